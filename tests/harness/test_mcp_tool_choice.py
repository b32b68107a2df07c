"""A server's tools chosen at the source: `include_tools` / `exclude_tools` in `[[mcp.servers]]`.

A tool the globs leave out is never listed, offered nor callable: a call naming it (a model that
guesses the name) is answered as an unknown tool and nothing reaches the server. Driven against the
real test server over stdio, the real hub, and the real SDK client against the loopback Messages API.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from harness.cli import list_tools, main
from harness.config import Config, ConfigError, load_config
from harness.loop import Finished, drive
from harness.state import new_run
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from harness.tools.mcp_listing import Listing, McpTool
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.mcp_support import calls, stdio_table


def config_of(tmp_path: Path, toml: str) -> Config:
    path = tmp_path / "harness.toml"
    path.write_text(toml)
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})


@pytest.fixture
def log(tmp_path: Path) -> Path:
    (tmp_path / "server").mkdir(exist_ok=True)
    return tmp_path / "server" / "calls.jsonl"


# --- the config ---------------------------------------------------------------------------------

TABLE = '[[mcp.servers]]\nname = "desk"\ncommand = "python"\n'


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('include_tools = "get_*"', "mcp.servers[0].include_tools must be a list of the server's tool names"),
        (
            "exclude_tools = [1]",
            'mcp.servers[0].exclude_tools[0] must be a tool name or glob, like "write_*", got 1',
        ),
        ('exclude_tools = ["ok", ""]', "mcp.servers[0].exclude_tools[1] must be a tool name or glob"),
        ('include_tools = ["  "]', "mcp.servers[0].include_tools[0] must be a tool name or glob"),
        (
            'include_tools = ["desk__get_*"]',
            "include_tools[0]: name the server's own tools ('get_*'), without desk__",
        ),
        ('defer_loading = "yes"', "mcp.servers[0].defer_loading must be true or false, got 'yes'"),
        (
            "[limits]\ndefer_tools_over_tokens = -1",
            "limits.defer_tools_over_tokens must be a whole number >= 0",
        ),
    ],
)
def test_a_bad_glob_or_flag_stops_the_config_with_one_line_naming_the_key(
    tmp_path: Path, line: str, said: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        config_of(tmp_path, TABLE + line + "\n")
    message = str(caught.value)
    assert said in message and "\n" not in message


def test_globs_and_defer_loading_are_read_as_given(tmp_path: Path) -> None:
    config = config_of(
        tmp_path,
        TABLE + 'include_tools = ["get_*", "get_*", "list?"]\nexclude_tools = []\ndefer_loading = true\n',
    )
    server = config.mcp_servers[0]
    assert (server.include_tools, server.exclude_tools, server.defer_loading) == (
        ("get_*", "list?"),
        (),
        True,
    )
    assert config_of(tmp_path, TABLE).mcp_servers[0].defer_loading is None  # not set: by size
    assert config.limits.defer_tools_over_tokens == 10_000


# --- the listing --------------------------------------------------------------------------------


def test_left_out_tools_are_never_listed_and_the_listing_says_by_which_glob(
    tmp_path: Path, log: Path, caplog: pytest.LogCaptureFixture
) -> None:
    toml = stdio_table("desk", log)
    toml += 'include_tools = ["*ticket*", "comment", "crash", "nothing_like_this*"]\n'
    toml += 'exclude_tools = ["delete_*", "crash"]\n'
    config = config_of(tmp_path, toml)
    with caplog.at_level(logging.WARNING, logger="harness.mcp"), McpHub(config.resolved_servers({})) as hub:
        listing = hub.listing()
        catalog = Catalog.from_config(config, host=hub)
        registry = catalog.registry()
        left_out = catalog.left_out()
    assert sorted(t.name for t in listing.tools) == ["close_ticket", "comment", "get_ticket"]
    assert sorted(registry.names())[:3] == ["delete_file", "desk__close_ticket", "desk__comment"]
    assert "desk__delete_ticket" not in registry and "desk__crash" not in registry
    assert left_out["desk__delete_ticket"] == 'mcp.servers[desk].exclude_tools "delete_*"'
    assert left_out["desk__crash"] == 'mcp.servers[desk].exclude_tools "crash"'  # excluding wins
    assert left_out["desk__slow"] == "mcp.servers[desk].include_tools (no glob matches it)"
    unmatched = [r.getMessage() for r in caplog.records if "matches none" in r.getMessage()]
    assert unmatched == [
        "MCP server desk: mcp.servers[desk].include_tools 'nothing_like_this*' matches none of its 15 tools"
    ]


def test_a_listing_crosses_the_relay_with_what_was_left_out() -> None:
    tool = McpTool(server="desk", name="get_ticket", description="", input_schema={"type": "object"})
    listing = Listing((tool,), {}, {"desk": 5.0}, {"desk__crash": 'mcp.servers[desk].exclude_tools "crash"'})
    assert Listing.from_json(listing.to_json()) == listing


def test_a_model_that_guesses_a_left_out_name_gets_an_unknown_tool_and_nothing_reaches_the_server(
    tmp_path: Path, log: Path, model: FakeMessagesAPI
) -> None:
    model.check_tool_names = False  # the guessed name is in no request's tools, as in the real API
    config = config_of(tmp_path, stdio_table("desk", log) + 'exclude_tools = ["delete_*"]\n')
    model.script(
        reply(tool_use("desk__delete_ticket", {"id": "T-1"}, id="toolu_guess")),
        reply(text("It is not there.")),
    )
    with McpHub(config.resolved_servers({})) as hub:
        registry = Catalog.from_config(config, host=hub).registry()
        agent = make_agent(model, tmp_path, tools=registry, default="allow")
        state, outcome = drive(new_run("delete T-1"), agent, lambda _event: None)
    assert isinstance(outcome, Finished)
    answer = state.messages[2]["content"][0]
    assert answer["tool_use_id"] == "toolu_guess" and answer["is_error"] is True
    assert "no tool named 'desk__delete_ticket' is offered" in answer["content"]
    assert calls(log) == []  # nothing reached the server
    assert all(t["name"] != "desk__delete_ticket" for t in model.requests[0]["tools"])


def test_list_tools_names_each_left_out_tool_and_its_glob_after_the_tools_offered(
    tmp_path: Path, log: Path
) -> None:
    config = config_of(tmp_path, stdio_table("desk", log) + 'exclude_tools = ["delete_*", "c*"]\n')
    out = io.StringIO()
    with McpHub(config.resolved_servers({})) as hub:
        assert list_tools(Catalog.from_config(config, host=hub), config.policy, out) == 0
    lines = out.getvalue().splitlines()
    offered = [line.split("\t")[0] for line in lines if not line.startswith("#")]
    assert "desk__get_ticket" in offered and "desk__close_ticket" not in offered
    assert lines[-4:] == [  # after every tool offered, and what the server costs
        '# left out: desk__close_ticket (mcp.servers[desk].exclude_tools "c*")',
        '# left out: desk__comment (mcp.servers[desk].exclude_tools "c*")',
        '# left out: desk__crash (mcp.servers[desk].exclude_tools "c*")',
        '# left out: desk__delete_ticket (mcp.servers[desk].exclude_tools "delete_*")',
    ]


def test_explain_call_of_a_left_out_tool_names_its_glob(
    tmp_path: Path, log: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "harness.toml"
    path.write_text(stdio_table("desk", log) + 'exclude_tools = ["delete_*"]\n')
    monkeypatch.setenv("HARNESS_CONFIG", str(path))
    monkeypatch.setenv("HARNESS_WORKSPACE", str(tmp_path))
    monkeypatch.setattr("harness.cli.protect_process", lambda: True)  # not this test process's /proc
    assert main(["--explain-call", "desk__delete_ticket", '{"id": "T-1"}']) == 1
    assert capsys.readouterr().out == (
        'desk__delete_ticket\t-\tleft out by mcp.servers[desk].exclude_tools "delete_*": '
        "never offered nor callable\n"
    )
