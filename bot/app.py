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
from harness.config import Config
from harness.state import Decision, StateError, Verdict
from workers.services import RUN_JOB_TIMEOUT
from workers.store import BadId, DecideOutcome, RunRecord, RunStatus, Store, check_id, new_run_id

log = logging.getLogger(__name__)

START_RUN = "workers.jobs.start_run"
APPLY_DECISIONS = "workers.jobs.apply_decisions"
RETRY_RUN = "workers.jobs.retry_run"
REPLY = "ephemeral_reply"  # context key: what the background reply tells the clicker


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

    def enqueue(self, func: str, *args: Any, pipeline: Any = None) -> None:
        self.queue.enqueue_call(func, args=args, timeout=RUN_JOB_TIMEOUT, result_ttl=600, pipeline=pipeline)

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
    app.event("app_mention")(_then(deps, _on_mention(deps), _acknowledge_visibly))
    app.event("message")(_ignore)  # subscribed by some manifests; answered, never retried
    for action_id, verdict in (("approve", Verdict.APPROVED), ("decline", Verdict.DECLINED)):
        app.action(action_id)(_then(deps, _on_decision(deps, verdict), _tell_clicker))
    app.action("decline_with_reason")(_then(deps, _on_decline_with_reason(deps), _tell_clicker))
    app.view("decline_reason")(_then(deps, _on_decline_reason(deps), _tell_clicker))
    app.action("retry")(_then(deps, _on_retry(deps), _tell_clicker))
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
        if event.get("bot_id") or event.get("subtype") or not event.get("user"):
            return  # other bots' (and edited) messages never start runs: no bot loops
        try:
            team = check_id("team", body.get("team_id") or context.team_id)
            event_id = check_id("event", body.get("event_id"))
            channel = check_id("channel", event.get("channel"))
            ts = check_id("ts", event.get("ts"))
            thread_ts = check_id("ts", event.get("thread_ts") or ts)
        except BadId as exc:
            log.warning("ignoring a malformed app_mention: %s", exc)
            return
        record = RunRecord(
            run_id=new_run_id(),
            team=team,
            channel=channel,
            thread_ts=thread_ts,
            requester=str(event["user"]),
            task=str(event.get("text") or "")[:20_000],
        )
        accepted = deps.store.accept_event(
            team, event_id, record, lambda pipe: deps.enqueue(START_RUN, record.run_id, pipeline=pipe)
        )
        context["accepted"] = accepted
        log.info(
            "app_mention %s in %s: %s", event_id, channel, "run " + record.run_id if accepted else "duplicate"
        )

    return on_mention


def _acknowledge_visibly(body: dict[str, Any], context: BoltContext, client: WebClient) -> None:
    """Something visible within a second: an :eyes: reaction on the mention."""
    event = body.get("event") or {}
    if context.get("accepted"):
        try:
            client.reactions_add(channel=event["channel"], timestamp=event["ts"], name="eyes")
        except SlackApiError as exc:
            log.info("could not react to the mention: %s", exc.response.get("error"))


def _ignore() -> None:
    return None


# --- approvals --------------------------------------------------------------------------------------


def _parse_value(value: Any) -> tuple[str, str]:
    run_id, _, call_id = str(value or "").partition(":")
    return check_id("run", run_id), check_id("call", call_id)


def _open_record(
    deps: BotDeps, value: Any, user: str, channel: str | None, context: BoltContext
) -> tuple[RunRecord, str] | None:
    """The run and call a button names, if the clicker may decide it; else a reply is set."""
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
    if channel is not None and channel != record.channel:
        context[REPLY] = texts.WRONG_CHANNEL
        return None
    if not deps.may_decide(user, record):
        context[REPLY] = (texts.NOT_ALLOWED, {"who": deps.deciders(record)})
        return None
    return record, call_id


def _decide(deps: BotDeps, record: RunRecord, call_id: str, decision: Decision, context: BoltContext) -> None:
    try:
        call = next((c for c in record.run_state().pending if c.id == call_id), None)
    except StateError:
        context[REPLY] = texts.UNREADABLE_RUN  # fail closed: no decision on what we cannot read
        return
    result = deps.store.decide(record.run_id, call_id, decision, audit=record.audit_fields(call))
    if result.outcome is DecideOutcome.RECORDED:
        deps.enqueue(APPLY_DECISIONS, record.run_id)
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


def _clicker(body: dict[str, Any]) -> tuple[str, str | None]:
    user = str((body.get("user") or {}).get("id") or "")
    channel = (body.get("channel") or {}).get("id")
    context_channel = channel or (body.get("container") or {}).get("channel_id")
    return user, context_channel


def _on_decision(deps: BotDeps, verdict: Verdict) -> Callable[..., None]:
    def on_decision(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        user, channel = _clicker(body)
        context["reply_channel"], context["reply_user"] = channel, user
        opened = _open_record(deps, action.get("value"), user, channel, context)
        if opened:
            record, call_id = opened
            _decide(deps, record, call_id, Decision(verdict, by=user), context)

    return on_decision


def _on_decline_with_reason(deps: BotDeps) -> Callable[..., None]:
    def on_decline_with_reason(
        ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext, client: WebClient
    ) -> None:
        ack()
        user, channel = _clicker(body)
        context["reply_channel"], context["reply_user"] = channel, user
        opened = _open_record(deps, action.get("value"), user, channel, context)
        if not opened:
            return
        record, call_id = opened
        call = next((c for c in record.run_state().awaiting if c.id == call_id), None)
        if call is None:
            context[REPLY] = texts.UNKNOWN_APPROVAL
            return
        view = render.decline_reason_modal(run_id=record.run_id, call=call)
        client.views_open(trigger_id=body["trigger_id"], view=view)  # trigger_id expires in 3 s

    return on_decline_with_reason


def _on_decline_reason(deps: BotDeps) -> Callable[..., None]:
    def on_decline_reason(ack: Ack, body: dict[str, Any], view: dict[str, Any], context: BoltContext) -> None:
        ack()
        user = str((body.get("user") or {}).get("id") or "")
        values = (view.get("state") or {}).get("values") or {}
        reason = str(((values.get("reason") or {}).get("reason") or {}).get("value") or "").strip()
        opened = _open_record(deps, view.get("private_metadata"), user, None, context)
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
        user, channel = _clicker(body)
        context["reply_channel"], context["reply_user"] = channel, user
        try:
            record = deps.store.load_run(check_id("run", action.get("value")))
        except (BadId, StateError):
            record = None
        if record is None or record.status is not RunStatus.FAILED or not record.failure_ts:
            context[REPLY] = texts.RETRY_TAKEN
            return
        if channel != record.channel:
            context[REPLY] = texts.WRONG_CHANNEL
            return
        if not deps.may_decide(user, record):
            context[REPLY] = (texts.NOT_ALLOWED_RETRY, {"who": deps.deciders(record)})
            return
        if not deps.store.claim_retry(record.run_id, record.failure_ts):
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
    thread_ts = ((body.get("message") or {}).get("thread_ts")) or None
    msg = render.notice(text, **users)
    try:
        client.chat_postEphemeral(
            channel=channel, user=user, text=msg.text, blocks=msg.blocks, thread_ts=thread_ts
        )
    except SlackApiError as exc:
        log.warning("could not send an ephemeral reply: %s", exc.response.get("error"))
