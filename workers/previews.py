"""An approval given on a card whose change no longer holds: the card showed what the call would
change (its tool's preview, such as `write_file`'s diff), and the file changed between the card and
the click. When the run resumes, each approved call's preview is drawn again: one that differs
from its card's is not run on that approval. Its card says why, and the call asks again, on a new
card showing the change as it is now (`workers.life` parks the run again, as for any call that
waits for a decision). A call run under a grant is not checked: the grant's giver approved the
tool's later calls, whatever they change.

What the check closes is the window between the card and the click (minutes, hours); what is
left is the one between this check and the call (milliseconds), which only the tool can close.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime

from harness.state import GrantUse, PendingCall, RunState, Verdict
from messages import cards
from workers import park_cards
from workers.driver import Driver
from workers.services import Services
from workers.stepping import agent_of

log = logging.getLogger(__name__)


def ask_again_if_changed(svc: Services, driver: Driver, state: RunState, decided: set[str]) -> RunState:
    """`state` with each call approved in this park (`decided`) whose change is no longer its
    card's undecided again, its card saying why; the others as they were."""
    record = driver.record
    approved = [c for c in state.pending if c.id in decided and _approved_on_its_card(c)]
    shown = {c.id: record.call_tool(c.id).preview for c in approved}
    approved = [c for c in approved if shown[c.id] is not None]
    if not approved:
        return state
    agent = agent_of(svc, driver)
    changed = {c.id: c for c in approved if park_cards.preview_of(agent, c) != shown[c.id]}
    now = datetime.now(UTC)
    for call in changed.values():
        assert call.decision is not None
        log.info("run %s: %s changed after its card was posted; it asks again", record.run_id, call.name)
        if call.id in record.cards:
            card = cards.card_changed(call=call, requester=record.requester, by=call.decision.by, at=now)
            driver.owe_update(record.cards[call.id], card)
    if not changed:
        return state
    pending = tuple(replace(c, decision=None) if c.id in changed else c for c in state.pending)
    return replace(state, pending=pending)


def _approved_on_its_card(call: PendingCall) -> bool:
    decision = call.decision
    return (
        decision is not None
        and decision.verdict is Verdict.APPROVED
        and decision.grant not in (GrantUse.USED, GrantUse.GIVEN)
        and call.result is None
    )
