"""A hostile MCP server (`tests/fakes/mcp_odd_server.py`, a real process over stdio) against the hub.

What it lists (two tools of one name, names the Messages API refuses), what it claims (every
tool says `readOnlyHint: true`, the destructive one too) and what it answers (huge text, many
and large images, an image repeated in `structuredContent`, audio) must never break a run,
set a tier, or make a request the API would refuse.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.config import Config, load_config
from harness.tools import ToolContext
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from tests.mcp_support import calls, odd_table

REFUSED_NAMES = ("twin", "l" * 60, "has.dot")


def config_of(tmp_path: Path, toml: str) -> Config:
    path = tmp_path / "harness.toml"
    path.write_text(toml)
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "calls.jsonl"


@pytest.fixture
def odd(tmp_path: Path, log: Path, caplog: pytest.LogCaptureFixture) -> Iterator[tuple[Catalog, McpHub]]:
    """The hostile server, untrusted (the default), its hub started, and the catalog that offers it."""
    config = config_of(tmp_path, odd_table("odd", log) + "timeout_seconds = 30\n")
    with caplog.at_level(logging.WARNING, logger="harness.mcp"), McpHub(config.resolved_servers({})) as hub:
        yield Catalog.from_config(config, host=hub), hub


def run(catalog: Catalog, name: str, args: dict[str, Any], tmp_path: Path) -> Any:
    return catalog.registry().run(name, args, ToolContext(workspace=tmp_path))


# --- names -------------------------------------------------------------------------------------


def test_two_tools_of_one_name_are_left_out_and_every_other_tool_still_works(
    odd: tuple[Catalog, McpHub], tmp_path: Path, log: Path
) -> None:
    """Today the job's tool list raises DuplicateTool: every run fails, built-in-only ones too."""
    catalog, _ = odd
    registry = catalog.registry()  # raised DuplicateTool before
    names = registry.names()
    assert "odd__twin" not in names
    assert {"odd__echo", "odd__wipe", "get_time", "read_file"} <= set(names)
    assert not run(catalog, "get_time", {}, tmp_path).is_error  # a built-in-only run works
    assert run(catalog, "odd__echo", {"text": "hi"}, tmp_path).content == "hi"
    twin = run(catalog, "odd__twin", {}, tmp_path)
    assert twin.is_error and "no tool" in twin.content.lower()  # never offered, never sent
    assert [c["tool"] for c in calls(log)] == ["echo"]


def test_names_past_64_characters_or_outside_the_apis_pattern_are_left_out(
    odd: tuple[Catalog, McpHub],
) -> None:
    catalog, hub = odd
    listed = [t.qualified for t in hub.listing().tools]
    assert all(len(n) <= 64 for n in listed) and not any("." in n for n in listed)
    assert f"odd__{'l' * 59}"[:64] not in catalog.registry().names()
    assert len("odd__" + "l" * 60) == 65  # one past the API's limit: the old 128 let it through


def test_every_refused_name_is_named_in_one_log_line(
    odd: tuple[Catalog, McpHub], caplog: pytest.LogCaptureFixture
) -> None:
    listed = caplog.get_records("setup") + caplog.records  # the hub lists its tools as it starts
    lines = [r.getMessage() for r in listed if "not offered" in r.getMessage()]
    assert len(lines) == 1, lines
    for name in REFUSED_NAMES:
        assert repr(name) in lines[0]
    assert "2 tools share this name" in lines[0] and "^[a-zA-Z0-9_-]{1,64}$" in lines[0]
