"""A server whose tools change while it runs (`notifications/tools/list_changed`), and `pin_tools`.

Against a real stdio server (`tests/fakes/mcp_moving_server.py`) at both protocol eras: the
2026-07-28 one, where the change comes on a `subscriptions/listen` stream, and the 2025 one, where
it comes on the connection.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cli import Terminal, run_in_terminal
from harness.config import Config, load_config
from harness.loop import Finished
from harness.policy import Tier
from harness.tools import ToolContext
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from harness.tools.relay import RelayServer
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.mcp_support import MOVING, HttpDesk, calls, moving_table
from tests.stack import wait_until


def config_of(tmp_path: Path, toml: str) -> Config:
    path = tmp_path / "harness.toml"
    path.write_text(toml + '[policy]\ndefault = "ask"\n[policy.tools]\n"moving__extra" = "deny"\n')
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})


@pytest.fixture
def log(tmp_path: Path) -> Path:
    (tmp_path / "server").mkdir(exist_ok=True)
    return tmp_path / "server" / "calls.jsonl"


@pytest.fixture(params=["2026-07-28", "2025"])
def era(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """The moving server's flags for one protocol era."""
    return () if request.param == "2026-07-28" else ("--legacy",)


def started(tmp_path: Path, toml: str) -> tuple[Config, McpHub]:
    config = config_of(tmp_path, toml)
    return config, McpHub(config.resolved_servers({})).start()


@pytest.fixture
def moving(tmp_path: Path, log: Path, era: tuple[str, ...]) -> Iterator[tuple[Catalog, McpHub]]:
    config, hub = started(tmp_path, moving_table(log, *era))
    try:
        yield Catalog.from_config(config, host=hub), hub
    finally:
        hub.close()


@pytest.fixture
def pinned(tmp_path: Path, log: Path, era: tuple[str, ...]) -> Iterator[tuple[Catalog, McpHub]]:
    config, hub = started(tmp_path, moving_table(log, *era, pin=True))
    try:
        yield Catalog.from_config(config, host=hub), hub
    finally:
        hub.close()


def offered(catalog: Catalog) -> set[str]:
    return set(catalog.registry().names())


def test_a_tool_added_later_is_offered_and_tiered_by_the_policy(
    moving: tuple[Catalog, McpHub], tmp_path: Path, log: Path
) -> None:
    catalog, hub = moving
    assert "moving__extra" not in offered(catalog)
    assert not hub.call("moving", "add", {"name": "extra", "description": "An extra."}, False).is_error

    assert wait_until(lambda: "moving__extra" in offered(catalog), timeout=20)
    extra = catalog.registry().get("moving__extra")
    assert extra is not None and extra.description == "An extra."
    config = config_of(tmp_path, "")
    assert config.policy.decide_tool("moving__extra").tier is Tier.DENY  # the policy's, as for any tool
    answer = catalog.registry().run("moving__extra", {}, ToolContext(workspace=tmp_path))
    assert answer.text == "I am extra"


def test_a_server_that_says_its_tools_changed_again_and_again_is_listed_once_a_second(
    moving: tuple[Catalog, McpHub], log: Path
) -> None:
    catalog, hub = moving
    before = len(listings(log))
    said = hub.call("moving", "flood", {"count": 100, "every": 0.02}, False)  # 100 in about 2 s
    assert not said.is_error, said.text
    assert not hub.call("moving", "add", {"name": "late", "description": "After the flood."}, False).is_error
    assert wait_until(lambda: "moving__late" in offered(catalog), timeout=20)  # still heard, once it settles
    assert len(listings(log)) - before < 10  # not one listing per notice (each one listed: about 100)


def listings(log: Path) -> list[dict[str, object]]:
    """Each listing of the server's tools, as it wrote them down."""
    return [e for e in map(json.loads, log.read_text().splitlines()) if e.get("tool") == "tools/list"]


def test_a_removed_tool_is_no_longer_offered_and_a_call_of_it_never_reaches_the_server(
    moving: tuple[Catalog, McpHub], tmp_path: Path, log: Path
) -> None:
    catalog, hub = moving
    before = catalog.registry()  # what a run's step was given before the change
    assert "moving__note" in before
    assert not hub.call("moving", "drop", {"name": "note"}, False).is_error

    assert wait_until(lambda: "moving__note" not in offered(catalog), timeout=20)
    answer = before.run("moving__note", {"text": "hello"}, ToolContext(workspace=tmp_path))
    assert answer.is_error and "no longer offers moving__note" in answer.text
    assert [c for c in calls(log) if c["tool"] == "note"] == []


def test_a_tool_redefined_under_its_name_is_offered_as_now_defined_and_logged_at_info(
    moving: tuple[Catalog, McpHub], caplog: pytest.LogCaptureFixture
) -> None:
    catalog, hub = moving
    caplog.set_level(logging.INFO, logger="harness.mcp")
    redescribe = {"name": "note", "description": "Now it mails."}
    assert not hub.call("moving", "redescribe", redescribe, False).is_error

    def description() -> str:
        found = catalog.registry().get("moving__note")
        return found.description if found is not None else ""

    assert wait_until(lambda: description() == "Now it mails.", timeout=20)
    lines = [r for r in caplog.records if "its tools changed" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO]
    assert "changed 'note'" in lines[0].getMessage()


def test_pin_tools_keeps_the_first_listing_and_names_each_change_in_one_warning(
    pinned: tuple[Catalog, McpHub], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    catalog, hub = pinned
    caplog.set_level(logging.DEBUG, logger="harness.mcp")
    first = catalog.registry().get("moving__note")
    assert first is not None

    def changed(level: int) -> list[str]:
        said = (r for r in caplog.records if r.levelno == level)
        return [r.getMessage() for r in said if "its tools changed" in r.getMessage()]

    assert not hub.call("moving", "add", {"name": "extra", "description": "An extra."}, False).is_error
    assert wait_until(lambda: changed(logging.WARNING), timeout=20)
    redescribe = {"name": "note", "description": "Now it mails."}
    assert not hub.call("moving", "redescribe", redescribe, False).is_error
    assert wait_until(lambda: any("changed 'note'" in w for w in changed(logging.WARNING)), timeout=20)
    assert all("added 'extra'" in w and "pin_tools = true" in w for w in changed(logging.WARNING))
    assert "moving__extra" not in offered(catalog)
    note = catalog.registry().get("moving__note")
    assert note is not None and note.description == first.description
    assert changed(logging.INFO) == []

    # The server says so again, with nothing new: the same change is not a new warning.
    warnings = len(changed(logging.WARNING))
    assert not hub.call("moving", "redescribe", redescribe, False).is_error
    assert wait_until(lambda: changed(logging.DEBUG), timeout=20)
    assert len(changed(logging.WARNING)) == warnings


def test_a_work_horse_offers_the_refreshed_listing_through_the_relay(
    moving: tuple[Catalog, McpHub], tmp_path: Path
) -> None:
    catalog, hub = moving
    relay = RelayServer(hub).start()
    try:
        horse = catalog.with_host(relay.client())
        assert "moving__extra" not in set(horse.registry().names())
        assert not hub.call("moving", "add", {"name": "extra", "description": "An extra."}, False).is_error
        assert wait_until(lambda: "moving__extra" in set(horse.registry().names()), timeout=20)
        answer = horse.registry().run("moving__extra", {}, ToolContext(workspace=tmp_path))
        assert answer.text == "I am extra"
    finally:
        relay.close()


def test_the_terminal_agent_offers_a_tool_added_mid_run_on_its_next_request(
    moving: tuple[Catalog, McpHub], model: FakeMessagesAPI, tmp_path: Path
) -> None:
    """Turn 1 adds a tool; turn 2's call asks a person, who answers once the hub has the new
    listing; the request after that offers the new tool, the first did not."""
    catalog, hub = moving
    model.script(
        reply(tool_use("moving__add", {"name": "extra", "description": "An extra."})),
        reply(tool_use("moving__note", {"text": "n"})),
        reply(text("done")),
    )
    agent = make_agent(model, tmp_path, tools=catalog.registry(), policy={"moving__add": "allow"})

    def ask(_prompt: str) -> str:
        assert wait_until(lambda: "moving__extra" in offered(catalog), timeout=20)
        return "y"

    state, outcome = run_in_terminal("go", agent, Terminal(io.StringIO(), ask), catalog.registry)

    assert isinstance(outcome, Finished)
    names = [{t["name"] for t in r.get("tools", [])} for r in model.requests]
    # The first request came before the change; the last one after the hub took it (the second
    # may have come before or after: the server's notification races the call's answer).
    assert len(names) == 3 and "moving__extra" not in names[0] and "moving__extra" in names[2]


def test_a_tool_removed_mid_run_stays_defined_for_the_history_and_a_later_call_of_it_is_refused(
    moving: tuple[Catalog, McpHub], model: FakeMessagesAPI, tmp_path: Path, log: Path
) -> None:
    """The API refuses a request whose history names a tool `tools` does not define: a run that
    called a tool its server then removed goes on, and the model's next call of it never runs."""
    catalog, _ = moving
    model.script(
        reply(tool_use("moving__note", {"text": "first"})),
        reply(tool_use("moving__drop", {"name": "note"})),
        reply(tool_use("write_file", {"path": "x.txt", "content": "x"})),  # asks: answered once the
        # hub took the removal
        reply(tool_use("moving__note", {"text": "again"})),
        reply(text("done")),
    )
    allowed = {"moving__note": "allow", "moving__drop": "allow"}
    agent = make_agent(model, tmp_path, tools=catalog.registry(), policy=allowed)

    def ask(_prompt: str) -> str:
        assert wait_until(lambda: "moving__note" not in offered(catalog), timeout=20)
        return "y"

    state, outcome = run_in_terminal("go", agent, Terminal(io.StringIO(), ask), catalog.registry)

    assert isinstance(outcome, Finished) and model.errors == []
    refused = model.requests[4]["messages"][-1]["content"][0]
    assert refused["is_error"] is True and "moving__note" in str(refused["content"])
    assert [c["text"] for c in calls(log) if c["tool"] == "note"] == ["first"]


@pytest.fixture
def http_moving(tmp_path: Path, log: Path) -> Iterator[tuple[Catalog, McpHub]]:
    """The moving server over streamable HTTP (the 2026-07-28 protocol: a listen stream over HTTP)."""
    desk = HttpDesk(log, script=MOVING).start()
    try:
        config, hub = started(tmp_path, f'[[mcp.servers]]\nname = "moving"\nurl = "{desk.url}"\n')
        try:
            yield Catalog.from_config(config, host=hub), hub
        finally:
            hub.close()
    finally:
        desk.stop()


def test_over_http_a_tool_added_later_is_offered_and_a_removed_one_is_not(
    http_moving: tuple[Catalog, McpHub], tmp_path: Path
) -> None:
    catalog, hub = http_moving
    assert not hub.call("moving", "add", {"name": "extra", "description": "An extra."}, False).is_error
    assert wait_until(lambda: "moving__extra" in offered(catalog), timeout=20)
    assert catalog.registry().run("moving__extra", {}, ToolContext(workspace=tmp_path)).text == "I am extra"
    assert not hub.call("moving", "drop", {"name": "extra"}, False).is_error
    assert wait_until(lambda: "moving__extra" not in offered(catalog), timeout=20)
