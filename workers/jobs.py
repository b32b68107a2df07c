"""The RQ jobs: start, continue, resume, retry and recover runs; show decisions on their cards.

Every job that drives a run does one thing: take the run's lease and do what the run needs next
(`drive`), one phase after another in one loop (`life`) until the run is let go. A queued run
starts; a running one continues from its last checkpoint; a parked one resumes once every decision
is in; a failed one with a Retry click retries; an ended one pays what it still owes Slack and
lets its thread go. So a job may die anywhere: the run stays in `harness:active` with no lease,
the watchdog enqueues `recover_run`, and the next driver carries on from the last write. No job
ever waits for a human.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import rq

from harness.state import (
    Decision,
    NewerRecord,
    PendingCall,
    StateError,
    Verdict,
)
from observe import families, logs, metrics, tracing
from runtime.queue import enqueue_run_job
from store import (
    LIMIT_CALL,
    DecideOutcome,
    RunRecord,
    RunStatus,
    Store,
)
from workers import granting, newer, park_cards
from workers.driver import Driver
from workers.life import life
from workers.services import Services, handed_services, keep_handed

log = logging.getLogger(__name__)


def services() -> Services:
    """The services the worker handed this job (`workers.services.handed`). A job run by a worker
    that hands none (a plain RQ worker) builds them from the environment, once for its thread."""
    found = handed_services()
    if found is None:
        job = rq.get_current_job()
        found = Services.from_env(job.connection if job else None)
        keep_handed(found)
    return found


def enqueue(svc: Services, func: Any, run_id: str, *args: Any) -> None:
    """Enqueue a job about `run_id` with the retry policy every job gets."""
    enqueue_run_job(svc.store, svc.queue, func, run_id, *args)


def leaves_newer(job: Callable[..., None]) -> Callable[..., None]:
    """A job about a run that a newer release wrote ends there, having changed nothing of it: the
    run is left for that release (`workers.newer.leave`), and the job succeeds (no retry, no failure)."""

    @functools.wraps(job)
    def leaving(run_id: str, *args: Any) -> None:
        try:
            job(run_id, *args)
        except NewerRecord as exc:
            newer.leave(services().store, run_id, exc)

    return leaving


@leaves_newer
def start_run(run_id: str) -> None:
    """Start a queued run (the bot enqueues this for every mention)."""
    drive(run_id)


@leaves_newer
def recover_run(run_id: str) -> None:
    """Continue a run whose driver died (the watchdog enqueues this); counts as a recovery."""
    drive(run_id, recovering=True)


@leaves_newer
def retry_run(run_id: str, by: str | None = None) -> None:
    """Retry a failed run from its last state (the Retry button; who clicked is in the claim)."""
    drive(run_id)


@leaves_newer
def honour_stop(run_id: str) -> None:
    """Act on a Stop (the bot enqueues this): a parked run stops now; a driven one at its next step."""
    drive(run_id)


@leaves_newer
def apply_decisions(run_id: str) -> None:
    """Show new decisions on their cards; once every call of the park is decided, resume."""
    svc = services()
    svc.store.runs.job_started(run_id)
    record = load_record(svc.store, run_id)
    if record is None or record.status is not RunStatus.AWAITING_APPROVAL:
        return
    calls = pending_by_id(record)
    decisions = granting.spread_grants(svc, record, calls, svc.store.parks.decisions(run_id, record.park_id))
    if decisions and all(d is not None for d in decisions.values()):
        _drive(svc, run_id)  # the resume updates every card
        return
    votes = svc.store.parks.votes(run_id, record.park_id)
    for call_id, decision in decisions.items():
        card = record.cards.get(call_id)
        if card and call_id == LIMIT_CALL and decision is None and call_id in votes:  # Continues so far
            msg = park_cards.limit_card(svc, record, votes[call_id])
            svc.update(record.channel, card, msg.text, msg.blocks)
            continue
        if not card or call_id not in calls:
            continue
        if decision is None and call_id in votes:  # a quorum filling up: the card shows who so far
            msg = park_cards.approval_card(svc, record, calls[call_id], votes[call_id])
            svc.update(record.channel, card, msg.text, msg.blocks)
        elif decision is not None and svc.store.parks.first_card_update(run_id, record.park_id, call_id):
            msg = park_cards.decided_card(record, calls[call_id], decision)
            svc.update(record.channel, card, msg.text, msg.blocks)


@leaves_newer
def show_new_expiry(run_id: str, park_id: int) -> None:
    """After an Extend: the park's open cards (and its Approve all message) show the new expiry."""
    svc = services()
    record = load_record(svc.store, run_id)
    if record is None or record.status is not RunStatus.AWAITING_APPROVAL or record.park_id != park_id:
        return
    park_cards.redraw_open(svc, record)


def drive(run_id: str, *, recovering: bool = False) -> None:
    """Take the run's lease and do what it needs next; hand its thread on when it ends."""
    svc = services()
    svc.store.runs.job_started(run_id)
    _drive(svc, run_id, recovering)


def _drive(svc: Services, run_id: str, recovering: bool = False) -> None:
    """The job's part after `job_started` (once per job): the run's life under its lease, then the
    thread's next run enqueued, once the lease is let go."""
    following = None
    with Driver(svc, run_id) as driver:
        if driver is None:
            return  # someone else drives it, or there is no such run
        record = driver.record
        with (
            logs.bound(**logs.run_fields(record)),  # every line logged meanwhile names the run
            tracing.job_span(record.trace, _job_name(), run_id),
        ):
            following = life(svc, driver, recovering)
    if following:
        enqueue(svc, start_run, following)


def _job_name() -> str:
    """The RQ job driving the run now (`start_run`, `apply_decisions`, …): its span's name."""
    job = rq.get_current_job()
    return (job.func_name or "drive").rsplit(".", 1)[-1] if job is not None else "drive"


def expire_due(store: Store, queue: rq.Queue, now: float) -> int:
    """Answer every undecided call of every park past its expiry as expired; returns how many parks.
    A park a newer release wrote stays as it is, its expiry kept, for that release."""
    done = 0
    for run_id, park_id in store.escalations.due_expiries(now):
        try:
            done += _expire(store, queue, run_id, park_id, now)
        except NewerRecord as exc:
            newer.leave(store, run_id, exc)
    return done


def _expire(store: Store, queue: rq.Queue, run_id: str, park_id: int, now: float) -> int:
    """Expire park `park_id` of `run_id` if it is still the run's open park (1), and forget its expiry."""
    done = 0
    record = load_record(store, run_id)
    if record is not None and record.status is RunStatus.AWAITING_APPROVAL and record.park_id == park_id:
        calls = pending_by_id(record)
        for call_id, decision in store.parks.decisions(run_id, park_id).items():
            if decision is None:
                audit = record.audit_fields(calls.get(call_id)) | _kind(calls.get(call_id))
                result = store.parks.decide(
                    run_id, park_id, call_id, Decision(Verdict.EXPIRED), audit=audit, now=now
                )
                if result.outcome in (DecideOutcome.RECORDED, DecideOutcome.EXPIRED):
                    metrics.incr(store.redis, families.EXPIRATIONS, profile=record.profile)
        enqueue_run_job(store, queue, apply_decisions, run_id)
        done = 1
    if record is not None and record.park_id == park_id:
        store.parks.forget(record)  # its Home tab indexes too
    else:
        store.escalations.forget_expiry(run_id, park_id)
    return done


def _kind(call: PendingCall | None) -> dict[str, str]:
    """What an expiry answers, when it is not an approval: a server's question, or its task's time."""
    if call is not None and call.tasking is not None:
        return {"kind": "task"}
    if call is not None and call.asking is not None:
        return {"kind": "input"}
    return {}


def load_record(store: Store, run_id: str) -> RunRecord | None:
    """The run's record; None when there is none or it cannot be read (logged), `NewerRecord`
    when a newer release wrote it."""
    try:
        return store.runs.load(run_id)
    except NewerRecord:
        raise
    except StateError as exc:
        log.error("run %s cannot be read: %s", run_id, exc)  # nowhere to post: refuse quietly
        return None


def pending_by_id(record: RunRecord) -> dict[str, PendingCall]:
    try:
        return {c.id: c for c in record.run_state().pending}
    except StateError:
        return {}
