"""Every message the bot posts, as Block Kit: pure functions, no I/O.

Text that came from the model or a tool (answers, arguments, results, errors, decline reasons)
is untrusted: it goes through `escape` before it lands in `text` or in any block, so it can
never ping (`<!channel>`, `<@U…>`, `<!subteam^…>`) or smuggle a labelled link. Only ids we
hold ourselves (`^[UW][A-Z0-9]+$`) are rendered as real mentions, and only dates we format
ourselves use `<!date^…>`.

Every builder keeps within Slack's limits: 50 blocks, section text 3000 characters, button
text 75 and value 2000, context element text 2000, and a whole `blocks` payload well under the
~12k characters at which Slack answers `msg_blocks_too_long`. The `text` fallback stays
within 3000 characters.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from slack_sdk.models.blocks import (
    ActionsBlock,
    ButtonElement,
    ContextBlock,
    InputBlock,
    MarkdownTextObject,
    PlainTextInputElement,
    PlainTextObject,
    SectionBlock,
)
from slack_sdk.models.views import View

from harness.policy import Tier
from harness.state import PendingCall, Verdict
from harness.texts import FOOTER

SECTION_MAX = 3000
CONTEXT_TEXT_MAX = 2000
BUTTON_VALUE_MAX = 2000
TEXT_MAX = 3000  # our own cap on the `text` fallback (Slack allows 40000)
BLOCKS_JSON_MAX = 11500  # Slack refuses blocks of ~13k characters; stay clear of 12k
PRIVATE_METADATA_MAX = 3000

ARG_LIMIT = 300  # per call in a turn summary
RESULT_LIMIT = 300
ANSWER_LIMIT = 10500  # total escaped characters of a final answer across its sections

ELLIPSIS = "…"
FENCE = "```"
FENCE_SAFE = "ˋˋˋ"  # modifier-letter grave accents: look like a fence, do not close one

_USER_ID = re.compile(r"[UW][A-Z0-9]{1,30}")
_ESCAPED_WEIGHT = {"&": 5, "<": 4, ">": 4}  # len("&amp;"), len("&lt;"), len("&gt;")


@dataclass(frozen=True)
class Message:
    """One Slack message: the notification/fallback `text` and its Block Kit `blocks`."""

    text: str
    blocks: list[dict[str, Any]]


# --- text primitives ------------------------------------------------------------------------------


def escape(text: str) -> str:
    """Slack mrkdwn escaping: `&`, `<`, `>` become entities, so no mention or link survives."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _units(text: str) -> int:
    """Length in UTF-16 code units: an emoji counts twice, in case Slack counts that way."""
    return len(text.encode("utf-16-le")) // 2


def _escaped_len(text: str) -> int:
    return _units(text) + 4 * text.count("&") + 3 * (text.count("<") + text.count(">"))


def _take(text: str, room: int) -> int:
    """How many leading characters of `text` fit in `room` characters once escaped."""
    used = 0
    for n, ch in enumerate(text):
        used += _ESCAPED_WEIGHT.get(ch, 1) if ch < "\U00010000" else 2
        if used > room:
            return n
    return len(text)


def cut(text: str, limit: int) -> str:
    """`text` shortened with a trailing "…" so that even `escape(result)` fits in `limit` characters.

    Characters outside the BMP (most emoji) count as two, as they do in UTF-16.
    Cut the raw text, then escape it: cutting escaped text could split an entity such as `&amp;`.
    """
    if _escaped_len(text) <= limit:
        return text
    if limit <= 0:
        return ""
    return text[: _take(text, limit - len(ELLIPSIS))] + ELLIPSIS


def _esc(text: str, limit: int) -> str:
    """Untrusted text, cut and escaped: the result is at most `limit` characters."""
    return escape(cut(text, limit))


def code(text: str, limit: int) -> str:
    """Escaped `text` in a ``` block of at most `limit` characters; a ``` inside cannot close it."""
    body = text.replace(FENCE, FENCE_SAFE)
    inner = _esc(body, max(limit - 8, 1)) or " "  # "```\n" + inner + "\n```"
    return f"{FENCE}\n{inner}\n{FENCE}"


def _inline(text: str, limit: int) -> str:
    """Untrusted text on one line in `inline code`, at most `limit` characters."""
    flat = " ".join(text.split()).replace("`", "ˋ") or " "
    return f"`{_esc(flat, limit - 2)}`"


def _quoted(text: str, limit: int) -> str:
    """Untrusted text on one line in double quotes, at most `limit` characters."""
    flat = " ".join(text.split())
    return f'"{_esc(flat, limit - 2)}"'


def mention(user_id: str | None) -> str:
    """`<@U…>` for an id of ours that looks like one; anything else is shown inert."""
    if user_id and _USER_ID.fullmatch(user_id):
        return f"<@{user_id}>"
    return _esc(user_id or "someone", 40)


def slack_date(at: datetime) -> str:
    """A date Slack shows in the reader's time zone, with a UTC fallback (naive means UTC)."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    fallback = at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{int(at.timestamp())}^{{date_short_pretty}} at {{time}}|{fallback}>"


def _footer(turns: int, requests: int) -> str:
    return FOOTER.format(turns=turns, requests=requests)


def _with_tail(body: str, tail: str, sep: str = "\n\n") -> str:
    """Escaped untrusted `body` then trusted `tail`, within TEXT_MAX, always ending with `tail`."""
    room = TEXT_MAX - len(tail) - len(sep)
    head = _esc(body, room).strip()
    return f"{head}{sep}{tail}" if head else tail


# --- blocks ---------------------------------------------------------------------------------------


def _section(mrkdwn: str) -> dict[str, Any]:
    return SectionBlock(text=MarkdownTextObject(text=mrkdwn or " ")).to_dict()


def _context(*mrkdwn: str) -> dict[str, Any]:
    return ContextBlock(elements=[MarkdownTextObject(text=t or " ") for t in mrkdwn]).to_dict()


def blocks_size(blocks: list[dict[str, Any]]) -> int:
    """Size of the blocks as JSON (UTF-16 units): what Slack's `msg_blocks_too_long` limit counts."""
    return _units(json.dumps(blocks, ensure_ascii=False))


def _fit(build: Callable[[float], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """`build(scale)` at the largest scale (1, shrinking) whose blocks fit BLOCKS_JSON_MAX.

    JSON escaping (quotes, backslashes, newlines) can make text longer than its characters,
    so the byte budget is checked on the real JSON and the untrusted parts shrunk to fit.
    """
    scale = 1.0
    for _ in range(12):
        blocks = build(scale)
        size = blocks_size(blocks)
        if size <= BLOCKS_JSON_MAX:
            return blocks
        scale *= BLOCKS_JSON_MAX / size * 0.9
    return build(0.0)


def _n(limit: int, scale: float, floor: int = 20) -> int:
    return max(floor, int(limit * scale))


# --- turn summary ---------------------------------------------------------------------------------


def _args_json(call: PendingCall, *, indent: int | None = None) -> str:
    return json.dumps(call.input, ensure_ascii=False, indent=indent, default=str)


def _outcome(call: PendingCall, limit: int) -> str:
    """What became of one call, for its line in the turn summary."""
    decision = call.decision
    if call.tier is Tier.DENY:
        return "⛔ denied by policy (not run)"
    if decision is not None and decision.verdict is Verdict.EXPIRED:
        return "⌛ expired: nobody decided in time (not run)"
    if decision is not None and decision.verdict is Verdict.DECLINED:
        said = f": {_quoted(decision.reason, limit)}" if decision.reason else ""
        return f"❌ declined by {mention(decision.by)}{said} (not run)"
    result = call.result
    if result is None:
        return "_not run_"
    shown = _quoted(result.content, limit) if result.content.strip() else "_(empty)_"
    if result.is_error:
        shown = f"✗ {shown}"
    if decision is not None and decision.verdict is Verdict.APPROVED:
        shown += f" (approved by {mention(decision.by)})"
    return shown


def _call_line(call: PendingCall, limit: int) -> str:
    name = _inline(call.name, 80)
    return f"• {name} {_inline(_args_json(call), limit)} → {_outcome(call, limit)}"


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
    return [_section(s) for s in sections]


def turn_summary(turn: int, calls: Sequence[PendingCall], tokens: int, budget: int) -> Message:
    """One message per turn: each call with its arguments and outcome, and the tokens used so far."""
    usage = f"{tokens:,} / {budget:,} tokens used"
    limit = max(60, min(ARG_LIMIT, 6000 // max(len(calls), 1)))
    lines = [_call_line(call, limit) for call in calls]
    head = f"*Turn {turn}*" + ("" if calls else " (no tool calls)")

    def build(shown: int) -> list[dict[str, Any]]:
        rest = len(lines) - shown
        tail = [f"…and {rest} more call{'s' if rest != 1 else ''}"] if rest else []
        return [*_pack_sections([head, *lines[:shown], *tail]), _context(usage)]

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
    names = ", ".join(call.name for call in calls) or "no tool calls"
    text = _with_tail(f"Turn {turn}: {names}", usage, " — ")
    return Message(text=text, blocks=blocks)


# --- approvals ------------------------------------------------------------------------------------


def _button_value(run_id: str, call: PendingCall) -> str:
    value = f"{run_id}:{call.id}"
    if len(value) > BUTTON_VALUE_MAX:
        raise ValueError(f"button value of {len(value)} characters exceeds Slack's {BUTTON_VALUE_MAX}")
    return value


def _what_will_run(call: PendingCall, heading: str, requester: str, scale: float) -> list[dict[str, Any]]:
    """The tool and its arguments (pretty JSON, cut to fit), and who the run is for."""
    args = code(_args_json(call, indent=2), _n(SECTION_MAX - 100, scale, 200))
    return [
        _section(f"{heading} {_inline(call.name, 120)} with these arguments:"),
        _section(args),
        _context(f"Asked for by {mention(requester)}"),
    ]


def _who_decides(requester: str, approvers: Sequence[str]) -> str:
    people = [mention(a) for a in approvers] or [mention(requester)]
    shown = ", ".join(people[:20])
    if len(people) > 20:
        shown += f" and {len(people) - 20} more"
    return f"only {shown}"


def approval_card(
    *,
    run_id: str,
    call: PendingCall,
    requester: str,
    tier_source: str,
    approvers: Sequence[str],
    expires_at: datetime,
) -> Message:
    """The card asking a human to approve or decline one `ask`-tier call."""
    value = _button_value(run_id, call)
    expires = slack_date(expires_at)
    details = "\n".join(
        [
            f"*Why it needs approval:* {_inline(tier_source, 400)}",
            f"*Who may decide:* {_who_decides(requester, approvers)}",
            f"*Expires:* {expires} (the call will not run if nobody decides by then)",
        ]
    )
    actions = ActionsBlock(
        block_id="approval",
        elements=[
            ButtonElement(text="Approve", action_id="approve", value=value, style="primary"),
            ButtonElement(text="Decline", action_id="decline", value=value, style="danger"),
            ButtonElement(text="Decline with reason…", action_id="decline_with_reason", value=value),
        ],
    ).to_dict()

    def build(scale: float) -> list[dict[str, Any]]:
        heading = ":raised_hand: *Approval needed:* the agent wants to run"
        return [*_what_will_run(call, heading, requester, scale), _section(details), actions]

    text = _with_tail(
        f"Approval needed: the agent wants to run {call.name}",
        f"(asked for by {mention(requester)}; expires {expires})",
        " ",
    )
    return Message(text=text, blocks=_fit(build))


def decided_card(
    *,
    call: PendingCall,
    requester: str,
    verdict: Verdict,
    by: str | None,
    at: datetime,
    reason: str | None = None,
) -> Message:
    """The approval card once decided: no buttons left, the outcome and who decided shown."""
    when = slack_date(at)
    who = f" by {mention(by)}" if by else ""

    def outcome(scale: float) -> str:
        if verdict is Verdict.APPROVED:
            return f"✅ Approved{who} at {when}"
        if verdict is Verdict.EXPIRED:
            return f"⌛ Expired at {when} — nobody decided in time; the call was not run"
        said = f" — reason: {_esc(reason, _n(2000, scale, 100))}" if reason else ""
        return f"❌ Declined{who} at {when}{said}"

    def build(scale: float) -> list[dict[str, Any]]:
        return [*_what_will_run(call, "The agent asked to run", requester, scale), _section(outcome(scale))]

    text = _with_tail(call.name, outcome(0.5), ": ")
    return Message(text=text, blocks=_fit(build))


# --- endings --------------------------------------------------------------------------------------


def _split_answer(answer: str, total: int) -> list[str]:
    """Escaped `answer` cut to `total` and split into section texts of <= SECTION_MAX characters.

    Splits prefer line breaks, never fall inside an escaped entity, and a ``` block that spans a
    split is closed at the end of one section and reopened at the start of the next.
    """
    rest = cut(answer.strip(), total)
    chunks: list[str] = []
    in_fence = False
    while rest:
        prefix = f"{FENCE}\n" if in_fence else ""
        room = SECTION_MAX - len(prefix) - len(FENCE) - 1
        n = _take(rest, room)
        if n < len(rest):
            newline = rest.rfind("\n", 0, n)
            if newline > n // 2:
                n = newline
            back = 0
            while back < 2 and n > 1 and rest[n - 1] == "`":  # never split a fence in two
                n, back = n - 1, back + 1
        piece, rest = rest[:n], rest[n:].lstrip("\n")
        if in_fence:
            piece = piece.lstrip("\n")
        if not piece.strip() and not in_fence:
            continue
        in_fence = (piece.count(FENCE) % 2 == 1) != in_fence
        chunk = prefix + escape(piece) + (f"\n{FENCE}" if in_fence else "")
        chunks.append(chunk)
    return chunks


def final_answer(answer: str, turns: int, requests: int) -> Message:
    """The model's answer (escaped, split over sections, cut to fit) and the footer."""
    footer = _footer(turns, requests)

    def build(scale: float) -> list[dict[str, Any]]:
        chunks = _split_answer(answer, _n(ANSWER_LIMIT, scale, 500)) or ["_(the model gave no answer)_"]
        return [*(_section(chunk) for chunk in chunks), _context(footer)]

    return Message(text=_with_tail(answer, footer), blocks=_fit(build))


def stopped(reason: str, turns: int, requests: int) -> Message:
    """A stop by a valve: which valve and why, and the footer."""
    footer = _footer(turns, requests)

    def build(scale: float) -> list[dict[str, Any]]:
        said = _esc(reason, _n(SECTION_MAX - 20, scale, 200))
        return [_section(f":octagonal_sign: {said}"), _context(footer)]

    return Message(text=_with_tail(":octagonal_sign: " + reason, footer), blocks=_fit(build))


def _failure_section(error: str, scale: float) -> dict[str, Any]:
    return _section(":warning: The run failed: " + _esc(error, _n(SECTION_MAX - 40, scale, 200)))


def failed(*, run_id: str, error: str) -> Message:
    """A run that failed on a model API error, with a Retry button (value: the run id)."""
    if len(run_id) > BUTTON_VALUE_MAX:
        raise ValueError(f"run id of {len(run_id)} characters does not fit a button value")
    actions = ActionsBlock(
        block_id="failure",
        elements=[ButtonElement(text="Retry", action_id="retry", value=run_id, style="primary")],
    ).to_dict()

    def build(scale: float) -> list[dict[str, Any]]:
        return [_failure_section(error, scale), actions]

    return Message(text=_esc("The run failed: " + error, TEXT_MAX), blocks=_fit(build))


def retried_card(*, error: str, by: str, at: datetime) -> Message:
    """The failure message after Retry was clicked: no button, who retried and when."""
    retried = f":repeat: Retried by {mention(by)} at {slack_date(at)}"

    def build(scale: float) -> list[dict[str, Any]]:
        return [_failure_section(error, scale), _context(retried)]

    return Message(text=_with_tail("The run failed: " + error, retried), blocks=_fit(build))


def notice(text: str, **users: str | Sequence[str]) -> Message:
    """A plain message with text we wrote ourselves (escaped all the same).

    `{name}` placeholders are filled, after escaping, with real mentions of the trusted user ids
    given as `name=` (one id or several).
    """

    def body(limit: int) -> str:
        out = _esc(text, limit)
        for name, ids in users.items():
            ids = [ids] if isinstance(ids, str) else list(ids)
            out = out.replace("{" + name + "}", ", ".join(mention(u) for u in ids[:20]))
        return out

    return Message(
        text=body(SECTION_MAX) or " ", blocks=_fit(lambda scale: [_section(body(_n(SECTION_MAX, scale)))])
    )


def decline_reason_modal(*, run_id: str, call: PendingCall) -> dict[str, Any]:
    """The modal behind "Decline with reason…": one multiline input the model will read."""
    metadata = f"{run_id}:{call.id}"
    if len(metadata) > PRIVATE_METADATA_MAX:
        raise ValueError(f"private_metadata of {len(metadata)} characters exceeds {PRIVATE_METADATA_MAX}")
    view = View(
        type="modal",
        callback_id="decline_reason",
        private_metadata=metadata,
        title=PlainTextObject(text="Decline"),
        submit=PlainTextObject(text="Decline"),
        close=PlainTextObject(text="Cancel"),
        blocks=[
            ContextBlock(
                elements=[
                    MarkdownTextObject(
                        text=f"Declining {_inline(call.name, 120)}: the call will not run, "
                        "and the model is told why."
                    )
                ]
            ),
            InputBlock(
                block_id="reason",
                label=PlainTextObject(text="Why? (the model will read this)"),
                element=PlainTextInputElement(action_id="reason", multiline=True, max_length=500),
            ),
        ],
    )
    return view.to_dict()


__all__ = [
    "Message",
    "approval_card",
    "blocks_size",
    "code",
    "cut",
    "decided_card",
    "decline_reason_modal",
    "escape",
    "failed",
    "final_answer",
    "mention",
    "notice",
    "retried_card",
    "slack_date",
    "stopped",
    "turn_summary",
]
