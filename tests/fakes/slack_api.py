"""A loopback stand-in for the Slack Web API, for tests.

:class:`FakeSlackAPI` runs a :class:`http.server.ThreadingHTTPServer` on ``127.0.0.1``
(OS-chosen port) in a daemon thread.  Point a real ``slack_sdk.WebClient`` at it with
``WebClient(token=..., base_url=fake.base_url)`` -- in this process or in a subprocess
(e.g. via a ``SLACK_API_URL`` environment variable) -- and it answers the handful of Web
API methods the bot uses the way Slack does, keeping the resulting workspace state
(messages, threads, reactions, views, ephemerals) in memory for assertions.

All state lives behind one re-entrant lock shared with a :class:`threading.Condition`
that is notified after every request, so tests can block on :meth:`FakeSlackAPI.wait_for`
instead of sleeping.

Block Kit payloads are validated the way Slack would reject them (see
:func:`validate_blocks`), so a bot that builds an over-long section or a duplicate
``action_id`` fails in tests exactly as it would in production.
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from slack_sdk.errors import SlackObjectFormationError
from slack_sdk.models.blocks import Block
from slack_sdk.models.views import View

__all__ = [
    "Call",
    "FakeSlackAPI",
    "MAX_BLOCKS_PER_MESSAGE",
    "MAX_BLOCKS_PER_VIEW",
    "validate_blocks",
]

# Limits Slack enforces on messages and Block Kit payloads.
MAX_BLOCKS_PER_MESSAGE = 50
MAX_BLOCKS_PER_VIEW = 100
MAX_BLOCKS_JSON_CHARS = 13_000
MAX_MESSAGE_TEXT = 40_000
SECTION_TEXT_MAX = 3000
SECTION_FIELDS_MAX = 10
SECTION_FIELD_TEXT_MAX = 2000
HEADER_TEXT_MAX = 150
CONTEXT_ELEMENTS_MAX = 10
BUTTON_TEXT_MAX = 75
BUTTON_VALUE_MAX = 2000
ID_MAX = 255
MAX_SUGGESTED_PROMPTS = 4
AGENT_SESSION_STATUSES = ("active", "processing", "suspended", "closed")
TASK_STATUSES = ("pending", "in_progress", "complete", "error")  # a task_update chunk's status
_ADDED_TASK_FIELDS = ("details", "output")  # a task update adds to these (see _apply_tasks)
AGENT_SESSION_TITLE_MAX = 200
# What an app not set up as an agent hears from agents.sessions.setStatus. Slack's reference does
# not name it; the bot treats any refusal alike, so the name is this fake's own.
NOT_AN_AGENT = "not_an_agent"

_TS_BASE_MICROS = 1_700_000_000_000_000
_TS_STEP_MICROS = 100
_JSON_FIELDS = ("blocks", "attachments", "view", "metadata", "files")
_TEXT_OBJECT_TYPES = ("mrkdwn", "plain_text")


@dataclass(frozen=True)
class Call:
    """One request the fake answered.

    ``params`` are the normalised request parameters (query string, form or JSON body
    merged; ``blocks``/``attachments``/``view``/``metadata`` decoded from JSON strings;
    ``token`` removed).  ``errors`` holds Slack's detailed ``errors`` list for
    ``invalid_blocks`` (or the view validation messages), ``status`` the HTTP status
    answered and ``response`` the JSON body answered.
    """

    method: str
    params: dict[str, Any]
    ok: bool
    error: str | None
    status: int = 200
    errors: list[str] = field(default_factory=list)
    response: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.monotonic)  # when it was answered (this process's clock)


@dataclass
class _Failure:
    """A queued injected failure for one method (see :meth:`FakeSlackAPI.fail_next`)."""

    error: str
    status: int
    headers: dict[str, str]
    remaining: int


class _ApiError(Exception):
    """Raised by method handlers to answer ``{"ok": false, "error": ...}``."""

    def __init__(self, error: str, *, errors: list[str] | None = None) -> None:
        super().__init__(error)
        self.error = error
        self.errors = errors or []


# ---------------------------------------------------------------------------
# Block validation
# ---------------------------------------------------------------------------


def _text_of(obj: Any) -> str:
    """Return the ``text`` of a text object (dict) or the string itself, else ``""``."""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        text = obj.get("text")
        if isinstance(text, str):
            return text
    return ""


def _check_element(element: Any, pointer: str, errors: list[str]) -> None:
    """Apply the explicit per-element limits (ids, button text/value) to one element."""
    if not isinstance(element, dict):
        errors.append(f"must be an object [json-pointer:{pointer}]")
        return
    action_id = element.get("action_id")
    if isinstance(action_id, str) and len(action_id) > ID_MAX:
        errors.append(f"must be less than {ID_MAX + 1} characters [json-pointer:{pointer}/action_id]")
    if element.get("type") == "button":
        if len(_text_of(element.get("text"))) > BUTTON_TEXT_MAX:
            errors.append(
                f"must be less than {BUTTON_TEXT_MAX + 1} characters [json-pointer:{pointer}/text/text]"
            )
        value = element.get("value")
        if isinstance(value, str) and len(value) > BUTTON_VALUE_MAX:
            errors.append(
                f"must be less than {BUTTON_VALUE_MAX + 1} characters [json-pointer:{pointer}/value]"
            )


def _check_block_limits(block: dict[str, Any], pointer: str, errors: list[str]) -> None:
    """Apply the explicit type-specific limits Slack enforces to one block dict."""
    kind = block.get("type")
    if kind in ("section", "header") and "text" in block and not isinstance(block["text"], dict):
        errors.append(f"must be a text object [json-pointer:{pointer}/text]")
    if kind in ("actions", "context") and not isinstance(block.get("elements"), list):
        errors.append(f"must be an array [json-pointer:{pointer}/elements]")
    if kind == "section":
        if len(_text_of(block.get("text"))) > SECTION_TEXT_MAX:
            errors.append(
                f"must be less than {SECTION_TEXT_MAX + 1} characters [json-pointer:{pointer}/text/text]"
            )
        fields = block.get("fields")
        if isinstance(fields, list):
            if len(fields) > SECTION_FIELDS_MAX:
                errors.append(
                    f"must be no more than {SECTION_FIELDS_MAX} items [json-pointer:{pointer}/fields]"
                )
            for j, item in enumerate(fields):
                if len(_text_of(item)) > SECTION_FIELD_TEXT_MAX:
                    errors.append(
                        f"must be less than {SECTION_FIELD_TEXT_MAX + 1} characters "
                        f"[json-pointer:{pointer}/fields/{j}/text]"
                    )
        if "accessory" in block:
            _check_element(block["accessory"], f"{pointer}/accessory", errors)
    elif kind == "header":
        if len(_text_of(block.get("text"))) > HEADER_TEXT_MAX:
            errors.append(
                f"must be less than {HEADER_TEXT_MAX + 1} characters [json-pointer:{pointer}/text/text]"
            )
    elif kind == "context":
        elements = block.get("elements")
        if isinstance(elements, list) and len(elements) > CONTEXT_ELEMENTS_MAX:
            errors.append(
                f"must be no more than {CONTEXT_ELEMENTS_MAX} items [json-pointer:{pointer}/elements]"
            )
    elif kind == "actions":
        elements = block.get("elements")
        if isinstance(elements, list):
            seen: set[str] = set()
            for j, element in enumerate(elements):
                _check_element(element, f"{pointer}/elements/{j}", errors)
                action_id = element.get("action_id") if isinstance(element, dict) else None
                if isinstance(action_id, str):
                    if action_id in seen:
                        errors.append(
                            f"duplicate action_id '{action_id}' "
                            f"[json-pointer:{pointer}/elements/{j}/action_id]"
                        )
                    seen.add(action_id)
    elif kind == "input" and "element" in block:
        _check_element(block["element"], f"{pointer}/element", errors)


def validate_blocks(blocks: Any, *, max_blocks: int = MAX_BLOCKS_PER_MESSAGE) -> list[str]:
    """Validate a list of Block Kit block dicts the way Slack does; return error strings.

    Every block is parsed with ``slack_sdk.models.blocks.Block.parse`` and validated with
    ``validate_json()`` (and ``to_dict()``, which validates nested elements); unknown or
    unparseable types are errors.  On top of that the documented limits are enforced
    explicitly (block count, section/field/header text lengths, context elements, button
    text/value, ``action_id``/``block_id`` length, duplicate ``action_id`` within an
    actions block, duplicate ``block_id`` in the payload).  Errors are formatted like
    Slack's: ``"<message> [json-pointer:/blocks/N/...]"``.  The overall JSON size limit
    (``msg_blocks_too_long``) is *not* checked here.
    """
    if not isinstance(blocks, list):
        return ["must be an array [json-pointer:/blocks]"]
    errors: list[str] = []
    if len(blocks) > max_blocks:
        errors.append(f"must be no more than {max_blocks} items [json-pointer:/blocks]")
    block_ids: set[str] = set()
    for i, raw in enumerate(blocks):
        pointer = f"/blocks/{i}"
        if not isinstance(raw, dict):
            errors.append(f"must be an object [json-pointer:{pointer}]")
            continue
        if not isinstance(raw.get("type"), str):
            errors.append(f"missing required field: type [json-pointer:{pointer}]")
            continue
        try:
            parsed = Block.parse(copy.deepcopy(raw))
        except Exception as exc:  # noqa: BLE001 - any constructor failure means "invalid"
            errors.append(f"invalid block: {exc} [json-pointer:{pointer}]")
            continue
        if parsed is None:
            errors.append(f"unsupported type: {raw['type']} [json-pointer:{pointer}/type]")
            continue
        try:
            parsed.validate_json()
            parsed.to_dict()  # validates nested elements / text objects too
        except SlackObjectFormationError as exc:
            errors.append(f"{exc} [json-pointer:{pointer}]")
        except Exception as exc:  # noqa: BLE001 - malformed nested structures
            errors.append(f"invalid block: {exc} [json-pointer:{pointer}]")
        block_id = raw.get("block_id")
        if isinstance(block_id, str):
            if len(block_id) > ID_MAX:
                errors.append(f"must be less than {ID_MAX + 1} characters [json-pointer:{pointer}/block_id]")
            if block_id in block_ids:
                errors.append(f"duplicate block_id '{block_id}' [json-pointer:{pointer}/block_id]")
            block_ids.add(block_id)
        _check_block_limits(raw, pointer, errors)
    return errors


def _collect_texts(obj: Any, out: list[str]) -> None:
    """Append every mrkdwn/plain_text (and rich-text ``text``) string found in ``obj``."""
    if isinstance(obj, dict):
        text = obj.get("text")
        if obj.get("type") in (*_TEXT_OBJECT_TYPES, "text") and isinstance(text, str):
            out.append(text)
        for value in obj.values():
            if isinstance(value, (dict, list)):
                _collect_texts(value, out)
    elif isinstance(obj, list):
        for item in obj:
            _collect_texts(item, out)


# ---------------------------------------------------------------------------
# HTTP plumbing
# ---------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its :class:`FakeSlackAPI`."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the default of 5 drops SYNs under concurrent clients (1 s stalls)

    def __init__(self, fake: FakeSlackAPI) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fake = fake
        self.accepted = 0  # connections accepted so far
        self.open: set[socket.socket] = set()  # connections open now
        self._conn_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conn_lock:
            self.accepted += 1
            self.open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conn_lock:
            self.open.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> int:
        """Close every open connection from this side, as a server does with idle keep-alives."""
        with self._conn_lock:
            conns, self.open = list(self.open), set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        return len(conns)


class _Handler(BaseHTTPRequestHandler):
    """Reads each request of a connection (HTTP/1.1 keep-alive, as Slack's servers), hands it to
    the fake, writes the JSON answer."""

    server: _Server
    server_version = "FakeSlackAPI/1.0"
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        self._handle()

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self._handle()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Silence the default stderr access log."""

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        status, headers, body = self.server.fake._dispatch(self.path, raw, self.headers)
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        if self.server.fake.scopes is not None:
            self.send_header("x-oauth-scopes", ",".join(self.server.fake.scopes))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def _mentions(raw: bytes, needle: bytes) -> bool:
    """Whether a request body holds `needle`, form-encoded, JSON-escaped or as it is."""
    from urllib.parse import quote_plus

    text = needle.decode()
    forms = {needle, quote_plus(text).encode(), json.dumps(text)[1:-1].encode()}
    return any(form in raw for form in forms)


def _parse_params(query: str, raw: bytes, content_type: str) -> dict[str, Any]:
    """Merge query-string and body parameters (form or JSON) into one dict."""
    params: dict[str, Any] = dict(parse_qsl(query, keep_blank_values=True))
    if raw:
        text = raw.decode("utf-8")
        if "json" in content_type.lower() or text.lstrip().startswith("{"):
            try:
                body = json.loads(text)
            except json.JSONDecodeError:
                body = None
            if isinstance(body, dict):
                params.update(body)
            else:
                params.update(parse_qsl(text, keep_blank_values=True))
        else:
            params.update(parse_qsl(text, keep_blank_values=True))
    for name in _JSON_FIELDS:
        value = params.get(name)
        if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
            # Undecodable values stay strings; the method then rejects them as malformed.
            with contextlib.suppress(json.JSONDecodeError):
                params[name] = json.loads(value)
    return params


def _bearer_token(headers: Mapping[str, str]) -> str | None:
    """Extract the token from an ``Authorization: Bearer <token>`` header."""
    auth = headers.get("Authorization") or ""
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return None


# ---------------------------------------------------------------------------
# The fake
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Hold:
    """A frozen API call: `arrived` is set when it comes in, `release` lets it answer.

    `unless`: a call whose body holds these bytes goes through, and the hold waits for the next;
    `only`: a call whose body does not hold these bytes goes through.
    """

    arrived: threading.Event
    release: threading.Event
    unless: bytes | None = None
    only: bytes | None = None

    def passes(self, raw: bytes) -> bool:
        """Whether a call with body `raw` goes through (the hold then waits for the next)."""
        if self.unless is not None and _mentions(raw, self.unless):
            return True
        return self.only is not None and not _mentions(raw, self.only)


class FakeSlackAPI:
    """In-memory Slack Web API served over loopback HTTP.

    Usable as a context manager (``with FakeSlackAPI() as fake: ...``) or via
    :meth:`start` / :meth:`stop`.  All read accessors return copies taken under the
    lock, so they are safe to call while other threads/processes hit the server.
    """

    def __init__(
        self,
        bot_token: str = "xoxb-test",
        bot_user_id: str = "UBOT",
        bot_id: str = "BBOT",
        team_id: str = "T1",
        scopes: tuple[str, ...] | None = None,
        agent: bool = False,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.bot_token = bot_token
        # Served over TLS with this server-side context (HTTPS, as slack.com), else plain HTTP.
        self.tls = tls
        # Whether the app is set up as an agent: only then may it call agents.sessions.setStatus.
        self.agent = agent
        # A workspace whose streams take task_update chunks (Slack's task display); off: refused.
        self.tasks_supported = True
        # Slack names a token's scopes in the `x-oauth-scopes` header of every answer; None: no header.
        self.scopes = scopes
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.team_id = team_id
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._seq = 0  # never reset, so ts values stay unique across reset()
        self._methods: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._chat_post_message,
            "chat.update": self._chat_update,
            "chat.delete": self._chat_delete,
            "chat.postEphemeral": self._chat_post_ephemeral,
            "reactions.add": self._reactions_add,
            "reactions.remove": self._reactions_remove,
            "views.open": self._views_open,
            "views.update": self._views_update,
            "conversations.replies": self._conversations_replies,
            "users.info": self._users_info,
            "assistant.threads.setStatus": self._assistant_set_status,
            "assistant.threads.setSuggestedPrompts": self._assistant_set_suggested_prompts,
            "agents.sessions.setStatus": self._agents_sessions_set_status,
            "usergroups.list": self._usergroups_list,
            "usergroups.users.list": self._usergroups_users_list,
            "views.publish": self._views_publish,
            "chat.getPermalink": self._chat_get_permalink,
            "chat.startStream": self._chat_start_stream,
            "chat.appendStream": self._chat_append_stream,
            "chat.stopStream": self._chat_stop_stream,
            "files.getUploadURLExternal": self._files_get_upload_url,
            "files.completeUploadExternal": self._files_complete_upload,
        }
        self._init_state()

    def _init_state(self) -> None:
        self._holds: dict[str, Hold] = {}
        """(Re)initialise all recorded state.  Caller holds the lock (or is __init__)."""
        self._calls: list[Call] = []
        self._messages: dict[str, list[dict[str, Any]]] = {}
        self._files: dict[str, dict[str, Any]] = {}  # file id -> name, length, title, data (once uploaded)
        self._ephemerals: list[dict[str, Any]] = []
        self._reactions: list[tuple[str, str, str]] = []
        self._views: list[dict[str, Any]] = []
        self._responses: list[dict[str, Any]] = []
        self._statuses: list[dict[str, Any]] = []
        self._sessions: list[dict[str, Any]] = []
        self._suggestions: list[dict[str, Any]] = []
        self._texts: list[str] = []
        self._failures: dict[str, deque[_Failure]] = {}
        self._usergroups: dict[str, list[str]] = {}
        self._usergroup_handles: dict[str, str] = {}  # group id -> its handle (set_usergroup)
        self._usergroups_disabled: set[str] = set()
        self._homes: dict[str, dict[str, Any]] = {}  # user id -> the Home view published for them

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> FakeSlackAPI:
        """Bind to an OS-chosen loopback port and serve in a daemon thread."""
        if self._server is not None:
            raise RuntimeError("FakeSlackAPI already started")
        self._server = _Server(self)
        if self.tls is not None:  # every accepted connection does its TLS handshake first
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"FakeSlackAPI:{self._server.server_address[1]}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port.  Idempotent."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> FakeSlackAPI:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def connections(self) -> int:
        """How many connections the server has accepted since it started."""
        if self._server is None:
            raise RuntimeError("FakeSlackAPI is not started")
        return self._server.accepted

    def drop_connections(self) -> int:
        """Close every open client connection from the server's side (how many there were)."""
        if self._server is None:
            raise RuntimeError("FakeSlackAPI is not started")
        return self._server.drop_connections()

    @property
    def port(self) -> int:
        """The bound TCP port (only while started)."""
        if self._server is None:
            raise RuntimeError("FakeSlackAPI is not started")
        return int(self._server.server_address[1])

    @property
    def root_url(self) -> str:
        """``http://127.0.0.1:PORT/`` (``https`` when served over TLS; only while started)."""
        return f"{'https' if self.tls is not None else 'http'}://127.0.0.1:{self.port}/"

    @property
    def base_url(self) -> str:
        """Web API base URL for ``WebClient(base_url=...)``: ``http://127.0.0.1:PORT/api/``."""
        return f"{self.root_url}api/"

    def response_url(self, name: str = "r1") -> str:
        """A URL under ``/response_url/`` to put in fake interactivity payloads."""
        return f"{self.root_url}response_url/{name}"

    # -- recorded state (copies) ---------------------------------------------

    @property
    def calls(self) -> list[Call]:
        """Every Web API call answered, in order (including failures)."""
        with self._lock:
            return list(self._calls)

    def messages(self, channel: str, thread_ts: str | None = None) -> list[dict[str, Any]]:
        """Current messages of ``channel`` in ts order.

        Without ``thread_ts``: every message in the channel (top-level and replies).  With
        it: the parent whose ts is ``thread_ts`` plus its replies.  Each message is
        ``{"channel", "ts", "thread_ts", "text", "blocks", "user"}``; ``thread_ts`` is
        ``None`` for top-level messages and ``blocks`` is a list of dicts (possibly empty).

        A streamed message shows here once `chat.update` has settled it (a reader of a test sees
        the answer as it ends up); `streams()` shows it from its start.
        """
        with self._lock:
            msgs = [m for m in self._messages.get(channel, []) if not m.get("unsettled")]
            if thread_ts is not None:
                msgs = [m for m in msgs if m["ts"] == thread_ts or m["thread_ts"] == thread_ts]
            return copy.deepcopy(msgs)

    @property
    def ephemerals(self) -> list[dict[str, Any]]:
        """``chat.postEphemeral`` calls: ``{"channel","user","text","blocks","thread_ts"}``."""
        with self._lock:
            return copy.deepcopy(self._ephemerals)

    @property
    def reactions(self) -> list[tuple[str, str, str]]:
        """Reactions currently added, as ``(channel, ts, name)``."""
        with self._lock:
            return list(self._reactions)

    @property
    def views(self) -> list[dict[str, Any]]:
        """Views opened via ``views.open``: ``{"trigger_id","view","id"}`` (latest view)."""
        with self._lock:
            return copy.deepcopy(self._views)

    @property
    def responses(self) -> list[dict[str, Any]]:
        """JSON bodies POSTed to ``/response_url/...`` (Bolt's ``respond()``)."""
        with self._lock:
            return copy.deepcopy(self._responses)

    @property
    def statuses(self) -> list[dict[str, Any]]:
        """``assistant.threads.setStatus`` calls: ``{"channel_id","thread_ts","status"}``."""
        with self._lock:
            return copy.deepcopy(self._statuses)

    @property
    def sessions(self) -> list[dict[str, Any]]:
        """``agents.sessions.setStatus`` calls answered ok: ``{"channel_id","thread_ts","status",
        "title","initiator_user_id"}``, in order."""
        with self._lock:
            return copy.deepcopy(self._sessions)

    @property
    def suggestions(self) -> list[dict[str, Any]]:
        """``assistant.threads.setSuggestedPrompts`` calls answered ok:
        ``{"channel_id","thread_ts","title","prompts"}``."""
        with self._lock:
            return copy.deepcopy(self._suggestions)

    def home(self, user: str) -> dict[str, Any] | None:
        """The Home tab view last published (``views.publish``) for ``user``, or ``None``."""
        with self._lock:
            entry = self._homes.get(user)
            return copy.deepcopy(entry["view"]) if entry else None

    @property
    def texts(self) -> list[str]:
        """Every text string accepted: message/ephemeral ``text`` params and all
        mrkdwn/plain_text strings inside blocks, views and response_url bodies."""
        with self._lock:
            return list(self._texts)

    def find_texts(self, needle: str) -> list[str]:
        """The recorded :attr:`texts` that contain ``needle``."""
        return [t for t in self.texts if needle in t]

    # -- control ---------------------------------------------------------------

    def fail_next(
        self,
        method: str,
        *,
        error: str | None = None,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        times: int = 1,
    ) -> None:
        """Make the next ``times`` calls of ``method`` fail.

        The answer is HTTP ``status`` with ``headers`` and body
        ``{"ok": false, "error": error}``.  ``error`` defaults to ``"ratelimited"`` for
        429, ``"internal_error"`` for 5xx and ``"fatal_error"`` otherwise; a 429 without a
        ``Retry-After`` header gets ``Retry-After: 1`` like Slack.  Queued failures for
        the same method are consumed in order.  ``method`` may also be ``"response_url"``.
        """
        if times < 1:
            raise ValueError("times must be >= 1")
        if error is None:
            error = "ratelimited" if status == 429 else "internal_error" if status >= 500 else "fatal_error"
        hdrs = dict(headers or {})
        if status == 429 and not any(k.lower() == "retry-after" for k in hdrs):
            hdrs["Retry-After"] = "1"
        with self._lock:
            self._failures.setdefault(method, deque()).append(
                _Failure(error=error, status=status, headers=hdrs, remaining=times)
            )

    def clear_failures(self, method: str) -> None:
        """Drop the failures still queued for ``method`` (see :meth:`fail_next`)."""
        with self._cond:
            self._failures.pop(method, None)
            self._cond.notify_all()

    def set_usergroup(
        self, group_id: str, users: list[str] | None, handle: str | None = None, *, disabled: bool = False
    ) -> None:
        """Make ``group_id`` a user group of ``users`` (``None``: no such group any more), mentioned
        as ``@handle`` (by default its id in lower case); ``disabled``: listed only on request."""
        with self._cond:
            if users is None:
                self._usergroups.pop(group_id, None)
                self._usergroup_handles.pop(group_id, None)
                self._usergroups_disabled.discard(group_id)
            else:
                self._usergroups[group_id] = list(users)
                self._usergroup_handles[group_id] = group_id.lower() if handle is None else handle
                if disabled:
                    self._usergroups_disabled.add(group_id)
                else:
                    self._usergroups_disabled.discard(group_id)
            self._cond.notify_all()

    def add_message(
        self,
        channel: str,
        text: str,
        *,
        user: str = "U1",
        thread_ts: str | None = None,
        blocks: list[dict[str, Any]] | None = None,
    ) -> str:
        """Insert a message as if posted by someone else (no validation); return its ts."""
        with self._cond:
            ts = self._store_message(channel, text, blocks or [], thread_ts, user)
            self._cond.notify_all()
            return ts

    def reset(self) -> None:
        """Forget all calls, messages, reactions, views, ... and queued failures."""
        with self._cond:
            self._init_state()
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[FakeSlackAPI], bool], timeout: float = 10.0) -> bool:
        """Block until ``predicate(self)`` is truthy (re-checked after every request) or
        ``timeout`` seconds pass; return the last predicate result as a bool."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if predicate(self):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return bool(predicate(self))
                self._cond.wait(remaining)

    def wait_for_message(
        self,
        channel: str,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = 10.0,
    ) -> dict[str, Any] | None:
        """Wait until a message in ``channel`` satisfies ``predicate``; return it (a copy)
        or ``None`` on timeout.  Messages are checked in ts order."""
        found: list[dict[str, Any]] = []

        def check(fake: FakeSlackAPI) -> bool:
            for msg in fake.messages(channel):
                if predicate(msg):
                    found.append(msg)
                    return True
            return False

        return found[-1] if self.wait_for(check, timeout) and found else None

    # -- request dispatch ----------------------------------------------------------

    def _dispatch(
        self, path: str, raw: bytes, headers: Mapping[str, str]
    ) -> tuple[int, dict[str, str], dict[str, Any]]:
        """Answer one HTTP request: (status, extra headers, JSON body)."""
        url = urlsplit(path)
        content_type = headers.get("Content-Type") or ""
        if url.path.startswith("/response_url/"):
            return self._handle_response_url(url.query, raw, content_type)
        if url.path.startswith("/upload/"):
            return self._handle_upload(url.path.removeprefix("/upload/"), raw)
        if not url.path.startswith("/api/"):
            return 404, {}, {"ok": False, "error": "not_found"}
        method = url.path[len("/api/") :].strip("/")
        with self._cond:
            hold = self._holds.get(method)
            if hold is not None and hold.passes(raw):
                hold = None  # let this one through; the hold waits for the next
            elif hold is not None:
                del self._holds[method]
        if hold is not None:  # a test freezes this call mid-flight (to kill the caller, say)
            hold.arrived.set()
            hold.release.wait(60)
        params = _parse_params(url.query, raw, content_type)
        token = _bearer_token(headers)
        param_token = params.pop("token", None)
        if token is None and isinstance(param_token, str):
            token = param_token
        with self._cond:
            try:
                failure = self._take_failure(method)
                if failure is not None:
                    body = {"ok": False, "error": failure.error}
                    self._record(method, params, body, status=failure.status)
                    return failure.status, failure.headers, body
                if token != self.bot_token:
                    body = {"ok": False, "error": "invalid_auth"}
                    self._record(method, params, body)
                    return 200, {}, body
                handler = self._methods.get(method)
                if handler is None:
                    body = {"ok": False, "error": "unknown_method"}
                    self._record(method, params, body)
                    return 200, {}, body
                try:
                    body = {"ok": True, **handler(params)}
                    errors: list[str] = []
                except _ApiError as exc:
                    errors = exc.errors
                    body = {"ok": False, "error": exc.error}
                    if errors:
                        body["errors"] = list(errors)
                        body["response_metadata"] = {"messages": [f"[ERROR] {e}" for e in errors]}
                self._record(method, params, body, errors=errors)
                return 200, {}, body
            finally:
                self._cond.notify_all()

    def _handle_upload(self, file_id: str, raw: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
        """The upload URL of `files.getUploadURLExternal`: the file's bytes, exactly `length` of them."""
        with self._cond:
            entry = self._files.get(file_id)
            if entry is None:
                return 404, {}, {"ok": False, "error": "file_not_found"}
            if len(raw) != entry["length"]:
                return 400, {}, {"ok": False, "error": "length_mismatch"}
            entry["data"] = bytes(raw)
            self._cond.notify_all()
            return 200, {}, {"ok": True}

    def _handle_response_url(
        self, query: str, raw: bytes, content_type: str
    ) -> tuple[int, dict[str, str], dict[str, Any]]:
        """Record a Bolt ``respond()`` body POSTed to a response_url."""
        params = _parse_params(query, raw, content_type)
        with self._cond:
            try:
                failure = self._take_failure("response_url")
                if failure is not None:
                    return failure.status, failure.headers, {"ok": False, "error": failure.error}
                self._responses.append(copy.deepcopy(params))
                _collect_texts(params, self._texts)
                return 200, {}, {"ok": True}
            finally:
                self._cond.notify_all()

    def hold_next(self, method: str, *, unless: str | None = None, only: str | None = None) -> Hold:
        """Freeze the next call of `method` until `hold.release` is set; `hold.arrived` tells when.

        `unless`: calls whose body holds this text are let through (say, a message that always
        comes first), and the hold waits for the next call. `only`: calls whose body does not hold
        this text are let through (say, to freeze one particular update).
        """
        hold = Hold(
            threading.Event(),
            threading.Event(),
            unless.encode() if unless else None,
            only.encode() if only else None,
        )
        with self._cond:
            self._holds[method] = hold
        return hold

    def _take_failure(self, method: str) -> _Failure | None:
        """Consume one queued failure for ``method``, if any.  Caller holds the lock."""
        queue = self._failures.get(method)
        if not queue:
            return None
        failure = queue[0]
        failure.remaining -= 1
        if failure.remaining <= 0:
            queue.popleft()
        return failure

    def _record(
        self,
        method: str,
        params: dict[str, Any],
        body: dict[str, Any],
        *,
        status: int = 200,
        errors: list[str] | None = None,
    ) -> None:
        """Append a :class:`Call`.  Caller holds the lock."""
        self._calls.append(
            Call(
                method=method,
                params=copy.deepcopy(params),
                ok=bool(body.get("ok")),
                error=body.get("error"),
                status=status,
                errors=list(errors or []),
                response=copy.deepcopy(body),
            )
        )

    # -- helpers used by handlers (caller holds the lock) ------------------------

    def _next_ts(self) -> str:
        """A unique, monotonically increasing Slack-style ts like ``1700000000.000100``."""
        self._seq += 1
        micros = _TS_BASE_MICROS + self._seq * _TS_STEP_MICROS
        return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"

    def _find_message(self, channel: str, ts: str) -> dict[str, Any] | None:
        for msg in self._messages.get(channel, []):
            if msg["ts"] == ts:
                return msg
        return None

    def _store_message(
        self,
        channel: str,
        text: str,
        blocks: list[dict[str, Any]],
        thread_ts: str | None,
        user: str,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        if thread_ts is not None:
            # Replying to a reply threads under the reply's parent, as in Slack.
            parent = self._find_message(channel, thread_ts)
            if parent is not None and parent["thread_ts"] is not None:
                thread_ts = parent["thread_ts"]
        ts = self._next_ts()
        self._messages.setdefault(channel, []).append(
            {
                "channel": channel,
                "ts": ts,
                "thread_ts": thread_ts,
                "text": text,
                "blocks": copy.deepcopy(blocks),
                "user": user,
                **({"metadata": copy.deepcopy(metadata)} if metadata else {}),
            }
        )
        return ts

    def _slack_message(
        self, msg: dict[str, Any], *, has_replies: bool = False, with_metadata: bool = False
    ) -> dict[str, Any]:
        """Render a stored message the way Slack returns it in API responses."""
        out: dict[str, Any] = {
            "type": "message",
            "user": msg["user"],
            "text": msg["text"],
            "ts": msg["ts"],
            "team": self.team_id,
        }
        if msg["blocks"]:
            out["blocks"] = copy.deepcopy(msg["blocks"])
        if msg["user"] == self.bot_user_id:
            out["bot_id"] = self.bot_id
        if msg["thread_ts"] is not None:
            out["thread_ts"] = msg["thread_ts"]
        elif has_replies:
            out["thread_ts"] = msg["ts"]
        if with_metadata and msg.get("metadata"):
            out["metadata"] = copy.deepcopy(msg["metadata"])
        if msg.get("files"):
            out["files"] = copy.deepcopy(msg["files"])
        return out

    @staticmethod
    def _require_str(params: dict[str, Any], name: str, error: str) -> str:
        value = params.get(name)
        if not isinstance(value, str) or not value:
            raise _ApiError(error)
        return value

    def _validated_content(
        self, params: dict[str, Any], *, require_content: bool = True
    ) -> tuple[str | None, list[dict[str, Any]] | None]:
        """Validate ``text``/``blocks`` of a message-ish call; return (text, blocks).

        ``text`` is ``None`` when absent; ``blocks`` is ``None`` when absent.
        """
        raw_text = params.get("text")
        text = None if raw_text is None else str(raw_text)
        blocks = params.get("blocks")
        if blocks is not None:
            if isinstance(blocks, str) and not blocks.strip():
                blocks = []
            if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
                raise _ApiError("invalid_blocks_format")
        has_attachments = bool(params.get("attachments"))
        if require_content and not text and not blocks and not has_attachments:
            raise _ApiError("no_text")
        if text is not None and len(text) > MAX_MESSAGE_TEXT:
            raise _ApiError("msg_too_long")
        if blocks:
            if len(json.dumps(blocks)) > MAX_BLOCKS_JSON_CHARS:
                raise _ApiError("msg_blocks_too_long")
            errors = validate_blocks(blocks)
            if errors:
                raise _ApiError("invalid_blocks", errors=errors)
        return text, blocks

    def _record_texts(self, text: str | None, blocks: list[dict[str, Any]] | None) -> None:
        if text:
            self._texts.append(text)
        if blocks:
            _collect_texts(blocks, self._texts)

    def _validated_view(self, params: dict[str, Any], kind: str = "modal") -> dict[str, Any]:
        """Validate the ``view`` param as a ``kind`` view (modal, or home); return it (a dict)."""
        view = params.get("view")
        if not isinstance(view, dict):
            raise _ApiError("invalid_arguments", errors=["view must be a JSON object"])
        errors: list[str] = []
        if view.get("type") != kind:
            errors.append(f"view type must be {kind} [json-pointer:/view/type]")
        if kind == "modal" and not view.get("title"):
            errors.append("missing required field: title [json-pointer:/view/title]")
        if not view.get("blocks"):
            errors.append("missing required field: blocks [json-pointer:/view/blocks]")
        try:
            View(**copy.deepcopy(view)).to_dict()  # validate_json() + nested validation
        except SlackObjectFormationError as exc:
            errors.append(f"{exc} [json-pointer:/view]")
        except Exception as exc:  # noqa: BLE001 - malformed view structure
            errors.append(f"invalid view: {exc} [json-pointer:/view]")
        if isinstance(view.get("blocks"), list):
            errors.extend(
                e.replace("[json-pointer:/blocks", "[json-pointer:/view/blocks")
                for e in validate_blocks(view["blocks"], max_blocks=MAX_BLOCKS_PER_VIEW)
            )
        if errors:
            raise _ApiError("invalid_arguments", errors=errors)
        return view

    def _view_response(self, entry: dict[str, Any]) -> dict[str, Any]:
        return {
            **copy.deepcopy(entry["view"]),
            "id": entry["id"],
            "hash": entry["hash"],
            "team_id": self.team_id,
            "bot_id": self.bot_id,
        }

    # -- method handlers (caller holds the lock) -------------------------------------

    def _auth_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "url": "https://fake-workspace.slack.com/",
            "team": "Fake Workspace",
            "user": "bot",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    def _chat_post_message(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._require_str(params, "channel", "channel_not_found")
        text, blocks = self._validated_content(params)
        thread_ts = params.get("thread_ts") or None
        raw = params.get("metadata")
        metadata = None if raw is None else self._valid_metadata(raw)
        ts = self._store_message(
            channel,
            text or "",
            blocks or [],
            str(thread_ts) if thread_ts else None,
            self.bot_user_id,
            metadata,
        )
        self._record_texts(text, blocks)
        msg = self._find_message(channel, ts)
        assert msg is not None
        return {"channel": channel, "ts": ts, "message": self._slack_message(msg)}

    def _chat_update(self, params: dict[str, Any]) -> dict[str, Any]:
        """Replace a message's text and blocks (omitted blocks are kept). A stopped stream's tasks
        are kept as they stopped: Slack's reference does not say what an update does to them, and
        a user saw a task's "Waiting for approval" outlive the update that settled its message
        (issue 32), so this fake, like the playground, keeps them; and as a stopped stream takes no
        task update, nothing can change them any more."""
        channel = self._require_str(params, "channel", "channel_not_found")
        ts = self._require_str(params, "ts", "message_not_found")
        msg = self._find_message(channel, ts)
        if msg is None:
            raise _ApiError("message_not_found")
        if msg["user"] != self.bot_user_id:
            raise _ApiError("cant_update_message")
        if msg.get("streaming"):
            raise _ApiError("message_is_streaming")  # stop the stream first
        text, blocks = self._validated_content(params)
        if text is not None:
            msg["text"] = text
        if blocks is not None:  # omitted blocks are kept, like Slack
            msg["blocks"] = copy.deepcopy(blocks)
        if params.get("metadata") is not None:
            msg["metadata"] = self._valid_metadata(params["metadata"])
        msg.pop("unsettled", None)
        self._record_texts(text, blocks)
        return {
            "channel": channel,
            "ts": ts,
            "text": msg["text"],
            "message": self._slack_message(msg),
        }

    def _chat_delete(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._require_str(params, "channel", "channel_not_found")
        ts = self._require_str(params, "ts", "message_not_found")
        msg = self._find_message(channel, ts)
        if msg is None:
            raise _ApiError("message_not_found")
        if msg["user"] != self.bot_user_id:
            raise _ApiError("cant_delete_message")
        self._messages[channel].remove(msg)
        self._reactions = [r for r in self._reactions if (r[0], r[1]) != (channel, ts)]
        return {"channel": channel, "ts": ts}

    def _chat_post_ephemeral(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._require_str(params, "channel", "channel_not_found")
        user = self._require_str(params, "user", "user_not_found")
        text, blocks = self._validated_content(params)
        thread_ts = params.get("thread_ts") or None
        self._ephemerals.append(
            {
                "channel": channel,
                "user": user,
                "text": text or "",
                "blocks": copy.deepcopy(blocks or []),
                "thread_ts": str(thread_ts) if thread_ts else None,
            }
        )
        self._record_texts(text, blocks)
        return {"message_ts": self._next_ts()}

    def _reaction_target(self, params: dict[str, Any]) -> tuple[str, str, str]:
        channel = self._require_str(params, "channel", "channel_not_found")
        ts = self._require_str(params, "timestamp", "no_item_specified")
        name = self._require_str(params, "name", "invalid_name").strip(":")
        if self._find_message(channel, ts) is None:
            raise _ApiError("message_not_found")
        return channel, ts, name

    def _reactions_add(self, params: dict[str, Any]) -> dict[str, Any]:
        key = self._reaction_target(params)
        if key in self._reactions:
            raise _ApiError("already_reacted")
        self._reactions.append(key)
        return {}

    def _reactions_remove(self, params: dict[str, Any]) -> dict[str, Any]:
        key = self._reaction_target(params)
        if key not in self._reactions:
            raise _ApiError("no_reaction")
        self._reactions.remove(key)
        return {}

    def _views_open(self, params: dict[str, Any]) -> dict[str, Any]:
        trigger_id = params.get("trigger_id")
        if not isinstance(trigger_id, str) or not trigger_id:
            raise _ApiError("invalid_arguments", errors=["missing required field: trigger_id"])
        view = self._validated_view(params)
        self._seq += 1
        entry = {
            "trigger_id": trigger_id,
            "view": copy.deepcopy(view),
            "id": f"V{self._seq:010d}",
            "hash": f"{self._seq}.hash",
        }
        self._views.append(entry)
        _collect_texts(view, self._texts)
        return {"view": self._view_response(entry)}

    def _views_update(self, params: dict[str, Any]) -> dict[str, Any]:
        view_id = params.get("view_id")
        external_id = params.get("external_id")
        if not view_id and not external_id:
            raise _ApiError("invalid_arguments", errors=["view_id or external_id is required"])
        view = self._validated_view(params)
        for entry in self._views:
            if (view_id and entry["id"] == view_id) or (
                external_id and entry["view"].get("external_id") == external_id
            ):
                expected_hash = params.get("hash")
                if expected_hash and expected_hash != entry["hash"]:
                    raise _ApiError("hash_conflict")
                self._seq += 1
                entry["view"] = copy.deepcopy(view)
                entry["hash"] = f"{self._seq}.hash"
                _collect_texts(view, self._texts)
                return {"view": self._view_response(entry)}
        raise _ApiError("not_found")

    def _conversations_replies(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._require_str(params, "channel", "channel_not_found")
        ts = self._require_str(params, "ts", "thread_not_found")
        parent = self._find_message(channel, ts)
        if parent is None:
            raise _ApiError("thread_not_found")
        root = parent["thread_ts"] or parent["ts"]
        thread = [m for m in self._messages.get(channel, []) if m["ts"] == root or m["thread_ts"] == root]
        has_replies = len(thread) > 1
        with_metadata = str(params.get("include_all_metadata")).lower() in ("1", "true")
        return {
            "messages": [
                self._slack_message(m, has_replies=has_replies, with_metadata=with_metadata) for m in thread
            ],
            "has_more": False,
            "response_metadata": {"next_cursor": ""},
        }

    def _users_info(self, params: dict[str, Any]) -> dict[str, Any]:
        user_id = self._require_str(params, "user", "user_not_found")
        real_name = f"User {user_id}"
        return {
            "user": {
                "id": user_id,
                "team_id": self.team_id,
                "name": user_id.lower(),
                "real_name": real_name,
                "is_bot": user_id == self.bot_user_id,
                "deleted": False,
                "tz": "UTC",
                "profile": {"real_name": real_name, "display_name": user_id.lower()},
            }
        }

    def _usergroups_list(self, params: dict[str, Any]) -> dict[str, Any]:
        """Every user group of the team, as Slack lists them: disabled ones (`date_delete` set)
        only with `include_disabled`, members with `include_users`, counts with `include_count`."""

        def flag(name: str) -> bool:
            return str(params.get(name, "")).lower() in ("1", "true")

        listed = []
        for group, users in self._usergroups.items():
            disabled = group in self._usergroups_disabled
            if disabled and not flag("include_disabled"):
                continue
            handle = self._usergroup_handles.get(group, group.lower())
            entry: dict[str, Any] = {
                "id": group,
                "team_id": self.team_id,
                "is_usergroup": True,
                "is_subteam": True,
                "name": handle.title(),
                "description": "",
                "handle": handle,
                "is_external": False,
                "date_create": 1446598059,
                "date_update": 1446670362,
                "date_delete": 1446670400 if disabled else 0,
                "auto_type": None,
                "created_by": "USLACKBOT",
                "updated_by": "USLACKBOT",
                "deleted_by": "USLACKBOT" if disabled else None,
                "prefs": {"channels": [], "groups": []},
            }
            if flag("include_users"):
                entry["users"] = list(users)
            if flag("include_count"):
                entry["user_count"] = len(users)
            listed.append(entry)
        return {"usergroups": listed}

    def _usergroups_users_list(self, params: dict[str, Any]) -> dict[str, Any]:
        group = params.get("usergroup")
        if not isinstance(group, str) or not group:
            raise _ApiError("invalid_arguments", errors=["missing required field: usergroup"])
        if group not in self._usergroups:
            raise _ApiError("no_such_subteam")
        return {"users": list(self._usergroups[group])}

    def _views_publish(self, params: dict[str, Any]) -> dict[str, Any]:
        user = params.get("user_id")
        if not isinstance(user, str) or not user:
            raise _ApiError("invalid_arguments", errors=["missing required field: user_id"])
        view = self._validated_view(params, kind="home")
        entry = self._homes.get(user)
        expected_hash = params.get("hash")
        if expected_hash and (entry is None or expected_hash != entry["hash"]):
            raise _ApiError("hash_conflict")
        self._seq += 1
        entry = {
            "view": copy.deepcopy(view),
            "id": entry["id"] if entry else f"V{self._seq:010d}",
            "hash": f"{self._seq}.hash",
        }
        self._homes[user] = entry
        _collect_texts(view, self._texts)
        return {"view": self._view_response(entry)}

    def _chat_get_permalink(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._require_str(params, "channel", "channel_not_found")
        ts = self._require_str(params, "message_ts", "message_not_found")
        if channel not in self._messages:
            raise _ApiError("channel_not_found")
        msg = self._find_message(channel, ts)
        if msg is None:
            raise _ApiError("message_not_found")
        link = f"https://fake-workspace.slack.com/archives/{channel}/p{ts.replace('.', '')}"
        if msg["thread_ts"] is not None:
            link += f"?thread_ts={msg['thread_ts']}&cid={channel}"
        return {"channel": channel, "permalink": link}

    @staticmethod
    def _require_args(params: dict[str, Any], *names: str) -> None:
        """Slack's answer to a required argument left out (or not a string): ``invalid_arguments``."""
        missing = [n for n in names if not isinstance(params.get(n), str) or not params[n]]
        if missing:
            raise _ApiError("invalid_arguments", errors=[f"missing required field: {n}" for n in missing])

    def _thread_root(self, channel: str, thread_ts: str) -> None:
        """A thread that is not there: ``channel_not_found`` or ``invalid_thread_ts``."""
        if channel not in self._messages:
            raise _ApiError("channel_not_found")
        if self._find_message(channel, thread_ts) is None:
            raise _ApiError("invalid_thread_ts")

    def _valid_metadata(self, metadata: Any) -> dict[str, Any]:
        if isinstance(metadata, str):
            try:
                metadata = json.loads(metadata)
            except ValueError:
                raise _ApiError("invalid_metadata_format") from None
        if not (
            isinstance(metadata, dict)
            and isinstance(metadata.get("event_type"), str)
            and isinstance(metadata.get("event_payload"), dict)
        ):
            raise _ApiError("invalid_metadata_schema")
        return copy.deepcopy(metadata)

    def _chat_start_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        """Slack's rules: a stream replies in a thread; in a channel it names who it streams to."""
        channel = self._require_str(params, "channel", "channel_not_found")
        thread_ts = params.get("thread_ts")
        if not isinstance(thread_ts, str) or not thread_ts:
            raise _ApiError("invalid_arguments", errors=["missing required field: thread_ts"])
        if self._find_message(channel, thread_ts) is None:
            raise _ApiError("message_not_found")
        if channel.startswith(("C", "G")) and not (
            params.get("recipient_team_id") and params.get("recipient_user_id")
        ):
            raise _ApiError(
                "invalid_arguments", errors=["recipient_team_id and recipient_user_id are required"]
            )
        words, tasks = self._chunks(params)
        mode = params.get("task_display_mode")
        if mode is not None and mode not in ("timeline", "plan"):
            raise _ApiError("invalid_arguments", errors=["task_display_mode must be timeline or plan"])
        ts = self._store_message(
            channel, str(params.get("markdown_text") or "") + words, [], thread_ts, self.bot_user_id
        )
        msg = self._find_message(channel, ts)
        assert msg is not None
        msg["streaming"] = msg["unsettled"] = True
        msg["tasks"] = {}
        self._apply_tasks(msg, tasks)
        return {"channel": channel, "ts": ts}

    def _chunks(self, params: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        """A stream call's ``chunks``: their words joined, and their task updates in order.

        Slack's rules as this fake knows them: a list of objects of a known ``type``; a
        ``markdown_text`` chunk has text; a ``task_update`` has an id, a title and a status of
        pending, in_progress, complete or error.  With :attr:`tasks_supported` off (a workspace
        without task updates) a task chunk is refused.  A call gives its words either as
        ``markdown_text`` or as ``chunks``, never both (Slack answers
        ``cannot_provide_both_markdown_text_and_chunks``: seen live by hermes-agent, PRs #100510 and
        #104173).
        """
        chunks = params.get("chunks")
        if chunks is None:
            return "", []
        if params.get("markdown_text"):
            raise _ApiError("cannot_provide_both_markdown_text_and_chunks")
        if isinstance(chunks, str):
            try:
                chunks = json.loads(chunks)
            except ValueError:
                raise _ApiError("invalid_chunks") from None
        if not isinstance(chunks, list) or not chunks:
            raise _ApiError("invalid_chunks", errors=["chunks must be a non-empty list"])
        words, tasks = [], []
        for chunk in chunks:
            kind = chunk.get("type") if isinstance(chunk, dict) else None
            if kind == "markdown_text" and isinstance(chunk.get("text"), str) and chunk["text"]:
                words.append(chunk["text"])
            elif kind == "task_update":
                if not self.tasks_supported:
                    raise _ApiError("invalid_chunks", errors=["task_update is not supported here"])
                if not (
                    isinstance(chunk.get("id"), str)
                    and chunk["id"]
                    and isinstance(chunk.get("title"), str)
                    and chunk["title"]
                    and chunk.get("status") in TASK_STATUSES
                    and all(isinstance(chunk.get(key, ""), str) for key in _ADDED_TASK_FIELDS)
                ):
                    raise _ApiError("invalid_chunks", errors=["task_update needs id, title and status"])
                tasks.append(copy.deepcopy(chunk))
            else:
                raise _ApiError("invalid_chunks", errors=[f"unknown or empty chunk: {kind!r}"])
        text = "".join(words)
        if len(text) > 12_000:
            raise _ApiError("msg_too_long")
        self._record_texts(text or None, None)
        return text, tasks

    @staticmethod
    def _apply_tasks(msg: dict[str, Any], tasks: list[dict[str, Any]]) -> None:
        """Each task update changes the task of its id (first seen keeps its place): its title and
        status are replaced, its ``details`` and ``output`` added to what the task showed before.

        Slack's reference does not say; openclaw saw it live ("appends details/output text on every
        update for the same task id — only title and status replace", openclaw PR #125168), and
        slack_sdk's own example of a task update sends later details as an addition (python-slack-sdk
        PR #1821). Slack shows every field as sent: a task card's title is plain text and its
        details and output are rich text (docs.slack.dev, task card block), none of them mrkdwn, so
        an entity such as ``&gt;`` shows as those four characters and ``<!here>`` pings nobody.
        """
        for task in tasks:
            shown = msg["tasks"].setdefault(task["id"], {})
            for key, value in task.items():
                if key in _ADDED_TASK_FIELDS:
                    shown[key] = shown.get(key, "") + value
                elif key != "type":
                    shown[key] = value
            shown.setdefault("history", []).append(task["status"])

    def _streaming(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._require_str(params, "channel", "channel_not_found")
        msg = self._find_message(channel, self._require_str(params, "ts", "message_not_found"))
        if msg is None:
            raise _ApiError("message_not_found")
        if not msg.get("streaming"):
            raise _ApiError("message_not_in_streaming_state")
        return msg

    def _chat_append_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        msg = self._streaming(params)
        text = params.get("markdown_text")
        words, tasks = self._chunks(params)
        if not words and not tasks and (not isinstance(text, str) or not text):
            raise _ApiError("invalid_arguments", errors=["missing required field: markdown_text or chunks"])
        text = str(text or "")
        if len(text) > 12_000:
            raise _ApiError("msg_too_long")
        msg["text"] += text + words
        self._apply_tasks(msg, tasks)
        if text:
            self._record_texts(text, None)
        return {"channel": msg["channel"], "ts": msg["ts"]}

    def _chat_stop_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        msg = self._streaming(params)
        words, tasks = self._chunks(params)
        msg["streaming"] = False
        if params.get("markdown_text"):
            msg["text"] += str(params["markdown_text"])
        msg["text"] += words
        self._apply_tasks(msg, tasks)
        if params.get("metadata") is not None:
            msg["metadata"] = self._valid_metadata(params["metadata"])
        return {"channel": msg["channel"], "ts": msg["ts"], "message": self._slack_message(msg)}

    def streams(self) -> list[dict[str, Any]]:
        """Every message that was streamed and is still in its channel: channel, ts, text now,
        whether it still streams, and its tasks (id -> its latest title and status, its details
        and output as they added up, and the ``history`` of its statuses). A stopped stream's
        tasks stay as they were when it stopped, through any `chat.update` (see `_chat_update`)."""
        with self._lock:
            return [
                {
                    "channel": m["channel"],
                    "ts": m["ts"],
                    "text": m["text"],
                    "streaming": m["streaming"],
                    "tasks": copy.deepcopy(m.get("tasks") or {}),
                    "thread_ts": m.get("thread_ts"),
                }
                for msgs in self._messages.values()
                for m in msgs
                if "streaming" in m
            ]

    def _files_get_upload_url(self, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("filename")
        length = params.get("length")
        if not isinstance(name, str) or not name:
            raise _ApiError("invalid_arguments", errors=["missing required field: filename"])
        if not str(length).isdigit() or int(str(length)) < 1:
            raise _ApiError("invalid_arguments", errors=["length must be a positive integer"])
        self._seq += 1
        file_id = f"F{self._seq:010d}"
        self._files[file_id] = {"id": file_id, "name": name, "length": int(str(length)), "data": None}
        return {"upload_url": f"{self.root_url}upload/{file_id}", "file_id": file_id}

    def _files_complete_upload(self, params: dict[str, Any]) -> dict[str, Any]:
        files = params.get("files")
        if not isinstance(files, list) or not files or not all(isinstance(f, dict) for f in files):
            raise _ApiError("invalid_arguments", errors=["files must be a non-empty list of objects"])
        done = []
        for item in files:
            entry = self._files.get(str(item.get("id")))
            if entry is None:
                raise _ApiError("file_not_found")
            if entry["data"] is None:
                raise _ApiError("upload_incomplete")  # completed before its bytes arrived
            entry["title"] = item.get("title") or entry["name"]
            done.append(
                {"id": entry["id"], "name": entry["name"], "title": entry["title"], "size": entry["length"]}
            )
        channel, thread_ts = params.get("channel_id"), params.get("thread_ts")
        if channel:
            if thread_ts and self._find_message(str(channel), str(thread_ts)) is None:
                raise _ApiError("invalid_thread_ts")
            ts = self._store_message(
                str(channel), str(params.get("initial_comment") or ""), [], thread_ts, self.bot_user_id
            )
            message = self._find_message(str(channel), ts)
            assert message is not None
            message["files"] = copy.deepcopy(done)
            for entry in done:
                self._files[entry["id"]]["shared"] = {"channel": channel, "thread_ts": thread_ts, "ts": ts}
        return {"files": done}

    def files(self) -> list[dict[str, Any]]:
        """Every file uploaded: id, name, title, its text and where it was shared (if it was)."""
        with self._lock:
            return [
                {
                    **{k: v for k, v in f.items() if k != "data"},
                    "text": (f["data"] or b"").decode("utf-8", "replace"),
                }
                for f in self._files.values()
            ]

    def _assistant_set_status(self, params: dict[str, Any]) -> dict[str, Any]:
        # `status` is required but may be "": an empty status clears the line.
        self._require_args(params, "channel_id", "thread_ts")
        if not isinstance(params.get("status"), str):
            raise _ApiError("invalid_arguments", errors=["missing required field: status"])
        self._thread_root(params["channel_id"], params["thread_ts"])
        self._statuses.append(
            {
                "channel_id": params.get("channel_id"),
                "thread_ts": params.get("thread_ts"),
                "status": params.get("status"),
            }
        )
        return {}

    def _assistant_set_suggested_prompts(self, params: dict[str, Any]) -> dict[str, Any]:
        self._require_args(params, "channel_id")
        prompts = params.get("prompts")
        if isinstance(prompts, str):
            with contextlib.suppress(json.JSONDecodeError):
                prompts = json.loads(prompts)
        fine = isinstance(prompts, list) and 1 <= len(prompts) <= MAX_SUGGESTED_PROMPTS
        if not fine or not all(
            isinstance(p, dict)
            and set(p) == {"title", "message"}
            and all(isinstance(v, str) and v for v in p.values())
            for p in prompts
        ):
            raise _ApiError("invalid_arguments", errors=["prompts: 1 to 4 objects of title and message"])
        if "thread_ts" in params:
            self._thread_root(params["channel_id"], str(params["thread_ts"]))
        self._suggestions.append(
            {
                "channel_id": params["channel_id"],
                "thread_ts": params.get("thread_ts"),
                "title": params.get("title"),
                "prompts": copy.deepcopy(prompts),
            }
        )
        return {}

    def _agents_sessions_set_status(self, params: dict[str, Any]) -> dict[str, Any]:
        status = params.get("status")
        if status not in AGENT_SESSION_STATUSES:
            raise _ApiError("invalid_arguments", errors=[f"status must be one of {AGENT_SESSION_STATUSES}"])
        # The bot's sessions are thread-based: in a channel or DM both ids are required.
        self._require_args(params, "channel_id", "thread_ts")
        title = params.get("title")
        if title is not None and (not isinstance(title, str) or len(title) > AGENT_SESSION_TITLE_MAX):
            raise _ApiError("invalid_arguments", errors=["title: at most 200 characters"])
        if not self.agent:
            raise _ApiError(NOT_AN_AGENT)
        self._thread_root(params["channel_id"], params["thread_ts"])
        fields = ("channel_id", "thread_ts", "status", "title", "initiator_user_id")
        self._sessions.append({k: params.get(k) for k in fields})
        return {"status": status}
