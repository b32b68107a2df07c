"""The RQ jobs: start, continue, resume, retry and recover runs; show decisions on their cards.

Every job that drives a run does one thing: take the run's lease and do what the run needs next
(`drive`). A queued run starts; a running one continues from its last checkpoint; a parked one
resumes once every decision is in; a failed one with a Retry click retries; an ended one pays
what it still owes Slack and lets its thread go. So a job may die anywhere: the run stays in
`harness:active` with no lease, the watchdog enqueues `recover_run`, and the next driver carries
on from the last write. No job ever waits for a human.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import rq

from gates import budgets
from harness import texts as harness_texts
from harness.loop import (
    Agent,
    AwaitingApproval,
    AwaitingLimit,
    Event,
    Failed,
    Finished,
    Outcome,
    ToolsRequested,
    TurnDone,
    continue_at_limit,
    saves_first,
    step,
    stop_run,
)
from harness.outcomes import NotRun, calls_not_run
from harness.state import (
    Decision,
    PendingCall,
    RunState,
    StateError,
    Status,
    Verdict,
    new_run,
    record_decisions,
)
from harness.valves import Stop, Valve, token_limit
from messages import cards, endings, texts, turns
from messages.blocks import notice
from messages.text import plural
from observe import logs, metrics, tracing
from ops import rulings
from runtime.queue import RUN_JOB_TIMEOUT, enqueue_run_job
from store import (
    BATCH,
    LIMIT_CALL,
    DecideOutcome,
    Keys,
    RunRecord,
    RunStatus,
    Store,
    rulings_write,
)
from workers import granting, live, outbox, park_cards, thread_status
from workers.driver import Driver, park_ttl
from workers.services import Services

log = logging.getLogger(__name__)

MAX_RECOVERIES = 3  # re-drives after a crash before the run is stopped (a reply that kills workers)

_services: Services | None = None


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


def enqueue(svc: Services, func: Any, run_id: str, *args: Any) -> None:
    """Enqueue a job about `run_id` with the retry policy every job gets."""
    enqueue_run_job(svc.store, svc.queue, func, run_id, *args)


# --- jobs ------------------------------------------------------------------------------------------


def start_run(run_id: str) -> None:
    """Start a queued run (the bot enqueues this for every mention)."""
    drive(run_id)


def recover_run(run_id: str) -> None:
    """Continue a run whose driver died (the watchdog enqueues this); counts as a recovery."""
    drive(run_id, recovering=True)


def retry_run(run_id: str, by: str | None = None) -> None:
    """Retry a failed run from its last state (the Retry button; who clicked is in the claim)."""
    drive(run_id)


def honour_stop(run_id: str) -> None:
    """Act on a Stop (the bot enqueues this): a parked run stops now; a driven one at its next step."""
    drive(run_id)


def apply_decisions(run_id: str) -> None:
    """Show new decisions on their cards; once every call of the park is decided, resume."""
    svc = services()
    svc.store.job_started(run_id)
    record = _load(svc.store, run_id)
    if record is None or record.status is not RunStatus.AWAITING_APPROVAL:
        return
    calls = _pending_by_id(record)
    decisions = granting.spread_grants(svc, record, calls, svc.store.decisions(run_id, record.park_id))
    if decisions and all(d is not None for d in decisions.values()):
        drive(run_id)  # the resume updates every card
        return
    votes = svc.store.votes(run_id, record.park_id)
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
        elif decision is not None and svc.store.first_card_update(run_id, record.park_id, call_id):
            msg = park_cards.decided_card(record, calls[call_id], decision)
            svc.update(record.channel, card, msg.text, msg.blocks)


def show_new_expiry(run_id: str, park_id: int) -> None:
    """After an Extend: the park's open cards (and its Approve all message) show the new expiry."""
    svc = services()
    record = _load(svc.store, run_id)
    if record is None or record.status is not RunStatus.AWAITING_APPROVAL or record.park_id != park_id:
        return
    park_cards.redraw_open(svc, record)


def drive(run_id: str, *, recovering: bool = False) -> None:
    """Take the run's lease and do what it needs next; hand its thread on when it ends."""
    svc = services()
    svc.store.job_started(run_id)
    following = None
    with Driver(svc, run_id) as driver:
        if driver is None:
            return  # someone else drives it, or there is no such run
        record = driver.record
        with (
            logs.bound(**logs.run_fields(record)),  # every line logged meanwhile names the run
            tracing.job_span(record.trace, _job_name(), run_id),
        ):
            following = _next_move(svc, driver, recovering)
    if following:
        enqueue(svc, start_run, following)


def _job_name() -> str:
    """The RQ job driving the run now (`start_run`, `apply_decisions`, …): its span's name."""
    job = rq.get_current_job()
    return (job.func_name or "drive").rsplit(".", 1)[-1] if job is not None else "drive"


def expire_due(store: Store, queue: rq.Queue, now: float) -> int:
    """Answer every undecided call of every park past its expiry as expired; returns how many parks."""
    done = 0
    for run_id, park_id in store.due_expiries(now):
        record = _load(store, run_id)
        if record is not None and record.status is RunStatus.AWAITING_APPROVAL and record.park_id == park_id:
            calls = _pending_by_id(record)
            for call_id, decision in store.decisions(run_id, park_id).items():
                if decision is None:
                    audit = record.audit_fields(calls.get(call_id))
                    result = store.decide(
                        run_id, park_id, call_id, Decision(Verdict.EXPIRED), audit=audit, now=now
                    )
                    if result.outcome in (DecideOutcome.RECORDED, DecideOutcome.EXPIRED):
                        metrics.incr(store.redis, metrics.EXPIRATIONS, profile=record.profile)
            enqueue_run_job(store, queue, apply_decisions, run_id)
            done += 1
        if record is not None and record.park_id == park_id:
            store.forget_park(record)  # its Home tab indexes too
        else:
            store.forget_expiry(run_id, park_id)
    return done


# --- what a run needs next ------------------------------------------------------------------------


def _next_move(svc: Services, driver: Driver, recovering: bool) -> str | None:
    if recovering:
        driver.save(recoveries=driver.record.recoveries + 1)
        if driver.record.recoveries > MAX_RECOVERIES:
            return _give_up(driver)
    driver.deliver()  # whatever an earlier driver still owed Slack
    status = driver.record.status
    if status is RunStatus.QUEUED:
        return _start(svc, driver)
    if status is RunStatus.RUNNING:
        try:
            state = _checkpointed_state(driver.record)
        except StateError as exc:
            return _refuse(driver, str(exc))
        live.drop_orphans(svc, driver.record)
        return _advance(svc, driver, state)
    if status is RunStatus.AWAITING_APPROVAL:
        return _resume_if_decided(svc, driver)
    if status is RunStatus.FAILED:
        return _retry_if_clicked(svc, driver)
    return driver.finish()


def _start(svc: Services, driver: Driver) -> str | None:
    record = driver.record
    task = _task_text(record.task)
    if not task:
        driver.notify(texts.EMPTY_TASK)
        return _end(driver, RunStatus.FINISHED)
    if not svc.store.take_thread(record, RUN_JOB_TIMEOUT):
        if record.posted == 0:
            driver.notify(texts.QUEUED_IN_THREAD)
        driver.save()
        driver.deliver()
        driver.leave()
        return None
    try:
        history, seq = svc.store.load_history(*record.thread)
    except StateError as exc:
        return _refuse(driver, str(exc))
    state = new_run(task, history)
    profile, kept = _thread_profile(svc, driver)
    driver.save(status=RunStatus.RUNNING, state=state.to_json(), history_seq=seq, profile=profile)
    if kept != profile:
        svc.store.keep_thread_profile(driver.record)
    return _advance(svc, driver, state)  # the "Working on it…" message goes out with the first request


def _thread_profile(svc: Services, driver: Driver) -> tuple[str, str | None]:
    """The profile a run starting in its thread goes under (its channel's now), and the one the
    thread kept (None: a new thread). A thread keeps its profile only while its channel maps to
    it: when its last run had another, the thread is told so in one line (the next save owes it)."""
    record = driver.record
    now = svc.settings_of(record).profile_label
    kept = svc.store.thread_profile(*record.thread)
    if kept is not None and kept != now:
        driver.notify(texts.THREAD_PROFILE_CHANGED.format(now=_profile_words(now), was=_profile_words(kept)))
    return now, kept


def _profile_words(profile: str) -> str:
    return texts.PROFILE_NAMED.format(profile=profile) if profile else texts.PROFILE_TOP_LEVEL


def _advance(svc: Services, driver: Driver, state: RunState) -> str | None:
    """Step the run until it leaves the loop: after every step, save (with what it owes Slack); the
    next step pays it meanwhile (a turn's summary goes out while the model reads its results)."""

    agent = replace(_agent(svc, driver), live=live.view_of(svc, driver))
    working = functools.partial(thread_status.show, svc, phase=thread_status.Phase.WORKING)
    while True:
        driver.dispatch(then=working)  # the status after the posts: a post in a DM clears it
        result = step(state, agent)
        state = result.state
        _record_rulings(svc, driver, result.events, agent)
        _owe_summaries(driver, result.events, agent, state)
        if result.outcome is not None:
            driver.collect()
            return _leave_loop(svc, driver, state, agent, result.outcome)
        if driver.owes() or not saves_first(state, agent):  # else the write-ahead mark saves it
            driver.save(state=state.to_json())


def _agent(svc: Services, driver: Driver) -> Agent:
    """The agent a driver steps with: every call marked started durably first, a Stop heard at once."""

    def write_ahead(marked: RunState, call: PendingCall) -> None:
        driver.save(state=marked.to_json(), promise="write_ahead")  # LostLease: the call never runs twice

    def stop_check() -> Stop | None:
        if driver.stop_requested() is None:
            return None
        return Stop(Valve.STOPPED_BY_USER, harness_texts.STOP_BY_USER)

    settings = svc.settings_of(driver.record)
    if settings.profile_label != driver.record.profile:
        log.warning(
            "run %s: it started under profile %r, its channel maps to %r now: it goes on under that",
            driver.run_id,
            driver.record.profile,
            settings.profile_label,
        )
    catalog = svc.catalog.narrowed(settings) if svc.catalog is not None else None
    record = driver.record
    gate = budgets.Gate(
        svc.store,
        record.team,
        record.requester,
        record.channel,
        record.profile,
        settings.budgets,
        stop_check=stop_check,
        defer=driver.beside_next_save,
    )
    return Agent.from_config(
        settings,
        catalog,
        client=svc.model,
        before_tool=write_ahead,
        stop_check=stop_check,
        budget=gate,
        tracer=tracing.run_tracer(),
    )


def _record_rulings(svc: Services, driver: Driver, events: tuple[Event, ...], agent: Agent) -> None:
    """The audit entry of every call of a reply just ruled, written with the step's save: a crash
    before it loses the reply too (the step is made again), and each call is written once."""
    for event in events:
        if not isinstance(event, ToolsRequested) or not event.calls:
            continue
        try:
            entries = []
            for call in event.calls:
                found = agent.tools.get(call.name)
                source = (
                    svc.catalog.source(call.name) if found is not None and svc.catalog is not None else ""
                )
                entries.append(rulings.ruling_entry(driver.record, call, found, source))
            driver.beside_next_save(rulings_write(driver.run_id, entries))
        except Exception:  # the audit of a ruling is never worth the run
            log.exception("run %s: the calls' tier decisions could not be recorded", driver.run_id)


def _owe_summaries(driver: Driver, events: tuple[Event, ...], agent: Agent, state: RunState) -> None:
    _count_step(driver, state, events)
    budget = token_limit(state, agent.limits)
    for event in events:
        if isinstance(event, ToolsRequested) and driver.live is not None:
            driver.live.requested(event.calls)
        if isinstance(event, TurnDone):
            settles = live.seal_turn(driver)
            # The words it streamed stay in the summary it settles into.
            said = park_cards.intent(state) if settles else ""
            try:
                msg = turns.turn_summary(event.turn, event.calls, event.tokens, budget, said=said)
            except Exception:  # never lose the step (and its usage) to a rendering bug
                log.exception("run %s: turn %s could not be rendered", driver.run_id, event.turn)
                msg = notice(texts.UNRENDERABLE.format(turn=event.turn))
            driver.owe(msg, live=settles)


def _count_step(driver: Driver, state: RunState, events: tuple[Event, ...]) -> None:
    """The step's metrics (deltas of the run's totals), unless the turn's calls come next: counted
    then. They go with the step's save, not in a round trip of their own."""
    if state.status is Status.RUNNING and state.pending:
        return
    try:
        catalog = driver.svc.catalog
        write = metrics.step_account(
            driver.run_id,
            state,
            events,
            profile=driver.record.profile,
            source_of=catalog.source if catalog is not None else None,
        )
        driver.beside_next_save(write)
    except Exception:  # a figure is never worth a run
        log.exception("run %s: the step's metrics could not be counted", driver.run_id)


def _leave_loop(svc: Services, driver: Driver, state: RunState, agent: Agent, outcome: Outcome) -> str | None:
    if isinstance(outcome, AwaitingApproval):
        return _park(svc, driver, state, agent, outcome)
    if not isinstance(outcome, Finished):
        live.let_stand(svc, driver, discard=isinstance(outcome, Failed))
    if isinstance(outcome, AwaitingLimit):
        return _park_at_limit(svc, driver, state, outcome)
    not_run: NotRun | None = None
    if isinstance(outcome, Failed):
        driver.owe(endings.failed(run_id=driver.run_id, error=outcome.error), role=outbox.FAILURE)
        driver.record = replace(driver.record, state=state.to_json(), error=outcome.error, failure_ts=None)
        return _end(driver, RunStatus.FAILED)
    if isinstance(outcome, Finished):
        answer = endings.final_answer(outcome.answer, state.turns, state.requests, run_id=driver.run_id)
        driver.owe(answer, live=driver.live.seal() if driver.live is not None else None)
        not_run = calls_not_run(state)  # declined, expired or denied: then it is not "Done", no ✅
        status, reaction = RunStatus.FINISHED, "no_entry_sign" if not_run.total else "white_check_mark"
    elif outcome.valve is Valve.STOPPED_BY_USER:
        by = svc.store.stop_requested(driver.run_id)
        driver.owe(endings.stopped_by(by=by, turns=state.turns, requests=state.requests))
        driver.record = replace(driver.record, stopped_by=by)
        status, reaction = RunStatus.STOPPED, "octagonal_sign"
    else:
        driver.owe(endings.stopped(outcome.reason, state.turns, state.requests))
        status, reaction = RunStatus.STOPPED, "octagonal_sign"
    driver.record = outbox.owe_reaction(
        replace(driver.record, state=state.to_json()), reaction, remove="eyes"
    )
    return _end(driver, status, getattr(outcome, "valve", ""), not_run)


def _end(driver: Driver, status: RunStatus, valve: str = "", not_run: NotRun | None = None) -> str | None:
    """Save the run ended with what it owes, pay it, then let the thread go (`valve`: what stopped it;
    `not_run`: the calls of a finished run that did not run, for its Working message)."""
    record = driver.record
    if record.working_ts and record.status in (RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL):
        by = record.stopped_by
        if status is RunStatus.FINISHED:  # its last request was in flight when Stop was pressed
            by = driver.svc.store.stop_requested(record.run_id)
        closed = turns.working_closed(outcome=status.value, by=by, not_run=not_run)
        driver.record = outbox.owe_update(record, record.working_ts, closed)  # its Stop button goes
    driver.save(status=status)
    metrics.run_ended(driver.svc.store.redis, driver.record, valve)
    driver.deliver()
    driver.record = thread_status.show(driver.svc, driver.record, thread_status.Phase.ENDED)
    if status is not RunStatus.FAILED:
        return driver.finish()
    ended = driver.finish_failed()
    if ended.retry_claimed:  # clicked while its card was on its way: the run is still ours
        return _retry_if_clicked(driver.svc, driver)
    return ended.next_run


def _park(
    svc: Services, driver: Driver, state: RunState, agent: Agent, outcome: AwaitingApproval
) -> str | None:
    state, waiting = granting.apply_grants(svc, driver.record, state, outcome.calls)
    if not waiting:
        driver.save(state=state.to_json())
        return _advance(svc, driver, state)
    approvals = svc.settings_of(driver.record).approvals
    minutes = approvals.expire_after_minutes
    expires_at = datetime.now(UTC) + timedelta(minutes=minutes)
    if approvals.escalate_after_minutes:  # scheduled before the park: a driver dying between parks again
        due = expires_at - timedelta(minutes=minutes - approvals.escalate_after_minutes)
        svc.store.schedule_escalation(driver.run_id, driver.record.park_id + 1, due.timestamp())
    if approvals.remind_before_minutes:  # the same: one reminder before the expiry, with Extend
        due = expires_at - timedelta(minutes=approvals.remind_before_minutes)
        svc.store.schedule_reminder(driver.run_id, driver.record.park_id + 1, due.timestamp())
    intent = park_cards.intent(state)
    call_tools = {c.id: park_cards.call_tool_info(agent, c, intent) for c in waiting}
    driver.record = replace(
        driver.record, call_tools=call_tools, expires_at=expires_at.timestamp(), extensions=0
    )
    if driver.live is not None:  # its message stops, showing what waits; the summary settles into it
        driver.live.waiting(waiting)
        live_ts = driver.live.seal() or driver.record.live_ts
        driver.record = replace(driver.record, live_ts=live_ts)
    for call in waiting:
        driver.owe(park_cards.approval_card(svc, driver.record, call), role=outbox.CARD, call=call.id)
    if len(waiting) > 1:  # owed in the park's own write, like the cards; `park` numbers it next
        batch = cards.batch_card(
            run_id=driver.run_id,
            park_id=driver.record.park_id + 1,
            calls=waiting,
            requester=driver.record.requester,
            expires_at=expires_at,
        )
        driver.owe(batch, role=outbox.CARD, call=BATCH)
    driver.park(state, waiting, park_ttl(minutes), expires_at.timestamp())
    driver.deliver()
    if driver.record.live_ts:  # kept by the record now; its writer stops it meanwhile
        svc.live_streams.forget(driver.record.live_ts)
        svc.store.redis.srem(Keys.live(driver.run_id), driver.record.live_ts)
    driver.record = thread_status.show(svc, driver.record, thread_status.Phase.WAITING)  # after the cards
    return _resume_if_decided(svc, driver)


def _resume_if_decided(svc: Services, driver: Driver) -> str | None:
    """Resume a parked run once every call is decided; else let it go (it stays parked)."""
    while True:
        record = driver.record
        view = svc.store.park_view(record.run_id, record.park_id)
        if view.stop_by is not None:
            return _stop_parked(svc, driver, view.stop_by)
        decisions = view.decisions
        if decisions and all(d is not None for d in decisions.values()):
            break
        if not driver.settle():
            return None
    # The click-to-resume time, written with the resume's save.
    driver.beside_next_save(metrics.resume_account(record.run_id, record.park_id, decisions))
    try:
        state = record.run_state()
    except StateError as exc:
        return _refuse(driver, str(exc))
    if state.status is Status.AWAITING_LIMIT:
        return _resume_at_limit(svc, driver, state, decisions)
    if set(decisions) != {c.id for c in state.awaiting}:
        return _refuse(driver, texts.DECISIONS_DO_NOT_MATCH)
    waited = state.awaiting
    state = record_decisions(state, {k: v for k, v in decisions.items() if v is not None})
    for call in state.pending:  # a grant clicked before the park settled: its notice is still due
        if call.decision is not None and call.decision.grant == "given":
            granting.announce_grant(svc, record, call.name, call.decision.grant_dir or "")
    if BATCH in record.cards:  # first the batch message (often the one clicked): buttons gone, outcomes
        batch = [c for c in state.pending if c.id in decisions]
        done = cards.batch_decided(calls=batch, decisions=decisions)
        driver.record = outbox.owe_update(driver.record, record.cards[BATCH], done)
    shown, now = view.cards_updated, time.time()
    for call in state.pending:  # rendered by the courier, while the approved calls run
        if call.decision is not None and call.id in record.cards and call.id not in shown:
            driver.record = outbox.owe_decided(driver.record, record.cards[call.id], call, now)
    # Durably running before anything else: the decisions stay in Redis until the park's TTL. The
    # same round trip forgets the park's expiry and takes the thread again.
    driver.beside_next_save(svc.store.resumed(driver.record, RUN_JOB_TIMEOUT))
    # What the park kept of its calls' tools serves its cards and modals only: every save of the
    # turn would carry it (with ten calls, a quarter of each write-ahead save).
    driver.save(status=RunStatus.RUNNING, state=state.to_json(), expires_at=None, call_tools={})
    tracing.approvals_waited(
        record.trace,
        record.run_id,
        waited,
        decisions,
        parked_since=record.parked_since,
        decided_at=view.decided_at,
    )
    return _advance(svc, driver, state)  # the decided cards are updated while the approved calls run


def _retry_if_clicked(svc: Services, driver: Driver) -> str | None:
    record = driver.record
    by = svc.store.retry_claimed_by(record.run_id, record.failure_ts) if record.failure_ts else None
    if by is None or record.failure_ts is None:
        return driver.finish()  # no Retry click: the failure stays as posted
    if not svc.store.take_thread(record, RUN_JOB_TIMEOUT, queue=False):
        svc.store.unclaim_retry(record.run_id, record.failure_ts)
        driver.notify(texts.RETRY_BUSY)
        return _end(driver, RunStatus.FAILED)
    try:
        state = record.run_state()
    except StateError as exc:
        return _refuse(driver, str(exc))
    retried = endings.retried_card(error=record.error or "", by=by, at=datetime.now(UTC))
    driver.record = outbox.owe_update(record, record.failure_ts, retried)
    if record.working_ts:  # working again: its Stop button is back
        driver.record = outbox.owe_update(
            driver.record, record.working_ts, turns.working(run_id=record.run_id)
        )
    driver.save(status=RunStatus.RUNNING, failure_ts=None, error=None)
    driver.deliver()
    return _advance(svc, driver, state)


# --- limits that ask, and Stop --------------------------------------------------------------------


def _park_at_limit(svc: Services, driver: Driver, state: RunState, outcome: AwaitingLimit) -> str | None:
    """Park a run at a limit: its card asks Continue or Stop; it expires like an approval (then stops)."""
    record = driver.record
    minutes = svc.settings_of(record).approvals.expire_after_minutes
    expires_at = datetime.now(UTC) + timedelta(minutes=minutes)
    info = {"question": outcome.question, "reason": outcome.reason, "more": outcome.more}
    driver.record = replace(
        record, call_tools={LIMIT_CALL: info}, expires_at=expires_at.timestamp(), extensions=0
    )
    driver.owe(park_cards.limit_card(svc, driver.record), role=outbox.CARD, call=LIMIT_CALL)
    driver.park_limit(state, park_ttl(minutes), expires_at.timestamp())
    driver.deliver()
    driver.record = thread_status.show(svc, driver.record, thread_status.Phase.WAITING)
    return _resume_if_decided(svc, driver)


def _resume_at_limit(
    svc: Services, driver: Driver, state: RunState, decisions: dict[str, Decision | None]
) -> str | None:
    """A limit answered: Continue grants one more allowance and goes on; Stop or expiry ends the run."""
    record = driver.record
    decision = decisions.get(LIMIT_CALL)
    if decision is None or set(decisions) != {LIMIT_CALL} or state.at_limit not in tuple(Valve):
        return _refuse(driver, texts.DECISIONS_DO_NOT_MATCH)
    info = record.call_tools.get(LIMIT_CALL, {})
    shown = svc.store.cards_updated(record.run_id, record.park_id)
    if LIMIT_CALL in record.cards and LIMIT_CALL not in shown:
        decided = cards.limit_decided(
            question=info.get("question", ""),
            verdict=decision.verdict,
            by=decision.by,
            at=datetime.now(UTC),
            more=info.get("more", ""),
            approvers=decision.approvers,
        )
        driver.record = outbox.owe_update(driver.record, record.cards[LIMIT_CALL], decided)
    svc.store.forget_park(record)
    if decision.verdict is Verdict.APPROVED:
        agent = _agent(svc, driver)
        result = continue_at_limit(state, agent)
        _record_rulings(svc, driver, result.events, agent)
        driver.save(status=RunStatus.RUNNING, state=result.state.to_json(), expires_at=None)
        svc.store.take_thread(driver.record, RUN_JOB_TIMEOUT)
        driver.deliver()
        _owe_summaries(driver, result.events, agent, result.state)
        if result.outcome is not None:
            return _leave_loop(svc, driver, result.state, agent, result.outcome)
        return _advance(svc, driver, result.state)
    reason = info.get("reason") or harness_texts.STOP_BY_USER
    said = texts.LIMIT_EXPIRED_REASON if decision.verdict is Verdict.EXPIRED else texts.LIMIT_STOP_REASON
    valve = "expired" if decision.verdict is Verdict.EXPIRED else state.at_limit
    state = stop_run(state, Valve(state.at_limit), reason)
    driver.owe(endings.stopped(said.format(reason=reason), state.turns, state.requests))
    driver.record = outbox.owe_reaction(
        replace(driver.record, state=state.to_json()), "octagonal_sign", remove="eyes"
    )
    return _end(driver, RunStatus.STOPPED, valve)


def _stop_parked(svc: Services, driver: Driver, by: str) -> str | None:
    """Stop a parked run at once: its cards lose their buttons, its open calls are answered as not run."""
    record = driver.record
    try:
        state = record.run_state()
    except StateError as exc:
        return _refuse(driver, str(exc))
    now = datetime.now(UTC)
    shown = svc.store.cards_updated(record.run_id, record.park_id)
    calls = {c.id: c for c in state.pending}
    for call_id, ts in record.cards.items():
        if call_id in shown:
            continue  # already shows its decision, with no buttons
        if call_id == LIMIT_CALL:
            info = record.call_tools.get(LIMIT_CALL, {})
            msg = cards.limit_decided(
                question=info.get("question", ""), verdict=Verdict.DECLINED, by=by, at=now, more=""
            )
        elif call_id in calls:
            msg = cards.card_stopped(call=calls[call_id], requester=record.requester, by=by, at=now)
        elif call_id == BATCH:
            msg = cards.batch_stopped(calls=state.awaiting, by=by, at=now)
        else:
            continue
        driver.record = outbox.owe_update(driver.record, ts, msg)
    svc.store.forget_park(record)
    if tracing.current() is not None and state.status is Status.AWAITING_APPROVAL:
        view = svc.store.park_view(record.run_id, record.park_id)
        tracing.approvals_waited(
            record.trace,
            record.run_id,
            state.awaiting,
            view.decisions,
            parked_since=record.parked_since,
            decided_at=view.decided_at,
            stopped_by=by,
        )
    if record.live_ts:  # the parked turn's message: no summary will settle into it now
        driver.record = outbox.owe_update(driver.record, record.live_ts, notice(texts.LIVE_ENDED))
        driver.record = replace(driver.record, live_ts=None)
    state = stop_run(state, Valve.STOPPED_BY_USER, harness_texts.STOP_BY_USER)
    driver.owe(endings.stopped_by(by=by, turns=state.turns, requests=state.requests))
    driver.record = outbox.owe_reaction(
        replace(driver.record, state=state.to_json(), stopped_by=by), "octagonal_sign", remove="eyes"
    )
    return _end(driver, RunStatus.STOPPED, Valve.STOPPED_BY_USER)


def _refuse(driver: Driver, reason: str) -> str | None:
    """Fail closed: say so in the thread, stop the run, run nothing."""
    driver.notify(driver.refuse_text(reason))
    return _end(driver, RunStatus.STOPPED, "refused")


def _give_up(driver: Driver) -> str | None:
    """A run whose driver died too often (a reply or tool that kills workers) is stopped."""
    record = driver.record
    log.error("run %s: driver died %d times; stopping it", record.run_id, record.recoveries)
    text = texts.TOO_MANY_RECOVERIES.format(times=plural(record.recoveries, "time"))
    state = None
    if record.state is not None:
        try:
            state = stop_run(record.run_state(), Valve.CRASHES, text).to_json()
        except StateError:
            state = None
    # What it still owed may be what kills the worker: past the limit it is dropped.
    driver.record = replace(record, outbox=[], state=state)
    if record.recoveries <= MAX_RECOVERIES + 2:
        driver.notify(text)
    return _end(driver, RunStatus.STOPPED, Valve.CRASHES)


# --- helpers ---------------------------------------------------------------------------------------


def _load(store: Store, run_id: str) -> RunRecord | None:
    try:
        return store.load_run(run_id)
    except StateError as exc:
        log.error("run %s cannot be read: %s", run_id, exc)  # nowhere to post: refuse quietly
        return None


def _checkpointed_state(record: RunRecord) -> RunState:
    if record.state is None:  # no state yet: start over
        return new_run(_task_text(record.task) or "(empty)")
    return record.run_state()


def _pending_by_id(record: RunRecord) -> dict[str, PendingCall]:
    try:
        return {c.id: c for c in record.run_state().pending}
    except StateError:
        return {}


def _task_text(raw: str) -> str:
    """The mention's text without the leading bot mention(s)."""
    return re.sub(r"^(\s*<@[UW][A-Z0-9]+(\|[^>]*)?>\s*)+", "", raw).strip()
