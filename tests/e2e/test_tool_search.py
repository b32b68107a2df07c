"""A deferred MCP server end to end: the real bot, `python -m workers`, Redis and the test server.

The model finds a deferred tool with the tool search and calls it in the same reply; the call asks,
so the run parks in Redis with the search in its history, resumes on the click, and a later mention
in the thread sends that history again. The loopback Messages API refuses any request the real one
would (a search without its result, a `tool_result` for a search, a reference to an undefined tool).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.messages_api import reply, text, tool_search, tool_use
from tests.mcp_support import calls, stdio_table
from tests.stack import RedisServer, Stack, running_stack, thread, wait_until
from tests.stack import wait_post as wait_for_post

pytestmark = pytest.mark.e2e

DB = (
    5  # a stack lives for its module only (test_mcp's is 5 too); see tests/e2e/test_groups_escalation_home.py
)
POLICY = '[policy]\ndefault = "ask"\n[limits]\nmax_runs_per_user = 1000\nmax_runs_per_channel = 1000\n'


@pytest.fixture(scope="module")
def desk_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("desk") / "calls.jsonl"


@pytest.fixture(scope="module")
def stack(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, desk_log: Path
) -> Iterator[Stack]:
    config = stdio_table("desk", desk_log) + "defer_loading = true\n" + POLICY
    yield from running_stack(redis_server, tmp_path_factory.mktemp("tool-search"), config, DB)


def approval_card(stack: Stack, channel: str, ts: str) -> dict[str, Any] | None:
    return next(
        (
            m
            for m in thread(stack, channel, ts)
            if any(b["type"] == "actions" and "approve" in str(b) for b in m.get("blocks") or [])
        ),
        None,
    )


def test_a_searched_call_parks_resumes_and_its_thread_goes_on(stack: Stack, desk_log: Path) -> None:
    use, found = tool_search("close a ticket", "desk__close_ticket")
    stack.model.script_for(
        "searchclose",
        reply(text("Looking for a tool."), use, found, tool_use("desk__close_ticket", {"id": "T-7"})),
        reply(text("searchclose done")),
        reply(text("searchclose second answer")),
    )
    status, ts, _ = stack.mention("searchclose T-7", channel="C950")
    assert status == 200
    card = wait_until(lambda: approval_card(stack, "C950", ts), 30)
    assert "desk__close_ticket" in str(card["blocks"])
    assert calls(desk_log) == []  # parked in Redis, the search in its history: nothing ran yet
    assert stack.click(card, "approve") == 200
    wait_for_post(stack, "C950", ts, lambda m: "searchclose done" in str(m), timeout=30)

    stack.mention("and again", channel="C950", thread_ts=ts)  # the thread's history goes back
    wait_for_post(stack, "C950", ts, lambda m: "searchclose second answer" in str(m), timeout=30)
    stack.settled()
    assert stack.model.errors == []  # every request, resumed and continued, was one the API takes
    assert [c["tool"] for c in calls(desk_log)] == ["close_ticket"]
    last = [r for r in stack.model.requests if "searchclose" in str(r["messages"][0])][-1]
    sent = [b["type"] for m in last["messages"] if m["role"] == "assistant" for b in m["content"]]
    assert sent.count("server_tool_use") == 1 and sent.count("tool_search_tool_result") == 1
    assert any(t.get("defer_loading") for t in last["tools"])
