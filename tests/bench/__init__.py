"""Benchmarks that print figures (not timed tests). Run them all: `make bench` (python -m tests.bench)."""
