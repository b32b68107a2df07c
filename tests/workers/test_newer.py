"""Runs a newer release wrote, as the watchdog meets them, on a real Redis: held and left as they
were (no recovery, no expiry, no reminder, one log line), taken back once this release reads them.
The worker processes themselves are in tests/e2e/test_upgrades.py."""

from __future__ import annotations

import json
import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from harness.policy import Tier
from harness.state import NewerRecord, PendingCall, RunState, Status, new_run
from runtime.queue import make_queue
from store import RECORD_VERSION, RunRecord, RunStatus, Store, new_run_id, pack
from store.keys import Keys
from workers import newer
from workers.jobs import expire_due
from workers.process.main import _expiry_reminder, _post_due

CALL = PendingCall("toolu_1", "write_file", {"path": "a.txt", "content": "a"}, Tier.ASK)


def queued(store: Store) -> RunRecord:
    record = RunRecord(new_run_id(), "T1", "C1", "1.2", "UALICE", "do it")
    store.runs.save_run(record)
    store.redis.zadd(Keys.active(), {record.run_id: time.time() - 600})  # its job long gone
    return record


def parked(store: Store, expires_at: float) -> RunRecord:
    state = RunState(
        messages=new_run("write").messages, status=Status.AWAITING_APPROVAL, pending=(CALL,), turns=1
    )
    record = RunRecord(
        new_run_id(),
        "T1",
        "C2",
        "1.3",
        "UALICE",
        "write",
        status=RunStatus.AWAITING_APPROVAL,
        state=state.to_json(),
        park_id=1,
        expires_at=expires_at,
    )
    store.runs.save_run(record)
    store.redis.hset(Keys.approvals(record.run_id, 1), mapping={CALL.id: "", "~expires": repr(expires_at)})
    store.redis.zadd(Keys.expiries(), {f"{record.run_id}:1": expires_at})
    store.escalations.schedule_reminder(record.run_id, 1, expires_at - 1)
    return record


def make_newer(conn: redis.Redis, record: RunRecord) -> bytes:
    """Rewrite `record` as a newer release would (a record version this release does not read)."""
    data = json.loads(record.to_json())
    data["version"] = RECORD_VERSION + 1
    conn.set(Keys.run(record.run_id), pack(json.dumps(data)))
    return bytes(conn.get(Keys.run(record.run_id)))


def snapshot(conn: redis.Redis) -> dict[bytes, object]:
    """Every key but the held set, as its type's read returns it (what "untouched" compares)."""
    out: dict[bytes, object] = {}
    for key in conn.scan_iter():
        if key == Keys.held().encode():
            continue
        kind = conn.type(key)
        if kind == b"string":
            out[key] = conn.get(key)
        elif kind == b"hash":
            out[key] = conn.hgetall(key)
        elif kind == b"zset":
            out[key] = conn.zrange(key, 0, -1, withscores=True)
        else:
            out[key] = kind
    return out


def test_the_watchdog_leaves_newer_runs_as_they_were_and_says_so_once(
    store: Store, conn: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "workers.newer")
    now = time.time()
    waiting, due = queued(store), parked(store, now - 5)  # the park's expiry and reminder are due
    make_newer(conn, waiting), make_newer(conn, due)
    newer.leave(store, waiting.run_id, _newer())  # as the job that met it left it
    queue = make_queue(conn)
    before = snapshot(conn)

    for _ in range(3):  # pass after pass: expiries, reminders, orphans, held runs
        assert expire_due(store, queue, time.time()) == 0
        assert store.escalations.claim_due_reminders(time.time()) == []
        assert store.runs.orphans(time.time(), lambda job_id: False) == []
        assert newer.TakeBack(every=0).run(store, queue, time.time()) == 0

    assert snapshot(conn) == before  # the records, the expiry, the reminder, the active set: as they were
    assert queue.count == 0
    assert {run_id for run_id, _ in store.held.held()} == {waiting.run_id, due.run_id}
    why = (
        f"stored run record has format version {RECORD_VERSION + 1}, newer than this release reads "
        f"(version {RECORD_VERSION}): a newer release wrote it"
    )
    lines = [r.getMessage() for r in caplog.records if r.name == "workers.newer"]
    held = (waiting.run_id, due.run_id)
    assert lines == [f"run {run_id} left untouched for a newer release: {why}" for run_id in held]


def test_a_held_run_this_release_reads_again_is_taken_back_and_driven(
    store: Store, conn: redis.Redis
) -> None:
    waiting, due = queued(store), parked(store, time.time() + 3600)
    originals = {r.run_id: conn.get(Keys.run(r.run_id)) for r in (waiting, due)}
    for record in (waiting, due):
        make_newer(conn, record)
        newer.leave(store, record.run_id, _newer())
    gone = new_run_id()
    newer.leave(store, gone, _newer())  # its record expired meanwhile
    queue = make_queue(conn)
    take_back = newer.TakeBack(every=0)
    assert take_back.run(store, queue, time.time()) == 0
    assert {run_id for run_id, _ in store.held.held()} == {waiting.run_id, due.run_id}  # the gone one left

    for run_id, raw in originals.items():  # a newer worker would have written them in a format we read
        conn.set(Keys.run(run_id), raw)
    assert take_back.run(store, queue, time.time()) == 2
    assert store.held.held() == []
    # The queued run needs a driver: one start_run. The parked one waits for its decision, no job.
    jobs = [queue.fetch_job(job_id) for job_id in queue.job_ids]
    found = [(j.func_name, list(j.args)) for j in jobs if j is not None]
    assert found == [("workers.jobs.start_run", [waiting.run_id])]
    assert conn.get(Keys.pending(waiting.run_id)) is not None  # the watchdog sends no recover_run beside it
    assert store.runs.orphans(time.time(), lambda job_id: job_id in queue.job_ids) == []


def test_a_held_run_is_looked_at_again_only_every_so_often(store: Store, conn: redis.Redis) -> None:
    record = queued(store)
    original = conn.get(Keys.run(record.run_id))
    make_newer(conn, record)
    newer.leave(store, record.run_id, _newer())
    queue, take_back, now = make_queue(conn), newer.TakeBack(every=30), time.time()
    assert take_back.run(store, queue, now) == 0
    conn.set(Keys.run(record.run_id), original)
    assert take_back.run(store, queue, now + 10) == 0  # read 10 s ago: not read again yet
    assert take_back.run(store, queue, now + 31) == 1


def test_a_newer_thread_history_leaves_a_queued_run_queued(store: Store, conn: redis.Redis) -> None:
    record = queued(store)
    history = pack(json.dumps({"version": 2, "messages": []}))
    conn.hset(Keys.history(*record.thread), mapping={"data": history, "seq": 4})
    with pytest.raises(NewerRecord, match="thread history has format version 2"):
        newer.look(store, record)
    assert store.threads.take(record, 60)
    assert store.threads.give_back(record) is None
    assert store.threads.thread_run(*record.thread) is None  # the thread is free again, as it was


def _newer() -> NewerRecord:
    return NewerRecord("run record", RECORD_VERSION + 1, {RECORD_VERSION})


def test_a_reminder_due_on_a_newer_run_stays_due_for_it(store: Store, conn: redis.Redis) -> None:
    """A reminder claimed before anyone held its run: the run is held, the reminder put back, not
    posted and not lost; while the run is held no watchdog claims it again."""
    now = time.time()
    due = parked(store, now + 3600)
    store.escalations.schedule_reminder(due.run_id, 1, now - 1)
    make_newer(conn, due)
    claimed = store.escalations.claim_due_reminders(now)
    assert claimed == [(due.run_id, 1)]
    svc: Any = SimpleNamespace(store=store)  # nothing else of it is touched: no post is built
    posted = _post_due(svc, claimed, _expiry_reminder, store.escalations.schedule_reminder, "reminder", now)
    assert posted == 0 and store.held.ids() == {due.run_id}
    assert conn.zscore(Keys.reminders(), f"{due.run_id}:1") == now  # due again, for the newer release
    assert store.escalations.claim_due_reminders(now + 1) == []
