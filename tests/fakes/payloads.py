"""Realistic Slack request bodies, and malformed variants of them derived field by field.

The shapes follow Slack's reference pages for the Events API, interactivity payloads and slash
commands, and the request fixtures of Slack's own SDK test suites (bolt-python's
`tests/scenario_tests`, python-slack-sdk's `tests/slack_sdk/socket_mode`); they are written afresh
here with this project's ids. Nulls sit where Slack sends nulls: `enterprise` outside Enterprise
Grid, `team` and `authorizations[].team_id` for org-wide installs, a modal's `close` and
`previous_view_id`, an empty input's `value`.

`deliveries()` is the corpus (HTTP bodies and Socket Mode envelopes alike); `mutants(payload)`
yields every single-field corruption of a payload: each key removed, each value replaced by every
other JSON type, each string replaced by odd unicode (lone surrogates, NUL, RTL override, 100k
characters).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

TEAM = "T1"
ENTERPRISE = "E1"
APP_ID = "A1"
BOT_USER = "UBOT"
BOT_ID = "BBOT"
VERIFICATION_TOKEN = "fake-verification-token"
RESPONSE_URL = "https://hooks.slack.com/actions/T1/1234567890/abcdefghijklmnop"
CARD_VALUE = "0" * 32 + ":toolu_01A"  # an approval button's value: run id and tool_use id

Json = dict[str, Any]


@dataclass(frozen=True)
class Delivery:
    """One request as Slack makes it: the payload, how it travels, and Slack's retry headers."""

    name: str
    kind: str  # the Socket Mode envelope type: events_api, interactive or slash_commands
    payload: Json
    retry: tuple[int, str] | None = None  # (X-Slack-Retry-Num, X-Slack-Retry-Reason)
    http_only: bool = False  # ssl_check never comes through Socket Mode

    def http(self) -> tuple[str, str, dict[str, str]]:
        """(body, content type, extra headers) as Slack POSTs it to the Request URL."""
        return http_body(self.kind, self.payload) + (self.retry_headers(),)

    def retry_headers(self) -> dict[str, str]:
        if self.retry is None:
            return {}
        return {"X-Slack-Retry-Num": str(self.retry[0]), "X-Slack-Retry-Reason": self.retry[1]}

    def envelope(self, envelope_id: str) -> Json:
        """The Socket Mode envelope Slack sends over the WebSocket."""
        return envelope(self.kind, self.payload, envelope_id, retry=self.retry)


def http_body(kind: str, payload: Any) -> tuple[str, str]:
    """Events are JSON; interactivity is `payload=<json>` form data; slash commands are form fields."""
    if kind == "events_api":
        return json.dumps(payload), "application/json"
    if kind == "interactive":
        return urlencode({"payload": json.dumps(payload)}), "application/x-www-form-urlencoded"
    fields = payload if isinstance(payload, dict) else {"payload": json.dumps(payload)}
    # Form values are text: a mutated non-string travels as its JSON text, a lone surrogate as the
    # bytes Python would write for it (the receiver decodes them as U+FFFD).
    as_text = {k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()}
    return urlencode(as_text, errors="surrogatepass"), "application/x-www-form-urlencoded"


def envelope(kind: str, payload: Any, envelope_id: str, *, retry: tuple[int, str] | None = None) -> Json:
    """A Socket Mode envelope around `payload`."""
    env: Json = {
        "envelope_id": envelope_id,
        "payload": payload,
        "type": kind,
        "accepts_response_payload": kind != "events_api",
    }
    if kind == "events_api":
        env["retry_attempt"], env["retry_reason"] = retry or (0, "")
    return env


def ts_now(offset: int = 0) -> str:
    """A message timestamp in Slack's `seconds.micros` form."""
    micros = time.time_ns() // 1000 + offset
    return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"


# --- the Events API --------------------------------------------------------------------------------


def event_callback(
    event: Json,
    *,
    event_id: str,
    team: str = TEAM,
    org: bool = False,
    shared: bool = False,
) -> Json:
    """The `event_callback` wrapper of an event, with `authorizations` as Slack sends it since 2021."""
    event_time = int(float(event.get("event_ts") or event.get("ts") or time.time()))
    body: Json = {
        "token": VERIFICATION_TOKEN,
        "team_id": team,
        "context_team_id": team,
        "context_enterprise_id": ENTERPRISE if org else None,
        "api_app_id": APP_ID,
        "event": event,
        "type": "event_callback",
        "event_id": event_id,
        "event_time": event_time,
        "authorizations": [
            {
                "enterprise_id": ENTERPRISE if org else None,
                "team_id": None if org else team,  # an org-wide install is authorized for the org
                "user_id": BOT_USER,
                "is_bot": True,
                "is_enterprise_install": org,
            }
        ],
        "is_ext_shared_channel": shared,
        "event_context": f"4-eyJldCI6Im1lc3NhZ2UiLCJ0aWQiOiJ{team}IiwiYWlkIjoiQTEifQ-{event_id}",
    }
    if org:
        body["enterprise_id"] = ENTERPRISE
    return body


def _rich_text(text: str, *, mention: str | None = None) -> list[Json]:
    elements: list[Json] = [{"type": "user", "user_id": mention}] if mention else []
    elements.append({"type": "text", "text": text})
    return [
        {
            "type": "rich_text",
            "block_id": "Xq3Rw",
            "elements": [{"type": "rich_text_section", "elements": elements}],
        }
    ]


def app_mention(
    task: str,
    *,
    user: str = "UALICE",
    channel: str = "C1",
    ts: str | None = None,
    thread_ts: str | None = None,
    team: str = TEAM,
) -> Json:
    """An `app_mention` event: `<@UBOT> task`, in a channel or inside a thread."""
    ts = ts or ts_now()
    event: Json = {
        "user": user,
        "type": "app_mention",
        "ts": ts,
        "client_msg_id": "7e1b0c3a-5d2f-4a52-9a8e-0b6f2f0e4c11",
        "text": f"<@{BOT_USER}> {task}",
        "team": team,
        "blocks": _rich_text(f" {task}", mention=BOT_USER),
        "channel": channel,
        "event_ts": ts,
    }
    if thread_ts:
        event["thread_ts"] = thread_ts
        event["parent_user_id"] = user
    return event


def channel_message(
    text: str, *, user: str = "UBOB", channel: str = "C1", channel_type: str = "channel", **extra: Any
) -> Json:
    """A plain `message` event from a person."""
    ts = ts_now()
    return {
        "client_msg_id": "0186b75a-2ad4-4f36-8ccc-18608b0ac5d1",
        "type": "message",
        "text": text,
        "user": user,
        "ts": ts,
        "blocks": _rich_text(text),
        "team": TEAM,
        "channel": channel,
        "event_ts": ts,
        "channel_type": channel_type,
        **extra,
    }


def _bot_message(channel: str = "C1") -> Json:
    ts = ts_now()
    return {
        "type": "message",
        "subtype": "bot_message",
        "text": "Deploy finished",
        "ts": ts,
        "username": "deploybot",
        "bot_id": "B2DEPLOY",
        "app_id": "A2DEPLOY",
        "channel": channel,
        "event_ts": ts,
        "channel_type": "channel",
    }


def _modern_bot_message(channel: str = "C1") -> Json:
    ts = ts_now()
    return {
        "type": "message",
        "text": "<@UBOT> ping from another bot",
        "ts": ts,
        "bot_id": "B2OTHER",
        "app_id": "A2OTHER",
        "user": "U2OTHERBOT",
        "team": TEAM,
        "bot_profile": {
            "id": "B2OTHER",
            "deleted": False,
            "name": "otherbot",
            "updated": 1700000000,
            "app_id": "A2OTHER",
            "icons": {"image_36": "https://a.slack-edge.com/80588/img/plugins/app/bot_36.png"},
            "team_id": TEAM,
        },
        "blocks": _rich_text("ping from another bot", mention=BOT_USER),
        "channel": channel,
        "event_ts": ts,
        "channel_type": "channel",
    }


def _message_changed() -> Json:
    ts, edited = ts_now(-5_000_000), ts_now()
    return {
        "type": "message",
        "subtype": "message_changed",
        "message": {
            "client_msg_id": "c9a6b8f2-8a55-4a50-8d5e-2e7b8d3f6a10",
            "type": "message",
            "text": "fixed typo",
            "user": "UBOB",
            "team": TEAM,
            "edited": {"user": "UBOB", "ts": edited},
            "blocks": _rich_text("fixed typo"),
            "ts": ts,
            "source_team": TEAM,
            "user_team": TEAM,
        },
        "previous_message": {
            "client_msg_id": "c9a6b8f2-8a55-4a50-8d5e-2e7b8d3f6a10",
            "type": "message",
            "text": "fixd typo",
            "user": "UBOB",
            "ts": ts,
            "team": TEAM,
            "blocks": _rich_text("fixd typo"),
        },
        "channel": "C1",
        "hidden": True,
        "ts": edited,
        "event_ts": edited,
        "channel_type": "channel",
    }


def _message_deleted() -> Json:
    ts, deleted = ts_now(-5_000_000), ts_now()
    return {
        "type": "message",
        "subtype": "message_deleted",
        "previous_message": {"type": "message", "text": "oops", "user": "UBOB", "ts": ts, "team": TEAM},
        "channel": "C1",
        "hidden": True,
        "deleted_ts": ts,
        "event_ts": deleted,
        "ts": deleted,
        "channel_type": "channel",
    }


def _file_share() -> Json:
    message = channel_message("here is the log", subtype="file_share", upload=False, display_as_bot=False)
    message["files"] = [
        {
            "id": "F1LOG",
            "created": 1700000000,
            "timestamp": 1700000000,
            "name": "build.log",
            "title": "build.log",
            "mimetype": "text/plain",
            "filetype": "text",
            "pretty_type": "Plain Text",
            "user": "UBOB",
            "user_team": TEAM,
            "editable": True,
            "size": 1204,
            "mode": "snippet",
            "is_external": False,
            "external_type": "",
            "is_public": True,
            "public_url_shared": False,
            "url_private": "https://files.slack.com/files-pri/T1-F1LOG/build.log",
            "permalink": "https://example.slack.com/files/UBOB/F1LOG/build.log",
            "preview": "step 1 ok",
            "lines": 12,
            "has_rich_preview": False,
        }
    ]
    return message


def direct_message(
    text: str,
    *,
    user: str = "UALICE",
    channel: str = "D1BOT",
    ts: str | None = None,
    thread_ts: str | None = None,
    **extra: Any,
) -> Json:
    """A `message` event a person sends the bot directly (`message.im`): in the DM, or in one of its
    threads (the assistant pane's threads are DM threads too)."""
    event = channel_message(text, user=user, channel=channel, channel_type="im", **extra)
    if ts:
        event["ts"] = event["event_ts"] = ts
    if thread_ts:
        event["thread_ts"] = thread_ts
        event["parent_user_id"] = user
    return event


def _im_thread_message() -> Json:
    """A reply in a DM thread with the bot: Bolt treats it as an assistant-thread message."""
    return direct_message("and then?", thread_ts=ts_now(-9_000_000))


def _reaction_added() -> Json:
    return {
        "type": "reaction_added",
        "user": "UBOB",
        "reaction": "eyes",
        "item_user": BOT_USER,
        "item": {"type": "message", "channel": "C1", "ts": ts_now(-3_000_000)},
        "event_ts": ts_now(),
    }


def _app_home_opened() -> Json:
    return {
        "type": "app_home_opened",
        "user": "UALICE",
        "channel": "D1BOT",
        "tab": "home",
        "view": {
            "id": "V1HOME",
            "team_id": TEAM,
            "type": "home",
            "blocks": [{"type": "section", "block_id": "hi", "text": {"type": "mrkdwn", "text": "Hello"}}],
            "private_metadata": "",
            "callback_id": "",
            "state": {"values": {}},
            "hash": "1700000000.abcdEF12",
            "title": {"type": "plain_text", "text": "View Title", "emoji": True},
            "clear_on_close": False,
            "notify_on_close": False,
            "close": None,
            "submit": None,
            "previous_view_id": None,
            "root_view_id": "V1HOME",
            "app_id": APP_ID,
            "external_id": "",
            "app_installed_team_id": TEAM,
            "bot_id": BOT_ID,
        },
        "event_ts": ts_now(),
    }


def _member_joined_channel() -> Json:
    return {
        "type": "member_joined_channel",
        "user": "UBOB",
        "channel": "C1",
        "channel_type": "C",
        "team": TEAM,
        "inviter": "UALICE",
        "event_ts": ts_now(),
    }


def _channel_created() -> Json:
    return {
        "type": "channel_created",
        "channel": {
            "id": "C2NEW",
            "is_channel": True,
            "name": "project-x",
            "name_normalized": "project-x",
            "created": 1700000000,
            "creator": "UALICE",
            "is_shared": False,
            "is_org_shared": False,
            "context_team_id": TEAM,
            "updated": 1700000000123,
        },
        "event_ts": ts_now(),
    }


def _team_join() -> Json:
    return {
        "type": "team_join",
        "user": {
            "id": "UNEW",
            "team_id": TEAM,
            "name": "newbie",
            "deleted": False,
            "color": "9f69e7",
            "real_name": "New Person",
            "tz": "Europe/Paris",
            "tz_label": "Central European Time",
            "tz_offset": 3600,
            "profile": {
                "title": "",
                "phone": "",
                "real_name": "New Person",
                "display_name": "",
                "status_text": "",
                "status_emoji": "",
                "status_expiration": 0,
                "avatar_hash": "g123456789ab",
                "team": TEAM,
            },
            "is_admin": False,
            "is_owner": False,
            "is_bot": False,
            "is_app_user": False,
            "updated": 1700000000,
            "is_email_confirmed": True,
            "who_can_share_contact_card": "EVERYONE",
        },
        "cache_ts": 1700000000,
        "event_ts": ts_now(),
    }


def _link_shared() -> Json:
    return {
        "type": "link_shared",
        "channel": "C1",
        "is_bot_user_member": True,
        "user": "UBOB",
        "message_ts": ts_now(-1_000_000),
        "unfurl_id": "C1.1700000000.000100.abc",
        "source": "conversations_history",
        "links": [{"domain": "example.com", "url": "https://example.com/tickets/12345"}],
        "event_ts": ts_now(),
    }


def assistant_thread_started(
    *, user: str = "UALICE", channel: str = "D1BOT", thread_ts: str | None = None, viewing: str = "C1"
) -> Json:
    """A person opened a new thread in the assistant pane (`viewing`: the channel they had open)."""
    return {
        "type": "assistant_thread_started",
        "assistant_thread": {
            "user_id": user,
            "context": {"channel_id": viewing, "team_id": TEAM, "enterprise_id": None},
            "channel_id": channel,
            "thread_ts": thread_ts or ts_now(-1_000_000),
        },
        "event_ts": ts_now(),
    }


def _function_executed() -> Json:
    return {
        "type": "function_executed",
        "function": {
            "id": "Fn1SUMMARY",
            "callback_id": "summarize",
            "title": "Summarize",
            "description": "",
            "type": "app",
            "input_parameters": [
                {"type": "slack#/types/user_id", "name": "user_id", "title": "User", "is_required": True}
            ],
            "output_parameters": [
                {"type": "string", "name": "summary", "title": "Summary", "is_required": True}
            ],
            "app_id": APP_ID,
            "date_created": 1700000000,
            "date_updated": 1700000000,
            "date_deleted": 0,
        },
        "inputs": {"user_id": "UALICE"},
        "function_execution_id": "Fx1ABC",
        "workflow_execution_id": "Wx1ABC",
        "event_ts": ts_now(),
        "bot_access_token": "xwfp-fake-function-token",
    }


def _tokens_revoked() -> Json:
    return {"type": "tokens_revoked", "tokens": {"oauth": [], "bot": [BOT_USER]}, "event_ts": ts_now()}


def _team_access_granted() -> Json:
    """An org-level event: the envelope names the enterprise, not a workspace."""
    return {
        "token": VERIFICATION_TOKEN,
        "enterprise_id": ENTERPRISE,
        "api_app_id": APP_ID,
        "event": {"type": "team_access_granted", "team_ids": [TEAM, "T2"], "event_ts": ts_now()},
        "type": "event_callback",
        "event_id": "Ev1GRANTED",
        "event_time": int(time.time()),
    }


def shared_channel_mention(task: str, *, event_id: str) -> Json:
    """A mention from a Slack Connect partner's user: `user_team` is their workspace."""
    event = app_mention(task, user="UPARTNER", channel="C9SHARED", team="T2")
    event.update(user_team="T2", source_team="T2")
    body = event_callback(event, event_id=event_id, shared=True)
    body["authorizations"][0]["team_id"] = TEAM
    return body


# --- interactivity ---------------------------------------------------------------------------------


def _user(user: str, team: str = TEAM) -> Json:
    return {"id": user, "username": user.lower(), "name": user.lower(), "team_id": team}


def _workspace(org: bool) -> Json:
    """`team`, `enterprise` and `is_enterprise_install` as an install of either kind sends them."""
    if org:
        return {
            "team": None,
            "enterprise": {"id": ENTERPRISE, "name": "Example Org"},
            "is_enterprise_install": True,
        }
    return {"team": {"id": TEAM, "domain": "example"}, "enterprise": None, "is_enterprise_install": False}


def _trigger_id() -> str:
    return f"{time.time_ns() % 10**13}.1234567890.abcdef0123456789abcdef0123456789"


def card_message(
    *, ts: str, thread_ts: str | None, value: str = CARD_VALUE, text: str = "write_file wants to run"
) -> Json:
    """A bot message holding an approval card, as Slack echoes it inside a click's payload."""
    message: Json = {
        "bot_id": BOT_ID,
        "type": "message",
        "text": text,
        "user": BOT_USER,
        "ts": ts,
        "app_id": APP_ID,
        "blocks": [
            {
                "type": "section",
                "block_id": "call",
                "text": {"type": "mrkdwn", "text": text, "verbatim": False},
            },
            {
                "type": "actions",
                "block_id": "approval",
                "elements": [
                    {
                        "type": "button",
                        "action_id": action_id,
                        "text": {"type": "plain_text", "text": action_id.title(), "emoji": True},
                        "value": value,
                    }
                    for action_id in ("approve", "decline")
                ],
            },
        ],
        "team": TEAM,
    }
    if thread_ts:
        message.update(thread_ts=thread_ts, parent_user_id="UALICE")
    return message


def block_actions(
    action_id: str = "approve",
    value: str = CARD_VALUE,
    *,
    user: str = "UALICE",
    channel: str = "C1",
    message: Json | None = None,
    org: bool = False,
    response_url: str = RESPONSE_URL,
) -> Json:
    """A click on a button of a message the bot posted (`message` is that message as Slack echoes it)."""
    message = message or card_message(ts=ts_now(-2_000_000), thread_ts=ts_now(-4_000_000), value=value)
    button = next(
        e
        for b in message.get("blocks", [])
        if b.get("type") == "actions"
        for e in b.get("elements", [])
        if e.get("action_id") == action_id
    )
    container: Json = {
        "type": "message",
        "message_ts": message["ts"],
        "channel_id": channel,
        "is_ephemeral": False,
    }
    if message.get("thread_ts"):
        container["thread_ts"] = message["thread_ts"]
    return {
        "type": "block_actions",
        "user": _user(user),
        "api_app_id": APP_ID,
        "token": VERIFICATION_TOKEN,
        "container": container,
        "trigger_id": _trigger_id(),
        **_workspace(org),
        "channel": {"id": channel, "name": "general"},
        "message": message,
        "state": {"values": {}},
        "response_url": response_url,
        "actions": [
            {
                "action_id": action_id,
                "block_id": "approval",
                "text": button.get("text", {"type": "plain_text", "text": action_id, "emoji": True}),
                "value": button.get("value", value),
                "type": "button",
                "action_ts": ts_now(),
            }
        ],
    }


def _modal_view(callback_id: str, private_metadata: str, values: Json, *, root: str = "V1MODAL") -> Json:
    return {
        "id": root,
        "team_id": TEAM,
        "type": "modal",
        "blocks": [
            {
                "type": "input",
                "block_id": "reason",
                "label": {"type": "plain_text", "text": "Why decline?", "emoji": True},
                "optional": True,
                "dispatch_action": False,
                "element": {
                    "type": "plain_text_input",
                    "action_id": "reason",
                    "multiline": True,
                    "dispatch_action_config": {"trigger_actions_on": ["on_enter_pressed"]},
                },
            }
        ],
        "private_metadata": private_metadata,
        "callback_id": callback_id,
        "state": {"values": values},
        "hash": "1700000000.Zx9Yw8Vu",
        "title": {"type": "plain_text", "text": "Decline", "emoji": True},
        "clear_on_close": False,
        "notify_on_close": True,
        "close": {"type": "plain_text", "text": "Cancel", "emoji": True},
        "submit": {"type": "plain_text", "text": "Decline", "emoji": True},
        "previous_view_id": None,
        "root_view_id": root,
        "app_id": APP_ID,
        "external_id": "",
        "app_installed_team_id": TEAM,
        "bot_id": BOT_ID,
    }


def view_submission(
    callback_id: str = "decline_reason",
    private_metadata: str = CARD_VALUE,
    reason: str | None = "not today",
    *,
    user: str = "UALICE",
    org: bool = False,
) -> Json:
    """A modal submitted (`reason` None: the optional input left empty, which Slack sends as null)."""
    values = {"reason": {"reason": {"type": "plain_text_input", "value": reason}}}
    return {
        "type": "view_submission",
        "team": {"id": TEAM, "domain": "example"},
        "user": _user(user),
        "api_app_id": APP_ID,
        "token": VERIFICATION_TOKEN,
        "trigger_id": _trigger_id(),
        "view": _modal_view(callback_id, private_metadata, values),
        "response_urls": [],
        **{k: v for k, v in _workspace(org).items() if k != "team"},
    }


def view_closed(callback_id: str = "decline_reason", *, user: str = "UALICE") -> Json:
    """A modal closed with Cancel (sent because the view set `notify_on_close`)."""
    return {
        "type": "view_closed",
        "team": {"id": TEAM, "domain": "example"},
        "user": _user(user),
        "api_app_id": APP_ID,
        "token": VERIFICATION_TOKEN,
        "view": _modal_view(callback_id, CARD_VALUE, {}),
        "is_cleared": False,
        "enterprise": None,
        "is_enterprise_install": False,
    }


def _select_in_modal() -> Json:
    view = _modal_view("pick", "", {"pick": {"menu": {"type": "static_select", "selected_option": None}}})
    return {
        "type": "block_actions",
        "user": _user("UALICE"),
        "api_app_id": APP_ID,
        "token": VERIFICATION_TOKEN,
        "container": {"type": "view", "view_id": view["id"]},
        "trigger_id": _trigger_id(),
        **_workspace(False),
        "view": view,
        "actions": [
            {
                "type": "static_select",
                "action_id": "menu",
                "block_id": "pick",
                "selected_option": {
                    "text": {"type": "plain_text", "text": "Option A", "emoji": True},
                    "value": "a",
                },
                "placeholder": {"type": "plain_text", "text": "Pick one", "emoji": True},
                "action_ts": ts_now(),
            }
        ],
    }


def _home_button() -> Json:
    home = _app_home_opened()["view"]
    return {
        "type": "block_actions",
        "user": _user("UALICE"),
        "api_app_id": APP_ID,
        "token": VERIFICATION_TOKEN,
        "container": {"type": "view", "view_id": home["id"]},
        "trigger_id": _trigger_id(),
        **_workspace(False),
        "view": home,
        "actions": [
            {
                "action_id": "refresh",
                "block_id": "home",
                "text": {"type": "plain_text", "text": "Refresh", "emoji": True},
                "value": "refresh",
                "type": "button",
                "action_ts": ts_now(),
            }
        ],
    }


def _block_suggestion() -> Json:
    view = _modal_view("pick", "", {})
    return {
        "type": "block_suggestion",
        "user": _user("UALICE"),
        "container": {"type": "view", "view_id": view["id"]},
        "api_app_id": APP_ID,
        "token": VERIFICATION_TOKEN,
        "action_id": "ticket",
        "block_id": "pick",
        "value": "ab",
        **_workspace(False),
        "view": view,
    }


def global_shortcut(*, org: bool = False) -> Json:
    return {
        "type": "shortcut",
        "token": VERIFICATION_TOKEN,
        "action_ts": ts_now(),
        **_workspace(org),
        "user": {"id": "UALICE", "username": "ualice", "team_id": TEAM},
        "callback_id": "new_task",
        "trigger_id": _trigger_id(),
    }


def _message_shortcut() -> Json:
    ts = ts_now(-1_000_000)
    return {
        "type": "message_action",
        "token": VERIFICATION_TOKEN,
        "action_ts": ts_now(),
        **_workspace(False),
        "user": _user("UALICE"),
        "channel": {"id": "C1", "name": "general"},
        "callback_id": "ask_agent",
        "trigger_id": _trigger_id(),
        "response_url": RESPONSE_URL,
        "message_ts": ts,
        "message": {
            "client_msg_id": "3f0c1d2e-0000-4000-8000-000000000001",
            "type": "message",
            "text": "can someone look at the build?",
            "user": "UBOB",
            "ts": ts,
            "team": TEAM,
            "blocks": _rich_text("can someone look at the build?"),
        },
    }


def _interactive_message() -> Json:
    """A click on a legacy attachment button."""
    ts = ts_now(-1_000_000)
    return {
        "type": "interactive_message",
        "actions": [{"name": "choice", "type": "button", "value": "yes"}],
        "callback_id": "legacy_choice",
        **_workspace(False),
        "channel": {"id": "C1", "name": "general"},
        "user": {"id": "UALICE", "name": "ualice"},
        "action_ts": ts_now(),
        "message_ts": ts,
        "attachment_id": "1",
        "token": VERIFICATION_TOKEN,
        "is_app_unfurl": False,
        "original_message": {
            "type": "message",
            "subtype": "bot_message",
            "text": "Proceed?",
            "ts": ts,
            "bot_id": BOT_ID,
            "attachments": [
                {
                    "callback_id": "legacy_choice",
                    "fallback": "Proceed?",
                    "id": 1,
                    "actions": [
                        {"id": "1", "name": "choice", "text": "Yes", "type": "button", "value": "yes"}
                    ],
                }
            ],
        },
        "response_url": RESPONSE_URL,
        "trigger_id": _trigger_id(),
    }


def _dialog_submission() -> Json:
    return {
        "type": "dialog_submission",
        "token": VERIFICATION_TOKEN,
        "action_ts": ts_now(),
        **_workspace(False),
        "user": {"id": "UALICE", "name": "ualice"},
        "channel": {"id": "C1", "name": "general"},
        "submission": {"title": "a ticket", "priority": None},
        "callback_id": "ticket_dialog",
        "response_url": RESPONSE_URL,
        "state": "",
    }


def slash_command(text: str = "summarize the thread", *, org: bool = False) -> Json:
    """A slash command's fields (form-encoded over HTTP, a JSON object inside Socket Mode)."""
    fields = {
        "token": VERIFICATION_TOKEN,
        "team_id": TEAM,
        "team_domain": "example",
        "channel_id": "C1",
        "channel_name": "general",
        "user_id": "UALICE",
        "user_name": "ualice",
        "command": "/agent",
        "text": text,
        "api_app_id": APP_ID,
        "is_enterprise_install": "true" if org else "false",
        "response_url": "https://hooks.slack.com/commands/T1/1234567890/abcdefghijklmnop",
        "trigger_id": _trigger_id(),
    }
    if org:
        fields.update(enterprise_id=ENTERPRISE, enterprise_name="Example Org")
    return fields


# --- the corpus ------------------------------------------------------------------------------------


@dataclass
class _Ids:
    n: int = field(default=0)

    def event_id(self) -> str:
        self.n += 1
        return f"Ev0{time.time_ns() % 10**9}{self.n:04d}"


def deliveries() -> list[Delivery]:
    """Every kind of request this app can receive from Slack, the ones it has no listener for included."""
    ids = _Ids()

    def event(name: str, body: Json, **kw: Any) -> Delivery:
        return Delivery(name, "events_api", event_callback(body, event_id=ids.event_id(), **kw))

    mention = app_mention("what time is it?")
    return [
        event("app_mention", mention),
        event("app_mention in a thread", app_mention("and now?", thread_ts=ts_now(-60_000_000))),
        event("app_mention from an org-wide install", app_mention("hi", user="WALICE"), org=True),
        Delivery(
            "app_mention from a Slack Connect partner",
            "events_api",
            shared_channel_mention("hello from outside", event_id=ids.event_id()),
        ),
        Delivery(
            "app_mention retried by Slack",
            "events_api",
            event_callback(app_mention("retried"), event_id=ids.event_id()),
            retry=(1, "http_timeout"),
        ),
        event("message", channel_message("hello team")),
        event("message in a thread", channel_message("reply", thread_ts=ts_now(-9_000_000))),
        event("message in a DM", direct_message("what time is it?")),
        event("message in a DM thread", _im_thread_message()),
        event("message from a bot (bot_message)", _bot_message()),
        event("message from a bot (bot_profile)", _modern_bot_message()),
        event("message_changed", _message_changed()),
        event("message_deleted", _message_deleted()),
        event("message with a file", _file_share()),
        event("message from an org-wide install", channel_message("hi", user="WBOB"), org=True),
        event("reaction_added", _reaction_added()),
        event("app_home_opened", _app_home_opened()),
        event("member_joined_channel", _member_joined_channel()),
        event("channel_created", _channel_created()),
        event("team_join", _team_join()),
        event("link_shared", _link_shared()),
        event("assistant_thread_started", assistant_thread_started()),
        event("function_executed", _function_executed()),
        event("tokens_revoked", _tokens_revoked()),
        event("app_uninstalled", {"type": "app_uninstalled", "event_ts": ts_now()}),
        Delivery("team_access_granted (org-level)", "events_api", _team_access_granted()),
        Delivery(
            "url_verification",
            "events_api",
            {
                "token": VERIFICATION_TOKEN,
                "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
                "type": "url_verification",
            },
        ),
        Delivery(
            "app_rate_limited",
            "events_api",
            {
                "token": VERIFICATION_TOKEN,
                "type": "app_rate_limited",
                "team_id": TEAM,
                "minute_rate_limited": 1518467820,
                "api_app_id": APP_ID,
            },
        ),
        Delivery("block_actions: approve on a card", "interactive", block_actions("approve")),
        Delivery("block_actions: decline on a card", "interactive", block_actions("decline")),
        Delivery(
            "block_actions: approve, org-wide install",
            "interactive",
            block_actions("approve", org=True, user="WALICE"),
        ),
        Delivery("block_actions: select in a modal", "interactive", _select_in_modal()),
        Delivery("block_actions: button in App Home", "interactive", _home_button()),
        Delivery("view_submission", "interactive", view_submission()),
        Delivery("view_submission with an empty input", "interactive", view_submission(reason=None)),
        Delivery("view_submission, org-wide install", "interactive", view_submission(org=True)),
        Delivery("view_closed", "interactive", view_closed()),
        Delivery("block_suggestion", "interactive", _block_suggestion()),
        Delivery("global shortcut", "interactive", global_shortcut()),
        Delivery("global shortcut, org-wide install", "interactive", global_shortcut(org=True)),
        Delivery("message shortcut", "interactive", _message_shortcut()),
        Delivery("interactive_message (legacy attachment button)", "interactive", _interactive_message()),
        Delivery("dialog_submission (legacy)", "interactive", _dialog_submission()),
        Delivery("slash command", "slash_commands", slash_command()),
        Delivery("slash command, org-wide install", "slash_commands", slash_command(org=True)),
        Delivery(
            "slash command whose text says payload", "slash_commands", slash_command("show the payload")
        ),
        Delivery(
            "ssl_check", "slash_commands", {"ssl_check": "1", "token": VERIFICATION_TOKEN}, http_only=True
        ),
    ]


# --- malformed variants ----------------------------------------------------------------------------

Path = tuple[str | int, ...]

WRONG_TYPES: dict[str, Any] = {
    "null": None,
    "true": True,
    "0": 0,
    "1.5": 1.5,
    '"x"': "x",
    "[]": [],
    "[{}]": [{}],
    "{}": {},
}
ODD_STRINGS: dict[str, str] = {
    "empty": "",
    "lone high surrogate": "a\ud83dz",
    "lone low surrogate": "\udc00",
    "NUL": "a\x00b",
    "RTL override": "\u202etxt.exe",
    "zero-width and BOM": "\u200b\ufeffU1",
    "non-ASCII digits": "\u0661\u0662.\u0663",
    "newline-terminated": "C1\n",
    "100k characters": "x" * 100_000,
}


def paths(obj: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every path into `obj`, containers and leaves, depth first (lists: their first item only)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield (*prefix, key)
            yield from paths(value, (*prefix, key))
    elif isinstance(obj, list) and obj:
        yield (*prefix, 0)
        yield from paths(obj[0], (*prefix, 0))


def get(obj: Any, path: Path) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def replaced(obj: Any, path: Path, value: Any) -> Any:
    """A deep copy of `obj` with the value at `path` replaced."""
    out = copy.deepcopy(obj)
    get(out, path[:-1])[path[-1]] = value
    return out


def removed(obj: Any, path: Path) -> Any:
    """A deep copy of `obj` without the key (or list item) at `path`."""
    out = copy.deepcopy(obj)
    del get(out, path[:-1])[path[-1]]
    return out


def _json_type(value: Any) -> str:
    for name, kind in (("null", type(None)), ("bool", bool), ("number", int | float), ("string", str)):
        if isinstance(value, kind):
            return name
    return "array" if isinstance(value, list) else "object"


@dataclass(frozen=True)
class Mutant:
    """One corruption of a payload: what was done (`how`) and the result."""

    how: str
    payload: Any


MISSING = "missing"


def corruptions(payload: Json) -> list[tuple[Path, str]]:
    """Every single-field corruption of `payload`, as (path, what): missing, another type, odd text."""
    found: list[tuple[Path, str]] = [((), "an array"), ((), "a string")]
    for path in paths(payload):
        current = get(payload, path)
        found.append((path, MISSING))
        for label, value in WRONG_TYPES.items():
            if _json_type(value) != _json_type(current) or (value == [] and current):
                found.append((path, label))
        if isinstance(current, str):
            found.extend((path, label) for label in ODD_STRINGS)
    return found


def corrupt(payload: Json, path: Path, what: str) -> Mutant:
    """`payload` with the corruption `what` applied at `path` (a copy; `payload` is left alone)."""
    where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path) or "the payload"
    if not path:
        return Mutant(f"the payload is {what}", [payload] if what == "an array" else json.dumps(payload))
    if what == MISSING:
        return Mutant(f"{where} missing", removed(payload, path))
    value = copy.deepcopy(WRONG_TYPES[what]) if what in WRONG_TYPES else ODD_STRINGS[what]
    return Mutant(f"{where} = {what}", replaced(payload, path, value))


def mutants(payload: Json) -> Iterator[Mutant]:
    """Every single-field corruption of `payload`, applied."""
    for path, what in corruptions(payload):
        yield corrupt(payload, path, what)
