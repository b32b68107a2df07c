"""The RQ jobs: start, continue, resume, retry and recover runs; show decisions on their cards.

Every job that drives a run does one thing: take the run's lease and do what the run needs next
(`drive`), one phase after another in one loop (`_life`) until the run is let go. A queued run
starts; a running one continues from its last checkpoint; a parked one resumes once every decision
is in; a failed one with a Retry click retries; an ended one pays what it still owes Slack and
lets its thread go. So a job may die anywhere: the run stays in `harness:active` with no lease,
the watchdog enqueues `recover_run`, and the next driver carries on from the last write. No job
ever waits for a human.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, assert_never

import rq

from gates import budgets
from harness import texts as harness_texts
from harness.config import Approvals
from harness.loop import (
    Agent,
    AwaitingApproval,
    AwaitingLimit,
    Event,
    Failed,
    Finished,
    Outcome,
    Stopped,
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
    ParkView,
    RunRecord,
    RunStatus,
    Store,
    rulings_write,
)
from workers import granting, outbox, park_cards, thread_status
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
        _drive(svc, run_id)  # the resume updates every card
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
            following = _life(svc, driver, recovering)
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


# --- a run's life: one loop over phases -----------------------------------------------------------
#
# A job that holds a run's lease takes it from phase to phase (`_life`) until the run is let go:
# parked, queued behind another run of its thread, or ended. Each phase does its work and names the
# next; none calls another, and only `Finish` learns the run its thread starts next. A lost lease
# (`LostLease`, raised by any write) ends the job wherever it stands: the next driver carries on.


@dataclass(frozen=True)
class Arrive:
    """The lease just taken: pay what an earlier driver owed, then go where the record says."""

    recovering: bool = False  # the watchdog sent this job: its driver died (counted)


@dataclass(frozen=True)
class Start:
    """A queued run: it takes its thread and starts from the thread's memory, or waits its turn."""


@dataclass(frozen=True)
class Advance:
    """A running run, stepped from `state` until it leaves the loop."""

    state: RunState


@dataclass(frozen=True)
class Leave:
    """The loop left with `outcome`: the run parks, or ends with what its thread is owed."""

    state: RunState
    agent: Agent
    outcome: Outcome


@dataclass(frozen=True)
class Park:
    """`calls` ask for people (once the thread's standing grants took theirs): one card each."""

    state: RunState
    agent: Agent
    calls: tuple[PendingCall, ...]


@dataclass(frozen=True)
class ParkAtLimit:
    """A limit that asks: one card, Continue or Stop."""

    state: RunState
    outcome: AwaitingLimit


@dataclass(frozen=True)
class Parked:
    """A parked run: stopped on a Stop, resumed once every decision is in, else let go."""


@dataclass(frozen=True)
class Resume:
    """Every call of the park is decided (`view`): the run goes on with the decisions in `state`."""

    state: RunState
    view: ParkView


@dataclass(frozen=True)
class ResumeAtLimit:
    """The limit's card is answered: Continue goes on, Stop or the expiry ends the run."""

    state: RunState
    decisions: dict[str, Decision | None]


@dataclass(frozen=True)
class StopParked:
    """Stop pressed (`by`) while the run waited for people."""

    by: str


@dataclass(frozen=True)
class RetryIfClicked:
    """A failed run: retried if its Retry was clicked, else its thread let go."""


@dataclass(frozen=True)
class End:
    """The run ends as `status` (`valve`: what stopped it; `not_run`: calls a finished run left)."""

    status: RunStatus
    valve: str = ""
    not_run: NotRun | None = None


@dataclass(frozen=True)
class Finish:
    """The ended run lets its thread go; a `failed` one first looks for a Retry clicked meanwhile."""

    failed: bool = False


@dataclass(frozen=True)
class Gone:
    """The run is let go: `next_run`, the run its thread starts next (only `Finish` knows one)."""

    next_run: str | None = None


Phase = (
    Arrive
    | Start
    | Advance
    | Leave
    | Park
    | ParkAtLimit
    | Parked
    | Resume
    | ResumeAtLimit
    | StopParked
    | RetryIfClicked
    | End
    | Finish
)


def _life(svc: Services, driver: Driver, recovering: bool) -> str | None:
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
    and go where the run's status says."""
    if recovering:
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
    if not svc.store.take_thread(record, RUN_JOB_TIMEOUT):
        return _wait_for_thread(driver)
    try:
        history, seq = svc.store.load_history(*record.thread)
    except StateError as exc:
        return _refuse(driver, str(exc))
    state = new_run(task, history)
    profile, kept = _thread_profile(svc, driver)
    driver.save(status=RunStatus.RUNNING, state=state.to_json(), history_seq=seq, profile=profile)
    if kept != profile:
        svc.store.keep_thread_profile(driver.record)
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

    agent = replace(_agent(svc, driver), live=driver.live_view())
    working = functools.partial(thread_status.show, svc, phase=thread_status.Phase.WORKING)
    while True:
        driver.dispatch(then=working)  # the status after the posts: a post in a DM clears it
        result = step(state, agent)
        state = result.state
        _record_rulings(svc, driver, result.events, agent)
        _owe_summaries(driver, result.events, agent, state)
        if result.outcome is not None:
            driver.collect()
            return Leave(state, agent, result.outcome)
        if driver.owes() or not saves_first(state, agent):  # else the write-ahead mark saves it
            driver.save(state=state.to_json())


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
            settles = driver.seal_turn()
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


def _leave(svc: Services, driver: Driver, state: RunState, agent: Agent, outcome: Outcome) -> Phase:
    """Where the loop's outcome leads: a park, or the run's end with what its thread is owed."""
    if isinstance(outcome, AwaitingApproval):
        return Park(state, agent, outcome.calls)
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
        by = svc.store.stop_requested(driver.run_id)
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
            by = driver.svc.store.stop_requested(record.run_id)
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
    call_tools = {c.id: park_cards.call_tool_info(agent, c, intent) for c in waiting}
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
        svc.store.schedule_escalation(driver.run_id, park_id, due.timestamp())
    if approvals.remind_before_minutes:  # one reminder before the expiry, with Extend
        due = expires_at - timedelta(minutes=approvals.remind_before_minutes)
        svc.store.schedule_reminder(driver.run_id, park_id, due.timestamp())


def _owe_cards(svc: Services, driver: Driver, waiting: tuple[PendingCall, ...], expires_at: datetime) -> None:
    """A card per waiting call, and with several an Approve all message (`park` numbers it next)."""
    for call in waiting:
        driver.owe(park_cards.approval_card(svc, driver.record, call), role=outbox.CARD, call=call.id)
    if len(waiting) > 1:
        batch = cards.batch_card(
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
    view = svc.store.park_view(record.run_id, record.park_id)
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
    record, decisions = driver.record, view.decisions
    if set(decisions) != {c.id for c in state.awaiting}:
        return _refuse(driver, texts.DECISIONS_DO_NOT_MATCH)
    waited = state.awaiting
    state = record_decisions(state, {k: v for k, v in decisions.items() if v is not None})
    for call in state.pending:  # a grant clicked before the park settled: its notice is still due
        if call.decision is not None and call.decision.grant == "given":
            granting.announce_grant(svc, record, call.name, call.decision.grant_dir or "")
    _owe_decided_cards(driver, state, view)
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
    return Advance(state)


def _owe_decided_cards(driver: Driver, state: RunState, view: ParkView) -> None:
    """First the batch message (often the one clicked): buttons gone, outcomes; then each card not
    yet updated, rendered by the courier while the approved calls run."""
    record, decisions = driver.record, view.decisions
    if BATCH in record.cards:
        batch = [c for c in state.pending if c.id in decisions]
        driver.owe_update(record.cards[BATCH], cards.batch_decided(calls=batch, decisions=decisions))
    shown, now = view.cards_updated, time.time()
    for call in state.pending:
        if call.decision is not None and call.id in record.cards and call.id not in shown:
            driver.owe_decided(record.cards[call.id], call, now)


def _retry_if_clicked(svc: Services, driver: Driver) -> Phase:
    """Retry a failed run whose Retry was clicked, from its last state; else its thread is let go."""
    record = driver.record
    by = svc.store.retry_claimed_by(record.run_id, record.failure_ts) if record.failure_ts else None
    if by is None or record.failure_ts is None:
        return Finish()  # no Retry click: the failure stays as posted
    if not svc.store.take_thread(record, RUN_JOB_TIMEOUT, queue=False):
        svc.store.unclaim_retry(record.run_id, record.failure_ts)
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


# --- limits that ask, and Stop --------------------------------------------------------------------


def _park_at_limit(svc: Services, driver: Driver, state: RunState, outcome: AwaitingLimit) -> Parked:
    """Park a run at a limit: its card asks Continue or Stop; it expires like an approval (then stops)."""
    minutes = svc.settings_of(driver.record).approvals.expire_after_minutes
    expires_at = datetime.now(UTC) + timedelta(minutes=minutes)
    info = {"question": outcome.question, "reason": outcome.reason, "more": outcome.more}
    driver.amend(call_tools={LIMIT_CALL: info}, expires_at=expires_at.timestamp(), extensions=0)
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
        driver.owe_update(record.cards[LIMIT_CALL], decided)
    svc.store.forget_park(record)
    if decision.verdict is Verdict.APPROVED:
        return _continue_at_limit(svc, driver, state)
    return _stop_at_limit(driver, state, info, decision)


def _continue_at_limit(svc: Services, driver: Driver, state: RunState) -> Leave | Advance:
    """Continue: one more allowance of the limit, and the turn it held starts now."""
    agent = _agent(svc, driver)
    result = continue_at_limit(state, agent)
    _record_rulings(svc, driver, result.events, agent)
    driver.save(status=RunStatus.RUNNING, state=result.state.to_json(), expires_at=None)
    svc.store.take_thread(driver.record, RUN_JOB_TIMEOUT)
    driver.deliver()
    _owe_summaries(driver, result.events, agent, result.state)
    if result.outcome is not None:
        return Leave(result.state, agent, result.outcome)
    return Advance(result.state)


def _stop_at_limit(driver: Driver, state: RunState, info: dict[str, Any], decision: Decision) -> End:
    """Stop, or nobody answered in time: the run ends as the limit's stop, saying which."""
    reason = info.get("reason") or harness_texts.STOP_BY_USER
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
        driver.owe_update(record.live_ts, notice(texts.LIVE_ENDED))
        driver.amend(live_ts=None)
    state = stop_run(state, Valve.STOPPED_BY_USER, harness_texts.STOP_BY_USER)
    driver.owe(endings.stopped_by(by=by, turns=state.turns, requests=state.requests))
    driver.amend(state=state.to_json(), stopped_by=by)
    driver.owe_reaction("octagonal_sign", remove="eyes")
    return End(RunStatus.STOPPED, Valve.STOPPED_BY_USER)


def _owe_stopped_cards(svc: Services, driver: Driver, state: RunState, by: str) -> None:
    """Every card of the park not yet showing its decision shows the Stop, without buttons."""
    record, now = driver.record, datetime.now(UTC)
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
