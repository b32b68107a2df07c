"""Helpers shared by the benchmarks: percentiles and Markdown tables."""

from __future__ import annotations

import platform
import statistics
from collections.abc import Sequence


def percentile(samples: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) by nearest rank; samples need not be sorted."""
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary_ms(samples: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / max / mean of samples given in seconds, in milliseconds."""
    return {
        "p50": percentile(samples, 50) * 1000,
        "p99": percentile(samples, 99) * 1000,
        "max": max(samples) * 1000,
        "mean": statistics.fmean(samples) * 1000,
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    return str(value)


def machine() -> str:
    """One line naming the machine the figures come from."""
    import os

    cores = os.cpu_count()
    return f"{platform.machine()}, {cores} cores, Python {platform.python_version()}, {platform.system()}"
