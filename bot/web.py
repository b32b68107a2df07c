"""The WSGI front: `/slack/events` to Bolt behind an input gate, `/healthz`, and gunicorn to serve it.

The gate answers every request Slack could not have sent with a 4xx before Bolt sees it: an
unsigned body 401, a signed body whose shape is not one Slack sends 400. Bolt reads many fields
without checking their type (`slack_bolt/request/internals.py` builds the context from `team`,
`user`, `channel`, `enterprise`, `authorizations[0]`, `event`... before the signature is even
checked; its matchers index `actions[0]["action_id"]` and `view["type"]`), so the gate checks the
type of every field Bolt or our listeners read, accepting each type Slack documents for it (null
included: `team` of an org-wide install, `enterprise` outside Enterprise Grid). Fields nobody
reads are not checked: Slack adds fields over time. A 5xx is kept for the one case where Slack's
retry can help: Redis is unavailable (see `bolt_error_handler`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qs

import redis
from gunicorn import glogging
from gunicorn.app.base import BaseApplication
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from slack_bolt import App, BoltRequest, BoltResponse
from slack_bolt.adapter.wsgi.http_request import WsgiHttpRequest
from slack_bolt.adapter.wsgi.http_response import WsgiHttpResponse
from slack_bolt.request.internals import parse_body
from slack_sdk.signature import SignatureVerifier

from bot.access import OperatorAccess, Refusal
from harness.config import Config
from observe import families, health, logs, metrics, scrape
from runtime.queue import make_queue

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1_000_000  # Slack's payloads are far smaller; bigger ones are not Slack
ACK = families.ACK_SECONDS
MAX_DEPTH = 32  # Slack's deepest payloads (rich text in a message echoed in a click) nest about 12 levels

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

# Redis unavailable: the one failure a retry by Slack can cure, so the one answered with a 5xx.
RETRYABLE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ReadOnlyError,
)


def wsgi_app(
    app: App,
    connection: redis.Redis,
    *,
    signing_secret: str,
    operators: OperatorAccess | None = None,
    config: Callable[[], Config] | None = None,
) -> WsgiApp:
    """The whole HTTP surface of the bot as one WSGI callable.

    `operators`: who may read `/metrics` and `/healthz?deep=1` (`bot.access`); loopback only by default.
    `config`: the config in force now, which labels the gauges of approvers and budgets.
    """
    verifier = SignatureVerifier(signing_secret)
    figures = scrape.registry(connection, make_queue(connection), config)
    acks = metrics.Gathered(connection)  # an answer's time, written with the others of its second
    access = operators or OperatorAccess()

    def application(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        started = time.monotonic()
        path = environ.get("PATH_INFO", "")
        if path == "/healthz" and environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
            if _deep(environ):
                refused = access.refusal(environ)
                if refused:
                    return _refuse(start_response, refused)
                return _deep_healthz(connection, start_response)
            return _healthz(connection, start_response)
        if path == "/metrics" and environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
            refused = access.refusal(environ)
            if refused:
                return _refuse(start_response, refused)
            return _metrics(figures, start_response)
        if path != "/slack/events" or access.on_metrics_listener(environ):
            return _plain(start_response, "404 Not Found", "not found\n")
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            return _plain(start_response, "413 Request Entity Too Large", "body too large\n")
        if environ.get("REQUEST_METHOD") != "POST":
            return _plain(start_response, "405 Method Not Allowed", "POST only\n")
        body = environ["wsgi.input"].read(length) if length else b""
        if not is_signed(verifier, body, environ):
            return _plain(start_response, "401 Unauthorized", "invalid signature\n")
        problem = body_problem(body, environ.get("CONTENT_TYPE", ""))
        if problem:
            log.info("refused a signed request: %s", problem)
            return _plain(start_response, "400 Bad Request", problem + "\n")
        kind = "event" if environ.get("CONTENT_TYPE", "").startswith("application/json") else "interaction"
        answer = _dispatch(app, environ, body.decode("utf-8"), start_response)
        return _Timed(answer, lambda: acks.observe(ACK, time.monotonic() - started, kind=kind))

    return application


class _Timed:
    """The body of an answer to Slack; `on_close` runs once the server has sent it (WSGI's close),
    so what it does (a metrics write) never delays the answer."""

    def __init__(self, body: Iterable[bytes], on_close: Callable[[], None]) -> None:
        self.body = body
        self.on_close = on_close

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.body)

    def close(self) -> None:
        self.on_close()


def is_signed(verifier: SignatureVerifier, body: bytes, environ: dict[str, Any]) -> bool:
    """Whether Slack signed `body` in the last five minutes; never raises on odd headers.

    Bolt checks again, but its check raises on a non-numeric timestamp or a non-ASCII signature
    (a 500), and runs only after Bolt has parsed the body: here nothing unsigned is parsed at all.
    """
    timestamp = environ.get("HTTP_X_SLACK_REQUEST_TIMESTAMP")
    signature = environ.get("HTTP_X_SLACK_SIGNATURE")
    try:
        return verifier.is_valid(body, timestamp, signature)
    except (ValueError, TypeError, OverflowError):
        return False


def _dispatch(app: App, environ: dict[str, Any], text: str, start_response: StartResponse) -> Iterable[bytes]:
    """Bolt's WSGI adapter, except that a failure to build or run the request is a 400, not a 500."""
    request = WsgiHttpRequest(environ)
    try:
        bolt_request = BoltRequest(body=text, query=request.query_string, headers=request.get_headers())
        response = app.dispatch(bolt_request)
    except Exception:  # the gate let through a shape Bolt cannot take: the body's fault, not ours
        log.exception("Bolt failed on a signed request that passed the gate")
        return _plain(start_response, "400 Bad Request", "bad request\n")
    answer = WsgiHttpResponse(status=response.status, headers=response.headers, body=response.body)
    start_response(answer.status, answer.get_headers())
    return answer.get_body()


def bolt_error_handler(error: Exception, body: dict[str, Any], logger: logging.Logger) -> BoltResponse:
    """Bolt's global error handler (`app.error`): 500 only when Slack's retry can succeed.

    Redis unavailable: 500, and Slack retries the event. Anything else a listener raises would
    raise again on every retry: 400, logged with its traceback.
    """
    kind = body.get("type") if isinstance(body, dict) else None
    if isinstance(error, RETRYABLE_ERRORS):
        logger.error("Redis is unavailable (%s): answering %s with 500 so Slack retries", error, kind)
        return BoltResponse(status=500, body="")
    logger.error("a listener failed on a %s request: answering 400", kind, exc_info=error)
    return BoltResponse(status=400, body="")


# --- the shapes Slack sends --------------------------------------------------------------------------


def body_problem(body: bytes, content_type: str) -> str | None:
    """Why `body` cannot be a request from Slack, or None."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "body is not UTF-8"
    try:  # exactly as Bolt will parse it (BoltRequest drops the content type's parameters)
        parsed = parse_body(text, content_type.split(";")[0] or None)
    except (ValueError, RecursionError):
        return "body is not valid JSON or form data"
    return payload_problem(parsed)


def payload_problem(payload: Any) -> str | None:
    """Why a parsed payload is not one Slack sends (in a field Bolt or our listeners read), or None."""
    if not isinstance(payload, dict):
        return "body is not a JSON object"
    return _text_problem(payload) or _context_problem(payload, "") or _kind_problem(payload)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _text_problem(payload: dict[str, Any]) -> str | None:
    """Slack sends Unicode text: no lone surrogate (JSON can escape one; UTF-8 cannot hold it)."""
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return "a string holds a lone surrogate"
        elif depth > MAX_DEPTH:
            return "body nests deeper than Slack's payloads"
        elif isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE.search(key):
                    return "a key holds a lone surrogate"
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
    return None


# Read by Bolt's context building at every level it searches (the body, `authorizations[0]`,
# `event` and the objects below it), and copied into the context and its Web API client.
_ID_FIELDS = ("enterprise_id", "team_id", "user_id", "channel_id", "thread_ts", "function_execution_id")
_REF_FIELDS = ("enterprise", "team", "user", "channel")  # an id, an object with one, or null
_NESTED = ("event", "message", "previous_message", "item", "assistant_thread")


def _context_problem(obj: dict[str, Any], where: str) -> str | None:
    for name in _ID_FIELDS + ("bot_access_token",):
        if obj.get(name) is not None and not isinstance(obj[name], str):
            return f"{where}{name} is not a string"
    for name in _REF_FIELDS:
        ref = obj.get(name)
        if ref is None or isinstance(ref, str):
            continue
        if not isinstance(ref, dict):
            return f"{where}{name} is not an object, an id or null"
        for key in ("id", "team_id", "enterprise_id"):
            if ref.get(key) is not None and not isinstance(ref[key], str):
                return f"{where}{name}.{key} is not a string"
    authorizations = obj.get("authorizations")
    if authorizations is not None:
        if not _objects(authorizations):
            return f"{where}authorizations is not a list of objects"
        if authorizations and (problem := _context_problem(authorizations[0], f"{where}authorizations[0].")):
            return problem
    if "event" in obj and not isinstance(obj["event"], dict):
        return f"{where}event is not an object"
    for name in ("assistant_thread", "function_data"):
        if obj.get(name) is not None and not isinstance(obj[name], dict):
            return f"{where}{name} is not an object"
    for name in _NESTED:
        if isinstance(obj.get(name), dict) and (problem := _context_problem(obj[name], f"{where}{name}.")):
            return problem
    return None


# Top-level fields read by Bolt (matchers, the unhandled-request message, url_verification) or by
# our listeners, and the type Slack sends them with.
_TOP_STRINGS = ("type", "event_id", "trigger_id", "callback_id", "response_url", "challenge", "action_id")


def _kind_problem(body: dict[str, Any]) -> str | None:
    for name in _TOP_STRINGS:
        if name in body and not isinstance(body[name], str):
            return f"{name} is not a string"
    if "view" in body and not isinstance(body["view"], dict):
        return "view is not an object"
    kind = body.get("type")
    if kind == "event_callback":
        return _event_problem(body.get("event"))
    if kind in ("block_actions", "interactive_message"):
        problem = _actions_problem(body.get("actions"), block_kit=kind == "block_actions")
        if problem:
            return problem
        if kind == "block_actions" and not isinstance(body.get("trigger_id"), str):
            return "block_actions without a trigger_id"
    if kind in ("view_submission", "view_closed") and "view" not in body:
        return f"{kind} without a view"
    if kind == "workflow_step_edit" and "workflow_step" not in body:
        return "workflow_step_edit without a workflow_step"
    message = body.get("message")
    thread_ts = message.get("thread_ts") if isinstance(message, dict) else None
    if thread_ts is not None and not isinstance(thread_ts, str):
        return "message.thread_ts is not a string"
    if "response_urls" in body and not _objects(body["response_urls"]):
        return "response_urls is not a list of objects"
    return _view_problem(body.get("view"), kind, "workflow_step" in body)


def _event_problem(event: Any) -> str | None:
    if not isinstance(event, dict):
        return "event_callback without an event"
    if not isinstance(event.get("type"), str):
        return "event.type is not a string"
    for name in ("text", "ts", "subtype", "bot_id"):  # what our listeners read
        if event.get(name) is not None and not isinstance(event[name], str):
            return f"event.{name} is not a string"
    if "function" in event and not isinstance(event["function"], dict):
        return "event.function is not an object"
    if event["type"] in ("app_mention", "message") and not isinstance(event.get("channel"), str):
        return f"{event['type']} without a channel"
    return None


def _actions_problem(actions: Any, *, block_kit: bool) -> str | None:
    if not actions or not _objects(actions):
        return "actions is not a non-empty list of objects"
    for action in actions if block_kit else ():
        if not isinstance(action.get("action_id"), str):
            return "an action without a string action_id"
        for key in ("block_id", "value"):
            if key in action and not isinstance(action[key], str):
                return f"an action's {key} is not a string"
    return None


def _view_problem(view: dict[str, Any] | None, kind: Any, has_step: bool) -> str | None:
    if view is None:
        return None
    for key in ("type", "callback_id", "private_metadata"):
        if key in view and not isinstance(view[key], str):
            return f"view.{key} is not a string"
    for key in ("team_id", "app_installed_team_id"):
        if view.get(key) is not None and not isinstance(view[key], str):
            return f"view.{key} is not a string"
    if kind in ("view_submission", "view_closed") and not all(k in view for k in ("type", "callback_id")):
        return f"{kind} with a view without a type or callback_id"
    if kind == "view_submission" and view.get("type") == "workflow_step" and not has_step:
        return "a workflow_step view without a workflow_step"
    state = view.get("state", {})
    values = state.get("values", {}) if isinstance(state, dict) else None
    if not isinstance(values, dict) or not all(
        isinstance(block, dict) and all(isinstance(element, dict) for element in block.values())
        for block in values.values()
    ):
        return "view.state.values is not an object of blocks of elements"
    return None


def _objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _healthz(connection: redis.Redis, start_response: StartResponse) -> Iterable[bytes]:
    try:
        connection.ping()
    except redis.RedisError as exc:
        return _plain(start_response, "503 Service Unavailable", f"redis unreachable: {type(exc).__name__}\n")
    return _plain(start_response, "200 OK", "ok\n")


def _deep(environ: dict[str, Any]) -> bool:
    values = parse_qs(environ.get("QUERY_STRING") or "").get("deep") or [""]
    return values[-1].lower() in ("1", "true", "yes")


def _deep_healthz(connection: redis.Redis, start_response: StartResponse) -> Iterable[bytes]:
    """Whether a worker is alive and how deep the queue is, as JSON; 503 when no worker is alive."""
    try:
        healthy, report = health.deep_health(connection, make_queue(connection), time.time())
    except redis.RedisError as exc:
        healthy, report = False, {"ok": False, "redis": f"unreachable: {type(exc).__name__}"}
    data = (json.dumps(report, indent=1) + "\n").encode()
    status = "200 OK" if healthy else "503 Service Unavailable"
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def _metrics(figures: Any, start_response: StartResponse) -> Iterable[bytes]:
    """Prometheus text of the whole product (figures in Redis, gauges read now); 503 without Redis."""
    try:
        data = generate_latest(figures)
    except redis.RedisError as exc:
        return _plain(start_response, "503 Service Unavailable", f"redis unreachable: {type(exc).__name__}\n")
    start_response("200 OK", [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4), ("Content-Length", str(len(data)))])
    return [data]


def _plain(
    start_response: StartResponse, status: str, body: str, headers: Iterable[tuple[str, str]] = ()
) -> Iterable[bytes]:
    data = body.encode()
    start_response(
        status,
        [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data))), *headers],
    )
    return [data]


def _refuse(start_response: StartResponse, refusal: Refusal) -> Iterable[bytes]:
    return _plain(start_response, refusal.status, refusal.body, refusal.headers)


class GunicornLogger(glogging.Logger):
    """gunicorn's own error and access lines in the process's format (JSON lines with LOG_FORMAT=json)."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        logs.restyle(self.error_log)
        logs.restyle(self.access_log)


class Server(BaseApplication):
    """gunicorn, configured in code: threaded workers, the app built once before forking.

    On SIGHUP gunicorn's master reloads (`Arbiter.reload` calls `reload` here) and forks a new
    set of workers, sending the old ones a graceful stop: `on_reload` runs in the master first, so
    what it swaps (the bot's config) is what the new workers inherit.
    """

    def __init__(
        self, application: Any, options: dict[str, Any], on_reload: Callable[[], object] | None = None
    ) -> None:
        self.application = application
        self.options = options
        self.on_reload = on_reload
        super().__init__()

    def reload(self) -> None:
        super().reload()
        if self.on_reload is not None:
            self.on_reload()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return self.application


def serve(
    application: Any,
    port: int,
    *,
    host: str = "0.0.0.0",
    workers: int = 2,
    threads: int = 8,
    also: tuple[tuple[str, int], ...] = (),
    on_reload: Callable[[], object] | None = None,
) -> None:
    """Serve `application` on `host`:`port` (and each (host, port) of `also`) until SIGTERM/SIGINT;
    SIGHUP runs `on_reload` in the master, then replaces the workers gracefully."""
    binds = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in ((host, port), *also)]
    Server(
        application,
        {
            "bind": binds,
            "workers": workers,
            "worker_class": "gthread",
            "threads": threads,
            "timeout": 30,
            "graceful_timeout": 10,
            "accesslog": "-",
            "logger_class": GunicornLogger,
            "limit_request_line": 8190,
            # gunicorn 25+ opens a control socket in $HOME/.gunicorn by default: nothing of ours
            # belongs in the user's home, and nobody here uses `gunicornc`.
            "control_socket_disable": True,
        },
        on_reload,
    ).run()
