"""MCP servers are defined once and picked per profile (issue 20), end to end: a real bot, a real
`python -m workers` whose hub runs the test desk server over stdio (in bubblewrap), real Redis.

`#ops` picks the desk; `#general` picks no server. The worker starts the desk once for both; a run
in `#general` is never offered its tools, and a call the model makes to one anyway is answered
`is_error` without reaching the server.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.messages_api import reply, text, tool_use
from tests.mcp_support import calls, stdio_table
from tests.stack import RedisServer, Stack, running_stack, wait_post, wait_until

pytestmark = pytest.mark.e2e

DB = 7  # other stacks: see tests/e2e/test_groups_escalation_home.py
OPS, GENERAL = "C7OPS", "C7GENERAL"
_words = itertools.count(1)


@pytest.fixture(scope="module")
def desk_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("desk") / "calls.jsonl"


@pytest.fixture(scope="module")
def stack(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, desk_log: Path
) -> Iterator[Stack]:
    config = (
        '[limits]\nmax_runs_per_user = 1000\nmax_runs_per_channel = 1000\n[tools]\nbuiltin = ["get_time"]\n'
        + stdio_table("desk", desk_log)
        + '[policy.tools]\n"desk__*" = "allow"\n'
        + f'[[profiles]]\nname = "ops"\nchannels = ["{OPS}"]\n[profiles.tools]\nmcp = ["desk"]\n'
        + f'[[profiles]]\nname = "general"\nchannels = ["{GENERAL}"]\n[profiles.tools]\nmcp = []\n'
    )
    yield from running_stack(redis_server, tmp_path_factory.mktemp("profiles-mcp"), config, DB)


def tools_of(stack: Stack, marker: str) -> list[str]:
    request = wait_until(
        lambda: next((r for r in stack.model.requests if marker in str(r["messages"][0])), None)
    )
    return sorted(t["name"] for t in request.get("tools") or [])


def test_only_the_profile_that_picks_a_server_is_offered_its_tools(stack: Stack, desk_log: Path) -> None:
    ops, general = f"pmcp{next(_words)}", f"pmcp{next(_words)}"
    stack.model.script_for(
        ops, reply(tool_use("desk__get_ticket", {"id": "T-7"})), reply(text(f"{ops}: done."))
    )
    stack.model.script_for(general, reply(text(f"{general}: done.")))
    _, ops_ts, _ = stack.mention(f"{ops}: look up T-7", channel=OPS)
    _, general_ts, _ = stack.mention(f"{general}: look up T-7", channel=GENERAL)
    wait_post(stack, OPS, ops_ts, lambda m: f"{ops}: done." in m["text"])
    wait_post(stack, GENERAL, general_ts, lambda m: f"{general}: done." in m["text"])
    assert any(name.startswith("desk__") for name in tools_of(stack, ops))
    assert tools_of(stack, general) == ["get_time"]
    assert [c["tool"] for c in calls(desk_log)] == ["get_ticket"]


def test_a_call_to_a_server_the_profile_does_not_pick_never_reaches_it(stack: Stack, desk_log: Path) -> None:
    marker = f"pmcp{next(_words)}"
    before = len(calls(desk_log))
    stack.model.check_tool_names = False  # the model names a tool this run was not offered, on purpose
    try:
        stack.model.script_for(
            marker,
            reply(tool_use("desk__delete_ticket", {"id": "T-1"})),
            reply(text(f"{marker}: done.")),
        )
        _, ts, _ = stack.mention(f"{marker}: delete T-1", channel=GENERAL)
        wait_post(stack, GENERAL, ts, lambda m: f"{marker}: done." in m["text"])
    finally:
        stack.model.check_tool_names = True
    second = [r for r in stack.model.requests if marker in str(r["messages"][0])][1]
    result = second["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result["is_error"] is True
    stack.settled()
    assert len(calls(desk_log)) == before
