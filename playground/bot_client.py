"""What the playground sends the bot: the payloads Slack would send, signed as Slack signs them.

Events (`app_mention`, `app_home_opened`) go as JSON, interactivity (`block_actions`,
`view_submission`, `view_closed`) as the form field ``payload=<json>``, both to the bot's
``/slack/events`` with ``X-Slack-Request-Timestamp`` and ``X-Slack-Signature`` made by
`slack_sdk`'s `SignatureVerifier` from the same signing secret the bot checks them with. An event
sent again (`playground.delivery` retries as Slack does) keeps its `event_id` and carries Slack's
``X-Slack-Retry-Num`` and ``X-Slack-Retry-Reason``.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from slack_sdk.signature import SignatureVerifier

from playground.slack import APP_ID, BOT_USER_ID, TEAM_ID, Channel, Person

Json = dict[str, Any]
TIMEOUT_SECONDS = 10.0  # Slack gives up after 3 s; a local bot that is still starting gets longer
HEALTH_TIMEOUT_SECONDS = 1.0
# Slack's X-Slack-Retry-Reason values for what the playground can tell apart
CONNECTION_FAILED = "connection_failed"
HTTP_TIMEOUT = "http_timeout"
HTTP_ERROR = "http_error"


@dataclass(frozen=True)
class Reply:
    """The bot's answer to one request: its HTTP status and body (JSON when it sent JSON)."""

    status: int
    body: Any
    no_retry: bool = False  # the bot answered ``X-Slack-No-Retry: 1``: Slack sends it no more


class BotUnreachable(Exception):
    """The bot did not answer at all (not started yet, or gone); `reason` as Slack would name it."""

    def __init__(self, message: str, reason: str = CONNECTION_FAILED) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Bot:
    """Where the bot listens, and the secret both sides sign with."""

    url: str
    signing_secret: str

    def send_event(self, event: Json) -> Reply:
        """An Events API `event_callback` around `event`, sent once."""
        return self.post_event(self.event_callback(event))

    def event_callback(self, event: Json) -> Json:
        """The Events API `event_callback` around `event`, with an event id of its own."""
        return {
            "token": "playground",
            "team_id": TEAM_ID,
            "context_team_id": TEAM_ID,
            "context_enterprise_id": None,
            "api_app_id": APP_ID,
            "event": event,
            "type": "event_callback",
            "event_id": f"Ev{secrets.token_hex(8).upper()}",
            "event_time": int(time.time()),
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": TEAM_ID,
                    "user_id": BOT_USER_ID,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
        }

    def post_event(self, callback: Json, retry: tuple[int, str] | None = None) -> Reply:
        """Send an `event_callback`; `retry` (its number, Slack's reason) when it is sent again."""
        headers = {"X-Slack-Retry-Num": str(retry[0]), "X-Slack-Retry-Reason": retry[1]} if retry else {}
        return self._post(json.dumps(callback), "application/json", headers)

    def healthy(self) -> bool:
        """True when the bot answers ``GET /healthz`` with 200: it listens and its Redis answers."""
        url = self.url.rsplit("/slack/events", 1)[0] + "/healthz"
        try:
            with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_SECONDS) as answer:
                return bool(answer.status == 200)
        except (OSError, ValueError):
            return False

    def send_interaction(self, payload: Json) -> Reply:
        """An interactivity payload, form-encoded as Slack sends it."""
        return self._post(urlencode({"payload": json.dumps(payload)}), "application/x-www-form-urlencoded")

    def _post(self, body: str, content_type: str, extra: dict[str, str] | None = None) -> Reply:
        data = body.encode("utf-8")
        stamp = str(int(time.time()))
        signature = (
            SignatureVerifier(self.signing_secret).generate_signature(timestamp=stamp, body=data) or ""
        )
        request = urllib.request.Request(
            self.url,
            data=data,
            method="POST",
            headers={
                "Content-Type": content_type,
                "X-Slack-Request-Timestamp": stamp,
                "X-Slack-Signature": signature,
                "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
                **(extra or {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as answer:
                return Reply(answer.status, _body(answer.read()))
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, _body(exc.read()), exc.headers.get("X-Slack-No-Retry") == "1")
        except OSError as exc:
            cause = getattr(exc, "reason", exc)  # urllib wraps a connect timeout in URLError
            timed_out = isinstance(exc, TimeoutError) or isinstance(cause, TimeoutError)
            reason = HTTP_TIMEOUT if timed_out else CONNECTION_FAILED
            raise BotUnreachable(f"the bot at {self.url} does not answer ({exc})", reason) from exc


def _body(raw: bytes) -> Any:
    text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return text


def user_ref(person: Person) -> Json:
    """The `user` object of an interaction payload."""
    return {"id": person.id, "username": person.name, "name": person.name, "team_id": TEAM_ID}


def app_mention(person: Person, message: Json) -> Json:
    """The `app_mention` event of a person's message that mentions the bot."""
    event: Json = {
        "type": "app_mention",
        "user": person.id,
        "text": message["text"],
        "ts": message["ts"],
        "channel": message["channel"],
        "event_ts": message["ts"],
        "team": TEAM_ID,
        "client_msg_id": secrets.token_hex(16),
    }
    if message.get("thread_ts"):
        event["thread_ts"] = message["thread_ts"]
    return event


def app_home_opened(person: Person, home: Json | None) -> Json:
    """The `app_home_opened` event of a person opening the app's Home tab."""
    event: Json = {
        "type": "app_home_opened",
        "user": person.id,
        "channel": f"D0{person.id[1:]}",
        "tab": "home",
        "event_ts": f"{time.time():.6f}",
    }
    if home is not None:
        event["view"] = home
    return event


def block_actions(
    person: Person,
    action: Json,
    *,
    trigger_id: str,
    response_url: str,
    channel: Channel | None = None,
    message: Json | None = None,
    ephemeral_ts: str | None = None,
    view: Json | None = None,
) -> Json:
    """A click on a button the bot posted: in a message or ephemeral message of `channel`, or a view."""
    payload: Json = {
        "type": "block_actions",
        "user": user_ref(person),
        "api_app_id": APP_ID,
        "token": "playground",
        "trigger_id": trigger_id,
        "team": {"id": TEAM_ID, "domain": "playground"},
        "enterprise": None,
        "is_enterprise_install": False,
        "state": {"values": {}},
        "actions": [{**action, "action_ts": f"{time.time():.6f}"}],
    }
    if view is not None:
        payload["container"] = {"type": "view", "view_id": view["id"]}
        payload["view"] = view
        return payload
    if channel is None:
        raise ValueError("a click on a message needs the message's channel")
    payload["channel"] = {"id": channel.id, "name": channel.name}
    payload["response_url"] = response_url
    if message is not None:
        payload["container"] = {
            "type": "message",
            "message_ts": message["ts"],
            "channel_id": channel.id,
            "is_ephemeral": False,
            **({"thread_ts": message["thread_ts"]} if message.get("thread_ts") else {}),
        }
        payload["message"] = message
    else:
        payload["container"] = {
            "type": "message",
            "message_ts": ephemeral_ts,
            "channel_id": channel.id,
            "is_ephemeral": True,
        }
    return payload


def view_submission(person: Person, view: Json, values: Json, *, trigger_id: str) -> Json:
    """A modal submitted with `values` (``{block_id: {action_id: {type, value}}}``)."""
    return {
        "type": "view_submission",
        "team": {"id": TEAM_ID, "domain": "playground"},
        "user": user_ref(person),
        "api_app_id": APP_ID,
        "token": "playground",
        "trigger_id": trigger_id,
        "view": {**view, "state": {"values": values}},
        "response_urls": [],
        "enterprise": None,
        "is_enterprise_install": False,
    }


def view_closed(person: Person, view: Json) -> Json:
    """A modal closed with its close button (sent only when the view set `notify_on_close`)."""
    return {
        "type": "view_closed",
        "team": {"id": TEAM_ID, "domain": "playground"},
        "user": user_ref(person),
        "api_app_id": APP_ID,
        "token": "playground",
        "view": view,
        "is_cleared": False,
        "enterprise": None,
        "is_enterprise_install": False,
    }
