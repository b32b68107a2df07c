"""The poller of parked tasks: the watchdog's pass over the tasks its worker's hub reaches.

Each due task (`store.tasks`) is claimed by one watchdog, whose hub asks the server where it stands
(`tasks/get`, `harness.tools.tasks.TaskHost`): still working, it is polled again at the server's
pace (its `pollInterval`, else backing off to a minute) and its note in the thread shows the
server's status message when that changed; ended, its result is kept beside the park and recorded
as the park's one decision, and the run is resumed on any worker. A task whose park is over (its
run was stopped, or its time ran out) is cancelled (`tasks/cancel`) and forgotten.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis
import rq

from harness import texts
from harness.state import Decision, NewerRecord, Verdict
from harness.tools import ToolResult
from harness.tools.tasks import UNREACHABLE, TaskHost
from messages import server_tasks
from runtime.queue import enqueue_run_job, make_queue
from store import RunStatus, Store, TaskEntry
from store.parks import DecideOutcome
from workers import jobs
from workers.driver import lease_seconds
from workers.services import Services
from workers.tasks import TASK_ENDED

log = logging.getLogger("workers.tasks")

RETRY_SECONDS = 30.0  # a poll that failed on our side (Redis, Slack) is tried again this much later


def poll_due(svc: Services, host: TaskHost, queue: rq.Queue, now: float | None = None) -> int:
    """Poll every task due by `now` that `host` reaches; returns how many were polled."""
    now = time.time() if now is None else now
    polled = 0
    # A claim lasts a lease: a poller that dies mid-poll leaves the task to another that soon.
    for run_id, park_id in svc.store.tasks.claim_due(host.holder, now, claim=lease_seconds()):
        entry = svc.store.tasks.entry(run_id, park_id)
        if entry is None:  # gone with its park's lifetime (or unreadable: logged): polled no more
            svc.store.tasks.forget(run_id, park_id, "")
            svc.store.tasks.forget(run_id, park_id, host.holder)
            continue
        try:
            _poll(svc, host, queue, run_id, park_id, entry)
            polled += 1
        except NewerRecord:
            svc.store.tasks.again(run_id, park_id, entry, time.time() + RETRY_SECONDS)
        except Exception:  # one task must not keep the others from their polls
            log.exception("run %s park %d: polling its task failed; trying again", run_id, park_id)
            svc.store.tasks.again(run_id, park_id, entry, time.time() + RETRY_SECONDS)
    return polled


def answer_orphans(svc: Services, queue: rq.Queue) -> int:
    """Answer every task whose hub is gone (its worker ended, and the stdio server that held the
    task with it): its call's outcome is unknown, and the run goes on. Returns how many."""
    answered = 0
    for run_id, park_id in svc.store.tasks.orphaned():
        entry = svc.store.tasks.entry(run_id, park_id)
        if entry is None:
            continue
        handle = entry.handle
        text = texts.MCP_TASK_HOLDER_GONE.format(server=handle.server, name=entry.name)
        log.warning("run %s: the worker that held the task of MCP server %s is gone", run_id, handle.server)
        _end(
            svc, queue, run_id, park_id, TaskEntry(entry.call_id, entry.name, handle, ToolResult(text, True))
        )
        answered += 1
    return answered


def _end(svc: Services, queue: rq.Queue, run_id: str, park_id: int, ended: TaskEntry) -> None:
    """The task ended with `ended.result`: kept beside the park, recorded as its decision, and the
    run resumed on any worker (also when the park's time ran out meanwhile: the result answers)."""
    svc.store.tasks.ended(run_id, park_id, ended)
    result = svc.store.parks.decide(
        run_id, park_id, ended.call_id, Decision(Verdict.APPROVED, by=None), fingerprint=TASK_ENDED
    )
    log.info(
        "run %s: the task of MCP server %s ended (%s)", run_id, ended.handle.server, result.outcome.value
    )
    if result.outcome in (DecideOutcome.RECORDED, DecideOutcome.EXPIRED):
        enqueue_run_job(svc.store, queue, jobs.apply_decisions, run_id)


def _poll(
    svc: Services, host: TaskHost, queue: rq.Queue, run_id: str, park_id: int, entry: TaskEntry
) -> None:
    record = jobs.load_record(svc.store, run_id)
    view = svc.store.parks.view(run_id, park_id)
    decision = view.decisions.get(entry.call_id)
    waiting = (
        record is not None
        and record.status is RunStatus.AWAITING_APPROVAL
        and record.park_id == park_id
        and view.stop_by is None
        and decision is None
    )
    handle = entry.handle
    if not waiting:
        if decision is not None and decision.verdict is Verdict.APPROVED:
            return  # its end was recorded (a poll's answer raced the resume): nothing to cancel
        acked = host.cancel_task(handle)
        log.info(
            "run %s: the task of MCP server %s is no longer waited for; tasks/cancel sent (%s)",
            run_id,
            handle.server,
            "acknowledged" if acked else "not acknowledged",
        )
        svc.store.tasks.forget(run_id, park_id, handle.holder)
        return
    assert record is not None
    poll = host.poll_task(handle)
    if poll.result is None:
        if poll.status == UNREACHABLE:
            log.info("run %s: MCP server %s cannot be asked about its task now", run_id, handle.server)
            seen = handle.seen(handle.status, handle.message, None)
        else:
            seen = handle.seen(poll.status, poll.message, poll.poll_seconds)
            changed = (seen.status, seen.message) != (handle.status, handle.message)
            if changed and entry.call_id in record.cards:
                note = server_tasks.task_note(tool=entry.name, handle=seen)
                svc.update(record.channel, record.cards[entry.call_id], note.text, note.blocks)
        # Polled again at its pace, and at the latest just past its deadline: the park's expiry
        # answers the call then, and that poll cancels the task.
        due = min(time.time() + seen.next_poll_in(), max(seen.deadline, time.time()) + 1)
        svc.store.tasks.again(run_id, park_id, TaskEntry(entry.call_id, entry.name, seen), due)
        return
    _end(svc, queue, run_id, park_id, TaskEntry(entry.call_id, entry.name, handle, poll.result))


TICK_SECONDS = 0.5  # how often the poller looks for due tasks (a server's interval is at least this)


def sweep_seconds() -> float:
    """How often a poller says its hub is alive and looks for the tasks of hubs gone: as often as
    the watchdog looks for runs whose driver died (half a lease, at most 5 s). A hub silent for
    two leases is gone, and its stdio servers' tasks with it."""
    return min(max(lease_seconds() / 2, 0.5), 5.0)


def poller(store: Store, stop: threading.Event, svc: Callable[[], Services], host: TaskHost) -> None:
    """The worker's task poller, until `stop`: a thread beside the watchdog, in the process that
    holds the hub (`svc`: the services in force at each pass, with `store`, its own connection)."""
    queue = make_queue(store.redis)
    swept = float("-inf")
    while True:
        try:
            if time.monotonic() - swept >= sweep_seconds():
                store.tasks.alive(host.holder, max(2, round(2 * lease_seconds())))
                answer_orphans(svc(), queue)
                swept = time.monotonic()
            poll_due(svc(), host, queue)
        except redis.RedisError as exc:
            log.warning("the task poller cannot reach Redis (%s); trying again", exc)
        except Exception:  # the poller must outlive any one bad pass
            log.exception("task poll pass failed; trying again")
        if stop.wait(TICK_SECONDS):
            return
