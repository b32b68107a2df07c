"""`python -m tests.bench [NAME ...]`: run the benchmarks and print their tables.

Each module `tests/bench/bench_NAME.py` has `run() -> str` returning Markdown (a heading, the
command, the table). With no names, all of them run in turn.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import tests.bench
from tests.bench.common import machine


def main(argv: list[str]) -> int:
    names = argv or sorted(
        m.name.removeprefix("bench_")
        for m in pkgutil.iter_modules(tests.bench.__path__)
        if m.name.startswith("bench_")
    )
    print(f"# Benchmarks\n\nMachine: {machine()}\n", flush=True)
    for name in names:
        module = importlib.import_module(f"tests.bench.bench_{name}")
        started = time.monotonic()
        print(module.run(), flush=True)
        print(f"\n_({name}: {time.monotonic() - started:.0f} s)_\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
