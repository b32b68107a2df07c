"""Memory: the worker's process tree idle, with a run in flight and over 1,000 runs; Redis per parked run.

A real `python -m bot` and `python -m workers` per worker class, each class on its own private
redis-server, the model stand-in answering at once. Memory is read from `/proc/<pid>/smaps_rollup`
of every process of the worker's tree: RSS, PSS (shared pages divided among the processes that
map them, so forked processes add up honestly) and USS (pages of that process alone).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from rq import Worker

from store import RunStatus, Store
from tests.bench.bench_latency import has_actions, post_mention
from tests.bench.common import table
from tests.fakes.messages_api import FakeMessagesAPI, Reply, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import ROOT, RedisServer, Stack, descendants, wait_until

COMMAND = ".venv/bin/python -m tests.bench memory"
# prefork (the default): one long-lived work horse forked from the warmed worker; fork: RQ's
# forking worker, a horse per job; simple: jobs in the worker process.
CLASSES = ("prefork", "fork", "simple")
RUNS = 1_000
SAMPLE_EVERY = 100
WARMUP = 20
PARK_EVERY = 10  # every 10th run parks on a write_file approval and is approved by a click
PARKED_TURNS = (1, 10, 50)
PARKED_RUNS = 20  # parked runs per size, for the used_memory delta
GOAL_GROWTH = 0.10
WARMUP_FIRST = 900_000  # warm-up runs are numbered from here, apart from the measured ones
TRACE_FIRST = 800_000  # and the traced ones from here
DOCS = 7
CONFIG = """\
[limits]
max_runs_per_user = 100000
max_runs_per_channel = 100000
max_turns = 60
token_budget = 1000000000
no_progress_window = 2
"""
SOURCES = sorted((ROOT / "harness").glob("*.py")) + sorted((ROOT / "workers").rglob("*.py"))
_MARKER = re.compile(r"\bmb([rwhp])(\d+)(?:x(\d+))?\b")
_DONE = re.compile(r"\b(mb[rwhp]\d+(?:x\d+)?) done\b")


# --- memory of a process tree ------------------------------------------------------------------


@dataclass(frozen=True)
class Mem:
    """Memory of one process or a sum of several, in KiB."""

    rss: int = 0
    pss: int = 0
    uss: int = 0

    def __add__(self, other: Mem) -> Mem:
        return Mem(self.rss + other.rss, self.pss + other.pss, self.uss + other.uss)


def smaps(pid: int) -> Mem | None:
    """RSS, PSS and USS of `pid` from `/proc/<pid>/smaps_rollup`; None if it is gone."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    except OSError:
        return None
    kib = {name: int(value.split()[0]) for name, value in (line.split(":", 1) for line in lines)}
    return Mem(kib["Rss"], kib["Pss"], kib["Private_Clean"] + kib["Private_Dirty"])


@dataclass(frozen=True)
class Sample:
    """The worker's tree at one moment: role -> (processes, their summed memory)."""

    roles: dict[str, tuple[int, Mem]]
    pids: dict[str, tuple[int, ...]] = field(default_factory=dict)  # role -> its processes

    @property
    def total(self) -> Mem:
        return sum((mem for _, mem in self.roles.values()), Mem())


def scheduler_pids(conn: redis.Redis) -> set[int]:
    """The pids of RQ's scheduler processes, as they registered themselves in Redis."""
    pids = set()
    for key in conn.scan_iter("rq:scheduler:*"):
        pid = conn.hget(key, "pid") if conn.type(key) == b"hash" else None
        if pid:
            pids.add(int(pid))
    return pids


def sample_tree(root: int, conn: redis.Redis) -> Sample:
    """Memory of `python -m workers` (pid `root`) and every descendant, by role."""
    schedulers = scheduler_pids(conn)
    roles: dict[str, tuple[int, Mem]] = {}
    pids: dict[str, tuple[int, ...]] = {}
    for pid in [root, *descendants(root)]:
        mem = smaps(pid)
        if mem is None:
            continue  # a work horse that ended between the listing and the read
        role = "worker" if pid == root else "scheduler" if pid in schedulers else "work horse"
        count, total = roles.get(role, (0, Mem()))
        roles[role] = (count + 1, total + mem)
        pids[role] = (*pids.get(role, ()), pid)
    return Sample(roles, pids)


# --- the stand-ins -----------------------------------------------------------------------------


class DoneSlack(FakeSlackAPI):
    """The Slack fake, noting every run whose final answer ("<marker> done") it was given."""

    def __init__(self) -> None:
        super().__init__(bot_token="xoxb-test")
        self.done: set[str] = set()

    def _record_texts(self, text_: str | None, blocks: list[dict[str, Any]] | None) -> None:
        super()._record_texts(text_, blocks)
        if text_:
            self.done.update(_DONE.findall(text_))


class Model:
    """The model stand-in's responder. The task's marker says what the run does:

    `mbrN`: reads doc(N % 7).md, then answers; `mbwN`: the same, then a `write_file` (approval)
    before the answer; `mbhN`: reads, then its answer is held until `release` is set;
    `mbpNxK`: N turns of reads, then a `write_file` it parks on.
    """

    def __init__(self) -> None:
        self.held = threading.Event()
        self.release = threading.Event()

    def __call__(self, body: dict[str, Any]) -> Reply:
        first = body["messages"][0]["content"]
        task = first if isinstance(first, str) else " ".join(b.get("text", "") for b in first)
        found = _MARKER.search(task)
        assert found, f"no marker in {task[:200]!r}"
        kind, number = found.group(1), int(found.group(2))
        marker = found.group(0)
        results = sum(
            1
            for m in body["messages"]
            if m["role"] == "user"
            and isinstance(m["content"], list)
            and any(b.get("type") == "tool_result" for b in m["content"])
        )
        reads = number if kind == "p" else 1
        if results < reads:
            doc = (results + number) % DOCS
            return reply(text(f"Reading part {results}."), tool_use("read_file", {"path": f"doc{doc}.md"}))
        if kind in "wp" and results == reads:
            return reply(tool_use("write_file", {"path": f"note-{marker}.md", "content": "A summary. " * 40}))
        if kind == "h":
            self.held.set()
            self.release.wait(120)
        return reply(text(f"{marker} done: the file holds part of the harness's source."))


@dataclass
class Rig:
    """One class's stack: bot, worker, stand-ins and their Redis."""

    stack: Stack
    slack: DoneSlack
    model: Model
    api: FakeMessagesAPI
    conn: redis.Redis
    worker_pid: int
    trace_dir: Path | None  # where the worker's tracer writes, when it has one


@contextmanager
def rig(kind: str, *, traced: bool = False) -> Iterator[Rig]:
    """A private redis-server, the stand-ins, `python -m bot` and `python -m workers` of `kind`;
    `traced`: the worker gets the dormant tracer (see `TRACER`)."""
    server = RedisServer().start()
    model = Model()
    try:
        with DoneSlack() as slack, FakeMessagesAPI() as api, tempfile.TemporaryDirectory() as tmp:
            api.responder = model
            env = {"HARNESS_WORKER_CLASS": kind}
            trace_dir = Path(tmp) / "trace" if traced else None
            if trace_dir is not None:
                trace_dir.mkdir()
                (trace_dir / "sitecustomize.py").write_text(TRACER)
                env.update(PYTHONPATH=f"{trace_dir}:{ROOT}", MEMTRACE_DIR=str(trace_dir))
            stack = Stack(server.url, slack, api, Path(tmp), config=CONFIG, extra_env=env)
            for i in range(DOCS):  # real, varied text: the project's own source files
                (stack.workspace / f"doc{i}.md").write_text(SOURCES[i % len(SOURCES)].read_text())
            try:
                stack.start_bot()
                worker = stack.start_worker()
                conn = redis.Redis.from_url(server.url)
                yield Rig(stack, slack, model, api, conn, worker.proc.pid, trace_dir)
                if api.errors:
                    raise AssertionError(f"model stand-in saw invalid requests: {api.errors[:3]}")
            finally:
                stack.stop()
    finally:
        server.cleanup()


def idle(rig_: Rig) -> None:
    """Wait until nothing is queued, driven or leased and the worker waits for its next job."""
    rig_.stack.settled(timeout=120)
    wait_until(lambda: all(w.get_state() == "idle" for w in Worker.all(connection=rig_.conn)), 30)
    wait_until(lambda: not rig_.conn.keys("harness:lease:*"), 30)


def run_batch(rig_: Rig, first: int, count: int, *, park_every: int = PARK_EVERY) -> None:
    """Runs `first` … `first + count - 1`, each in its own channel; every `park_every`-th parks on
    a write_file approval that is approved by a signed click. Returns once every run answered."""
    posted = []
    for i in range(first, first + count):
        marker = f"mbw{i}" if i % park_every == park_every - 1 else f"mbr{i}"
        ts, _, _ = post_mention(rig_.stack, f"CMB{i}", f"{marker}: read a doc and tell me about it")
        posted.append((marker, f"CMB{i}", ts))
    for marker, channel, ts in posted:
        if marker.startswith("mbw"):
            card = wait_until(
                lambda c=channel, t=ts: next(
                    (m for m in rig_.stack.slack.messages(c, t) if has_actions(m)), None
                ),
                120,
            )
            assert rig_.stack.click(card, "approve") == 200
    markers = {m for m, _, _ in posted}
    answered = rig_.slack.wait_for(lambda f: markers <= f.done or bool(rig_.api.errors), 300)
    assert answered and not rig_.api.errors, (len(markers - rig_.slack.done), rig_.api.errors[:3])


# --- per class: idle, in flight, 1,000 runs ----------------------------------------------------


@dataclass
class ClassFigures:
    kind: str
    started: Sample
    warmed: Sample
    in_flight: Sample
    series: list[tuple[int, Sample, int]] = field(default_factory=list)  # runs, tree, Redis used_memory
    keys: list[list[Any]] = field(default_factory=list)  # the key census after the runs
    seconds: float = 0.0
    warmup: int = WARMUP
    every: int = SAMPLE_EVERY


def measure_class(
    r: Rig, kind: str, *, runs: int = RUNS, every: int = SAMPLE_EVERY, warmup: int = WARMUP
) -> ClassFigures:
    """Idle after start and after `warmup` runs, with one run in flight, then `runs` runs sampled
    every `every`; then the keys they left in Redis."""
    idle(r)
    started = sample_tree(r.worker_pid, r.conn)
    run_batch(r, WARMUP_FIRST, warmup)  # the warm-up runs, numbered apart
    idle(r)
    warmed = sample_tree(r.worker_pid, r.conn)
    in_flight = held_run(r)
    idle(r)
    figures = ClassFigures(kind, started, warmed, in_flight, warmup=warmup, every=every)
    figures.series.append((0, sample_tree(r.worker_pid, r.conn), used_memory(r.conn)))
    t0 = time.monotonic()
    for done in range(0, runs, every):
        run_batch(r, done, min(every, runs - done))
        idle(r)
        figures.series.append((done + every, sample_tree(r.worker_pid, r.conn), used_memory(r.conn)))
        total = figures.series[-1][1].total
        progress(
            f"{kind}: {done + every} runs, tree RSS {_mib(total.rss):.1f} MiB, PSS {_mib(total.pss):.1f} MiB"
        )
    figures.seconds = time.monotonic() - t0
    figures.keys = census(r.conn)
    return figures


def held_run(r: Rig) -> Sample:
    """The tree while a run waits for its model's answer (after one tool turn)."""
    r.model.held.clear()
    r.model.release.clear()
    post_mention(r.stack, "CMBH", "mbh0: read a doc and tell me about it")
    assert r.model.held.wait(60), "the held run never reached its second model request"
    try:
        return sample_tree(r.worker_pid, r.conn)
    finally:
        r.model.release.set()
        assert r.slack.wait_for(lambda f: "mbh0" in f.done, 60)


def progress(line: str) -> None:
    """A line on stderr while a long benchmark runs (the report goes to stdout)."""
    print(line, file=sys.stderr, flush=True)


def used_memory(conn: redis.Redis) -> int:
    return int(conn.info("memory")["used_memory"])


_ID_PARTS = (
    (re.compile(r"(?<=^harness:)(.*)[0-9a-f]{32}"), r"\1<run>"),
    (re.compile(r"[0-9a-f]{32}"), "<id>"),
    (re.compile(r"\d{6,}\.\d+"), "<ts>"),
    (re.compile(r":CMB[-A-Z0-9]+"), ":<channel>"),
    (re.compile(r":Ev[A-Za-z0-9_]+"), ":<event>"),
    (re.compile(r":\d+\b"), ":<n>"),
)


def pattern(key: str) -> str:
    for regex, name in _ID_PARTS:
        key = regex.sub(name, key)
    return key


def census(conn: redis.Redis) -> list[list[Any]]:
    """Every key by pattern: how many, their bytes, TTLs, and how many have none."""
    by: dict[str, list[Any]] = {}
    for raw in conn.scan_iter(count=1000):
        key = raw.decode()
        ttl = int(conn.ttl(raw))
        if ttl == -2:
            continue  # expired meanwhile
        row = by.setdefault(pattern(key), [0, 0, [], 0, 0])
        row[0] += 1
        row[1] += int(conn.memory_usage(raw) or 0)
        if ttl == -1:
            row[3] += 1
            row[4] = max(row[4], members(conn, raw))
        else:
            row[2].append(ttl)
    rows = []
    for name, (count, size, ttls, forever, most) in sorted(by.items()):
        span = f"{_age(min(ttls))} – {_age(max(ttls))}" if ttls else ""
        rows.append([f"`{name}`", count, size, span, forever, most if forever else ""])
    return rows


def members(conn: redis.Redis, key: bytes) -> int:
    """How many members a collection key holds (1 for a string)."""
    kind = conn.type(key).decode()
    size: Callable[[bytes], Any] = {
        "zset": conn.zcard,
        "set": conn.scard,
        "hash": conn.hlen,
        "list": conn.llen,
        "stream": conn.xlen,
    }.get(kind, lambda _: 1)
    return int(size(key))


def _age(seconds: int) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} d"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds} s"


# --- Redis per parked run ----------------------------------------------------------------------


@dataclass(frozen=True)
class ParkedRow:
    turns: int
    runs: int
    state_json: int  # the run's RunState as JSON
    record_json: int  # the whole run record as JSON (what is packed into its key)
    run_keys: int  # MEMORY USAGE of every key naming the run or its thread
    key_names: tuple[str, ...]
    used_delta: int  # INFO used_memory after - before, over `runs` parked runs
    rq_delta: int  # of which RQ's own keys (finished jobs are kept for result_ttl)


def key_bytes(conn: redis.Redis, prefix: str) -> int:
    return sum(int(conn.memory_usage(k) or 0) for k in conn.scan_iter(f"{prefix}*", count=1000))


def measure_parked(
    r: Rig, *, sizes: Sequence[int] = PARKED_TURNS, runs: int = PARKED_RUNS
) -> list[ParkedRow]:
    """Park `runs` runs after each number of turns in `sizes`; bytes in Redis per parked run."""
    idle(r)
    return [park_runs(r, turns, runs) for turns in sizes]


def park_runs(r: Rig, turns: int, runs: int) -> ParkedRow:
    """Park `runs` runs of `turns` turns each; what one costs Redis."""
    before, rq_before = used_memory(r.conn), key_bytes(r.conn, "rq:")
    runs_before = set(r.conn.scan_iter("harness:run:*"))
    threads = []
    for k in range(runs):
        channel = f"CMBP{turns}X{k}"
        ts, _, _ = post_mention(r.stack, channel, f"mbp{turns}x{k}: read the docs, then write a summary")
        threads.append((channel, ts))
    for channel, ts in threads:
        wait_until(lambda c=channel, t=ts: any(has_actions(m) for m in r.stack.slack.messages(c, t)), 300)
    idle(r)
    used = used_memory(r.conn) - before
    rq_used = key_bytes(r.conn, "rq:") - rq_before
    new = sorted(set(r.conn.scan_iter("harness:run:*")) - runs_before)
    assert len(new) == runs, (len(new), runs)
    run_id = new[0].decode().rsplit(":", 1)[1]
    record = Store(r.conn).runs.load(run_id)
    assert record is not None and record.status is RunStatus.AWAITING_APPROVAL, record
    thread = ":".join(record.thread)
    names = sorted(
        k.decode()
        for k in r.conn.scan_iter("harness:*", count=1000)
        if run_id in k.decode() or thread in k.decode()
    )
    return ParkedRow(
        turns,
        runs,
        len(record.run_state().dumps().encode()),
        len(record.to_json().encode()),
        sum(int(r.conn.memory_usage(n) or 0) for n in names),
        tuple(pattern(n) for n in names),
        used,
        rq_used,
    )


# --- where the worker's own growth goes: tracemalloc in a `simple` worker ------------------------

# Installed as `sitecustomize` for the worker only. The first SIGUSR2 starts tracemalloc (from
# the start, imports under it would take the worker minutes); each later one dumps a snapshot
# plus the count of live objects by type, after a full collection.
TRACER = """\
import os
if os.environ.get("MEMTRACE_DIR") and b"workers" in open("/proc/self/cmdline", "rb").read():
    import collections, gc, json, signal, tracemalloc
    _pid, _n = os.getpid(), [0]

    def _dump(signum, frame):
        if os.getpid() != _pid:
            return  # a fork of the worker inherited the handler
        if not tracemalloc.is_tracing():
            tracemalloc.start(12)
            open(os.path.join(os.environ["MEMTRACE_DIR"], "0.done"), "w").close()
            return
        gc.collect()
        _n[0] += 1
        where = os.path.join(os.environ["MEMTRACE_DIR"], str(_n[0]))
        tracemalloc.take_snapshot().dump(where + ".snap")
        types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        with open(where + ".types", "w") as out:
            json.dump(types, out)
        os.rename(where + ".snap", where + ".done")

    signal.signal(signal.SIGUSR2, _dump)
"""


@dataclass(frozen=True)
class Trace:
    runs: int  # between the two snapshots
    traced_growth: int  # bytes tracemalloc saw grow between them
    top: list[tuple[str, int, int]]  # (where, bytes, blocks) of the largest growths
    types: list[tuple[str, int]]  # (type, live objects gained) of the largest gains
    rss_growth: int  # KiB of worker RSS between them


def snapshot(r: Rig, tmp: Path, n: int) -> tuple[Any, dict[str, int], Mem]:
    """Have the worker dump snapshot `n`; the snapshot, its object counts and the worker's memory."""
    os.kill(r.worker_pid, signal.SIGUSR2)
    done = tmp / f"{n}.done"
    wait_until(done.exists, 120)
    mem = smaps(r.worker_pid)
    assert mem is not None
    return tracemalloc.Snapshot.load(str(done)), json.loads((tmp / f"{n}.types").read_text()), mem


def _frame(frame: tracemalloc.Frame) -> str:
    """`package/file.py:line`, short."""
    path = Path(frame.filename)
    return (
        f"{path.parent.name}/{path.name}:{frame.lineno}"
        if path.parent.name
        else f"{path.name}:{frame.lineno}"
    )


def trace_growth(r: Rig, *, runs: int = 300, warmup: int = 60, top: int = 10) -> Trace:
    """Warm up (tracing from half way), snapshot, `runs` more, snapshot: what the worker of a
    `rig(..., traced=True)` kept between the two."""
    tmp = r.trace_dir
    assert tmp is not None, "the worker has no tracer: start it with rig(kind, traced=True)"
    run_batch(r, TRACE_FIRST, warmup // 2)
    idle(r)
    os.kill(r.worker_pid, signal.SIGUSR2)  # tracing starts
    wait_until((tmp / "0.done").exists, 60)
    run_batch(r, TRACE_FIRST + warmup // 2, warmup - warmup // 2)  # first-use caches fill
    idle(r)
    before, types0, mem0 = snapshot(r, tmp, 1)
    for done in range(0, runs, SAMPLE_EVERY):
        run_batch(r, TRACE_FIRST + warmup + done, min(SAMPLE_EVERY, runs - done))
    idle(r)
    after, types1, mem1 = snapshot(r, tmp, 2)
    ignore = [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap*>"),
        tracemalloc.Filter(False, "*/sitecustomize.py", all_frames=True),  # the tracer's own work
    ]
    diff = after.filter_traces(ignore).compare_to(before.filter_traces(ignore), "traceback")
    grown = sorted((d for d in diff if d.size_diff > 0), key=lambda d: -d.size_diff)
    rows = [
        (" ← ".join(_frame(f) for f in reversed(d.traceback)), d.size_diff, d.count_diff) for d in grown[:top]
    ]
    gained = sorted(((t, types1.get(t, 0) - types0.get(t, 0)) for t in types1), key=lambda x: -x[1])
    return Trace(
        runs,
        sum(d.size_diff for d in diff),
        rows,
        [g for g in gained[:top] if g[1] > 0],
        mem1.rss - mem0.rss,
    )


# --- the report --------------------------------------------------------------------------------


def known_classes() -> tuple[list[str], list[str]]:
    """The classes of `CLASSES` this checkout's `python -m workers` knows, and those it does not."""
    source = "".join(p.read_text() for p in sorted((ROOT / "workers").rglob("*.py")))
    known = [k for k in CLASSES if k == "fork" or f'"{k}"' in source]
    return known, [k for k in CLASSES if k not in known]


def _mib(kib: int) -> float:
    return kib / 1024


def growth(first: float, last: float) -> float:
    return (last - first) / first if first else float("nan")


def tree_rows(figures: Sequence[ClassFigures]) -> list[list[Any]]:
    rows = []
    for f in figures:
        for moment, sample in (
            ("idle, just started", f.started),
            (f"idle, after {f.warmup} warm-up runs", f.warmed),
            ("one run in flight", f.in_flight),
        ):
            for role, (count, mem) in sorted(sample.roles.items()):
                rows.append([f.kind, moment, role, count, _mib(mem.rss), _mib(mem.pss), _mib(mem.uss)])
            total = sample.total
            rows.append(
                [
                    f.kind,
                    moment,
                    "**tree**",
                    sum(c for c, _ in sample.roles.values()),
                    _mib(total.rss),
                    _mib(total.pss),
                    _mib(total.uss),
                ]
            )
    return rows


def series_rows(figures: Sequence[ClassFigures]) -> list[list[Any]]:
    rows = []
    for f in figures:
        seen: set[int] = set()
        for runs, sample, used in f.series:
            worker = sample.roles.get("worker", (0, Mem()))[1]
            horses = set(sample.pids.get("work horse", ()))
            rows.append(
                [
                    f.kind,
                    runs,
                    _mib(sample.total.rss),
                    _mib(sample.total.pss),
                    _mib(worker.rss),
                    _mib(worker.uss),
                    f"{len(horses)} ({len(horses - seen)} new)" if horses else "0",
                    f"{used / 2**20:.1f}",
                ]
            )
            seen |= horses
    return rows


def growth_rows(figures: Sequence[ClassFigures]) -> list[list[Any]]:
    rows = []
    for f in figures:
        (_, first, used0), (runs, last, used1) = f.series[0], f.series[-1]
        rss, pss = growth(first.total.rss, last.total.rss), growth(first.total.pss, last.total.pss)
        worst = max(rss, pss)
        rows.append(
            [
                f.kind,
                runs,
                f"{rss:+.1%}",
                f"{pss:+.1%}",
                f"{(used1 - used0) / max(runs, 1):,.0f}",
                f"{f.seconds:.0f}",
                "met" if worst <= GOAL_GROWTH else "missed",
            ]
        )
    return rows


def parked_rows(rows: Sequence[ParkedRow]) -> list[list[Any]]:
    return [
        [
            p.turns,
            p.runs,
            p.state_json,
            p.record_json,
            p.run_keys,
            f"{p.used_delta / p.runs:,.0f}",
            f"{p.rq_delta / p.runs:,.0f}",
            ", ".join(f"`{n}`" for n in sorted(set(p.key_names))),
        ]
        for p in rows
    ]


def report(
    figures: Sequence[ClassFigures],
    parked: Sequence[ParkedRow],
    skipped: Sequence[str] = (),
    trace: Trace | None = None,
) -> str:
    census_of = figures[0] if figures else None
    forever = [row for row in census_of.keys if row[4]] if census_of else []
    met = all(row[-1] == "met" for row in growth_rows(figures))
    lines = [
        "## Memory",
        "",
        f"`{COMMAND}` — per worker class, a private redis-server, one `python -m bot` and one "
        "`python -m workers` (`HARNESS_WORKER_CLASS`), the stand-ins answering at once. Memory is "
        "read from `/proc/<pid>/smaps_rollup` of every process of the worker's tree (the worker, "
        "RQ's scheduler process, work horses): RSS, PSS (each shared page divided among the processes "
        "mapping it, so a fork's copy-on-write pages are counted once) and USS (pages of that process "
        "alone), in MiB. Each run is its own thread: a `read_file` of one of 7 workspace files (the "
        "project's own sources, cut to 2,000 characters), then the final text; every "
        f"{PARK_EVERY}th run also asks for a `write_file`, parks on its approval and is resumed by a "
        "signed approve click. The run in flight is held at its second model request (after its "
        "tool turn) by a `threading.Event` in the model stand-in. Samples are taken with the worker "
        "idle (nothing queued, leased or driven).",
    ]
    if skipped:
        lines += [
            "",
            f"Not measured: {', '.join(f'`{k}`' for k in skipped)} (this checkout's "
            "`workers/process/main.py` does not know the class).",
        ]
    lines += [
        "",
        table(["worker class", "when", "process", "n", "RSS", "PSS", "USS"], tree_rows(figures)),
        "",
        f"Over the runs (sampled every {figures[0].every if figures else SAMPLE_EVERY} after the "
        "warm-up and the run in flight; MiB; Redis `used_memory` "
        "of the whole server):",
        "",
        table(
            [
                "worker class",
                "runs",
                "tree RSS",
                "tree PSS",
                "worker RSS",
                "worker USS",
                "idle work horses",
                "Redis MiB",
            ],
            series_rows(figures),
        ),
        "",
        table(
            [
                "worker class",
                "runs",
                "tree RSS, last vs first",
                "tree PSS, last vs first",
                "Redis bytes per run handled",
                "seconds",
                f"flat within {GOAL_GROWTH:.0%}",
            ],
            growth_rows(figures),
        ),
    ]
    if census_of:
        lines += [
            "",
            f"Redis keys after the runs (`{census_of.kind}`; TTL range of those that have one; "
            "`no TTL` counts the keys without one and `members` the largest of those):",
            "",
            table(["key", "keys", "bytes", "TTL", "no TTL", "members"], census_of.keys),
        ]
        for other in figures[1:]:
            same = [(r[0], r[4]) for r in other.keys] == [(r[0], r[4]) for r in census_of.keys]
            lines += [
                "",
                f"`{other.kind}` left {'the same key patterns' if same else 'these keys'}"
                + (" (same TTL-less keys)." if same else ":"),
            ]
            if not same:
                lines += ["", table(["key", "keys", "bytes", "TTL", "no TTL", "members"], other.keys)]
    if parked:
        lines += [
            "",
            "Redis bytes per parked run: runs of N turns of `read_file` (each result cut to 2,000 "
            "characters), then a `write_file` they park on; `MEMORY USAGE` of every key naming the "
            "run or its thread, and the `INFO memory` `used_memory` delta over all of them divided "
            "by their number (which includes RQ's finished job hashes, kept `result_ttl` = 600 s, "
            "shown apart):",
            "",
            table(
                [
                    "turns",
                    "runs parked",
                    "state JSON bytes",
                    "record JSON bytes",
                    "run's keys, bytes",
                    "used_memory per run",
                    "of which RQ's",
                    "the run's keys",
                ],
                parked_rows(parked),
            ),
        ]
    if trace is not None:
        lines += ["", *trace_section(trace)]
    lines += ["", f"Reading: {reading(figures, parked, forever, met)}"]
    return "\n".join(lines)


def trace_section(trace: Trace) -> list[str]:
    return [
        f"What a `simple` worker keeps between two points {trace.runs} runs apart, by tracemalloc "
        "(`sitecustomize` in the worker only: tracing starts half way through the warm-up, each "
        "snapshot follows a full `gc.collect()`; innermost frames first): "
        f"{trace.traced_growth:,} bytes in all, {trace.traced_growth / trace.runs:,.0f} bytes per run.",
        "",
        table(
            ["allocated at", "bytes", "blocks"],
            [[f"`{' ← '.join(where.split(' ← ')[:4])}`", size, count] for where, size, count in trace.top],
        ),
        "",
        "Live objects gained by type (after `gc.collect()`): "
        + (", ".join(f"{name} +{n}" for name, n in trace.types) or "none")
        + ".",
    ]


def reading(
    figures: Sequence[ClassFigures], parked: Sequence[ParkedRow], forever: list[list[Any]], met: bool
) -> str:
    parts = []
    for f, row in zip(figures, growth_rows(figures), strict=True):
        parts.append(
            f"`{f.kind}`: idle tree {_mib(f.warmed.total.pss):.0f} MiB PSS "
            f"({_mib(f.warmed.total.rss):.0f} MiB RSS), {_mib(f.in_flight.total.pss):.0f} MiB PSS with a run "
            f"in flight; over {row[1]} runs RSS {row[2]}, PSS {row[3]}"
        )
    verdict = (
        f"the worker's memory is flat within {GOAL_GROWTH:.0%} over the runs for every class measured"
        if met
        else f"the memory of at least one class grew by more than {GOAL_GROWTH:.0%}"
    )
    keys = (
        "Keys left without a TTL after the runs: "
        + ", ".join(
            f"{row[0]} ({row[4]} key{'s' if row[4] != 1 else ''}, up to {row[5]} members)" for row in forever
        )
        + "."
        if forever
        else "Every key left after the runs carries a TTL."
    )
    return "; ".join(parts) + f". So {verdict}. {keys}"


def measure() -> str:
    known, skipped = known_classes()
    for kind in skipped:
        progress(
            f"note: bench memory skips HARNESS_WORKER_CLASS={kind}: workers/process/main.py does not know it"
        )
    figures, parked, trace = [], [], None
    for kind in known:
        with rig(kind, traced=kind == "simple") as r:
            figures.append(measure_class(r, kind))
            if kind == "simple":  # neither depends on the class; jobs in one process are easier to trace
                parked = measure_parked(r)
                trace = trace_growth(r)
    return report(figures, parked, skipped, trace)


def run() -> str:
    try:
        return measure()
    except Exception:  # a benchmark that breaks reports it, it does not stop the others
        return "## Memory\n\nFailed:\n\n```\n" + traceback.format_exc() + "```\n"


if __name__ == "__main__":
    print(run())
