"""Mentions and direct messages: each starts (or continues) a run in its thread.

A mention is acked with the run and its job written in one step (deduplicated by Slack's event id,
or for a DM by its message), then :eyes: (or why it was not started) after Slack has its answer.
A requester the profile leaves out, or a daily budget already spent, starts nothing: the requester
gets an ephemeral reply saying why. A mention past a bound of runs is told so in its thread, at most
once a minute per requester; within that minute the requester gets it as an ephemeral reply instead:
no mention is refused silently (Slack's retries of one aside: they are the same mention).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slack_bolt import App, BoltContext
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.listening import (
    START_RUN,
    BotDeps,
    Then,
    group_handles,
)
from gates import budgets
from messages import texts
from messages.blocks import notice
from messages.metadata import BUSY_KEY, tagged
from messages.text import plural
from observe import metrics, tracing
from runtime.queue import queued_job
from store import (
    IM,
    Accepted,
    BadId,
    RunRecord,
    check_id,
    new_run_id,
)

log = logging.getLogger(__name__)

MAX_TASK_CHARS = 20_000

# What the listener leaves in the request's context for `acknowledge_visibly`, after Slack's answer.
ACCEPTED, REFUSAL, BUSY_NOTICE = "accepted", "refusal", "busy_notice"


@dataclass(frozen=True)
class Refusal:
    """Why a mention started nothing, told to its author alone (`users`: who is named in it)."""

    channel: str
    thread_ts: str
    user: str
    text: str
    users: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class BusyNotice:
    """The thread is told the bound of runs is reached (once a minute per person; else a `Refusal`)."""

    channel: str
    thread_ts: str
    text: str


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
        # Who may ask, and what a run gets, is the channel's profile as configured now, in an old
        # thread too: the worker says so in the thread when that is not the profile it kept.
        settings = deps.config.for_run(channel, team)
        if settings.requesters and not deps.groups.includes(deps.store, team, user, settings.requesters):
            log.info(
                "app_mention %s in %s: %s may not start runs under profile %s",
                event_id,
                channel,
                user,
                settings.profile,
            )
            context[REFUSAL] = Refusal(
                channel,
                thread_ts,
                user,
                texts.NOT_A_REQUESTER.format(profile=settings.profile),
                {"who": list(settings.requesters)},
            )
            return
        spent = budgets.refusal(deps.store, settings, team, user, channel)
        if spent is not None:
            log.info("app_mention %s in %s: a daily budget is spent; nothing started", event_id, channel)
            if deps.store.admission.first_delivery(team, _message_key(channel, ts) if direct else event_id):
                context[REFUSAL] = Refusal(
                    channel, thread_ts, user, spent
                )  # one reply, Slack's retries aside
            return
        run_id = new_run_id()
        # The run's trace starts here; the run keeps its traceparent, so every job continues it.
        with tracing.run_started(
            run_id, model=settings.model, team=team, channel=channel, requester=user
        ) as root:
            record = RunRecord(
                run_id=run_id,
                team=team,
                channel=channel,
                thread_ts=thread_ts,
                requester=user,
                task=text[:MAX_TASK_CHARS],
                surface=IM if direct else "channel",
                asked_ts=ts,
                profile=settings.profile or "",
                trace=root.traceparent,
            )
            limits = settings.limits
            accepted = deps.store.admission.accept_event(
                team,
                _message_key(channel, ts) if direct else event_id,
                record,
                queued_job(deps.queue, START_RUN, record.run_id, job_id=uuid.uuid4().hex),
                max_per_user=limits.max_runs_per_user,
                max_per_channel=limits.max_runs_per_channel,
                counted_in=metrics.mention_counter(),
            )
            root.set("harness.mention.accepted", accepted.value)
        context[ACCEPTED] = accepted
        busy = {
            Accepted.USER_BUSY: limits.max_runs_per_user,
            Accepted.CHANNEL_BUSY: limits.max_runs_per_channel,
        }
        if accepted in busy:
            text = texts.BUSY_USER if accepted is Accepted.USER_BUSY else texts.BUSY_CHANNEL
            said = text.format(requests=plural(busy[accepted], "request"))
            if deps.store.admission.first_busy_notice(team, user):
                context[BUSY_NOTICE] = BusyNotice(channel, thread_ts, said)
            else:  # told in a thread within the minute: this one only to them, never silently
                context[REFUSAL] = Refusal(channel, thread_ts, user, said)
        log.info("app_mention %s in %s: %s", event_id, channel, accepted.value)

    return on_mention


def acknowledge_visibly(body: dict[str, Any], context: BoltContext, client: WebClient) -> None:
    """Something visible within a second: an :eyes: reaction, or why the mention was not started."""
    event = body.get("event") or {}
    try:
        refusal, busy = context.get(REFUSAL), context.get(BUSY_NOTICE)
        if context.get(ACCEPTED) is Accepted.NEW:
            client.reactions_add(channel=event["channel"], timestamp=event["ts"], name="eyes")
        elif isinstance(refusal, Refusal):
            team = body.get("team_id") or event.get("team")
            handles = group_handles(context, team if isinstance(team, str) else None, refusal.users)
            msg = notice(refusal.text, handles, **refusal.users)
            client.chat_postEphemeral(
                channel=refusal.channel,
                user=refusal.user,
                thread_ts=refusal.thread_ts,
                text=msg.text,
                blocks=msg.blocks,
            )
        elif isinstance(busy, BusyNotice):
            msg = notice(busy.text)
            client.chat_postMessage(
                channel=busy.channel,
                thread_ts=busy.thread_ts,
                text=msg.text,
                blocks=msg.blocks,
                unfurl_links=False,
                metadata=tagged("", BUSY_KEY),  # ours, never taken for a stream (messages.metadata)
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


def register(app: App, deps: BotDeps, then: Then) -> None:
    """Register this surface's listeners."""
    app.event("app_mention")(then(_on_mention(deps), acknowledge_visibly))
    # Direct messages start runs like mentions; any other message is answered and left alone.
    app.event("message")(then(_on_direct_message(deps), acknowledge_visibly))
