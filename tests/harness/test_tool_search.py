"""Paying only for the tools a run uses: an MCP server's tools deferred behind the tool search tool.

A deferred server's tools go with `defer_loading: true` beside the Messages API's tool search tool;
the model's search (`server_tool_use` + `tool_search_tool_result`) stays in the history as it came,
gets no `tool_result`, survives the checkpoint, and the tool it found runs as any other. Driven with
the real test server over stdio and the real SDK client against the loopback Messages API, which
refuses what the real API refuses.
"""

from __future__ import annotations

import io
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.cli import list_tools
from harness.config import Config, load_config
from harness.loop import Finished, drive, step
from harness.request import build_request
from harness.state import RunState, new_run
from harness.tools import ToolRegistry
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from harness.tools.tool_search import SEARCH_TOOL, request_tools, searchable, server_costs
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_search, tool_use, validate_request
from tests.mcp_support import calls, stdio_table


def config_of(tmp_path: Path, toml: str) -> Config:
    path = tmp_path / "harness.toml"
    path.write_text(toml)
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})


@pytest.fixture
def log(tmp_path: Path) -> Path:
    (tmp_path / "server").mkdir(exist_ok=True)
    return tmp_path / "server" / "calls.jsonl"


def schema(name: str, words: int = 10) -> dict[str, Any]:
    return {"name": name, "description": "word " * words, "input_schema": {"type": "object"}}


# --- which servers are deferred, and what goes in the request -------------------------------------


def test_a_server_is_deferred_when_it_says_so_or_when_unset_and_over_the_threshold() -> None:
    schemas = [schema("big__a", 3000), schema("big__b"), schema("pinned__a", 3000), schema("small__a")]
    deferral = {"big": None, "pinned": False, "small": True, "off": None}
    costs = {c.server: c for c in server_costs(schemas, ["big", "pinned", "small", "off"], deferral, 1000)}
    assert (
        costs["big"].deferred_why == "over limits.defer_tools_over_tokens (1000)" and costs["big"].tools == 2
    )
    assert costs["pinned"].deferred_why == ""  # defer_loading = false: sent whole, however big
    assert costs["small"].deferred_why == "mcp.servers[small].defer_loading = true"
    assert costs["off"].tools == 0 and costs["big"].per_request == 0 < costs["pinned"].per_request
    never = server_costs(schemas, ["big"], {"big": None}, 0)  # 0: never by size
    assert never[0].deferred_why == ""


def test_the_request_marks_deferred_tools_and_adds_the_search_tool_once() -> None:
    tools = request_tools([schema("get_time"), schema("big__a"), schema("big__b")], {"big__a", "big__b"})
    assert [t.get("defer_loading") for t in tools] == [None, True, True, None]
    assert tools[-1] == dict(SEARCH_TOOL)
    assert request_tools([schema("get_time")], ()) == [schema("get_time")]  # nothing deferred: no search tool
    body = {"model": "m", "max_tokens": 10, "tools": tools, "messages": [{"role": "user", "content": "hi"}]}
    assert validate_request(body) == []


def test_every_tool_deferred_still_makes_a_request_the_api_takes() -> None:
    tools = request_tools([schema("big__a"), schema("big__b")], {"big__a", "big__b"})
    body = {"model": "m", "max_tokens": 10, "tools": tools, "messages": [{"role": "user", "content": "hi"}]}
    assert validate_request(body) == []  # the search tool is the one tool loaded, as the API asks


def searched_history(found: str = "desk__get_ticket") -> tuple[dict[str, Any], ...]:
    use, result = tool_search("ticket", found, id="srvtoolu_1")
    return (
        {"role": "user", "content": "look at T-1"},
        {"role": "assistant", "content": [use, result, text("Found nothing I need.")]},
        {"role": "user", "content": "then say hi"},
    )


def test_history_refers_only_to_tools_the_request_defers_and_is_kept_whole_when_it_does() -> None:
    history = searched_history()
    assert searchable(history, frozenset({"desk__get_ticket"})) is history
    narrowed = searchable(history, frozenset({"other__x"}))
    assert narrowed[1]["content"][1]["content"]["tool_references"] == []
    assert history[1]["content"][1]["content"]["tool_references"]  # the stored run is never changed
    gone = searchable(history, frozenset())
    assert [b["type"] for b in gone[1]["content"]] == ["text"]


def test_a_server_no_longer_deferred_leaves_a_history_the_api_still_takes(
    model: FakeMessagesAPI, tmp_path: Path
) -> None:
    agent = make_agent(model, tmp_path)  # built-ins only: the server is gone, or no longer deferred
    request = build_request(RunState(messages=searched_history()), agent)
    assert validate_request(request) == []
    deferred = replace(agent, tools=ToolRegistry([replace(t, deferred=True) for t in agent.tools]))
    request = build_request(RunState(messages=searched_history("get_time")), deferred)
    assert validate_request(request) == []


# --- a run with a deferred server ------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["created", "streamed"])
def test_a_run_searches_calls_the_found_tool_and_keeps_the_search_through_a_checkpoint(
    tmp_path: Path, log: Path, model: FakeMessagesAPI, streamed: bool
) -> None:
    config = config_of(tmp_path, stdio_table("desk", log) + "defer_loading = true\n")
    use, found = tool_search("look up a ticket", "desk__get_ticket")
    model.script(
        reply(text("Searching."), use, found, tool_use("desk__get_ticket", {"id": "T-1"}, id="toolu_t")),
        reply(text("T-1 is on fire.")),
    )
    with McpHub(config.resolved_servers({})) as hub:
        agent = make_agent(
            model,
            tmp_path,
            tools=Catalog.from_config(config, host=hub).registry(),
            policy={},
            default="allow",
        )
        if streamed:  # as a worker with a live view (Slack's streaming message) sends it
            agent = replace(agent, live=lambda _event: None)
        asked = step(new_run("what about T-1?"), agent)
        state = RunState.loads(asked.state.dumps())  # the checkpoint a driver parks, as JSON
        assert state == asked.state
        assert [c.name for c in state.pending] == ["desk__get_ticket"]  # the search is no call of ours
        state, outcome = drive(state, agent, lambda _event: None)
    assert isinstance(outcome, Finished) and outcome.answer == "T-1 is on fire."
    assert model.errors == []  # every request was one the API takes
    first, second = model.requests
    assert bool(first.get("stream")) is streamed
    by_name = {t["name"]: t for t in first["tools"]}
    assert (
        by_name["desk__get_ticket"]["defer_loading"] is True and "defer_loading" not in by_name["read_file"]
    )
    assert by_name["tool_search_tool_bm25"] == dict(SEARCH_TOOL)
    assert "those of these MCP servers: desk." in first["system"][0]["text"]  # told what there is to find
    sent = [b["type"] for b in second["messages"][1]["content"]]
    assert sent == ["text", "server_tool_use", "tool_search_tool_result", "tool_use"]
    results = [b for b in second["messages"][2]["content"] if b["type"] == "tool_result"]
    assert [r["tool_use_id"] for r in results] == ["toolu_t"]  # one, for the tool_use only
    assert [c["tool"] for c in calls(log)] == ["get_ticket"]


def test_a_reply_paused_mid_search_is_continued_and_the_tool_found_runs(
    tmp_path: Path, log: Path, model: FakeMessagesAPI
) -> None:
    config = config_of(tmp_path, stdio_table("desk", log) + "defer_loading = true\n")
    use, found = tool_search("look up a ticket", "desk__get_ticket", id="srvtoolu_paused")
    model.script(
        reply(use, stop_reason="pause_turn"),  # the API paused its own turn mid-search
        reply(found, tool_use("desk__get_ticket", {"id": "T-2"})),
        reply(text("T-2 is fine.")),
    )
    with McpHub(config.resolved_servers({})) as hub:
        registry = Catalog.from_config(config, host=hub).registry()
        agent = make_agent(model, tmp_path, tools=registry, policy={}, default="allow")
        state, outcome = drive(new_run("and T-2?"), agent, lambda _event: None)
    assert isinstance(outcome, Finished) and model.errors == []
    merged = [b["type"] for b in state.messages[1]["content"]]
    assert merged == ["server_tool_use", "tool_search_tool_result", "tool_use"]  # one assistant message
    assert [c["tool"] for c in calls(log)] == ["get_ticket"]


def test_deferring_a_server_saves_its_definitions_on_every_request(
    tmp_path: Path, log: Path, model: FakeMessagesAPI
) -> None:
    model.count_tools = True  # input_tokens count the tool definitions as the API bills them

    def total(toml: str) -> int:
        config = config_of(tmp_path, stdio_table("desk", log) + toml)
        model.script(reply(tool_use("get_time", {})), reply(text("done")))
        with McpHub(config.resolved_servers({})) as hub:
            catalog = Catalog.from_config(config, host=hub)
            agent = make_agent(model, tmp_path, tools=catalog.registry(), policy={}, default="allow")
            state, outcome = drive(new_run("what time is it?"), agent, lambda _event: None)
            desk = next(c for c in catalog.costs() if c.server == "desk")
        assert isinstance(outcome, Finished) and model.errors == []
        return state.usage.input, desk.tokens

    loaded, desk_tokens = total("defer_loading = false\n")
    deferred, _ = total("defer_loading = true\n")
    # Two requests, each without the desk's definitions (the fake counts 4 characters a token,
    # the estimate 3: the saving is 3/4 of the estimate, twice, less the search tool's own few tokens).
    assert loaded - deferred >= 2 * (desk_tokens * 3 // 4 - 25)


def test_a_server_over_the_threshold_is_deferred_with_one_log_line_and_false_keeps_it_whole(
    tmp_path: Path, log: Path, caplog: pytest.LogCaptureFixture
) -> None:
    limits = "[limits]\ndefer_tools_over_tokens = 100\n"
    config = config_of(tmp_path, stdio_table("desk", log) + limits)
    with caplog.at_level(logging.INFO, logger="harness.mcp"), McpHub(config.resolved_servers({})) as hub:
        catalog = Catalog.from_config(config, host=hub)
        registry = catalog.registry()
        catalog.narrowed(config).registry()  # another run's catalog: not said again
    assert registry.get("desk__get_ticket").deferred  # type: ignore[union-attr]
    said = [r.getMessage() for r in caplog.records if "tool search" in r.getMessage()]
    assert len(said) == 1 and "over limits.defer_tools_over_tokens (100)" in said[0]
    pinned = config_of(tmp_path, stdio_table("desk", log) + "defer_loading = false\n" + limits)
    with McpHub(pinned.resolved_servers({})) as hub:
        assert not Catalog.from_config(pinned, host=hub).registry().deferred()


def test_list_tools_shows_each_servers_tokens_and_share_of_the_budget(tmp_path: Path, log: Path) -> None:
    toml = stdio_table("desk", log) + stdio_table("later", log) + "defer_loading = true\n"
    config = config_of(tmp_path, toml + "[limits]\ntoken_budget = 10000\n")
    out = io.StringIO()
    with McpHub(config.resolved_servers({})) as hub:
        catalog = Catalog.from_config(config, host=hub)
        list_tools(catalog, config.policy, out, config.limits.token_budget)
        costs = {c.server: c for c in catalog.costs()}
    lines = [line for line in out.getvalue().splitlines() if line.startswith("# ")]
    desk, later = costs["desk"], costs["later"]
    assert lines[0] == (
        f"# mcp server desk: {desk.tools} tools, about {desk.tokens:,} tokens a request "
        f"({desk.tokens / 10000:.1%} of limits.token_budget 10000)"
    )
    assert lines[1].startswith(
        f"# mcp server later: {later.tools} tools, deferred (mcp.servers[later].defer_loading = true): "
        "nothing a request until a search finds one"
    )
    assert lines[2].startswith("# tool definitions: about ") and "of limits.token_budget 10000" in lines[2]
    total = int(lines[2].split("about ")[1].split(" ")[0].replace(",", ""))
    assert desk.tokens < total < desk.tokens + later.tokens  # the deferred server adds nothing


def test_a_profile_takes_its_own_threshold(tmp_path: Path, log: Path) -> None:
    toml = stdio_table("desk", log) + "[limits]\ndefer_tools_over_tokens = 0\n"
    toml += '[[profiles]]\nname = "lean"\nchannels = ["C0LEAN"]\n'
    toml += "[profiles.limits]\ndefer_tools_over_tokens = 100\n"
    config = config_of(tmp_path, toml)
    with McpHub(config.resolved_servers({})) as hub:
        catalog = Catalog.from_config(config, host=hub)
        top = catalog.narrowed(config.for_run("C0ELSE")).registry()
        lean = catalog.narrowed(config.for_run("C0LEAN")).registry()
    assert not top.deferred()  # 0: never by size
    assert "desk__get_ticket" in lean.deferred() and "get_time" not in lean.deferred()
