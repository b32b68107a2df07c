"""The WSGI front: `/slack/events` to Bolt, `/healthz`, a body-size cap, and gunicorn to serve it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import redis
from gunicorn.app.base import BaseApplication
from slack_bolt import App
from slack_bolt.adapter.wsgi import SlackRequestHandler

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
        return slack(environ, start_response)

    return application


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


class Server(BaseApplication):  # type: ignore[misc]
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
