"""Upgrades that never orphan a run, with real processes on a real Redis.

- A worker meeting runs whose records a newer release wrote (a queued one and a parked one whose
  decision is in) leaves them exactly as they were, says so once, shows them in `workers status`,
  and drives them to their end once they read again (a newer worker would have written them so).
- The previous release (commit 99a4bc2, checked out in a git worktree of its own) parks runs and
  queues one; this release's bot and worker take over: every run finishes once, every call with a
  side effect runs once.

Every run's side effects go through two tools that append their key to a ledger, so "once" is
counted, not assumed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from harness.state import STATE_VERSIONS
from runtime.queue import make_queue
from store import RECORD_VERSION, RunRecord, RunStatus, pack, unpack
from store.keys import Keys
from store.threads import HISTORY_VERSIONS
from tests.e2e.test_failover import TOOLS
from tests.e2e.test_faults import FAST_LEASE, card_of, is_card, posts, wait_text
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import ROOT, Process, Stack, wait_until

pytestmark = pytest.mark.e2e

PREVIOUS_RELEASE = "99a4bc2"  # the last commit of the release before this one

# The ledger tools of the failover test: `stamp` (allow) and `sign` (ask) each write their key once.

CONFIG = """
[tools]
modules = ["upgrade_tools"]
[policy.tools]
stamp = "allow"
sign = "ask"
[approvals]
approvers = ["UANN"]
"""


@pytest.fixture
def modules(tmp_path: Path) -> Path:
    found = tmp_path / "modules"
    found.mkdir()
    (found / "upgrade_tools.py").write_text(textwrap.dedent(TOOLS))
    return found


@pytest.fixture
def stack(redis_url: str, tmp_path: Path, modules: Path) -> Iterator[Stack]:
    env = {**FAST_LEASE, "PYTHONPATH": f"{ROOT}:{modules}"}
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        stack = Stack(redis_url, slack, model, tmp_path / "stack", config=CONFIG, extra_env=env)
        try:
            yield stack
        finally:
            stack.stop()


def ledger(stack: Stack) -> list[str]:
    path = stack.workspace / "ledger.txt"
    return sorted(path.read_text().split()) if path.exists() else []


def record_of(conn: redis.Redis, run_id: str) -> RunRecord:
    record = RunRecord.from_json(unpack(conn.get(Keys.run(run_id))))
    assert record is not None
    return record


def run_of(conn: redis.Redis, channel: str) -> RunRecord:
    """The one run asked for in `channel`."""
    found = [RunRecord.from_json(unpack(conn.get(k))) for k in conn.scan_iter(Keys.all_runs())]
    [record] = [r for r in found if r.channel == channel]
    return record


def answered(stack: Stack, channel: str, ts: str, answer: str) -> int:
    """How many posts of the thread carry `answer` (a run that finished twice would post it twice)."""
    return sum(answer in m["text"] for m in posts(stack, channel, ts))


def watchdog_passes(conn: redis.Redis, n: int = 2) -> None:
    """Wait until a worker's watchdog made `n` more passes: each removes a member of the active set
    that is no run of ours (`RunStore.orphans`). Two removals: at least one whole pass began after
    this call, held runs looked at again, orphans, expiries and all."""
    for i in range(n):
        conn.zadd(Keys.active(), {f"not-a-run-{i}": 0})
        wait_until(lambda i=i: conn.zscore(Keys.active(), f"not-a-run-{i}") is None, timeout=30)


def lines_about(process: Process, run_id: str, words: str) -> int:
    """How many lines of `process`'s log name `run_id` and say `words`."""
    return sum(words in line and run_id in line for line in process.output().splitlines())


# --- records of a newer release ------------------------------------------------------------------


def test_a_worker_leaves_runs_a_newer_release_wrote_as_they_were_until_it_reads_them(
    stack: Stack,
) -> None:
    """P parked, decided, its harness state newer; Q queued, its record newer; R queued in a thread
    whose history is newer (an earlier run of the thread saved it)."""
    conn = redis.Redis.from_url(stack.redis_url)
    stack.model.script_for("upp:", reply(tool_use("sign", {"key": "p"})), reply(text("p done")))
    stack.model.script_for("upq:", reply(tool_use("stamp", {"key": "q"})), reply(text("q done")))
    stack.model.script_for("upr:", reply(text("first done")), reply(tool_use("stamp", {"key": "r"})))
    stack.model.script_for("upr:", reply(text("r done")))
    stack.start_bot()
    first = stack.start_worker()
    _, p_ts, _ = stack.mention("upp: sign p", channel="C1", user="UANN")
    _, r_ts, _ = stack.mention("upr: hello", channel="C3", user="UANN")
    card = card_of(stack, "C1", p_ts)
    wait_text(stack, "C3", r_ts, "first done")
    stack.settled()
    first.stop()
    # Then, no worker running: P's decision is in (the run active, its resume job queued), Q and R
    # are queued, and a newer release rewrites P's harness state, Q's record and R's thread history.
    assert stack.click(card, "approve", user="UANN") == 200
    p = run_of(conn, "C1")
    wait_until(lambda: conn.hget(Keys.approvals(p.run_id, 1), value_of_call(card)))
    _, q_ts, _ = stack.mention("upq: stamp q", channel="C2", user="UANN")
    stack.mention("upr: stamp r", channel="C3", user="UANN", thread_ts=r_ts)
    wait_until(lambda: make_queue(conn).count == 3)  # P's resume, Q's and R's starts
    q = run_of(conn, "C2")
    [r] = [run for run in runs(conn) if run.channel == "C3" and run.status is RunStatus.QUEUED]
    originals = {run_id: conn.get(Keys.run(run_id)) for run_id in (p.run_id, q.run_id, r.run_id)}
    history = conn.hget(Keys.history(*r.thread), "data")
    newer_state(conn, p.run_id)
    newer_record(conn, q.run_id)
    newer_history(conn, r)
    before = stored(conn, p, q, r)
    seen = {ts: len(posts(stack, channel, ts)) for channel, ts in (("C1", p_ts), ("C2", q_ts), ("C3", r_ts))}

    done = make_queue(conn).finished_job_registry
    ran = done.count  # P's and R's first starts
    worker = stack.start_worker()
    wait_until(lambda: done.count == ran + 3, timeout=60)  # each job ran, to its end
    watchdog_passes(conn)

    assert stored(conn, p, q, r) == before  # byte for byte: records, park, history, active set, threads
    assert {m.decode() for m in conn.zrange(Keys.held(), 0, -1)} == set(originals)
    queue = make_queue(conn)
    assert (queue.count, queue.scheduled_job_registry.count, queue.failed_job_registry.count) == (0, 0, 0)
    assert not conn.keys("harness:lease:*")
    assert {ts: len(posts(stack, ch, ts)) for ch, ts in (("C1", p_ts), ("C2", q_ts), ("C3", r_ts))} == seen
    assert len(stack.model.requests) == 2 and ledger(stack) == []
    for run_id, what in (
        (p.run_id, f"stored run state has format version {max(STATE_VERSIONS) + 1}"),
        (q.run_id, f"stored run record has format version {RECORD_VERSION + 1}"),
        (r.run_id, f"stored thread history has format version {max(HISTORY_VERSIONS) + 1}"),
    ):
        said = [line for line in worker.output().splitlines() if run_id in line and "left untouched" in line]
        assert len(said) == 1 and what in said[0], worker.output()

    status = stack.spawn("status", "-m", "workers", "status")
    assert status.proc.wait(60) == 0, status.output()
    shown = status.output().splitlines()
    assert "Waiting for a newer version: 3" in shown
    shown = shown[shown.index("Waiting for a newer version: 3") + 1 :]
    for run_id, where in (
        (p.run_id, "T1/C1 awaiting_approval"),
        (q.run_id, "T1/C2 queued"),
        (r.run_id, "T1/C3 queued"),
    ):
        line = next(line for line in shown if line.startswith(f"  run {run_id}"))
        assert where in line and "left by a worker" in line and "newer than this release reads" in line

    # A newer worker would write them again in a format it reads; here, as they were.
    for run_id, raw in originals.items():
        conn.set(Keys.run(run_id), raw, keepttl=True)
    conn.hset(Keys.history(*r.thread), "data", history)
    for channel, ts, answer in (("C1", p_ts, "p done"), ("C2", q_ts, "q done"), ("C3", r_ts, "r done")):
        wait_text(stack, channel, ts, answer)
    stack.settled()
    assert ledger(stack) == ["p", "q", "r"]  # each side effect once
    for channel, ts, answer in (("C1", p_ts, "p done"), ("C2", q_ts, "q done"), ("C3", r_ts, "r done")):
        assert answered(stack, channel, ts, answer) == 1
    assert {record_of(conn, run_id).status for run_id in originals} == {RunStatus.FINISHED}
    assert conn.zcard(Keys.held()) == 0
    assert all(lines_about(worker, run_id, "left untouched for a newer release") == 1 for run_id in originals)
    assert all(record_of(conn, run_id).recoveries == 0 for run_id in originals)  # taken back, not recovered
    assert not any(lines_about(worker, run_id, "has no driver") for run_id in originals)  # no recovery job


def stored(conn: redis.Redis, p: RunRecord, q: RunRecord, r: RunRecord) -> dict[str, Any]:
    """What "untouched" compares: the runs' records, P's park, R's thread (history, lock and queue),
    the runs' places (and scores) in the active set, and the threads' locks."""
    ids = (p.run_id, q.run_id, r.run_id)
    return {
        "records": {run_id: conn.get(Keys.run(run_id)) for run_id in ids},
        "park": conn.hgetall(Keys.approvals(p.run_id, 1)),
        "history": conn.hgetall(Keys.history(*r.thread)),
        "waiting": conn.lrange(Keys.thread_waiting(*r.thread), 0, -1),
        "active": {run_id: conn.zscore(Keys.active(), run_id) for run_id in ids},
        "locks": [conn.get(Keys.thread_lock(*run.thread)) for run in (p, q, r)],
    }


def runs(conn: redis.Redis) -> list[RunRecord]:
    found = []
    for key in conn.scan_iter(Keys.all_runs()):
        try:
            found.append(RunRecord.from_json(unpack(conn.get(key))))
        except ValueError:
            continue
    return found


def value_of_call(card: dict[str, Any]) -> str:
    actions = next(b for b in card["blocks"] if b["type"] == "actions")
    return str(actions["elements"][0]["value"]).split(":")[1]


def newer_state(conn: redis.Redis, run_id: str) -> None:
    """Rewrite the run as a newer release would: its harness state in a format after this one's."""
    data = json.loads(unpack(conn.get(Keys.run(run_id))))
    data["state"]["version"] = max(STATE_VERSIONS) + 1
    conn.set(Keys.run(run_id), pack(json.dumps(data)), keepttl=True)


def newer_history(conn: redis.Redis, record: RunRecord) -> None:
    """Rewrite the thread's history as a newer release would: a format after this one's."""
    data = json.loads(unpack(conn.hget(Keys.history(*record.thread), "data")))
    data["version"] = max(HISTORY_VERSIONS) + 1
    conn.hset(Keys.history(*record.thread), "data", pack(json.dumps(data)))


def newer_record(conn: redis.Redis, run_id: str) -> None:
    """Rewrite the run as a newer release would: a record format after this one's."""
    data = json.loads(unpack(conn.get(Keys.run(run_id))))
    data["version"] = RECORD_VERSION + 1
    conn.set(Keys.run(run_id), pack(json.dumps(data)), keepttl=True)


# --- from the previous release --------------------------------------------------------------------


@pytest.fixture
def previous(tmp_path: Path) -> Iterator[Path]:
    """The previous release, checked out in a git worktree of its own (removed after)."""
    git = shutil.which("git")
    if git is None:
        pytest.skip(
            "UPGRADE PATH NOT TESTED: git is not on PATH, so the previous release cannot be checked out"
        )
    found = subprocess.run(
        [git, "-C", str(ROOT), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"], capture_output=True
    )
    if found.returncode != 0:
        pytest.skip(
            f"UPGRADE PATH NOT TESTED: commit {PREVIOUS_RELEASE} (the previous release) is not in this "
            f"clone (a shallow clone?); fetch it (git fetch --unshallow) to test the upgrade from it"
        )
    where = tmp_path / "previous-release"
    subprocess.run(
        [git, "-C", str(ROOT), "worktree", "add", "--detach", str(where), PREVIOUS_RELEASE],
        check=True,
        capture_output=True,
    )
    try:
        yield where
    finally:
        subprocess.run(
            [git, "-C", str(ROOT), "worktree", "remove", "--force", str(where)], capture_output=True
        )
        subprocess.run([git, "-C", str(ROOT), "worktree", "prune"], capture_output=True)


def test_runs_the_previous_release_parked_and_queued_finish_once_on_this_one(
    stack: Stack, previous: Path, modules: Path
) -> None:
    conn = redis.Redis.from_url(stack.redis_url)
    old_path = f"{previous}:{modules}"
    where = "import bot, store, workers; print(bot.__file__, store.__file__, workers.__file__)"
    found = subprocess.run(
        [sys.executable, "-c", where],
        cwd=previous,
        env=stack.env(PYTHONPATH=old_path),
        capture_output=True,
        text=True,
        check=True,
    )
    assert all(path.startswith(str(previous)) for path in found.stdout.split()), found.stdout
    stack.model.script_for("upa:", reply(tool_use("sign", {"key": "a"})), reply(text("a done")))
    stack.model.script_for("upb:", reply(tool_use("sign", {"key": "b"})), reply(text("b done")))
    stack.model.script_for("upc:", reply(tool_use("stamp", {"key": "c"})), reply(text("c done")))

    # The previous release: two runs parked, then, its worker gone, one decided and one queued.
    old_bot = stack.start_bot(root=previous, PYTHONPATH=old_path)
    old_worker = stack.start_worker(root=previous, PYTHONPATH=old_path)
    _, a_ts, _ = stack.mention("upa: sign a", channel="C1", user="UANN")
    _, b_ts, _ = stack.mention("upb: sign b", channel="C2", user="UANN")
    a_card, b_card = card_of(stack, "C1", a_ts), card_of(stack, "C2", b_ts)
    stack.settled()
    old_worker.stop()
    assert stack.click(b_card, "approve", user="UANN") == 200  # recorded by the previous release
    b = run_of(conn, "C2")
    wait_until(lambda: conn.hget(Keys.approvals(b.run_id, 1), value_of_call(b_card)))
    _, c_ts, _ = stack.mention("upc: stamp c", channel="C3", user="UANN")
    wait_until(lambda: make_queue(conn).count == 2)  # B's resume and C's start, for a worker to take
    old_bot.stop()
    assert "Traceback" not in old_bot.output() + old_worker.output()

    # This release takes over: B resumes on its old decision, C starts, A is approved now.
    stack.start_bot()
    worker = stack.start_worker()
    wait_text(stack, "C2", b_ts, "b done")
    wait_text(stack, "C3", c_ts, "c done")
    assert stack.click(a_card, "approve", user="UANN") == 200
    wait_text(stack, "C1", a_ts, "a done")
    stack.settled()

    assert ledger(stack) == ["a", "b", "c"]  # every side effect once
    for channel, ts, answer in (("C1", a_ts, "a done"), ("C2", b_ts, "b done"), ("C3", c_ts, "c done")):
        assert answered(stack, channel, ts, answer) == 1
        assert run_of(conn, channel).status is RunStatus.FINISHED
        assert sum(is_card(m) for m in posts(stack, channel, ts)) <= 1  # no card asked twice
    assert conn.zcard(Keys.held()) == 0 and "left untouched" not in worker.output()
    assert " refused: " not in worker.output() and "Traceback" not in worker.output()  # no run refused
    assert len(stack.model.requests) == 6  # two per run: nothing asked twice
