"""Parked tasks (`store.tasks`): a poll goes to one watchdog, and only to one whose hub reaches
the task; a Stop makes it due at once; an entry of a shape never written is refused, not used."""

from __future__ import annotations

import time

import redis

from harness.tools import ToolResult
from harness.tools.tasks import TaskHandle
from store import Store, TaskEntry, new_run_id
from store.keys import Keys
from store.tasks import CLAIM_SECONDS

HUB_A, HUB_B = "a" * 32, "b" * 32


def entry(holder: str = "", **changes: object) -> TaskEntry:
    now = time.time()
    handle = TaskHandle("jobs", "t-1", since=now, deadline=now + 60, holder=holder)
    return TaskEntry("toolu_1", "jobs__build", handle, **changes)  # type: ignore[arg-type]


def test_a_due_poll_goes_to_one_watchdog_whose_hub_reaches_the_task(store: Store) -> None:
    anyone, only_a = new_run_id(), new_run_id()
    store.tasks.schedule(anyone, 1, entry(), time.time() - 1, ttl=600)
    store.tasks.schedule(only_a, 1, entry(HUB_A), time.time() - 1, ttl=600)
    later = new_run_id()
    store.tasks.schedule(later, 1, entry(), time.time() + 600, ttl=600)

    assert store.tasks.claim_due(HUB_B, time.time()) == [(anyone, 1)]  # not A's stdio task
    assert store.tasks.claim_due(HUB_B, time.time()) == []  # claimed once
    assert store.tasks.claim_due(HUB_A, time.time()) == [(only_a, 1)]
    kept = store.tasks.entry(only_a, 1)
    assert kept is not None and kept.handle.holder == HUB_A and kept.call_id == "toolu_1"


def test_a_stop_makes_a_scheduled_poll_due_at_once(store: Store) -> None:
    run = new_run_id()
    store.tasks.schedule(run, 2, entry(HUB_A), time.time() + 600, ttl=600)
    assert store.tasks.claim_due(HUB_A, time.time()) == []
    store.tasks.poke(run, 2, HUB_A)
    assert store.tasks.claim_due(HUB_A, time.time()) == [(run, 2)]
    assert store.tasks.claim_due(HUB_A, time.time()) == []  # claimed: not due again at once


def test_a_claim_is_a_lease_so_a_poller_dying_mid_poll_loses_nothing(store: Store) -> None:
    run = new_run_id()
    store.tasks.schedule(run, 1, entry(), time.time() - 1, ttl=600)
    assert store.tasks.claim_due(HUB_A, time.time()) == [(run, 1)]
    assert store.tasks.claim_due(HUB_B, time.time() + 1) == []  # its poller holds it
    # That poller dies without saying when it is due next: the claim runs out, another takes it.
    assert store.tasks.claim_due(HUB_B, time.time() + CLAIM_SECONDS + 1) == [(run, 1)]
    store.tasks.ended(run, 1, entry(result=ToolResult("done")))  # ended: polled no more
    assert store.tasks.claim_due(HUB_B, time.time() + 10 * CLAIM_SECONDS) == []


def test_an_ended_task_keeps_its_result_for_the_resume(store: Store) -> None:
    run = new_run_id()
    store.tasks.schedule(run, 1, entry(), time.time() + 600, ttl=600)
    store.tasks.ended(run, 1, entry(result=ToolResult("built", False)))
    kept = store.tasks.entry(run, 1)
    assert kept is not None and kept.result == ToolResult("built", False)
    store.tasks.forget(run, 1)
    assert store.tasks.entry(run, 1) is None


def test_an_entry_or_member_of_a_shape_never_written_is_refused(store: Store, conn: redis.Redis) -> None:
    run = new_run_id()
    conn.set(Keys.task(run, 1), '{"call": "toolu_1", "name": "x", "handle": {"server": "s", "task_id": ""}}')
    assert store.tasks.entry(run, 1) is None  # an empty task id: no handle
    conn.set(Keys.task(run, 2), '{"call": "../../x", "name": "x", "handle": {"server": "s", "task_id": "t"}}')
    assert store.tasks.entry(run, 2) is None  # a call id we never write
    conn.set(Keys.task(run, 3), "not json")
    assert store.tasks.entry(run, 3) is None
    conn.zadd(Keys.task_polls(), {"not-a-run:1": 0, f"{run}:4": 0})
    assert store.tasks.claim_due(HUB_A, time.time()) == [(run, 4)]
    assert conn.zscore(Keys.task_polls(), "not-a-run:1") is None  # dropped, not polled forever


def test_the_tasks_of_a_hub_gone_are_handed_out_once_and_an_alive_hubs_never(store: Store) -> None:
    gone, alive = new_run_id(), new_run_id()
    store.tasks.schedule(gone, 1, entry(HUB_A), time.time() + 600, ttl=600)
    store.tasks.schedule(alive, 1, entry(HUB_B), time.time() + 600, ttl=600)
    store.tasks.alive(HUB_B, 60)
    assert store.tasks.orphaned() == [(gone, 1)]
    assert store.tasks.orphaned() == []  # once, and hub A is forgotten now that none is left
    assert store.tasks.claim_due(HUB_B, time.time() + 601) == [(alive, 1)]
