"""Approve all / Decline all on a park of two or more calls.

A batch button names `run:park`. A click is the clicker's own approve or decline of every call of
that park still open, one call at a time through the same atomic `decide` as a card's button (per
call: the fingerprint the park holds, the audit entry, the quorum). Then one job shows the
decisions and, once every call is decided, resumes the run. Approve all leaves open a call that
always asks (`harness.policy.always_asks`), and says so: a person approves it on its own card.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from slack_bolt import Ack, App, BoltContext

from bot import approver_checks
from bot.listening import (
    APPLY_DECISIONS,
    REPLY,
    BotDeps,
    Click,
    Opening,
    Reply,
    Then,
    Where,
    clicker_and_channel,
    open_click,
    tell_clicker,
)
from gates import deciders
from harness.policy import always_asks
from harness.state import Decision, PendingCall, StateError, Verdict
from messages import texts
from messages.arguments import fully_reviewable
from messages.text import plural
from observe import metrics
from store import BadId, DecideOutcome, RunRecord, RunStatus, check_id


@dataclass(frozen=True)
class ParkRef:
    """What a batch button names: the run, and the park its message was posted for."""

    run_id: str
    park_id: int

    @classmethod
    def parse(cls, value: Any) -> ParkRef:
        run_id, _, park = str(value or "").partition(":")
        if not park.isdigit() or len(park) > 12:
            raise BadId(f"bad park id {park[:20]!r}")
        return cls(check_id("run", run_id), int(park))


def _park_opening(deps: BotDeps) -> Opening[ParkRef]:
    """How a batch button is opened: the clicker may decide the run, parked still at that park."""

    def may_act(click: Click[ParkRef]) -> Reply | None:
        if deps.may_decide(click.clicker.user, click.record):
            return None
        return (texts.NOT_ALLOWED, {"who": deps.deciders(click.record)})

    def still_open(click: Click[ParkRef]) -> Reply | None:
        record = click.record
        if record.status is RunStatus.AWAITING_APPROVAL and record.park_id == click.ref.park_id:
            return None
        return texts.BATCH_CLOSED

    return Opening(
        ParkRef.parse, _run_of, texts.UNKNOWN_APPROVAL, (may_act, still_open), where=Where.RUN_CHANNEL
    )


def _run_of(ref: ParkRef) -> str:
    return ref.run_id


def decide_all(
    deps: BotDeps, record: RunRecord, calls: tuple[PendingCall, ...], decision: Decision
) -> Reply | None:
    """`decision` on every call of `calls` still open, in the model's order; the reply owed, if any."""
    approvals = deps.settings_of(record).approvals
    approving = decision.verdict is Verdict.APPROVED
    user = decision.by or ""
    if approving and deciders.self_approval_refused(approvals, user, record):
        return texts.NO_SELF_APPROVAL  # their Decline all still counts
    if approving and (refused := deps.no_more_work(record)):
        return refused  # the requester may no longer start model work here
    open_, votes = deps.store.parks.ballot(record.run_id, record.park_id)
    unreadable: list[str] = []
    left_open: list[str] = []
    todo: list[PendingCall] = []
    for call in calls:
        if open_.get(call.id, "gone") is not None or (approving and user in votes.get(call.id, ())):
            continue  # decided already (or not of this park), or this approver's vote already counts
        if approving and always_asks(call.why):
            left_open.append(call.name)  # a person approves each call of it on its own card
            continue
        if approving and not fully_reviewable(call):
            unreadable.append(call.name)  # nobody approves bytes they could not have read
            continue
        todo.append(call)
    checks, not_let_through = _checked(deps, record, todo, decision)
    results = (
        deps.store.parks.decide_each(record.run_id, record.park_id, checks, required=approvals.required)
        if checks
        else []
    )
    recorded = sum(r.outcome is DecideOutcome.RECORDED for r in results)
    counted = sum(r.outcome is DecideOutcome.COUNTED and user in r.votes for r in results)
    expired = any(r.outcome is DecideOutcome.EXPIRED for r in results)  # the clock decides the rest
    if recorded:
        metrics.decided(deps.store.redis, record, decision.verdict, approvals, calls=recorded)
    if recorded or counted or expired:
        deps.enqueue(APPLY_DECISIONS, record.run_id)  # one job shows them all and resumes the run
    return _reply(recorded, counted, expired, unreadable, approving, left_open, not_let_through)


def _checked(
    deps: BotDeps, record: RunRecord, calls: list[PendingCall], decision: Decision
) -> tuple[list[tuple[str, dict[str, Any], str, Decision]], list[str]]:
    """The calls to decide (id, audit, fingerprint, decision), each approval with what its tool's
    `approvers_from` callable answered; and, for those it did not let through, why (left open)."""
    if decision.verdict is not Verdict.APPROVED:
        return [(c.id, record.audit_fields(c), c.fingerprint, decision) for c in calls], []
    asked = approver_checks.ask_all(deps, record, calls, decision.by or "")
    todo, refused = [], []
    for call, answer in zip(calls, asked, strict=True):
        if answer.refusal is not None and answer.check is not None:
            check = answer.check
            refused.append(
                texts.BATCH_CHECK_CALL.format(
                    tool=call.name,
                    function=check.ref,
                    answer=check.answer,
                    reason=approver_checks.reason_of(check),
                )
            )
            continue
        todo.append(
            (call.id, record.audit_fields(call), call.fingerprint, replace(decision, check=answer.check))
        )
    return todo, refused


def _reply(
    recorded: int,
    counted: int,
    expired: bool,
    unreadable: list[str],
    approving: bool,
    left_open: Sequence[str] = (),
    refused: Sequence[str] = (),
) -> Reply | None:
    if expired:
        return texts.ALREADY_EXPIRED
    if refused:
        return texts.BATCH_CHECK_REFUSED.format(calls="; ".join(refused[:10]))
    if unreadable:
        names = ", ".join(sorted(set(unreadable))[:10])
        return texts.BATCH_NOT_REVIEWABLE.format(calls=names)
    if left_open:
        return texts.BATCH_LEFT_OPEN.format(calls=", ".join(sorted(set(left_open))[:10]))
    if counted:
        return texts.BATCH_COUNTED.format(calls=plural(counted, "call"))
    if recorded:
        return None
    return texts.BATCH_ALREADY_COUNTED if approving else texts.BATCH_NOTHING_OPEN


def _on_batch(deps: BotDeps, verdict: Verdict) -> Callable[..., None]:
    def on_batch(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = clicker_and_channel(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        click = open_click(deps, _park_opening(deps), action.get("value"), clicker, channel, context)
        if click is None:
            return
        record = click.record
        try:
            calls = record.run_state().awaiting
        except StateError:
            context[REPLY] = texts.UNREADABLE_RUN  # fail closed: no decision on what we cannot read
            return
        reply = decide_all(deps, record, calls, Decision(verdict, by=clicker.user))
        if reply is not None:
            context[REPLY] = reply

    return on_batch


def register(app: App, deps: BotDeps, then: Then) -> None:
    """Register this surface's listeners."""
    app.action("approve_all")(then(_on_batch(deps, Verdict.APPROVED), tell_clicker))
    app.action("decline_all")(then(_on_batch(deps, Verdict.DECLINED), tell_clicker))
