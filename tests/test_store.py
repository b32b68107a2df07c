"""The Redis store on a real redis-server: atomic decisions, dedup, thread locks, key hygiene."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis
import rq

from harness.state import Decision, StateError, Verdict
from workers.store import BadId, DecideOutcome, Keys, RunRecord, RunStatus, Store, new_run_id


@pytest.fixture
def conn(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def store(conn: redis.Redis) -> Store:
    return Store(conn)


def record(**overrides: object) -> RunRecord:
    fields = dict(
        run_id=new_run_id(), team="T1", channel="C1", thread_ts="1.000100", requester="UA", task="hi"
    )
    fields.update(overrides)
    return RunRecord(**fields)  # type: ignore[arg-type]


def test_concurrent_decisions_on_one_call_yield_exactly_one(store: Store) -> None:
    run = store.park(record(), ["toolu_1"], ttl=60)
    results = []
    barrier = threading.Barrier(10)

    def click(i: int) -> None:
        barrier.wait()
        verdict = Verdict.APPROVED if i % 2 else Verdict.DECLINED
        results.append(store.decide(run.run_id, "toolu_1", Decision(verdict, by=f"U{i}")))

    threads = [threading.Thread(target=click, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    recorded = [r for r in results if r.outcome is DecideOutcome.RECORDED]
    assert len(recorded) == 1
    assert all(r.decision == recorded[0].decision for r in results)
    assert store.decisions(run.run_id) == {"toolu_1": recorded[0].decision}


def test_the_same_decision_twice_is_idempotent_and_unknown_calls_are_refused(store: Store) -> None:
    run = store.park(record(), ["toolu_1"], ttl=60)
    decision = Decision(Verdict.APPROVED, by="UA")
    assert store.decide(run.run_id, "toolu_1", decision).outcome is DecideOutcome.RECORDED
    assert store.decide(run.run_id, "toolu_1", decision).outcome is DecideOutcome.RECORDED
    assert store.decide(run.run_id, "toolu_2", decision).outcome is DecideOutcome.UNKNOWN
    assert store.decide(new_run_id(), "toolu_1", decision).outcome is DecideOutcome.UNKNOWN


def test_resume_is_claimed_once_and_only_when_every_call_is_decided(store: Store) -> None:
    run = store.park(record(), ["toolu_1", "toolu_2"], ttl=60)
    store.decide(run.run_id, "toolu_1", Decision(Verdict.APPROVED, by="UA"))
    assert not store.claim_resume(run.run_id, run.park_id, "job-a")
    store.decide(run.run_id, "toolu_2", Decision(Verdict.DECLINED, by="UA"))
    assert store.claim_resume(run.run_id, run.park_id, "job-a")
    assert store.claim_resume(run.run_id, run.park_id, "job-a")  # the same claimer, retried
    assert not store.claim_resume(run.run_id, run.park_id, "job-b")


def test_an_event_is_accepted_once_even_when_delivered_concurrently(store: Store, conn: redis.Redis) -> None:
    queue = rq.Queue("harness-test", connection=conn)
    accepted = []
    barrier = threading.Barrier(5)

    def deliver() -> None:
        barrier.wait()
        run = record()
        ok = store.accept_event(
            "T1",
            "Ev1",
            run,
            lambda pipe: queue.enqueue_call("workers.jobs.start_run", args=(run.run_id,), pipeline=pipe),
        )
        accepted.append(ok)

    threads = [threading.Thread(target=deliver) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert accepted.count(True) == 1
    assert queue.count == 1
    assert len(conn.keys("harness:run:*")) == 1


def test_a_thread_has_one_active_run_and_queues_the_rest(store: Store) -> None:
    first, second = record(), record()
    assert store.take_thread(first, 60)
    assert not store.take_thread(second, 60)
    assert not store.take_thread(second, 60)  # queued once, not twice
    assert store.release_thread(second) is None  # not the holder: nothing changes
    assert store.thread_holder(first) == first.run_id
    assert store.release_thread(first) == second.run_id
    assert store.take_thread(second, 60)


def test_parked_runs_carry_a_ttl_and_every_key_is_under_the_prefix(store: Store, conn: redis.Redis) -> None:
    run = store.park(record(state={"x": 1}), ["toolu_1"], ttl=120)
    store.take_thread(run, 60)
    store.save_history("T1", "C1", "1.000100", ({"role": "user", "content": "hi"},))
    for key in conn.keys("*"):
        assert key.startswith(b"harness:"), key
        assert 0 < conn.ttl(key) <= 30 * 24 * 3600
    assert 0 < conn.ttl(Keys.run(run.run_id)) <= 120
    loaded = store.load_run(run.run_id)
    assert loaded is not None and loaded.status is RunStatus.AWAITING_APPROVAL and loaded.park_id == 1


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
        "call": lambda v: Keys.cards_done(new_run_id()) + Keys.retry_claim(new_run_id(), v),
        "ts": lambda v: Keys.thread("T1", "C1", v),
        "channel": lambda v: Keys.thread("T1", v, "1.1"),
        "team": lambda v: Keys.event(v, "Ev1"),
    }
    with pytest.raises(BadId):
        builders[kind](value)


def test_an_unreadable_record_is_refused(store: Store, conn: redis.Redis) -> None:
    run_id = new_run_id()
    conn.set(Keys.run(run_id), '{"version": 99}')
    with pytest.raises(StateError):
        store.load_run(run_id)


def test_big_records_are_stored_compressed_and_read_back(store: Store, conn: redis.Redis) -> None:
    run = record(task="x" * 5000)
    store.save_run(run)
    stored = conn.get(Keys.run(run.run_id))
    assert stored.startswith(b"z1:") and len(stored) < 1000
    assert store.load_run(run.run_id) == run
    small = record()
    store.save_run(small)
    assert conn.get(Keys.run(small.run_id)).startswith(b"{")
    assert store.load_run(small.run_id) == small


def test_a_corrupt_compressed_record_is_refused(store: Store, conn: redis.Redis) -> None:
    run_id = new_run_id()
    conn.set(Keys.run(run_id), b"z1:not zlib at all")
    with pytest.raises(StateError):
        store.load_run(run_id)
