"""The Redis store on a real redis-server: atomic decisions, dedup, thread locks, key hygiene."""

from __future__ import annotations

import ast
import json
import threading
import time
import zlib
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
import redis
import rq
from rq.serializers import JSONSerializer

from harness.state import Decision, StateError, Verdict
from runtime.queue import enqueue_job, make_queue, queued_job
from store import LIMIT_CALL, Accepted, BadId, DecideOutcome, RunRecord, RunStatus, Store, new_run_id
from store.keys import Keys


def record(**overrides: object) -> RunRecord:
    fields = dict(
        run_id=new_run_id(), team="T1", channel="C1", thread_ts="1.000100", requester="UA", task="hi"
    )
    fields.update(overrides)
    return RunRecord(**fields)  # type: ignore[arg-type]


def parked(store: Store, call_ids: list[str], *, expires_in: float = 60, **overrides: object) -> RunRecord:
    """A run parked the way a driver parks it: under its lease, in one fenced step."""
    run = record(state={"x": 1}, **overrides)
    token = "driver-token"
    assert store.runs.acquire_lease(run.run_id, token, 30)
    run = replace(
        run, status=RunStatus.AWAITING_APPROVAL, park_id=run.park_id + 1, expires_at=time.time() + expires_in
    )
    assert store.parks.park(run, token, 30, call_ids, ttl=120)
    assert store.parks.settle(run, token, 30, ttl=120) == "parked"
    return run


def test_concurrent_decisions_on_one_call_yield_exactly_one(store: Store) -> None:
    run = parked(store, ["toolu_1"])
    results = []
    barrier = threading.Barrier(10)

    def click(i: int) -> None:
        barrier.wait()
        verdict = Verdict.APPROVED if i % 2 else Verdict.DECLINED
        results.append(store.parks.decide(run.run_id, run.park_id, "toolu_1", Decision(verdict, by=f"U{i}")))

    threads = [threading.Thread(target=click, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    recorded = [r for r in results if r.outcome is DecideOutcome.RECORDED]
    assert len(recorded) == 1
    assert all(r.decision == recorded[0].decision for r in results)
    assert store.parks.decisions(run.run_id, run.park_id) == {"toolu_1": recorded[0].decision}


def test_the_same_decision_twice_is_idempotent_and_unknown_calls_are_refused(store: Store) -> None:
    run = parked(store, ["toolu_1"])
    decision = Decision(Verdict.APPROVED, by="UA")
    assert store.parks.decide(run.run_id, run.park_id, "toolu_1", decision).outcome is DecideOutcome.RECORDED
    assert store.parks.decide(run.run_id, run.park_id, "toolu_1", decision).outcome is DecideOutcome.RECORDED
    assert store.parks.decide(run.run_id, run.park_id, "toolu_2", decision).outcome is DecideOutcome.UNKNOWN
    assert (
        store.parks.decide(run.run_id, run.park_id + 1, "toolu_1", decision).outcome is DecideOutcome.UNKNOWN
    )
    assert store.parks.decide(new_run_id(), 1, "toolu_1", decision).outcome is DecideOutcome.UNKNOWN


def test_a_click_after_the_expiry_time_records_the_expiry_not_the_click(store: Store) -> None:
    run = parked(store, ["toolu_1"], expires_in=5)
    late = time.time() + 6  # after expires_at, before any expiry job could have run
    result = store.parks.decide(
        run.run_id, run.park_id, "toolu_1", Decision(Verdict.APPROVED, by="UA"), now=late
    )
    assert result.outcome is DecideOutcome.EXPIRED
    assert store.parks.decisions(run.run_id, run.park_id) == {"toolu_1": Decision(Verdict.EXPIRED)}
    [entry] = store.audit.entries()
    assert entry["verdict"] == "expired" and entry["late_click_by"] == "UA"


def test_the_decision_completing_a_park_marks_the_run_active_for_recovery(
    store: Store, conn: redis.Redis
) -> None:
    run = parked(store, ["toolu_1", "toolu_2"])
    assert conn.zscore(Keys.active(), run.run_id) is None  # parked, undecided: nobody needs to drive it
    store.parks.decide(run.run_id, run.park_id, "toolu_1", Decision(Verdict.APPROVED, by="UA"))
    assert conn.zscore(Keys.active(), run.run_id) is None
    store.parks.decide(run.run_id, run.park_id, "toolu_2", Decision(Verdict.DECLINED, by="UA"))
    assert conn.zscore(Keys.active(), run.run_id) is not None
    assert store.runs.orphans(time.time() + 1, lambda job_id: False) == [
        run.run_id
    ]  # no lease, no job on its way


def test_a_settle_racing_the_last_decision_keeps_the_driver(store: Store, conn: redis.Redis) -> None:
    run = record(state={"x": 1})
    assert store.runs.acquire_lease(run.run_id, "tok", 30)
    run = replace(run, status=RunStatus.AWAITING_APPROVAL, park_id=1, expires_at=time.time() + 60)
    assert store.parks.park(run, "tok", 30, ["toolu_1"], ttl=120)
    store.parks.decide(
        run.run_id, 1, "toolu_1", Decision(Verdict.APPROVED, by="UA")
    )  # a click while cards post
    assert store.parks.settle(run, "tok", 30, ttl=120) == "ready"
    assert conn.get(Keys.lease(run.run_id)) == b"tok"  # still driven: it resumes at once


def test_a_new_park_never_touches_an_older_parks_decisions(store: Store) -> None:
    run = parked(store, ["toolu_1"])
    store.parks.decide(run.run_id, run.park_id, "toolu_1", Decision(Verdict.APPROVED, by="UA"))
    token = "second-driver"
    assert store.runs.acquire_lease(run.run_id, token, 30)
    second = replace(run, park_id=run.park_id + 1)
    assert store.parks.park(second, token, 30, ["toolu_9"], ttl=120)
    assert store.parks.decisions(run.run_id, run.park_id) == {"toolu_1": Decision(Verdict.APPROVED, by="UA")}
    assert store.parks.decisions(run.run_id, second.park_id) == {"toolu_9": None}


def test_writes_without_the_lease_change_nothing(store: Store, conn: redis.Redis) -> None:
    run = record(state={"x": 1})
    store.runs.save_run(run)
    assert store.runs.acquire_lease(run.run_id, "holder", 30)
    stale = replace(run, status=RunStatus.AWAITING_APPROVAL, park_id=1, expires_at=time.time() + 60)
    assert not store.runs.save(stale, "stale-driver", 30)
    assert not store.parks.park(stale, "stale-driver", 30, ["toolu_1"], ttl=120)
    assert store.parks.settle(stale, "stale-driver", 30, ttl=120) == "lost"
    assert store.runs.finish(stale, "stale-driver", history=({"role": "user", "content": "x"},)) is None
    assert store.runs.load(run.run_id) == run
    assert not conn.exists(Keys.approvals(run.run_id, 1), Keys.history(*run.thread))


def test_an_older_run_never_overwrites_the_history_a_newer_run_saved(store: Store) -> None:
    old, new = record(state={"x": 1}), record(state={"x": 2})
    for run in (old, new):
        assert store.runs.acquire_lease(run.run_id, "t", 30)
    # Both began on an empty thread; the newer one finishes first.
    assert store.runs.finish(replace(new, status=RunStatus.FINISHED), "t", history=("newer",)).history_saved  # type: ignore[arg-type]
    result = store.runs.finish(replace(old, status=RunStatus.FINISHED), "t", history=("older",))  # type: ignore[arg-type]
    assert result is not None and not result.history_saved
    assert store.threads.load_history(*old.thread) == (("newer",), 1)


def test_an_event_is_accepted_once_even_when_delivered_concurrently(store: Store, conn: redis.Redis) -> None:
    queue = make_queue(conn)
    accepted = []
    barrier = threading.Barrier(5)

    def deliver() -> None:
        barrier.wait()
        run = record()
        job = queued_job(queue, "workers.jobs.start_run", run.run_id, job_id=new_run_id())
        ok = store.admission.accept_event("T1", "Ev1", run, job, max_per_user=10, max_per_channel=10)
        accepted.append(ok)

    threads = [threading.Thread(target=deliver) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert accepted.count(Accepted.NEW) == 1 and accepted.count(Accepted.DUPLICATE) == 4
    assert queue.count == 1
    assert len(conn.keys("harness:run:*")) == 1
    [job] = queue.get_jobs()
    assert job.retries_left == 3  # every job, whoever enqueues it, is retried
    stored = conn.hget(job.key, "data")
    assert json.loads(zlib.decompress(stored))[0] == "workers.jobs.start_run"  # JSON, never pickle
    [run_id] = [k.decode().rsplit(":", 1)[1] for k in conn.keys("harness:run:*")]
    assert conn.zscore(Keys.active(), run_id) is not None  # a job that dies before its lease is noticed


def test_a_requester_and_a_channel_have_a_bound_of_runs(store: Store, conn: redis.Redis) -> None:
    queue = make_queue(conn)

    def mention(event: str, user: str, channel: str) -> Accepted:
        run = record(requester=user, channel=channel)
        job = queued_job(queue, "workers.jobs.start_run", run.run_id, job_id=new_run_id())
        return store.admission.accept_event("T1", event, run, job, max_per_user=2, max_per_channel=3)

    assert [mention(f"Ev{i}", "UA", "C1") for i in range(3)] == [
        Accepted.NEW,
        Accepted.NEW,
        Accepted.USER_BUSY,
    ]
    assert mention("Ev3", "UB", "C1") is Accepted.NEW
    assert mention("Ev4", "UC", "C1") is Accepted.CHANNEL_BUSY
    assert mention("Ev5", "UC", "C2") is Accepted.NEW
    assert mention("Ev0", "UA", "C1") is Accepted.DUPLICATE  # the retry of a refused event stays refused
    assert queue.count == 4 and len(conn.keys("harness:run:*")) == 4


def test_a_thread_has_one_active_run_and_queues_the_rest(store: Store) -> None:
    first, second = record(state={"x": 1}), record(state={"x": 2})
    assert store.threads.take(first, 60)
    assert not store.threads.take(second, 60)
    assert not store.threads.take(second, 60)  # queued once, not twice
    assert store.threads.holder(first) == first.run_id
    assert store.runs.acquire_lease(first.run_id, "t", 30)
    result = store.runs.finish(replace(first, status=RunStatus.FINISHED), "t", history=None)
    assert result is not None and result.next_run == second.run_id
    assert store.threads.take(second, 60)


def test_parked_runs_carry_a_ttl_and_every_key_is_under_the_prefix(store: Store, conn: redis.Redis) -> None:
    run = parked(store, ["toolu_1"])
    store.threads.take(run, 60)
    store.parks.decide(run.run_id, run.park_id, "toolu_1", Decision(Verdict.APPROVED, by="UA"))
    for key in conn.keys("*"):
        assert key.startswith(b"harness:"), key
        if key not in {k.encode() for k in (Keys.active(), Keys.expiries(), Keys.audit(), Keys.audit_head())}:
            assert 0 < conn.ttl(key) <= 30 * 24 * 3600, key
    assert 0 < conn.ttl(Keys.run(run.run_id)) <= 120
    loaded = store.runs.load(run.run_id)
    assert loaded is not None and loaded.status is RunStatus.AWAITING_APPROVAL and loaded.park_id == 1


def _key_spellings(path: Path) -> list[str]:
    """Where `path` spells a Redis key itself: a `harness:` string that is no docstring, or the
    store's PREFIX imported to build one."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if "harness:" in node.value:
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("store"):
            found += [f"{path.name}:{node.lineno} imports PREFIX" for a in node.names if a.name == "PREFIX"]
    return found


def test_every_key_is_spelled_in_the_stores_keys_module() -> None:
    """`Keys` is the one place a key is spelled: the product's other modules ask it for their keys."""
    root = Path(__file__).resolve().parents[2]
    keys_module = root / "store" / "keys.py"
    assert keys_module.is_file()
    spelled = [
        where
        for package in (
            "harness",
            "store",
            "observe",
            "runtime",
            "gates",
            "ops",
            "bot",
            "workers",
            "playground",
            "launch",
        )
        for path in sorted((root / package).rglob("*.py"))
        if path != keys_module
        for where in _key_spellings(path)
    ]
    assert spelled == []


def test_the_key_check_finds_a_key_spelled_elsewhere(tmp_path: Path) -> None:
    """The check above sees a key built outside `Keys` (so its silence means something)."""
    stray = tmp_path / "stray.py"
    stray.write_text(
        '"""Mentions harness:run: in a docstring, which is fine."""\n'
        "from store import PREFIX\n"
        'KEY = "harness:mine"\n'
    )
    assert _key_spellings(stray) == ["stray.py:2 imports PREFIX", "stray.py:3 'harness:mine'"]


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("run", "../../etc"),
        ("run", "abc"),
        ("call", "a:b"),
        ("ts", "1.2.3"),
        ("channel", "c1 ; DEL *"),
        ("team", None),
    ],
)
def test_ids_from_outside_are_validated_before_they_become_keys(kind: str, value: object) -> None:
    builders = {
        "run": lambda v: Keys.run(v),
        "call": lambda v: Store(redis.Redis()).parks.first_card_update(new_run_id(), 1, v),
        "ts": lambda v: Keys.retry_claim(new_run_id(), v),
        "channel": lambda v: Keys.history("T1", v, "1.1"),
        "team": lambda v: Keys.event(v, "Ev1"),
    }
    with pytest.raises(BadId):
        builders[kind](value)


def test_an_unreadable_record_is_refused(store: Store, conn: redis.Redis) -> None:
    run_id = new_run_id()
    conn.set(Keys.run(run_id), '{"version": 99}')
    with pytest.raises(StateError):
        store.runs.load(run_id)


def test_big_records_are_stored_compressed_and_read_back(store: Store, conn: redis.Redis) -> None:
    run = record(task="x" * 5000)
    store.runs.save_run(run)
    stored = conn.get(Keys.run(run.run_id))
    assert stored.startswith(b"z1:") and len(stored) < 1000
    assert store.runs.load(run.run_id) == run
    small = record()
    store.runs.save_run(small)
    assert conn.get(Keys.run(small.run_id)).startswith(b"{")
    assert store.runs.load(small.run_id) == small


def test_a_corrupt_compressed_record_is_refused(store: Store, conn: redis.Redis) -> None:
    run_id = new_run_id()
    conn.set(Keys.run(run_id), b"z1:not zlib at all")
    with pytest.raises(StateError):
        store.runs.load(run_id)


def test_a_queue_that_would_pickle_jobs_is_refused(conn: redis.Redis) -> None:
    import rq

    with pytest.raises(ValueError, match="JSONSerializer"):
        enqueue_job(rq.Queue("harness", connection=conn), "workers.jobs.start_run", new_run_id())
    assert conn.keys("rq:job:*") == []


def test_concurrent_mentions_of_one_requester_start_no_more_runs_than_the_bound(
    store: Store, conn: redis.Redis
) -> None:
    queue = make_queue(conn)
    accepted = []
    barrier = threading.Barrier(8)

    def deliver(i: int) -> None:
        run = record(requester="UA", channel=f"C{i}")
        job = queued_job(queue, "workers.jobs.start_run", run.run_id, job_id=new_run_id())
        barrier.wait()
        accepted.append(
            store.admission.accept_event("T1", f"Ev{i}", run, job, max_per_user=3, max_per_channel=3)
        )

    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(accepted) == sorted([Accepted.NEW] * 3 + [Accepted.USER_BUSY] * 5)
    assert queue.count == 3 and len(conn.keys("harness:run:*")) == 3


def test_an_accept_run_again_after_a_lost_reply_answers_new_and_writes_nothing_more(
    store: Store, conn: redis.Redis
) -> None:
    queue = make_queue(conn)
    run = record()
    job = queued_job(queue, "workers.jobs.start_run", run.run_id, job_id=new_run_id())
    first = store.admission.accept_event("T1", "EvLost", run, job, max_per_user=5, max_per_channel=5)
    # redis-py sends the script again when its reply was lost
    again = store.admission.accept_event("T1", "EvLost", run, job, max_per_user=5, max_per_channel=5)
    other = record()
    retry = queued_job(queue, "workers.jobs.start_run", other.run_id, job_id=new_run_id())
    slack_retry = store.admission.accept_event(
        "T1", "EvLost", other, retry, max_per_user=5, max_per_channel=5
    )
    assert (first, again, slack_retry) == (Accepted.NEW, Accepted.NEW, Accepted.DUPLICATE)
    assert queue.count == 1 and conn.zcard(Keys.user_runs("T1", "UA")) == 1


def test_a_mention_job_is_written_as_rq_writes_the_job_it_enqueues(store: Store, conn: redis.Redis) -> None:
    queue = make_queue(conn)
    run = record()
    job = queued_job(queue, "workers.jobs.start_run", run.run_id, job_id=new_run_id())
    assert (
        store.admission.accept_event("T1", "EvSame", run, job, max_per_user=5, max_per_channel=5)
        is Accepted.NEW
    )
    theirs = enqueue_job(queue, "workers.jobs.start_run", run.run_id, job_id=new_run_id())
    ours_hash, their_hash = conn.hgetall(job.key), conn.hgetall(theirs.key)
    for stamp in (b"created_at", b"enqueued_at"):  # when each was made: moments apart
        made = [datetime.fromisoformat(h.pop(stamp).decode().rstrip("Z")) for h in (ours_hash, their_hash)]
        assert abs((made[1] - made[0]).total_seconds()) < 5
    assert ours_hash == their_hash
    assert conn.lrange(queue.key, 0, -1) == [job.job_id.encode(), theirs.id.encode()]
    assert conn.ttl(job.key) == conn.ttl(theirs.key) == -1
    assert conn.smembers("rq:queues") == {queue.key.encode()}
    assert conn.get(Keys.pending(run.run_id)) == job.job_id.encode()


class Unsubscribed(rq.SimpleWorker):
    """Stock RQ but for its command channel, which a burst never reads: once unsubscribed, stock
    RQ's thread on it sleeps out its 60 s (`run_in_thread(sleep_time=60)`) before the worker may
    leave (the product's worker does not; tests/e2e/test_horses.py)."""

    def subscribe(self) -> None:
        self.pubsub_thread = None


def test_a_stock_rq_worker_runs_a_job_written_by_accept_event(store: Store, conn: redis.Redis) -> None:
    queue = make_queue(conn)
    run = record()
    job = queued_job(queue, "os.getpid", job_id=new_run_id())
    assert (
        store.admission.accept_event("T1", "EvWork", run, job, max_per_user=5, max_per_channel=5)
        is Accepted.NEW
    )
    worker = Unsubscribed([queue], connection=conn, serializer=JSONSerializer)
    assert worker.work(burst=True)
    assert rq.job.Job.fetch(job.job_id, connection=conn, serializer=JSONSerializer).get_status() == "finished"


def test_what_a_park_kept_for_its_cards_reads_back_typed_and_a_hostile_value_as_unset() -> None:
    """`call_tools` comes from Redis: a value of the wrong type there never reaches a card or a
    policy decision as something else (a schema that is a string, a tier that is a list)."""
    from store import CallTool, LimitAsk

    kept = CallTool(intent="I will write it", schema={"type": "object"}, own_tier="allow", preview="+1 line")
    run = replace(
        record(),
        call_tools={
            "toolu_1": kept.to_json(),
            LIMIT_CALL: LimitAsk("Go on?", "max_turns", "5 more").to_json(),
        },
    )
    again = RunRecord.from_json(run.to_json())
    assert again.call_tool("toolu_1") == kept and again.limit_ask() == LimitAsk(
        "Go on?", "max_turns", "5 more"
    )
    assert again.call_tool("toolu_9") == CallTool()  # nothing kept: nothing shown
    hostile = replace(
        run, call_tools={"toolu_1": {"schema": "x", "own_tier": ["deny"], "preview": 7}, LIMIT_CALL: "?"}
    )
    assert hostile.call_tool("toolu_1") == CallTool() and hostile.limit_ask() == LimitAsk()
