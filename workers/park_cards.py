"""The cards of a parked run, drawn from what its record kept.

A park keeps, per call, what its card and the edit modal need of the tool and of the reply
(`RunRecord.call_tools`); every card is drawn again from that alone, by whichever process needs it:
the park's worker, the job that shows a quorum filling up, the one that shows a new expiry.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from gates import deciders
from harness.loop import Agent
from harness.state import Decision, PendingCall, RunState, StateError
from messages import batch_cards, cards
from messages.blocks import Message
from store import BATCH, LIMIT_CALL, CallTool, RunRecord
from workers.services import Services

log = logging.getLogger(__name__)


def redraw_open(svc: Services, record: RunRecord) -> None:
    """The park's open cards (and its Approve all message) drawn again, showing its expiry now.

    A decision may land meanwhile; its card update is claimed once (`first_card_update`). So a card
    is redrawn open only while that claim is not taken, and looked at again after: a decision that
    came in between gets its decided card back, whichever update Slack applied last.
    """
    run_id, park_id = record.run_id, record.park_id
    try:
        calls = {c.id: c for c in record.run_state().pending}
    except StateError:
        return
    votes = svc.store.parks.votes(run_id, park_id)
    open_calls = [c for c in calls.values() if c.id in record.cards and c.awaiting]
    decided_before = svc.store.parks.cards_updated(run_id, park_id)
    for call_id, ts in record.cards.items():
        if call_id in decided_before:
            continue
        if call_id == LIMIT_CALL:
            msg = limit_card(svc, record, votes.get(call_id, ()))
        elif call_id == BATCH:
            expires_at = datetime.fromtimestamp(record.expires_at or time.time(), UTC)
            msg = batch_cards.batch_card(
                run_id=run_id,
                park_id=park_id,
                calls=open_calls,
                requester=record.requester,
                expires_at=expires_at,
            )
        elif call_id in calls:
            msg = approval_card(svc, record, calls[call_id], votes.get(call_id, ()))
        else:
            continue
        svc.update(record.channel, ts, msg.text, msg.blocks)
    decisions = svc.store.parks.decisions(run_id, park_id)
    for call_id in svc.store.parks.cards_updated(run_id, park_id):  # decided meanwhile: shown decided again
        decision, card = decisions.get(call_id), record.cards.get(call_id)
        if decision is not None and card and call_id in calls:
            msg = decided_card(record, calls[call_id], decision)
            svc.update(record.channel, card, msg.text, msg.blocks)


def approval_card(
    svc: Services, record: RunRecord, call: PendingCall, votes: tuple[str, ...] = ()
) -> Message:
    """The card of one parked call, from what the park kept of its tool and reply."""
    approvals = svc.settings_of(record).approvals
    info = record.call_tool(call.id)
    expires_at = datetime.fromtimestamp(record.expires_at or time.time(), UTC)
    card = cards.CallCard(
        run_id=record.run_id,
        call=call,
        requester=record.requester,
        tier_source=call.why,
        approvers=list(approvals.approvers),
        expires_at=expires_at,
        title=info.title,
        annotations=info.annotations,
        intent=info.intent,
        preview=info.preview,
        required=approvals.required,
        votes=votes,
        self_approval=approvals.self_approval,
        grant_minutes=approvals.grant_minutes,
        grant_uses=approvals.grant_uses,
        handles=svc.group_handles(record.team, approvals.approvers),
        approvers_from=approvals.approvers_from_for(call.name),
    )
    return cards.approval_card(card)


def limit_card(svc: Services, record: RunRecord, votes: tuple[str, ...] = ()) -> Message:
    """The card of a run parked at a limit, from what the park kept; `votes`: Continues so far."""
    approvals = svc.settings_of(record).approvals
    ask = record.limit_ask()
    named = deciders.named(approvals, record.requester)
    card = cards.LimitCard(
        run_id=record.run_id,
        question=ask.question,
        more=ask.more,
        requester=record.requester,
        deciders=named,
        expires_at=datetime.fromtimestamp(record.expires_at or time.time(), UTC),
        required=approvals.required,
        votes=votes,
        self_approval=approvals.self_approval,
        handles=svc.group_handles(record.team, named),
    )
    return cards.limit_card(card)


def decided_card(
    record: RunRecord, call: PendingCall, decision: Decision, grant_until: float | None = None
) -> Message:
    return cards.card_of_decision(
        call=call,
        decision=decision,
        requester=record.requester,
        at=datetime.now(UTC),
        grant_until=datetime.fromtimestamp(grant_until, UTC) if grant_until else None,
    )


def intent(state: RunState) -> str:
    """The model's own words in the reply that made this turn's calls."""
    last = next((m for m in reversed(state.messages) if m["role"] == "assistant"), None)
    if last is None or not isinstance(last["content"], list):
        return ""
    return "\n\n".join(b["text"] for b in last["content"] if b.get("type") == "text").strip()


def call_tool_info(agent: Agent, call: PendingCall, intent: str) -> CallTool:
    """What the park keeps for the card of `call`: of its tool, and the reply's words (`intent`)."""
    found = agent.tools.get(call.name)
    if found is None:
        return CallTool(intent=intent[:4000])
    preview = preview_of(agent, call)
    return CallTool(
        intent=intent[:4000],
        schema=dict(found.input_schema),
        own_tier=found.own_tier.value if found.own_tier else None,
        own_why=found.own_tier_why,
        title=found.title,
        annotations=dict(found.annotations) or None,
        preview=preview,
    )


PREVIEW_KEPT = 20_000  # characters of a preview the park keeps for its card


def preview_of(agent: Agent, call: PendingCall) -> str | None:
    """What `call` would change as its tool previews it now (against the files as they are), as a
    park keeps it; None when its tool draws none (or drawing it failed: logged)."""
    found = agent.tools.get(call.name)
    if found is None or found.preview is None or not isinstance(call.input, dict):
        return None
    try:
        preview = found.preview(agent.context, call.input)
    except Exception:  # a preview is a courtesy: the card goes out without it
        log.exception("preview of %s failed", call.name)
        return None
    return preview[:PREVIEW_KEPT] if preview else None
