"""The prefork worker (`HARNESS_WORKER_CLASS=prefork`, the default): one long-lived work horse
forked from the warmed worker, replaced when it dies, bloats or keeps a hung tool's thread.

Each test runs the real `python -m workers` and bot against the stand-ins and does the damage for
real: a SIGKILL of the horse alone in the middle of a model request, a memory limit every job
passes, a tool that never returns.
"""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fakes.messages_api import FakeMessagesAPI, Reply, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import ROOT, Process, Stack, descendants, wait_until
from workers.process import horses

pytestmark = pytest.mark.e2e

FAST_LEASE = {"HARNESS_LEASE_SECONDS": "2"}

HANGING_TOOL = '''
import threading

from harness.tools import ToolContext, tool

FOREVER = threading.Event()


@tool(side_effects=False)
def wait_forever(ctx: ToolContext) -> str:
    """Waits for something that never happens."""
    FOREVER.wait()
    return "never"
'''


@pytest.fixture
def fakes() -> Iterator[tuple[FakeSlackAPI, FakeMessagesAPI]]:
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        yield slack, model


def make_stack(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path, config: str = "", **env: str
) -> Stack:
    return Stack(redis_url, *fakes, tmp_path, config=config, extra_env={**FAST_LEASE, **env})


def horse_of(stack: Stack, worker: Process) -> int:
    """The pid of the worker's work horse (its child that is an RQ worker; RQ's scheduler is not)."""
    found = horse_or_none(stack, worker)
    assert found is not None, descendants(worker.proc.pid)
    return found


def horse_or_none(stack: Stack, worker: Process) -> int | None:
    conn = redis.Redis.from_url(stack.redis_url)
    registered = {int(pid) for key in conn.smembers("rq:workers") if (pid := conn.hget(key, "pid"))}
    horses_ = [p for p in descendants(worker.proc.pid) if _parent(p) == worker.proc.pid and p in registered]
    return horses_[0] if len(horses_) == 1 else None


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def replaced(stack: Stack, reason: str) -> float:
    """`harness_work_horses_replaced_total{reason=...}` as the bot's /metrics serves it."""
    with urllib.request.urlopen(f"{stack.url}/metrics", timeout=10) as answer:
        body = answer.read().decode()
    line = f'harness_work_horses_replaced_total{{reason="{reason}"}} '
    found = [row for row in body.splitlines() if row.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def answered(stack: Stack, channel: str, ts: str, needle: str) -> Any:
    return wait_until(
        lambda: next((m for m in stack.slack.messages(channel, ts) if needle in m["text"]), None), 60
    )


class Held:
    """The model's first request waits until the test lets it go; later ones answer at once."""

    def __init__(self, first: Reply, later: Reply) -> None:
        self.first, self.later = first, later
        self.arrived = threading.Event()
        self.go = threading.Event()
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            self.calls += 1
            first = self.calls == 1
        if not first:
            return self.later
        self.arrived.set()
        self.go.wait(60)
        return self.first


def test_a_horse_killed_mid_run_is_replaced_at_once_and_its_run_finished(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path
) -> None:
    stack = make_stack(fakes, redis_url, tmp_path)
    held = Held(reply(text("an answer nobody reads")), reply(text("finished after all")))
    stack.model.responder = held
    try:
        stack.start_bot()
        worker = stack.start_worker()
        _, ts, _ = stack.mention("hkill: say something", channel="CHK1", user="UANN")
        assert held.arrived.wait(30)  # the horse is in the middle of the run's model request
        doomed = horse_of(stack, worker)

        os.kill(doomed, signal.SIGKILL)
        wait_until(lambda: horse_or_none(stack, worker) not in (None, doomed), 30)
        held.go.set()

        answered(stack, "CHK1", ts, "finished after all")  # the watchdog handed the run on
        assert worker.proc.poll() is None, "the worker process must outlive its horse"
        assert "work horse died (killed by SIGKILL); forking a new one" in worker.output()
        assert replaced(stack, horses.CRASHED) == 1
        assert held.calls == 2  # the killed request and the recovered one, nothing more
    finally:
        held.go.set()
        stack.stop()


def test_a_horse_over_its_memory_limit_leaves_after_its_job_and_nothing_is_lost(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path
) -> None:
    stack = make_stack(fakes, redis_url, tmp_path, HARNESS_WORKER_MAX_RSS_MB="1")  # every horse is over
    stack.model.responder = lambda body: reply(text("short and sweet"))
    try:
        stack.start_bot()
        worker = stack.start_worker()
        pids = set()
        for i in range(3):
            pids.add(wait_until(lambda: horse_or_none(stack, worker), 30))  # the horse waiting for a job
            _, ts, _ = stack.mention(f"hmem{i}: say hi", channel=f"CHM{i}", user="UANN")
            answered(stack, f"CHM{i}", ts, "short and sweet")
            wait_until(lambda n=i + 1: replaced(stack, horses.MEMORY) >= n, 30)
        assert len(pids) == 3  # a fresh horse for every job
        assert "leaves after this job (memory)" in worker.output()
        assert replaced(stack, horses.CRASHED) == 0
        assert worker.proc.poll() is None
    finally:
        stack.stop()


def test_a_horse_keeping_a_hung_tools_thread_is_replaced_after_that_job(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path
) -> None:
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "hanging_tool.py").write_text(textwrap.dedent(HANGING_TOOL), encoding="utf-8")
    config = (
        '[tools]\nmodules = ["hanging_tool"]\n[limits]\ntool_timeout_seconds = 0.5\n'
        '[policy.tools]\nwait_forever = "allow"\n'
    )
    stack = make_stack(fakes, redis_url, tmp_path, config, PYTHONPATH=f"{ROOT}{os.pathsep}{modules}")
    stack.model.script(
        reply(text("warm: nothing to do")),  # the horse's first job: its threads are counted before it
        reply(tool_use("wait_forever", {})),
        reply(text("gave up waiting")),
        reply(text("next run, same worker")),
    )
    try:
        stack.start_bot()
        worker = stack.start_worker()
        _, ts, _ = stack.mention("hwarm: hello", channel="CHT0", user="UANN")
        answered(stack, "CHT0", ts, "warm: nothing to do")
        first = horse_of(stack, worker)

        _, ts, _ = stack.mention("hhang: wait for it", channel="CHT1", user="UANN")
        answered(stack, "CHT1", ts, "gave up waiting")  # the call timed out; the run went on
        wait_until(lambda: replaced(stack, horses.THREADS) == 1, 30)
        assert "leaves after this job (threads)" in worker.output()

        _, ts, _ = stack.mention("hnext: and now", channel="CHT2", user="UANN")
        answered(stack, "CHT2", ts, "next run, same worker")
        assert horse_of(stack, worker) != first
        assert replaced(stack, horses.CRASHED) == 0
    finally:
        stack.stop()


def test_a_stop_signal_reaches_the_horse_once_and_the_worker_leaves_cleanly(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path
) -> None:
    stack = make_stack(fakes, redis_url, tmp_path)
    held = Held(reply(text("finished before leaving")), reply(text("unexpected second request")))
    stack.model.responder = held
    try:
        stack.start_bot()
        worker = stack.start_worker()
        _, ts, _ = stack.mention("hstop: say something", channel="CHS1", user="UANN")
        assert held.arrived.wait(30)
        horse = horse_of(stack, worker)

        worker.proc.send_signal(signal.SIGTERM)  # a warm shutdown: the job in hand finishes first
        wait_until(lambda: "warm shut down requested" in worker.output(), 30)
        held.go.set()
        assert worker.proc.wait(30) == 0
        answered(stack, "CHS1", ts, "finished before leaving")
        assert not Path(f"/proc/{horse}").exists() or _parent(horse) != worker.proc.pid
        conn = redis.Redis.from_url(stack.redis_url)
        wait_until(lambda: conn.scard("rq:workers") == 0, 10)  # the horse unregistered itself
        assert held.calls == 1
    finally:
        held.go.set()
        stack.stop()


@pytest.fixture(params=[horses.HarnessSimpleWorker, horses.HarnessWorker])
def subscribed(request: pytest.FixtureRequest, redis_url: str) -> Any:
    """A worker of that class listening on its pubsub channel (its thread reading the connection)."""
    from rq import Queue

    conn = redis.Redis.from_url(redis_url)
    worker = request.param([Queue("harness-pubsub-test", connection=conn)], connection=conn)
    worker.subscribe()
    wait_until(lambda: worker.pubsub.subscribed)
    return worker


def test_a_stopping_worker_leaves_its_pubsub_channel_and_its_thread_ends(subscribed: Any) -> None:
    thread = subscribed.pubsub_thread
    subscribed.unsubscribe()
    assert not thread.is_alive()
    assert subscribed.pubsub.connection is None


def test_a_stopping_worker_does_not_wait_for_a_pubsub_thread_that_already_read_the_answer(
    subscribed: Any,
) -> None:
    """The interleaving that hung warm shutdowns for a minute: the thread had read the answer to the
    unsubscribe and waited for a new subscription when the worker stopped it."""
    subscribed.pubsub.unsubscribe()
    wait_until(lambda: not subscribed.pubsub.subscribed)  # read by the thread, which waits again
    done = threading.Event()
    threading.Thread(target=lambda: (subscribed.unsubscribe(), done.set()), daemon=True).start()
    assert done.wait(20), "the worker is still waiting for its pubsub thread"
    assert subscribed.pubsub.connection is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("HARNESS_WORKER_CLASS", "forking", "HARNESS_WORKER_CLASS must be one of prefork, fork, simple"),
        ("HARNESS_WORKER_MAX_RSS_MB", "lots", "HARNESS_WORKER_MAX_RSS_MB must be a whole number"),
        ("HARNESS_WORKER_MAX_JOBS", "-1", "HARNESS_WORKER_MAX_JOBS must be 0 (no limit) or more"),
    ],
)
def test_a_bad_worker_setting_is_one_line_and_exit_2(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI],
    redis_url: str,
    tmp_path: Path,
    name: str,
    value: str,
    message: str,
) -> None:
    stack = make_stack(fakes, redis_url, tmp_path, **{name: value})
    worker = stack.spawn("worker", "-m", "workers")
    assert worker.proc.wait(30) == 2
    assert message in worker.output()
    assert redis.Redis.from_url(redis_url).scard("rq:workers") == 0
