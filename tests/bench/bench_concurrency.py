"""Many runs per worker: `HARNESS_WORKER_CONCURRENCY=1` (one job per horse, as before) side by side
with the default (16) and with 64, in one run of this benchmark.

A real `python -m bot` and one `python -m workers` per setting, each on its own private
redis-server; the model stand-in holds every request `HOLD` seconds, as a real model does. Each run
reads a file (one tool turn), then answers: two requests, about 4 s of waiting.

- **runs per GiB**: as many runs as slots (at least `MIN_RUNS`) mentioned at once; the most runs
  seen waiting on the model at one moment, over the PSS of the whole worker tree (worker, horse,
  scheduler) at that moment.
- **wall time** for all of them to answer.
- **click → resumed request** (p50, p90): with `INFLIGHT` runs waiting on the model, runs parked on
  an approval are approved one at a time, each once the one before has answered; the time from the
  click's request to the model receiving the resumed run's request.
- **CPU per tool turn**: the worker tree's CPU time (user + system), its idle CPU taken out, per
  held run (one tool turn each): runs arriving one every `HOLD` / runs s (a steady stream, as real
  mentions come), and runs mentioned at once (their requests come back together, so their turns
  compute together: threads then contend for the GIL). And over `TURNS` tool turns answered at once
  by the model, divided by the turns: every run busy at the same moment, the worst case; and the
  same runs one at a time, so that no two compute together: what the slots cost by themselves.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tests.bench.bench_latency import has_actions, post_mention
from tests.bench.bench_memory import Mem, sample_tree
from tests.bench.common import percentile, table
from tests.fakes.messages_api import FakeMessagesAPI, Reply, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import RedisServer, Stack, descendants, wait_until

COMMAND = ".venv/bin/python -m tests.bench concurrency"
SETTINGS = (1, 16, 64)
NOTES = {1: " (one job per horse, as before)", 16: " (the default)"}
HOLD = 2.0  # seconds the stand-in model holds each request of a held run
MIN_RUNS = 16  # runs mentioned at once (at least; as many as the slots) for memory, wall time, CPU
IDLE_WINDOW = 5.0  # seconds the idle tree's CPU is measured over
INFLIGHT = 50  # runs waiting on the model while clicks are measured (fewer than the slots)
CLICKS = 20
TURNS = 200  # tool turns for the CPU figure (runs of 4 turns, answered at once)
CONFIG = """\
[limits]
max_runs_per_user = 100000
max_runs_per_channel = 100000
max_turns = 20
[approvals]
approvers = ["UALICE"]
"""
_MARKER = re.compile(r"\bk([hpcw])(\d+)\b")


class Model:
    """`khN`: reads, then answers, each request held `HOLD` s; `kpN`: a write_file it parks on, then
    answers at once (its resumed request is timed); `kcN`: four read turns answered at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting = 0
        self.resumed: dict[int, float] = {}  # kpN -> perf_counter when its resumed request came
        self.release = threading.Event()  # lets the kwN runs answer

    def __call__(self, body: dict[str, Any]) -> Reply:
        first = body["messages"][0]["content"]
        task = first if isinstance(first, str) else " ".join(b.get("text", "") for b in first)
        found = _MARKER.search(task)
        assert found, task[:200]
        kind, n = found.group(1), int(found.group(2))
        results = sum(
            1
            for m in body["messages"]
            if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"]
            if b.get("type") == "tool_result"
        )
        if kind == "p":
            if results == 0:
                return reply(tool_use("write_file", {"path": f"p{n}.md", "content": "x"}))
            with self.lock:
                self.resumed[n] = time.perf_counter()
            return reply(text(f"k{kind}{n} done"))
        if kind == "w":  # in flight while clicks are measured: held until `release`
            with self.lock:
                self.waiting += 1
            try:
                self.release.wait(600)
            finally:
                with self.lock:
                    self.waiting -= 1
            return reply(text(f"k{kind}{n} done"))
        if kind == "c":
            if results < 4:  # four different files: the same call again would be no progress
                return reply(tool_use("read_file", {"path": f"doc{results}.md"}))
            return reply(text(f"k{kind}{n} done"))
        with self.lock:
            self.waiting += 1
        try:
            time.sleep(HOLD)  # the model thinking: this stand-in's own thread, nobody else's
        finally:
            with self.lock:
                self.waiting -= 1
        if results == 0:
            return reply(tool_use("read_file", {"path": "doc.md"}))
        return reply(text(f"k{kind}{n} done"))


class DoneSlack(FakeSlackAPI):
    def __init__(self) -> None:
        super().__init__(bot_token="xoxb-test")
        self.done: set[str] = set()

    def _record_texts(self, text_: str | None, blocks: list[dict[str, Any]] | None) -> None:
        super()._record_texts(text_, blocks)
        if text_:
            self.done.update(re.findall(r"\b(k[hpcw]\d+) done\b", text_))


@dataclass
class Rig:
    stack: Stack
    slack: DoneSlack
    model: Model
    conn: redis.Redis
    worker_pid: int


@contextmanager
def rig(concurrency: int) -> Iterator[Rig]:
    server = RedisServer().start()
    try:
        with DoneSlack() as slack, FakeMessagesAPI() as api, tempfile.TemporaryDirectory() as tmp:
            model = Model()
            api.responder = model
            # Streams paced at `Stack`'s 50 ms (production: 305 ms, which makes the one-slot rounds
            # far longer: each run's stream stops a pace after its last write).
            env = {"HARNESS_WORKER_CONCURRENCY": str(concurrency)}
            stack = Stack(server.url, slack, api, Path(tmp), config=CONFIG, extra_env=env)
            for name in ("doc.md", "doc0.md", "doc1.md", "doc2.md", "doc3.md"):
                (stack.workspace / name).write_text("A line of a document.\n" * 50)
            try:
                stack.start_bot()
                worker = stack.start_worker()
                yield Rig(stack, slack, model, redis.Redis.from_url(server.url), worker.proc.pid)
                if api.errors:
                    raise AssertionError(f"model stand-in saw invalid requests: {api.errors[:3]}")
            finally:
                stack.stop()
    finally:
        server.cleanup()


def mention(rig_: Rig, marker: str) -> str:
    ts, _, _ = post_mention(rig_.stack, f"C{marker.upper()}", f"{marker}: read the doc")
    return ts


def answered(rig_: Rig, markers: set[str], timeout: float) -> None:
    assert rig_.slack.wait_for(lambda f: markers <= f.done, timeout), sorted(markers - rig_.slack.done)[:5]


def card(rig_: Rig, marker: str, ts: str) -> dict[str, Any] | None:
    return next((m for m in rig_.stack.slack.messages(f"C{marker.upper()}", ts) if has_actions(m)), None)


def cpu_seconds(root: int) -> float:
    """User + system CPU of `root` and its descendants now (their own, not their reaped children's)."""
    total = 0.0
    for pid in [root, *descendants(root)]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def cpu_seconds_exact(root: int) -> float:
    """The CPU of the threads alive now in `root` and its descendants, to the nanosecond
    (`schedstat`): for the idle tree, whose threads live on. `cpu_seconds` counts in clock ticks
    (10 ms), too coarse for a tree idling at about 1 ms a second over a few seconds."""
    total = 0
    for pid in [root, *descendants(root)]:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


@dataclass
class Figures:
    concurrency: int
    inflight: int
    runs: int
    most_waiting: int
    pss: Mem
    wall: float
    click_p50: float
    click_p90: float
    cpu_per_turn: float  # the model answering after HOLD s, runs arriving steadily; idle CPU taken out
    cpu_burst: float  # the same, the runs mentioned at once (their turns all computed together)
    cpu_instant: float  # the model answering at once: every run busy at the same moment
    cpu_alone: float  # the model answering at once, one run at a time: no two runs compute together
    idle_ms_per_s: float  # the idle tree's CPU, taken out of the figures with the model at 2 s

    @property
    def per_gib(self) -> float:
        return self.most_waiting / (self.pss.pss / 1024 / 1024)


def held_round(r: Rig, first: int, runs: int, spacing: float, idle_rate: float) -> tuple[float, float, Any]:
    """`runs` held runs mentioned `spacing` s apart: (wall time, CPU per run with the idle CPU taken
    out, (most runs waiting on the model at one moment, the tree's memory then))."""
    started, cpu_before = time.monotonic(), cpu_seconds(r.worker_pid)
    peak: list[tuple[int, Mem]] = []
    markers = {f"kh{first + i}" for i in range(runs)}
    for i, m in enumerate(sorted(markers)):
        time.sleep(max(0.0, started + i * spacing - time.monotonic()))  # the arrival pace itself
        mention(r, m)
    deadline = time.monotonic() + runs * 2 * HOLD + 60
    while not markers <= r.slack.done and time.monotonic() < deadline:
        peak.append((r.model.waiting, sample_tree(r.worker_pid, r.conn).total))
        time.sleep(0.25)  # a sampling interval, not a synchronisation
    answered(r, markers, 30)
    r.stack.settled(timeout=120)
    wall = time.monotonic() - started
    cpu = cpu_seconds(r.worker_pid) - cpu_before - idle_rate * wall
    return wall, cpu / runs, max(peak, key=lambda p: (p[0], p[1].pss))


def measure(concurrency: int) -> Figures:
    with rig(concurrency) as r:
        # The tree's CPU while idle (watchdog passes, heartbeats), to take out of the figures below.
        r.stack.settled(timeout=60)
        idle_from, idle_cpu = time.monotonic(), cpu_seconds_exact(r.worker_pid)
        time.sleep(IDLE_WINDOW)  # the measuring window itself
        idle_rate = (cpu_seconds_exact(r.worker_pid) - idle_cpu) / (time.monotonic() - idle_from)

        # Memory, wall time and CPU per tool turn: as many held runs as there are slots, mentioned
        # at once (their requests come back together: a burst), then one every HOLD / runs s (a
        # steady stream, every run still waiting on the model at once after the first HOLD s).
        runs = max(MIN_RUNS, concurrency)
        wall, burst_cpu, (waiting, pss) = held_round(r, 0, runs, 0.0, idle_rate)
        _, steady_cpu, _ = held_round(r, runs, runs, HOLD / runs, idle_rate)

        # Click → resumed request, INFLIGHT held runs in flight.
        parked = [f"kp{i}" for i in range(CLICKS)]
        cards = {}
        for m in parked:
            ts = mention(r, m)
            cards[m] = wait_until(
                lambda ts=ts, m=m: next(
                    (x for x in r.stack.slack.messages(f"C{m.upper()}", ts) if has_actions(x)), None
                ),
                60,
            )
        inflight = min(INFLIGHT, concurrency - 1)  # a slot left for the resume: else it queues
        held = {f"kw{i}" for i in range(inflight)}
        for m in sorted(held):
            mention(r, m)
        wait_until(lambda: r.model.waiting >= inflight, 60)
        delays = []
        for i, m in enumerate(parked):
            clicked = time.perf_counter()
            assert r.stack.click(cards[m], "approve", user="UALICE") == 200
            wait_until(lambda i=i: i in r.model.resumed, 120)
            delays.append((r.model.resumed[i] - clicked) * 1000)
            answered(r, {m}, 60)  # the next click finds only the held runs in flight, not this one
        r.model.release.set()
        answered(r, held | {f"kp{i}" for i in range(CLICKS)}, INFLIGHT * 2 * HOLD + 120)
        r.stack.settled(timeout=120)

        # CPU per tool turn: runs of four read turns, answered at once.
        before = cpu_seconds(r.worker_pid)
        cpu_markers = {f"kc{i}" for i in range(TURNS // 4)}
        for m in sorted(cpu_markers):
            mention(r, m)
        answered(r, cpu_markers, 300)
        r.stack.settled(timeout=120)
        cpu = (cpu_seconds(r.worker_pid) - before) / TURNS

        # The same runs one at a time (each mentioned once the one before has answered): no two
        # runs compute together, so what the slots cost by themselves.
        before, alone_runs = cpu_seconds(r.worker_pid), TURNS // 8
        for i in range(alone_runs):
            m = f"kc{TURNS + i}"
            mention(r, m)
            answered(r, {m}, 60)
        r.stack.settled(timeout=120)
        alone = (cpu_seconds(r.worker_pid) - before) / (alone_runs * 4)
        return Figures(
            concurrency,
            inflight,
            runs,
            waiting,
            pss,
            wall,
            statistics.median(delays),
            percentile(delays, 90),
            steady_cpu * 1000,
            burst_cpu * 1000,
            cpu * 1000,
            alone * 1000,
            idle_rate * 1000,
        )


def run() -> str:
    figures = []
    for c in SETTINGS:
        figures.append(measure(c))
        print(f"concurrency {c}: {figures[-1]}", file=sys.stderr, flush=True)
    base = figures[0]
    rows = [
        [
            f"{f.concurrency}{NOTES.get(f.concurrency, '')}",
            f"{f.runs} / {f.most_waiting}",
            f"{f.pss.pss / 1024:.1f}",
            f"{f.per_gib:.0f}",
            f"{f.wall:.1f}",
            f"{f.click_p50:.1f} / {f.click_p90:.1f} ({f.inflight} in flight)",
            f"{f.cpu_per_turn:.2f} ({f.cpu_per_turn / base.cpu_per_turn:.2f}x)",
            f"{f.cpu_burst:.2f} ({f.cpu_burst / base.cpu_burst:.2f}x)",
            f"{f.cpu_instant:.2f} ({f.cpu_instant / base.cpu_instant:.2f}x)",
            f"{f.cpu_alone:.2f} ({f.cpu_alone / base.cpu_alone:.2f}x)",
        ]
        for f in figures
    ]
    return (
        "## Many runs per worker\n\n"
        f"`{COMMAND}`: one worker tree per `HARNESS_WORKER_CONCURRENCY`, side by side in one run. Runs "
        f"of one tool turn, then the answer, the model holding each request {HOLD:.0f} s, as many mentioned "
        f"at once as there are slots (at least {MIN_RUNS}); clicks with up to {INFLIGHT} runs in flight (a "
        f"slot left free for the resume), each once the one before has answered; CPU of the worker tree "
        f"per tool turn, its idle CPU taken out, with as many runs arriving one every {HOLD:.0f} s / runs "
        f"(steadily) and mentioned at once (a burst); and {TURNS} tool turns with the model answering at "
        f"once (every run busy together), then {TURNS // 2} one run at a time (none together).\n\n"
        + table(
            [
                "concurrency",
                "runs mentioned / waiting on the model at once",
                "worker tree PSS (MiB)",
                "active runs per GiB",
                "wall time (s)",
                "click → resumed request p50 / p90 (ms)",
                "CPU per tool turn, model 2 s, runs arriving steadily (ms)",
                "CPU per tool turn, model 2 s, runs mentioned at once (ms)",
                "CPU per tool turn, model instant (ms)",
                "CPU per tool turn, model instant, one run at a time (ms)",
            ],
            rows,
        )
    )
