"""Extend in the store, on a real Redis through the store's own script: one step moves a park's
expiry everywhere it is held, once per count it was asked on, never past the limit, never for a
park that expired or moved on, and never over a record saved meanwhile."""

from __future__ import annotations

import time

import redis

from gates.deciders import escalated
from harness.config import Approvals
from store import DAY, ExtendOutcome, ExtendResult, RunRecord, Store
from store.keys import Keys
from tests.store.test_home_index import park


def held(store: Store, record: RunRecord) -> dict[str, float | None]:
    member = f"{record.run_id}:{record.park_id}"
    raw = store.redis.hget(Keys.approvals(record.run_id, record.park_id), "~expires")
    loaded = store.runs.load(record.run_id)
    return {
        "hash": float(raw) if raw else None,
        "expiries": store.redis.zscore(Keys.expiries(), member),
        "team": store.redis.zscore(Keys.team_parks(record.team), member),
        "user": store.redis.zscore(Keys.user_parks(record.team, record.requester), member),
        "record": loaded.expires_at if loaded else None,
    }


def extend(
    store: Store, record: RunRecord, seen: int, *, most: int = 2, now: float | None = None
) -> ExtendResult:
    read = store.escalations.read_run(record.run_id)
    assert read is not None
    raw, current = read
    return store.escalations.extend_park(
        raw, current, seen=seen, most=most, seconds=600, remind_before=60, now=now
    )


def test_extend_moves_every_place_that_holds_the_expiry_and_their_lifetimes(conn: redis.Redis) -> None:
    store = Store(conn)
    record = park(store, "UALICE", expires_in=120)
    assert record.expires_at is not None
    result = extend(store, record, 0)
    assert result.outcome is ExtendOutcome.EXTENDED and result.extensions == 1
    new = record.expires_at + 600
    assert all(v is not None and abs(v - new) < 0.001 for v in held(store, record).values())
    assert store.escalations.extensions(record.run_id, record.park_id) == (new, 1)
    assert store.runs.load(record.run_id).extensions == 1  # type: ignore[union-attr]
    for key in (Keys.run(record.run_id), Keys.approvals(record.run_id, record.park_id)):
        assert conn.ttl(key) >= 600 + DAY - 5
    due = conn.zscore(Keys.reminders(), f"{record.run_id}:{record.park_id}")
    assert due is not None and abs(due - (new - 60)) < 0.001  # the next reminder, before the new expiry


def test_a_second_click_on_the_same_count_and_a_click_past_the_limit_change_nothing(
    conn: redis.Redis,
) -> None:
    store = Store(conn)
    record = park(store, "UALICE", expires_in=120)
    assert extend(store, record, 0, most=1).outcome is ExtendOutcome.EXTENDED
    before = held(store, record)
    assert extend(store, record, 0, most=1).outcome is ExtendOutcome.TAKEN
    assert extend(store, record, 1, most=1).outcome is ExtendOutcome.MOST
    assert held(store, record) == before


def test_no_extension_at_all_when_max_extensions_is_zero(conn: redis.Redis) -> None:
    store = Store(conn)
    record = park(store, "UALICE", expires_in=120)
    before = held(store, record)
    assert extend(store, record, 0, most=0).outcome is ExtendOutcome.MOST
    assert held(store, record) == before


def test_an_expired_or_forgotten_park_is_not_extended_nor_put_back_in_any_index(conn: redis.Redis) -> None:
    store = Store(conn)
    record = park(store, "UALICE", expires_in=120)
    assert record.expires_at is not None
    late = extend(store, record, 0, now=record.expires_at + 0.001)
    assert late.outcome is ExtendOutcome.EXPIRED
    store.parks.forget(record)  # what a resume, a stop or the expiry does
    assert extend(store, record, 0).outcome is ExtendOutcome.EXPIRED
    state = held(store, record)
    assert state["expiries"] is None and state["team"] is None and state["user"] is None
    assert conn.zscore(Keys.reminders(), f"{record.run_id}:{record.park_id}") is None


def test_a_record_saved_between_read_and_extend_is_not_overwritten(conn: redis.Redis) -> None:
    store = Store(conn)
    record = park(store, "UALICE", expires_in=120)
    read = store.escalations.read_run(record.run_id)
    assert read is not None
    raw, current = read
    conn.set(Keys.run(record.run_id), current.to_json() + " ", keepttl=True)  # someone saved it meanwhile
    result = store.escalations.extend_park(
        raw, current, seen=0, most=1, seconds=600, remind_before=0, now=time.time()
    )
    assert result.outcome is ExtendOutcome.MOVED
    assert store.escalations.extensions(record.run_id, record.park_id)[1] == 0


def test_an_extended_park_stays_escalated_and_counts_its_age_from_the_park(conn: redis.Redis) -> None:
    store = Store(conn)
    record = park(store, "UALICE", expires_in=120)  # an hour's park, 58 min in
    approvals = Approvals(expire_after_minutes=60, escalate_after_minutes=30, escalate_to=("UBOSS",))
    assert record.expires_at is not None and escalated(approvals, record)
    read = store.escalations.read_run(record.run_id)
    assert read is not None
    result = store.escalations.extend_park(*read, seen=0, most=1, seconds=3600, remind_before=0)
    assert result.outcome is ExtendOutcome.EXTENDED
    moved = store.runs.load(record.run_id)
    assert moved is not None and moved.expires_at == record.expires_at + 3600
    assert moved.parked_at(60) == record.parked_at(60) == record.expires_at - 3600
    assert escalated(approvals, moved)  # escalate_to keep their say after an Extend
