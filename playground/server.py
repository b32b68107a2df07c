"""The playground's HTTP server: the page, the page's actions, Slack's Web API and the demo model.

One `ThreadingHTTPServer` (standard library) on 127.0.0.1 answers:

- ``GET /`` and ``/static/…``: the page (plain HTML, CSS and JavaScript, no build step);
- ``GET /play/state`` and ``GET /play/events`` (server-sent events: the state's version, each
  time it changes); ``GET /play/channels``: each channel's profile, the tools a run there is
  offered and what each demo user may do there (`playground.profiles`);
  ``POST /play/{mention,action,submit,close,home}``: what a person does on the
  page, turned into the signed request Slack would send the bot (`playground.bot_client`); an
  event the bot does not take yet is kept and sent again as Slack would (`playground.delivery`);
- ``POST /play/respond/<id>``: the `response_url` of a click;
- ``POST /api/<method>`` (or ``GET``): the Slack Web API the bot and workers call (`SLACK_API_URL`);
- ``POST /model/v1/messages``: the offline demo model (`ANTHROPIC_BASE_URL`), when there is no key;
  with ``"stream": true`` its reply comes as the Messages API's server-sent events.

The page's own endpoints refuse a request whose ``Host`` is not this machine's loopback name (a
web page elsewhere cannot reach them by DNS rebinding) and a POST without the page's
``X-Playground`` header (a form or a simple cross-site request cannot carry it, so another tab
cannot make the bot act).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from playground import bot_client, demo_model, demo_stream
from playground.bot_client import Bot, BotUnreachable
from playground.delivery import Deliveries
from playground.slack import BOT_USER_ID, CHANNEL_ID, ApiError, Channel, Person, Workspace
from playground.view_inputs import state_values

log = logging.getLogger(__name__)

Json = dict[str, Any]
STATIC = Path(__file__).parent / "static"
ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}
# The page's ES modules (static/js/), served by plain name only: no path a request spells reaches
# another file. A browser runs a module only when it is served as JavaScript.
MODULE_PATH = re.compile(r"/static/js/([a-z]+\.js)")
MODULE_TYPE = "text/javascript; charset=utf-8"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
PAGE_HEADER = "X-Playground"
KEEPALIVE_SECONDS = 15.0
RESPONSE_URL_SECONDS = 30 * 60  # as Slack: a response_url works for 30 minutes …
RESPONSE_URL_USES = 5  # … and five times
MAX_BODY = 1 << 20
# What the app's manifest asks for; Slack names a token's scopes on every Web API answer.
SCOPES = (
    "app_mentions:read",
    "assistant:write",
    "channels:history",
    "chat:write",
    "files:write",
    "groups:history",
    "im:history",
    "reactions:write",
    "usergroups:read",
)


class PageError(Exception):
    """A page action that cannot be done, with the reason shown on the page."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ResponseUrl:
    """What a click's `response_url` acts on."""

    user: str
    channel: str
    message_ts: str
    thread_ts: str | None
    expires: float
    uses: int = RESPONSE_URL_USES


@dataclass
class Playground:
    """The page's actions on the workspace, sent to the bot as Slack would send them."""

    workspace: Workspace
    bot: Bot
    base_url: str
    demo: bool
    model_label: str
    notes: Mapping[str, str] = field(default_factory=dict)
    # channel id -> what `GET /play/channels` says of it (playground.profiles.describe)
    profiles: Mapping[str, Json] = field(default_factory=dict)
    # between two pieces of a streamed demo reply's text: words appear as a person watches
    model_pause_seconds: float = demo_stream.PIECE_PAUSE_SECONDS
    _responses: dict[str, ResponseUrl] = field(default_factory=dict)
    deliveries: Deliveries = field(init=False)

    def __post_init__(self) -> None:
        self.deliveries = Deliveries(self.bot, self.workspace.touch)

    def state(self) -> Json:
        """The page's snapshot: the workspace plus who the people are and which model answers."""
        return {
            **self.workspace.snapshot(),
            "users": [
                {"id": p.id, "name": p.name, "real_name": p.real_name, "note": self.notes.get(p.id, "")}
                for p in self.workspace.people.values()
            ],
            "model": {"demo": self.demo, "label": self.model_label},
            "delivery": self.deliveries.status(),
        }

    def channels(self) -> Json:
        """Each channel of the workspace with its profile, its tools and who may do what there."""
        return {
            "channels": [
                {"id": c.id, "name": c.name, **self.profiles.get(c.id, {})}
                for c in self.workspace.channels.values()
            ]
        }

    def channel(self, channel: Any) -> Channel:
        found = self.workspace.channels.get(channel) if isinstance(channel, str) else None
        if found is None:
            raise PageError(f"no such channel: {channel!r}")
        return found

    def person(self, user: Any) -> Person:
        found = self.workspace.people.get(user) if isinstance(user, str) else None
        if found is None:
            raise PageError(f"no such user: {user!r}")
        return found

    def mention(self, user: Any, text: Any, thread_ts: Any = None, channel: Any = CHANNEL_ID) -> Json:
        """Post a person's message mentioning the bot in `channel`, and send the bot its `app_mention`."""
        person = self.person(user)
        where = self.channel(channel)
        if not isinstance(text, str) or not text.strip():
            raise PageError("write something for the bot to do")
        if thread_ts is not None and not isinstance(thread_ts, str):
            raise PageError("thread_ts must be a message timestamp")
        mention = f"<@{BOT_USER_ID}>"
        body = text.strip()
        if mention not in body:
            body = f"{mention} {body.removeprefix('@harness').lstrip()}"
        try:
            message = self.workspace.post_as(person.id, body, thread_ts, where.id)
        except ApiError as exc:
            raise PageError(f"cannot post: {exc.error}") from None
        sent = self._send_event(bot_client.app_mention(person, message), f"{person.real_name}'s message")
        return {"ok": True, "ts": message["ts"], "delivered": sent}

    def action(self, request: Json) -> Json:
        """A click on a button the bot posted: in a message, an ephemeral message, a modal or Home."""
        person = self.person(request.get("user"))
        action_id, block_id = request.get("action_id"), request.get("block_id")
        trigger = self.workspace.new_trigger(person.id)
        view_id = request.get("view_id")
        if view_id:
            view = self.workspace.view(str(view_id), person.id)
            if view is None:
                raise PageError("that view is no longer open")
            element = _element(view.get("blocks"), block_id, action_id, request.get("value"))
            payload = bot_client.block_actions(
                person, element, trigger_id=trigger, response_url="", view=view
            )
        else:
            ts = str(request.get("message_ts") or "")
            ephemeral = bool(request.get("ephemeral"))
            found = self.workspace.ephemeral(ts, person.id) if ephemeral else self.workspace.message(ts)
            channel = self.workspace.channel_of(ts)
            if found is None or channel is None:
                raise PageError("that message is gone")
            element = _element(found.get("blocks"), block_id, action_id, request.get("value"))
            url = self._response_url(person.id, channel.id, ts, found.get("thread_ts"))
            where: Json = {"ephemeral_ts": ts} if ephemeral else {"message": found}
            payload = bot_client.block_actions(
                person, element, trigger_id=trigger, response_url=url, channel=channel, **where
            )
        self._deliver(lambda: self.bot.send_interaction(payload))
        return {"ok": True}

    def submit(self, user: Any, view_id: Any, typed: Any) -> Json:
        """Submit a modal; the bot may keep it open with errors, update it, or close it."""
        person = self.person(user)
        view = self.workspace.view(str(view_id), person.id)
        if view is None:
            raise PageError("that view is no longer open")
        values = state_values(view, typed if isinstance(typed, dict) else {})
        trigger = self.workspace.new_trigger(person.id)
        reply = self._deliver(
            lambda: self.bot.send_interaction(
                bot_client.view_submission(person, view, values, trigger_id=trigger)
            )
        )
        answer = reply.body if isinstance(reply.body, dict) else {}
        if answer.get("response_action") == "errors":
            errors = {str(k): str(v) for k, v in (answer.get("errors") or {}).items()}
            if not errors or set(errors) - set(values):  # Slack shows no error but under an input block
                raise PageError(f"the bot's errors name no input block of the view: {sorted(errors)}", 502)
            self.workspace.close_view(view["id"], person.id, errors=errors)
            return {"ok": False, "errors": errors}
        self.workspace.close_view(view["id"], person.id)
        return {"ok": True}

    def close(self, user: Any, view_id: Any) -> Json:
        """Close a modal with its close button (the bot hears of it when the view asked to)."""
        person = self.person(user)
        view = self.workspace.view(str(view_id), person.id)
        if view is None:
            return {"ok": True}
        self.workspace.close_view(view["id"], person.id)
        if view.get("notify_on_close"):
            self._deliver(lambda: self.bot.send_interaction(bot_client.view_closed(person, view)))
        return {"ok": True}

    def home(self, user: Any) -> Json:
        """A person opened the app's Home tab."""
        person = self.person(user)
        home = self.workspace.snapshot()["homes"].get(person.id)
        self._send_event(bot_client.app_home_opened(person, home), f"{person.real_name}'s Home tab opening")
        return {"ok": True}

    def respond(self, key: str, body: Json) -> None:
        """A POST to a click's `response_url`."""
        target = self._responses.get(key)
        if target is None or target.expires < time.monotonic() or target.uses <= 0:
            raise PageError("expired_url", status=404)
        target.uses -= 1
        self.workspace.respond(target.user, target.channel, target.message_ts, target.thread_ts, body)

    def _response_url(self, user: str, channel: str, message_ts: str, thread_ts: str | None) -> str:
        now = time.monotonic()
        self._responses = {k: r for k, r in self._responses.items() if r.expires > now}
        key = secrets.token_urlsafe(16)
        self._responses[key] = ResponseUrl(user, channel, message_ts, thread_ts, now + RESPONSE_URL_SECONDS)
        return f"{self.base_url}play/respond/{key}"

    def _send_event(self, event: Json, what: str) -> bool:
        """Send an event as Slack does: True when the bot took it, False when it is kept and retried."""
        reply = self.deliveries.send(event, what)
        if reply is not None:
            self._check(reply)
        return reply is not None

    def _deliver(self, send: Any) -> bot_client.Reply:
        """Send a click or a modal's submit or close once (Slack does not retry these either)."""
        try:
            reply: bot_client.Reply = send()
        except BotUnreachable as exc:
            if not self.deliveries.answered:
                raise PageError("the bot is still starting: try again in a moment", 503) from None
            raise PageError(f"{exc}; it may have stopped: see the terminal", 502) from None
        return self._check(reply)

    @staticmethod
    def _check(reply: bot_client.Reply) -> bot_client.Reply:
        if reply.status >= 300:
            raise PageError(f"the bot answered HTTP {reply.status}: {str(reply.body)[:300]}", 502)
        return reply


def _asset(path: str) -> tuple[Path, str] | None:
    """The file behind a GET of the page (its HTML, style or one of its modules) and its type."""
    if path in ASSETS:
        name, kind = ASSETS[path]
        return STATIC / name, kind
    module = MODULE_PATH.fullmatch(path)
    if module and (STATIC / "js" / module[1]).is_file():
        return STATIC / "js" / module[1], MODULE_TYPE
    return None


def _element(blocks: Any, block_id: Any, action_id: Any, value: Any = None) -> Json:
    """The interactive element `action_id` of block `block_id`, as a click reports it (`value`
    picks the half of a feedback_buttons element that was clicked)."""
    for block in blocks if isinstance(blocks, list) else []:
        if not isinstance(block, dict) or block.get("block_id") != block_id:
            continue
        candidates = list(block.get("elements") or [])
        if isinstance(block.get("accessory"), dict):
            candidates.append(block["accessory"])
        for element in candidates:
            if isinstance(element, dict) and element.get("action_id") == action_id:
                action = {"type": element.get("type", "button"), "action_id": action_id, "block_id": block_id}
                if action["type"] == "feedback_buttons":  # one element, two buttons: the value says which
                    halves = [element.get(h) or {} for h in ("positive_button", "negative_button")]
                    chosen = next((h for h in halves if h.get("value") == value), None)
                    if chosen is None:
                        raise PageError("no such feedback button")
                    return {**action, "text": chosen.get("text"), "value": chosen["value"]}
                for key in ("text", "value", "style"):
                    if key in element:
                        action[key] = element[key]
                return action
    raise PageError("that button is no longer there (the message changed)")


class Server(ThreadingHTTPServer):
    """The playground's HTTP server; `allowed_hosts` are the Host headers the page may use."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], playground: Playground) -> None:
        if ":" in address[0]:  # ::1 (the class-level default is IPv4)
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)
        self.playground = playground
        self.stopping = False


class Handler(BaseHTTPRequestHandler):
    """Routes one request."""

    server: Server
    server_version = "HarnessPlayground/1.0"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        split = urlsplit(self.path)
        path = split.path
        if path == "/healthz":
            return self._json(200, {"ok": True})
        if path.startswith("/api/"):  # Slack takes a Web API call as a GET too (usergroups.list is one)
            return self._web_api(path.removeprefix("/api/"), split.query, b"")
        if not self._local_host():
            return None
        asset = _asset(path)
        if asset is not None:
            return self._send(200, asset[0].read_bytes(), asset[1], cache=False)
        if path == "/play/state":
            return self._json(200, self.server.playground.state())
        if path == "/play/channels":
            return self._json(200, self.server.playground.channels())
        if path == "/play/events":
            return self._events()
        return self._json(404, {"ok": False, "error": "not_found"})

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        split = urlsplit(self.path)
        raw = self._body()
        if raw is None:
            return
        if split.path.startswith("/upload/"):  # the upload URL files.getUploadURLExternal hands out
            stored = self.server.playground.workspace.upload(split.path.removeprefix("/upload/"), raw)
            return self._json(200 if stored else 400, {"ok": stored})
        if split.path.startswith("/api/"):
            return self._web_api(split.path.removeprefix("/api/"), split.query, raw)
        if split.path == "/model/v1/messages" and self.server.playground.demo:
            return self._model(raw)
        if split.path.startswith("/play/respond/"):
            key = split.path.rsplit("/", 1)[1]
            return self._page(lambda body: self.server.playground.respond(key, body), raw)
        if not self._local_host():
            return None
        if self.headers.get(PAGE_HEADER) != "1":
            return self._json(403, {"ok": False, "error": f"the page's {PAGE_HEADER} header is missing"})
        play = self.server.playground
        routes = {
            "/play/mention": lambda r: play.mention(
                r.get("user"), r.get("text"), r.get("thread_ts"), r.get("channel", CHANNEL_ID)
            ),
            "/play/action": play.action,
            "/play/submit": lambda r: play.submit(r.get("user"), r.get("view_id"), r.get("values")),
            "/play/close": lambda r: play.close(r.get("user"), r.get("view_id")),
            "/play/home": lambda r: play.home(r.get("user")),
        }
        route = routes.get(split.path)
        if route is None:
            return self._json(404, {"ok": False, "error": "not_found"})
        return self._page(route, raw)

    # -- routes ------------------------------------------------------------------------------

    def _page(self, route: Any, raw: bytes) -> None:
        try:
            request = json.loads(raw or b"{}")
            if not isinstance(request, dict):
                raise PageError("the request must be a JSON object")
            answer = route(request)
        except ValueError:
            return self._json(400, {"ok": False, "error": "the request is not JSON"})
        except PageError as exc:
            return self._json(exc.status, {"ok": False, "error": str(exc)})
        return self._json(200, answer if isinstance(answer, dict) else {"ok": True})

    def _web_api(self, method: str, query: str, raw: bytes) -> None:
        params: Json = dict(parse_qsl(query, keep_blank_values=True))
        kind = self.headers.get("Content-Type") or ""
        text = raw.decode("utf-8", errors="replace")
        if "json" in kind:
            try:
                body = json.loads(text or "{}")
            except ValueError:
                return self._json(200, {"ok": False, "error": "invalid_json"})
            params.update(body if isinstance(body, dict) else {})
        else:
            params.update(parse_qsl(text, keep_blank_values=True))
        auth = self.headers.get("Authorization") or ""
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else params.pop("token", None)
        try:
            answer = self.server.playground.workspace.call(method, params, token)
        except ApiError as exc:
            return self._json(exc.status, {"ok": False, "error": exc.error})
        return self._json(200, answer, headers={"x-oauth-scopes": ",".join(SCOPES)})

    def _model(self, raw: bytes) -> None:
        try:
            request = json.loads(raw)
            if not isinstance(request, dict):
                raise demo_model.DemoModelError("the body must be an object")
            message = demo_model.respond(request)  # refuses before anything is sent: errors stay JSON
        except ValueError:
            error = demo_model.DemoModelError("the body is not JSON")
            return self._json(400, demo_model.error_body(error))
        except demo_model.DemoModelError as exc:
            return self._json(exc.status, demo_model.error_body(exc))
        if request.get("stream") is True:
            return self._model_stream(message)
        return self._json(200, message)

    def _model_stream(self, message: Json) -> None:
        """The demo model's reply as the Messages API streams it (`playground.demo_stream`)."""
        self.send_response(200)
        self.send_header("Content-Type", demo_stream.CONTENT_TYPE)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # the end of the body is the end of the stream
        self.end_headers()
        self.close_connection = True
        pause = self.server.playground.model_pause_seconds
        try:
            for event in demo_stream.stream_events(message, pause=lambda: time.sleep(pause)):
                self.wfile.write(demo_stream.encode(event))
                self.wfile.flush()
        except OSError:
            pass  # the client went away mid-stream

    def _events(self) -> None:
        """Server-sent events: the version now, then each new one (a comment line keeps it open)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        workspace = self.server.playground.workspace
        seen = -1
        try:
            while not self.server.stopping:
                version = workspace.wait_change(seen, KEEPALIVE_SECONDS)
                line = f"data: {version}\n\n" if version != seen else ": keepalive\n\n"
                self.wfile.write(line.encode())
                self.wfile.flush()
                seen = version
        except OSError:
            pass  # the page went away

    # -- plumbing -------------------------------------------------------------------------------

    def _local_host(self) -> bool:
        host = urlsplit("//" + (self.headers.get("Host") or "")).hostname or ""
        if host in LOOPBACK_NAMES or host == self.server.server_address[0]:
            return True
        self._json(421, {"ok": False, "error": f"open the playground at 127.0.0.1, not {host!r}"})
        return False

    def _body(self) -> bytes | None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self._json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"ok": False, "error": "body too large"})
            return None
        return self.rfile.read(length) if length else b""

    def _json(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        self._send(
            status, json.dumps(body).encode("utf-8"), "application/json; charset=utf-8", headers=headers
        )

    def _send(
        self,
        status: int,
        data: bytes,
        kind: str,
        *,
        cache: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Content-Type-Options", "nosniff")
        if kind.startswith("text/html"):
            self.send_header(
                "Content-Security-Policy",
                "default-src 'self'; img-src 'self' data: https:; object-src 'none'; base-uri 'none'; "
                "frame-ancestors 'none'",
            )
        if not cache:
            self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)
