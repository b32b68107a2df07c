"""The playground's Slack: one workspace, two channels, a few people, and the Web API methods the bot calls.

`Workspace` holds everything a person sees on the page (messages and threads, reactions, their
ephemeral replies, their open modals, their App Home) and answers the bot's Web API calls
(`call`), the way Slack answers them: the same methods, the same `ok`/`error` shape, the same
error names for the mistakes the bot could make (an unknown message, an expired trigger id, a
view hash that no longer matches). Every change bumps `version`, which the page follows.

It is a stand-in for trying the product, not a test fake: it validates what the bot relies on and
keeps whatever Slack would keep; it does not enforce Block Kit's limits (the tests' fake does).

What it keeps, and in which shape each side sees it, is `playground.slack_store`; this module is
what is done to it: a person's actions on the page and the bot's Web API methods. The workspace's
people, channels and ids are importable from here too, as the playground's modules import them.
"""

from __future__ import annotations

import copy
import json
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from playground import stream_chunks
from playground.slack_store import (
    APP_ID,
    BOT_ID,
    BOT_NAME,
    BOT_USER_ID,
    CHANNEL_ID,
    CHANNELS,
    MAX_FILE_BYTES,
    MAX_MESSAGES,
    OPS_CHANNEL_ID,
    PEOPLE,
    SESSION_STATUSES,
    TEAM_ID,
    TEAM_NAME,
    TRIGGER_SECONDS,
    WORKSPACE_URL,
    ApiError,
    Channel,
    Json,
    Person,
    SlackStore,
    Trigger,
)
from playground.view_inputs import Refused, check_inputs

__all__ = [
    "APP_ID",
    "BOT_USER_ID",
    "CHANNEL_ID",
    "CHANNELS",
    "OPS_CHANNEL_ID",
    "PEOPLE",
    "TEAM_ID",
    "ApiError",
    "Channel",
    "Person",
    "Workspace",
]


class Workspace(SlackStore):
    """The playground's Slack: what a person does on the page, and the Web API the bot calls."""

    # -- what the page does -------------------------------------------------------------------

    def post_as(self, user: str, text: str, thread_ts: str | None, channel: str = CHANNEL_ID) -> Json:
        """A person's message in `channel` (or a thread of it there); the message as stored."""
        with self._lock:
            if user not in self.people:
                raise ApiError("user_not_found")
            channel = self._channel({"channel": channel})
            if thread_ts is not None:
                thread_ts = self._root(thread_ts, "thread_not_found", channel)
            message = self._store(
                user=user, bot_id=None, text=text, blocks=None, thread_ts=thread_ts, channel=channel
            )
            self._bump()
            return copy.deepcopy(message)

    def message(self, ts: str) -> Json | None:
        """A copy of the message with this ts, as Slack echoes it in a click's payload."""
        with self._lock:
            found = self._find(ts)
            return self._as_slack(found) if found else None

    def channel_of(self, ts: str) -> Channel | None:
        """The channel of the message or ephemeral message with this ts."""
        with self._lock:
            found = self._find(ts) or next((e for e in self.ephemerals if e["ts"] == ts), None)
            return self.channels.get(found["channel"]) if found else None

    def ephemeral(self, ts: str, user: str) -> Json | None:
        """A copy of `user`'s ephemeral message with this ts."""
        with self._lock:
            for item in self.ephemerals:
                if item["ts"] == ts and item["user"] == user:
                    return copy.deepcopy(item)
            return None

    def view(self, view_id: str, user: str) -> Json | None:
        """A copy of an open modal or App Home view of `user`, with its id and hash."""
        with self._lock:
            for entry in self.views:
                if entry["id"] == view_id and entry["user"] == user:
                    return self._view_out(entry)
            home = self.homes.get(user)
            if home and home["id"] == view_id:
                return self._view_out(home)
            return None

    def new_trigger(self, user: str) -> str:
        """A trigger_id for one click or submission by `user`, good for `TRIGGER_SECONDS`."""
        trigger = f"{next(self._ids)}.{int(self._clock())}.{secrets.token_hex(16)}"
        with self._lock:
            now = time.monotonic()
            self._triggers = {k: t for k, t in self._triggers.items() if t.expires > now}
            self._triggers[trigger] = Trigger(user, now + TRIGGER_SECONDS)
        return trigger

    def close_view(self, view_id: str, user: str, errors: Mapping[str, str] | None = None) -> None:
        """Take a modal off the page; with `errors`, keep it open and show them instead."""
        with self._lock:
            for entry in self.views:
                if entry["id"] == view_id and entry["user"] == user:
                    if errors:
                        entry["errors"] = dict(errors)
                    else:
                        self.views.remove(entry)
                    self._bump()
                    return

    def respond(
        self, user: str, channel: str, message_ts: str, thread_ts: str | None, body: Mapping[str, Any]
    ) -> None:
        """A `response_url` POST: replace or delete the clicked message, or an ephemeral reply."""
        text, blocks = str(body.get("text") or ""), _blocks(body.get("blocks"))
        with self._lock:
            target = self._find(message_ts, channel)
            if body.get("delete_original") and target is not None and target["bot_id"]:
                self.messages.remove(target)
            elif body.get("replace_original") and target is not None and target["bot_id"]:
                target.update(text=text, blocks=blocks, edited=True)
            elif body.get("response_type") == "in_channel":
                self._store(
                    user=BOT_USER_ID,
                    bot_id=BOT_ID,
                    text=text,
                    blocks=blocks,
                    thread_ts=thread_ts,
                    channel=channel,
                )
            else:
                self._ephemeral(user, text, blocks, thread_ts, channel)
            self._bump()

    def snapshot(self) -> Json:
        """Everything the page shows (all users' parts: the page shows the chosen user's)."""
        with self._lock:
            return {
                "version": self.version,
                "team": {"id": TEAM_ID, "name": TEAM_NAME},
                "channels": [{"id": c.id, "name": c.name} for c in self.channels.values()],
                "bot": {"user_id": BOT_USER_ID, "bot_id": BOT_ID, "name": BOT_NAME},
                "groups": [{"id": g, "handle": h} for g, h in self.handles.items()],
                "messages": [self._for_page(m) for m in self.messages],
                "ephemerals": copy.deepcopy(self.ephemerals),
                "views": [
                    {"id": e["id"], "user": e["user"], "view": self._view_out(e), "errors": e["errors"]}
                    for e in self.views
                ],
                "homes": {user: self._view_out(entry) for user, entry in self.homes.items()},
            }

    def touch(self) -> None:
        """Something the page shows besides the workspace changed (the bot's deliveries): wake it."""
        with self._lock:
            self._bump()

    def wait_change(self, seen: int, timeout: float) -> int:
        """Block until `version` passes `seen` or `timeout` passes; the version then."""
        with self.changed:
            self.changed.wait_for(lambda: self.version != seen, timeout)
            return self.version

    # -- what the bot does: the Web API ----------------------------------------------------

    def call(self, method: str, params: Mapping[str, Any], token: str | None) -> Json:
        """Answer one Web API call: ``{"ok": true, ...}`` or raise `ApiError`."""
        handler = self._methods().get(method)
        if handler is None:
            raise ApiError("unknown_method", status=404)
        if method != "api.test":
            if not token:
                raise ApiError("not_authed")
            if not secrets.compare_digest(token, self.token):
                raise ApiError("invalid_auth")
        with self._lock:
            try:
                result = handler(dict(params))
            except stream_chunks.BadChunks:
                raise ApiError("invalid_arguments") from None
            self._bump()
        return {"ok": True, **result}

    def _methods(self) -> dict[str, Callable[[Json], Json]]:
        return {
            "api.test": lambda params: {"args": params},
            "auth.test": self._auth_test,
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "chat.delete": self._delete,
            "chat.postEphemeral": self._post_ephemeral,
            "chat.getPermalink": self._permalink,
            "reactions.add": self._reaction(add=True),
            "reactions.remove": self._reaction(add=False),
            "conversations.replies": self._replies,
            "users.info": self._user_info,
            "usergroups.list": self._groups,
            "usergroups.users.list": self._group_members,
            "views.open": self._views_open,
            "views.push": self._views_open,
            "views.update": self._views_update,
            "views.publish": self._views_publish,
            "assistant.threads.setStatus": self._set_status,
            "assistant.threads.setSuggestedPrompts": self._suggest_prompts,
            "agents.sessions.setStatus": self._session_status,
            "chat.startStream": self._start_stream,
            "chat.appendStream": self._append_stream,
            "chat.stopStream": self._stop_stream,
            "files.getUploadURLExternal": self._upload_url,
            "files.completeUploadExternal": self._complete_upload,
        }

    def _auth_test(self, params: Json) -> Json:
        return {
            "url": WORKSPACE_URL,
            "team": TEAM_NAME,
            "user": BOT_NAME,
            "team_id": TEAM_ID,
            "user_id": BOT_USER_ID,
            "bot_id": BOT_ID,
            "is_enterprise_install": False,
        }

    def _post_message(self, params: Json) -> Json:
        channel = self._channel(params)
        text, blocks = _content(params)
        thread_ts = params.get("thread_ts") or None
        if thread_ts is not None:
            thread_ts = self._root(str(thread_ts), "thread_not_found", channel)
        message = self._store(
            user=BOT_USER_ID,
            bot_id=BOT_ID,
            text=text,
            blocks=blocks,
            thread_ts=thread_ts,
            channel=channel,
            metadata=_metadata(params.get("metadata")),
        )
        return {"channel": channel, "ts": message["ts"], "message": self._as_slack(message)}

    def _update(self, params: Json) -> Json:
        channel = self._channel(params)
        message = self._own(str(params.get("ts") or ""), "cant_update_message", channel)
        if message.get("streaming"):
            raise ApiError("message_is_streaming")
        text, blocks = _content(params, required=False)
        if "text" in params:
            message["text"] = text
        if "blocks" in params:  # omitted blocks are kept, as Slack does
            message["blocks"] = blocks
        if "metadata" in params:
            message["metadata"] = _metadata(params["metadata"])
        message["edited"] = not message.pop("streamed", False)  # settling a stream is no edit
        return {"channel": channel, "ts": message["ts"], "text": message["text"]}

    def _delete(self, params: Json) -> Json:
        channel = self._channel(params)
        message = self._own(str(params.get("ts") or ""), "cant_delete_message", channel)
        self.messages.remove(message)
        return {"channel": channel, "ts": message["ts"]}

    def _post_ephemeral(self, params: Json) -> Json:
        channel = self._channel(params)
        user = str(params.get("user") or "")
        if user not in self.people:
            raise ApiError("user_not_in_channel")
        text, blocks = _content(params)
        thread_ts = params.get("thread_ts") or None
        item = self._ephemeral(user, text, blocks, str(thread_ts) if thread_ts else None, channel)
        return {"message_ts": item["ts"]}

    def _permalink(self, params: Json) -> Json:
        channel = self._channel(params)
        message = self._find(str(params.get("message_ts") or ""), channel)
        if message is None:
            raise ApiError("message_not_found")
        # Slack's own form (the bot accepts nothing else); the page turns it into "scroll to that message".
        link = f"{WORKSPACE_URL}archives/{channel}/p{message['ts'].replace('.', '')}"
        if message["thread_ts"]:
            link += f"?thread_ts={message['thread_ts']}&cid={channel}"
        return {"channel": channel, "permalink": link}

    def _reaction(self, *, add: bool) -> Callable[[Json], Json]:
        def react(params: Json) -> Json:
            channel = self._channel(params)
            message = self._find(str(params.get("timestamp") or ""), channel)
            if message is None:
                raise ApiError("message_not_found")
            name = str(params.get("name") or "").strip(":")
            if not name:
                raise ApiError("invalid_name")
            users = message["reactions"].setdefault(name, [])
            if add:
                if BOT_USER_ID in users:
                    raise ApiError("already_reacted")
                users.append(BOT_USER_ID)
            else:
                if BOT_USER_ID not in users:
                    raise ApiError("no_reaction")
                users.remove(BOT_USER_ID)
                if not users:
                    del message["reactions"][name]
            return {}

        return react

    def _replies(self, params: Json) -> Json:
        channel = self._channel(params)
        root = self._root(str(params.get("ts") or ""), "thread_not_found", channel)
        thread = [m for m in self.messages if m["ts"] == root or m["thread_ts"] == root]
        with_metadata = str(params.get("include_all_metadata")).lower() in ("1", "true")
        found = [self._as_slack(m, metadata=with_metadata) for m in thread]
        return {"messages": found, "has_more": False, "response_metadata": {"next_cursor": ""}}

    def _user_info(self, params: Json) -> Json:
        person = self.people.get(str(params.get("user") or ""))
        if person is None:
            raise ApiError("user_not_found")
        return {
            "user": {
                "id": person.id,
                "team_id": TEAM_ID,
                "name": person.name,
                "real_name": person.real_name,
                "is_bot": False,
                "deleted": False,
                "tz": "UTC",
                "profile": {"real_name": person.real_name, "display_name": person.name},
            }
        }

    def _groups(self, params: Json) -> Json:
        """The workspace's user groups, as Slack lists them (members with `include_users`)."""
        listed = []
        for group, users in self.usergroups.items():
            handle = self.handles[group]
            entry = {"id": group, "team_id": TEAM_ID, "is_usergroup": True, "name": handle.title()}
            entry.update(handle=handle, date_delete=0)
            if str(params.get("include_users", "")).lower() in ("1", "true"):
                entry["users"] = list(users)
            listed.append(entry)
        return {"usergroups": listed}

    def _group_members(self, params: Json) -> Json:
        group = str(params.get("usergroup") or "")
        if group not in self.usergroups:
            raise ApiError("no_such_subteam")
        return {"users": list(self.usergroups[group])}

    def _views_open(self, params: Json) -> Json:
        trigger = self._triggers.pop(str(params.get("trigger_id") or ""), None)
        if trigger is None:
            raise ApiError("invalid_trigger_id")
        if trigger.expires < time.monotonic():
            raise ApiError("expired_trigger_id")
        view = _view(params, "modal")
        entry = {
            "id": self._view_id(),
            "hash": self._hash(),
            "user": trigger.user,
            "view": view,
            "errors": {},
        }
        self.views.append(entry)
        return {"view": self._view_out(entry)}

    def _views_update(self, params: Json) -> Json:
        view_id, external_id = params.get("view_id"), params.get("external_id")
        view = _view(params, "modal")
        for entry in self.views:
            if entry["id"] == view_id or (external_id and entry["view"].get("external_id") == external_id):
                if params.get("hash") and params["hash"] != entry["hash"]:
                    raise ApiError("hash_conflict")
                entry.update(view=view, hash=self._hash(), errors={})
                return {"view": self._view_out(entry)}
        raise ApiError("not_found")

    def _views_publish(self, params: Json) -> Json:
        user = str(params.get("user_id") or "")
        if user not in self.people:
            raise ApiError("user_not_found")
        view = _view(params, "home")
        entry = self.homes.get(user)
        if params.get("hash") and (entry is None or params["hash"] != entry["hash"]):
            raise ApiError("hash_conflict")
        view_id = entry["id"] if entry else self._view_id()
        self.homes[user] = {"id": view_id, "hash": self._hash(), "user": user, "view": view, "errors": {}}
        return {"view": self._view_out(self.homes[user])}

    def _start_stream(self, params: Json) -> Json:
        channel = self._channel(params)
        thread_ts = self._root(
            str(params.get("thread_ts") or ""), "invalid_arguments", channel
        )  # in a thread
        if not (params.get("recipient_team_id") and params.get("recipient_user_id")):
            raise ApiError("invalid_arguments")  # required in a channel
        chunks = stream_chunks.parse_chunks(params.get("chunks"))
        mode = stream_chunks.display_mode(params.get("task_display_mode"))
        message = self._store(
            user=BOT_USER_ID, bot_id=BOT_ID, text="", blocks=None, thread_ts=thread_ts, channel=channel
        )
        message.update(streaming=True, streamed=True, task_display_mode=mode)
        stream_chunks.apply(message, str(params.get("markdown_text") or ""), chunks)
        return {"channel": channel, "ts": message["ts"]}

    def _streaming(self, params: Json) -> Json:
        channel = self._channel(params)
        message = self._own(str(params.get("ts") or ""), "cant_update_message", channel)
        if not message.get("streaming"):
            raise ApiError("message_not_in_streaming_state")
        return message

    def _append_stream(self, params: Json) -> Json:
        message, chunks = self._streaming(params), stream_chunks.parse_chunks(params.get("chunks"))
        if not params.get("markdown_text") and not chunks:
            raise ApiError("invalid_arguments")
        stream_chunks.apply(message, str(params.get("markdown_text") or ""), chunks)
        return {"channel": message["channel"], "ts": message["ts"]}

    def _stop_stream(self, params: Json) -> Json:
        message, chunks = self._streaming(params), stream_chunks.parse_chunks(params.get("chunks"))
        metadata = _metadata(params["metadata"]) if params.get("metadata") else message["metadata"]
        stream_chunks.apply(message, str(params.get("markdown_text") or ""), chunks)
        message.update(streaming=False, metadata=metadata)
        return {"channel": message["channel"], "ts": message["ts"]}

    def _upload_url(self, params: Json) -> Json:
        name, length = str(params.get("filename") or ""), str(params.get("length") or "")
        if not name or not length.isdigit() or not 0 < int(length) <= MAX_FILE_BYTES:
            raise ApiError("invalid_arguments")
        file_id = f"F{next(self._ids):010d}"
        self.files[file_id] = {"id": file_id, "name": name, "length": int(length), "data": None}
        return {"file_id": file_id, "upload_url": f"{self.upload_base}{file_id}"}

    def upload(self, file_id: str, data: bytes) -> bool:
        """The bytes of a file, POSTed to its upload URL: they must be exactly the length asked for."""
        with self._lock:
            entry = self.files.get(file_id)
            if entry is None or entry["data"] is not None or len(data) != entry["length"]:
                return False
            entry["data"] = bytes(data)
            return True

    def _complete_upload(self, params: Json) -> Json:
        files = _decoded(params.get("files"))
        if not isinstance(files, list) or not files or not all(isinstance(f, dict) for f in files):
            raise ApiError("invalid_arguments")
        done = []
        for item in files:
            entry = self.files.get(str(item.get("id")))
            if entry is None:
                raise ApiError("file_not_found")
            if entry["data"] is None:
                raise ApiError("upload_incomplete")
            entry["title"] = str(item.get("title") or entry["name"])
            done.append(
                {"id": entry["id"], "name": entry["name"], "title": entry["title"], "size": entry["length"]}
            )
        if params.get("channel_id"):
            channel = self._channel({"channel": params["channel_id"]})
            thread_ts = params.get("thread_ts") or None
            if thread_ts is not None:
                thread_ts = self._root(str(thread_ts), "invalid_thread_ts", channel)
            text = str(params.get("initial_comment") or "")
            message = self._store(
                user=BOT_USER_ID, bot_id=BOT_ID, text=text, blocks=None, thread_ts=thread_ts, channel=channel
            )
            message["files"] = done
        return {"files": done}

    def _set_status(self, params: Json) -> Json:
        self._thread(params)
        if not isinstance(params.get("status"), str):  # required; "" clears the line
            raise ApiError("invalid_arguments")
        self.statuses.append({k: params.get(k) for k in ("channel_id", "thread_ts", "status")})
        del self.statuses[:-MAX_MESSAGES]
        return {}

    def _session_status(self, params: Json) -> Json:
        """An agent session's status: `processing`, `suspended`, `closed` (or `active`), per thread."""
        status = params.get("status")
        if status not in SESSION_STATUSES:
            raise ApiError("invalid_arguments")
        self.sessions[self._thread(params)] = str(status)
        return {"status": status}

    def _suggest_prompts(self, params: Json) -> Json:
        self._channel_id(params)
        prompts = _decoded(params.get("prompts"))
        if not isinstance(prompts, list) or not 1 <= len(prompts) <= 4:
            raise ApiError("invalid_arguments")
        if not all(
            isinstance(p, dict) and isinstance(p.get("title"), str) and p.get("message") for p in prompts
        ):
            raise ApiError("invalid_arguments")
        self.suggestions.append({"thread_ts": params.get("thread_ts"), "prompts": copy.deepcopy(prompts)})
        del self.suggestions[:-MAX_MESSAGES]
        return {}


def _decoded(value: Any) -> Any:
    """A form field that carries JSON (blocks, view, metadata) as its text, decoded."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except ValueError:
            raise ApiError("invalid_arguments") from None
    return value


def _blocks(value: Any) -> list[Json] | None:
    value = _decoded(value)
    if value is None or value == "":
        return None
    if not isinstance(value, list) or not all(isinstance(b, dict) and "type" in b for b in value):
        raise ApiError("invalid_blocks")
    return _with_block_ids(value)


def _with_block_ids(blocks: list[Json]) -> list[Json]:
    """A copy of `blocks` in which each block without a `block_id` has one, as Slack gives them."""
    return [{**copy.deepcopy(b), "block_id": b.get("block_id") or secrets.token_urlsafe(4)} for b in blocks]


def _content(params: Json, *, required: bool = True) -> tuple[str, list[Json] | None]:
    text, blocks = params.get("text"), _blocks(params.get("blocks"))
    if required and not text and not blocks:
        raise ApiError("no_text")
    if text is not None and not isinstance(text, str):
        raise ApiError("invalid_arguments")
    return text or "", blocks


def _metadata(value: Any) -> Json | None:
    value = _decoded(value)
    if value is None or value == "":
        return None
    if not (isinstance(value, dict) and isinstance(value.get("event_type"), str)):
        raise ApiError("invalid_metadata_schema")
    if not isinstance(value.get("event_payload"), dict):
        raise ApiError("invalid_metadata_schema")
    return copy.deepcopy(value)


def _view(params: Json, kind: str) -> Json:
    view = _decoded(params.get("view"))
    if not isinstance(view, dict) or view.get("type") != kind:
        raise ApiError("invalid_arguments")
    if not isinstance(view.get("blocks"), list) or not all(isinstance(b, dict) for b in view["blocks"]):
        raise ApiError("invalid_arguments")
    try:
        check_inputs(view["blocks"])
    except Refused:
        raise ApiError("invalid_arguments") from None
    return {**copy.deepcopy(view), "blocks": _with_block_ids(view["blocks"])}
