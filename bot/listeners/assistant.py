"""Slack's agent surfaces: suggested prompts in a new assistant thread, and Slack's own stop."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slack_bolt import App, BoltContext
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.listeners.runs import request_stop
from bot.listening import (
    REPLY,
    BotDeps,
    Clicker,
    Then,
    as_dict,
    tell_clicker,
)
from messages import texts
from store import (
    BadId,
    check_id,
)

log = logging.getLogger(__name__)

SUGGEST_IN = "suggest_in"  # context key: the new assistant thread to suggest prompts in


@dataclass(frozen=True)
class SuggestIn:
    channel: str
    thread_ts: str


def _on_assistant_thread_started(deps: BotDeps) -> Callable[..., None]:
    """A person opened a new thread in the assistant pane: note where to suggest prompts (once)."""

    def on_thread_started(body: dict[str, Any], event: dict[str, Any], context: BoltContext) -> None:
        thread = as_dict(event.get("assistant_thread"))
        try:
            team = check_id("team", body.get("team_id") or context.team_id)
            event_id = check_id("event", body.get("event_id"))
            channel = check_id("channel", thread.get("channel_id"))
            thread_ts = check_id("ts", thread.get("thread_ts"))
        except BadId as exc:
            log.warning("ignoring a malformed assistant_thread_started: %s", exc)
            return
        if deps.store.admission.first_delivery(team, event_id):
            context[SUGGEST_IN] = SuggestIn(channel, thread_ts)

    return on_thread_started


def _suggest_prompts(body: dict[str, Any], context: BoltContext, client: WebClient) -> None:
    """After Slack has its answer: the suggested prompts of a new assistant thread."""
    where = context.get(SUGGEST_IN)
    if not isinstance(where, SuggestIn):
        return
    channel, thread_ts = where.channel, where.thread_ts
    prompts = [{"title": title, "message": message} for title, message in texts.SUGGESTED_PROMPTS]
    try:
        client.assistant_threads_setSuggestedPrompts(
            channel_id=channel, thread_ts=thread_ts, title=texts.SUGGESTED_PROMPTS_TITLE, prompts=prompts
        )
    except SlackApiError as exc:
        log.warning("could not suggest prompts in %s: %s", channel, exc.response.get("error"))


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
        if not deps.store.admission.first_delivery(team, event_id):
            return  # a retry of a delivery already acted on
        context["reply_channel"], context["reply_user"], context["reply_thread"] = channel, user, thread_ts
        run_id = deps.store.threads.thread_run(team, channel, thread_ts)
        if run_id is None:
            context[REPLY] = texts.STOP_NOTHING_RUNNING
            return
        request_stop(deps, run_id, Clicker(user, team), channel, context)

    return on_session_stopped


def register(app: App, deps: BotDeps, then: Then) -> None:
    """Register this surface's listeners."""
    app.event("assistant_thread_started")(then(_on_assistant_thread_started(deps), _suggest_prompts))
    app.event("agent_session_stopped")(then(_on_session_stopped(deps), tell_clicker))
