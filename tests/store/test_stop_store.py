"""The store's side of Stop, on a real redis-server: one first press, and a park that cannot miss it."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
import redis

from store import EVENT_TTL, RunRecord, RunStatus, Store, new_run_id
from store.keys import Keys


def run_record() -> RunRecord:
    return RunRecord(new_run_id(), "T1", "C1", "1.000100", "UA", "hi", state={"x": 1})


def test_only_the_first_of_concurrent_presses_is_kept(store: Store, conn: redis.Redis) -> None:
    run_id = new_run_id()
    barrier = threading.Barrier(8)
    answers: list[str | None] = []

    def press(user: str) -> None:
        barrier.wait()
        answers.append(store.runs.request_stop(run_id, user))

    threads = [threading.Thread(target=press, args=(f"U{i}X",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = store.runs.stop_requested(run_id)
    assert answers.count(None) == 1 and all(a == first for a in answers if a is not None)
    assert 0 < conn.ttl(Keys.stop_request(run_id)) <= 24 * 3600
    assert conn.zscore(Keys.active(), run_id) is not None  # the watchdog drives it if the job is lost
    assert Keys.stop_request(run_id).startswith("harness:")


def test_a_park_settling_after_a_press_keeps_its_driver(store: Store, conn: redis.Redis) -> None:
    run = run_record()
    assert store.runs.acquire_lease(run.run_id, "tok", 30)
    run = replace(run, status=RunStatus.AWAITING_APPROVAL, park_id=1, expires_at=time.time() + 60)
    assert store.parks.park(run, "tok", 30, ["toolu_1"], ttl=120)
    store.runs.request_stop(run.run_id, "UA")  # pressed while the cards were being posted
    assert store.parks.settle(run, "tok", 30, ttl=120) == "ready"
    assert conn.get(Keys.lease(run.run_id)) == b"tok"  # still driven: it stops at once


def test_a_park_settling_with_no_press_lets_go(store: Store, conn: redis.Redis) -> None:
    run = run_record()
    assert store.runs.acquire_lease(run.run_id, "tok", 30)
    run = replace(run, status=RunStatus.AWAITING_APPROVAL, park_id=1, expires_at=time.time() + 60)
    assert store.parks.park(run, "tok", 30, ["toolu_1"], ttl=120)
    assert store.parks.settle(run, "tok", 30, ttl=120) == "parked"
    assert conn.get(Keys.lease(run.run_id)) is None


def test_the_run_holding_a_thread_and_a_delivery_seen_once(store: Store) -> None:
    run = run_record()
    assert store.threads.thread_run(*run.thread) is None
    assert store.threads.take(run, 60)
    assert store.threads.thread_run(*run.thread) == run.run_id
    assert store.admission.first_delivery("T1", "Ev1") and not store.admission.first_delivery("T1", "Ev1")
    assert 0 < store.redis.ttl(Keys.event("T1", "Ev1")) <= EVENT_TTL


def test_a_save_reads_the_stop_and_the_driver_uses_that_reading_once(
    store: Store, conn: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slack_sdk import WebClient

    from harness.config import Config
    from runtime.queue import make_queue
    from workers import driver as driver_module
    from workers.driver import Driver
    from workers.services import Services

    monkeypatch.setattr(driver_module, "STOP_SEEN_SECONDS", 600)  # "just now", however slow the machine
    run = replace(run_record(), status=RunStatus.RUNNING)
    store.runs.save_run(run)
    svc = Services(store, make_queue(conn), WebClient(token="xoxb-unused"), Config(), model=None)  # type: ignore[arg-type]
    with Driver(svc, run.run_id) as driver:
        assert driver is not None
        driver.save()
        store.runs.request_stop(run.run_id, "UB")  # after the save read it: the next check looks again
        reads: list[str] = []
        original = store.runs.stop_requested
        monkeypatch.setattr(
            store.runs, "stop_requested", lambda run_id: reads.append(run_id) or original(run_id)
        )
        assert driver.stop_requested() is None  # the save's reading, taken just now
        assert driver.stop_requested() == "UB" and reads == [run.run_id]  # a reading serves one check
        driver.save()
        assert driver.stop_requested() == "UB" and reads == [run.run_id]
    assert store.runs.save(run, "not-the-holder", 30).ok is False
