"""What the playground's Slack keeps, and how it shows it: the workspace's people and channels,
and its messages, ephemeral replies, views and files, in Slack's shape for the bot and in the
page's shape for the page.

Apart from `playground.slack`, whose `Workspace` is what people and the bot do to all this (the
page's actions and the Web API methods); here are only the state and the helpers both share,
each called with the lock held.
"""

from __future__ import annotations

import copy
import itertools
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]

TEAM_ID = "T0PLAYGND"
TEAM_NAME = "Playground"
CHANNEL_ID = "C0PLAYGND"  # the first channel: the page opens on it
CHANNEL_NAME = "playground"
OPS_CHANNEL_ID = "C0OPS"  # the second: playground/config.toml gives it another profile
OPS_CHANNEL_NAME = "ops"
BOT_USER_ID = "U0HARNESS"
BOT_ID = "B0HARNESS"
APP_ID = "A0HARNESS"
BOT_NAME = "harness"
WORKSPACE_URL = "https://playground.slack.com/"  # Slack's form, which the bot's permalink check accepts
TRIGGER_SECONDS = 3.0  # a trigger_id is good for 3 s, as in Slack
MAX_MESSAGES = 5000  # the oldest go first; a playground is not an archive
MAX_FILE_BYTES = 1 << 20  # a file the bot posts (a long answer, a turn's results in full)
SESSION_STATUSES = ("active", "processing", "suspended", "closed")  # agents.sessions.setStatus


@dataclass(frozen=True)
class Person:
    """A demo user of the playground's workspace."""

    id: str
    name: str
    real_name: str


PEOPLE = (
    Person("U01ALICE", "alice", "Alice"),
    Person("U02BOB", "bob", "Bob"),
    Person("U03CAROL", "carol", "Carol"),
)


@dataclass(frozen=True)
class Channel:
    """A channel of the playground's workspace (everyone is a member of every one)."""

    id: str
    name: str


CHANNELS = (Channel(CHANNEL_ID, CHANNEL_NAME), Channel(OPS_CHANNEL_ID, OPS_CHANNEL_NAME))


class ApiError(Exception):
    """A Web API call Slack would answer with ``{"ok": false, "error": ...}``."""

    def __init__(self, error: str, status: int = 200) -> None:
        super().__init__(error)
        self.error = error
        self.status = status


@dataclass
class Trigger:
    """Who a trigger_id was made for, and until when it may open a modal."""

    user: str
    expires: float


class SlackStore:
    """The playground's Slack state, safe to use from many threads; `changed` wakes the page."""

    def __init__(
        self,
        *,
        token: str,
        people: Iterable[Person] = PEOPLE,
        channels: Iterable[Channel] = CHANNELS,
        usergroups: Mapping[str, list[str]] | None = None,
        handles: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.token = token
        self.people = {p.id: p for p in people}
        self.channels = {c.id: c for c in channels}
        self.usergroups = dict(usergroups or {})
        # group id -> the handle it is mentioned by (@oncall); a group not given one: its id, lower case
        self.handles = {g: (handles or {}).get(g) or g.lower() for g in self.usergroups}
        self._clock = clock
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        self.version = 0
        self._last_ts = 0.0
        self._ids = itertools.count(1)
        self.messages: list[Json] = []
        self.ephemerals: list[Json] = []
        self.views: list[Json] = []  # open modals, oldest first
        self.homes: dict[str, Json] = {}
        self.statuses: list[Json] = []  # assistant.threads.setStatus calls, oldest first
        self.sessions: dict[str, str] = {}  # thread ts -> its agent session's status
        self.suggestions: list[Json] = []  # assistant.threads.setSuggestedPrompts calls
        self._triggers: dict[str, Trigger] = {}
        self.files: dict[str, Json] = {}  # file id -> name, length, title, data (once uploaded)
        self.upload_base = "http://127.0.0.1/upload/"  # where uploads go: the server sets its own

    # -- helpers (the caller holds the lock) ------------------------------------------------

    def _bump(self) -> None:
        self.version += 1
        self.changed.notify_all()

    def _next_ts(self) -> str:
        now = max(self._clock(), self._last_ts + 0.000001)
        self._last_ts = now
        return f"{now:.6f}"

    def _store(
        self,
        *,
        user: str,
        bot_id: str | None,
        text: str,
        blocks: list[Json] | None,
        thread_ts: str | None,
        channel: str,
        metadata: Json | None = None,
    ) -> Json:
        message = {
            "ts": self._next_ts(),
            "channel": channel,
            "thread_ts": thread_ts,
            "user": user,
            "bot_id": bot_id,
            "text": text,
            "blocks": blocks,
            "metadata": metadata,
            "reactions": {},
            "edited": False,
        }
        self.messages.append(message)
        del self.messages[:-MAX_MESSAGES]
        return message

    def _ephemeral(
        self, user: str, text: str, blocks: list[Json] | None, thread_ts: str | None, channel: str
    ) -> Json:
        item = {
            "ts": self._next_ts(),
            "channel": channel,
            "thread_ts": thread_ts,
            "user": user,
            "text": text,
            "blocks": blocks,
        }
        self.ephemerals.append(item)
        del self.ephemerals[:-MAX_MESSAGES]
        return item

    def _find(self, ts: str, channel: str | None = None) -> Json | None:
        """The message with this ts (in `channel`, when given: Slack finds no ts of another channel)."""
        return next((m for m in self.messages if m["ts"] == ts and channel in (None, m["channel"])), None)

    def _root(self, ts: str, missing: str, channel: str) -> str:
        """The ts of the thread that message `ts` of `channel` belongs to (its own when it starts one)."""
        message = self._find(ts, channel)
        if message is None:
            raise ApiError(missing)
        return str(message["thread_ts"] or message["ts"])

    def _own(self, ts: str, refused: str, channel: str) -> Json:
        message = self._find(ts, channel)
        if message is None:
            raise ApiError("message_not_found")
        if message["bot_id"] != BOT_ID:
            raise ApiError(refused)
        return message

    def _thread(self, params: Json) -> str:
        """The thread a status call names (`channel_id` and `thread_ts`, both required): its ts."""
        thread = self._find(str(params.get("thread_ts") or ""), self._channel_id(params))
        if thread is None:
            raise ApiError("invalid_thread_ts")
        return str(thread["thread_ts"] or thread["ts"])

    def _channel_id(self, params: Json) -> str:
        """The assistant and agent methods name their channel `channel_id`, and must."""
        if not params.get("channel_id"):
            raise ApiError("invalid_arguments")
        if params["channel_id"] not in self.channels:
            raise ApiError("channel_not_found")
        return str(params["channel_id"])

    def _channel(self, params: Json) -> str:
        """The channel a call names (`channel`, or `channel_id`), which must be one of the workspace's."""
        channel = params.get("channel") or params.get("channel_id")
        if channel not in self.channels:
            raise ApiError("channel_not_found")
        return str(channel)

    def _view_id(self) -> str:
        return f"V{next(self._ids):010d}"

    def _hash(self) -> str:
        return f"{int(self._clock())}.{secrets.token_hex(4)}"

    def _view_out(self, entry: Json) -> Json:
        return {
            **copy.deepcopy(entry["view"]),
            "id": entry["id"],
            "hash": entry["hash"],
            "team_id": TEAM_ID,
            "app_id": APP_ID,
            "bot_id": BOT_ID,
        }

    def _as_slack(self, message: Json, *, metadata: bool = False) -> Json:
        """A message as Slack's API returns it."""
        out: Json = {"type": "message", "ts": message["ts"], "text": message["text"], "user": message["user"]}
        if message["bot_id"]:
            out.update(bot_id=message["bot_id"], app_id=APP_ID)
        if message["blocks"] is not None:
            out["blocks"] = copy.deepcopy(message["blocks"])
        if message["thread_ts"]:
            out["thread_ts"] = message["thread_ts"]
        if metadata and message["metadata"]:
            out["metadata"] = copy.deepcopy(message["metadata"])
        if message.get("files"):
            out["files"] = copy.deepcopy(message["files"])
        if message["reactions"]:
            out["reactions"] = _reactions(message)
        out["team"] = TEAM_ID
        return out

    def file_text(self, file_id: str) -> str:
        """A file's content as text, for the page (the caller holds the lock)."""
        data = (self.files.get(file_id) or {}).get("data") or b""
        return data.decode("utf-8", errors="replace")

    def _for_page(self, message: Json) -> Json:
        return {
            "ts": message["ts"],
            "channel": message["channel"],
            "thread_ts": message["thread_ts"],
            "user": message["user"],
            "bot_id": message["bot_id"],
            "text": message["text"],
            "blocks": copy.deepcopy(message["blocks"]),
            "reactions": _reactions(message),
            "edited": message["edited"],
            "streaming": bool(message.get("streaming")),
            "tasks": copy.deepcopy(message.get("tasks") or []),
            "task_display_mode": message.get("task_display_mode"),
            "files": [
                {"name": f["name"], "title": f["title"], "text": self.file_text(f["id"])}
                for f in message.get("files") or []
            ],
        }


def _reactions(message: Json) -> list[Json]:
    """A message's reactions as Slack lists them."""
    return [
        {"name": name, "users": list(users), "count": len(users)}
        for name, users in message["reactions"].items()
    ]
