"""The Bolt app: Slack events and button clicks in, Redis writes and RQ jobs out.

Listeners run before Slack gets its answer (`process_before_response=True`), so the job is in
Redis before the 200 and a Redis failure answers 500 (Slack retries). That is why each one does
Redis work only; Slack Web API calls happen in jobs, or in a background thread after the
answer (ephemeral replies). The one exception is `views.open`, whose trigger_id lives 3 s.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import inspect
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import rq
from slack_bolt import Ack, App, BoltContext
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot import edits
from bot.web import bolt_error_handler
from harness.config import Config
from harness.state import Decision, PendingCall, StateError, Verdict
from messages import texts
from messages.arguments import fully_reviewable
from messages.blocks import notice
from messages.cards import grant_revoked
from messages.endings import FEEDBACK_BAD, FEEDBACK_GOOD
from messages.home import HOME_ITEMS_MAX, HomeItem, home_view
from messages.modals import arguments_modal, decline_reason_modal, edit_modal
from workers import deciders, logs, metrics
from workers.services import enqueue_run_job, queued_job
from workers.store import (
    ENDED,
    FEEDBACK_PER_MINUTE,
    IM,
    LIMIT_CALL,
    Accepted,
    BadId,
    DecideOutcome,
    FeedbackOutcome,
    Grant,
    Keys,
    OpenPark,
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
HONOUR_STOP = "workers.jobs.honour_stop"
REPLY = "ephemeral_reply"  # context key: what the background reply tells the clicker
Reply = str | tuple[str, dict[str, str]]  # a text, or a text and the users it names by placeholder
MAX_TASK_CHARS = 20_000
HOME_SCAN = 200  # open parks read at most for one Home tab (from its index), the soonest to expire first
HOME_BATCH = 25  # parks read per round trip: about one tab's worth (HOME_ITEMS_MAX + 1)
AFTER_THREADS = "slack-after"  # the threads that make Slack calls after the answer


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
                self._pool = ThreadPoolExecutor(
                    self._workers, thread_name_prefix=AFTER_THREADS, initializer=_name_os_thread
                )
                self._pid = os.getpid()
            self._pool.submit(contextvars.copy_context().run, _logged, fn, *args)  # its lines name the run


def _name_os_thread() -> None:
    """Name the calling thread for the OS too (`top -H`, /proc/PID/task/TID/comm; Linux only), so
    the CPU of the calls made after the answer can be told apart (tests/bench/bench_ack.py)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(15, AFTER_THREADS.encode())  # 15: PR_SET_NAME


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
    groups: deciders.GroupDirectory = field(default_factory=deciders.GroupDirectory)

    def enqueue(self, func: str, run_id: str, *args: Any) -> None:
        """Enqueue a job about `run_id` with the retry policy every job gets."""
        enqueue_run_job(self.store, self.queue, func, run_id, *args)

    def may_decide(self, user: str, record: RunRecord) -> bool:
        """Whether `user` may decide `record` now (`workers.deciders.may_decide`)."""
        approvals = self.config.approvals
        return deciders.may_decide(user, record, approvals=approvals, groups=self.groups, store=self.store)

    def deciders(self, record: RunRecord) -> list[str]:
        """Who may decide `record` now, users and user groups (`workers.deciders.deciders`)."""
        return deciders.deciders(self.config.approvals, record)


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
    deps.groups.bind(client)

    def then(handler: Callable[..., None], after: Callable[..., None]) -> Callable[..., None]:
        return _then(deps, client, handler, after)

    app.event("app_home_opened")(then(_on_home_opened, _home_publisher(deps)))
    app.event("app_mention")(then(_on_mention(deps), _acknowledge_visibly))
    # Direct messages start runs like mentions; any other message is answered and left alone.
    app.event("message")(then(_on_direct_message(deps), _acknowledge_visibly))
    app.event("assistant_thread_started")(then(_on_assistant_thread_started(deps), _suggest_prompts))
    for action_id, verdict in (("approve", Verdict.APPROVED), ("decline", Verdict.DECLINED)):
        app.action(action_id)(then(_on_decision(deps, verdict), _tell_clicker))
    app.action("approve_thread")(then(_on_decision(deps, Verdict.APPROVED, grant=True), _tell_clicker))
    app.action("edit")(then(_on_edit(deps), _tell_clicker))
    app.view("edit_call")(then(_on_edit_submitted(deps), _tell_clicker))
    app.action("revoke_grant")(then(_on_revoke_grant(deps), _after_revoke))
    app.action("decline_with_reason")(then(_on_decline_with_reason(deps), _tell_clicker))
    app.view("decline_reason")(then(_on_decline_reason(deps), _tell_clicker))
    app.action("retry")(then(_on_retry(deps), _tell_clicker))
    app.action("view_args")(then(_on_view_args(deps), _tell_clicker))
    app.action("continue")(then(_on_continue(deps), _tell_clicker))
    app.action("stop")(then(_on_stop(deps), _tell_clicker))
    app.action("feedback")(then(_on_feedback(deps), _tell_clicker))
    app.event("agent_session_stopped")(then(_on_session_stopped(deps), _tell_clicker))
    return app


def _then(
    deps: BotDeps, client: WebClient, handler: Callable[..., None], after: Callable[..., None]
) -> Callable[..., None]:
    """Run `handler` before Slack gets its answer, then `after` (a Slack call) in the background.

    Bolt's lazy listeners would do the same but deep-copy the whole request first: a fifth of an
    ack's CPU (tests/bench/bench_ack.py). Both are given the app's own `client` (one token, one
    workspace), whose connections stay open between calls, rather than the fresh `WebClient` Bolt
    builds for every request.
    """
    wanted = list(inspect.signature(handler).parameters)

    def listener(
        ack: Ack,
        body: dict[str, Any],
        context: BoltContext,
        action: dict[str, Any] | None = None,
        view: dict[str, Any] | None = None,
        event: dict[str, Any] | None = None,
    ) -> None:
        given = {"ack": ack, "body": body, "context": context, "client": client}
        given.update(action=action, view=view, event=event)
        token = logs.enter(**logs.slack_fields(body))  # every line logged meanwhile names the thread
        try:
            handler(**{name: given[name] for name in wanted})
        finally:
            deps.background.submit(after, body, context, client)
            logs.leave(token)

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
        direct = event.get("channel_type") == IM or channel.startswith("D")  # app_mention has no type
        record = RunRecord(
            run_id=new_run_id(),
            team=team,
            channel=channel,
            thread_ts=thread_ts,
            requester=user,
            task=text[:MAX_TASK_CHARS],
            surface=IM if direct else "channel",
            asked_ts=ts,
        )
        limits = deps.config.limits
        accepted = deps.store.accept_event(
            team,
            _message_key(channel, ts) if direct else event_id,
            record,
            queued_job(deps.queue, START_RUN, record.run_id, job_id=uuid.uuid4().hex),
            max_per_user=limits.max_runs_per_user,
            max_per_channel=limits.max_runs_per_channel,
            counted_in=metrics.mention_counter(),
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


def _acknowledge_visibly(body: dict[str, Any], context: BoltContext, client: WebClient) -> None:
    """Something visible within a second: an :eyes: reaction, or why the mention was not started."""
    event = body.get("event") or {}
    try:
        if context.get("accepted") is Accepted.NEW:
            client.reactions_add(channel=event["channel"], timestamp=event["ts"], name="eyes")
        elif context.get("busy_notice"):
            channel, thread_ts, text = context["busy_notice"]
            msg = notice(text)
            client.chat_postMessage(
                channel=channel, thread_ts=thread_ts, text=msg.text, blocks=msg.blocks, unfurl_links=False
            )
    except SlackApiError as exc:
        log.info("could not acknowledge the mention: %s", exc.response.get("error"))


def _message_key(channel: str, ts: str) -> str:
    """The dedup key of a direct message: Slack sends a DM that mentions the bot twice, as an
    `app_mention` and as a `message`, each with its own event id (and retries each)."""
    return check_id("event", f"im-{channel}-{ts.replace('.', '-')}")


def _on_direct_message(deps: BotDeps) -> Callable[..., None]:
    """`message`: one a person sends the bot directly (`message.im`, the assistant pane's too) starts
    or continues a run like a mention; channel messages, edits and bots' messages are left alone."""
    start = _on_mention(deps)

    def on_direct_message(body: dict[str, Any], event: dict[str, Any], context: BoltContext) -> None:
        if event.get("channel_type") == IM:
            start(body=body, event=event, context=context)  # it leaves subtypes and bots alone

    return on_direct_message


def _on_assistant_thread_started(deps: BotDeps) -> Callable[..., None]:
    """A person opened a new thread in the assistant pane: note where to suggest prompts (once)."""

    def on_thread_started(body: dict[str, Any], event: dict[str, Any], context: BoltContext) -> None:
        thread = _dict(event.get("assistant_thread"))
        try:
            team = check_id("team", body.get("team_id") or context.team_id)
            event_id = check_id("event", body.get("event_id"))
            channel = check_id("channel", thread.get("channel_id"))
            thread_ts = check_id("ts", thread.get("thread_ts"))
        except BadId as exc:
            log.warning("ignoring a malformed assistant_thread_started: %s", exc)
            return
        if deps.store.first_delivery(team, event_id):
            context["suggest_in"] = (channel, thread_ts)

    return on_thread_started


def _suggest_prompts(body: dict[str, Any], context: BoltContext, client: WebClient) -> None:
    """After Slack has its answer: the suggested prompts of a new assistant thread."""
    where = context.get("suggest_in")
    if not where:
        return
    channel, thread_ts = where
    prompts = [{"title": title, "message": message} for title, message in texts.SUGGESTED_PROMPTS]
    try:
        client.assistant_threads_setSuggestedPrompts(
            channel_id=channel, thread_ts=thread_ts, title=texts.SUGGESTED_PROMPTS_TITLE, prompts=prompts
        )
    except SlackApiError as exc:
        log.warning("could not suggest prompts in %s: %s", channel, exc.response.get("error"))


# --- the Home tab: who is waiting on me -------------------------------------------------------------


def _on_home_opened(body: dict[str, Any], event: dict[str, Any], context: BoltContext) -> None:
    """Note whose Home tab to publish; the publish itself happens after Slack has its answer."""
    user, team = event.get("user"), body.get("team_id") or context.team_id
    if event.get("tab") != "home" or not isinstance(user, str) or not deciders.USER_ID.fullmatch(user):
        return  # the Messages tab, or a shape Slack does not send
    if isinstance(team, str):
        context["home_for"] = (team, user)


def _home_publisher(deps: BotDeps) -> Callable[..., None]:
    def publish_home(body: dict[str, Any], context: BoltContext, client: WebClient) -> None:
        wanted = context.get("home_for")
        if not wanted:
            return
        team, user = wanted
        items, more = _waiting_on(deps, team, user)
        items = [replace(item, link=_permalink(client, item)) for item in items]
        view = home_view(items, more=more, at=datetime.now(UTC))
        try:
            client.views_publish(user_id=user, view=view)
        except SlackApiError as exc:
            log.warning("could not publish the Home tab: %s", exc.response.get("error"))

    return publish_home


def _waiting_on(deps: BotDeps, team: str, user: str) -> tuple[list[HomeItem], bool]:
    """The undecided calls of open parks that `user` may decide now, soonest expiry first; and
    whether there are more than the Home tab shows.

    Read from the index of what waits on whom (`Store.open_parks`), never by scanning every parked
    run: an approver's candidates are the team's open parks, a requester's (with no `approvers`)
    their own runs' parks, an `escalate_to`'s the team's parks past their escalation time (those
    expiring soonest: escalation comes a fixed time after a park). At most `HOME_SCAN` candidates
    are read, a batch at a time, until the tab is full; `may_decide` has the last word on each.
    """
    now = time.time()
    items: list[HomeItem] = []
    over: list[OpenPark] = []  # parks the index still holds but that wait on nobody any more
    requesters: dict[str, str] = {}
    try:
        candidates = _home_candidates(deps, team, user, now)
    except BadId:
        return [], False  # a team id of a shape we never write: nothing is parked there
    for start in range(0, len(candidates), HOME_BATCH):
        batch = candidates[start : start + HOME_BATCH]
        for park, (record, decisions) in zip(batch, deps.store.read_parks(batch), strict=True):
            if record is not None:
                requesters[park.run_id] = record.requester
            if not _still_open(record, park, decisions):
                over.append(park)
                continue
            assert record is not None and record.expires_at is not None  # _still_open checked it
            if not deps.may_decide(user, record):
                continue
            try:
                awaiting = record.run_state().awaiting
            except StateError:
                continue
            expires_at = datetime.fromtimestamp(record.expires_at, UTC)
            for call in awaiting:
                if call.id in decisions and decisions[call.id] is None:
                    card = record.cards.get(call.id)
                    items.append(HomeItem(call, record.requester, record.channel, expires_at, card))
        if len(items) > HOME_ITEMS_MAX:
            break  # enough to fill the tab and to know there is more
    deps.store.drop_from_index(team, over, requesters)
    return items[:HOME_ITEMS_MAX], len(items) > HOME_ITEMS_MAX


def _home_candidates(deps: BotDeps, team: str, user: str, now: float) -> list[OpenPark]:
    """The open parks that may wait on `user`, soonest expiry first, at most `HOME_SCAN` of them."""
    approvals = deps.config.approvals
    found: list[OpenPark] = []
    if not approvals.approvers:  # each run's requester decides it
        found += deps.store.open_parks(team, requester=user, now=now, limit=HOME_SCAN)
    elif _is_named(deps, team, user, approvals.approvers):
        found += deps.store.open_parks(team, now=now, limit=HOME_SCAN)
    if approvals.escalate_after_minutes and _is_named(deps, team, user, approvals.escalate_to):
        # `deciders.escalated`: parked at expires_at - expire_after, escalated escalate_after later
        horizon = now + (approvals.expire_after_minutes - approvals.escalate_after_minutes) * 60
        found += deps.store.open_parks(team, now=now, until=horizon, limit=HOME_SCAN)
    unique = {(p.run_id, p.park_id): p for p in found}
    return sorted(unique.values(), key=lambda p: p.expires_at)[:HOME_SCAN]


def _is_named(deps: BotDeps, team: str, user: str, names: Sequence[str]) -> bool:
    """`user` is one of `names`, or a member of a user group among them (as `may_decide` reads it)."""
    return deps.groups.includes(deps.store, team, user, names)


def _still_open(record: RunRecord | None, park: OpenPark, decisions: dict[str, Any]) -> bool:
    """Whether the indexed park still waits on someone: its run parked there, a call undecided."""
    if record is None or record.status is not RunStatus.AWAITING_APPROVAL or record.park_id != park.park_id:
        return False
    return record.expires_at is not None and any(d is None for d in decisions.values())


def _permalink(client: WebClient, item: HomeItem) -> str | None:
    """The link to the call's card, if Slack gives one."""
    if not item.card_ts:
        return None
    try:
        link = client.chat_getPermalink(channel=item.channel, message_ts=item.card_ts).get("permalink")
    except SlackApiError as exc:
        log.info("no permalink for a card in %s: %s", item.channel, exc.response.get("error"))
        return None
    return link if isinstance(link, str) else None


# --- approvals --------------------------------------------------------------------------------------


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


def _open_record(
    deps: BotDeps,
    value: Any,
    clicker: Clicker,
    channel: str | None,
    context: BoltContext,
    *,
    viewing: bool = False,
) -> tuple[RunRecord, CardRef] | None:
    """The run and call a button names, if the clicker may decide it; else a reply is set."""
    user = clicker.user
    try:
        ref = CardRef.parse(value)
    except BadId:
        context[REPLY] = texts.UNKNOWN_APPROVAL
        return None
    try:
        record = deps.store.load_run(ref.run_id)
    except StateError:
        context[REPLY] = texts.UNREADABLE_RUN
        return None
    if record is None:
        context[REPLY] = texts.UNKNOWN_APPROVAL
        return None
    if clicker.team != record.team:
        context[REPLY] = texts.WRONG_TEAM
        return None
    if channel is None:  # a modal's submission names no channel: a refusal is told where the card is
        context["reply_channel"] = record.channel
    if channel is not None and channel != record.channel:
        context[REPLY] = texts.WRONG_CHANNEL
        return None
    if record.status is not RunStatus.AWAITING_APPROVAL:  # decided, resumed, maybe ended meanwhile
        context[REPLY] = _moved_on(deps, record, ref, user)
        return None
    if not (deps.may_decide(user, record) or (viewing and user == record.requester)):
        context[REPLY] = (texts.NOT_ALLOWED, {"who": deps.deciders(record)})
        return None
    return record, ref


def _moved_on(deps: BotDeps, record: RunRecord, ref: CardRef, user: str) -> Reply:
    """The reply to a click on a card whose run has moved on: who decided it, when that is known.

    A second click that arrives after the first one's resume (tens of milliseconds) hears the same
    as one that arrives before it. A person who may not decide learns nothing more than before.
    """
    if not deps.may_decide(user, record):
        return texts.UNKNOWN_APPROVAL
    standing = deps.store.decisions(record.run_id, record.park_id).get(ref.call_id)
    if standing is None:  # a call of an earlier park, or never decided (stopped, expired unrecorded)
        return texts.UNKNOWN_APPROVAL
    if standing.verdict is Verdict.EXPIRED:
        return texts.ALREADY_EXPIRED
    if standing.by:
        return (texts.ALREADY_DECIDED_BY.format(verdict=standing.verdict.value), {"who": standing.by})
    return texts.ALREADY_DECIDED


def _decide(
    deps: BotDeps,
    record: RunRecord,
    ref: CardRef,
    decision: Decision,
    context: BoltContext,
    *,
    grant: Grant | None = None,
) -> None:
    try:
        call = next((c for c in record.run_state().pending if c.id == ref.call_id), None)
    except StateError:
        context[REPLY] = texts.UNREADABLE_RUN  # fail closed: no decision on what we cannot read
        return
    result = deps.store.decide(
        record.run_id,
        record.park_id,
        ref.call_id,
        decision,
        audit=record.audit_fields(call),
        fingerprint=ref.fingerprint,
        required=deps.config.approvals.required,
        grant=grant,
    )
    if result.outcome is DecideOutcome.RECORDED:  # noted before the resume job exists: it reads the note
        metrics.decided(deps.store.redis, record, decision.verdict, deps.config.approvals)
    if result.outcome in (DecideOutcome.RECORDED, DecideOutcome.EXPIRED, DecideOutcome.COUNTED):
        deps.enqueue(APPLY_DECISIONS, record.run_id)
    if result.outcome is DecideOutcome.RECORDED:
        return
    if result.outcome is DecideOutcome.COUNTED:
        required = deps.config.approvals.required
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


def _on_decision(deps: BotDeps, verdict: Verdict, *, grant: bool = False) -> Callable[..., None]:
    def on_decision(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = _clicker(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        opened = _open_record(deps, action.get("value"), clicker, channel, context)
        if not opened:
            return
        record, ref = opened
        if verdict is Verdict.APPROVED and not _may_approve(deps, record, ref, clicker.user, context):
            return
        if not grant:
            _decide(deps, record, ref, Decision(verdict, by=clicker.user), context)
            return
        approvals = deps.config.approvals
        call = _awaiting_call(record, ref.call_id)
        if approvals.grant_minutes <= 0 or approvals.required > 1 or call is None:
            context[REPLY] = texts.NO_GRANTS if call is not None else texts.UNKNOWN_APPROVAL
            return
        try:
            key = Keys.grant(record.team, record.channel, record.thread_ts, call.name)
        except BadId:
            context[REPLY] = texts.NO_GRANTS
            return
        until = time.time() + approvals.grant_minutes * 60
        given = Grant(key, call.name, clicker.user, record.requester, until, record.run_id)
        _decide(deps, record, ref, Decision(verdict, by=clicker.user, grant="given"), context, grant=given)

    return on_decision


def _may_approve(deps: BotDeps, record: RunRecord, ref: CardRef, user: str, context: BoltContext) -> bool:
    """Whether `user` may approve (not only decline) the call: four eyes, and arguments one can read."""
    if deciders.self_approval_refused(deps.config.approvals, user, record):
        context[REPLY] = texts.NO_SELF_APPROVAL  # their decline still counts
        return False
    if not _reviewable(record, ref.call_id):
        context[REPLY] = texts.NOT_REVIEWABLE  # nobody approves bytes they could not have read
        return False
    return True


def _awaiting_call(record: RunRecord, call_id: str) -> PendingCall | None:
    try:
        return next((c for c in record.run_state().awaiting if c.id == call_id), None)
    except StateError:
        return None


def _reviewable(record: RunRecord, call_id: str) -> bool:
    try:
        call = next((c for c in record.run_state().pending if c.id == call_id), None)
    except StateError:
        return True  # _decide refuses an unreadable state itself, with its own reply
    return call is None or fully_reviewable(call)


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
        record, ref = opened
        call = _awaiting_call(record, ref.call_id)
        trigger_id = body.get("trigger_id")
        if call is None or not isinstance(trigger_id, str):
            context[REPLY] = texts.UNKNOWN_APPROVAL
            return
        client.views_open(trigger_id=trigger_id, view=build(record, call))

    return open_modal


def _on_view_args(deps: BotDeps) -> Callable[..., None]:
    def build(record: RunRecord, call: PendingCall) -> dict[str, Any]:
        preview = record.call_tools.get(call.id, {}).get("preview")
        return arguments_modal(call=call, preview=preview if isinstance(preview, str) else None)

    return _modal_opener(deps, build, viewing=True)


def _on_decline_with_reason(deps: BotDeps) -> Callable[..., None]:
    return _modal_opener(
        deps, lambda record, call: decline_reason_modal(run_id=record.run_id, call=call), viewing=False
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
        record, ref = opened
        context["reply_channel"] = record.channel
        _decide(deps, record, ref, Decision(Verdict.DECLINED, by=user, reason=reason[:500] or None), context)

    return on_decline_reason


def _on_edit(deps: BotDeps) -> Callable[..., None]:
    def build(record: RunRecord, call: PendingCall) -> dict[str, Any]:
        schema = record.call_tools.get(call.id, {}).get("schema")
        return edit_modal(run_id=record.run_id, call=call, schema=schema)

    return _modal_opener(deps, build, viewing=False)


def _on_edit_submitted(deps: BotDeps) -> Callable[..., None]:
    """`edit_call`: validate the edited arguments (schema, then policy) inside the modal; approve them."""

    def on_edit_submitted(ack: Ack, body: dict[str, Any], view: dict[str, Any], context: BoltContext) -> None:
        clicker = Clicker.of(body)
        context["reply_user"] = clicker.user
        opened = _open_record(deps, view.get("private_metadata"), clicker, None, context)
        if not opened:
            ack()
            return
        record, ref = opened
        context["reply_channel"] = record.channel
        call = _awaiting_call(record, ref.call_id)
        if call is None or call.fingerprint != ref.fingerprint:
            ack()
            context[REPLY] = texts.STALE_CARD if call is not None else texts.UNKNOWN_APPROVAL
            return
        edited, errors = edits.read(view, call, record.call_tools.get(call.id, {}), deps.config)
        if not errors and deps.config.approvals.required > 1:
            errors = {edits.first_block(view, call): texts.NO_EDIT_WITH_QUORUM}
        if not errors and deciders.self_approval_refused(deps.config.approvals, clicker.user, record):
            errors = {edits.first_block(view, call): texts.NO_SELF_APPROVAL}
        if errors:
            ack(response_action="errors", errors=errors)  # the modal stays open; nothing is decided
            return
        ack()
        changed = edited if edited != call.input else None
        _decide(deps, record, ref, Decision(Verdict.APPROVED, by=clicker.user, edited_input=changed), context)

    return on_edit_submitted


def _on_revoke_grant(deps: BotDeps) -> Callable[..., None]:
    def on_revoke(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = _clicker(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        run_id, _, tool = str(action.get("value") or "").partition(":")
        try:
            record = deps.store.load_run(check_id("run", run_id))
            check_id("tool", tool)
        except (BadId, StateError):
            record = None
        if record is None or clicker.team != record.team or channel != record.channel:
            context[REPLY] = texts.NO_SUCH_GRANT
            return
        grant = deps.store.grant(record.team, record.channel, record.thread_ts, tool)
        allowed = clicker.user in (record.requester, grant.by if grant else None)
        if not (allowed or deps.may_decide(clicker.user, record)):
            context[REPLY] = (texts.NOT_ALLOWED_REVOKE, {"who": deps.deciders(record)})
            return
        if grant is None or not deps.store.revoke_grant(record.team, record.channel, record.thread_ts, tool):
            context[REPLY] = texts.NO_SUCH_GRANT
            return
        context["revoked"] = (tool, clicker.user)

    return on_revoke


def _after_revoke(body: dict[str, Any], context: BoltContext, client: WebClient) -> None:
    """The grant's message loses its button and says who revoked it; or the clicker hears why not."""
    revoked = context.get("revoked")
    message = _dict(body.get("message"))
    channel = context.get("reply_channel")
    if revoked and channel and message.get("ts"):
        tool, by = revoked
        msg = grant_revoked(tool=tool, by=by, at=datetime.now(UTC))
        try:
            client.chat_update(channel=channel, ts=message["ts"], text=msg.text, blocks=msg.blocks)
        except SlackApiError as exc:
            log.warning("could not mark the grant revoked: %s", exc.response.get("error"))
    _tell_clicker(body, context, client)


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
        limits = deps.config.limits
        claimed = deps.store.claim_retry(
            record,
            record.failure_ts,
            user,
            max_per_user=limits.max_runs_per_user,
            max_per_channel=limits.max_runs_per_channel,
        )
        if claimed is Accepted.USER_BUSY:  # a retry is a run again: the mention's bounds apply
            text = texts.RETRY_USER_BUSY.format(limit=limits.max_runs_per_user)
            context[REPLY] = (text, {"who": record.requester})
        elif claimed is Accepted.CHANNEL_BUSY:
            context[REPLY] = texts.RETRY_CHANNEL_BUSY.format(limit=limits.max_runs_per_channel)
        elif claimed is not Accepted.NEW:
            context[REPLY] = texts.RETRY_TAKEN
        else:
            deps.enqueue(RETRY_RUN, record.run_id, user)

    return on_retry


def _on_feedback(deps: BotDeps) -> Callable[..., None]:
    """`feedback` (Slack's thumbs under an answer, value ``good:RUN`` or ``bad:RUN``): a click goes
    into the feedback stream (not the decisions' audit) with who, which answer and where, and into
    `harness_feedback_total`, unless it repeats the clicker's feedback on that answer or they are
    past their share of the minute (`FEEDBACK_PER_MINUTE`); the clicker hears which, in private."""

    def on_feedback(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = _clicker(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        verdict, _, run = str(action.get("value") or "").partition(":")
        try:
            good = verdict in (FEEDBACK_GOOD, FEEDBACK_BAD)
            record = deps.store.load_run(check_id("run", run)) if good else None
        except (BadId, StateError):
            record = None
        if record is None or clicker.team != record.team or channel != record.channel:
            context[REPLY] = texts.FEEDBACK_UNKNOWN
            return
        try:
            user = check_id("user", clicker.user)
        except BadId:
            return  # Slack always names a user: nobody to record, nobody to tell
        where = {"team": record.team, "channel": record.channel, "thread_ts": record.thread_ts}
        entry = {"event": "feedback", "run_id": record.run_id, "feedback": verdict, "by": user}
        outcome = deps.store.record_feedback(
            {**entry, **where, "requester": record.requester},
            team=record.team,
            user=user,
            run_id=record.run_id,
        )
        if outcome is FeedbackOutcome.RECORDED:
            metrics.incr(deps.store.redis, metrics.FEEDBACK, feedback=verdict)
        context[REPLY] = {
            FeedbackOutcome.RECORDED: texts.FEEDBACK_THANKS,
            FeedbackOutcome.SAME: texts.FEEDBACK_SAME,
            FeedbackOutcome.LIMITED: texts.FEEDBACK_LIMITED.format(limit=FEEDBACK_PER_MINUTE),
        }[outcome]

    return on_feedback


# --- Stop, and limits that ask ---------------------------------------------------------------------


def _on_stop(deps: BotDeps) -> Callable[..., None]:
    """`stop`: on a limit card (value `run:limit`) it answers the limit; on the "Working on it…"
    message (value: the run id) it stops the run."""

    def on_stop(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = _clicker(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        run_id, _, what = str(action.get("value") or "").partition(":")
        if what == LIMIT_CALL:
            _answer_limit(deps, run_id, Verdict.DECLINED, clicker, channel, context)
        elif what:
            context[REPLY] = texts.STOP_UNKNOWN
        else:
            _request_stop(deps, run_id, clicker, channel, context)

    return on_stop


def _on_continue(deps: BotDeps) -> Callable[..., None]:
    def on_continue(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = _clicker(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        run_id, _, what = str(action.get("value") or "").partition(":")
        if what != LIMIT_CALL:
            context[REPLY] = texts.LIMIT_NOT_OPEN
            return
        _answer_limit(deps, run_id, Verdict.APPROVED, clicker, channel, context)

    return on_continue


def _on_session_stopped(deps: BotDeps) -> Callable[..., None]:
    """Slack's own stop button (`agent_session_stopped`): the same as Stop on the thread's run."""

    def on_session_stopped(body: dict[str, Any], event: dict[str, Any], context: BoltContext) -> None:
        try:
            team = check_id("team", body.get("team_id") or context.team_id)
            event_id = check_id("event", body.get("event_id"))
            user = check_id("user", event.get("user"))
            channel = check_id("channel", event.get("channel"))
            thread_ts = check_id("ts", event.get("thread_ts"))
        except BadId as exc:
            log.warning("ignoring a malformed agent_session_stopped: %s", exc)
            return
        if not deps.store.first_delivery(team, event_id):
            return  # a retry of a delivery already acted on
        context["reply_channel"], context["reply_user"], context["reply_thread"] = channel, user, thread_ts
        run_id = deps.store.thread_run(team, channel, thread_ts)
        if run_id is None:
            context[REPLY] = texts.STOP_NOTHING_RUNNING
            return
        _request_stop(deps, run_id, Clicker(user, team), channel, context)

    return on_session_stopped


def _clicked_run(
    deps: BotDeps, run_id: str, clicker: Clicker, channel: str | None, context: BoltContext
) -> RunRecord | None:
    """The run a Stop or Continue names, if it is of this workspace and channel; else a reply is set."""
    try:
        record = deps.store.load_run(check_id("run", run_id))
    except BadId:
        record = None
    except StateError:
        context[REPLY] = texts.UNREADABLE_RUN
        return None
    if record is None:
        context[REPLY] = texts.STOP_UNKNOWN
    elif clicker.team != record.team:
        context[REPLY] = texts.WRONG_TEAM
    elif channel is not None and channel != record.channel:
        context[REPLY] = texts.WRONG_CHANNEL
    else:
        return record
    return None


def _request_stop(
    deps: BotDeps, run_id: str, clicker: Clicker, channel: str | None, context: BoltContext
) -> None:
    """Record the first Stop of a run (by its requester or one who may decide) and have it acted on."""
    record = _clicked_run(deps, run_id, clicker, channel, context)
    if record is None:
        return
    if clicker.user != record.requester and not deps.may_decide(clicker.user, record):
        stoppers = list(dict.fromkeys([record.requester, *deps.deciders(record)]))
        context[REPLY] = (texts.STOP_NOT_ALLOWED, {"who": stoppers})
        return
    if record.status is RunStatus.STOPPED and record.stopped_by:
        context[REPLY] = (texts.STOP_ALREADY_STOPPED, {"who": record.stopped_by})
        return
    if record.status in ENDED:
        context[REPLY] = texts.STOP_ENDED
        return
    first = deps.store.request_stop(record.run_id, clicker.user)
    if first is not None:
        context[REPLY] = (texts.STOP_ALREADY, {"who": first})
        return
    # A driven run sees the request before its next step; this job stops a parked one at once.
    deps.enqueue(HONOUR_STOP, record.run_id)


def _answer_limit(
    deps: BotDeps, run_id: str, verdict: Verdict, clicker: Clicker, channel: str | None, context: BoltContext
) -> None:
    """Record Continue (approved) or Stop (declined) for a run parked at a limit: the same deciders,
    four eyes and quorum as a call's approval (one Stop stops)."""
    record = _clicked_run(deps, run_id, clicker, channel, context)
    if record is None:
        return
    if record.status is not RunStatus.AWAITING_APPROVAL:
        context[REPLY] = texts.LIMIT_NOT_OPEN
        return
    if not deps.may_decide(clicker.user, record):
        context[REPLY] = (texts.LIMIT_NOT_ALLOWED, {"who": deps.deciders(record)})
        return
    approvals = deps.config.approvals
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
    result = deps.store.decide(
        record.run_id, record.park_id, LIMIT_CALL, decision, audit=audit, required=approvals.required
    )
    if result.outcome is DecideOutcome.RECORDED:  # noted before the resume job exists: it reads the note
        metrics.decided(deps.store.redis, record, verdict, approvals)
    if result.outcome in (DecideOutcome.RECORDED, DecideOutcome.EXPIRED, DecideOutcome.COUNTED):
        deps.enqueue(APPLY_DECISIONS, record.run_id)  # a Continue that counted: the card shows it
    if result.outcome is DecideOutcome.RECORDED:
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


def _tell_clicker(body: dict[str, Any], context: BoltContext, client: WebClient) -> None:
    """After Slack has its answer: an ephemeral reply when a click changed nothing."""
    reply, channel, user = context.get(REPLY), context.get("reply_channel"), context.get("reply_user")
    if not (reply and channel and user):
        return
    text, users = reply if isinstance(reply, tuple | list) else (reply, {})
    thread_ts = _dict(body.get("message")).get("thread_ts") or context.get("reply_thread") or None
    msg = notice(text, **users)
    try:
        client.chat_postEphemeral(
            channel=channel, user=user, text=msg.text, blocks=msg.blocks, thread_ts=thread_ts
        )
    except SlackApiError as exc:
        log.warning("could not send an ephemeral reply: %s", exc.response.get("error"))
