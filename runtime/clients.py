"""The clients of a process: Redis (`runtime.connection`) and Slack's Web API, and what a missing
setting says."""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Mapping

import redis
from slack_sdk import WebClient
from slack_sdk.http_retry import HttpRequest, HttpResponse, RetryState
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)

from runtime import connection
from runtime.slack_http import KeepAliveWebClient

DEFAULT_SLACK_API_URL = "https://slack.com/api/"
COURTESY_TIMEOUT = 5  # seconds: a status line is not worth a stalled run
COURTESY_MAX_WAIT = 5  # seconds of a 429's Retry-After a courtesy call waits out (once); longer: skipped


class SettingsError(ValueError):
    """A required setting is missing; the message says what to set and where to get it."""


def slack_client(env: Mapping[str, str] | None = None) -> WebClient:
    """A `WebClient` on `SLACK_API_URL` that retries 429 (honouring Retry-After) and 5xx, and keeps
    its connections open between calls (`runtime.slack_http`)."""
    env = os.environ if env is None else env
    token = env.get("SLACK_BOT_TOKEN")
    if not token:
        raise SettingsError(
            "SLACK_BOT_TOKEN is not set: copy the Bot User OAuth Token (xoxb-…) from your app's "
            "OAuth & Permissions page at https://api.slack.com/apps"
        )
    return KeepAliveWebClient(
        token=token,
        base_url=env.get("SLACK_API_URL") or DEFAULT_SLACK_API_URL,
        timeout=15,
        ssl=tls_context(),
        retry_handlers=[
            ConnectionErrorRetryHandler(max_retry_count=2),
            RateLimitErrorRetryHandler(max_retry_count=3),
            ServerErrorRetryHandler(max_retry_count=2),
        ],
    )


class ShortRateLimitRetry(RateLimitErrorRetryHandler):
    """Waits out a 429 once, and only when Slack asks for at most `COURTESY_MAX_WAIT` seconds.

    slack_sdk's own handler sleeps whatever Retry-After says, in the calling thread.
    """

    def __init__(self) -> None:
        super().__init__(max_retry_count=1)

    def _can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        if response is None or response.status_code != 429:
            return False
        wait = next((v for k, v in response.headers.items() if k.lower() == "retry-after"), ["1"])
        try:
            return int(wait[0]) <= COURTESY_MAX_WAIT
        except (IndexError, ValueError):
            return False


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The one TLS context of the process's Slack clients (certificates checked as by default).

    Without one, every HTTPS call of a `WebClient` makes its own (Python 3.11's `http.client` does,
    for a connection given no context), loading the CA bundle again: milliseconds of CPU per call.
    """
    return ssl.create_default_context()


def redis_connection(env: Mapping[str, str] | None = None) -> redis.Redis:
    """This process's Redis client: `REDIS_URL`, or the master of `REDIS_SENTINELS` (`runtime.connection`).

    Raises `SettingsError` (one line) when those settings cannot be used.
    """
    try:
        return connection.connect(env)
    except connection.RedisSettingsError as exc:
        raise SettingsError(str(exc)) from None
