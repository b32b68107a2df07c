"""The RQ jobs: start or continue a run, apply decisions (and resume), expire approvals, retry.

Each job drives the harness step by step and leaves the run somewhere durable: finished,
stopped, failed (with a Retry button) or parked awaiting decisions. No job ever waits for a
human. Exactly one driver holds a run's lease; every write of the run is fenced by it, the state
is checkpointed after every step, and a side-effecting call is checkpointed as started before it
runs. A driver that dies leaves the lease to expire; the watchdog then enqueues `continue_run`,
which picks the run up from its last checkpoint on any worker.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import rq
from rq import Retry

from bot import render, texts
from harness.loop import Agent, AwaitingApproval, Failed, Finished, Outcome, Stopped, TurnDone, step
from harness.state import Decision, PendingCall, RunState, StateError, Verdict, new_run, record_decisions
from workers.services import RUN_JOB_TIMEOUT, Services
from workers.store import DAY, FINISHED_RUN_TTL, RunRecord, RunStatus

log = logging.getLogger(__name__)

_services: Services | None = None


class LostLease(Exception):
    """Another driver took this run over (this one stalled past its lease); stop at once."""


def lease_seconds() -> float:
    """How long a silent driver keeps its run before another worker takes it over."""
    return float(os.environ.get("HARNESS_LEASE_SECONDS") or 30)


def use_services(services: Services | None) -> None:
    """Set the services jobs of this process use (the worker does this before it starts)."""
    global _services
    _services = services


def services() -> Services:
    global _services
    if _services is None:  # a job run outside `python -m workers` (a bare Worker in tests)
        job = rq.get_current_job()
        _services = Services.from_env(job.connection if job else None)
    return _services


def enqueue(svc: Services, func: Any, *args: Any, **kwargs: Any) -> rq.job.Job:
    """Enqueue a job with the timeout of a whole run and RQ retries for crashed attempts."""
    return svc.queue.enqueue(
        func,
        *args,
        job_timeout=RUN_JOB_TIMEOUT,
        result_ttl=600,
        retry=Retry(max=3, interval=[1, 5, 15]),
        **kwargs,
    )


# --- jobs ------------------------------------------------------------------------------------------


def start_run(run_id: str) -> None:
    """Start a queued run (or continue one whose driver died): take its thread and drive it."""
    continue_run(run_id)


def continue_run(run_id: str) -> None:
    """Drive `run_id` from its last checkpoint, if nobody else is driving it."""
    svc = services()
    with Driver(svc, run_id) as driver:
        if driver is None or driver.record.status not in (RunStatus.QUEUED, RunStatus.RUNNING):
            return  # someone else drives it, or it is parked or over
        if driver.record.status is RunStatus.QUEUED:
            state = _first_state(svc, driver)
        else:
            state = _checkpointed_state(svc, driver)
        if state is not None:
            driver.advance(state)


def apply_decisions(run_id: str) -> None:
    """Show every new decision on its card; once all of a park's calls are decided, resume."""
    svc = services()
    record = _load(svc, run_id)
    if record is None or record.status is not RunStatus.AWAITING_APPROVAL:
        return
    decisions = svc.store.decisions(run_id)
    calls = _pending_by_id(record)
    for call_id, decision in decisions.items():
        card = record.cards.get(call_id)
        if decision and card and call_id in calls and svc.store.first_card_update(run_id, call_id):
            msg = render.decided_card(
                call=calls[call_id],
                requester=record.requester,
                verdict=decision.verdict,
                by=decision.by,
                at=datetime.now(UTC),
                reason=decision.reason,
            )
            svc.update(record.channel, card, msg.text, msg.blocks)
    if not decisions or any(d is None for d in decisions.values()):
        return
    with Driver(svc, run_id) as driver:
        if driver is None:  # the run is still being parked by its driver: look again shortly
            svc.queue.enqueue_in(timedelta(seconds=1), apply_decisions, run_id, job_timeout=RUN_JOB_TIMEOUT)
            return
        if driver.record.status is not RunStatus.AWAITING_APPROVAL:
            return
        job = rq.get_current_job()
        if svc.store.claim_resume(run_id, driver.record.park_id, job.id if job else uuid.uuid4().hex):
            driver.resume(svc.store.decisions(run_id))


def expire_approvals(run_id: str, park_id: int) -> None:
    """Answer every call of park `park_id` still undecided as expired, then apply decisions."""
    svc = services()
    record = _load(svc, run_id)
    if record is None or record.status is not RunStatus.AWAITING_APPROVAL or record.park_id != park_id:
        return
    pending = _pending_by_id(record)
    for call_id, decision in svc.store.decisions(run_id).items():
        if decision is None:
            audit = record.audit_fields(pending.get(call_id))
            svc.store.decide(run_id, call_id, Decision(Verdict.EXPIRED), audit=audit)
    apply_decisions(run_id)


def retry_run(run_id: str, by: str) -> None:
    """Resume a failed run from its last state (the Retry button)."""
    svc = services()
    with Driver(svc, run_id) as driver:
        if driver is None or driver.record.status is not RunStatus.FAILED or driver.record.state is None:
            return
        record = driver.record
        if not svc.store.take_thread(record, RUN_JOB_TIMEOUT):
            driver.notify(texts.RETRY_BUSY)
            svc.store.unclaim_retry(run_id, record.failure_ts or "")
            svc.store.forget_active(run_id)
            return
        if record.failure_ts:
            msg = render.retried_card(error=record.error or "", by=by, at=datetime.now(UTC))
            svc.update(record.channel, record.failure_ts, msg.text, msg.blocks)
        state = _checkpointed_state(svc, driver)
        if state is not None:
            driver.record = replace(record, failure_ts=None, error=None)
            driver.advance(state)


# --- the driver ------------------------------------------------------------------------------------


class Driver:
    """Holds a run's lease while a job drives it; every write of the run goes through it."""

    def __init__(self, svc: Services, run_id: str) -> None:
        self.svc = svc
        self.run_id = run_id
        self.record: RunRecord
        self.token = uuid.uuid4().hex
        self.seconds = lease_seconds()
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> Driver | None:
        if not self.svc.store.acquire_lease(self.run_id, self.token, self.seconds):
            return None
        record = _load(self.svc, self.run_id)  # read under the lease: nobody else writes it now
        if record is None:
            self.svc.store.release_lease(self.run_id, self.token)
            self.svc.store.forget_active(self.run_id)
            return None
        self.record = record
        self._beat = threading.Thread(target=self._heartbeat, name="lease", daemon=True)
        self._beat.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(5)
        # On a crash the run stays marked active, so the watchdog hands it to another worker.
        self.svc.store.release_lease(self.run_id, self.token)
        if exc_type is None and self.record.status not in (RunStatus.RUNNING,):
            self.svc.store.forget_active(self.run_id)

    def _heartbeat(self) -> None:
        # Renews the lease while a long model request or tool runs between checkpoints.
        while not self._stop.wait(self.seconds / 3):
            if not self.svc.store.renew_lease(self.record.run_id, self.token, self.seconds):
                self._lost.set()
                return

    def save(self, *, ttl: int = FINISHED_RUN_TTL, finish: bool = False, **changes: Any) -> None:
        """Write the run (fenced by the lease); `finish` lets the lease go with the write."""
        record = replace(self.record, **changes)
        if self._lost.is_set() or not self.svc.store.checkpoint(
            record, self.token, self.seconds, ttl=ttl, finish=finish
        ):
            raise LostLease(self.record.run_id)
        self.record = record

    def notify(self, text: str) -> None:
        msg = render.notice(text)
        self.svc.post(self.record.channel, self.record.thread_ts, msg.text, msg.blocks)

    def refuse(self, reason: str) -> None:
        """Fail closed: say so in the thread, stop the run, run nothing."""
        log.error("run %s refused: %s", self.record.run_id, reason)
        self.notify(texts.REFUSED_TO_CONTINUE.format(reason=reason))
        self.save(status=RunStatus.STOPPED, finish=True)
        _release_thread(self.svc, self.record)

    def resume(self, decisions: dict[str, Decision | None]) -> None:
        try:
            state = self.record.run_state()
        except StateError as exc:
            self.refuse(str(exc))
            return
        awaiting = {c.id for c in state.awaiting}
        decided = {k: v for k, v in decisions.items() if v is not None and k in awaiting}
        if set(decided) != awaiting or set(decisions) != awaiting:
            self.refuse(texts.DECISIONS_DO_NOT_MATCH)
            return
        self.svc.store.clear_approvals(self.record.run_id)
        self.svc.store.take_thread(self.record, RUN_JOB_TIMEOUT)
        self.advance(record_decisions(state, decided))

    def advance(self, state: RunState) -> None:
        """Step the run until it leaves the loop: checkpoint, then post, after every step."""
        agent = Agent.from_config(self.svc.config, client=self.svc.model, before_tool=self._write_ahead)
        self.save(status=RunStatus.RUNNING, state=state.to_json(), expires_at=None)
        while True:
            result = step(state, agent)
            state = result.state
            if result.outcome is None:
                self.save(state=state.to_json())
            for event in result.events:
                if isinstance(event, TurnDone):
                    msg = render.turn_summary(
                        event.turn, event.calls, event.tokens, agent.limits.token_budget
                    )
                    self.svc.post(self.record.channel, self.record.thread_ts, msg.text, msg.blocks)
            if result.outcome is not None:
                self._leave_loop(state, agent, result.outcome)
                return

    def _write_ahead(self, state: RunState, call: PendingCall) -> None:
        self.save(state=state.to_json())  # raises LostLease before the call could run twice

    def _leave_loop(self, state: RunState, agent: Agent, outcome: Outcome) -> None:
        record, svc = self.record, self.svc
        if isinstance(outcome, AwaitingApproval):
            self._park(state, agent, outcome)
            return
        if isinstance(outcome, Failed):
            msg = render.failed(run_id=record.run_id, error=outcome.error)
            ts = svc.post(record.channel, record.thread_ts, msg.text, msg.blocks)
            self.save(
                status=RunStatus.FAILED,
                state=state.to_json(),
                failure_ts=ts,
                error=outcome.error,
                finish=True,
            )
            _release_thread(svc, record)
            return
        if isinstance(outcome, Finished):
            msg = render.final_answer(outcome.answer, state.turns, state.requests)
            status, reaction = RunStatus.FINISHED, "white_check_mark"
        else:
            assert isinstance(outcome, Stopped)
            msg = render.stopped(outcome.reason, state.turns, state.requests)
            status, reaction = RunStatus.STOPPED, "octagonal_sign"
        svc.store.save_history(*record.thread, state.messages)
        self.save(status=status, state=state.to_json(), finish=True)
        svc.post(record.channel, record.thread_ts, msg.text, msg.blocks)
        svc.react(record.channel, record.thread_ts, reaction, remove="eyes")
        _release_thread(svc, record)

    def _park(self, state: RunState, agent: Agent, outcome: AwaitingApproval) -> None:
        svc, approvals = self.svc, self.svc.config.approvals
        minutes = approvals.expire_after_minutes
        expires_at = datetime.now(UTC) + timedelta(minutes=minutes)
        ttl = int(minutes * 60) + DAY
        park_id = self.record.park_id + 1
        svc.store.open_approvals(self.record.run_id, [c.id for c in outcome.calls], ttl)
        self.save(
            status=RunStatus.AWAITING_APPROVAL,
            state=state.to_json(),
            park_id=park_id,
            expires_at=expires_at.timestamp(),
            cards={},
            ttl=ttl,
        )
        svc.store.take_thread(self.record, ttl)  # the parked run keeps its thread
        cards = {}
        for call in outcome.calls:
            msg = render.approval_card(
                run_id=self.record.run_id,
                call=call,
                requester=self.record.requester,
                tier_source=agent.policy.source(call.name),
                approvers=list(approvals.approvers),
                expires_at=expires_at,
            )
            ts = svc.post(self.record.channel, self.record.thread_ts, msg.text, msg.blocks)
            if ts:
                cards[call.id] = ts
        self.save(status=RunStatus.AWAITING_APPROVAL, cards=cards, ttl=ttl, finish=True)
        svc.queue.enqueue_in(
            timedelta(minutes=minutes),
            expire_approvals,
            self.record.run_id,
            park_id,
            job_timeout=RUN_JOB_TIMEOUT,
            result_ttl=600,
            retry=Retry(max=3, interval=[1, 5, 15]),
        )


# --- helpers ---------------------------------------------------------------------------------------


def _load(svc: Services, run_id: str) -> RunRecord | None:
    try:
        return svc.store.load_run(run_id)
    except StateError as exc:
        log.error("run %s cannot be read: %s", run_id, exc)  # nowhere to post: refuse quietly
        return None


def _first_state(svc: Services, driver: Driver) -> RunState | None:
    record = driver.record
    task = _task_text(record.task)
    if not task:
        driver.notify(texts.EMPTY_TASK)
        driver.save(status=RunStatus.FINISHED, finish=True)
        return None
    if not svc.store.take_thread(record, RUN_JOB_TIMEOUT):
        driver.notify(texts.QUEUED_IN_THREAD)
        return None
    try:
        return new_run(task, svc.store.load_history(*record.thread))
    except StateError as exc:
        driver.refuse(str(exc))
        return None


def _checkpointed_state(svc: Services, driver: Driver) -> RunState | None:
    record = driver.record
    if record.state is None:  # died before its first checkpoint: start over
        return new_run(_task_text(record.task) or "(empty)", svc.store.load_history(*record.thread))
    try:
        return record.run_state()
    except StateError as exc:
        driver.refuse(str(exc))
        return None


def _pending_by_id(record: RunRecord) -> dict[str, PendingCall]:
    try:
        return {c.id: c for c in record.run_state().pending}
    except StateError:
        return {}


def _release_thread(svc: Services, record: RunRecord) -> None:
    following = svc.store.release_thread(record)
    if following:
        enqueue(svc, start_run, following)


def _task_text(raw: str) -> str:
    """The mention's text without the leading bot mention(s)."""
    return re.sub(r"^(\s*<@[UW][A-Z0-9]+(\|[^>]*)?>\s*)+", "", raw).strip()
