# One front door. `make run` starts the bot on this machine; `make test` runs every test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast lint bench screenshots clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m launch

# Test files run in parallel on up to 4 processes (one per core), each file on one process, so a
# module's stack (its bot, worker and Redis database) stays together; 20½ minutes on 2 cores (2026-12-05).
XDIST := -n auto --maxprocesses 4 --dist loadfile

test: $(STAMP)
	$(BIN)/python -m pytest $(XDIST)

# The inner loop: every test but those marked e2e, which start the product's processes (docs/testing.md);
# 2 minutes 46 seconds on 2 cores (2026-12-05).
test-fast: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) -m "not e2e"

# The README's pictures of the playground, taken by its browser tests (Debian's chromium needed).
screenshots: $(STAMP)
	PLAYGROUND_SCREENSHOTS=docs $(BIN)/python -m pytest tests/e2e/test_playground_browser.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	$(BIN)/python -m tests.bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache
