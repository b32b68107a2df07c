"""Approval cards and what follows them in the thread.

The card that asks a person to approve or decline one `ask`-tier call, the same card once decided
or once its run was stopped, the question at a limit (`on_limit = "ask"`) and its answer, a grant's
notice and its revocation, the one reminder that pings `escalate_to`, and the reminder before a
park expires (with Extend) and what it reads once extended. Each button's value
binds a click to the exact call its card shows (`button_value`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slack_sdk.models.blocks import ActionsBlock, ButtonElement

from harness.policy import always_asks, grant_directory, limit_asks, no_grant
from harness.state import ClickCheck, Decision, GrantUse, PendingCall, Verdict
from messages import texts
from messages.arguments import Arg, Shown, args_reviewable, arguments_of, pack, present
from messages.blocks import Message, context, fit, scaled, section, with_tail
from messages.limits import BUTTON_TEXT_MAX, BUTTON_VALUE_MAX, SECTION_MAX, TEXT_MAX
from messages.markdown import FENCE
from messages.reasons import plain_why
from messages.text import (
    ELLIPSIS,
    answer_mrkdwn,
    approver,
    cut,
    deciders_named,
    fence_safe,
    inert,
    inline,
    mention,
    mrkdwn_prefix_len,
    plural,
    slack_date,
    units,
    visible_as,
)

CARD_ARGS_BUDGET = 8000  # escaped characters of arguments on a card, before shrinking to fit
CARD_NAME_MAX = 150  # escaped characters of an argument's name on a card


def button_value(run_id: str, call: PendingCall) -> str:
    """`run:call:fingerprint`: a click binds to the exact call its card shows."""
    value = f"{run_id}:{call.id}:{call.fingerprint}"
    if len(value) > BUTTON_VALUE_MAX:
        raise ValueError(f"button value of {len(value)} characters exceeds Slack's {BUTTON_VALUE_MAX}")
    return value


def _what_will_run(
    call: PendingCall, args: Sequence[Arg], heading: str, requester: str, scale: float, hint: str
) -> tuple[list[dict[str, Any]], Shown]:
    """The tool, each argument on its own (cut to fit, saying so), and who the run is for."""
    shown = present(args, scaled(CARD_ARGS_BUDGET, scale, 0), name_max=CARD_NAME_MAX, hint=hint)
    what = "with these arguments:" if args else "with no arguments."
    blocks = [
        section(f"{heading} {inline(call.name, 120)} {what}"),
        *(section(s) for s in pack(shown.segments)),
        context(f"Asked for by {mention(requester)}"),
    ]
    return blocks, shown


def _target_text(args: Sequence[Arg]) -> str:
    """The " on TARGET" of the `text` fallback: what the call acts on (raw, escaped later)."""
    return f" on {args[0].text}" if args and args[0].target else ""


def _who_decides(requester: str, approvers: Sequence[str], handles: Mapping[str, str]) -> str:
    """Who may decide: the approvers, or the requester; a group by its handle, never pinged."""
    return f"only {deciders_named(list(approvers) or [requester], handles)}"


@dataclass(frozen=True)
class CallCard:
    """What an approval card is drawn from: the call and its run, who decides it under which rules
    (the approvals in force, and the votes so far), and what the park kept of its tool and reply.

    `title` and `annotations` are what an MCP server says of its tool: hints, shown as such.
    `handles`: the handles of the user groups among `approvers` (id -> handle, from Slack).
    `intent`: the model's own words in the reply that made the call. `preview`: what the call
    would change (a diff), as plain text. `required` > 1: a quorum, with `votes` so far. A call
    that always asks (`tier_source`) is offered no grant, and its card says so.
    """

    run_id: str
    call: PendingCall
    requester: str
    tier_source: str
    approvers: Sequence[str]
    expires_at: datetime
    title: str | None = None
    annotations: Mapping[str, Any] | None = None
    intent: str = ""
    preview: str | None = None
    required: int = 1
    votes: Sequence[str] = ()
    self_approval: bool = True
    grant_minutes: float = 0
    grant_uses: int = 0
    handles: Mapping[str, str] = field(default_factory=dict)
    approvers_from: str = ""  # "module:function" asked at each approval; then no grant is offered


def approval_card(card: CallCard) -> Message:
    """The card asking a human to approve or decline one `ask`-tier call (`CallCard`): what will
    run, the model's words and the change it would make, who decides under which rules, and the
    buttons; fitted to Slack's limits by shortening the arguments and words shown (`fit`)."""
    call, value = card.call, button_value(card.run_id, card.call)
    buttons = _decision_buttons(card, value)
    view_all = ButtonElement(text="View all arguments", action_id="view_args", value=value)
    args = arguments_of(call)
    reviewable = args_reviewable(args)
    details = section(_card_details(card))

    def build(scale: float) -> list[dict[str, Any]]:
        heading = ":raised_hand: *Approval needed:* the agent wants to run"
        blocks, shown = _what_will_run(
            call, args, heading, card.requester, scale, " (see View all arguments)"
        )
        preview_cut = bool(card.preview) and len(card.preview or "") > scaled(2400, scale, 100)
        more = [view_all] if shown.hidden or not reviewable or preview_cut else []
        actions = ActionsBlock(block_id="approval", elements=[*buttons, *more]).to_dict()
        said = _model_said(card.intent, scale)
        change = _change_shown(card.preview, scale)
        warning = _arguments_warning(args, shown, reviewable)
        return [*blocks, *said, *change, *warning, details, actions]

    text = with_tail(
        f"Approval needed: the agent wants to run {call.name}{_target_text(args)}",
        f"(asked for by {mention(card.requester)}; expires {slack_date(card.expires_at)})",
        " ",
    )
    return Message(text=text, blocks=fit(build))


def _card_details(card: CallCard) -> str:
    """Why the call asks, who may decide it under which rules, and when it expires."""
    rules = [texts.CARD_ALWAYS_ASKS] if always_asks(card.tier_source) else []
    if limit_asks(card.tier_source):
        rules.append(texts.CARD_LIMIT)
    if card.approvers_from:
        rules.append(texts.CARD_CHECKED.format(function=inert(card.approvers_from, 200)))
    if card.required > 1:
        votes = card.votes
        so_far = ", ".join(mention(v) for v in votes[:20]) if votes else "nobody yet"
        rules.append(
            f"*Approvals:* {len(votes)} of {card.required} needed (so far: {so_far}); one decline declines"
        )
    if not card.self_approval:
        rules.append(
            f"*Four eyes:* {mention(card.requester)} asked for this run and may decline it, not approve it"
        )
    return "\n".join(
        [
            *_tool_described(card.title, card.annotations),
            f"*Why it needs approval:* {plain_why(card.tier_source)}",
            f"*Who may decide:* {_who_decides(card.requester, card.approvers, card.handles)}",
            *rules,
            f"*Expires:* {slack_date(card.expires_at)} (the call will not run if nobody decides by then)",
        ]
    )


def _decision_buttons(card: CallCard, value: str) -> list[ButtonElement]:
    """Approve, Decline, Edit, Decline with reason; and the grants, where the approvals allow them
    (not with a quorum, never for a call that always asks)."""
    buttons = [
        ButtonElement(text="Approve", action_id="approve", value=value, style="primary"),
        ButtonElement(text="Decline", action_id="decline", value=value, style="danger"),
        ButtonElement(text="Edit…", action_id="edit", value=value),
        ButtonElement(text="Decline with reason…", action_id="decline_with_reason", value=value),
    ]
    if card.grant_minutes <= 0 or card.required > 1 or no_grant(card.tier_source) or card.approvers_from:
        return buttons
    uses = f", {plural(card.grant_uses, 'use')}" if card.grant_uses else ""
    lasting = _duration(card.grant_minutes) + uses
    thread = ButtonElement(
        text=f"Approve for this thread ({lasting})", action_id="approve_thread", value=value
    )
    buttons.append(thread)
    call = card.call
    directory = grant_directory(call.input, call.path_args)
    if directory is not None:
        text = cut(f"Approve {call.name} under {directory} ({lasting})", BUTTON_TEXT_MAX)
        buttons.append(ButtonElement(text=text, action_id="approve_dir", value=value))
    return buttons


def _model_said(intent: str, scale: float) -> list[dict[str, Any]]:
    """The model's own words in the reply that made the call, quoted (shortened to fit)."""
    if not intent.strip():
        return []
    words, room = answer_mrkdwn(intent), scaled(1200, scale, 80)
    if units(words) > room:
        words = words[: mrkdwn_prefix_len(words, room - len(ELLIPSIS))] + ELLIPSIS
    return [section(f"*What the model said with it:*\n>{words.replace(chr(10), chr(10) + '>')}")]


def _change_shown(preview: str | None, scale: float) -> list[dict[str, Any]]:
    """What the call would change, as its tool previews it (shortened to fit)."""
    if not preview:
        return []
    limit = scaled(2400, scale, 100)
    body = cut(preview, limit)
    whole = "" if len(preview) <= limit else "\n_The whole change: *View all arguments*._"
    return [section(f"*What it would change:*\n{FENCE}\n{fence_safe(visible_as(body))}\n{FENCE}{whole}")]


def _arguments_warning(args: Sequence[Any], shown: Shown, reviewable: bool) -> list[dict[str, Any]]:
    """Said when the card cannot show every argument: approvable only once they were all seen."""
    if not reviewable:
        total = sum(a.size for a in args)
        return [
            section(
                f"⛔ *These arguments are too large to review in Slack* ({plural(total, 'character')}): "
                "not even *View all arguments* can show them all, so this call cannot be approved "
                "here. Decline it, and ask for something smaller."
            )
        ]
    if shown.hidden:
        return [
            section(
                f"⚠️ *Not everything fits on this card:* {plural(shown.hidden, 'character')} of the "
                "arguments are not shown. Press *View all arguments* to read every one in full "
                "before you decide."
            )
        ]
    return []


_HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


def _tool_described(title: str | None, annotations: Mapping[str, Any] | None) -> list[str]:
    """The tool's title and annotations as its server gives them (hints, not guarantees)."""
    lines = []
    if title:
        lines.append(f"*Tool:* {inline(title, 200)}")
    hints = [f"{k}: {str(annotations[k]).lower()}" for k in _HINTS if annotations and k in annotations]
    if hints:
        lines.append(f"*The server says of it:* {inline(', '.join(hints), 300)}")
    return lines


def _duration(minutes: float) -> str:
    if minutes >= 120 and minutes % 60 == 0:
        return f"{int(minutes // 60)} h"
    return f"{minutes:g} min"


def decided_card(
    *,
    call: PendingCall,
    requester: str,
    verdict: Verdict,
    by: str | None,
    at: datetime,
    reason: str | None = None,
    edited_input: Mapping[str, Any] | None = None,
    approvers: Sequence[str] = (),
    grant: GrantUse | None = None,
    grant_until: datetime | None = None,
    grant_dir: str | None = None,
    check: ClickCheck | None = None,
) -> Message:
    """The approval card once decided: no buttons left, the outcome and who decided shown (and what
    the `approvers_from` callable answered for the approver)."""
    when = slack_date(at)
    who = f" by {mention(by)}" if by else ""
    if len(approvers) > 1:
        who = " by " + ", ".join(mention(a) for a in approvers[:20])
    args = arguments_of(call)

    def outcome(scale: float) -> str:
        if verdict is Verdict.APPROVED and edited_input is not None:
            changes = _changes(call.input if isinstance(call.input, dict) else {}, edited_input)
            return f"✏️ Approved with edits{who} at {when}\n{cut(changes, scaled(2400, scale, 100))}"
        where = f" under {inline(grant_dir, 200)}" if grant_dir else ""
        if verdict is Verdict.APPROVED and grant is GrantUse.USED:
            return f"✅ Run under a grant for this thread{where}{who} at {when}"
        if verdict is Verdict.APPROVED and grant is GrantUse.GIVEN:
            until = f" until {slack_date(grant_until)}" if grant_until else ""
            return f"✅ Approved{who} at {when}, with later calls of this tool{where} in this thread{until}"
        if verdict is Verdict.APPROVED:
            return f"✅ Approved{who} at {when}"
        if verdict is Verdict.EXPIRED:
            return f"⌛ Expired at {when} — nobody decided in time; the call was not run"
        said = f" — reason: {inert(reason, scaled(2000, scale, 100))}" if reason else ""
        return f"❌ Declined{who} at {when}{said}"

    def build(scale: float) -> list[dict[str, Any]]:
        blocks, shown = _what_will_run(call, args, "The agent asked to run", requester, scale, "")
        if shown.hidden:
            blocks.append(context(f"_{plural(shown.hidden, 'character')} of the arguments not shown here._"))
        return [*blocks, section(outcome(scale)), *_checked(check, by, scale)]

    text = with_tail(f"{call.name}{_target_text(args)}", outcome(0.5), ": ")
    return Message(text=text, blocks=fit(build))


def card_of_decision(
    *,
    call: PendingCall,
    decision: Decision,
    requester: str,
    at: datetime,
    grant_until: datetime | None = None,
) -> Message:
    """`decided_card` of `call` as `decision` decided it (verdict, who, reason, edits, grant)."""
    return decided_card(
        call=call,
        requester=requester,
        verdict=decision.verdict,
        by=decision.by,
        at=at,
        reason=decision.reason,
        edited_input=decision.edited_input,
        approvers=decision.approvers,
        grant=decision.grant,
        grant_until=grant_until,
        grant_dir=decision.grant_dir,
        check=decision.check,
    )


def _checked(check: ClickCheck | None, by: str | None, scale: float) -> list[dict[str, Any]]:
    """What the `approvers_from` callable answered for the approver who decided: its reason escaped."""
    if check is None:
        return []
    reason = inert(check.reason, scaled(600, scale, 60)) if check.reason else texts.CHECK_NO_REASON
    function, who = inert(check.ref, 200), mention(by) if by else "the approver"
    return [
        context(texts.DECIDED_CHECKED.format(function=function, answer=check.answer, who=who, reason=reason))
    ]


def _changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """What a reviewer changed, argument by argument: `name: old → new`, escaped."""
    lines = []
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            old = json.dumps(before.get(name), ensure_ascii=False) if name in before else "(absent)"
            new = json.dumps(after.get(name), ensure_ascii=False) if name in after else "(absent)"
            lines.append(f"• {inline(name, 80)}: {inline(old, 400)} → {inline(new, 400)}")
    return "\n".join(lines) or "(no argument changed)"


def card_stopped(*, call: PendingCall, requester: str, by: str | None, at: datetime) -> Message:
    """An approval card of a parked run that was stopped: no buttons, the call was not run."""
    outcome = texts.CARD_STOPPED.format(who=mention(by) if by else "someone", when=slack_date(at))
    return _closed(call, requester, outcome)


def card_changed(*, call: PendingCall, requester: str, by: str | None, at: datetime) -> Message:
    """An approval card whose change was no longer what the call would do when it was approved (a
    file changed after the card was posted): no buttons; a new card asks again."""
    outcome = texts.CARD_CHANGED.format(who=mention(by) if by else "someone", when=slack_date(at))
    return _closed(call, requester, outcome)


def _closed(call: PendingCall, requester: str, outcome: str) -> Message:
    args = arguments_of(call)

    def build(scale: float) -> list[dict[str, Any]]:
        blocks, _ = _what_will_run(call, args, "The agent asked to run", requester, scale, "")
        return [*blocks, section(outcome)]

    return Message(text=with_tail(f"{call.name}{_target_text(args)}", outcome, ": "), blocks=fit(build))


@dataclass(frozen=True)
class LimitCard:
    """What the card of a run waiting at a limit (`on_limit = "ask"`) is drawn from.

    Continue is an approval like any other: `required` > 1 needs that many people (`votes` so far,
    shown), and without `self_approval` the requester may Stop, never Continue. A user group among
    `deciders` is shown by its handle in `handles` (id -> handle), never pinged.
    """

    run_id: str
    question: str
    more: str
    requester: str
    deciders: Sequence[str]
    expires_at: datetime
    required: int = 1
    votes: Sequence[str] = ()
    self_approval: bool = True
    handles: Mapping[str, str] = field(default_factory=dict)


def limit_card(card: LimitCard) -> Message:
    """A run waiting at a limit: Continue (one more allowance) or Stop (`LimitCard`)."""
    run_id, question, more, requester = card.run_id, card.question, card.more, card.requester
    deciders, required, votes = card.deciders, card.required, card.votes
    value = f"{run_id}:limit"
    if len(value) > BUTTON_VALUE_MAX:
        raise ValueError(f"button value of {len(value)} characters exceeds Slack's {BUTTON_VALUE_MAX}")
    who = deciders_named(deciders, card.handles) or mention(requester)  # a group is named, never pinged
    head = f":raised_hand: {inert(question, SECTION_MAX - 20)}"
    choice = texts.LIMIT_CHOICE.format(more=inert(more, 200))
    rules = texts.LIMIT_RULES.format(
        requester=mention(requester), who=who, expires=slack_date(card.expires_at)
    )
    if required > 1:
        so_far = ", ".join(mention(v) for v in votes[:20]) if votes else "nobody yet"
        rules += "\n" + texts.LIMIT_VOTES.format(count=len(votes), required=required, so_far=so_far)
    if not card.self_approval:
        rules += "\n" + texts.LIMIT_FOUR_EYES.format(requester=mention(requester))
    actions = ActionsBlock(
        block_id="limit",
        elements=[
            ButtonElement(text="Continue", action_id="continue", value=value, style="primary"),
            ButtonElement(text="Stop", action_id="stop", value=value, style="danger"),
        ],
    ).to_dict()
    return Message(
        text=inert(question, TEXT_MAX), blocks=[section(head), section(choice), context(rules), actions]
    )


def limit_decided(
    *,
    question: str,
    verdict: Verdict,
    by: str | None,
    at: datetime,
    more: str,
    approvers: Sequence[str] = (),
) -> Message:
    """The limit card once answered: no buttons, what was chosen, by whom (everyone who chose
    Continue, under a quorum) and when."""
    when = slack_date(at)
    if verdict is Verdict.APPROVED:
        who = ", ".join(mention(a) for a in approvers[:20]) if approvers else mention(by)
        outcome = texts.LIMIT_CONTINUED.format(who=who, when=when, more=inert(more, 200))
    elif verdict is Verdict.EXPIRED:
        outcome = texts.LIMIT_EXPIRED.format(when=when)
    else:
        outcome = texts.LIMIT_STOPPED.format(who=mention(by) if by else "someone", when=when)
    head = f":raised_hand: {inert(question, SECTION_MAX - 20)}"
    return Message(text=with_tail(question, outcome, " — "), blocks=[section(head), section(outcome)])


def grant_notice(
    *, tool: str, by: str, requester: str, until: datetime, value: str, directory: str = "", uses: int = 0
) -> Message:
    """The thread's note of a grant (its scope and uses, if limited), with the button that revokes it."""
    where = f" under {inline(directory, 200)}" if directory else ""
    limited = f" (at most {plural(uses, 'call')})" if uses else ""
    text = (
        f"🔓 {mention(by)} approved {inline(tool, 120)}{where} for this thread until {slack_date(until)}"
        f"{limited}: later calls of it{where} in runs {mention(requester)} asks for here run without a card."
    )
    actions = ActionsBlock(
        block_id="grant",
        elements=[ButtonElement(text="Revoke", action_id="revoke_grant", value=value, style="danger")],
    ).to_dict()
    return Message(text=text, blocks=[section(text), actions])


def grant_revoked(*, tool: str, by: str, at: datetime, directory: str = "") -> Message:
    """The grant's notice once revoked: who revoked it and when, no button left."""
    when = slack_date(at)
    where = f" under {inline(directory, 200)}" if directory else ""
    text = (
        f"🔒 The grant of {inline(tool, 120)}{where} in this thread was revoked by {mention(by)} at {when}."
    )
    return Message(text=text, blocks=[section(text)])


def escalation_reminder(
    *, calls: Sequence[PendingCall], requester: str, escalate_to: Sequence[str], expires_at: datetime
) -> Message:
    """The one reminder of a park nobody decided in time: it mentions `escalate_to`, on purpose."""
    names = ", ".join(inline(c.name, 120) for c in calls[:10]) or "a call"
    if len(calls) > 10:
        names += f" and {len(calls) - 10} more"
    who = ", ".join(approver(w) for w in escalate_to[:20])
    text = texts.ESCALATION.format(
        who=who, calls=names, requester=mention(requester), expires=slack_date(expires_at)
    )
    return Message(text=text, blocks=[section(text)])


def expiry_reminder(
    *,
    run_id: str,
    park_id: int,
    calls: Sequence[PendingCall],
    requester: str,
    deciders: Sequence[str],
    expires_at: datetime,
    extend_minutes: float,
    extensions: int,
    max_extensions: int,
) -> Message:
    """The reminder before a park expires: it mentions who may decide, with an Extend button whose
    value binds the click to the extension count it was posted at (a double click extends once)."""
    names = ", ".join(inline(c.name, 120) for c in calls[:10]) or "a call"
    if len(calls) > 10:
        names += f" and {len(calls) - 10} more"
    who = ", ".join(approver(w) for w in deciders[:20])
    left = max(0, max_extensions - extensions)
    text = texts.EXPIRY_REMINDER.format(
        who=who, calls=names, requester=mention(requester), expires=slack_date(expires_at)
    )
    rule = texts.EXTEND_RULE.format(duration=_duration(extend_minutes), left=plural(left, "more time"))
    actions = ActionsBlock(
        block_id="reminder",
        elements=[ButtonElement(text="Extend", action_id="extend", value=f"{run_id}:{park_id}:{extensions}")],
    ).to_dict()
    return Message(text=text, blocks=[section(text), context(rule), actions])


def reminder_extended(*, by: str, expires_at: datetime) -> Message:
    """The reminder once Extend moved the expiry: who extended it, until when; no button left."""
    text = texts.EXTENDED.format(who=mention(by), expires=slack_date(expires_at))
    return Message(text=text, blocks=[section(text)])
