"""`python -m bot` and `python -m workers` as processes: settings, startup, Redis outages."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
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


def test_a_redis_outage_answers_slack_with_an_error_and_healthz_says_so(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], tmp_path: Path
) -> None:
    server = RedisServer().start()
    stack = Stack(server.url, *fakes, tmp_path)
    try:
        stack.start_bot()
        server.stop()
        assert wait_until(lambda: stack.healthz() == 503)
        status, _, _ = stack.mention("outage: anything")
        assert status == 500  # Slack retries a 5xx delivery
        assert fakes[1].requests == []
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
        assert len(model.requests) == 1
        stack.click(card, "approve")
        wait_until(lambda: any("second done" in m["text"] for m in slack.messages("C7", root)))
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


def test_an_app_token_switches_to_socket_mode_without_a_signing_secret(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path
) -> None:
    slack, _ = fakes
    stack = Stack(redis_url, *fakes, tmp_path)
    env = stack.env(SLACK_APP_TOKEN="xapp-test")
    del env["SLACK_SIGNING_SECRET"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(
            lambda: any(c.method == "apps.connections.open" for c in slack.calls) or proc.poll() is not None
        )
        assert any(c.method == "apps.connections.open" for c in slack.calls)
        assert stack.healthz() == 0  # no HTTP server in Socket Mode
    finally:
        proc.kill()
        proc.wait(10)
