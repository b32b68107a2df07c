"""What traces cost a tool turn: today's code, tracing off, tracing on, side by side in one run.

The turn is `bench_overhead`'s "ours: as a worker steps it" (the real `Driver`, `Store` and
registry over a private redis-server, Slack left out): per tool turn = (a TURNS-turn run - a 0-turn
run) / TURNS. Three contenders, each a worker process of its own, measured round-robin so drift
hits all alike:

- **today's**: the commit before traces came (`git archive` of it into a temp dir), no `OTEL_*`;
- **off**: this tree, no `OTEL_*` (the default: no tracer, no SDK);
- **on**: this tree, `OTEL_EXPORTER_OTLP_ENDPOINT` at a loopback OTLP/HTTP receiver in this
  process (`tests/fakes/otlp_receiver.py`): a `chat` and an `execute_tool` span per turn, batched
  and exported over HTTP with protobuf by the SDK's thread.

The figures: each contender's median, and its ratio to today's as the ratio of the medians and as
the median of the per-round ratios (one round's sample is a single run pair, so the two disagree
by the noise of the machine; both are shown).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import IO, Any

from tests.bench.common import machine, table
from tests.fakes.otlp_receiver import OTLPReceiver

ROOT = Path(__file__).resolve().parents[2]
TURNS = 20
ROUNDS = int(os.environ.get("BENCH_TRACING_ROUNDS", "100"))
WARMUP = 3

# Runs in each contender's process, from its own tree: one line in, one measurement out.
_CHILD = """
import gc, json, sys, tempfile
from contextlib import ExitStack
from pathlib import Path
from tests.bench import bench_overhead as b
from tests.fakes.messages_api import FakeMessagesAPI

with ExitStack() as stack:
    fake = stack.enter_context(FakeMessagesAPI())
    fake.responder = b.responder
    env = b.Env(fake.base_url, Path(stack.enter_context(tempfile.TemporaryDirectory())), stack)
    run = b.worker(env)

    def timed(turns):
        gc.collect()
        started = b.now()
        run(turns, False)
        ended = b.now()
        return ended[0] - started[0], ended[1] - started[1]

    print("ready", flush=True)
    for line in sys.stdin:
        zero, full = timed(0), timed(int(line))
        print(json.dumps({"wall": (full[0] - zero[0]), "cpu": (full[1] - zero[1])}), flush=True)
"""


def _base_tree(into: Path) -> tuple[Path, str]:
    """The tree of the commit before traces came (`BENCH_TRACING_BASE` overrides it), and its id."""
    base = (
        os.environ.get("BENCH_TRACING_BASE")
        or _git("log", "-1", "--format=%H", "--diff-filter=A", "--", "observe/tracing.py") + "^"
    )
    commit = _git("rev-parse", "--short", base)
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into, commit


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


class Contender:
    """One worker process measuring tool turns on request."""

    def __init__(self, name: str, tree: Path, env: dict[str, str]) -> None:
        self.name = name
        self.samples: list[dict[str, float]] = []
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "HARNESS_", "SLACK_"))}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD],
            cwd=tree,
            env={**clean, "PYTHONPATH": str(tree), **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._read() == "ready", f"{name} did not start"

    def _read(self) -> str:
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        return out.readline().strip()

    def measure(self, keep: bool = True) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{TURNS}\n")
        self.proc.stdin.flush()
        sample = json.loads(self._read())
        if keep:
            self.samples.append({k: v / TURNS for k, v in sample.items()})

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)


def measure() -> tuple[list[Contender], OTLPReceiver, str]:
    with tempfile.TemporaryDirectory() as tmp, OTLPReceiver() as receiver:
        base, commit = _base_tree(Path(tmp))
        on = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        }
        contenders = [
            Contender(f"today's (`{commit}`, before traces)", base, {}),
            Contender("tracing off (no `OTEL_*`)", ROOT, {}),
            Contender("tracing on (OTLP/HTTP protobuf to a loopback receiver)", ROOT, on),
        ]
        try:
            for _ in range(WARMUP):
                for contender in contenders:
                    contender.measure(keep=False)
            for _ in range(ROUNDS):
                for contender in contenders:
                    contender.measure()
        finally:
            for contender in contenders:
                contender.close()
        return contenders, receiver, commit


def _ratio(row: Contender, floor: Contender, key: str) -> float:
    return statistics.median(a[key] / b[key] for a, b in zip(row.samples, floor.samples, strict=True))


def run() -> str:
    contenders, receiver, commit = measure()
    today = contenders[0]
    rows: list[list[Any]] = []
    for contender in contenders:
        wall = statistics.median(s["wall"] for s in contender.samples) * 1e6
        cpu = statistics.median(s["cpu"] for s in contender.samples) * 1e6
        today_wall = statistics.median(s["wall"] for s in today.samples) * 1e6
        today_cpu = statistics.median(s["cpu"] for s in today.samples) * 1e6
        rows.append(
            [
                contender.name,
                f"{wall:.0f}",
                f"{cpu:.0f}",
                f"{wall / today_wall:.3f}× / {_ratio(contender, today, 'wall'):.3f}×",
                f"{cpu / today_cpu:.3f}× / {_ratio(contender, today, 'cpu'):.3f}×",
            ]
        )
    return "\n\n".join(
        [
            "## What traces cost a tool turn",
            "`python -m tests.bench tracing`",
            f"Machine: {machine()}. {ROUNDS} rounds (after {WARMUP} warm-up rounds), round-robin over "
            f"three worker processes; per tool turn = ({TURNS}-turn run - 0-turn run) / {TURNS}, as "
            '`bench_overhead`\'s "ours: as a worker steps it"; ratios: of the medians / median of the '
            f"per-round ratios, to today's (`{commit}`). Spans received by the loopback collector: "
            f"{len(receiver.spans)}.",
            table(
                ["contender", "µs per tool turn (wall)", "µs (CPU)", "÷ today's (wall)", "÷ today's (CPU)"],
                rows,
            ),
        ]
    )


if __name__ == "__main__":
    print(run())
