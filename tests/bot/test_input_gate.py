"""The input gate in front of Bolt, and Bolt's error handler: one test per way a request broke the bot.

Each shape here once got a 5xx (Slack retries those), started a run it should not have, or was
refused although Slack sends it: an Approve click from an org-wide install carries `team: null`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
import redis
from slack_bolt import App
from slack_sdk import WebClient

from bot.app import create_app
from bot.listening import BotDeps
from bot.web import wsgi_app
from harness.config import load_config
from runtime.queue import make_queue
from store import Store
from store.keys import Keys
from tests.fakes import payloads
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.fakes.signing import signed_headers
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import SIGNING_SECRET, RedisServer, Stack, free_port, wait_until

JSON, FORM = "application/json", "application/x-www-form-urlencoded"


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A real `python -m bot` (no worker: a run is its record, written before the answer)."""
    url = redis_server.url.rsplit("/", 1)[0] + "/6"
    redis.Redis.from_url(url).flushdb()
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        stack = Stack(url, slack, model, Path(tmp_path_factory.mktemp("gate")))
        try:
            stack.start_bot()
            yield stack
        finally:
            stack.stop()


def run_tasks(redis_url: str) -> list[str]:
    conn = redis.Redis.from_url(redis_url)
    records = [Store(conn).runs.load(k.decode().rsplit(":", 1)[1]) for k in conn.scan_iter("harness:run:*")]
    return [r.task for r in records if r is not None]


def post(stack: Stack, kind: str, payload: Any) -> tuple[int, str]:
    body, content_type = payloads.http_body(kind, payload)
    return stack.post(body, content_type)


def mention_body(event_id: str, **event: Any) -> dict[str, Any]:
    base = payloads.app_mention("do it", user=f"U{event_id.upper()}", channel=f"C{event_id.upper()}")
    return payloads.event_callback({**base, **event}, event_id=event_id)


# --- shapes that got a 5xx or a run ------------------------------------------------------------------


def delivery(name: str) -> payloads.Json:
    """A fresh copy of the realistic payload called `name`."""
    return next(d.payload for d in payloads.deliveries() if d.name == name)


def broken(name: str, path: tuple[str | int, ...], value: Any = payloads.MISSING) -> payloads.Json:
    """The payload `name` with the value at `path` replaced (or removed)."""
    if value == payloads.MISSING:
        return payloads.removed(delivery(name), path)
    return payloads.replaced(delivery(name), path, value)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        pytest.param("events_api", mention_body("Ev1", user=7), id="event.user is a number"),
        pytest.param("events_api", mention_body("Ev2", channel=True), id="event.channel is true"),
        pytest.param(
            "events_api", {**mention_body("Ev3"), "authorizations": "x"}, id="authorizations a string"
        ),
        pytest.param(
            "events_api", {**mention_body("Ev4"), "authorizations": [None]}, id="authorizations[0] null"
        ),
        pytest.param(
            "interactive", broken("view_submission", ("enterprise",), 1.5), id="enterprise a number"
        ),
        pytest.param("interactive", broken("view_submission", ("view", "type")), id="view without its type"),
        pytest.param(
            "interactive", broken("view_submission", ("response_urls",), None), id="response_urls null"
        ),
        pytest.param("interactive", broken("block_suggestion", ("action_id",), 3), id="action_id a number"),
        pytest.param(
            "interactive",
            broken("interactive_message (legacy attachment button)", ("actions",)),
            id="legacy button without actions",
        ),
        pytest.param(
            "interactive", broken("block_actions: approve on a card", ("actions",), []), id="no action"
        ),
        pytest.param(
            "events_api", broken("function_executed", ("event", "function"), "f"), id="function a string"
        ),
    ],
)
def test_a_signed_body_bolt_would_choke_on_gets_a_400(stack: Stack, kind: str, payload: Any) -> None:
    status, answer = post(stack, kind, payload)
    assert status == 400, answer


@pytest.mark.e2e
def test_a_mention_whose_text_is_not_a_string_starts_no_run(stack: Stack) -> None:
    status, _ = post(stack, "events_api", mention_body("EvTextTrue", text=True))
    assert status == 400
    assert "True" not in run_tasks(stack.redis_url)


@pytest.mark.e2e
def test_a_mention_with_a_lone_surrogate_gets_a_400_not_a_500(stack: Stack) -> None:
    status, _ = post(stack, "events_api", mention_body("EvSurrogate", text="<@UBOT> a\ud83dz"))
    assert status == 400  # it was a 500: the run record could not be encoded as UTF-8 for Redis


@pytest.mark.e2e
def test_a_json_array_sent_as_json_with_a_charset_gets_a_400(stack: Stack) -> None:
    body = json.dumps([mention_body("EvArray")])
    status, _ = stack.post(body, "application/json; charset=utf-8")
    assert status == 400  # the old gate parsed it as form data (no `payload`: {}); Bolt as JSON


@pytest.mark.e2e
def test_json_nested_deeper_than_python_recurses_gets_a_400(stack: Stack) -> None:
    body = '{"type": "event_callback", "event": ' + "[" * 100_000 + "]" * 100_000 + "}"
    status, _ = stack.post(body, JSON)
    assert status == 400


@pytest.mark.e2e
@pytest.mark.parametrize(
    "headers",
    [
        {"X-Slack-Request-Timestamp": "yesterday", "X-Slack-Signature": "v0=00"},
        {"X-Slack-Request-Timestamp": str(int(time.time())), "X-Slack-Signature": "v0=caf\u00e9"},
        {"X-Slack-Request-Timestamp": "9" * 400, "X-Slack-Signature": "v0=00"},
    ],
    ids=["timestamp not a number", "signature not ASCII", "timestamp too big"],
)
def test_odd_signature_headers_get_a_401_not_a_500(stack: Stack, headers: dict[str, str]) -> None:
    body = json.dumps(mention_body("EvHeaders"))
    status, _ = stack.post(body, JSON, headers=headers)
    assert status == 401


@pytest.mark.e2e
def test_an_unsigned_malformed_body_gets_a_401_before_its_shape_is_looked_at(stack: Stack) -> None:
    status, _ = stack.post("[1, 2", JSON, headers=signed_headers("not-the-secret", "[1, 2"))
    assert status == 401


# --- shapes Slack sends that the gate must let through -----------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("delivery", payloads.deliveries(), ids=lambda d: d.name)
def test_no_request_slack_sends_is_refused_at_the_gate(stack: Stack, delivery: payloads.Delivery) -> None:
    body, content_type, retry = delivery.http()
    status, answer = stack.post(body, content_type, headers={**signed_headers(SIGNING_SECRET, body), **retry})
    assert status in (200, 404), (status, answer)  # 404: no listener for it (Bolt's answer, not the gate's)


@pytest.mark.e2e
def test_an_approve_click_from_an_org_wide_install_reaches_the_listener(
    redis_url: str, tmp_path: Path
) -> None:
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        stack = Stack(redis_url, slack, model, tmp_path)
        model.script(
            reply(tool_use("write_file", {"path": "org.txt", "content": "grid"})), reply(text("org done"))
        )
        try:
            stack.start_bot()
            stack.start_worker()
            ts = slack.add_message("CORG", "<@UBOT> write org.txt", user="WORGUSER")
            mention = payloads.app_mention("write org.txt", user="WORGUSER", channel="CORG", ts=ts)
            status, _ = post(
                stack, "events_api", payloads.event_callback(mention, event_id="EvOrg", org=True)
            )
            assert status == 200
            card = wait_until(
                lambda: next((m for m in slack.messages("CORG", ts) if "approve" in str(m["blocks"])), None)
            )

            click = payloads.block_actions("approve", user="WORGUSER", channel="CORG", message=card, org=True)
            assert click["team"] is None and click["is_enterprise_install"] is True
            status, answer = post(stack, "interactive", click)

            assert status == 200, answer  # it was a 400: "team is not an object"
            wait_until(lambda: any("org done" in m["text"] for m in slack.messages("CORG", ts)), timeout=60)
            assert (stack.workspace / "org.txt").read_text() == "grid"
        finally:
            stack.stop()


# --- Bolt's error handler: 500 only when Slack's retry can help --------------------------------------


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[Any]:
    """Serve a WSGI app over real HTTP on loopback; yields a function that starts one and returns its URL."""
    servers = []

    def start(application: Any) -> str:
        server = make_server("127.0.0.1", 0, application, handler_class=_Quiet)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/slack/events"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def send(url: str, payload: dict[str, Any]) -> int:
    body, content_type = payloads.http_body("events_api", payload)
    headers = {"Content-Type": content_type, **signed_headers(SIGNING_SECRET, body)}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, body.encode(), headers), timeout=15
        ) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.fixture
def slack() -> Iterator[FakeSlackAPI]:
    with FakeSlackAPI(bot_token="xoxb-test") as fake:
        yield fake


def bot_app(connection: redis.Redis, slack: FakeSlackAPI) -> App:
    """The real app of `bot/app.py` (it registers `bolt_error_handler` itself)."""
    deps = BotDeps(store=Store(connection), queue=make_queue(connection), config=load_config(env={}))
    return create_app(
        deps, client=WebClient(token="xoxb-test", base_url=slack.base_url), signing_secret=SIGNING_SECRET
    )


def test_with_the_error_handler_redis_down_is_still_a_500(serve: Any, slack: FakeSlackAPI) -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=1)
    url = serve(wsgi_app(bot_app(dead, slack), dead, signing_secret=SIGNING_SECRET))
    assert send(url, mention_body("EvDown")) == 500  # Slack retries it: Redis may be back by then


def test_a_listener_failure_a_retry_cannot_cure_is_a_400_with_the_error_handler(
    serve: Any, slack: FakeSlackAPI, redis_url: str
) -> None:
    connection = redis.Redis.from_url(redis_url)
    connection.set(Keys.user_runs(payloads.TEAM, "UEVWRONGTYPE"), "not a sorted set")  # WRONGTYPE
    url = serve(wsgi_app(bot_app(connection, slack), connection, signing_secret=SIGNING_SECRET))
    assert send(url, mention_body("EvWrongType")) == 400  # Bolt's default handler would say 500


def test_a_failure_that_escapes_bolt_is_a_400(serve: Any, slack: FakeSlackAPI, redis_url: str) -> None:
    app = App(client=WebClient(token="xoxb-test", base_url=slack.base_url), signing_secret=SIGNING_SECRET)

    @app.middleware
    def broken_middleware(next: Any) -> None:
        raise KeyError("event")

    @app.error
    def broken_handler(error: Exception) -> None:
        raise RuntimeError("and the error handler fails too") from error

    connection = redis.Redis.from_url(redis_url)
    url = serve(wsgi_app(app, connection, signing_secret=SIGNING_SECRET))
    assert send(url, mention_body("EvEscape")) == 400  # Bolt's WSGI adapter let it out: a 500


@pytest.mark.e2e
def test_the_bot_answers_a_failure_a_retry_cannot_cure_with_a_400(stack: Stack) -> None:
    connection = redis.Redis.from_url(stack.redis_url)
    connection.set(Keys.user_runs(payloads.TEAM, "UEVBOTWRONG"), "not a sorted set")  # WRONGTYPE
    status, _ = post(stack, "events_api", mention_body("EvBotWrong"))
    assert status == 400


# --- ids that are strings but not Slack's ------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize(
    "field",
    [{"ts": "\u0661\u0662.\u0663"}, {"channel": "CNEWLINE\n"}, {"user": "UNEWLINE\n"}],
    ids=["ts in Arabic-Indic digits", "channel ending in a newline", "user ending in a newline"],
)
def test_a_mention_with_an_id_slack_never_sends_starts_no_run(stack: Stack, field: dict[str, str]) -> None:
    text = f"<@UBOT> odd id {sorted(field)[0]}"
    status, _ = post(stack, "events_api", mention_body(f"EvOdd{sorted(field)[0]}", text=text, **field))
    assert status in (200, 400)
    assert text not in run_tasks(stack.redis_url)


def test_a_normal_start_warns_of_nothing(
    conn: redis.Redis, slack: FakeSlackAPI, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Seen on every start: Bolt read SLACK_BOT_TOKEN itself and warned "`token` will be unused"
    about the very token our client was built with."""
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test")
    with caplog.at_level(logging.WARNING):
        bot_app(conn, slack)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
