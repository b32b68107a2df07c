"""Approve all and Decline all: the one message of a park of two or more calls, beside their cards,
and that message once its park is decided or its run stopped. Its buttons' value binds a click to
the park it was posted for (`batch_value`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from slack_sdk.models.blocks import ActionsBlock, ButtonElement

from harness.policy import always_asks
from harness.state import Decision, PendingCall, Verdict
from messages import texts
from messages.arguments import arguments_of
from messages.blocks import Message, context, section
from messages.limits import BUTTON_VALUE_MAX, SECTION_MAX
from messages.text import cut, inline, mention, slack_date

BATCH_LISTED = 10  # calls named one by one on a batch message; the rest are counted


def batch_value(run_id: str, park_id: int) -> str:
    """`run:park`: a batch click binds to the park its message was posted for, never a later one."""
    value = f"{run_id}:{int(park_id)}"
    if len(value) > BUTTON_VALUE_MAX:
        raise ValueError(f"button value of {len(value)} characters exceeds Slack's {BUTTON_VALUE_MAX}")
    return value


def _call_line(call: PendingCall) -> str:
    args = arguments_of(call)
    target = f" on {inline(args[0].text, 100)}" if args and args[0].target else ""
    return f"• {inline(call.name, 80)}{target}"


def _open_line(call: PendingCall) -> str:
    """A call's line on an open batch message: one Approve all leaves open says so."""
    line = _call_line(call)
    return f"{line} — {texts.BATCH_ALWAYS_ASKS}" if always_asks(call.why) else line


def _listed(lines: Sequence[str]) -> str:
    shown = "\n".join(lines[:BATCH_LISTED])
    if len(lines) > BATCH_LISTED:
        shown += f"\n… and {len(lines) - BATCH_LISTED} more (see their cards)"
    return shown


def batch_card(
    *, run_id: str, park_id: int, calls: Sequence[PendingCall], requester: str, expires_at: datetime
) -> Message:
    """The one message of a park of two or more calls: Approve all / Decline all beside the cards."""
    value = batch_value(run_id, park_id)
    head = texts.BATCH_HEAD.format(count=len(calls))
    body = _listed([_open_line(c) for c in calls])
    rules = texts.BATCH_RULES.format(requester=mention(requester), expires=slack_date(expires_at))
    actions = ActionsBlock(
        block_id="batch",
        elements=[
            ButtonElement(text="Approve all", action_id="approve_all", value=value, style="primary"),
            ButtonElement(text="Decline all", action_id="decline_all", value=value, style="danger"),
        ],
    ).to_dict()
    text = f"{len(calls)} calls wait for approval (asked for by {mention(requester)})"
    return Message(
        text=text, blocks=[section(head), section(cut(body, SECTION_MAX)), context(rules), actions]
    )


def _outcome_word(decision: Decision | None) -> str:
    if decision is None:
        return "not decided"
    who = decision.approvers or ((decision.by,) if decision.by else ())
    by = " by " + ", ".join(mention(w) for w in who[:5]) if who else ""
    if decision.verdict is Verdict.APPROVED:
        return f"✅ approved{by}"
    if decision.verdict is Verdict.EXPIRED:
        return "⌛ expired (not run)"
    return f"❌ declined{by}"


def batch_decided(*, calls: Sequence[PendingCall], decisions: Mapping[str, Decision | None]) -> Message:
    """The batch message once its park is decided: no buttons, each call's outcome and who decided."""
    counts: dict[str, int] = {}
    for call in calls:
        verdict = decisions.get(call.id)
        word = verdict.verdict.value if verdict is not None else "undecided"
        counts[word] = counts.get(word, 0) + 1
    summary = ", ".join(f"{n} {word}" for word, n in counts.items())
    lines = [f"{_call_line(c)}: {_outcome_word(decisions.get(c.id))}" for c in calls]
    head = texts.BATCH_DONE.format(count=len(calls), summary=summary)
    return Message(text=head, blocks=[section(head), section(cut(_listed(lines), SECTION_MAX))])


def batch_stopped(*, calls: Sequence[PendingCall], by: str | None, at: datetime) -> Message:
    """The batch message of a parked run that was stopped: no buttons, nothing was run."""
    outcome = texts.CARD_STOPPED.format(who=mention(by) if by else "someone", when=slack_date(at))
    body = _listed([_call_line(c) for c in calls])
    return Message(text=outcome, blocks=[section(outcome), section(cut(body, SECTION_MAX))])
