"""An approval asks the `approvers_from` callable of its call's tool before anything is recorded.

Every approving click (Approve, an approving edit, Approve all, each vote of a quorum) comes here
once the static rule has let the clicker through (`gates.deciders`). No callable for the tool: the
approval goes on as before. A yes: it goes on, and the decision carries the answer and its reason
to the card and the audit. Anything else refuses it: nothing is decided, the clicker is told why,
and the refusal has its own audit entry (`verdict: "approval_refused"`). Declines never come here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bot.listening import BotDeps, Reply
from gates.approvers_from import Answer, ApprovalClick, click_of
from harness.state import ClickCheck, PendingCall
from messages import texts
from store import RunRecord

REFUSED = "approval_refused"  # the audit's verdict of an approval the callable did not let through


@dataclass(frozen=True)
class Asked:
    """What the callable said of one approval (None: no callable for the tool), and why the approval
    is refused (None: it goes on, and `check` is recorded with it)."""

    check: ClickCheck | None = None
    refusal: Reply | None = None


def callable_for(deps: BotDeps, record: RunRecord, tool: str) -> str:
    """The `module:function` asked at an approval of `tool` in `record`'s run now ("": none)."""
    return deps.settings_of(record).approvals.approvers_from_for(tool)


def ask(
    deps: BotDeps,
    record: RunRecord,
    call: PendingCall | None,
    user: str,
    *,
    edited: Mapping[str, Any] | None = None,
) -> Asked:
    """Ask the callable of `call`'s tool whether `user` may approve it (with `edited` arguments)."""
    if call is None:
        return Asked()  # no such call waits: the decide script answers that itself
    return ask_all(deps, record, [call], user, edited=edited)[0]


def ask_all(
    deps: BotDeps,
    record: RunRecord,
    calls: Sequence[PendingCall],
    user: str,
    *,
    edited: Mapping[str, Any] | None = None,
) -> list[Asked]:
    """`ask` of each of `calls` (one clicker's Approve all), every callable asked at once."""
    settings = deps.settings_of(record)
    approvals = settings.approvals
    asks: list[tuple[str, ApprovalClick]] = []
    for call in calls:
        ref = approvals.approvers_from_for(call.name)
        if ref:
            click = click_of(call, clicker=user, record=record, workspace=settings.workspace, edited=edited)
            asks.append((ref, click))
    answers = iter(deps.checks.ask_all(asks, approvals.approvers_from_timeout_seconds) if asks else [])
    out = []
    for call in calls:
        if not approvals.approvers_from_for(call.name):
            out.append(Asked())
            continue
        check = next(answers)
        if check.answer == Answer.YES:
            out.append(Asked(check=check))
            continue
        _audit_refusal(deps, record, call, user, check, edited)
        out.append(Asked(check=check, refusal=refusal_text(check)))
    return out


def refusal_text(check: ClickCheck) -> str:
    """What the clicker is told when `check` did not let their approval through."""
    template = texts.CHECK_SAID_NO if check.answer == Answer.NO else texts.CHECK_UNSURE
    return template.format(function=check.ref, reason=reason_of(check))


def refusal_line(check: ClickCheck, most: int) -> str:
    """The same, in one line of at most `most` characters (under a modal's input)."""
    line = texts.CHECK_EDIT_REFUSED.format(function=check.ref, answer=check.answer, reason=reason_of(check))
    return line if len(line) <= most else line[: most - 1] + "…"


def reason_of(check: ClickCheck) -> str:
    return check.reason or texts.CHECK_NO_REASON


def _audit_refusal(
    deps: BotDeps,
    record: RunRecord,
    call: PendingCall,
    user: str,
    check: ClickCheck,
    edited: Mapping[str, Any] | None,
) -> None:
    """An approval the callable refused, in the decisions' audit: who tried, on what, what it said."""
    entry: dict[str, Any] = {
        "run_id": record.run_id,
        "park_id": record.park_id,
        "call_id": call.id,
        **record.audit_fields(call),
        "verdict": REFUSED,
        "by": user,
        "approvers_from": check.to_json(),
    }
    if edited is not None:
        entry["edited_input"] = dict(edited)
    deps.store.audit.append(entry)
