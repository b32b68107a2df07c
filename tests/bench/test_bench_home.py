"""The Home tab benchmark runs end to end at a tiny size, so its code cannot rot between `make bench` runs."""

from __future__ import annotations

from messages.home import HOME_ITEMS_MAX
from tests.bench import bench_home


def test_the_home_benchmark_times_every_person_and_prints_its_table() -> None:
    figures = bench_home.measure(parks=60, opens=3)

    assert figures.parks == 63
    assert [len(row.samples) for row in figures.rows] == [3, 3, 3, 5]
    assert [row.shown for row in figures.rows[:3]] == [HOME_ITEMS_MAX, 3, 0]
    assert all(0 < t < 5 for row in figures.rows for t in row.samples)
    report = bench_home.report(figures)
    assert report.startswith("## Home tab with 63 parked runs") and "p99 ms" in report
