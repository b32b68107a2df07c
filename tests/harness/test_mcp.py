"""MCP servers as tools: a real server (the `mcp` package's own server API) over stdio and HTTP.

The hub keeps one warm session per server; these tests drive it, the catalog and the policy
against real server processes, and crash, kill and restart those processes for real.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.config import Config, load_config
from harness.policy import Tier
from harness.tools import ToolContext, mcp
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from harness.tools.mcp_listing import Listing
from harness.tools.relay import RelayClient, RelayServer
from tests.mcp_support import TOKEN, HttpDesk, calls, http_table, server_pids, stdio_table
from tests.stack import ROOT, wait_until


def config_of(tmp_path: Path, toml: str) -> Config:
    path = tmp_path / "harness.toml"
    path.write_text(toml)
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})


@pytest.fixture
def log(tmp_path: Path) -> Path:
    """Where the server logs its calls: a directory of its own, which its walls let it write."""
    (tmp_path / "server").mkdir(exist_ok=True)
    return tmp_path / "server" / "calls.jsonl"


@pytest.fixture
def http_desk(log: Path) -> Iterator[HttpDesk]:
    desk = HttpDesk(log).start()
    yield desk
    desk.stop()


@pytest.fixture(params=["stdio", "http"])
def desk(request: pytest.FixtureRequest, tmp_path: Path, log: Path) -> Iterator[tuple[Catalog, McpHub]]:
    """The desk server over one transport, its hub started, and the catalog that offers it."""
    if request.param == "stdio":
        toml = stdio_table("desk", log)
    else:
        http: HttpDesk = request.getfixturevalue("http_desk")
        toml = http_table("desk", http.url)
    toml += "trust_annotations = true\n"  # its readOnlyHint may set tiers (test_mcp_hostile: untrusted)
    config = config_of(tmp_path, toml + 'timeout_seconds = 3\n[policy]\ndefault = "ask"\n')
    with McpHub(config.resolved_servers({"DESK_TOKEN": TOKEN})) as hub:
        yield Catalog.from_config(config, host=hub), hub


def run(catalog: Catalog, name: str, args: dict[str, Any], tmp_path: Path) -> Any:
    return catalog.registry().run(name, args, ToolContext(workspace=tmp_path))


def test_tools_are_offered_as_server__tool_with_the_servers_own_schema(desk: Any) -> None:
    catalog, _ = desk
    registry = catalog.registry()
    assert "desk__get_ticket" in registry and "desk__close_ticket" in registry
    schema = next(s for s in registry.schemas() if s["name"] == "desk__get_ticket")
    assert schema["input_schema"]["properties"]["id"]["description"] == "Ticket id, like T-1"
    assert schema["input_schema"]["required"] == ["id"]
    assert schema["description"] == "Read one ticket."
    close = registry.get("desk__close_ticket")
    assert close is not None and close.title == "Close a ticket"
    assert close.annotations["destructiveHint"] is True


def test_a_tool_name_the_api_would_refuse_is_left_out_with_one_log_line(
    tmp_path: Path, log: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = config_of(tmp_path, stdio_table("desk", log))
    with caplog.at_level(logging.WARNING, logger="harness.mcp"), McpHub(config.resolved_servers({})) as hub:
        names = [t.qualified for t in hub.listing().tools]
        assert "desk__get_ticket" in names and not any("export" in n for n in names)
    refused = [r.getMessage() for r in caplog.records if "tickets.export" in r.getMessage()]
    assert len(refused) == 1 and "tool-name rule" in refused[0]


def test_tiers_come_from_annotations_and_only_an_honest_read_only_hint_allows(desk: Any) -> None:
    catalog, _ = desk
    config_policy = load_config(env={}).policy  # default ask, nothing listed
    registry = catalog.registry()

    def tier(name: str) -> Tier:
        found = registry.get(name)
        assert found is not None
        return config_policy.decide(name, {}, found.own_tier, found.own_tier_why).tier

    assert tier("desk__get_ticket") is Tier.ALLOW  # readOnlyHint, on a server whose annotations are trusted
    assert tier("desk__close_ticket") is Tier.ASK  # destructive
    assert tier("desk__comment") is Tier.ASK  # no annotations at all
    assert tier("desk__odd_hints") is Tier.ASK  # read-only AND destructive: not trusted as read-only
    assert registry.get("desk__comment").side_effects is True  # type: ignore[union-attr]
    assert registry.get("desk__get_ticket").side_effects is False  # type: ignore[union-attr]


def test_text_images_structured_content_and_errors_come_back_as_the_api_wants(
    desk: Any, tmp_path: Path, log: Path
) -> None:
    catalog, _ = desk
    got = run(catalog, "desk__get_ticket", {"id": "T-1"}, tmp_path)
    assert (got.content, got.is_error) == ("T-1: printer on fire (open)", False)

    picture = run(catalog, "desk__picture", {}, tmp_path)
    assert picture.content[0] == {"type": "text", "text": "a pixel"}
    assert picture.content[1]["type"] == "image"
    assert picture.content[1]["source"]["media_type"] == "image/png"

    stats = run(catalog, "desk__stats", {}, tmp_path)
    assert stats.content == '{"open": 3, "closed": 9}' and not stats.is_error

    boom = run(catalog, "desk__explode", {}, tmp_path)
    assert boom.is_error is True

    flood = run(catalog, "desk__flood", {"chars": 50_000}, tmp_path)
    assert len(flood.content) < 21_000 and "cut" in flood.content
    assert [c["tool"] for c in calls(log)] == ["get_ticket", "picture", "stats", "explode", "flood"]


def test_a_slow_call_times_out_and_the_session_stays_usable(desk: Any, tmp_path: Path) -> None:
    catalog, _ = desk
    slow = run(catalog, "desk__slow", {"seconds": 30}, tmp_path)
    assert slow.is_error and "did not finish within 3 seconds" in slow.content
    assert run(catalog, "desk__get_ticket", {"id": "T-2"}, tmp_path).content.startswith("T-2")


def test_a_server_that_dies_mid_call_answers_outcome_unknown_and_comes_back(
    desk: Any, tmp_path: Path, log: Path, request: pytest.FixtureRequest
) -> None:
    catalog, hub = desk
    result = run(catalog, "desk__crash", {}, tmp_path)
    crashed = calls(log)[-1]["pid"]
    assert result.is_error and "Outcome unknown" in result.content and "NOT run again" in result.content
    if request.node.callspec.params["desk"] == "http":
        request.getfixturevalue("http_desk").start()  # an HTTP server is someone else's to restart
    # stdio: the hub starts a new process itself

    def answered() -> Any:
        again = run(catalog, "desk__get_ticket", {"id": "T-3"}, tmp_path)
        return not again.is_error and again

    assert wait_until(answered, timeout=40, interval=0.1).content.startswith("T-3")
    assert [c["tool"] for c in calls(log)].count("crash") == 1  # never re-sent
    assert calls(log)[-1]["pid"] != crashed


def test_a_stdio_server_killed_while_idle_is_noticed_and_restarted(tmp_path: Path, log: Path) -> None:
    config = config_of(tmp_path, stdio_table("desk", log))
    with McpHub(config.resolved_servers({})) as hub:
        catalog = Catalog.from_config(config, host=hub)
        assert not run(catalog, "desk__get_ticket", {"id": "T-1"}, tmp_path).is_error
        first = calls(log)[-1]["pid"]
        (server,) = server_pids()
        os.kill(server, signal.SIGKILL)
        wait_until(lambda: "desk" in hub.listing().away, timeout=30)  # noticed at rest, not by a call
        wait_until(lambda: not hub.listing().away, timeout=20)
        assert run(catalog, "desk__get_ticket", {"id": "T-4"}, tmp_path).content.startswith("T-4")
        assert calls(log)[-1]["pid"] != first


def test_a_server_that_never_starts_does_not_stop_anything_and_its_calls_name_it(
    tmp_path: Path, log: Path, caplog: pytest.LogCaptureFixture
) -> None:
    toml = stdio_table("desk", log) + '[[mcp.servers]]\nname = "gone"\ncommand = "/nonexistent/mcp-server"\n'
    config = config_of(tmp_path, toml)
    with caplog.at_level(logging.DEBUG, logger="harness.mcp"), McpHub(config.resolved_servers({})) as hub:
        catalog = Catalog.from_config(config, host=hub)
        assert "gone" in hub.listing().away and "desk" not in hub.listing().away
        answer = run(catalog, "gone__anything", {}, tmp_path)
        assert answer.is_error and "'gone'" in answer.content and "not reachable" in answer.content
        assert "its command '/nonexistent/mcp-server' does not exist" in answer.content
        assert not run(catalog, "desk__get_ticket", {"id": "T-1"}, tmp_path).is_error
        wait_until(lambda: len(about(caplog, "gone")) >= 3, timeout=30)  # retried
        health = {h.name: h for h in hub.health()}
        assert health["desk"].up and health["desk"].reason == "" and health["desk"].failures == 0
        assert not health["gone"].up and health["gone"].failures >= 2
        assert health["gone"].reason.startswith("its command '/nonexistent/mcp-server' does not exist")
    warned = [r for r in about(caplog, "gone") if r.levelno >= logging.WARNING]
    assert len(warned) == 1  # once, at start; the tries after it at DEBUG
    said = warned[0].getMessage()
    assert said.startswith("MCP server gone (stdio: /nonexistent/mcp-server) cannot start: its command ")
    assert "'/nonexistent/mcp-server' does not exist (/nonexistent/mcp-server): install it there" in said
    assert "; trying again in " in said and "said again only if the reason changes" in said
    later = about(caplog, "gone")[1:]
    assert all(r.levelno == logging.DEBUG and "still cannot start" in r.getMessage() for r in later)


def about(caplog: pytest.LogCaptureFixture, server: str) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "harness.mcp" and f"MCP server {server} " in r.getMessage()
    ]


def test_a_command_installed_later_brings_its_server_up_and_that_is_said_once(
    tmp_path: Path, log: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mcp, "_BACKOFF_FIRST", 0.05)  # tries come quickly
    monkeypatch.setattr(mcp, "_BACKOFF_MAX", 0.2)
    tools = tmp_path / "tools"
    tools.mkdir()
    toml = stdio_table("desk", log).replace(f"command = {json.dumps(sys.executable)}", 'command = "desk-mcp"')
    toml = toml.replace("env = { ", f'env = {{ PATH = "{tools}:/usr/bin:/bin", ')
    config = config_of(tmp_path, toml)
    with caplog.at_level(logging.DEBUG, logger="harness.mcp"), McpHub(config.resolved_servers({})) as hub:
        (down,) = hub.health()
        assert not down.up and "its command 'desk-mcp' is not on the PATH it is given" in down.reason
        wait_until(lambda: len(about(caplog, "desk")) >= 4, timeout=30)
        installed = tools / "desk-mcp"
        # A Python script (its interpreter is the venv's: the walls keep it in view wherever it is,
        # /tmp included) that runs the server file its arguments name.
        installed.write_text(
            f"#!{sys.executable}\nimport runpy, sys\nsys.argv = sys.argv[1:]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n"
        )
        installed.chmod(0o755)
        wait_until(lambda: not hub.listing().away, timeout=30)
        (up,) = hub.health()
        assert up.up and up.reason == "" and up.failures == 0 and up.since >= down.since
    said = [(r.levelname, r.getMessage()) for r in about(caplog, "desk")]
    assert [level for level, _ in said if level != "DEBUG"] == ["WARNING", "INFO"]
    back = next(message for level, message in said if level == "INFO")
    assert (
        back.startswith("MCP server desk (stdio: desk-mcp) is up again after ") and "failed tries): " in back
    )


def test_an_http_server_restarted_on_its_port_is_reconnected(
    tmp_path: Path, log: Path, http_desk: HttpDesk
) -> None:
    config = config_of(tmp_path, http_table("desk", http_desk.url))
    with McpHub(config.resolved_servers({"DESK_TOKEN": TOKEN})) as hub:
        catalog = Catalog.from_config(config, host=hub)
        assert not run(catalog, "desk__get_ticket", {"id": "T-1"}, tmp_path).is_error
        http_desk.kill()
        down = run(catalog, "desk__get_ticket", {"id": "T-2"}, tmp_path)
        assert down.is_error
        http_desk.start()

        def back() -> bool:
            return not run(catalog, "desk__get_ticket", {"id": "T-3"}, tmp_path).is_error

        wait_until(back, timeout=40, interval=0.2)


def test_http_header_secrets_reach_the_server_but_never_a_log_line(
    tmp_path: Path, log: Path, http_desk: HttpDesk, caplog: pytest.LogCaptureFixture
) -> None:
    good = config_of(tmp_path, http_table("desk", http_desk.url))
    with caplog.at_level(logging.DEBUG), McpHub(good.resolved_servers({"DESK_TOKEN": TOKEN})) as hub:
        assert not hub.listing().away  # the token got it in
    bad = config_of(tmp_path, http_table("desk", http_desk.url))
    with caplog.at_level(logging.DEBUG), McpHub(bad.resolved_servers({"DESK_TOKEN": "wrong-token"})) as hub:
        away = hub.listing().away
        assert "desk" in away and "wrong-token" not in away["desk"]
    text = caplog.text + repr(good) + repr(good.resolved_servers({"DESK_TOKEN": TOKEN}))
    assert TOKEN not in text and "wrong-token" not in text


def test_stdio_env_secrets_reach_the_server_and_nothing_else_of_ours_does(
    tmp_path: Path, log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-must-not-leak")
    toml = stdio_table("desk", log, DESK_TOKEN="${DESK_TOKEN}")
    config = config_of(tmp_path, toml)
    with McpHub(config.resolved_servers({"DESK_TOKEN": TOKEN})) as hub:
        catalog = Catalog.from_config(config, host=hub)
        assert run(catalog, "desk__env_seen", {"name": "DESK_TOKEN"}, tmp_path).content == "set"
        assert run(catalog, "desk__env_seen", {"name": "SLACK_BOT_TOKEN"}, tmp_path).content == "unset"


def test_a_forked_child_calls_the_parents_warm_session_through_the_relay(tmp_path: Path, log: Path) -> None:
    config = config_of(tmp_path, stdio_table("desk", log))
    with McpHub(config.resolved_servers({})) as hub:
        relay = RelayServer(hub).start()
        try:
            client = relay.client()
            assert client.listing() == hub.listing()
            pid = os.fork()
            if pid == 0:  # the child: what an RQ work horse is
                code = 1
                try:
                    answer = client.call("desk", "get_ticket", {"id": "T-9"}, False)
                    code = 0 if answer.content.startswith("T-9") else 3
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            assert [c["tool"] for c in calls(log)] == ["get_ticket"]  # one server, warm: started once
        finally:
            relay.close()


def test_a_relay_that_is_gone_answers_errors_not_exceptions(tmp_path: Path) -> None:
    client = RelayClient(str(tmp_path / "nothing.sock"), "any-token")
    assert client.listing() == Listing()
    lost = client.call("desk", "close_ticket", {"id": "T-1"}, True)
    assert lost.is_error and "Outcome unknown" in lost.content


FORK_WAITS_FOR_SPAWN = """
import os, threading
from harness.tools.mcp_transports import SPAWNING, guard_forks
guard_forks()
held, forking, order = threading.Event(), threading.Event(), []
os.register_at_fork(before=forking.set)  # registered later, so it runs before the guard's hook
def spawn():  # stands for the hub's loop thread spawning a stdio server
    with SPAWNING:
        held.set()
        forking.wait()  # the fork has begun: it must now wait for this spawn to end
        order.append("spawned")
threading.Thread(target=spawn).start()
held.wait()
pid = os.fork()
if pid == 0:  # what the child copied: the spawn had ended before the fork
    os._exit(0 if order == ["spawned"] else 1)
_, status = os.waitpid(pid, 0)
print("child saw the spawn done" if os.waitstatus_to_exitcode(status) == 0 else "child forked mid-spawn")
"""


def test_a_fork_waits_for_a_stdio_spawn_in_progress() -> None:
    """RQ forking a work horse while the hub spawns a server would copy the spawn's error pipe into
    the horse and stall the hub's loop, relay and all, until the horse exits (seen: 30 s)."""
    done = subprocess.run(
        [sys.executable, "-c", FORK_WAITS_FOR_SPAWN], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "child saw the spawn done"
