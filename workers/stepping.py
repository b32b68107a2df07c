"""One step of a run's loop, the parts that are not a phase: the agent a run gets (its channel's
settings now), the tier rulings and turn summaries a step owes, the figures it counts."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from gates import budgets
from gates.meters import RunMeter, where_of
from harness import texts as harness_texts
from harness.agent import with_tools
from harness.loop import (
    Agent,
    Event,
    ToolsRequested,
    TurnDone,
)
from harness.receipts import Minter, RunFacts
from harness.state import (
    PendingCall,
    RunState,
    Status,
)
from harness.tools.catalog import Catalog
from harness.tools.inputs import InputAsk
from harness.valves import Stop, Valve, token_limit
from messages import texts, turns
from messages.blocks import notice
from observe import metrics, tracing
from ops import rulings
from store import (
    rulings_write,
)
from workers import park_cards
from workers.driver import Driver
from workers.services import Services

log = logging.getLogger(__name__)


def thread_profile(svc: Services, driver: Driver) -> tuple[str, str | None]:
    """The profile a run starting in its thread goes under (its channel's now), and the one the
    thread kept (None: a new thread). A thread keeps its profile only while its channel maps to
    it: when its last run had another, the thread is told so in one line (the next save owes it)."""
    record = driver.record
    now = svc.settings_of(record).profile_label
    kept = svc.store.threads.profile(*record.thread)
    if kept is not None and kept != now:
        driver.notify(texts.THREAD_PROFILE_CHANGED.format(now=profile_words(now), was=profile_words(kept)))
    return now, kept


def profile_words(profile: str) -> str:
    return texts.PROFILE_NAMED.format(profile=profile) if profile else texts.PROFILE_TOP_LEVEL


def agent_of(svc: Services, driver: Driver) -> Agent:
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

    def input_values(ask: InputAsk) -> dict[str, dict[str, Any]]:
        """The values the requester sent for `ask`'s questions, taken (read, then dropped): the call
        they go with is marked started first, so it never goes twice."""
        refs = {key: answer.ref for key, answer in ask.answers.items() if answer.ref}
        values = {key: svc.store.inputs.values(driver.run_id, ref) for key, ref in refs.items()}
        svc.store.inputs.drop(driver.run_id, list(refs.values()))
        return values

    agent = Agent.from_config(
        settings,
        catalog,
        client=svc.model,
        before_tool=write_ahead,
        stop_check=stop_check,
        budget=gate,
        tracer=tracing.run_tracer(),
        input_values=input_values,
        meter=RunMeter(svc.store, where_of(record)),
        receipt=_minter(svc, driver, catalog),
    )
    # A server's question in the middle of a call is put to this run's requester (`workers.mid_call`).
    return replace(agent, context=replace(agent.context, who=driver.run_id))


def _minter(svc: Services, driver: Driver, catalog: Catalog | None) -> Minter | None:
    """What makes each call's approval receipt as it runs (none without HARNESS_RECEIPT_KEY)."""
    if svc.signer is None or catalog is None:
        return None
    record = driver.record
    facts = RunFacts(driver.run_id, record.requester, record.team, record.channel)
    return Minter(svc.signer, facts, catalog.audience, time.time)


def offered_now(svc: Services, driver: Driver, agent: Agent, state: RunState) -> Agent:
    """`agent` with the tools offered now: an MCP server's may have changed since its last step
    (`notifications/tools/list_changed`). The same agent while they have not (the catalog keeps
    its registry until the listing changes)."""
    if svc.catalog is None:
        return agent
    return with_tools(agent, svc.catalog.narrowed(svc.settings_of(driver.record)).registry(), state)


def record_rulings(svc: Services, driver: Driver, events: tuple[Event, ...], agent: Agent) -> None:
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


def owe_summaries(driver: Driver, events: tuple[Event, ...], agent: Agent, state: RunState) -> None:
    count_step(driver, state, events)
    budget = token_limit(state, agent.limits)
    for event in events:
        if isinstance(event, ToolsRequested) and driver.live is not None:
            driver.live.requested(event.calls)
        if isinstance(event, TurnDone):
            if driver.live is not None:  # every line shows how its call ended (a Stop left some unrun)
                driver.live.requested(event.calls)
            settles = driver.seal_live()
            # The words it streamed stay in the summary it settles into.
            said = park_cards.intent(state) if settles else ""
            try:
                msg = turns.turn_summary(event.turn, event.calls, event.tokens, budget, said=said)
            except Exception:  # never lose the step (and its usage) to a rendering bug
                log.exception("run %s: turn %s could not be rendered", driver.run_id, event.turn)
                msg = notice(texts.UNRENDERABLE.format(turn=event.turn))
            driver.owe(msg, live=settles)


def count_step(driver: Driver, state: RunState, events: tuple[Event, ...]) -> None:
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
