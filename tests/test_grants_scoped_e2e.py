"""Grants that fit, end to end (real bot, worker and Redis; loopback Slack and model): a grant
scoped to a directory runs calls inside it without a card and asks for the rest (`docs/../x`
included), a grant limited in uses runs out and asks, and Revoke ends it at once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.fakes.messages_api import reply, text, tool_use
from tests.stack import RedisServer, Stack, has_actions, running_stack, thread, wait_post, wait_until
from tests.test_approvals_e2e import (
    action_ids,
    audit,
    call_id,
    cards,
    done,
    final,
    is_card,
    new_channel,
    now,
    park_writes,
    shown,
)
from workers.store import Store

DB = 15  # other stacks: see tests/test_groups_escalation_home.py; 9-11 test_approvals_e2e, 14 rules
CONFIG = """
[approvals]
approvers = ["UALICE", "UANN", "UBEN"]
grant_minutes = 30
grant_uses = 2
[[policy.rules]]
tool = "write_file"
args = { path = "docs/private/**" }
tier = "deny"
[limits]
max_runs_per_user = 1000
max_runs_per_channel = 1000
"""


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Approvers UALICE, UANN, UBEN; grants of 30 minutes and at most 2 calls; docs/private/ denied."""
    yield from running_stack(redis_server, tmp_path_factory.mktemp("grants"), CONFIG, DB)


def grant_keys(stack: Stack) -> list[str]:
    found: list[bytes] = redis.Redis.from_url(stack.redis_url).keys("harness:grant:*")  # type: ignore[assignment]
    return sorted(k.decode() for k in found)


def entries_about(stack: Stack, needle: str) -> list[dict[str, Any]]:
    return [e for e in Store(redis.Redis.from_url(stack.redis_url)).audit_entries(10_000) if needle in str(e)]


def summary_of(stack: Stack, channel: str, ts: str, path: str) -> dict[str, Any]:
    return wait_post(stack, channel, ts, lambda m: path in shown(m) and "Turn" in m["text"])


def test_a_grant_under_a_directory_runs_calls_inside_it_and_asks_for_the_rest(stack: Stack) -> None:
    marker = "scopedir"
    (stack.workspace / "docs").mkdir(exist_ok=True)
    channel, ts, [card] = park_writes(
        stack,
        marker,
        [{"path": "docs/a.txt", "content": "a"}],
        then=[
            reply(text(f"{marker} first done")),
            reply(tool_use("write_file", {"path": "docs/sub/b.txt", "content": "b"})),
            reply(text(f"{marker} inside done")),
            reply(
                tool_use("write_file", {"path": "docs/../secret.txt", "content": "s"}),
                tool_use("write_file", {"path": "other/c.txt", "content": "c"}),
            ),
            reply(text(f"{marker} outside done")),
        ],
    )
    assert {"approve_thread", "approve_dir"} <= action_ids(card)
    button = next(
        e
        for b in card["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["action_id"] == "approve_dir"
    )
    assert "docs/" in button["text"]["text"] and "write_file" in button["text"]["text"]
    stack.click(card, "approve_dir", user="UANN")
    done(stack, channel, ts, marker, "first done")
    assert (stack.workspace / "docs/a.txt").read_text() == "a"
    notice = wait_post(stack, channel, ts, lambda m: "revoke_grant" in action_ids(m))
    assert "docs/" in shown(notice) and "<@UANN>" in shown(notice) and "at most 2 calls" in shown(notice)
    assert "docs/" in shown(now(stack, channel, card)) and not has_actions(now(stack, channel, card))
    [given] = final(audit(stack, call_id(card)))
    assert given["grant"] == "given" and given["grant_dir"] == "docs/"

    # Inside the directory: runs without a card, and says whose grant and how many uses are left.
    before = len(cards(stack, channel, ts))
    stack.mention("and b", channel=channel, thread_ts=ts, user="UALICE")
    done(stack, channel, ts, marker, "inside done")
    assert (stack.workspace / "docs/sub/b.txt").read_text() == "b"
    summary = summary_of(stack, channel, ts, "docs/sub/b.txt")
    assert "ran under <@UANN>'s grant for" in shown(summary) and "(1 of 2 uses left)" in shown(summary)
    [used] = entries_about(stack, "docs/sub/b.txt")
    assert used["grant"] == "used" and used["by"] == "UANN" and used["grant_dir"] == "docs/"
    assert used["grant_left"] == 1 and used["grant_uses"] == 2
    stack.settled()
    assert len(cards(stack, channel, ts)) == before

    # `docs/../secret.txt` is `secret.txt`, outside; `other/` is outside: both ask.
    stack.mention("and the rest", channel=channel, thread_ts=ts, user="UALICE")
    wait_until(lambda: len(cards(stack, channel, ts)) == before + 2)
    stack.settled()
    assert not (stack.workspace / "secret.txt").exists() and not (stack.workspace / "other").exists()
    for asking in cards(stack, channel, ts)[before:]:
        stack.click(asking, "decline")
    done(stack, channel, ts, marker, "outside done")
    assert [e["verdict"] for e in final(entries_about(stack, "secret.txt"))] == ["declined"]


def test_a_grant_limited_in_uses_runs_out_then_calls_ask(stack: Stack) -> None:
    marker = "scopeuses"
    (stack.workspace / "notes").mkdir(exist_ok=True)
    channel, ts, [card] = park_writes(
        stack,
        marker,
        [{"path": "notes/1.txt", "content": "1"}],
        then=[
            reply(text(f"{marker} first done")),
            reply(
                *[tool_use("write_file", {"path": f"notes/{i}.txt", "content": str(i)}) for i in (2, 3, 4)]
            ),
            reply(text(f"{marker} second done")),
        ],
    )
    stack.click(card, "approve_thread", user="UBEN")  # the whole thread, limited in uses too
    done(stack, channel, ts, marker, "first done")
    notice = wait_post(stack, channel, ts, lambda m: "revoke_grant" in action_ids(m))
    assert "at most 2 calls" in shown(notice)

    stack.mention("three more", channel=channel, thread_ts=ts, user="UALICE")
    last = wait_post(stack, channel, ts, lambda m: is_card(m) and "notes/4.txt" in shown(m))
    stack.settled()  # the granted calls run with the turn, once its one card is decided
    assert [m for m in cards(stack, channel, ts) if has_actions(now(stack, channel, m))] == [last]
    stack.click(last, "approve", user="UBEN")
    done(stack, channel, ts, marker, "second done")
    for i in (2, 3, 4):
        assert (stack.workspace / f"notes/{i}.txt").read_text() == str(i)
    summary = summary_of(stack, channel, ts, "notes/3.txt")
    assert "(0 of 2 uses left)" in shown(summary) and "grant for this thread" in shown(summary)
    assert [e["grant_left"] for e in entries_about(stack, "notes/") if e.get("grant") == "used"] == [1, 0]


def test_revoke_ends_a_scoped_grant_at_once(stack: Stack) -> None:
    marker = "scoperevoke"
    (stack.workspace / "site").mkdir(exist_ok=True)
    channel, ts, [card] = park_writes(
        stack,
        marker,
        [{"path": "site/1.txt", "content": "1"}],
        then=[
            reply(text(f"{marker} first done")),
            reply(tool_use("write_file", {"path": "site/2.txt", "content": "2"})),
            reply(text(f"{marker} second done")),
        ],
    )
    stack.click(card, "approve_dir", user="UANN")
    done(stack, channel, ts, marker, "first done")
    notice = wait_post(stack, channel, ts, lambda m: "revoke_grant" in action_ids(m))
    mine = [k for k in grant_keys(stack) if ":dir:" in k]
    assert len(mine) >= 1

    assert stack.click(notice, "revoke_grant", user="UANN") == 200  # whoever granted it
    wait_until(lambda: not has_actions(now(stack, channel, notice)))
    assert "revoked by <@UANN>" in shown(now(stack, channel, notice)) and "site/" in shown(
        now(stack, channel, notice)
    )
    assert len([k for k in grant_keys(stack) if ":dir:" in k]) == len(mine) - 1

    stack.mention("and 2", channel=channel, thread_ts=ts, user="UALICE")
    again = wait_post(stack, channel, ts, lambda m: is_card(m) and "site/2.txt" in shown(m))
    stack.settled()
    assert not (stack.workspace / "site/2.txt").exists()
    stack.click(again, "decline")
    done(stack, channel, ts, marker, "second done")


def test_a_card_without_a_directory_offers_no_scoped_grant(stack: Stack) -> None:
    marker = "scopenone"
    channel, ts, [card] = park_writes(stack, marker, [{"path": "root.txt", "content": "r"}])
    assert "approve_thread" in action_ids(card) and "approve_dir" not in action_ids(card)
    stack.click(card, "decline")
    done(stack, channel, ts, marker)
    assert not [m for m in thread(stack, channel, ts) if "revoke_grant" in action_ids(m)]


def test_a_scoped_grant_never_lifts_deny_inside_its_directory(stack: Stack) -> None:
    marker = "scopedeny"
    (stack.workspace / "docs").mkdir(exist_ok=True)
    channel, ts, [card] = park_writes(
        stack,
        marker,
        [{"path": "docs/open.txt", "content": "o"}],
        then=[
            reply(text(f"{marker} first done")),
            reply(tool_use("write_file", {"path": "docs/private/key.txt", "content": "k"})),
            reply(text(f"{marker} deny done")),
        ],
    )
    stack.click(card, "approve_dir", user="UANN")
    done(stack, channel, ts, marker, "first done")
    wait_post(stack, channel, ts, lambda m: "revoke_grant" in action_ids(m))
    stack.mention("and the key", channel=channel, thread_ts=ts, user="UALICE")
    done(stack, channel, ts, marker, "deny done")
    assert not (stack.workspace / "docs/private").exists()
    assert not [e for e in entries_about(stack, "docs/private/key.txt") if e.get("grant")]
    grant = next(k for k in grant_keys(stack) if ":dir:" in k and channel in k)
    assert "taken" not in redis.Redis.from_url(stack.redis_url).get(grant).decode()  # no use spent


def test_a_scoped_grant_clicked_by_a_stranger_or_forged_on_a_root_path_changes_nothing(stack: Stack) -> None:
    marker = "scopeforged"
    (stack.workspace / "pub").mkdir(exist_ok=True)
    channel, ts, [card] = park_writes(stack, marker, [{"path": "pub/x.txt", "content": "x"}])
    before = grant_keys(stack)
    assert stack.click(card, "approve_dir", user="UMALLORY") == 200
    wait_until(
        lambda: any(
            "may decide this approval" in e["text"] for e in stack.slack.ephemerals if e["user"] == "UMALLORY"
        )
    )
    root_channel, root_ts, [root] = park_writes(stack, "rootforged", [{"path": "top.txt", "content": "t"}])
    value = next(
        e["value"]
        for b in root["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["action_id"] == "approve"
    )
    status, _ = stack.click_value(root, "approve_dir", value, user="UALICE")  # no such button on that card
    assert status == 200
    wait_until(
        lambda: any("no directory" in e["text"] for e in stack.slack.ephemerals if e["user"] == "UALICE")
    )
    stack.settled()
    assert grant_keys(stack) == before
    assert has_actions(now(stack, channel, card)) and has_actions(now(stack, root_channel, root))
    assert not (stack.workspace / "pub/x.txt").exists() and not (stack.workspace / "top.txt").exists()
    assert audit(stack, call_id(card)) == [] and audit(stack, call_id(root)) == []
    stack.click(card, "decline")
    stack.click(root, "decline")
    done(stack, channel, ts, marker)
    done(stack, root_channel, root_ts, "rootforged")


_ = new_channel  # the channels come from the same counter as test_approvals_e2e's
