"""Approval actions on a card: approve, decline, approve for the thread (or under a directory),
revoking a grant, and Extend on the reminder before a park expires.

Every button names `run:call:fingerprint`; `open_record` checks the run, the workspace, the channel
and the clicker before anything is recorded, and `decide` records a decision atomically (four eyes,
quorum and late clicks included) and has the run resumed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from slack_bolt import Ack, App, BoltContext
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot import approver_checks
from bot.listening import (
    APPLY_DECISIONS,
    REPLY,
    SHOW_NEW_EXPIRY,
    BotDeps,
    Click,
    Clicker,
    Opening,
    Reply,
    Then,
    Where,
    as_dict,
    clicker_and_channel,
    open_click,
    tell_clicker,
)
from gates import deciders
from harness.policy import grant_directory, no_grant
from harness.state import Decision, GrantUse, PendingCall, StateError, Verdict
from messages import texts
from messages.arguments import fully_reviewable
from messages.cards import grant_revoked, reminder_extended
from messages.reasons import plain_quote, plain_why
from messages.text import plural, slack_date
from observe import metrics
from store import (
    BadId,
    DecideOutcome,
    DecideResult,
    ExtendOutcome,
    Grant,
    RunRecord,
    RunStatus,
    check_id,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CardRef:
    """What a card's button names: the run, the call, and the version of the call it showed."""

    run_id: str
    call_id: str
    fingerprint: str  # "" on a card from before fingerprints: no park of now accepts it

    @classmethod
    def parse(cls, value: Any) -> CardRef:
        run_id, _, rest = str(value or "").partition(":")
        call_id, _, fingerprint = rest.partition(":")
        if fingerprint:
            check_id("fingerprint", fingerprint)
        return cls(check_id("run", run_id), check_id("call", call_id), fingerprint)


def card_opening(deps: BotDeps, *, viewing: bool = False) -> Opening[CardRef]:
    """How a card's button (or its modal's submission) is opened: the run must still wait on a
    decision, and the clicker be one who may decide it (or, `viewing`, its requester)."""

    def still_open(click: Click[CardRef]) -> Reply | None:
        if click.record.status is RunStatus.AWAITING_APPROVAL:
            return None
        return _moved_on(deps, click.record, click.ref, click.clicker.user)  # decided, resumed, maybe ended

    def may_act(click: Click[CardRef]) -> Reply | None:
        user, record = click.clicker.user, click.record
        if deps.may_decide(user, record) or (viewing and user == record.requester):
            return None
        return (texts.NOT_ALLOWED, {"who": deps.deciders(record)})

    return Opening(CardRef.parse, _run_of, texts.UNKNOWN_APPROVAL, (still_open, may_act), where=Where.CARD)


def _run_of(ref: CardRef) -> str:
    return ref.run_id


def open_record(
    deps: BotDeps,
    value: Any,
    clicker: Clicker,
    channel: str | None,
    context: BoltContext,
    *,
    viewing: bool = False,
) -> Click[CardRef] | None:
    """The click on a card's button, if the clicker may decide its call; else a reply is set."""
    return open_click(deps, card_opening(deps, viewing=viewing), value, clicker, channel, context)


def _moved_on(deps: BotDeps, record: RunRecord, ref: CardRef, user: str) -> Reply:
    """The reply to a click on a card whose run has moved on: who decided it, when that is known.

    A second click that arrives after the first one's resume (tens of milliseconds) hears the same
    as one that arrives before it. A person who may not decide learns nothing more than before.
    """
    if not deps.may_decide(user, record):
        return texts.UNKNOWN_APPROVAL
    standing = deps.store.parks.decisions(record.run_id, record.park_id).get(ref.call_id)
    if standing is None:  # a call of an earlier park, or never decided (stopped, expired unrecorded)
        return texts.UNKNOWN_APPROVAL
    if standing.verdict is Verdict.EXPIRED:
        return texts.ALREADY_EXPIRED
    if standing.by:
        return (texts.ALREADY_DECIDED_BY.format(verdict=standing.verdict.value), {"who": standing.by})
    return texts.ALREADY_DECIDED


def set_going(deps: BotDeps, record: RunRecord, verdict: Verdict, result: DecideResult) -> bool:
    """What a decision (or a vote of a quorum) sets going: its metric, noted before the job exists
    (the resume reads the note), and the job that shows it on the card or resumes the run. True
    when the decision was recorded: then the clicker needs no reply."""
    if result.outcome is DecideOutcome.RECORDED:
        metrics.decided(deps.store.redis, record, verdict, deps.settings_of(record).approvals)
    if result.outcome in (DecideOutcome.RECORDED, DecideOutcome.EXPIRED, DecideOutcome.COUNTED):
        deps.enqueue(APPLY_DECISIONS, record.run_id)
    return result.outcome is DecideOutcome.RECORDED


def decide(
    deps: BotDeps,
    click: Click[CardRef],
    decision: Decision,
    context: BoltContext,
    *,
    grant: Grant | None = None,
) -> None:
    """Record `decision` on the call `click` names (atomically), and have it shown or the run
    resumed; else the clicker's reply is set."""
    record, ref = click.record, click.ref
    try:
        call = next((c for c in record.run_state().pending if c.id == ref.call_id), None)
    except StateError:
        context[REPLY] = texts.UNREADABLE_RUN  # fail closed: no decision on what we cannot read
        return
    result = deps.store.parks.decide(
        record.run_id,
        record.park_id,
        ref.call_id,
        decision,
        audit=record.audit_fields(call),
        fingerprint=ref.fingerprint,
        required=deps.settings_of(record).approvals.required,
        grant=grant,
    )
    if set_going(deps, record, decision.verdict, result):
        return
    if result.outcome is DecideOutcome.COUNTED:
        required = deps.settings_of(record).approvals.required
        context[REPLY] = texts.APPROVAL_COUNTED.format(count=len(result.votes), required=required)
    elif result.outcome is DecideOutcome.STALE:
        context[REPLY] = texts.STALE_CARD
    elif result.outcome is DecideOutcome.UNKNOWN:
        context[REPLY] = texts.UNKNOWN_APPROVAL
    elif result.decision is not None and result.decision.verdict is Verdict.EXPIRED:
        context[REPLY] = texts.ALREADY_EXPIRED
    else:
        standing = result.decision
        if standing and standing.by:
            context[REPLY] = (
                texts.ALREADY_DECIDED_BY.format(verdict=standing.verdict.value),
                {"who": standing.by},
            )
        else:
            context[REPLY] = texts.ALREADY_DECIDED


def _on_decision(
    deps: BotDeps, verdict: Verdict, *, grant: bool = False, scoped: bool = False
) -> Callable[..., None]:
    def on_decision(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = clicker_and_channel(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        click = open_record(deps, action.get("value"), clicker, channel, context)
        if click is None:
            return
        record, ref = click.record, click.ref
        if verdict is Verdict.APPROVED and not _may_approve(deps, record, ref, clicker.user, context):
            return
        if not grant:
            check = None
            if verdict is Verdict.APPROVED:  # a decline runs nothing: the static rule alone says who
                asked = approver_checks.ask(deps, record, awaiting_call(record, ref.call_id), clicker.user)
                if asked.refusal is not None:
                    context[REPLY] = asked.refusal
                    return
                check = asked.check  # a yes (or None: no callable for this tool)
            decide(deps, click, Decision(verdict, by=clicker.user, check=check), context)
            return
        approvals = deps.settings_of(record).approvals
        call = awaiting_call(record, ref.call_id)
        if approvals.grant_minutes <= 0 or approvals.required > 1 or call is None:
            context[REPLY] = texts.NO_GRANTS if call is not None else texts.UNKNOWN_APPROVAL
            return
        if no_grant(call.why):  # its card offers no grant; a stale or forged click gives none either
            context[REPLY] = texts.NO_GRANT_ALWAYS_ASKS.format(why=plain_why(call.why, plain_quote))
            return
        if function := approver_checks.callable_for(deps, record, call.name):
            # A grant would let later calls run with nobody asking the callable: none is given.
            context[REPLY] = texts.NO_GRANT_WITH_CHECK.format(function=function)
            return
        # From the parked call alone (its arguments, and its tool's path arguments as the worker that
        # ruled it knew them), as the card was built: nothing of the click's payload names the scope.
        directory = grant_directory(call.input, call.path_args) if scoped else ""
        if directory is None:  # a card only offers it for a call with a directory to scope to
            context[REPLY] = texts.NO_SCOPED_GRANT
            return
        until = time.time() + approvals.grant_minutes * 60
        try:
            given = Grant.given(
                record.team,
                record.channel,
                record.thread_ts,
                call.name,
                clicker.user,
                record.requester,
                until,
                record.run_id,
                directory=directory,
                uses=approvals.grant_uses,
            )
        except BadId:
            context[REPLY] = texts.NO_GRANTS
            return
        decision = Decision(verdict, by=clicker.user, grant=GrantUse.GIVEN, grant_dir=directory or None)
        decide(deps, click, decision, context, grant=given)

    return on_decision


def _may_approve(deps: BotDeps, record: RunRecord, ref: CardRef, user: str, context: BoltContext) -> bool:
    """Whether `user` may approve (not only decline) the call: four eyes, arguments one can read, and
    a requester the channel's profile still lets start a run."""
    if deciders.self_approval_refused(deps.settings_of(record).approvals, user, record):
        context[REPLY] = texts.NO_SELF_APPROVAL  # their decline still counts
        return False
    if not _reviewable(record, ref.call_id):
        context[REPLY] = texts.NOT_REVIEWABLE  # nobody approves bytes they could not have read
        return False
    if refused := deps.no_more_work(record):  # an approval starts model work for the requester
        context[REPLY] = refused
        return False
    return True


def awaiting_call(record: RunRecord, call_id: str) -> PendingCall | None:
    try:
        return next((c for c in record.run_state().awaiting if c.id == call_id), None)
    except StateError:
        return None


def _reviewable(record: RunRecord, call_id: str) -> bool:
    try:
        call = next((c for c in record.run_state().pending if c.id == call_id), None)
    except StateError:
        return True  # decide refuses an unreadable state itself, with its own reply
    return call is None or fully_reviewable(call)


@dataclass(frozen=True)
class GrantRef:
    """What a Revoke button names: the run whose thread holds the grant, its tool and its scope."""

    run_id: str
    tool: str
    slot: str  # "": the grant of the whole thread

    @classmethod
    def parse(cls, value: Any) -> GrantRef:
        run_id, _, rest = str(value or "").partition(":")
        tool, _, slot = rest.partition(":")
        if slot:
            check_id("slot", slot)
        return cls(check_id("run", run_id), check_id("tool", tool), slot)


def _grant_run(ref: GrantRef) -> str:
    return ref.run_id


# A Revoke: who may revoke depends on the grant, read after; every refusal before reads the same.
_GRANT = Opening(
    GrantRef.parse,
    _grant_run,
    texts.NO_SUCH_GRANT,
    where=Where.RUN_CHANNEL,
    unreadable=texts.NO_SUCH_GRANT,
    wrong_team=texts.NO_SUCH_GRANT,
    wrong_channel=texts.NO_SUCH_GRANT,
)

REVOKED = "revoked"  # context key: the grant a Revoke ended, for the message's update after


@dataclass(frozen=True)
class Revoked:
    """A grant a click revoked: its tool, who revoked it, and its directory ("": the whole thread)."""

    tool: str
    by: str
    directory: str


def _on_revoke_grant(deps: BotDeps) -> Callable[..., None]:
    def on_revoke(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = clicker_and_channel(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        click = open_click(deps, _GRANT, action.get("value"), clicker, channel, context)
        if click is None:
            return
        record, tool, slot = click.record, click.ref.tool, click.ref.slot
        grant = deps.store.grants.grant(record.team, record.channel, record.thread_ts, tool, slot)
        allowed = clicker.user in (record.requester, grant.by if grant else None)
        if not (allowed or deps.may_decide(clicker.user, record)):
            context[REPLY] = (texts.NOT_ALLOWED_REVOKE, {"who": deps.deciders(record)})
            return
        if grant is None or not deps.store.grants.revoke(
            record.team, record.channel, record.thread_ts, tool, slot
        ):
            context[REPLY] = texts.NO_SUCH_GRANT
            return
        context[REVOKED] = Revoked(tool, clicker.user, grant.directory)

    return on_revoke


def _after_revoke(body: dict[str, Any], context: BoltContext, client: WebClient) -> None:
    """The grant's message loses its button and says who revoked it; or the clicker hears why not."""
    revoked = context.get(REVOKED)
    message = as_dict(body.get("message"))
    channel = context.get("reply_channel")
    if isinstance(revoked, Revoked) and channel and message.get("ts"):
        msg = grant_revoked(
            tool=revoked.tool, by=revoked.by, at=datetime.now(UTC), directory=revoked.directory
        )
        try:
            client.chat_update(channel=channel, ts=message["ts"], text=msg.text, blocks=msg.blocks)
        except SlackApiError as exc:
            log.warning("could not mark the grant revoked: %s", exc.response.get("error"))
    tell_clicker(body, context, client)


MAX_EXTEND_TRIES = 5  # a record saved between read and write (a card's ts noted) is read again


@dataclass(frozen=True)
class ReminderRef:
    """What an Extend button names: the run, the park, and how many extensions it was posted at."""

    run_id: str
    park_id: int
    seen: int

    @classmethod
    def parse(cls, value: Any) -> ReminderRef:
        run_id, park, seen = (str(value or "").split(":") + ["", ""])[:3]
        if not (park.isdigit() and seen.isdigit() and len(park) < 10 and len(seen) < 10):
            raise BadId("not a valid reminder value")
        return cls(check_id("run", run_id), int(park), int(seen))


EXTENDED = "extended"  # context key: the Extend that moved a park's expiry, for the reminder's update


@dataclass(frozen=True)
class Extended:
    """An Extend that moved a park's expiry: who clicked it, and the new expiry (epoch seconds)."""

    by: str
    expires_at: float


def _extend_opening(deps: BotDeps) -> Opening[ReminderRef]:
    """How Extend on a reminder is opened: by the requester or one who may decide, while the park
    it names still waits. A reminder from another workspace or channel reads as unknown."""

    def may_extend(click: Click[ReminderRef]) -> Reply | None:
        record, user = click.record, click.clicker.user
        if user == record.requester or deps.may_decide(user, record):
            return None
        return (texts.EXTEND_NOT_ALLOWED, {"who": deps.deciders(record)})

    def more_work(click: Click[ReminderRef]) -> Reply | None:
        return deps.no_more_work(click.record)

    def still_waits(click: Click[ReminderRef]) -> Reply | None:
        return None if _waits(click.record, click.ref) else texts.EXTEND_EXPIRED

    return Opening(
        parse=ReminderRef.parse,
        run_of=lambda ref: ref.run_id,
        unknown=texts.UNKNOWN_APPROVAL,
        checks=(may_extend, more_work, still_waits),
        where=Where.RUN_CHANNEL,
        unreadable=texts.UNKNOWN_APPROVAL,
        wrong_team=texts.UNKNOWN_APPROVAL,
        wrong_channel=texts.UNKNOWN_APPROVAL,
    )


def _waits(record: RunRecord, ref: ReminderRef) -> bool:
    return record.status is RunStatus.AWAITING_APPROVAL and record.park_id == ref.park_id


def _on_extend(deps: BotDeps) -> Callable[..., None]:
    def on_extend(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = clicker_and_channel(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        click = open_click(deps, _extend_opening(deps), action.get("value"), clicker, channel, context)
        if click is None:
            return
        ref, approvals = click.ref, deps.settings_of(click.record).approvals
        for _ in range(MAX_EXTEND_TRIES):  # the expiry is moved on the record as read (compare-and-set)
            try:
                read = deps.store.escalations.read_run(ref.run_id)
            except StateError:
                read = None
            if read is None:
                context[REPLY] = texts.UNKNOWN_APPROVAL
                return
            raw, record = read
            if not _waits(record, ref):
                context[REPLY] = texts.EXTEND_EXPIRED
                return
            result = deps.store.escalations.extend_park(
                raw,
                record,
                seen=ref.seen,
                most=approvals.max_extensions,
                seconds=approvals.expire_after_minutes * 60,
                remind_before=approvals.remind_before_minutes * 60,
            )
            if result.outcome is not ExtendOutcome.MOVED:
                break
        else:
            context[REPLY] = texts.EXTEND_EXPIRED  # the record kept changing: nothing was changed
            return
        expires = slack_date(datetime.fromtimestamp(result.expires_at, UTC)) if result.expires_at else ""
        if result.outcome is ExtendOutcome.EXTENDED:
            log.info("run %s park %d: extended by %s", record.run_id, record.park_id, clicker.user)
            context[EXTENDED] = Extended(clicker.user, result.expires_at)
            deps.enqueue(SHOW_NEW_EXPIRY, record.run_id, record.park_id)  # its cards show the new expiry
        elif result.outcome is ExtendOutcome.TAKEN:
            context[REPLY] = texts.EXTEND_TAKEN.format(expires=expires)
        elif result.outcome is ExtendOutcome.MOST:
            context[REPLY] = texts.EXTEND_MOST.format(
                count=plural(result.extensions, "time"), expires=expires
            )
        else:
            context[REPLY] = texts.EXTEND_EXPIRED

    return on_extend


def _after_extend(body: dict[str, Any], context: BoltContext, client: WebClient) -> None:
    """The reminder loses its button and says who extended it, until when; or the clicker hears why not."""
    extended = context.get(EXTENDED)
    message = as_dict(body.get("message"))
    channel = context.get("reply_channel")
    if isinstance(extended, Extended) and channel and message.get("ts"):
        expires_at = datetime.fromtimestamp(extended.expires_at, UTC)
        msg = reminder_extended(by=extended.by, expires_at=expires_at)
        try:
            client.chat_update(channel=channel, ts=message["ts"], text=msg.text, blocks=msg.blocks)
        except SlackApiError as exc:
            log.warning("could not mark the reminder extended: %s", exc.response.get("error"))
    tell_clicker(body, context, client)


def register(app: App, deps: BotDeps, then: Then) -> None:
    """Register this surface's listeners."""
    for action_id, verdict in (("approve", Verdict.APPROVED), ("decline", Verdict.DECLINED)):
        app.action(action_id)(then(_on_decision(deps, verdict), tell_clicker))
    app.action("approve_thread")(then(_on_decision(deps, Verdict.APPROVED, grant=True), tell_clicker))
    scoped = _on_decision(deps, Verdict.APPROVED, grant=True, scoped=True)
    app.action("approve_dir")(then(scoped, tell_clicker))
    app.action("revoke_grant")(then(_on_revoke_grant(deps), _after_revoke))
    app.action("extend")(then(_on_extend(deps), _after_extend))
