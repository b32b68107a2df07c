"""The memory benchmark runs end to end at a tiny size, so its code cannot rot between `make bench` runs."""

from __future__ import annotations

import pytest

from tests.bench import bench_memory


@pytest.mark.e2e
def test_the_memory_benchmark_samples_the_worker_tree_and_the_parked_runs_and_prints_its_tables() -> None:
    with bench_memory.rig("simple", traced=True) as rig:
        figures = bench_memory.measure_class(rig, "simple", runs=4, every=2, warmup=1)
        parked = bench_memory.measure_parked(rig, sizes=(1, 2), runs=1)
        trace = bench_memory.trace_growth(rig, runs=2, warmup=2, top=3)

    assert [runs for runs, _, _ in figures.series] == [0, 2, 4]
    for sample in (figures.started, figures.warmed, figures.in_flight, *(s for _, s, _ in figures.series)):
        assert sample.roles["worker"][0] == 1  # the worker itself, whatever else its tree holds
        total = sample.total
        assert total.rss >= total.pss >= total.uss > 0
    assert all(used > 0 for _, _, used in figures.series)
    keys = {row[0]: row for row in figures.keys}
    assert keys["`harness:run:<run>`"][1] == 4 + 1 + 1  # the runs, the warm-up and the held run
    assert keys["`harness:run:<run>`"][4] == 0  # every run record left behind carries a TTL

    assert [p.turns for p in parked] == [1, 2]
    assert parked[0].state_json < parked[1].state_json  # one more tool result in the conversation
    assert all(p.run_keys > 0 and "harness:run:<run>" in p.key_names for p in parked)

    assert trace.runs == 2 and len(trace.top) <= 3  # the worker dumped both snapshots
    assert all(size > 0 for _, size, _ in trace.top)

    report = bench_memory.report([figures], parked, ["prefork"], trace)
    assert report.startswith("## Memory")
    assert "| simple | idle, just started | worker | 1 |" in report
    assert "| simple | one run in flight | **tree** |" in report
    assert "Not measured: `prefork`" in report
    assert "What a `simple` worker keeps between two points 2 runs apart" in report
