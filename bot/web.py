"""The WSGI front: `/slack/events` to Bolt, `/healthz`, a body-size cap, and gunicorn to serve it."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from typing import Any

import redis
from gunicorn.app.base import BaseApplication
from slack_bolt import App
from slack_bolt.adapter.wsgi import SlackRequestHandler
from slack_bolt.request.internals import parse_body

MAX_BODY_BYTES = 1_000_000  # Slack's payloads are far smaller; bigger ones are not Slack

StartResponse = Callable[..., Any]


def wsgi_app(app: App, connection: redis.Redis) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    """The whole HTTP surface of the bot as one WSGI callable."""
    slack = SlackRequestHandler(app, path="/slack/events")

    def application(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz" and environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
            return _healthz(connection, start_response)
        if path == "/slack/events":
            try:
                length = int(environ.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY_BYTES:
                return _plain(start_response, "413 Request Entity Too Large", "body too large\n")
            if environ.get("REQUEST_METHOD") != "POST":
                return _plain(start_response, "405 Method Not Allowed", "POST only\n")
            body = environ["wsgi.input"].read(length) if length else b""
            problem = body_problem(body, environ.get("CONTENT_TYPE", ""))
            if problem:
                return _plain(start_response, "400 Bad Request", problem + "\n")
            environ["wsgi.input"] = io.BytesIO(body)
        return slack(environ, start_response)

    return application


def body_problem(body: bytes, content_type: str) -> str | None:
    """Why `body` cannot be a Slack request (Bolt would answer such bodies with a 500), or None."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "body is not UTF-8"
    try:
        parsed = parse_body(text, content_type or None)  # exactly as Bolt will parse it
    except ValueError:
        return "body is not valid JSON or form data"
    return _shape_problem(parsed)


# The shapes Slack sends: fields Bolt reads without checking must have the type it expects.
_DICT_FIELDS = ("event", "user", "channel", "team", "container", "message", "view", "authorizations_info")
_STR_FIELDS = ("type", "event_id", "team_id", "api_app_id", "trigger_id", "token", "challenge")


def _shape_problem(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "body is not a JSON object"
    for name in _DICT_FIELDS:
        if name in body and not isinstance(body[name], dict):
            return f"{name} is not an object"
    for name in _STR_FIELDS:
        if name in body and not isinstance(body[name], str):
            return f"{name} is not a string"
    if "event" in body and not isinstance(body["event"].get("type", ""), str):
        return "event.type is not a string"
    actions = body.get("actions")
    if actions is not None and not (isinstance(actions, list) and all(isinstance(a, dict) for a in actions)):
        return "actions is not a list of objects"
    if body.get("type") == "block_actions" and not actions:
        return "block_actions without actions"
    for action in actions or ():
        if not all(isinstance(action.get(k, ""), str) for k in ("action_id", "block_id", "value", "type")):
            return "an action field is not a string"
        if "action_id" not in action:
            return "an action without action_id"
    view = body.get("view", {})
    if not all(isinstance(view.get(k, ""), str) for k in ("callback_id", "private_metadata", "type", "id")):
        return "a view field is not a string"
    if not isinstance(view.get("state", {}), dict) or not isinstance(
        view.get("state", {}).get("values", {}), dict
    ):
        return "view.state is not an object"
    return None


def _healthz(connection: redis.Redis, start_response: StartResponse) -> Iterable[bytes]:
    try:
        connection.ping()
    except redis.RedisError as exc:
        return _plain(start_response, "503 Service Unavailable", f"redis unreachable: {type(exc).__name__}\n")
    return _plain(start_response, "200 OK", "ok\n")


def _plain(start_response: StartResponse, status: str, body: str) -> Iterable[bytes]:
    data = body.encode()
    start_response(
        status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))]
    )
    return [data]


class Server(BaseApplication):
    """gunicorn, configured in code: threaded workers, the app built once before forking."""

    def __init__(self, application: Any, options: dict[str, Any]) -> None:
        self.application = application
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return self.application


def serve(application: Any, port: int, *, workers: int = 2, threads: int = 8) -> None:
    """Serve `application` on 0.0.0.0:`port` until SIGTERM/SIGINT."""
    Server(
        application,
        {
            "bind": f"0.0.0.0:{port}",
            "workers": workers,
            "worker_class": "gthread",
            "threads": threads,
            "timeout": 30,
            "graceful_timeout": 10,
            "accesslog": "-",
            "limit_request_line": 8190,
        },
    ).run()
