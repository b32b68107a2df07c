"""What `python -m workers audit` prints: one line per entry, whatever its kind.

The decisions' audit (`harness:audit`) holds decisions (approved, declined, expired, with edits or
a grant given), votes towards a quorum (`approval_counted`), approvals an `approvers_from` callable refused
(`approval_refused`), calls a grant let run (`grant:
"used"`) and answers at a limit (`limit`). The answers' feedback has a stream of its own
(`harness:feedback`, `--feedback`); versions before it wrote feedback into the audit, and such
entries are still read there. Every call's tier decision has one too (`event: "ruled"`, written by
`ops.rulings`; `harness:audit:calls`, `--calls`), so that the many calls never push decisions
out of the decisions' audit. An entry of a kind this version does not know (a newer version's,
one written by hand, one that is not JSON) is printed as what it holds: reading never crashes.

Every value is printed on one line with nothing a terminal would act on: entries hold text that
came from the model (arguments) and from Slack, and a control sequence in it must not reach the
operator's terminal as one.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

DECIDED = ("approved", "declined", "expired")
RULED = "ruled"  # the event of a call's tier decision (ops.rulings)
_UNKNOWN_SHOWN = 500  # characters of an unknown entry's JSON
_ARGS_SHOWN = 600  # characters of a ruled call's arguments


def lines(entries: Iterable[Mapping[str, Any]], *, feedback: bool = False) -> Iterator[str]:
    """One line per entry, in order: decisions' audit entries, or (`feedback`) feedback entries."""
    for entry in entries:
        yield feedback_line(entry) if feedback else audit_line(entry)


def audit_line(entry: Mapping[str, Any]) -> str:
    """An entry of the decisions' audit, by its kind."""
    verdict, where = entry.get("verdict"), _where(entry)
    if entry.get("event") == "feedback" and verdict is None:  # written by a version before the stream
        return feedback_line(entry)
    if entry.get("event") == RULED and verdict is None:
        return ruled_line(entry)
    if verdict == "approval_counted":
        approvers = ",".join(_text(a) for a in entry.get("approvers") or ())
        count = f"{_text(entry.get('count'))} of {_text(entry.get('required'))}"
        checked = _checked(entry)
        return (
            f"{_when(entry)} counted  by {_who(entry)} ({count}: {approvers}) {_call(entry)} {where}{checked}"
        )
    if verdict == "approval_refused":  # an approval the approvers_from callable did not let through
        return f"{_when(entry)} refused  by {_who(entry)} {_call(entry)} {where}{_checked(entry)}"
    if verdict not in DECIDED:
        shown = _safe(json.dumps(entry, ensure_ascii=False, default=str))[:_UNKNOWN_SHOWN]
        return f"{_when(entry)} unknown  {shown}"
    extra = ""
    if entry.get("reason"):
        extra += f" reason={_quoted(entry['reason'])}"
    if entry.get("grant"):
        extra += f" grant={_text(entry['grant'])}"
    if entry.get("grant_dir"):
        extra += f" grant_dir={_quoted(entry['grant_dir'])}"
    if entry.get("grant_uses"):
        extra += f" grant_left={_text(entry.get('grant_left'))}/{_text(entry['grant_uses'])}"
    if entry.get("approvers"):
        extra += f" approvers={','.join(_text(a) for a in entry['approvers'])}"
    if entry.get("edited_input") is not None:
        extra += f" edited_to={_quoted(json.dumps(entry['edited_input'], ensure_ascii=False))[:600]}"
    extra += _checked(entry)
    if entry.get("late_click_by"):
        extra += f" late_click_by={_text(entry['late_click_by'])}"
    if entry.get("input_sha256"):
        extra += f" input_sha256={_text(entry['input_sha256'])}"
    if entry.get("tier_why"):
        extra += f" why={_quoted(entry['tier_why'])}"
    who = _who(entry) if entry.get("by") else "(nobody: expired)"
    return f"{_when(entry)} {_text(verdict):<8} by {who} {_call(entry)} {where}{extra}"


def _checked(entry: Mapping[str, Any]) -> str:
    """What an `approvers_from` callable answered at the click, when one was asked."""
    check = entry.get("approvers_from")
    if not isinstance(check, Mapping):
        return ""
    said = f"{_text(check.get('function'))}={_text(check.get('answer'))}"
    return f" approvers_from={said} check_reason={_quoted(check.get('reason') or '')}"


def ruled_line(entry: Mapping[str, Any]) -> str:
    """A call's tier decision: when, the tier, the call, where, and what replay reads of it."""
    args = json.dumps(entry.get("input"), ensure_ascii=False, default=str)
    if len(args) > _ARGS_SHOWN:
        args = args[:_ARGS_SHOWN] + "…"
    call = f"{_text(entry.get('tool'))}({_safe(args)})"
    extra = f" profile={_text(entry.get('profile') or '-')} source={_text(entry.get('source') or '-')}"
    if entry.get("answered"):
        extra += f" answered={_text(entry['answered'])}"
    if entry.get("cut") and isinstance(entry["cut"], list):
        extra += f" cut={','.join(_text(k) for k in entry['cut'])}"
    extra += f" input_sha256={_text(entry.get('input_sha256'))} why={_quoted(entry.get('why') or '')}"
    return f"{_when(entry)} ruled    {_text(entry.get('tier')):<5} {call} {_where(entry)}{extra}"


def feedback_line(entry: Mapping[str, Any]) -> str:
    """An entry of the feedback stream: when, good or bad, who, which answer and where."""
    if "unreadable" in entry:
        return f"{_when(entry)} unknown  {_quoted(entry['unreadable'])}"
    return f"{_when(entry)} feedback {_text(entry.get('feedback')):<4} by {_who(entry)} {_where(entry)}"


def _call(entry: Mapping[str, Any]) -> str:
    """What was decided: a limit (Continue or Stop), or a tool call and its arguments' preview."""
    if entry.get("limit"):
        return f"limit {_text(entry['limit'])}"
    if "unreadable" in entry:
        return f"(unreadable entry: {_quoted(entry['unreadable'])})"
    args = entry.get("input_preview")
    if not isinstance(args, str):
        args = json.dumps(entry.get("input"), ensure_ascii=False, default=str)
    return f"{_text(entry.get('tool'))}({_safe(args)})"


def _where(entry: Mapping[str, Any]) -> str:
    return (
        f"run={_text(entry.get('run_id'))} channel={_text(entry.get('channel'))} "
        f"asked_by={_text(entry.get('requester'))}"
    )


def _when(entry: Mapping[str, Any]) -> str:
    at = entry.get("at")
    if not isinstance(at, int | float) or isinstance(at, bool):
        return "(no time)"
    try:
        return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return "(no time)"


def _who(entry: Mapping[str, Any]) -> str:
    return _text(entry.get("by")) if entry.get("by") else "(nobody)"


def _quoted(value: Any) -> str:
    return _safe(json.dumps(value if isinstance(value, str) else str(value), ensure_ascii=False))


def _text(value: Any) -> str:
    return _safe(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str))


def _safe(text: str) -> str:
    """`text` with every control, format or unassigned character shown as its code point: no
    escape sequence, line break or bidi override of a stored value acts on the terminal."""
    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c)[0] in "CZ" and c != " " else c for c in text)
