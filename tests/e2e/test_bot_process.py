"""`python -m bot` and `python -m workers` as processes: settings, startup, Redis outages."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from slack_sdk import WebClient

import bot.__main__ as bot_main
from runtime.queue import make_queue
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.fakes.socket_mode import APP_TOKEN, SocketModeServer, SocketModeSlack
from tests.stack import ROOT, RedisServer, Stack, free_port, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def fakes() -> Iterator[tuple[FakeSlackAPI, FakeMessagesAPI]]:
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        yield slack, model


def run_module(
    stack: Stack, module: str, *, drop: tuple[str, ...] = (), **extra: str
) -> subprocess.CompletedProcess[str]:
    env = stack.env(**extra)
    for name in drop:
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", module], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("module", "drop", "named"),
    [
        ("bot", ("SLACK_BOT_TOKEN",), "SLACK_BOT_TOKEN"),
        ("bot", ("SLACK_SIGNING_SECRET",), "SLACK_SIGNING_SECRET"),
        ("workers", ("SLACK_BOT_TOKEN",), "SLACK_BOT_TOKEN"),
    ],
)
def test_a_missing_setting_is_one_clear_line_and_exit_2(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI],
    redis_url: str,
    tmp_path: Path,
    module: str,
    drop: tuple[str, ...],
    named: str,
) -> None:
    stack = Stack(redis_url, *fakes, tmp_path)
    done = run_module(stack, module, drop=drop)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and named in lines[0] and "https://api.slack.com/apps" in lines[0]


@pytest.mark.parametrize("module", ["bot", "workers"])
def test_a_bad_config_stops_the_process_at_start(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path, module: str
) -> None:
    stack = Stack(redis_url, *fakes, tmp_path, config="[limits]\nmax_turns = -1\n")
    done = run_module(stack, module)
    assert done.returncode == 2
    assert "limits.max_turns" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_token_is_checked_at_startup_not_in_slacks_3_second_window(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path
) -> None:
    slack, _ = fakes
    stack = Stack(redis_url, *fakes, tmp_path)
    try:
        stack.start_bot()
        assert [c.method for c in slack.calls][:1] == ["auth.test"]
    finally:
        stack.stop()


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"SLACK_BOT_TOKEN": "xoxb-placeholder"}, "invalid_auth"),
        ({"SLACK_API_URL": "http://127.0.0.1:9/api/"}, "cannot reach Slack at http://127.0.0.1:9/api/"),
    ],
)
def test_a_token_slack_refuses_or_a_slack_it_cannot_reach_is_one_line_not_a_traceback(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI],
    redis_url: str,
    tmp_path: Path,
    extra: dict[str, str],
    named: str,
) -> None:
    stack = Stack(redis_url, *fakes, tmp_path)
    done = run_module(stack, "bot", **extra)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in done.stderr


def test_a_token_without_a_scope_the_bot_needs_stops_it_and_one_it_can_miss_is_a_warning(
    redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lacking = tuple(s for s in bot_main.REQUIRED_SCOPES + tuple(bot_main.USEFUL_SCOPES) if s != "chat:write")
    with FakeSlackAPI(bot_token="xoxb-test", scopes=lacking) as slack, FakeMessagesAPI() as model:
        done = run_module(Stack(redis_url, slack, model, tmp_path), "bot")
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "missing_scope: chat:write" in lines[0] and "reinstall" in lines[0]

    without_groups = tuple(
        s for s in bot_main.REQUIRED_SCOPES + tuple(bot_main.USEFUL_SCOPES) if s != "usergroups:read"
    )
    with FakeSlackAPI(bot_token="xoxb-test", scopes=without_groups) as slack:
        client = WebClient(token="xoxb-test", base_url=slack.base_url)
        with caplog.at_level(logging.WARNING, logger="bot.__main__"):
            assert bot_main._check_token(client) is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "bot.__main__"]
    assert len(warnings) == 1 and "usergroups:read" in warnings[0] and "no members" in warnings[0]


def run_ids(client: redis.Redis) -> list[str]:
    """The ids of every run record in Redis (what a mention that started a run leaves behind)."""
    return [key.decode().rsplit(":", 1)[1] for key in client.scan_iter(match="harness:run:*")]


def test_a_redis_outage_answers_slack_with_an_error_and_its_retry_makes_exactly_one_run(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], tmp_path: Path
) -> None:
    slack, model = fakes
    model.script_for("outage", reply(text("outage answered")))
    server = RedisServer(appendonly=True).start()  # what Redis held before the outage survives it
    stack = Stack(server.url, slack, model, tmp_path)
    try:
        stack.start_bot()
        redis.Redis.from_url(server.url).set("test:before-the-outage", "kept")
        server.stop()
        assert wait_until(lambda: stack.healthz() == 503)
        status, ts, event_id = stack.mention("outage: anything")
        assert status == 500  # Slack retries a 5xx delivery

        server.start()
        wait_until(lambda: stack.healthz() == 200)
        client = redis.Redis.from_url(server.url)
        assert client.get("test:before-the-outage") == b"kept"  # so an empty store below is not a wipe
        # The refused delivery left nothing that would run, nor a dedup mark that would swallow the retry.
        assert run_ids(client) == []
        assert list(client.scan_iter(match="harness:event:*")) == []
        assert client.zcard("harness:active") == 0
        queue = make_queue(client)
        assert queue.count == 0 and queue.scheduled_job_registry.count == 0
        stack.start_worker()
        stack.settled()
        assert model.requests == []

        status, _, _ = stack.mention("outage: anything", ts=ts, event_id=event_id)  # Slack's retry
        assert status == 200
        wait_until(lambda: any("outage answered" in m["text"] for m in slack.messages("C1", ts)))
        stack.settled()
        assert len(model.requests) == 1 and len(run_ids(client)) == 1
        assert len([m for m in slack.messages("C1", ts) if "outage answered" in m["text"]]) == 1
    finally:
        stack.stop()
        server.cleanup()


def test_a_mention_while_the_thread_is_parked_waits_and_then_runs(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path
) -> None:
    slack, model = fakes
    stack = Stack(redis_url, slack, model, tmp_path)
    model.script(
        reply(tool_use("write_file", {"path": "a.txt", "content": "a"})),
        reply(text("first done")),
        reply(text("second done")),
    )
    try:
        stack.start_bot()
        stack.start_worker()
        _, root, _ = stack.mention("write a.txt", channel="C7")
        card = wait_until(
            lambda: next((m for m in slack.messages("C7", root) if "approve" in str(m["blocks"])), None)
        )
        stack.mention("and then say hi", channel="C7", thread_ts=root)
        wait_until(
            lambda: any("still on the previous request" in m["text"] for m in slack.messages("C7", root))
        )
        stack.settled()  # the queued mention has done all it will do until the thread is free
        assert len(model.requests) == 1
        stack.click(card, "approve")
        wait_until(lambda: any("second done" in m["text"] for m in slack.messages("C7", root)))
        stack.settled()
        assert len(model.requests) == 3  # the approved run's answer and the queued mention, once each
        last = model.requests[-1]["messages"]
        assert "and then say hi" in str(last[-1]) and "first done" in str(last)
    finally:
        stack.stop()


def test_port_is_taken_from_the_environment(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path
) -> None:
    stack = Stack(redis_url, *fakes, tmp_path, port=free_port())
    try:
        stack.start_bot()
        assert stack.healthz() == 200
    finally:
        stack.stop()


def test_a_taken_port_is_one_line_naming_it_and_who_holds_it(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path
) -> None:
    """Seen: gunicorn retried for 5 s, then a line blamed the web process. Now: which port, which
    process holds it (this test's own), and how to choose another."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        stack = Stack(redis_url, *fakes, tmp_path, port=port)
        done = run_module(stack, "bot", HOST="127.0.0.1")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}: the port is taken by pid {os.getpid()}" in lines[0]
    assert f"PORT={port + 1}" in lines[0]


def test_an_app_token_switches_to_socket_mode_without_a_signing_secret(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path
) -> None:
    _, model = fakes
    endpoint = SocketModeServer()
    with SocketModeSlack(endpoint) as slack:
        stack = Stack(redis_url, slack, model, tmp_path)
        env = stack.env(SLACK_APP_TOKEN=APP_TOKEN)
        del env["SLACK_SIGNING_SECRET"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "bot"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            # The session is the last step of a Socket Mode start: an HTTP server would be up by now.
            wait_until(lambda: endpoint.handshakes or proc.poll() is not None, timeout=30)
            assert proc.poll() is None, "the bot exited instead of holding its Socket Mode session"
            assert slack.links_opened >= 1 and "Upgrade: websocket" in endpoint.handshakes[0]
            assert stack.healthz() == 0  # no HTTP server in Socket Mode
        finally:
            proc.kill()
            proc.wait(10)
            endpoint.close()
