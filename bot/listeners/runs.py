"""A run's own buttons: Stop, Continue at a limit, Retry after a failure, and feedback on an answer."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slack_bolt import Ack, App, BoltContext

from bot.listeners.approvals import set_going
from bot.listening import (
    HONOUR_STOP,
    REPLY,
    RETRY_RUN,
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
from harness.state import Decision, StateError, Verdict
from messages import texts
from messages.endings import FEEDBACK_BAD, FEEDBACK_GOOD
from messages.text import plural
from observe import families, metrics
from store import (
    ENDED,
    FEEDBACK_PER_MINUTE,
    LIMIT_CALL,
    Accepted,
    BadId,
    DecideOutcome,
    FeedbackOutcome,
    RunRecord,
    RunStatus,
    check_id,
)

log = logging.getLogger(__name__)


def _on_stop(deps: BotDeps) -> Callable[..., None]:
    """`stop`: on a limit card (value `run:limit`) it answers the limit; on the "Working on it…"
    message (value: the run id) it stops the run."""

    def on_stop(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = clicker_and_channel(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        run_id, _, what = str(action.get("value") or "").partition(":")
        if what == LIMIT_CALL:
            _answer_limit(deps, run_id, Verdict.DECLINED, clicker, channel, context)
        elif what:
            context[REPLY] = texts.STOP_UNKNOWN
        else:
            request_stop(deps, run_id, clicker, channel, context)

    return on_stop


def _on_continue(deps: BotDeps) -> Callable[..., None]:
    def on_continue(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = clicker_and_channel(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        run_id, _, what = str(action.get("value") or "").partition(":")
        if what != LIMIT_CALL:
            context[REPLY] = texts.LIMIT_NOT_OPEN
            return
        _answer_limit(deps, run_id, Verdict.APPROVED, clicker, channel, context)

    return on_continue


def _run_opening(*checks: Callable[[Click[str]], Reply | None]) -> Opening[str]:
    """How a Stop or Continue is opened: its value names a run of this workspace and channel, and
    `checks` hold."""
    return Opening(_run_id, _same, texts.STOP_UNKNOWN, checks)


def _run_id(value: Any) -> str:
    return check_id("run", value)


def _same(run_id: str) -> str:
    return run_id


def request_stop(
    deps: BotDeps, run_id: str, clicker: Clicker, channel: str | None, context: BoltContext
) -> None:
    """Record the first Stop of a run (by its requester or one who may decide) and have it acted on."""

    def may_stop(click: Click[str]) -> Reply | None:
        record = click.record
        if click.clicker.user == record.requester or deps.may_decide(click.clicker.user, record):
            return None
        stoppers = list(dict.fromkeys([record.requester, *deps.deciders(record)]))
        return (texts.STOP_NOT_ALLOWED, {"who": stoppers})

    click = open_click(deps, _run_opening(may_stop), run_id, clicker, channel, context)
    if click is None:
        return
    record = click.record
    if record.status is RunStatus.STOPPED and record.stopped_by:
        context[REPLY] = (texts.STOP_ALREADY_STOPPED, {"who": record.stopped_by})
        return
    if record.status in ENDED:
        context[REPLY] = texts.STOP_ENDED
        return
    first = deps.store.runs.request_stop(record.run_id, clicker.user)
    if first is not None:
        context[REPLY] = (texts.STOP_ALREADY, {"who": first})
        return
    # A driven run sees the request before its next step; this job stops a parked one at once.
    deps.enqueue(HONOUR_STOP, record.run_id)


def _limit_opening(deps: BotDeps) -> Opening[str]:
    """How Continue or Stop on a limit card is opened: the run waits at its limit still, and the
    clicker may decide it."""

    def limit_open(click: Click[str]) -> Reply | None:
        return None if click.record.status is RunStatus.AWAITING_APPROVAL else texts.LIMIT_NOT_OPEN

    def may_act(click: Click[str]) -> Reply | None:
        if deps.may_decide(click.clicker.user, click.record):
            return None
        return (texts.LIMIT_NOT_ALLOWED, {"who": deps.deciders(click.record)})

    return _run_opening(limit_open, may_act)


def _answer_limit(
    deps: BotDeps, run_id: str, verdict: Verdict, clicker: Clicker, channel: str | None, context: BoltContext
) -> None:
    """Record Continue (approved) or Stop (declined) for a run parked at a limit: the same deciders,
    four eyes and quorum as a call's approval (one Stop stops)."""
    click = open_click(deps, _limit_opening(deps), run_id, clicker, channel, context)
    if click is None:
        return
    record = click.record
    refused = deps.no_more_work(record) if verdict is Verdict.APPROVED else None  # Stop stays open
    if refused is not None:
        context[REPLY] = refused
        return
    approvals = deps.settings_of(record).approvals
    if verdict is Verdict.APPROVED and deciders.self_approval_refused(approvals, clicker.user, record):
        context[REPLY] = texts.LIMIT_NO_SELF_CONTINUE  # four eyes: their Stop still counts
        return
    try:
        at_limit = record.run_state().at_limit
    except StateError:
        context[REPLY] = texts.UNREADABLE_RUN
        return
    audit = {**record.audit_fields(None), "limit": at_limit}
    decision = Decision(verdict, by=clicker.user)
    result = deps.store.parks.decide(
        record.run_id, record.park_id, LIMIT_CALL, decision, audit=audit, required=approvals.required
    )
    if set_going(deps, record, verdict, result):  # a Continue that counted: the card shows it
        return
    standing = result.decision
    if result.outcome is DecideOutcome.COUNTED:
        context[REPLY] = texts.LIMIT_CONTINUE_COUNTED.format(
            count=len(result.votes), required=approvals.required
        )
    elif result.outcome is DecideOutcome.UNKNOWN or standing is None:
        context[REPLY] = texts.LIMIT_NOT_OPEN
    elif standing.verdict is Verdict.EXPIRED:
        context[REPLY] = texts.LIMIT_ALREADY_EXPIRED
    else:
        chosen = "Continue" if standing.verdict is Verdict.APPROVED else "Stop"
        context[REPLY] = (texts.LIMIT_ALREADY.format(verdict=chosen), {"who": standing.by or "someone"})


def _retry_opening(deps: BotDeps, body: dict[str, Any]) -> Opening[str]:
    """How Retry on a failure card is opened: in the run's channel, on a failure not yet retried,
    by one who may decide."""

    def failed(click: Click[str]) -> Reply | None:
        return None if _failure_clicked(click.record, body) is not None else texts.RETRY_TAKEN

    def may_retry(click: Click[str]) -> Reply | None:
        if deps.may_decide(click.clicker.user, click.record):
            return None
        return (texts.NOT_ALLOWED_RETRY, {"who": deps.deciders(click.record)})

    def more_work(click: Click[str]) -> Reply | None:
        return deps.no_more_work(click.record)

    return Opening(
        parse=_run_id,
        run_of=_same,
        unknown=texts.RETRY_TAKEN,
        checks=(failed, may_retry, more_work),
        where=Where.RUN_CHANNEL,
        unreadable=texts.RETRY_TAKEN,
    )


def _on_retry(deps: BotDeps) -> Callable[..., None]:
    def on_retry(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = clicker_and_channel(body)
        user = clicker.user
        context["reply_channel"], context["reply_user"] = channel, user
        click = open_click(deps, _retry_opening(deps, body), action.get("value"), clicker, channel, context)
        if click is None:
            return
        record = click.record
        failure_ts = _failure_clicked(record, body)
        if failure_ts is None:  # not after the opening's check; read once more, as the claim needs it
            context[REPLY] = texts.RETRY_TAKEN
            return
        limits = deps.settings_of(record).limits
        claimed = deps.store.admission.claim_retry(
            record,
            failure_ts,
            user,
            max_per_user=limits.max_runs_per_user,
            max_per_channel=limits.max_runs_per_channel,
        )
        if claimed is Accepted.USER_BUSY:  # a retry is a run again: the mention's bounds apply
            text = texts.RETRY_USER_BUSY.format(requests=plural(limits.max_runs_per_user, "request"))
            context[REPLY] = (text, {"who": record.requester})
        elif claimed is Accepted.CHANNEL_BUSY:
            context[REPLY] = texts.RETRY_CHANNEL_BUSY.format(
                requests=plural(limits.max_runs_per_channel, "request")
            )
        elif claimed is not Accepted.NEW:
            context[REPLY] = texts.RETRY_TAKEN
        else:
            deps.enqueue(RETRY_RUN, record.run_id, user)

    return on_retry


def _failure_clicked(record: RunRecord | None, body: dict[str, Any]) -> str | None:
    """The ts of the failure of `record` a Retry click is for, if it is failed: the saved one, or,
    while the worker has yet to save it (its card reaches Slack first), the clicked card's own.

    Only a failure card carries a Retry button, and a retried one loses it (its claim stays):
    the worker that saves this failure finds a claim made on its card before it ended the run.
    """
    if record is None or record.status is not RunStatus.FAILED:
        return None
    if record.failure_ts:
        return record.failure_ts
    try:
        return check_id("ts", as_dict(body.get("container")).get("message_ts"))
    except BadId:
        return None


@dataclass(frozen=True)
class FeedbackRef:
    """What a feedback button names: good or bad, and the run whose answer it is under."""

    verdict: str  # FEEDBACK_GOOD or FEEDBACK_BAD
    run_id: str

    @classmethod
    def parse(cls, value: Any) -> FeedbackRef:
        verdict, _, run = str(value or "").partition(":")
        if verdict not in (FEEDBACK_GOOD, FEEDBACK_BAD):
            raise BadId("not a feedback value")
        return cls(verdict, check_id("run", run))


def _feedback_run(ref: FeedbackRef) -> str:
    return ref.run_id


# Feedback on an answer: anyone in its channel may give it; every refusal reads the same.
_FEEDBACK = Opening(
    FeedbackRef.parse,
    _feedback_run,
    texts.FEEDBACK_UNKNOWN,
    where=Where.RUN_CHANNEL,
    unreadable=texts.FEEDBACK_UNKNOWN,
    wrong_team=texts.FEEDBACK_UNKNOWN,
    wrong_channel=texts.FEEDBACK_UNKNOWN,
)


def _on_feedback(deps: BotDeps) -> Callable[..., None]:
    """`feedback` (Slack's thumbs under an answer, value ``good:RUN`` or ``bad:RUN``): a click goes
    into the feedback stream (not the decisions' audit) with who, which answer and where, and into
    `harness_feedback_total`, unless the clicker is past their share of the minute
    (`FEEDBACK_PER_MINUTE` clicks) or it repeats their feedback on that answer; the clicker hears
    which, in private, and past their share only once that minute."""

    def on_feedback(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = clicker_and_channel(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        click = open_click(deps, _FEEDBACK, action.get("value"), clicker, channel, context)
        if click is None:
            return
        record, verdict = click.record, click.ref.verdict
        try:
            user = check_id("user", clicker.user)
        except BadId:
            return  # Slack always names a user: nobody to record, nobody to tell
        where = {"team": record.team, "channel": record.channel, "thread_ts": record.thread_ts}
        entry = {"event": "feedback", "run_id": record.run_id, "feedback": verdict, "by": user}
        outcome = deps.store.audit.record_feedback(
            {**entry, **where, "requester": record.requester},
            team=record.team,
            user=user,
            run_id=record.run_id,
        )
        if outcome is FeedbackOutcome.RECORDED:
            metrics.incr(deps.store.redis, families.FEEDBACK, feedback=verdict)
        if outcome is not FeedbackOutcome.IGNORED:  # told once a minute that they are past their share
            context[REPLY] = {
                FeedbackOutcome.RECORDED: texts.FEEDBACK_THANKS,
                FeedbackOutcome.SAME: texts.FEEDBACK_SAME,
                FeedbackOutcome.LIMITED: texts.FEEDBACK_LIMITED.format(
                    times=plural(FEEDBACK_PER_MINUTE, "time")
                ),
            }[outcome]

    return on_feedback


def register(app: App, deps: BotDeps, then: Then) -> None:
    """Register this surface's listeners."""
    app.action("stop")(then(_on_stop(deps), tell_clicker))
    app.action("continue")(then(_on_continue(deps), tell_clicker))
    app.action("retry")(then(_on_retry(deps), tell_clicker))
    app.action("feedback")(then(_on_feedback(deps), tell_clicker))
