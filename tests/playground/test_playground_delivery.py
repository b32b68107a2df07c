"""The playground delivers events as Slack does: kept and sent again while the bot does not take them.

The playground's server in this process, and a stand-in bot on real HTTP that records what it gets
(headers and bodies, signatures checked) and answers as each test scripts it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest
from slack_sdk import WebClient
from slack_sdk.signature import SignatureVerifier

from playground.server import Server
from playground.slack import CHANNEL_ID
from tests.playground_support import ALICE, Page, stand_in
from tests.stack import wait_until

TOKEN = "xoxb-playground-delivery"


class RecordingBot(ThreadingHTTPServer):
    """A bot that answers ``/healthz`` 200 and each event with the next of `statuses` (200 after)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, statuses: list[int], no_retry: bool = False) -> None:
        super().__init__(("127.0.0.1", port), _Recorder)
        self.statuses = list(statuses)
        self.no_retry = no_retry
        self.events: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.lock = threading.Lock()


class _Recorder(BaseHTTPRequestHandler):
    server: RecordingBot

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802
        self._answer(200 if self.path == "/healthz" else 404)

    def do_POST(self) -> None:  # noqa: N802
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k.lower(): v for k, v in self.headers.items()}
        signed = SignatureVerifier("secret").is_valid(
            body=raw, timestamp=headers["x-slack-request-timestamp"], signature=headers["x-slack-signature"]
        )
        with self.server.lock:
            self.server.events.append(({**headers, "signed": str(signed)}, json.loads(raw)))
            status = self.server.statuses.pop(0) if self.server.statuses else 200
        self._answer(status, {"X-Slack-No-Retry": "1"} if self.server.no_retry and status >= 300 else {})

    def _answer(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()


@contextmanager
def recording_bot(server: Server, statuses: list[int], no_retry: bool = False) -> Iterator[RecordingBot]:
    """A recording bot on the address the playground sends to, until the block ends."""
    bot = RecordingBot(urlsplit(server.playground.bot.url).port or 0, statuses, no_retry)
    thread = threading.Thread(target=bot.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield bot
    finally:
        bot.shutdown()
        bot.server_close()
        thread.join(10)


@pytest.fixture
def served() -> Iterator[tuple[Server, Page]]:
    """A playground server whose bot does not listen yet."""
    with stand_in(TOKEN) as server:
        yield server, Page(server.playground.base_url)


def delivery(page: Page) -> dict[str, Any]:
    return page.state()["delivery"]  # type: ignore[no-any-return]


def test_a_mention_sent_while_the_bot_starts_is_kept_and_delivered_by_slacks_first_retry(served: Any) -> None:
    server, page = served
    server.playground.deliveries.watch_start()
    assert delivery(page) == {"bot_answered": False, "kept": [], "lost": []}  # the page says: starting

    status, answer = page.request("POST", "play/mention", {"user": ALICE, "text": "hello while you start"})

    assert status == 200 and answer["ok"] is True and answer["delivered"] is False
    [kept] = delivery(page)["kept"]
    assert (kept["what"], kept["retry"], kept["of"], kept["reason"]) == (
        "Alice's message",
        1,
        3,
        "connection_failed",
    )
    with recording_bot(server, []) as bot:
        wait_until(lambda: delivery(page) == {"bot_answered": True, "kept": [], "lost": []})
        [(headers, body)] = bot.events
    assert headers["x-slack-retry-num"] == "1" and headers["x-slack-retry-reason"] == "connection_failed"
    assert headers["signed"] == "True"
    assert body["event"]["type"] == "app_mention" and "hello while you start" in body["event"]["text"]
    assert body["event"]["ts"] == answer["ts"]


def test_a_bot_answering_5xx_gets_the_same_event_again_until_it_takes_it(served: Any) -> None:
    server, page = served
    with recording_bot(server, [503]) as bot:
        ts = page.mention(ALICE, "hello again")
        wait_until(lambda: len(bot.events) == 2 and delivery(page)["kept"] == [])
    (first, sent), (again, resent) = bot.events
    assert "x-slack-retry-num" not in first
    assert again["x-slack-retry-num"] == "1" and again["x-slack-retry-reason"] == "http_error"
    assert resent["event_id"] == sent["event_id"] and resent["event"]["ts"] == ts  # the same event
    assert delivery(page)["bot_answered"] is True


def test_after_slacks_three_retries_the_page_says_the_bot_never_took_it(served: Any) -> None:
    server, page = served
    server.playground.deliveries.schedule = (0.01, 0.01, 0.01)  # Slack's 1 s, 1 min, 5 min, shortened
    with recording_bot(server, [500] * 10) as bot:
        page.mention(ALICE, "hello to a broken bot")
        wait_until(lambda: delivery(page)["lost"])
        assert [h.get("x-slack-retry-num") for h, _ in bot.events] == [None, "1", "2", "3"]
        assert len({b["event_id"] for _, b in bot.events}) == 1
    assert delivery(page)["kept"] == []
    assert delivery(page)["lost"] == [
        {"what": "Alice's message", "why": "the bot never took it after Slack's 3 retries; see the terminal"}
    ]


@pytest.mark.parametrize(("status", "no_retry"), [(400, False), (500, True)])
def test_a_refusal_the_bot_means_is_not_retried_and_the_page_says_it(
    served: Any, status: int, no_retry: bool
) -> None:
    server, page = served
    with recording_bot(server, [status], no_retry=no_retry) as bot:
        code, answer = page.request("POST", "play/mention", {"user": ALICE, "text": "hello"})
        assert code == 502 and f"the bot answered HTTP {status}" in answer["error"]
        assert delivery(page)["kept"] == [] and len(bot.events) == 1


def test_a_click_while_the_bot_starts_says_so_and_is_not_kept(served: Any) -> None:
    server, page = served
    client = WebClient(token=TOKEN, base_url=server.playground.base_url + "api/")
    button = {"type": "button", "action_id": "x", "text": {"type": "plain_text", "text": "Go"}}
    posted = client.chat_postMessage(
        channel=CHANNEL_ID, text="a card", blocks=[{"type": "actions", "block_id": "b", "elements": [button]}]
    )
    body = {"user": ALICE, "action_id": "x", "block_id": "b", "message_ts": posted["ts"]}
    code, answer = page.request("POST", "play/action", body)
    assert code == 503 and answer["error"] == "the bot is still starting: try again in a moment"
    assert delivery(page)["kept"] == []
