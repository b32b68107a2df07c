"""MCP sessions as the spec has them: a lost session is opened again, a closed one is deleted, and
a tool the harness cannot call as listed is never offered.

Against the test server (`tests/fakes/mcp_server.py`) in its `http-sessions` mode, which speaks
the 2025 protocol with session ids and answers 404 for an id it does not know.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.config import Config, load_config
from harness.tools import ToolContext, mcp
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from tests.mcp_support import TOKEN, HttpDesk, calls, http_table, stdio_table
from tests.stack import wait_until


def config_of(tmp_path: Path, toml: str) -> Config:
    path = tmp_path / "harness.toml"
    path.write_text(toml)
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})


def run(catalog: Catalog, name: str, args: dict[str, Any], tmp_path: Path) -> Any:
    return catalog.registry().run(name, args, ToolContext(workspace=tmp_path))


@pytest.fixture
def log(tmp_path: Path) -> Path:
    """Where the server logs its calls: a directory of its own, which its walls let it write."""
    (tmp_path / "server").mkdir(exist_ok=True)
    return tmp_path / "server" / "calls.jsonl"


@pytest.fixture
def session_desk(log: Path) -> Iterator[HttpDesk]:
    desk = HttpDesk(log, sessions=True).start()
    yield desk
    desk.stop()


@pytest.fixture
def hub_of(tmp_path: Path, session_desk: HttpDesk) -> Iterator[tuple[Catalog, McpHub]]:
    config = config_of(tmp_path, http_table("desk", session_desk.url) + "timeout_seconds = 20\n")
    with McpHub(config.resolved_servers({"DESK_TOKEN": TOKEN})) as hub:
        yield Catalog.from_config(config, host=hub), hub


def deletes(desk: HttpDesk) -> list[str | None]:
    if not desk.http_log.exists():
        return []
    return [json.loads(line)["delete"] for line in desk.http_log.read_text().splitlines()]


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """However soon a session is forgotten after it opened: a session's age must not decide (CI
    once restarted the server within 2 s of the session's start, and the call was answered
    "not reachable")."""
    monkeypatch.setattr(mcp, "_STEADY_SECONDS", 600.0)


@pytest.mark.parametrize("called_before", [True, False], ids=["after-a-call", "before-any-call"])
def test_an_http_server_restarted_while_idle_is_reconnected_and_the_next_call_runs_once(
    quick: None,
    hub_of: tuple[Catalog, McpHub],
    session_desk: HttpDesk,
    tmp_path: Path,
    log: Path,
    called_before: bool,
) -> None:
    """Seen: the restarted server answers the old session id with 404 (or 400), the SDK raises
    -32603 or -32600, and 100 calls over 45 s all failed. Nothing ran on the old id, so the
    call is sent again, once, on a new session."""
    catalog, hub = hub_of
    if called_before:
        assert not run(catalog, "desk__get_ticket", {"id": "T-1"}, tmp_path).is_error
    session_desk.kill()
    session_desk.start()  # the same port, a server that never heard of the session
    again = run(catalog, "desk__comment", {"id": "T-2", "text": "after the restart"}, tmp_path)
    assert not again.is_error, again.content
    assert again.content == "commented on T-2"
    ran = ["get_ticket", "comment"] if called_before else ["comment"]
    assert [c["tool"] for c in calls(log)] == ran  # a side effect, run once
    assert not hub.listing().away


def test_a_call_made_while_a_forgotten_session_is_replaced_waits_for_the_new_one(
    quick: None,
    tmp_path: Path,
    log: Path,
    session_desk: HttpDesk,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen in CI: the server restarted, the hub noticed on its own (the SDK's listening stream
    reconnected and got 404) and was opening a new session when the call came; the call was
    answered "not reachable", the server listed as away. While a new session opens, a call waits.

    The restarted server holds the new session's `initialize` until the call is seen waiting."""
    config = config_of(tmp_path, http_table("desk", session_desk.url) + "timeout_seconds = 20\n")
    hold = tmp_path / "hold"
    with (
        caplog.at_level(logging.INFO, logger="harness.mcp"),
        McpHub(config.resolved_servers({"DESK_TOKEN": TOKEN})) as hub,
    ):
        catalog = Catalog.from_config(config, host=hub)
        session_desk.kill()
        hold.touch()
        session_desk.hold = hold
        session_desk.start()
        monkeypatch.setattr(mcp, "_PING_SECONDS", 0.1)  # the hub notices the restart without a call
        wait_until(hold.with_suffix(".held").exists)  # the new session is being opened
        assert not hub.listing().away  # not away: its session is being replaced
        answer: list[Any] = []
        caller = threading.Thread(
            target=lambda: answer.append(
                run(catalog, "desk__comment", {"id": "T-4", "text": "while reopening"}, tmp_path)
            )
        )
        caller.start()
        messages = lambda: [r.getMessage() for r in caplog.records]  # noqa: E731
        wait_until(lambda: answer or any("a call waits for the new session" in m for m in messages()))
        hold.unlink()
        caller.join(30)
    assert answer and not answer[0].is_error, answer
    assert [c["tool"] for c in calls(log)] == ["comment"]


def test_a_server_that_forgets_every_session_is_backed_off_from_and_nothing_runs(
    quick: None, tmp_path: Path, log: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A new session opened for a forgotten one, and forgotten too before it answered a call, is not
    replaced at once again: the hub backs off as from a server that is down (no loop of sessions)."""
    desk = HttpDesk(log, sessions=True, forgetful=True).start()
    try:
        config = config_of(tmp_path, http_table("desk", desk.url) + "timeout_seconds = 20\n")
        with (
            caplog.at_level(logging.INFO, logger="harness.mcp"),
            McpHub(config.resolved_servers({"DESK_TOKEN": TOKEN})) as hub,
        ):
            catalog = Catalog.from_config(config, host=hub)
            result = run(catalog, "desk__comment", {"id": "T-9", "text": "never"}, tmp_path)
            assert result.is_error
            messages = lambda: [r.getMessage() for r in caplog.records]  # noqa: E731
            wait_until(lambda: any("trying again in" in m for m in messages()))
            opened = [m for m in messages() if "is up" in m]
            assert len(opened) == 2, opened  # the first session, and one new one: then the backoff
            assert sum("opening a new session" in m for m in messages()) == 1
        assert calls(log) == []  # refused before it ran, every time
    finally:
        desk.stop()


def test_a_session_the_server_forgot_while_idle_is_noticed_without_a_call(
    tmp_path: Path, session_desk: HttpDesk, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub pings a resting HTTP session: unanswered while the server is down, refused (404 for
    the forgotten session) once it is back. Either way a new session is opened before any call."""
    monkeypatch.setattr(mcp, "_PING_SECONDS", 0.5)
    config = config_of(tmp_path, http_table("desk", session_desk.url))
    with (
        caplog.at_level(logging.INFO, logger="harness.mcp"),
        McpHub(config.resolved_servers({"DESK_TOKEN": TOKEN})) as hub,
    ):
        catalog = Catalog.from_config(config, host=hub)
        session_desk.kill()
        session_desk.start()
        wait_until(lambda: sum("is up" in r.getMessage() for r in caplog.records) >= 2, timeout=20)
        assert run(catalog, "desk__get_ticket", {"id": "T-3"}, tmp_path).content.startswith("T-3")


def test_closing_the_hub_sends_the_session_delete(tmp_path: Path, session_desk: HttpDesk) -> None:
    config = config_of(tmp_path, http_table("desk", session_desk.url))
    with McpHub(config.resolved_servers({"DESK_TOKEN": TOKEN})) as hub:
        assert not hub.listing().away
        assert deletes(session_desk) == []
    sent = deletes(session_desk)
    assert len(sent) == 1 and sent[0]  # one DELETE, carrying the session's id


def test_after_a_reconnect_close_deletes_the_new_session(tmp_path: Path, session_desk: HttpDesk) -> None:
    config = config_of(tmp_path, http_table("desk", session_desk.url) + "timeout_seconds = 20\n")
    with McpHub(config.resolved_servers({"DESK_TOKEN": TOKEN})) as hub:
        catalog = Catalog.from_config(config, host=hub)
        session_desk.kill()
        session_desk.start()
        assert not run(catalog, "desk__get_ticket", {"id": "T-1"}, tmp_path).is_error
        before = deletes(session_desk)  # the old session's, when the server was back to hear it
    after = deletes(session_desk)
    assert len(after) == len(before) + 1 and after[-1] and after[-1] not in before


def test_a_tool_that_must_run_as_a_task_is_offered_and_a_server_that_answers_at_once_is_heard(
    tmp_path: Path, log: Path, caplog: pytest.LogCaptureFixture, session_desk: HttpDesk
) -> None:
    """`execution.taskSupport: "required"` (the 2025 protocol's): offered, and called as a task
    (`harness.tools.mcp_tasks`). This server ignores the call's `task` and answers at once: its
    plain result is the call's. (Once left out: the harness did not run tasks.)"""
    config = config_of(tmp_path, http_table("desk", session_desk.url))
    with (
        caplog.at_level(logging.WARNING, logger="harness.mcp"),
        McpHub(config.resolved_servers({"DESK_TOKEN": TOKEN})) as hub,
    ):
        research = next(t for t in hub.listing().tools if t.name == "research")
        catalog = Catalog.from_config(config, host=hub)
        answer = run(catalog, "desk__research", {"topic": "printers"}, tmp_path)
    assert research.task_only
    assert not answer.is_error and answer.task is None and answer.content == "researched printers"
    assert [c["arguments"] for c in calls(log) if c["tool"] == "research"] == [{"topic": "printers"}]
    assert not [r for r in caplog.records if "research" in r.getMessage()]


def test_a_tool_whose_input_schema_is_invalid_is_not_offered_and_one_line_says_why(
    tmp_path: Path, log: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = config_of(tmp_path, stdio_table("desk", log))
    with caplog.at_level(logging.WARNING, logger="harness.mcp"), McpHub(config.resolved_servers({})) as hub:
        names = [t.name for t in hub.listing().tools]
        catalog = Catalog.from_config(config, host=hub)
        answer = run(catalog, "desk__bad_schema", {"n": 1}, tmp_path)
        assert not run(catalog, "desk__get_ticket", {"id": "T-1"}, tmp_path).is_error  # the rest works
    assert "get_ticket" in names and "bad_schema" not in names
    assert answer.is_error and "bad_schema" not in [c["tool"] for c in calls(log)]
    lines = [r.getMessage() for r in caplog.records if "bad_schema" in r.getMessage()]
    assert len(lines) == 1 and "inputSchema" in lines[0] and "a-number-please" in lines[0]
