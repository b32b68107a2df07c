"""The Bolt app: Slack events and button clicks in, Redis writes and RQ jobs out.

Listeners run before Slack gets its answer (`process_before_response=True`), so the job is in
Redis before the 200 and a Redis failure answers 500 (Slack retries). That is why each one does
Redis work only; Slack Web API calls happen in jobs, or in a background thread after the
answer (ephemeral replies). The one exception is `views.open`, whose trigger_id lives 3 s.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import rq
from slack_bolt import Ack, App, BoltContext
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot import render, texts
from bot.web import bolt_error_handler
from harness.config import Config
from harness.state import Decision, PendingCall, StateError, Verdict
from workers.services import enqueue_run_job
from workers.store import (
    Accepted,
    BadId,
    DecideOutcome,
    RunRecord,
    RunStatus,
    Store,
    check_id,
    new_run_id,
)

log = logging.getLogger(__name__)

START_RUN = "workers.jobs.start_run"
APPLY_DECISIONS = "workers.jobs.apply_decisions"
RETRY_RUN = "workers.jobs.retry_run"
REPLY = "ephemeral_reply"  # context key: what the background reply tells the clicker
MAX_TASK_CHARS = 20_000


class Background:
    """A small thread pool for Slack calls made after the answer; safe across gunicorn's fork."""

    def __init__(self, workers: int = 4) -> None:
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():  # a forked child has no threads
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="slack-after")
                self._pid = os.getpid()
            self._pool.submit(_logged, fn, *args)


def _logged(fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # a courtesy call must never take a thread down silently
        log.exception("background Slack call %s failed", getattr(fn, "__name__", fn))


@dataclass(frozen=True)
class BotDeps:
    """What the listeners need: the store, the queue and the config."""

    store: Store
    queue: rq.Queue
    config: Config
    background: Background = field(default_factory=lambda: Background())

    def enqueue(self, func: str, run_id: str, *args: Any) -> None:
        """Enqueue a job about `run_id` with the retry policy every job gets."""
        enqueue_run_job(self.store, self.queue, func, run_id, *args)

    def may_decide(self, user: str, record: RunRecord) -> bool:
        return user in (self.config.approvals.approvers or (record.requester,))

    def deciders(self, record: RunRecord) -> list[str]:
        return list(self.config.approvals.approvers or (record.requester,))


def create_app(
    deps: BotDeps, *, client: WebClient, signing_secret: str | None, token_verification: bool = True
) -> App:
    """The Bolt app with every listener registered; `client` is the Web API client on SLACK_API_URL."""
    app = App(
        client=client,
        signing_secret=signing_secret,
        process_before_response=True,
        token_verification_enabled=token_verification,
        logger=logging.getLogger("slack_bolt.App"),
    )
    app.error(bolt_error_handler)  # 400 for what a retry cannot cure; 500 only when Redis is down
    app.event("app_mention")(_then(deps, _on_mention(deps), _acknowledge_visibly))
    app.event("message")(_ignore)  # subscribed by some manifests; answered, never retried
    for action_id, verdict in (("approve", Verdict.APPROVED), ("decline", Verdict.DECLINED)):
        app.action(action_id)(_then(deps, _on_decision(deps, verdict), _tell_clicker))
    app.action("decline_with_reason")(_then(deps, _on_decline_with_reason(deps), _tell_clicker))
    app.view("decline_reason")(_then(deps, _on_decline_reason(deps), _tell_clicker))
    app.action("retry")(_then(deps, _on_retry(deps), _tell_clicker))
    app.action("view_args")(_then(deps, _on_view_args(deps), _tell_clicker))
    return app


def _then(deps: BotDeps, handler: Callable[..., None], after: Callable[..., None]) -> Callable[..., None]:
    """Run `handler` before Slack gets its answer, then `after` (a Slack call) in the background.

    Bolt's lazy listeners would do the same but deep-copy the whole request first: a fifth of an
    ack's CPU (tests/bench/bench_ack.py).
    """
    wanted = list(inspect.signature(handler).parameters)

    def listener(
        ack: Ack,
        body: dict[str, Any],
        context: BoltContext,
        client: WebClient,
        action: dict[str, Any] | None = None,
        view: dict[str, Any] | None = None,
        event: dict[str, Any] | None = None,
    ) -> None:
        given = {"ack": ack, "body": body, "context": context, "client": client}
        given.update(action=action, view=view, event=event)
        try:
            handler(**{name: given[name] for name in wanted})
        finally:
            deps.background.submit(after, body, context, client)

    return listener


# --- mentions ---------------------------------------------------------------------------------------


def _on_mention(deps: BotDeps) -> Callable[..., None]:
    def on_mention(body: dict[str, Any], event: dict[str, Any], context: BoltContext) -> None:
        if event.get("bot_id") or event.get("subtype"):
            return  # other bots' (and edited) messages never start runs: no bot loops
        try:
            team = check_id("team", body.get("team_id") or context.team_id)
            event_id = check_id("event", body.get("event_id"))
            user = check_id("user", event.get("user"))
            channel = check_id("channel", event.get("channel"))
            ts = check_id("ts", event.get("ts"))
            thread_ts = check_id("ts", event.get("thread_ts") or ts)
        except BadId as exc:
            log.warning("ignoring a malformed app_mention: %s", exc)
            return
        text = event.get("text")
        if not isinstance(text, str):
            log.warning("ignoring an app_mention whose text is not a string")
            return
        record = RunRecord(
            run_id=new_run_id(),
            team=team,
            channel=channel,
            thread_ts=thread_ts,
            requester=user,
            task=text[:MAX_TASK_CHARS],
        )
        limits = deps.config.limits
        accepted = deps.store.accept_event(
            team,
            event_id,
            record,
            lambda pipe: _enqueue_start(deps, record.run_id, pipe),
            max_per_user=limits.max_runs_per_user,
            max_per_channel=limits.max_runs_per_channel,
        )
        context["accepted"] = accepted
        busy = {
            Accepted.USER_BUSY: limits.max_runs_per_user,
            Accepted.CHANNEL_BUSY: limits.max_runs_per_channel,
        }
        if accepted in busy and deps.store.first_busy_notice(team, user):
            text = texts.BUSY_USER if accepted is Accepted.USER_BUSY else texts.BUSY_CHANNEL
            context["busy_notice"] = (channel, thread_ts, text.format(limit=busy[accepted]))
        log.info("app_mention %s in %s: %s", event_id, channel, accepted.value)

    return on_mention


def _enqueue_start(deps: BotDeps, run_id: str, pipe: Any) -> None:
    enqueue_run_job(deps.store, deps.queue, START_RUN, run_id, pipeline=pipe)


def _acknowledge_visibly(body: dict[str, Any], context: BoltContext, client: WebClient) -> None:
    """Something visible within a second: an :eyes: reaction, or why the mention was not started."""
    event = body.get("event") or {}
    try:
        if context.get("accepted") is Accepted.NEW:
            client.reactions_add(channel=event["channel"], timestamp=event["ts"], name="eyes")
        elif context.get("busy_notice"):
            channel, thread_ts, text = context["busy_notice"]
            msg = render.notice(text)
            client.chat_postMessage(
                channel=channel, thread_ts=thread_ts, text=msg.text, blocks=msg.blocks, unfurl_links=False
            )
    except SlackApiError as exc:
        log.info("could not acknowledge the mention: %s", exc.response.get("error"))


def _ignore() -> None:
    return None


# --- approvals --------------------------------------------------------------------------------------


def _parse_value(value: Any) -> tuple[str, str]:
    run_id, _, call_id = str(value or "").partition(":")
    return check_id("run", run_id), check_id("call", call_id)


def _open_record(
    deps: BotDeps,
    value: Any,
    clicker: Clicker,
    channel: str | None,
    context: BoltContext,
    *,
    viewing: bool = False,
) -> tuple[RunRecord, str] | None:
    """The run and call a button names, if the clicker may decide it; else a reply is set."""
    user = clicker.user
    try:
        run_id, call_id = _parse_value(value)
    except BadId:
        context[REPLY] = texts.UNKNOWN_APPROVAL
        return None
    try:
        record = deps.store.load_run(run_id)
    except StateError:
        context[REPLY] = texts.UNREADABLE_RUN
        return None
    if record is None or record.status is not RunStatus.AWAITING_APPROVAL:
        context[REPLY] = texts.UNKNOWN_APPROVAL
        return None
    if clicker.team != record.team:
        context[REPLY] = texts.WRONG_TEAM
        return None
    if channel is not None and channel != record.channel:
        context[REPLY] = texts.WRONG_CHANNEL
        return None
    if not (deps.may_decide(user, record) or (viewing and user == record.requester)):
        context[REPLY] = (texts.NOT_ALLOWED, {"who": deps.deciders(record)})
        return None
    return record, call_id


def _decide(deps: BotDeps, record: RunRecord, call_id: str, decision: Decision, context: BoltContext) -> None:
    try:
        call = next((c for c in record.run_state().pending if c.id == call_id), None)
    except StateError:
        context[REPLY] = texts.UNREADABLE_RUN  # fail closed: no decision on what we cannot read
        return
    result = deps.store.decide(
        record.run_id, record.park_id, call_id, decision, audit=record.audit_fields(call)
    )
    if result.outcome in (DecideOutcome.RECORDED, DecideOutcome.EXPIRED):
        deps.enqueue(APPLY_DECISIONS, record.run_id)
    if result.outcome is DecideOutcome.RECORDED:
        return
    if result.outcome is DecideOutcome.UNKNOWN:
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


@dataclass(frozen=True)
class Clicker:
    """Who clicked, from which workspace (an org-wide install sends `team: null`: the user's team)."""

    user: str
    team: str | None

    @classmethod
    def of(cls, body: dict[str, Any]) -> Clicker:
        user = _dict(body.get("user"))
        team = _dict(body.get("team")).get("id") or user.get("team_id")
        uid = user.get("id")
        return cls(uid if isinstance(uid, str) else "", team if isinstance(team, str) else None)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _clicker(body: dict[str, Any]) -> tuple[Clicker, str | None]:
    channel = _dict(body.get("channel")).get("id") or _dict(body.get("container")).get("channel_id")
    return Clicker.of(body), channel if isinstance(channel, str) else None


def _on_decision(deps: BotDeps, verdict: Verdict) -> Callable[..., None]:
    def on_decision(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = _clicker(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        opened = _open_record(deps, action.get("value"), clicker, channel, context)
        if not opened:
            return
        record, call_id = opened
        if verdict is Verdict.APPROVED and not _reviewable(record, call_id):
            context[REPLY] = texts.NOT_REVIEWABLE  # nobody approves bytes they could not have read
            return
        _decide(deps, record, call_id, Decision(verdict, by=clicker.user), context)

    return on_decision


def _reviewable(record: RunRecord, call_id: str) -> bool:
    try:
        call = next((c for c in record.run_state().pending if c.id == call_id), None)
    except StateError:
        return True  # _decide refuses an unreadable state itself, with its own reply
    return call is None or render.fully_reviewable(call)


def _modal_opener(
    deps: BotDeps, build: Callable[[RunRecord, PendingCall], dict[str, Any]], *, viewing: bool
) -> Callable[..., None]:
    """A listener for a card button that opens a modal about its call (at once: trigger_id lives 3 s).

    `viewing`: the requester may open it too, not only those who may decide.
    """

    def open_modal(
        ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext, client: WebClient
    ) -> None:
        ack()
        clicker, channel = _clicker(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        opened = _open_record(deps, action.get("value"), clicker, channel, context, viewing=viewing)
        if not opened:
            return
        record, call_id = opened
        call = next((c for c in record.run_state().awaiting if c.id == call_id), None)
        trigger_id = body.get("trigger_id")
        if call is None or not isinstance(trigger_id, str):
            context[REPLY] = texts.UNKNOWN_APPROVAL
            return
        client.views_open(trigger_id=trigger_id, view=build(record, call))

    return open_modal


def _on_view_args(deps: BotDeps) -> Callable[..., None]:
    return _modal_opener(deps, lambda record, call: render.arguments_modal(call=call), viewing=True)


def _on_decline_with_reason(deps: BotDeps) -> Callable[..., None]:
    return _modal_opener(
        deps, lambda record, call: render.decline_reason_modal(run_id=record.run_id, call=call), viewing=False
    )


def _on_decline_reason(deps: BotDeps) -> Callable[..., None]:
    def on_decline_reason(ack: Ack, body: dict[str, Any], view: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker = Clicker.of(body)
        user = clicker.user
        values = _dict(_dict(view.get("state")).get("values"))
        raw_reason = _dict(_dict(values.get("reason")).get("reason")).get("value")
        reason = (raw_reason if isinstance(raw_reason, str) else "").strip()
        opened = _open_record(deps, view.get("private_metadata"), clicker, None, context)
        context["reply_user"] = user
        if not opened:
            return
        record, call_id = opened
        context["reply_channel"] = record.channel
        _decide(
            deps, record, call_id, Decision(Verdict.DECLINED, by=user, reason=reason[:500] or None), context
        )

    return on_decline_reason


def _on_retry(deps: BotDeps) -> Callable[..., None]:
    def on_retry(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = _clicker(body)
        user = clicker.user
        context["reply_channel"], context["reply_user"] = channel, user
        try:
            record = deps.store.load_run(check_id("run", action.get("value")))
        except (BadId, StateError):
            record = None
        if record is None or record.status is not RunStatus.FAILED or not record.failure_ts:
            context[REPLY] = texts.RETRY_TAKEN
            return
        if clicker.team != record.team:
            context[REPLY] = texts.WRONG_TEAM
            return
        if channel != record.channel:
            context[REPLY] = texts.WRONG_CHANNEL
            return
        if not deps.may_decide(user, record):
            context[REPLY] = (texts.NOT_ALLOWED_RETRY, {"who": deps.deciders(record)})
            return
        if not deps.store.claim_retry(record.run_id, record.failure_ts, user):
            context[REPLY] = texts.RETRY_TAKEN
            return
        deps.enqueue(RETRY_RUN, record.run_id, user)

    return on_retry


def _tell_clicker(body: dict[str, Any], context: BoltContext, client: WebClient) -> None:
    """After Slack has its answer: an ephemeral reply when a click changed nothing."""
    reply, channel, user = context.get(REPLY), context.get("reply_channel"), context.get("reply_user")
    if not (reply and channel and user):
        return
    text, users = reply if isinstance(reply, tuple | list) else (reply, {})
    thread_ts = _dict(body.get("message")).get("thread_ts") or None
    msg = render.notice(text, **users)
    try:
        client.chat_postEphemeral(
            channel=channel, user=user, text=msg.text, blocks=msg.blocks, thread_ts=thread_ts
        )
    except SlackApiError as exc:
        log.warning("could not send an ephemeral reply: %s", exc.response.get("error"))
