"""The RQ jobs: start a run, apply decisions (and resume), expire approvals, retry a failed run.

Each job drives the harness step by step and leaves the run somewhere durable: finished,
stopped, failed (with a Retry button) or parked awaiting decisions. No job ever waits for a
human. Only the job that owns a run (the one that started it, or claimed its resume or retry)
writes its record.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import rq

from bot import render, texts
from harness.loop import Agent, AwaitingApproval, Failed, Finished, Outcome, Stopped, TurnDone, step
from harness.state import Decision, RunState, StateError, Verdict, new_run, record_decisions
from workers.services import RUN_JOB_TIMEOUT, Services
from workers.store import DAY, RunRecord, RunStatus

log = logging.getLogger(__name__)

_services: Services | None = None


def use_services(services: Services | None) -> None:
    """Set the services jobs of this process use (the worker does this before it starts)."""
    global _services
    _services = services


def services() -> Services:
    global _services
    if _services is None:  # a job run outside `python -m workers` (tests with a bare Worker)
        job = rq.get_current_job()
        _services = Services.from_env(job.connection if job else None)
    return _services


def enqueue(svc: Services, func: Any, *args: Any, **kwargs: Any) -> rq.job.Job:
    return svc.queue.enqueue(func, *args, job_timeout=RUN_JOB_TIMEOUT, result_ttl=600, **kwargs)


# --- jobs ------------------------------------------------------------------------------------------


def start_run(run_id: str) -> None:
    """Start a queued run: take its thread (or queue behind it) and drive it."""
    svc = services()
    record = svc.store.load_run(run_id)
    if record is None or record.status is not RunStatus.QUEUED:
        return  # already started by a duplicate job
    task = _task_text(record.task)
    if not task:
        notice = render.notice(texts.EMPTY_TASK)
        svc.post(record.channel, record.thread_ts, notice.text, notice.blocks)
        svc.store.save_run(replace(record, status=RunStatus.FINISHED))
        return
    if not svc.store.take_thread(record, RUN_JOB_TIMEOUT):
        notice = render.notice(texts.QUEUED_IN_THREAD)
        svc.post(record.channel, record.thread_ts, notice.text, notice.blocks)
        return
    state = new_run(task, svc.store.load_history(*record.thread))
    _advance(svc, replace(record, status=RunStatus.RUNNING), state)


def apply_decisions(run_id: str) -> None:
    """Show every new decision on its card; once all of a park's calls are decided, resume."""
    svc = services()
    record = svc.store.load_run(run_id)
    if record is None or record.status is not RunStatus.AWAITING_APPROVAL:
        return
    decisions = svc.store.decisions(run_id)
    state = record.run_state()
    calls = {c.id: c for c in state.pending}
    for call_id, decision in decisions.items():
        card = record.cards.get(call_id)
        if decision and card and call_id in calls and svc.store.first_card_update(run_id, call_id):
            at = datetime.now(UTC)
            msg = render.decided_card(
                call=calls[call_id],
                requester=record.requester,
                verdict=decision.verdict,
                by=decision.by,
                at=at,
                reason=decision.reason,
            )
            svc.update(record.channel, card, msg.text, msg.blocks)
    job = rq.get_current_job()
    claimer = job.id if job else f"local-{time.time_ns()}"
    if svc.store.claim_resume(run_id, record.park_id, claimer):
        _resume(svc, record, state, decisions)


def expire_approvals(run_id: str, park_id: int) -> None:
    """Answer every call of park `park_id` still undecided as expired, then apply decisions."""
    svc = services()
    record = svc.store.load_run(run_id)
    if record is None or record.status is not RunStatus.AWAITING_APPROVAL or record.park_id != park_id:
        return
    for call_id, decision in svc.store.decisions(run_id).items():
        if decision is None:
            svc.store.decide(run_id, call_id, Decision(Verdict.EXPIRED))
    apply_decisions(run_id)


def retry_run(run_id: str, by: str) -> None:
    """Resume a failed run from its last state (the Retry button)."""
    svc = services()
    record = svc.store.load_run(run_id)
    if record is None or record.status is not RunStatus.FAILED or record.state is None:
        return
    if not svc.store.take_thread(record, RUN_JOB_TIMEOUT):
        notice = render.notice(texts.RETRY_BUSY)
        svc.post(record.channel, record.thread_ts, notice.text, notice.blocks)
        svc.store.unclaim_retry(run_id, record.failure_ts or "")
        return
    if record.failure_ts:
        msg = render.retried_card(error=record.error or "", by=by, at=datetime.now(UTC))
        svc.update(record.channel, record.failure_ts, msg.text, msg.blocks)
    record = replace(record, status=RunStatus.RUNNING, failure_ts=None, error=None)
    _advance(svc, record, record.run_state())


# --- driving ---------------------------------------------------------------------------------------


def _resume(svc: Services, record: RunRecord, state: RunState, decisions: dict[str, Decision | None]) -> None:
    awaiting = {c.id for c in state.awaiting}
    decided = {k: v for k, v in decisions.items() if v is not None and k in awaiting}
    if set(decided) != awaiting:
        # Fail closed: a decision record that does not match the parked calls runs nothing.
        log.error("run %s: decisions %s do not match awaiting calls %s", record.run_id, decided, awaiting)
        return
    try:
        state = record_decisions(state, decided)
    except StateError as exc:
        log.error("run %s: %s", record.run_id, exc)
        return
    svc.store.clear_approvals(record.run_id)
    svc.store.take_thread(record, RUN_JOB_TIMEOUT)
    _advance(svc, replace(record, status=RunStatus.RUNNING, expires_at=None), state)


def _advance(svc: Services, record: RunRecord, state: RunState) -> None:
    """Step the run until it leaves the loop, posting a summary after every turn."""
    agent = Agent.from_config(svc.config)
    while True:
        result = step(state, agent)
        state = result.state
        for event in result.events:
            if isinstance(event, TurnDone):
                msg = render.turn_summary(event.turn, event.calls, event.tokens, agent.limits.token_budget)
                svc.post(record.channel, record.thread_ts, msg.text, msg.blocks)
        record = replace(record, state=state.to_json())
        if result.outcome is not None:
            _leave_loop(svc, record, state, agent, result.outcome)
            return
        svc.store.save_run(record)  # checkpoint between steps


def _leave_loop(svc: Services, record: RunRecord, state: RunState, agent: Agent, outcome: Outcome) -> None:
    if isinstance(outcome, AwaitingApproval):
        _park(svc, record, agent, outcome)
        return
    if isinstance(outcome, Failed):
        msg = render.failed(run_id=record.run_id, error=outcome.error)
        ts = svc.post(record.channel, record.thread_ts, msg.text, msg.blocks)
        svc.store.save_run(replace(record, status=RunStatus.FAILED, failure_ts=ts, error=outcome.error))
        _release(svc, record)
        return
    if isinstance(outcome, Finished):
        msg = render.final_answer(outcome.answer, state.turns, state.requests)
        status, reaction = RunStatus.FINISHED, "white_check_mark"
    else:
        assert isinstance(outcome, Stopped)
        msg = render.stopped(outcome.reason, state.turns, state.requests)
        status, reaction = RunStatus.STOPPED, "octagonal_sign"
    svc.post(record.channel, record.thread_ts, msg.text, msg.blocks)
    svc.store.save_history(*record.thread, state.messages)
    svc.store.save_run(replace(record, status=status))
    svc.react(record.channel, record.thread_ts, reaction, remove="eyes")
    _release(svc, record)


def _park(svc: Services, record: RunRecord, agent: Agent, outcome: AwaitingApproval) -> None:
    approvals = svc.config.approvals
    minutes = approvals.expire_after_minutes
    expires_at = datetime.now(UTC) + timedelta(minutes=minutes)
    ttl = int(minutes * 60) + DAY
    record = svc.store.park(
        replace(record, expires_at=expires_at.timestamp()), [c.id for c in outcome.calls], ttl
    )
    svc.store.take_thread(record, ttl)  # the parked run keeps its thread
    cards = {}
    for call in outcome.calls:
        msg = render.approval_card(
            run_id=record.run_id,
            call=call,
            requester=record.requester,
            tier_source=agent.policy.source(call.name),
            approvers=list(approvals.approvers),
            expires_at=expires_at,
        )
        ts = svc.post(record.channel, record.thread_ts, msg.text, msg.blocks)
        if ts:
            cards[call.id] = ts
    svc.store.save_run(replace(record, cards=cards), ttl=ttl)
    svc.queue.enqueue_in(
        timedelta(minutes=minutes),
        expire_approvals,
        record.run_id,
        record.park_id,
        job_timeout=RUN_JOB_TIMEOUT,
        result_ttl=600,
    )


def _release(svc: Services, record: RunRecord) -> None:
    following = svc.store.release_thread(record)
    if following:
        enqueue(svc, start_run, following)


def _task_text(raw: str) -> str:
    """The mention's text without the leading bot mention(s)."""
    return re.sub(r"^(\s*<@[UW][A-Z0-9]+(\|[^>]*)?>\s*)+", "", raw).strip()
