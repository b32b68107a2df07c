"""A run parked on what a tool's server asks the requester (`harness.tools.inputs`).

The loop stops a turn at a call whose server asked a person something (`AwaitingInput`); here the
run parks on it as on an approval (one decision: the requester's answer, or the clock's), with a
prompt only the requester sees and a note for everyone (`messages.inputs`); the answer goes back
in the state, the note shows it, and the call goes again with it. A Stop tells each waiting server
that no answer will come.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from harness.state import PendingCall, RunState, Verdict, record_input_answers
from harness.tools.inputs import Action, InputAnswer, cancelled
from messages import inputs
from messages.blocks import Message
from runtime.queue import RUN_JOB_TIMEOUT
from store import ParkView, RunStatus
from workers import outbox, thread_status
from workers.driver import Driver, park_ttl
from workers.phases import Parked
from workers.services import Services
from workers.stepping import agent_of

log = logging.getLogger(__name__)


def park(svc: Services, driver: Driver, state: RunState, call: PendingCall) -> Parked:
    """Park on the question `call`'s server asks the requester: a prompt only they see, a note for
    everyone, and the park, whose one answer (or its expiry) is the question's."""
    ask, question = call.asking, call.asking.next_question if call.asking else None
    assert ask is not None and question is not None  # the loop parks only on an open question
    minutes = svc.settings_of(driver.record).approvals.expire_after_minutes
    expires_at = datetime.now(UTC) + timedelta(minutes=minutes)
    record = driver.record
    driver.amend(expires_at=expires_at.timestamp(), extensions=0, call_tools={})
    driver.seal_for_park((call,))
    note = inputs.input_note(
        run_id=record.run_id,
        call_id=call.id,
        tool=call.name,
        ask=ask,
        question=question,
        requester=record.requester,
    )
    driver.owe(note, role=outbox.CARD, call=call.id)
    prompt = inputs.input_prompt(
        run_id=record.run_id,
        call_id=call.id,
        tool=call.name,
        ask=ask,
        question=question,
        expires_at=expires_at,
    )
    driver.owe_ephemeral(record.requester, prompt)
    fingerprints = {call.id: ask.question_id(question)}
    driver.park(state, (call,), park_ttl(minutes), expires_at.timestamp(), fingerprints=fingerprints)
    driver.deliver()
    driver.hand_parked_live()
    driver.show(thread_status.Phase.WAITING)
    log.info("run %s: parked on a question of MCP server %s (%s)", record.run_id, ask.server, question.mode)
    return Parked()


def resume(svc: Services, driver: Driver, state: RunState, view: ParkView) -> RunState | None:
    """The requester answered (or the park expired: cancel): the answer goes in the state, the
    note shows it, and the run is saved running, to go on (the call goes again, with its answers,
    once every question has one). None: the decisions are not the questions' (refused)."""
    record, decisions = driver.record, view.decisions
    waiting = state.waiting_for_input
    if set(decisions) != {c.id for c in waiting}:
        return None
    answers, now = {}, datetime.now(UTC)
    for call in waiting:
        decision = decisions[call.id]
        assert decision is not None and call.asking is not None  # `_parked` resumes when all are in
        action = _ACTIONS[decision.verdict]
        ref = decision.reason if action == "accept" else None  # the values' reference (`store.inputs`)
        answers[call.id] = InputAnswer(action, by=decision.by, ref=ref)
        if call.id in record.cards:
            settled = inputs.input_settled(
                ask=call.asking, tool=call.name, outcome=action, by=decision.by, at=now
            )
            driver.owe_update(record.cards[call.id], settled)
        log.info("run %s: the question of %s was answered: %s", record.run_id, call.asking.server, action)
    state = record_input_answers(state, answers)
    driver.beside_next_save(svc.store.threads.resumed(driver.record, RUN_JOB_TIMEOUT))
    driver.save(status=RunStatus.RUNNING, state=state.to_json(), expires_at=None, call_tools={})
    return state


_ACTIONS: dict[Verdict, Action] = {
    Verdict.APPROVED: "accept",
    Verdict.DECLINED: "decline",
    Verdict.EXPIRED: "cancel",
}


def cancel(svc: Services, driver: Driver, state: RunState) -> None:
    """Tell each server still waiting for a person's answer that none will come (the call again,
    answered cancel); what it answers is not the model's any more: the run stops."""
    waiting = state.waiting_for_input
    if not waiting:
        return
    agent = agent_of(svc, driver)
    for call in waiting:
        assert call.asking is not None
        edited = call.decision.edited_input if call.decision is not None else None
        arguments = edited if edited is not None else call.input  # as the call was sent
        result = agent.tools.run(call.name, arguments, replace(agent.context, reply=cancelled(call.asking)))
        log.info(
            "run %s: told %s its question was cancelled (%s)",
            driver.run_id,
            call.asking.server,
            "it answered an error" if result.is_error else "it answered",
        )


def stopped_note(call: PendingCall, by: str, at: datetime) -> Message:
    """The note of `call`'s question once the run was stopped by `by`."""
    assert call.asking is not None
    return inputs.input_settled(ask=call.asking, tool=call.name, outcome="stopped", by=by, at=at)
