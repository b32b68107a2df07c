"""A run's progress in its thread: the Working message with its Stop button, and one summary per turn.

A turn summary shows each call with its arguments and what became of it (run, declined, expired,
denied), cut to fit, and the tokens used so far; a result too long for the message comes whole in
a file posted with it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from slack_sdk.models.blocks import ActionsBlock, ButtonElement, ConfirmObject

from harness.outcomes import NotRun
from harness.policy import Tier
from harness.state import Decision, GrantUse, PendingCall, Verdict
from harness.texts import WHY_UNKNOWN_TOOL
from messages import texts
from messages.arguments import args_json
from messages.blocks import Attachment, Message, blocks_size, context, section, with_tail
from messages.limits import BLOCKS_JSON_MAX, BUTTON_VALUE_MAX, SECTION_MAX
from messages.markdown import FENCE, FENCE_SAFE
from messages.reasons import denied_what, stopped_before, tier_reason
from messages.text import answer_mrkdwn, inline, mention, mrkdwn_prefix_len, plural, quoted, units, visible

ARG_LIMIT = 300  # per call in a turn summary
SAID_MAX = 1500  # characters of the model's words before its calls, in a turn summary
RESULT_FILE_MIN = 2000  # a tool result longer than this also comes whole, in a file with its turn
RESULT_LIMIT = 300


def _outcome(call: PendingCall, limit: int) -> str:
    """What became of one call, for its line in the turn summary."""
    decision = call.decision
    if call.tier is Tier.DENY:
        if call.result is not None and WHY_UNKNOWN_TOOL in call.why:  # not offered: say why
            return f"⛔ {quoted(call.result.text, limit)} (not run)"
        return texts.DENIED.format(what=denied_what(call, lambda t: inline(t, limit)))
    if decision is not None and decision.verdict is Verdict.EXPIRED:
        return "⌛ expired: nobody decided in time (not run)"
    if decision is not None and decision.verdict is Verdict.DECLINED:
        said = f": {quoted(decision.reason, limit)}" if decision.reason else ""
        return f"❌ declined by {mention(decision.by)}{said} (not run)"
    result = call.result
    if result is None:
        return "_not run_"
    if stopped_before(result.text):
        return texts.NOT_RUN_STOPPED
    shown = quoted(result.text, limit) if result.text.strip() else "_(empty)_"
    if result.is_error:
        shown = f"✗ {shown}"
    if decision is not None and decision.verdict is Verdict.APPROVED and decision.grant is GrantUse.USED:
        shown += f" ({_grant_used(call.name, decision)})"
    elif decision is not None and decision.verdict is Verdict.APPROVED and decision.edited_input is not None:
        shown += f" (approved with edits by {mention(decision.by)})"
    elif decision is not None and decision.verdict is Verdict.APPROVED:
        shown += f" (approved by {mention(decision.by)})"
    return shown


def _grant_used(tool: str, decision: Decision) -> str:
    """ "ran under @ann's grant for write_file under docs/ (2 of 5 uses left)"."""
    scope = (
        f"{inline(tool, 80)} under {inline(decision.grant_dir, 200)}" if decision.grant_dir else "this thread"
    )
    left = ""
    if decision.grant_uses and decision.grant_left is not None:
        left = f" ({decision.grant_left} of {plural(decision.grant_uses, 'use')} left)"
    return f"ran under {mention(decision.by)}'s grant for {scope}{left}"


def _call_line(call: PendingCall, limit: int) -> str:
    name = inline(call.name, 80)
    why = f" _({tier_reason(call)})_" if call.why else ""
    return f"• {name} {inline(args_json(call), limit)} → {_outcome(call, limit)}{why}"


def _pack_sections(lines: Sequence[str]) -> list[dict[str, Any]]:
    """Lines joined into as few sections as fit SECTION_MAX each (no line is split)."""
    sections: list[str] = []
    current = ""
    for line in lines:
        line = line[:SECTION_MAX]
        if current and len(current) + 1 + len(line) > SECTION_MAX:
            sections.append(current)
            current = line
        else:
            current = f"{current}\n{line}" if current else line
    if current:
        sections.append(current)
    return [section(s) for s in sections]


def not_run_words(not_run: NotRun) -> str:
    """`2 calls declined, 1 call denied by the policy`."""
    parts = [
        template.format(calls=plural(count, "call"))
        for template, count in (
            (texts.NOT_RUN_DECLINED, not_run.declined),
            (texts.NOT_RUN_EXPIRED, not_run.expired),
            (texts.NOT_RUN_DENIED, not_run.denied),
        )
        if count
    ]
    return ", ".join(parts)


def turn_summary(
    turn: int, calls: Sequence[PendingCall], tokens: int, budget: int, *, said: str = ""
) -> Message:
    """One message per turn: each call with its arguments and outcome, and the tokens used so far.

    `said`: what the model wrote before its calls, shown first (the turn's live message showed it
    as it was written; the summary it settles into keeps it).
    """
    usage = f"{tokens:,} / {budget:,} tokens used"
    words = answer_mrkdwn(said)
    if units(words) > SAID_MAX:
        words = words[: mrkdwn_prefix_len(words, SAID_MAX - 1)] + "…"
    said_blocks = [section(words)] if words else []
    limit = max(60, min(ARG_LIMIT, 6000 // max(len(calls), 1)))
    lines = [_call_line(call, limit) for call in calls]
    head = f"*Turn {turn}*" + ("" if calls else " (no tool calls)")

    def build(shown: int) -> list[dict[str, Any]]:
        rest = len(lines) - shown
        tail = [f"…and {rest} more call{'s' if rest != 1 else ''}"] if rest else []
        return [*said_blocks, *_pack_sections([head, *lines[:shown], *tail]), context(usage)]

    def fits(blocks: list[dict[str, Any]]) -> bool:
        return len(blocks) <= 50 and blocks_size(blocks) <= BLOCKS_JSON_MAX

    lo, hi = 0, len(lines)  # the largest number of lines shown in full that still fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(build(mid)):
            lo = mid
        else:
            hi = mid - 1
    blocks = build(lo)
    long = [c for c in calls if c.result is not None and len(c.result.text) > RESULT_FILE_MIN]
    if long:  # the note goes above the token count, when it fits
        noted = [*blocks[:-1], context(texts.RESULTS_IN_FILE), blocks[-1]]
        blocks = noted if fits(noted) else blocks
    names = ", ".join(call.name for call in calls) or "no tool calls"
    text = with_tail(f"Turn {turn}: {names}", usage, " — ")
    whole = (
        Attachment(f"turn-{turn}.md", texts.RESULTS_FILE_TITLE.format(turn=turn), _turn_file(calls))
        if long
        else None
    )
    return Message(text=text, blocks=blocks, attachment=whole)


def _turn_file(calls: Sequence[PendingCall]) -> str:
    """Every call of a turn with its arguments and result in full, as a Markdown file (a file is
    not mrkdwn: nothing in it can ping, so it is not escaped; hidden characters are shown)."""
    parts = []
    for call in calls:
        arguments = json.dumps(call.input, ensure_ascii=False, indent=2, default=str).replace(
            FENCE, FENCE_SAFE
        )
        result = visible(call.result.text if call.result is not None else "(not run)").replace(
            FENCE, FENCE_SAFE
        )
        error = " (error)" if call.result is not None and call.result.is_error else ""
        parts.append(
            f"## {call.name}\n\nArguments:\n\n{FENCE}json\n{arguments}\n{FENCE}\n\n"
            f"Result{error}:\n\n{FENCE}\n{result}\n{FENCE}\n"
        )
    return "\n".join(parts)


def working(*, run_id: str) -> Message:
    """The run's "Working on it…" message: its Stop button (value: the run id) while it works or waits.

    Posted first, before the run's first model request, so the thread has a Stop from the start.
    Its actions block is `working`, apart from the cards' `approval` blocks.
    """
    if len(run_id) > BUTTON_VALUE_MAX:
        raise ValueError(f"run id of {len(run_id)} characters does not fit a button value")
    stop = ButtonElement(
        text="Stop",
        action_id="stop",
        value=run_id,
        style="danger",
        confirm=ConfirmObject(
            title="Stop this run?",
            text="It ends before its next model request; a tool already running finishes first.",
            confirm="Stop it",
            deny="Keep going",
        ),
    )
    text = texts.WORKING
    actions = ActionsBlock(block_id="working", elements=[stop]).to_dict()
    return Message(text=text, blocks=[section(text), actions, context(texts.WORKING_WHO)])


def working_closed(*, outcome: str, by: str | None = None, not_run: NotRun | None = None) -> Message:
    """The "Working on it…" message once the run stopped working: no button, how it ended.

    `outcome`: "finished", "stopped" or "failed"; `by`: who pressed Stop, if anyone did (a run can
    still finish when the request in flight was its last). `not_run`: the calls of a finished run
    that did not run; any, and it says how many and why instead of "Done".
    """
    if outcome == "finished" and not_run is not None and not_run.total:
        what = not_run_words(not_run)
        if by:
            text = texts.WORKING_FINISHED_NOT_RUN_BEFORE_STOP.format(who=mention(by), what=what)
        else:
            text = texts.WORKING_FINISHED_NOT_RUN.format(what=what)
    elif outcome == "finished":
        text = texts.WORKING_DONE_BEFORE_STOP.format(who=mention(by)) if by else texts.WORKING_DONE
    elif outcome == "failed":
        text = texts.WORKING_FAILED
    elif by:
        text = texts.WORKING_STOPPED_BY.format(who=mention(by))
    else:
        text = texts.WORKING_STOPPED
    return Message(text=text, blocks=[section(text)])
