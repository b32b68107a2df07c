"""Tools that always ask (issue 30), end to end: a real bot, a real `python -m workers` whose hub
runs the test desk server over stdio (in bubblewrap), real Redis; loopback Slack and model.

The desk's `comment` says `anthropic/requiresUserInteraction: true` in its `_meta`; `[policy]
always_ask` lists `desk__close_*` and `desk__delete_*`; `[policy.tools]` allows every desk tool
but denies `desk__delete_ticket`; grants are on. Each call of a tool that always asks gets a card,
whatever allows it, after a thread grant and after Approve all; a deny still wins; and a grant
recorded before a reload added `always_ask` covers no later call.
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.e2e.test_approvals import (
    action_ids,
    button_value,
    cards,
    done,
    now,
    replies_to,
    shown,
)
from tests.fakes.messages_api import reply, text, tool_use
from tests.mcp_support import calls, stdio_table
from tests.stack import RedisServer, Stack, has_actions, running_stack, thread, wait_until

pytestmark = pytest.mark.e2e

DB = 6  # a stack lives for its module only; see tests/e2e/test_groups_escalation_home.py
_channels = itertools.count(1)
BASE = """
[limits]
max_runs_per_user = 1000
max_runs_per_channel = 1000
[approvals]
approvers = ["UALICE", "UANN"]
grant_minutes = 30
[tools]
builtin = ["get_time", "write_file", "delete_file"]
"""
POLICY = """
[policy]
always_ask = ["desk__close_*", "desk__delete_*"{more}]
[policy.tools]
"desk__*" = "allow"
desk__delete_ticket = "deny"
"""


def config(desk_log: Path, more: str = "") -> str:
    return BASE + stdio_table("desk", desk_log, MCP_ALWAYS_ASK="comment") + POLICY.format(more=more)


@pytest.fixture(scope="module")
def desk_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("desk") / "calls.jsonl"


@pytest.fixture(scope="module")
def stack(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, desk_log: Path
) -> Iterator[Stack]:
    yield from running_stack(redis_server, tmp_path_factory.mktemp("always-ask"), config(desk_log), DB)


def new_channel() -> str:
    return f"C6AA{next(_channels)}"


def desk_calls(desk_log: Path, tool: str) -> list[dict[str, Any]]:
    return [c for c in calls(desk_log) if c["tool"] == tool]


def grant_keys(stack: Stack, channel: str) -> list[str]:
    found: list[bytes] = redis.Redis.from_url(stack.redis_url).keys(f"harness:grant:*:{channel}:*")  # type: ignore[assignment]
    return [k.decode() for k in found]


def ask(stack: Stack, marker: str, *script: Any, channel: str | None = None) -> tuple[str, str]:
    channel = channel or new_channel()
    stack.model.script_for(marker, *script)
    status, ts, _ = stack.mention(f"{marker}: please", channel=channel)
    assert status == 200
    return channel, ts


def open_card(stack: Stack, channel: str, ts: str, *, besides: tuple[str, ...] = ()) -> dict[str, Any]:
    """The first card of the thread still asking, other than those posted at `besides`."""
    return wait_until(lambda: next((c for c in cards(stack, channel, ts) if c["ts"] not in besides), None))


def test_a_tool_whose_server_says_so_asks_on_every_call_and_no_thread_grant_covers_it(
    stack: Stack, desk_log: Path
) -> None:
    marker = "aameta"
    channel, ts = ask(
        stack,
        marker,
        reply(tool_use("desk__comment", {"id": "T-1", "text": "one"})),
        reply(text(f"{marker} first done")),
        reply(tool_use("desk__comment", {"id": "T-1", "text": "two"})),
        reply(text(f"{marker} second done")),
    )
    card = open_card(stack, channel, ts)
    assert "approve_thread" not in action_ids(card) and "approve_dir" not in action_ids(card)
    assert "server `desk` asks a person to approve every call of this tool" in shown(card)
    assert desk_calls(desk_log, "comment") == []  # allowed by [policy.tools], asked all the same

    # An Approve for this thread (a stale or forged click: the card offers none) grants nothing.
    stack.click_value(card, "approve_thread", button_value(card, "approve") or "", user="UANN")
    wait_until(lambda: any("No grant covers this tool" in t for t in replies_to(stack, "UANN", channel)))
    assert grant_keys(stack, channel) == [] and has_actions(now(stack, channel, card))

    stack.click(card, "approve", user="UANN")
    done(stack, channel, ts, marker, "first done")
    assert [c["arguments"]["text"] for c in desk_calls(desk_log, "comment")] == ["one"]

    stack.mention("again", channel=channel, thread_ts=ts)
    second = open_card(stack, channel, ts, besides=(card["ts"],))
    stack.settled()
    assert [c["arguments"]["text"] for c in desk_calls(desk_log, "comment")] == ["one"]
    stack.click(second, "approve", user="UANN")
    done(stack, channel, ts, marker, "second done")
    assert [c["arguments"]["text"] for c in desk_calls(desk_log, "comment")] == ["one", "two"]


def test_a_tool_always_ask_lists_asks_on_every_call_and_a_deny_still_wins(
    stack: Stack, desk_log: Path
) -> None:
    marker = "aaglob"
    channel, ts = ask(
        stack,
        marker,
        reply(
            tool_use("desk__close_ticket", {"id": "T-2", "reason": "fixed"}),
            tool_use("desk__delete_ticket", {"id": "T-3"}),
        ),
        reply(text(f"{marker} first done")),
        reply(tool_use("desk__close_ticket", {"id": "T-4", "reason": "dup"})),
        reply(text(f"{marker} second done")),
    )
    card = open_card(stack, channel, ts)
    stack.settled()
    assert len(cards(stack, channel, ts)) == 1  # the denied call gets no card
    assert "desk__close_ticket" in card["text"] and "approve_thread" not in action_ids(card)
    assert "lists it in always_ask" in shown(card) and "desk__close_*" in shown(card)
    stack.click(card, "approve", user="UANN")
    done(stack, channel, ts, marker, "first done")
    assert [c["arguments"]["id"] for c in desk_calls(desk_log, "close_ticket")] == ["T-2"]
    assert desk_calls(desk_log, "delete_ticket") == []  # denied: never reached the server

    stack.mention("again", channel=channel, thread_ts=ts)
    second = open_card(stack, channel, ts, besides=(card["ts"],))
    stack.settled()
    assert [c["arguments"]["id"] for c in desk_calls(desk_log, "close_ticket")] == ["T-2"]
    stack.click(second, "approve", user="UANN")
    done(stack, channel, ts, marker, "second done")


def batch_message(stack: Stack, channel: str, ts: str) -> dict[str, Any]:
    return wait_until(
        lambda: next((m for m in thread(stack, channel, ts) if "approve_all" in action_ids(m)), None)
    )


def test_approve_all_leaves_a_call_that_always_asks_open_and_says_so(stack: Stack, desk_log: Path) -> None:
    marker = "aaall"
    (stack.workspace / "old-aaall.md").write_text("old")
    channel, ts = ask(
        stack,
        marker,
        reply(
            tool_use("desk__comment", {"id": "T-5", "text": "batch"}),
            tool_use("delete_file", {"path": "old-aaall.md"}),
        ),
        reply(text(f"{marker} done")),
    )
    wait_until(lambda: len(cards(stack, channel, ts)) == 2)
    comment, delete = cards(stack, channel, ts)
    batch = batch_message(stack, channel, ts)
    [line] = [part for part in shown(batch).split("\\n") if "desk__comment" in part]
    assert "approve it on its own card" in line

    stack.click(batch, "approve_all", user="UANN")
    wait_until(lambda: any("Left open: desk__comment" in t for t in replies_to(stack, "UANN", channel)))
    wait_until(lambda: not has_actions(now(stack, channel, delete)))
    stack.settled()
    assert has_actions(now(stack, channel, comment))  # still open: a person approves it on its card
    assert not any(c["arguments"]["text"] == "batch" for c in desk_calls(desk_log, "comment"))
    assert (stack.workspace / "old-aaall.md").exists()  # the run waits for the open call

    stack.click(comment, "approve", user="UANN")
    done(stack, channel, ts, marker)
    assert any(c["arguments"]["text"] == "batch" for c in desk_calls(desk_log, "comment"))
    assert not (stack.workspace / "old-aaall.md").exists()


def hang_up_and_wait(stack: Stack) -> None:
    counts = [p.output().count("config reloaded from") for p in stack.processes]
    for process in stack.processes:
        process.proc.send_signal(signal.SIGHUP)
    wait_until(
        lambda: all(
            p.output().count("config reloaded from") > n for p, n in zip(stack.processes, counts, strict=True)
        )
    )


def test_a_grant_given_before_a_reload_added_always_ask_covers_no_later_call(
    stack: Stack, desk_log: Path
) -> None:
    marker = "aareload"
    channel, ts = ask(
        stack,
        marker,
        reply(tool_use("write_file", {"path": "aareload-1.txt", "content": "1"})),
        reply(text(f"{marker} first done")),
        reply(tool_use("write_file", {"path": "aareload-2.txt", "content": "2"})),
        reply(text(f"{marker} second done")),
    )
    card = open_card(stack, channel, ts)
    stack.click(card, "approve_thread", user="UANN")
    done(stack, channel, ts, marker, "first done")
    assert grant_keys(stack, channel)

    (stack.workdir / "harness.toml").write_text(config(desk_log, more=', "write_file"'), encoding="utf-8")
    try:
        hang_up_and_wait(stack)
        stack.mention("and the second", channel=channel, thread_ts=ts)
        second = open_card(stack, channel, ts, besides=(card["ts"],))
        stack.settled()
        assert grant_keys(stack, channel)  # the grant still stands, and covers nothing now
        assert not (stack.workspace / "aareload-2.txt").exists()
        assert "approve_thread" not in action_ids(second) and "lists it in always_ask" in shown(second)
        stack.click(second, "approve", user="UANN")
        done(stack, channel, ts, marker, "second done")
        assert (stack.workspace / "aareload-2.txt").read_text() == "2"
    finally:
        (stack.workdir / "harness.toml").write_text(config(desk_log), encoding="utf-8")
        hang_up_and_wait(stack)
