"""The MCP benchmark runs end to end at a tiny size, so its code cannot rot between `make bench` runs."""

from __future__ import annotations

import pytest

from tests.bench import bench_mcp
from tests.mcp_support import require_bwrap


@pytest.mark.e2e
def test_the_mcp_benchmark_measures_every_path_and_prints_its_tables() -> None:
    require_bwrap()  # the harness's paths start the server in its sandbox
    figures = bench_mcp.measure(rounds=2, batch=2, warmup=2, jobs=2, naive=1)

    assert [len(row.samples) for row in figures.rows] == [4] * 6
    assert all(0 < t < 5 for row in figures.rows for t in row.samples)
    jobs = figures.jobs
    assert len(jobs.job_first) == len(jobs.thread_first) == 2 and len(jobs.naive_first) == 1
    assert jobs.started == 0  # a job never starts a server: it calls the worker's over the relay
    assert all(first > built > 0 for first, built in zip(jobs.job_first, jobs.job_built, strict=True))

    report = bench_mcp.report(figures)
    assert report.startswith("## MCP tool calls")
    assert "direct `Client.call_tool` (floor)" in report and "job: fork → first result" in report
