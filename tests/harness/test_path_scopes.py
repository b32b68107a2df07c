"""Scopes read every value, not names (issue 30), below the Slack surface: which arguments of a
tool hold paths (its schema's marks, a module's pydantic marks, `[[mcp.servers]] path_arguments`,
the built-ins' own), which calls a directory grant covers (a table, and a property), the card's
`approve_dir` for MCP calls ruled by the loop, and the parked call carrying what the bot needs."""

from __future__ import annotations

import posixpath
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field

from harness.calls import calls_in
from harness.config import ConfigError, load_config
from harness.loop import Agent
from harness.policy import PathArgs, Tier, grant_directory, inside_directory, schema_path_arguments
from harness.state import PendingCall, RunState
from harness.tools import BUILTIN_TOOLS, ToolContext, ToolResult, tool
from harness.tools.catalog import Catalog
from harness.tools.mcp_listing import Listing, McpTool
from messages.cards import CallCard, approval_card

COPY = PathArgs(("path", "destination"))
Marked = Annotated[str, Field(description="A file", json_schema_extra={"format": "path"})]  # a module's way


# --- which calls a directory grant covers ---------------------------------------------------------


@pytest.mark.parametrize(
    ("call_input", "inside"),
    [
        ({"path": "docs/a.md", "destination": "docs/b.md"}, True),
        ({"path": "docs/a.md", "destination": "docs/sub/../b.md"}, True),
        ({"path": "docs/a.md", "destination": "/etc/cron.d/evil"}, False),
        ({"path": "docs/a.md", "destination": "../../home/alice/.ssh/authorized_keys"}, False),
        ({"path": "docs/a.md", "destination": "docs/../../x"}, False),
        ({"path": "docs/a.md", "destination": "~/x"}, False),
        ({"path": "docs/a.md", "destination": "~alice/x"}, False),
        ({"path": "docs/a.md", "destination": "docs\\..\\..\\x"}, False),
        ({"path": "docs/a.md", "destination": "C:\\Windows\\x"}, False),
        ({"path": "docs/a.md", "destination": "\\\\server\\share\\x"}, False),
        ({"path": "docs/a.md", "destination": "README.md"}, False),  # a path argument: at the root
        ({"path": "docs/a.md"}, True),  # a path argument left out holds nothing
        ({"path": "docs/a.md", "destination": None}, True),
        # URIs: a relative file: URI's path, percent-decoded; any other scheme is never inside
        ({"path": "docs/a.md", "destination": "file:docs/b.md"}, True),
        ({"path": "docs/a.md", "destination": "file:docs/%2E%2E/%2E%2E/etc/x"}, False),
        ({"path": "docs/a.md", "destination": "file:///etc/x"}, False),
        ({"path": "docs/a.md", "destination": "file://host/docs/x"}, False),
        ({"path": "docs/a.md", "destination": "https://example.com/docs/x"}, False),
        # every string anywhere in a path argument is a path
        ({"path": ["docs/a.md", "docs/b.md"]}, True),
        ({"path": ["docs/a.md", "../../etc/passwd"]}, False),
        ({"path": {"from": "docs/a.md", "to": "/etc/x"}}, False),
        # a string that looks like a path anywhere else: the policy cannot place it
        ({"path": "docs/a.md", "options": {"dest": "/etc/x"}}, False),
        ({"path": "docs/a.md", "options": {"dest": "docs/b.md"}}, False),
        ({"path": "docs/a.md", "options": [{"deep": ["..", "x"]}]}, False),
        ({"path": "docs/a.md", "options": {"/etc/x": 1}}, False),  # a key, too
        ({"path": "docs/a.md", "note": "~"}, False),
        ({"path": "docs/a.md", "note": "a\\b"}, False),
        ({"path": "docs/a.md", "note": "hello", "n": 3, "on": True}, True),  # nothing path-like
        ({"note": "docs/a.md"}, False),  # no path argument given: nothing to hold inside
        ({}, False),
    ],
)
def test_which_calls_a_grant_under_docs_covers(call_input: dict[str, Any], inside: bool) -> None:
    assert inside_directory(call_input, "docs/", COPY) is inside


def test_a_tool_whose_path_arguments_are_not_known_is_never_covered_nor_offered_a_directory() -> None:
    assert inside_directory({"path": "docs/a.md"}, "docs/", None) is False
    assert grant_directory({"path": "docs/a.md"}, None) is None


@pytest.mark.parametrize(
    ("call_input", "directory"),
    [
        ({"path": "docs/a.md", "destination": "docs/b.md"}, "docs/"),
        ({"path": "docs/x/a.md", "destination": "docs/x/y/b.md"}, "docs/x/"),
        ({"path": "docs/a.md", "destination": "/etc/cron.d/evil"}, None),
        ({"path": "docs/a.md", "destination": "other/b.md"}, None),  # only the root holds both
        ({"path": ["docs/a.md", "docs/sub/b.md"]}, "docs/"),
        ({"path": "docs/a.md", "options": {"dest": "docs/b.md"}}, None),  # a path it cannot place
        ({"path": "docs/a.md", "note": "see docs/b.md"}, None),
    ],
)
def test_the_directory_a_card_offers(call_input: dict[str, Any], directory: str | None) -> None:
    assert grant_directory(call_input, COPY) == directory


def test_the_built_in_write_files_content_is_text_never_a_path() -> None:
    write = next(t for t in BUILTIN_TOOLS if t.name == "write_file")
    assert write.path_args == PathArgs(("path",), ("content",))
    assert inside_directory({"path": "docs/a.md", "content": "see /etc/x and ../y"}, "docs/", write.path_args)
    assert {t.name: t.path_args.paths for t in BUILTIN_TOOLS} == {
        "get_time": (),
        "read_file": ("path",),
        "list_files": ("path",),
        "write_file": ("path",),
        "delete_file": ("path",),
    }


_PATH = st.builds(
    lambda lead, parts: lead + "/".join(parts),
    st.sampled_from(["", "", "./", "/", "~/", "file:///", "file:"]),
    st.lists(st.sampled_from(["docs", "docs", "a", "b.md", "sub", "..", "."]), min_size=1, max_size=5),
)


def _outside(value: str) -> bool:
    """An independent reading (posixpath's): is `value` anywhere but inside `docs/`?"""
    if value.startswith(("/", "~", "file://")):
        return True
    return not posixpath.normpath(value.removeprefix("file:")).startswith("docs/")


@given(
    path=_PATH,
    destination=st.one_of(_PATH, st.lists(_PATH, max_size=3)),
    elsewhere=st.one_of(st.none(), _PATH, st.sampled_from(["hello", "a.md", "3"])),
    nested=st.booleans(),
)
def test_a_grant_covers_a_call_exactly_when_every_path_lies_inside_and_none_sits_elsewhere(
    path: str, destination: str | list[str], elsewhere: str | None, nested: bool
) -> None:
    call: dict[str, Any] = {"path": path, "destination": destination}
    if elsewhere is not None:
        call["options"] = {"dest": elsewhere} if nested else elsewhere
    paths = [path, *([destination] if isinstance(destination, str) else destination)]
    looks = elsewhere is not None and ("/" in elsewhere or elsewhere.startswith(("~", "..", "file:")))
    covered = inside_directory(call, "docs/", COPY)
    assert covered is (not looks and not any(_outside(p) for p in paths)), call


# --- which arguments hold paths ---------------------------------------------------------------------


def test_a_schema_marks_paths_with_format_path_or_uri_or_x_path_on_a_property_or_its_items() -> None:
    schema = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "format": "path"},
            "url": {"type": "string", "format": "uri"},
            "dest": {"type": "string", "x-path": True},
            "paths": {"type": "array", "items": {"type": "string", "format": "path"}},
            "maybe": {"anyOf": [{"type": "string", "format": "path"}, {"type": "null"}]},
            "when": {"type": "string", "format": "date-time"},
            "note": {"type": "string"},
            "odd": {"type": "string", "x-path": "yes"},
        },
    }
    assert schema_path_arguments(schema) == ("path", "url", "dest", "paths", "maybe")
    assert schema_path_arguments({"properties": "nope"}) == () and schema_path_arguments(None) == ()


def test_a_tool_module_marks_a_parameter_with_pydantics_json_schema_extra() -> None:
    @tool()
    def copy(
        ctx: ToolContext,
        path: Marked,
        destination: Annotated[str, Field(json_schema_extra={"x-path": True})],
        more: list[Marked] | None = None,
        note: str = "",
    ) -> str:
        """Copy."""
        return "copied"

    assert copy.path_args == PathArgs(("path", "destination", "more"))


class Desk:
    """An `McpHost` listing one server's tools (nothing is called)."""

    def __init__(self, *tools: McpTool) -> None:
        self.tools = tools

    def listing(self) -> Listing:
        return Listing(tools=self.tools)

    def call(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        side_effects: bool,
        reply: Any = None,
        who: Any = None,
        receipt: Any = None,
    ) -> ToolResult:
        raise AssertionError("nothing runs here")


PLAIN = {"type": "object", "properties": {"path": {"type": "string"}, "destination": {"type": "string"}}}
MARKED = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "format": "path"},
        "destination": {"type": "string", "format": "path"},
    },
}


def _config(tmp_path: Path, extra: str = "") -> Any:
    path = tmp_path / "harness.toml"
    path.write_text(
        f'[approvals]\ngrant_minutes = 30\n[[mcp.servers]]\nname = "desk"\ncommand = "desk-server"\n{extra}',
        encoding="utf-8",
    )
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})


def _ruled(tmp_path: Path, config: Any, host: Desk, name: str, arguments: dict[str, Any]) -> PendingCall:
    """The call as the loop rules it, over the catalog `config` and `host` give."""
    registry = Catalog.from_config(config).with_host(host).registry()
    agent = Agent(client=cast(Any, None), tools=registry, context=ToolContext(tmp_path), policy=config.policy)
    [call] = calls_in([{"type": "tool_use", "id": "toolu_1", "name": name, "input": arguments}], agent)
    return call


def _offers_dir(call: PendingCall) -> bool:
    card = approval_card(
        CallCard(
            run_id="r1",
            call=call,
            requester="UALICE",
            tier_source=call.why,
            approvers=[],
            expires_at=datetime.now(UTC),
            grant_minutes=30,
        )
    )
    ids = [e.get("action_id") for b in card.blocks if b["type"] == "actions" for e in b["elements"]]
    return "approve_dir" in ids


def test_an_mcp_tool_whose_schema_marks_format_path_is_scoped_by_every_path(tmp_path: Path) -> None:
    host = Desk(McpTool("desk", "copy", "Copy.", MARKED))
    config = _config(tmp_path)
    ok = _ruled(tmp_path, config, host, "desk__copy", {"path": "docs/a.md", "destination": "docs/b.md"})
    assert ok.path_args == PathArgs(("path", "destination")) and _offers_dir(ok)
    evil = _ruled(
        tmp_path, config, host, "desk__copy", {"path": "docs/a.md", "destination": "/etc/cron.d/evil"}
    )
    assert not _offers_dir(evil) and not inside_directory(evil.input, "docs/", evil.path_args)


def test_an_mcp_tool_with_nothing_marked_gets_no_directory_for_a_path_it_carries(tmp_path: Path) -> None:
    host = Desk(McpTool("desk", "copy", "Copy.", PLAIN))
    config = _config(tmp_path)
    call = _ruled(tmp_path, config, host, "desk__copy", {"path": "docs/a.md", "destination": "docs/b.md"})
    assert call.path_args == PathArgs() and not _offers_dir(call)  # `path` is a name, nothing more


def test_path_arguments_from_the_config_make_a_servers_tool_scoped_by_them(tmp_path: Path) -> None:
    host = Desk(McpTool("desk", "copy", "Copy.", PLAIN))
    config = _config(tmp_path, 'path_arguments = { copy = ["path", "destination"] }\n')
    assert config.mcp_servers[0].path_arguments == {"copy": ("path", "destination")}
    ok = _ruled(tmp_path, config, host, "desk__copy", {"path": "docs/a.md", "destination": "docs/b.md"})
    assert ok.path_args == PathArgs(("path", "destination")) and _offers_dir(ok)
    for outside in ("/etc/cron.d/evil", "../../home/alice/.ssh/authorized_keys"):
        evil = _ruled(tmp_path, config, host, "desk__copy", {"path": "docs/a.md", "destination": outside})
        assert not _offers_dir(evil) and not inside_directory(evil.input, "docs/", evil.path_args)


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ('path_arguments = { copy = "path" }', "mcp.servers[0].path_arguments.copy"),
        ("path_arguments = { copy = [] }", "mcp.servers[0].path_arguments.copy"),
        ('path_arguments = { copy = ["path", 3] }', "mcp.servers[0].path_arguments.copy"),
        ('path_arguments = { copy = [""] }', "mcp.servers[0].path_arguments.copy"),
        ('path_arguments = { desk__copy = ["path"] }', "mcp.servers[0].path_arguments.desk__copy"),
        ('path_arguments = ["copy"]', "mcp.servers[0].path_arguments"),
    ],
)
def test_path_arguments_is_parsed_strictly_with_one_line_naming_the_key(
    tmp_path: Path, table: str, key: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, table + "\n")
    assert key in str(info.value) and "\n" not in str(info.value)


# --- the parked call carries what the bot needs ---------------------------------------------------


def test_a_parked_call_keeps_its_path_arguments_and_one_parked_before_them_is_scoped_by_nothing() -> None:
    call = PendingCall("toolu_1", "desk__copy", {"path": "docs/a"}, Tier.ASK, path_args=COPY)
    state = RunState(messages=(), pending=(call,))
    again = RunState.loads(state.dumps()).pending[0]
    assert again.path_args == COPY
    old = state.to_json()
    del old["pending"][0]["path_args"]  # as the release before wrote it
    before = RunState.from_json(old).pending[0]
    assert before.path_args is None and grant_directory(before.input, before.path_args) is None
