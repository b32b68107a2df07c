"""Servers that misbehave in ordinary ways, against real processes: junk on stdout, a crash at
start, a call past its timeout, and an HTTP server that restarted and forgot its session."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.config import Config, load_config
from harness.tools import ToolContext, mcp
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from harness.tools.sandbox import STDERR_BUDGET_BYTES
from tests.mcp_support import TOKEN, HttpDesk, calls, http_table, moving_table
from tests.stack import wait_until


def config_of(tmp_path: Path, toml: str) -> Config:
    path = tmp_path / "harness.toml"
    path.write_text(toml)
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})


@pytest.fixture
def log(tmp_path: Path) -> Path:
    (tmp_path / "server").mkdir(exist_ok=True)
    return tmp_path / "server" / "calls.jsonl"


def hub_of(tmp_path: Path, log: Path, *flags: str, timeout: float = 10) -> McpHub:
    config = config_of(tmp_path, moving_table(log, *flags, timeout=timeout))
    return McpHub(config.resolved_servers({"DESK_TOKEN": TOKEN}))


def junk_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "stdout, not JSON-RPC" in r.getMessage()]


def test_junk_on_stdout_is_one_escaped_line_each_and_the_session_goes_on(
    tmp_path: Path, log: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Seen: a server's banner on stdout became an ERROR with a traceback ("Failed to parse
    JSONRPC message from server"), outside the escaped, rate-limited path its stderr takes."""
    caplog.set_level(logging.INFO)
    with hub_of(tmp_path, log, "--junk") as hub:
        answer = hub.call("moving", "junk", {"text": "\x1b[2Kforged\rline"}, False)
        assert not answer.is_error and answer.content == "junk written"
        assert wait_until(lambda: len(junk_lines(caplog)) == 2, timeout=20)
        assert not hub.call("moving", "note", {"text": "still here"}, True).is_error
    banner, forged = (r.getMessage() for r in junk_lines(caplog))
    assert banner == (
        "MCP server moving stdout, not JSON-RPC: Starting moving server v1.0 \\x1b[31m(not JSON-RPC)\\x1b[0m"
    )
    assert forged == "MCP server moving stdout, not JSON-RPC: \\x1b[2Kforged\\rline"
    assert all(r.levelno == logging.WARNING and r.name == "harness.mcp.stderr" for r in junk_lines(caplog))
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_junk_on_stdout_shares_the_stderr_budget_and_says_what_it_dropped(
    tmp_path: Path, log: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    line = "j" * 99
    count = 2 * STDERR_BUDGET_BYTES // len(line)
    with hub_of(tmp_path, log) as hub:
        # Written before the answer, on the same pipe: every line is read by the time it comes.
        assert not hub.call("moving", "junk", {"text": line, "count": count}, False).is_error
    # Closing ends the server's log, which then says what it dropped.
    logged = junk_lines(caplog)
    assert 0 < len(logged) * len(line) <= STDERR_BUDGET_BYTES
    dropped = [r.getMessage() for r in caplog.records if "stderr dropped" in r.getMessage()]
    assert len(dropped) == 1 and dropped[0].startswith("MCP server moving stderr dropped: ")


def test_a_server_that_exits_at_start_says_why_in_its_log_line_and_its_health(
    tmp_path: Path, log: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Seen: a PyPI server written for `mcp` 1.x, in a venv where pip picked 2.x, crashed on its
    import, and all the log and `workers status` said was "Connection closed"."""
    caplog.set_level(logging.INFO, logger="harness.mcp")
    with hub_of(tmp_path, log, "--crash-at-start") as hub:
        (health,) = hub.health()
        assert not health.up
        why = "ModuleNotFoundError: No module named 'mcp.server.fastmcp'"
        assert "its stderr ended: " in health.reason and why in health.reason
        assert "\\x1b[31m" in health.reason and "\x1b" not in health.reason  # escaped, as data
        assert len(health.reason) < 1200

        def said() -> list[str]:
            records = caplog.records
            return [
                r.getMessage() for r in records if r.levelno == logging.WARNING and r.name == "harness.mcp"
            ]

        assert wait_until(lambda: any("moving" in line and why in line for line in said()), timeout=20)


@pytest.mark.parametrize("flags", [(), ("--legacy",)], ids=["2026-07-28", "2025"])
def test_a_side_effect_call_past_its_timeout_says_its_server_was_asked_to_cancel_it(
    tmp_path: Path, log: Path, flags: tuple[str, ...]
) -> None:
    """It used to say the call "was left running"; the SDK sends `notifications/cancelled` as it
    gives the call up, and the server (which writes down a cancellation) does stop."""
    with hub_of(tmp_path, log, *flags, timeout=1) as hub:
        answer = hub.call("moving", "hang", {"seconds": 60}, True)
        assert answer.is_error
        assert "Outcome unknown" in answer.text and "the MCP server was asked to cancel it" in answer.text
        assert "left running" not in answer.text
        assert wait_until(lambda: any(c.get("cancelled") for c in calls(log)), timeout=20)


@pytest.fixture
def session_desk(log: Path) -> Iterator[HttpDesk]:
    desk = HttpDesk(log, sessions=True).start()
    yield desk
    desk.stop()


def test_the_refused_delete_of_a_session_a_restarted_server_forgot_is_not_a_warning(
    tmp_path: Path,
    session_desk: HttpDesk,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After every restart of an HTTP server, the SDK logged "Session termination failed: 404"
    at WARNING: the DELETE of the old session, which the new server never knew. Expected: DEBUG.

    The SDK does not always wait for that DELETE's answer (its teardown may cancel it, and then it
    logs nothing): the server is restarted until one answer was logged."""
    monkeypatch.setattr(mcp, "_STEADY_SECONDS", 600.0)  # however soon the session is forgotten
    caplog.set_level(logging.DEBUG, logger="mcp.client.streamable_http")
    config = config_of(tmp_path, http_table("desk", session_desk.url) + "timeout_seconds = 20\n")

    def refused() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("Session termination failed: 40")]

    with McpHub(config.resolved_servers({"DESK_TOKEN": TOKEN})) as hub:
        catalog = Catalog.from_config(config, host=hub)
        context = ToolContext(workspace=tmp_path)
        assert not catalog.registry().run("desk__get_ticket", {"id": "T-1"}, context).is_error

        def restarted_and_refused() -> bool:
            session_desk.kill()
            session_desk.start()  # the same port, a server that never heard of the session
            # The call waits for the new session, opened after the old one was closed (its DELETE).
            assert not catalog.registry().run("desk__get_ticket", {"id": "T-2"}, context).is_error
            return bool(refused())

        assert wait_until(restarted_and_refused, timeout=120, interval=0)
    assert {r.levelno for r in refused()} == {logging.DEBUG}  # and no other (the SDK's own records
    # about the restart, a GET stream that reconnects, are not this fix's to judge)
