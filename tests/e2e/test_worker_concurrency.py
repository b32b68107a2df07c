"""Many runs per worker: one prefork horse drives `HARNESS_WORKER_CONCURRENCY` runs at once.

Real processes throughout: the bot, one `python -m workers` (one horse), the stand-in model. The
model holds the runs' requests at a gate (`Gate`) so that a test knows how many runs are talking
to it at once, and can kill the worker tree with all of them in flight. Each run's tool appends
its key to a ledger, so a side effect that ran twice (or never) shows.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_faults import count, posts
from tests.fakes.messages_api import FakeMessagesAPI, Reply, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import ROOT, Stack, descendants, wait_until

pytestmark = pytest.mark.e2e

TOOLS = '''
import os
import threading

from harness.tools import ToolContext, tool

FOREVER = threading.Event()


@tool()
def stamp(ctx: ToolContext, key: str) -> str:
    """Write `key` down once."""
    with open(ctx.workspace / "ledger.txt", "a", encoding="utf-8") as ledger:
        ledger.write(key + "\\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    return f"stamped {key}"


@tool(side_effects=False)
def wait_forever(ctx: ToolContext) -> str:
    """Waits for something that never happens."""
    FOREVER.wait()
    return "never"
'''

CONFIG = """
[tools]
modules = ["concurrency_tools"]
[policy.tools]
stamp = "allow"
wait_forever = "allow"
[limits]
tool_timeout_seconds = 1
max_runs_per_user = 100
max_runs_per_channel = 100
"""

MARKER = re.compile(r"\bcc(\d+):")


class Gate:
    """The stand-in model's answers: a run `ccN:` is asked to stamp `stamp-N` (answered at once),
    then its next request is held until `open` (counted in `held`), then answered "ccN done".
    A run whose text says `hang` is asked to call `wait_forever` first."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.lock = threading.Condition()
        self.held = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        first = json.dumps(body["messages"][0])
        n = int(MARKER.search(first).group(1))  # type: ignore[union-attr]
        results = sum(
            1
            for m in body["messages"]
            if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"]
            if b.get("type") == "tool_result"
        )
        if "hang" in first and results == 0:
            return reply(tool_use("wait_forever", {}))
        if results == 0 or ("hang" in first and results == 1):
            return reply(tool_use("stamp", {"key": f"stamp-{n}"}))
        with self.lock:
            self.held += 1
            self.lock.notify_all()
        try:
            self.open.wait(120)
        finally:
            with self.lock:
                self.held -= 1
        if "stop me" in first:  # what it would do next: a Stop pressed meanwhile keeps it from running
            return reply(tool_use("stamp", {"key": f"after-stop-{n}"}))
        return reply(text(f"cc{n} done"))


@pytest.fixture
def modules(tmp_path: Path) -> Path:
    where = tmp_path / "modules"
    where.mkdir()
    (where / "concurrency_tools.py").write_text(textwrap.dedent(TOOLS), encoding="utf-8")
    return where


@pytest.fixture
def fakes() -> Iterator[tuple[FakeSlackAPI, FakeMessagesAPI]]:
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        yield slack, model


def make_stack(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path, modules: Path, **env: str
) -> tuple[Stack, Gate]:
    gate = Gate()
    fakes[1].responder = gate
    extra = {"PYTHONPATH": f"{ROOT}{os.pathsep}{modules}", "HARNESS_LEASE_SECONDS": "2", **env}
    return Stack(redis_url, *fakes, tmp_path, config=CONFIG, extra_env=extra), gate


def mention_all(stack: Stack, runs: range, words: str = "stamp it") -> dict[int, str]:
    threads, ts = [], {}

    def one(i: int) -> None:
        status, ts[i], _ = stack.mention(f"cc{i}: {words}", channel=f"CCC{i}", user="UANN")
        assert status == 200

    for i in runs:
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
    for t in threads:
        t.join(30)
    return ts


def answered(stack: Stack, i: int, ts: str) -> bool:
    return any(f"cc{i} done" in m["text"] for m in posts(stack, f"CCC{i}", ts))


def ledger(stack: Stack) -> list[str]:
    path = stack.workspace / "ledger.txt"
    return sorted(path.read_text().split()) if path.exists() else []


def horses_of(stack: Stack, worker: Any) -> list[int]:
    """The worker's work horses: its children that are RQ workers (not RQ's scheduler)."""
    import redis

    conn = redis.Redis.from_url(stack.redis_url)
    registered = {int(pid) for key in conn.smembers("rq:workers") if (pid := conn.hget(key, "pid"))}
    return [p for p in descendants(worker.proc.pid) if p in registered]


def test_one_horse_drives_many_runs_at_once_each_to_its_answer(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path, modules: Path
) -> None:
    stack, gate = make_stack(fakes, redis_url, tmp_path, modules, HARNESS_WORKER_CONCURRENCY="12")
    try:
        stack.start_bot()
        worker = stack.start_worker()
        ts = mention_all(stack, range(12))
        # All twelve wait on the model at once, in one horse: before, one run held the horse.
        with gate.lock:
            assert gate.lock.wait_for(lambda: gate.held == 12, timeout=60), gate.held
        assert len(horses_of(stack, worker)) == 1
        gate.open.set()
        for i in range(12):
            wait_until(lambda i=i: answered(stack, i, ts[i]), timeout=60)
        assert ledger(stack) == sorted(f"stamp-{i}" for i in range(12))
        assert stack.model.errors == []
        body = metrics_text(stack)
        assert 'harness_horse_runs_in_flight_bucket{le="16.0"} 12.0' in body  # each start saw ≤ 12
        assert "harness_job_slot_wait_seconds_count" in body
    finally:
        stack.stop()


def test_a_horse_sigkilled_with_20_runs_in_flight_loses_none_and_runs_no_side_effect_twice(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path, modules: Path
) -> None:
    stack, gate = make_stack(fakes, redis_url, tmp_path, modules, HARNESS_WORKER_CONCURRENCY="20")
    try:
        stack.start_bot()
        worker = stack.start_worker()
        ts = mention_all(stack, range(20))
        with gate.lock:  # every run stamped, and waits on its next model request
            assert gate.lock.wait_for(lambda: gate.held == 20, timeout=60), gate.held
        worker.kill_group()
        count("work horses SIGKILLed with 20 runs in flight")
        gate.open.set()  # the dead horse's requests are answered into closed sockets
        stack.start_worker()
        for i in range(20):
            wait_until(lambda i=i: answered(stack, i, ts[i]), timeout=90)
        stack.settled(timeout=60)
        assert ledger(stack) == sorted(f"stamp-{i}" for i in range(20))  # each once
        for i in range(20):  # and each answer posted once
            assert sum(f"cc{i} done" in m["text"] for m in posts(stack, f"CCC{i}", ts[i])) == 1
        assert stack.model.errors == []
    finally:
        stack.stop()


def test_one_runs_hung_tool_does_not_stall_the_others_and_the_horse_leaves_only_once_empty(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path, modules: Path
) -> None:
    stack, gate = make_stack(fakes, redis_url, tmp_path, modules, HARNESS_WORKER_CONCURRENCY="6")
    try:
        stack.start_bot()
        worker = stack.start_worker()
        first = horses_of(stack, worker)
        ts = mention_all(stack, range(5))
        with gate.lock:
            assert gate.lock.wait_for(lambda: gate.held == 5, timeout=60), gate.held
        hung = mention_all(stack, range(5, 6), words="hang, then stamp it")
        with gate.lock:  # its tool call timed out ("outcome unknown" is not asked: it is read-only)
            assert gate.lock.wait_for(lambda: gate.held == 6, timeout=60), gate.held
        assert horses_of(stack, worker) == first  # six runs in it: it does not leave
        gate.open.set()
        for i in range(6):
            wait_until(lambda i=i: answered(stack, i, {**ts, **hung}[i]), timeout=60)
        assert ledger(stack) == sorted(f"stamp-{i}" for i in range(6))
        # Empty now, it leaves for the thread its hung tool keeps, and a fresh horse takes over.
        wait_until(lambda: horses_of(stack, worker) not in ([], first), timeout=60)
        assert "leaves after this job (threads)" in worker.output()
    finally:
        stack.stop()


def test_stop_of_one_run_among_many_stops_it_alone(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path, modules: Path
) -> None:
    stack, gate = make_stack(fakes, redis_url, tmp_path, modules, HARNESS_WORKER_CONCURRENCY="8")
    try:
        stack.start_bot()
        stack.start_worker()
        ts = {**mention_all(stack, range(3)), **mention_all(stack, range(4, 8))}
        ts.update(mention_all(stack, range(3, 4), words="stamp it, then stop me"))
        with gate.lock:
            assert gate.lock.wait_for(lambda: gate.held == 8, timeout=60), gate.held
        working = wait_until(
            lambda: next((m for m in posts(stack, "CCC3", ts[3]) if "Working on it" in m["text"]), None)
        )
        assert stack.click(working, "stop", user="UANN") == 200
        gate.open.set()
        wait_until(lambda: any("Stopped by <@UANN>" in m["text"] for m in posts(stack, "CCC3", ts[3])))
        for i in (0, 1, 2, 4, 5, 6, 7):
            wait_until(lambda i=i: answered(stack, i, ts[i]), timeout=60)
        stack.settled()
        assert "after-stop-3" not in ledger(stack)  # the call it asked for after the Stop never ran
        assert ledger(stack) == sorted(f"stamp-{i}" for i in range(8))
    finally:
        stack.stop()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"HARNESS_WORKER_CONCURRENCY": "0"}, "HARNESS_WORKER_CONCURRENCY must be a whole number from 1"),
        ({"HARNESS_WORKER_CONCURRENCY": "many"}, "HARNESS_WORKER_CONCURRENCY must be a whole number from 1"),
        (
            {"HARNESS_WORKER_CONCURRENCY": "4", "HARNESS_WORKER_CLASS": "simple"},
            "needs HARNESS_WORKER_CLASS=prefork",
        ),
    ],
)
def test_a_concurrency_that_cannot_be_used_stops_the_worker_at_start_in_one_line(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI],
    redis_url: str,
    tmp_path: Path,
    env: dict[str, str],
    named: str,
) -> None:
    stack = Stack(redis_url, *fakes, tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "workers"],
        env=stack.env(**env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and named in lines[0], done.stderr


def metrics_text(stack: Stack) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{stack.url}/metrics", timeout=10) as answer:
        return str(answer.read().decode())
