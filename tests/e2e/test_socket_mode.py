"""`python -m bot` in Socket Mode acks every envelope within 3 s, whatever it holds.

Slack redelivers an envelope that is not acked. A real bot process connects to a loopback
Socket Mode endpoint (tests/fakes/socket_mode.py) through `apps.connections.open` on
SLACK_API_URL, and is sent every realistic request (events it has no listener for, shortcuts,
slash commands, view_closed, block_suggestion...), corrupted ones, malformed envelopes, and a
mention while Redis hangs.
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from store import Store
from tests.e2e.test_faults import count
from tests.fakes import payloads
from tests.fakes.messages_api import FakeMessagesAPI
from tests.fakes.socket_mode import APP_TOKEN, SocketModeServer, SocketModeSlack
from tests.stack import Process, RedisServer, Stack, wait_until

pytestmark = pytest.mark.e2e

SLACK_WAITS = 3.0  # seconds Slack waits for an ack before it delivers the envelope again
SOCKET_DELIVERIES = [d for d in payloads.deliveries() if not d.http_only]


class SocketBot:
    """A `python -m bot` process in Socket Mode, and Slack's end of its connection."""

    def __init__(self, redis_url: str, workdir: Path) -> None:
        self.server = SocketModeServer()
        self.slack = SocketModeSlack(self.server).start()
        self.model = FakeMessagesAPI().start()
        self.stack = Stack(redis_url, self.slack, self.model, workdir)
        self.redis = redis.Redis.from_url(redis_url)
        self.bot: Process | None = None

    def start(self) -> SocketBot:
        self.bot = self.stack.spawn("bot", "-m", "bot", SLACK_APP_TOKEN=APP_TOKEN, SLACK_SIGNING_SECRET="")
        wait_until(lambda: self.server.handshakes or self.bot_exited(), timeout=30)
        assert not self.bot_exited(), self.bot.output()
        self.server.wait_connected()
        return self

    def bot_exited(self) -> bool:
        return self.bot is not None and self.bot.proc.poll() is not None

    def stop(self) -> None:
        self.stack.stop()
        self.server.close()
        self.slack.stop()
        self.model.stop()

    def deliver(self, envelopes: list[tuple[str, Any, dict[str, Any]]], window: int = 25) -> dict[str, float]:
        """Send envelopes, `window` at a time; return each one's seconds from sending to its first ack."""
        waited: dict[str, float] = {}
        for start in range(0, len(envelopes), window):
            batch = [
                self.server.send(kind, payload, **fields)
                for kind, payload, fields in envelopes[start : start + window]
            ]
            acks = self.server.wait_acked(batch, timeout=SLACK_WAITS + 5)
            waited.update({i: acks[i].at - self.server.sent[i] if i in acks else float("inf") for i in batch})
        return waited


def late(waited: dict[str, float], names: dict[str, str]) -> list[str]:
    return [
        f"{names[i]}: {'never acked' if s == float('inf') else f'acked after {s:.2f} s'}"
        for i, s in waited.items()
        if s > SLACK_WAITS
    ]


@pytest.fixture(scope="module")
def bot(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SocketBot]:
    url = redis_server.url.rsplit("/", 1)[0] + "/5"
    redis.Redis.from_url(url).flushdb()
    bot = SocketBot(url, tmp_path_factory.mktemp("socket")).start()
    try:
        yield bot
    finally:
        bot.stop()


def test_every_kind_of_request_slack_sends_is_acked_within_3_seconds(bot: SocketBot) -> None:
    envelopes = [
        (
            d.kind,
            d.payload,
            {"envelope_id": f"env-{n}", "retry_attempt": d.retry[0], "retry_reason": d.retry[1]}
            if d.retry
            else {"envelope_id": f"env-{n}"},
        )
        for n, d in enumerate(SOCKET_DELIVERIES)
    ]
    names = {f"env-{n}": d.name for n, d in enumerate(SOCKET_DELIVERIES)}
    waited = bot.deliver(envelopes)
    count("Socket Mode envelopes acked", len(waited))
    assert late(waited, names) == []
    assert all(len(bot.server.acked(i)) == 1 for i in waited)  # once each
    # Bolt's answer travels in the ack: only url_verification has one here (its challenge).
    answered = {names[i]: bot.server.acked(i)[0].payload for i in waited if bot.server.acked(i)[0].payload}
    challenge = next(d.payload["challenge"] for d in SOCKET_DELIVERIES if d.name == "url_verification")
    assert answered == {"url_verification": {"challenge": challenge}}


def test_corrupted_payloads_are_acked_within_3_seconds(bot: SocketBot) -> None:
    envelopes, names = [], {}
    n = itertools.count()
    for offset, delivery in enumerate(SOCKET_DELIVERIES):
        corruptions = payloads.corruptions(delivery.payload)
        for path, what in corruptions[offset % 12 :: 12]:  # a twelfth of each payload's corruptions
            mutant = payloads.corrupt(delivery.payload, path, what)
            envelope_id = f"bad-{next(n)}"
            names[envelope_id] = f"{delivery.name}: {mutant.how}"
            envelopes.append((delivery.kind, mutant.payload, {"envelope_id": envelope_id}))
    waited = bot.deliver(envelopes)
    count("Socket Mode envelopes acked", len(waited))
    assert len(waited) > 1000
    assert late(waited, names) == []


def test_malformed_envelopes_are_acked_within_3_seconds(bot: SocketBot) -> None:
    mention = payloads.event_callback(payloads.app_mention("hi"), event_id="EvEnvelope")
    odd: dict[str, dict[str, Any]] = {
        "payload is a string": {"type": "events_api", "payload": "hello"},
        "payload is null": {"type": "events_api", "payload": None},
        "payload is a list": {"type": "interactive", "payload": [mention]},
        "no payload": {"type": "events_api"},
        "no type": {"payload": mention},
        "unknown type": {"type": "workflow_whatever", "payload": mention},
        "retry_attempt is an object": {"type": "events_api", "payload": mention, "retry_attempt": {"n": 1}},
    }
    sent = {bot.server.send_raw({"envelope_id": f"odd-{name}", **env}): name for name, env in odd.items()}
    acks = bot.server.wait_acked(list(sent), timeout=SLACK_WAITS + 5)
    waited = {i: acks[i].at - bot.server.sent[i] if i in acks else float("inf") for i in sent}
    assert late(waited, sent) == []


def test_a_mention_over_socket_mode_starts_a_run_and_gets_its_eyes(bot: SocketBot) -> None:
    ts = bot.slack.add_message("CSOCK", "<@UBOT> over the socket", user="USOCK")
    mention = payloads.app_mention("over the socket", user="USOCK", channel="CSOCK", ts=ts)
    envelope_id = bot.server.send("events_api", payloads.event_callback(mention, event_id="EvSocketRun"))
    ack = bot.server.wait_acked([envelope_id])[envelope_id]
    assert ack.at - bot.server.sent[envelope_id] <= SLACK_WAITS
    tasks = [
        Store(bot.redis).runs.load(k.decode().rsplit(":", 1)[1]) for k in bot.redis.scan_iter("harness:run:*")
    ]
    assert any(r is not None and r.task == "<@UBOT> over the socket" for r in tasks)
    assert bot.slack.wait_for(lambda s: ("CSOCK", ts, "eyes") in [r[:3] for r in s.reactions])


def test_an_envelope_is_acked_in_time_even_while_its_listener_waits_for_redis(
    tmp_path: Path,
) -> None:
    server = RedisServer().start()
    bot = SocketBot(server.url, tmp_path).start()
    assert server.proc is not None
    try:
        mention = payloads.app_mention("while redis hangs", user="UHANG", channel="CHANG")
        os.kill(server.proc.pid, signal.SIGSTOP)  # Redis hangs: the listener blocks on its reply
        try:
            envelope_id = bot.server.send("events_api", payloads.event_callback(mention, event_id="EvHang"))
            ack = bot.server.wait_acked([envelope_id], timeout=SLACK_WAITS + 5).get(envelope_id)
            assert ack is not None and ack.at - bot.server.sent[envelope_id] <= SLACK_WAITS
            assert ack.payload is None
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        # The listener finishes once Redis answers: the run exists, and the envelope was acked once.
        wait_until(lambda: any(bot.redis.scan_iter("harness:run:*")), timeout=20)
        wait_until(lambda: "answered after its ack" in bot.bot.output() if bot.bot else False, timeout=10)
        assert len(bot.server.acked(envelope_id)) == 1
    finally:
        bot.stop()
        server.cleanup()


def test_a_refused_app_token_is_one_clear_line_and_exit_2(redis_url: str, tmp_path: Path) -> None:
    bot = SocketBot(redis_url, tmp_path)
    try:
        process = bot.stack.spawn("bot", "-m", "bot", SLACK_APP_TOKEN="xapp-revoked")
        assert process.proc.wait(60) == 2
        errors = [line for line in process.output().splitlines() if line.startswith("error:")]
        assert errors == ["error: Slack refused SLACK_APP_TOKEN (invalid_auth)"]
    finally:
        bot.stop()
