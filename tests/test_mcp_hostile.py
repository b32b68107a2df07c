"""A hostile MCP server (`tests/fakes/mcp_odd_server.py`, a real process over stdio) against the hub.

What it lists (two tools of one name, names the Messages API refuses), what it claims (every
tool says `readOnlyHint: true`, the destructive one too) and what it answers (huge text, many
and large images, an image repeated in `structuredContent`, audio) must never break a run,
set a tier, or make a request the API would refuse.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.config import Config, load_config
from harness.tools import ToolContext
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from tests.mcp_support import calls, odd_table
from tests.stack import ROOT

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


# --- annotations are claims ----------------------------------------------------------------------


def tier_and_why(catalog: Catalog, name: str) -> tuple[str, str]:
    found = catalog.registry().get(name)
    assert found is not None, name
    ruling = load_config(env={}).policy.decide(name, {}, found.own_tier, found.own_tier_why)
    return ruling.tier.value, ruling.why


def test_a_read_only_claim_of_an_untrusted_server_sets_no_tier_and_keeps_side_effects(
    odd: tuple[Catalog, McpHub],
) -> None:
    """`wipe` says readOnlyHint: true. Today that makes it allow, and never re-run after a crash."""
    catalog, _ = odd
    tier, why = tier_and_why(catalog, "odd__wipe")
    assert tier == "ask"  # the default: the claim gave nothing
    assert why == "policy.default (readOnlyHint not trusted: trust_annotations is false for server odd)"
    wipe = catalog.registry().get("odd__wipe")
    assert wipe is not None and wipe.side_effects is True  # fail safe: outcome unknown, never re-run
    assert wipe.annotations["readOnlyHint"] is True  # the card still shows what the server claims


def test_a_trusted_servers_read_only_claim_allows(tmp_path: Path, log: Path) -> None:
    config = config_of(tmp_path, odd_table("odd", log, trust=True))
    with McpHub(config.resolved_servers({})) as hub:
        catalog = Catalog.from_config(config, host=hub)
        tier, why = tier_and_why(catalog, "odd__wipe")
        assert (tier, why) == (
            "allow",
            "tool's own tier (MCP readOnlyHint, trusted: trust_annotations = true for server odd)",
        )
        wipe = catalog.registry().get("odd__wipe")
        assert wipe is not None and wipe.side_effects is False


def test_list_tools_says_why_an_untrusted_read_only_claim_is_not_allow(tmp_path: Path, log: Path) -> None:
    config = tmp_path / "harness.toml"
    config.write_text(odd_table("odd", log) + odd_table("trusted", log, trust=True))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "HARNESS_", "SLACK_"))}
    env.update(PYTHONPATH=str(ROOT), HARNESS_CONFIG=str(config), HARNESS_WORKSPACE=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "harness", "--list-tools"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = {line.split("\t")[0]: line.split("\t")[1:] for line in done.stdout.splitlines()}
    assert lines["odd__wipe"] == [
        "ask",
        "policy.default (readOnlyHint not trusted: trust_annotations is false for server odd)",
    ]
    assert lines["trusted__wipe"] == [
        "allow",
        "tool's own tier (MCP readOnlyHint, trusted: trust_annotations = true for server trusted)",
    ]
