"""What a job needs, built once per worker process from the environment and passed explicitly."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anthropic
import redis
import rq
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)

from harness.client import make_client
from harness.config import Config, load_config
from workers.store import Store

log = logging.getLogger(__name__)

QUEUE_NAME = "harness"
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
DEFAULT_SLACK_API_URL = "https://slack.com/api/"
RUN_JOB_TIMEOUT = 3600  # a whole run between two parks: (max_turns + 1) requests with retries


class SettingsError(ValueError):
    """A required setting is missing; the message says what to set and where to get it."""


def slack_client(env: Mapping[str, str] | None = None) -> WebClient:
    """A `WebClient` on `SLACK_API_URL` that retries 429 (honouring Retry-After) and 5xx."""
    env = os.environ if env is None else env
    token = env.get("SLACK_BOT_TOKEN")
    if not token:
        raise SettingsError(
            "SLACK_BOT_TOKEN is not set: copy the Bot User OAuth Token (xoxb-…) from your app's "
            "OAuth & Permissions page at https://api.slack.com/apps"
        )
    return WebClient(
        token=token,
        base_url=env.get("SLACK_API_URL") or DEFAULT_SLACK_API_URL,
        timeout=15,
        retry_handlers=[
            ConnectionErrorRetryHandler(max_retry_count=2),
            RateLimitErrorRetryHandler(max_retry_count=3),
            ServerErrorRetryHandler(max_retry_count=2),
        ],
    )


def redis_connection(env: Mapping[str, str] | None = None) -> redis.Redis:
    env = os.environ if env is None else env
    return redis.Redis.from_url(
        env.get("REDIS_URL") or DEFAULT_REDIS_URL,
        socket_timeout=10,
        socket_connect_timeout=5,
        health_check_interval=30,
    )


@dataclass(frozen=True)
class Services:
    """Redis store, job queue, Slack client and config of one process."""

    store: Store
    queue: rq.Queue
    slack: WebClient
    config: Config
    # Built once per process: a new client costs 25-120 ms (an SSL context and the CA bundle).
    model: anthropic.Anthropic

    @classmethod
    def from_env(
        cls, connection: redis.Redis | None = None, env: Mapping[str, str] | None = None
    ) -> Services:
        connection = connection or redis_connection(env)
        return cls(
            store=Store(connection),
            queue=rq.Queue(QUEUE_NAME, connection=connection),
            slack=slack_client(env),
            config=load_config(env=env),
            model=make_client(),
        )

    def post(self, channel: str, thread_ts: str, text: str, blocks: list[dict[str, Any]]) -> str | None:
        """Post in a thread; a failure after the client's retries is logged, never raised."""
        try:
            reply = self.slack.chat_postMessage(
                channel=channel, thread_ts=thread_ts, text=text, blocks=blocks
            )
            return str(reply["ts"])
        except (SlackApiError, OSError) as exc:
            log.error("could not post to %s/%s: %s", channel, thread_ts, _slack_error(exc))
            return None

    def update(self, channel: str, ts: str, text: str, blocks: list[dict[str, Any]]) -> bool:
        """Replace a message's text AND blocks (omitted blocks would keep old buttons clickable)."""
        try:
            self.slack.chat_update(channel=channel, ts=ts, text=text, blocks=blocks)
            return True
        except (SlackApiError, OSError) as exc:
            log.error("could not update %s/%s: %s", channel, ts, _slack_error(exc))
            return False

    def react(self, channel: str, ts: str, name: str, *, remove: str | None = None) -> None:
        """Best effort: a reaction is a courtesy, never a reason to fail a run."""
        try:
            if remove:
                self.slack.reactions_remove(channel=channel, timestamp=ts, name=remove)
        except (SlackApiError, OSError):
            pass
        with contextlib.suppress(SlackApiError, OSError):
            self.slack.reactions_add(channel=channel, timestamp=ts, name=name)


def _slack_error(exc: Exception) -> str:
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error"))
    return f"{type(exc).__name__}: {exc}"
