"""A run's life, one loop you can read top to bottom: `phase = _next(phase)` until the run is let
go (`Gone`). Each phase function does its work and returns the next phase; none calls another, and
only `_finish` learns which run its thread starts next."""

from __future__ import annotations

import functools
import logging
import re
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import assert_never

from harness import texts as harness_texts
from harness.config import Approvals
from harness.loop import (
    Agent,
    AwaitingApproval,
    AwaitingInput,
    AwaitingLimit,
    AwaitingTask,
    Failed,
    Finished,
    Outcome,
    Stopped,
    TurnDone,
    continue_at_limit,
    saves_first,
    step,
    stop_run,
)
from harness.outcomes import NotRun, calls_not_run
from harness.state import (
    Decision,
    GrantUse,
    NewerRecord,
    PendingCall,
    RunState,
    StateError,
    Status,
    Verdict,
    new_run,
    record_decisions,
)
from harness.stops import stop_mid_turn
from harness.valves import Stop, Valve
from messages import batch_cards, cards, endings, texts, turns
from messages.text import plural
from observe import metrics, tracing
from runtime.queue import RUN_JOB_TIMEOUT
from store import (
    BATCH,
    LIMIT_CALL,
    LimitAsk,
    ParkView,
    RunRecord,
    RunStatus,
)
from workers import granting, newer, outbox, park_cards, previews, questions, tasks, thread_status
from workers.driver import Driver, park_ttl
from workers.phases import (
    Advance,
    Arrive,
    End,
    Finish,
    Gone,
    Leave,
    Park,
    ParkAtLimit,
    Parked,
    ParkForInput,
    ParkForTask,
    Phase,
    Resume,
    ResumeAtLimit,
    RetryIfClicked,
    Start,
    StopParked,
)
from workers.services import Services
from workers.stepping import (
    agent_of,
    offered_now,
    owe_summaries,
    record_rulings,
    thread_profile,
)

log = logging.getLogger(__name__)

MAX_RECOVERIES = 3  # re-drives after a crash before the run is stopped (a reply that kills workers)


def life(svc: Services, driver: Driver, recovering: bool) -> str | None:
    """A run's life under one lease, top to bottom; the run its thread starts next, if any."""
    phase: Phase | Gone = Arrive(recovering)
    while not isinstance(phase, Gone):
        phase = _next(svc, driver, phase)
    return phase.next_run


def _next(svc: Services, driver: Driver, phase: Phase) -> Phase | Gone:
    """Do what `phase` does; the phase it leads to. The one place phases are told apart."""
    match phase:
        case Arrive(recovering=recovering):
            return _arrive(driver, recovering)
        case Start():
            return _start(svc, driver)
        case Advance(state=state):
            return _advance(svc, driver, state)
        case Leave(state=state, agent=agent, outcome=outcome):
            return _leave(svc, driver, state, agent, outcome)
        case Park(state=state, agent=agent, calls=calls):
            return _park(svc, driver, state, agent, calls)
        case ParkForInput(state=state, call=call):
            return questions.park(svc, driver, state, call)
        case ParkForTask(state=state, call=call):
            return tasks.park(svc, driver, state, call)
        case ParkAtLimit(state=state, outcome=limit):
            return _park_at_limit(svc, driver, state, limit)
        case Parked():
            return _parked(svc, driver)
        case Resume(state=state, view=view):
            return _resume(svc, driver, state, view)
        case ResumeAtLimit(state=state, decisions=decisions):
            return _resume_at_limit(svc, driver, state, decisions)
        case StopParked(by=by):
            return _stop_parked(svc, driver, by)
        case RetryIfClicked():
            return _retry_if_clicked(svc, driver)
        case End(status=status, valve=valve, not_run=not_run):
            return _end(driver, status, valve, not_run)
        case Finish(failed=failed):
            return _finish(driver, failed)
    assert_never(phase)


def _arrive(driver: Driver, recovering: bool) -> Phase:
    """Count a recovery (too many: the run stops), pay what an earlier driver still owed Slack,
    and go where the run's status says. (A newer release's thread or park raises `NewerRecord`
    before the count is written: the run is left as it is.)"""
    if recovering:
        newer.look(driver.svc.store, driver.record)
        driver.save(recoveries=driver.record.recoveries + 1)
        if driver.record.recoveries > MAX_RECOVERIES:
            return _give_up(driver)
    driver.deliver()
    status = driver.record.status
    if status is RunStatus.QUEUED:
        return Start()
    if status is RunStatus.RUNNING:
        return _from_checkpoint(driver)
    if status is RunStatus.AWAITING_APPROVAL:
        return Parked()
    if status is RunStatus.FAILED:
        return RetryIfClicked()
    return Finish()  # ended: its debts are paid, its thread still to hand on


def _from_checkpoint(driver: Driver) -> Phase:
    """A running run goes on from its last save; live messages its dead driver left are taken out."""
    try:
        state = _checkpointed_state(driver.record)
    except StateError as exc:
        return _refuse(driver, str(exc))
    driver.drop_orphans()
    return Advance(state)


def _start(svc: Services, driver: Driver) -> Phase | Gone:
    """A queued run takes its thread and starts from the thread's memory, under its channel's profile."""
    record = driver.record
    task = _task_text(record.task)
    if not task:
        driver.notify(texts.EMPTY_TASK)
        return End(RunStatus.FINISHED)
    if not svc.store.threads.take(record, RUN_JOB_TIMEOUT):
        return _wait_for_thread(driver)
    try:
        history, seq = svc.store.threads.load_history(*record.thread)
    except NewerRecord:
        svc.store.threads.give_back(record)  # queued, as it was, for the newer release that wrote it
        raise
    except StateError as exc:
        return _refuse(driver, str(exc))
    state = new_run(task, history)
    profile, kept = thread_profile(svc, driver)
    driver.save(status=RunStatus.RUNNING, state=state.to_json(), history_seq=seq, profile=profile)
    if kept != profile:
        svc.store.threads.keep_profile(driver.record)
    return Advance(state)  # the "Working on it…" message goes out with the first request


def _wait_for_thread(driver: Driver) -> Gone:
    """Another run holds the thread: this one stays queued (said once), and starts when it ends."""
    if driver.record.posted == 0:
        driver.notify(texts.QUEUED_IN_THREAD)
    driver.save()
    driver.deliver()
    driver.leave()
    return Gone()


def _advance(svc: Services, driver: Driver, state: RunState) -> Leave:
    """Step the run until it leaves the loop: after every step, save (with what it owes Slack); the
    next step pays it meanwhile (a turn's summary goes out while the model reads its results)."""

    agent = replace(agent_of(svc, driver), live=driver.live_view())
    driver.show_turn(state.pending)  # a turn going on after a park (or a crash) shows its calls anew
    working = functools.partial(thread_status.show, svc, phase=thread_status.Phase.WORKING)
    while True:
        driver.dispatch(then=working)  # the status after the posts: a post in a DM clears it
        agent = offered_now(svc, driver, agent, state)
        result = step(state, agent)
        state = result.state
        record_rulings(svc, driver, result.events, agent)
        owe_summaries(driver, result.events, agent, state)
        if result.outcome is not None:
            driver.collect()
            return Leave(state, agent, result.outcome)
        if driver.owes() or not saves_first(state, agent):  # else the write-ahead mark saves it
            driver.save(state=state.to_json())


def _leave(svc: Services, driver: Driver, state: RunState, agent: Agent, outcome: Outcome) -> Phase:
    """Where the loop's outcome leads: a park, or the run's end with what its thread is owed."""
    if isinstance(outcome, AwaitingApproval):
        return Park(state, agent, outcome.calls)
    if isinstance(outcome, AwaitingInput):
        return ParkForInput(state, outcome.call)
    if isinstance(outcome, AwaitingTask):
        return ParkForTask(state, outcome.call)
    if not isinstance(outcome, Finished):
        driver.let_stand(discard=isinstance(outcome, Failed))
    if isinstance(outcome, AwaitingLimit):
        return ParkAtLimit(state, outcome)
    if isinstance(outcome, Failed):
        driver.owe(endings.failed(run_id=driver.run_id, error=outcome.error), role=outbox.FAILURE)
        driver.amend(state=state.to_json(), error=outcome.error, failure_ts=None)
        return End(RunStatus.FAILED)
    if isinstance(outcome, Finished):
        return _answered(driver, state, outcome)
    return _stopped(svc, driver, state, outcome)


def _answered(driver: Driver, state: RunState, outcome: Finished) -> End:
    """The answer, settled into the message that streamed it; ✅ unless a call did not run."""
    answer = endings.final_answer(outcome.answer, state.turns, state.requests, run_id=driver.run_id)
    driver.owe(answer, live=driver.seal_live())
    not_run = calls_not_run(state)  # declined, expired or denied: then it is not "Done", no ✅
    driver.amend(state=state.to_json())
    driver.owe_reaction("no_entry_sign" if not_run.total else "white_check_mark", remove="eyes")
    return End(RunStatus.FINISHED, "", not_run)


def _stopped(svc: Services, driver: Driver, state: RunState, outcome: Stopped) -> End:
    """A valve stopped the run (Stop among them): the thread is told which."""
    if outcome.valve is Valve.STOPPED_BY_USER:
        by = svc.store.runs.stop_requested(driver.run_id)
        driver.owe(endings.stopped_by(by=by, turns=state.turns, requests=state.requests))
        driver.amend(stopped_by=by)
    else:
        driver.owe(endings.stopped(outcome.reason, state.turns, state.requests))
    driver.amend(state=state.to_json())
    driver.owe_reaction("octagonal_sign", remove="eyes")
    return End(RunStatus.STOPPED, outcome.valve)


def _end(driver: Driver, status: RunStatus, valve: str, not_run: NotRun | None) -> Finish:
    """Save the run ended with what it owes, pay it, close its status (`valve`: what stopped it;
    `not_run`: the calls of a finished run that did not run, for its Working message)."""
    record = driver.record
    if record.working_ts and record.status in (RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL):
        by = record.stopped_by
        if status is RunStatus.FINISHED:  # its last request was in flight when Stop was pressed
            by = driver.svc.store.runs.stop_requested(record.run_id)
        closed = turns.working_closed(outcome=status.value, by=by, not_run=not_run)
        driver.owe_update(record.working_ts, closed)  # its Stop button goes
    driver.save(status=status)
    metrics.run_ended(driver.svc.store.redis, driver.record, valve)
    driver.deliver()
    driver.show(thread_status.Phase.ENDED)
    return Finish(failed=status is RunStatus.FAILED)


def _finish(driver: Driver, failed: bool) -> RetryIfClicked | Gone:
    """Hand the thread on: the one place the run it starts next is learnt. A failure whose Retry
    was clicked while its card was on its way is still this driver's, to retry now."""
    if not failed:
        return Gone(driver.finish())
    ended = driver.finish_failed()
    return RetryIfClicked() if ended.retry_claimed else Gone(ended.next_run)


def _park(
    svc: Services, driver: Driver, state: RunState, agent: Agent, calls: tuple[PendingCall, ...]
) -> Advance | Parked:
    """Park the run on the calls no standing grant covers: their cards owed in the park's own
    write, its nudges scheduled before it; with none left, the run goes on."""
    state, waiting = granting.apply_grants(svc, driver.record, state, calls)
    if not waiting:
        driver.save(state=state.to_json())
        return Advance(state)
    approvals = svc.settings_of(driver.record).approvals
    minutes = approvals.expire_after_minutes
    expires_at = datetime.now(UTC) + timedelta(minutes=minutes)
    _schedule_nudges(svc, driver, approvals, expires_at)
    intent = park_cards.intent(state)
    call_tools = {c.id: park_cards.call_tool_info(agent, c, intent).to_json() for c in waiting}
    driver.amend(call_tools=call_tools, expires_at=expires_at.timestamp(), extensions=0)
    driver.seal_for_park(waiting)  # its message stops, showing what waits; the summary settles into it
    _owe_cards(svc, driver, waiting, expires_at)
    driver.park(state, waiting, park_ttl(minutes), expires_at.timestamp())
    driver.deliver()
    driver.hand_parked_live()
    driver.show(thread_status.Phase.WAITING)  # after the cards
    return Parked()


def _schedule_nudges(svc: Services, driver: Driver, approvals: Approvals, expires_at: datetime) -> None:
    """The park's escalation and reminder, scheduled before the park: a driver dying between
    parks again, and its next park finds them."""
    minutes = approvals.expire_after_minutes
    park_id = driver.record.park_id + 1
    if approvals.escalate_after_minutes:
        due = expires_at - timedelta(minutes=minutes - approvals.escalate_after_minutes)
        svc.store.escalations.schedule_escalation(driver.run_id, park_id, due.timestamp())
    if approvals.remind_before_minutes:  # one reminder before the expiry, with Extend
        due = expires_at - timedelta(minutes=approvals.remind_before_minutes)
        svc.store.escalations.schedule_reminder(driver.run_id, park_id, due.timestamp())


def _owe_cards(svc: Services, driver: Driver, waiting: tuple[PendingCall, ...], expires_at: datetime) -> None:
    """A card per waiting call, and with several an Approve all message (`park` numbers it next)."""
    for call in waiting:
        driver.owe(park_cards.approval_card(svc, driver.record, call), role=outbox.CARD, call=call.id)
    if len(waiting) > 1:
        batch = batch_cards.batch_card(
            run_id=driver.run_id,
            park_id=driver.record.park_id + 1,
            calls=waiting,
            requester=driver.record.requester,
            expires_at=expires_at,
        )
        driver.owe(batch, role=outbox.CARD, call=BATCH)


def _parked(svc: Services, driver: Driver) -> Phase | Gone:
    """A parked run: a Stop stops it, every decision in resumes it, else it is let go (parked)."""
    record = driver.record
    view = svc.store.parks.view(record.run_id, record.park_id)
    if view.stop_by is not None:
        return StopParked(view.stop_by)
    decisions = view.decisions
    if not decisions or any(d is None for d in decisions.values()):
        return Parked() if driver.settle() else Gone()  # settled "ready": decided meanwhile, look again
    # The click-to-resume time, written with the resume's save.
    driver.beside_next_save(metrics.resume_account(record.run_id, record.park_id, decisions))
    try:
        state = record.run_state()
    except StateError as exc:
        return _refuse(driver, str(exc))
    if state.status is Status.AWAITING_LIMIT:
        return ResumeAtLimit(state, decisions)
    return Resume(state, view)


def _resume(svc: Services, driver: Driver, state: RunState, view: ParkView) -> Phase:
    """Resume with every decision in the state; the cards show them while the approved calls run."""
    if state.waiting_for_input or state.waiting_on_task:
        answer = questions.resume if state.waiting_for_input else tasks.resume
        answered = answer(svc, driver, state, view)
        return _refuse(driver, texts.DECISIONS_DO_NOT_MATCH) if answered is None else Advance(answered)
    record, decisions = driver.record, view.decisions
    if set(decisions) != {c.id for c in state.awaiting}:
        return _refuse(driver, texts.DECISIONS_DO_NOT_MATCH)
    waited = state.awaiting
    state = record_decisions(state, {k: v for k, v in decisions.items() if v is not None})
    state = previews.ask_again_if_changed(svc, driver, state, set(decisions))  # a card's change went stale
    for call in state.pending:  # a grant clicked before the park settled: its notice is still due
        if call.decision is not None and call.decision.grant is GrantUse.GIVEN:
            granting.announce_grant(svc, record, call.name, call.decision.grant_dir or "")
    _owe_decided_cards(driver, state, view)
    # Durably running before anything else: the decisions stay in Redis until the park's TTL. The
    # same round trip forgets the park's expiry and takes the thread again.
    driver.beside_next_save(svc.store.threads.resumed(driver.record, RUN_JOB_TIMEOUT))
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
    return Advance(state)


def _owe_decided_cards(driver: Driver, state: RunState, view: ParkView) -> None:
    """First the batch message (often the one clicked): buttons gone, outcomes; then each card not
    yet updated, rendered by the courier while the approved calls run."""
    record, decisions = driver.record, view.decisions
    if BATCH in record.cards:
        batch = [c for c in state.pending if c.id in decisions]
        driver.owe_update(record.cards[BATCH], batch_cards.batch_decided(calls=batch, decisions=decisions))
    shown, now = view.cards_updated, time.time()
    for call in state.pending:
        if call.decision is not None and call.id in record.cards and call.id not in shown:
            driver.owe_decided(record.cards[call.id], call, now)


def _retry_if_clicked(svc: Services, driver: Driver) -> Phase:
    """Retry a failed run whose Retry was clicked, from its last state; else its thread is let go."""
    record = driver.record
    by = svc.store.admission.retry_claimed_by(record.run_id, record.failure_ts) if record.failure_ts else None
    if by is None or record.failure_ts is None:
        return Finish()  # no Retry click: the failure stays as posted
    if not svc.store.threads.take(record, RUN_JOB_TIMEOUT, queue=False):
        svc.store.admission.unclaim_retry(record.run_id, record.failure_ts)
        driver.notify(texts.RETRY_BUSY)
        return End(RunStatus.FAILED)
    try:
        state = record.run_state()
    except StateError as exc:
        return _refuse(driver, str(exc))
    retried = endings.retried_card(error=record.error or "", by=by, at=datetime.now(UTC))
    driver.owe_update(record.failure_ts, retried)
    if record.working_ts:  # working again: its Stop button is back
        driver.owe_update(record.working_ts, turns.working(run_id=record.run_id))
    driver.save(status=RunStatus.RUNNING, failure_ts=None, error=None)
    driver.deliver()
    return Advance(state)


def _park_at_limit(svc: Services, driver: Driver, state: RunState, outcome: AwaitingLimit) -> Parked:
    """Park a run at a limit: its card asks Continue or Stop; it expires like an approval (then stops)."""
    minutes = svc.settings_of(driver.record).approvals.expire_after_minutes
    expires_at = datetime.now(UTC) + timedelta(minutes=minutes)
    ask = LimitAsk(question=outcome.question, reason=outcome.reason, more=outcome.more)
    driver.amend(call_tools={LIMIT_CALL: ask.to_json()}, expires_at=expires_at.timestamp(), extensions=0)
    driver.owe(park_cards.limit_card(svc, driver.record), role=outbox.CARD, call=LIMIT_CALL)
    driver.park_limit(state, park_ttl(minutes), expires_at.timestamp())
    driver.deliver()
    driver.show(thread_status.Phase.WAITING)
    return Parked()


def _resume_at_limit(
    svc: Services, driver: Driver, state: RunState, decisions: dict[str, Decision | None]
) -> Phase:
    """A limit answered: Continue grants one more allowance and goes on; Stop or expiry ends the run."""
    record = driver.record
    decision = decisions.get(LIMIT_CALL)
    if decision is None or set(decisions) != {LIMIT_CALL} or state.at_limit not in tuple(Valve):
        return _refuse(driver, texts.DECISIONS_DO_NOT_MATCH)
    ask = record.limit_ask()
    shown = svc.store.parks.cards_updated(record.run_id, record.park_id)
    if LIMIT_CALL in record.cards and LIMIT_CALL not in shown:
        decided = cards.limit_decided(
            question=ask.question,
            verdict=decision.verdict,
            by=decision.by,
            at=datetime.now(UTC),
            more=ask.more,
            approvers=decision.approvers,
        )
        driver.owe_update(record.cards[LIMIT_CALL], decided)
    svc.store.parks.forget(record)
    if decision.verdict is Verdict.APPROVED:
        return _continue_at_limit(svc, driver, state)
    return _stop_at_limit(driver, state, ask, decision)


def _continue_at_limit(svc: Services, driver: Driver, state: RunState) -> Leave | Advance:
    """Continue: one more allowance of the limit, and the turn it held starts now."""
    agent = agent_of(svc, driver)
    result = continue_at_limit(state, agent)
    record_rulings(svc, driver, result.events, agent)
    driver.save(status=RunStatus.RUNNING, state=result.state.to_json(), expires_at=None)
    svc.store.threads.take(driver.record, RUN_JOB_TIMEOUT)
    driver.deliver()
    owe_summaries(driver, result.events, agent, result.state)
    if result.outcome is not None:
        return Leave(result.state, agent, result.outcome)
    return Advance(result.state)


def _stop_at_limit(driver: Driver, state: RunState, ask: LimitAsk, decision: Decision) -> End:
    """Stop, or nobody answered in time: the run ends as the limit's stop, saying which."""
    reason = ask.reason or harness_texts.STOP_BY_USER
    said = texts.LIMIT_EXPIRED_REASON if decision.verdict is Verdict.EXPIRED else texts.LIMIT_STOP_REASON
    valve = "expired" if decision.verdict is Verdict.EXPIRED else state.at_limit
    state = stop_run(state, Valve(state.at_limit), reason)
    driver.owe(endings.stopped(said.format(reason=reason), state.turns, state.requests))
    driver.amend(state=state.to_json())
    driver.owe_reaction("octagonal_sign", remove="eyes")
    return End(RunStatus.STOPPED, valve)


def _stop_parked(svc: Services, driver: Driver, by: str) -> End:
    """Stop a parked run at once: its cards lose their buttons, its open calls are answered as not run."""
    record = driver.record
    try:
        state = record.run_state()
    except StateError as exc:
        return _refuse(driver, str(exc))
    _owe_stopped_cards(svc, driver, state, by)
    svc.store.parks.forget(record)
    questions.cancel(svc, driver, state)
    state = tasks.stop(svc, driver, state)  # its poller cancels the task
    if tracing.current() is not None and state.status is Status.AWAITING_APPROVAL:
        view = svc.store.parks.view(record.run_id, record.park_id)
        tracing.approvals_waited(
            record.trace,
            record.run_id,
            state.awaiting,
            view.decisions,
            parked_since=record.parked_since,
            decided_at=view.decided_at,
            stopped_by=by,
        )
    ended = stop_mid_turn(state, Stop(Valve.STOPPED_BY_USER, harness_texts.STOP_BY_USER), [])
    state = ended.state
    driver.show_turn([c for e in ended.events if isinstance(e, TurnDone) for c in e.calls])  # not run
    ending = endings.stopped_by(by=by, turns=state.turns, requests=state.requests)
    driver.owe(ending, live=driver.seal_live())  # the parked turn's lines, as the Stop left them
    driver.amend(state=state.to_json(), stopped_by=by)
    driver.owe_reaction("octagonal_sign", remove="eyes")
    return End(RunStatus.STOPPED, Valve.STOPPED_BY_USER)


def _owe_stopped_cards(svc: Services, driver: Driver, state: RunState, by: str) -> None:
    """Every card of the park not yet showing its decision shows the Stop, without buttons."""
    record, now = driver.record, datetime.now(UTC)
    shown = svc.store.parks.cards_updated(record.run_id, record.park_id)
    calls = {c.id: c for c in state.pending}
    for call_id, ts in record.cards.items():
        if call_id in shown:
            continue  # already shows its decision, with no buttons
        if call_id == LIMIT_CALL:
            msg = cards.limit_decided(
                question=record.limit_ask().question, verdict=Verdict.DECLINED, by=by, at=now, more=""
            )
        elif call_id in calls and calls[call_id].asking is not None:
            msg = questions.stopped_note(calls[call_id], by, now)
        elif call_id in calls and calls[call_id].tasking is not None:
            msg = tasks.stopped_note(calls[call_id], by, now)
        elif call_id in calls:
            msg = cards.card_stopped(call=calls[call_id], requester=record.requester, by=by, at=now)
        elif call_id == BATCH:
            msg = batch_cards.batch_stopped(calls=state.awaiting, by=by, at=now)
        else:
            continue
        driver.owe_update(ts, msg)


def _refuse(driver: Driver, reason: str) -> End:
    """Fail closed: say so in the thread, stop the run, run nothing."""
    driver.notify(driver.refuse_text(reason))
    return End(RunStatus.STOPPED, "refused")


def _give_up(driver: Driver) -> End:
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
    driver.amend(outbox=[], state=state)
    if record.recoveries <= MAX_RECOVERIES + 2:
        driver.notify(text)
    return End(RunStatus.STOPPED, Valve.CRASHES)


def _checkpointed_state(record: RunRecord) -> RunState:
    if record.state is None:  # no state yet: start over
        return new_run(_task_text(record.task) or "(empty)")
    return record.run_state()


def _task_text(raw: str) -> str:
    """The mention's text without the leading bot mention(s)."""
    return re.sub(r"^(\s*<@[UW][A-Z0-9]+(\|[^>]*)?>\s*)+", "", raw).strip()
