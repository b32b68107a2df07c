"""Grants that fit, end to end (real bot, worker and Redis; loopback Slack and model): a grant
scoped to a directory runs calls inside it without a card and asks for the rest (`docs/../x`
included), a grant limited in uses runs out and asks, and Revoke ends it at once.

Issue 30: a grant reads every value, not names. The tools of `scope_tools` (an operator's module,
its paths marked in their schemas) carry paths in a second argument, nested in an object, in a
list, or in an argument not marked: a grant under `docs/` covers a call only when every path lies
inside it, and a call with a path the policy cannot place is offered no grant at all."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from store import Store
from tests.e2e.test_approvals import (
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
from tests.fakes.messages_api import reply, text, tool_use
from tests.stack import ROOT, RedisServer, Stack, has_actions, running_stack, thread, wait_post, wait_until

DB = 15  # other stacks: see tests/e2e/test_groups_escalation_home.py; 9-11 test_approvals, 14 rules
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
[tools]
modules = ["scope_tools"]
"""
# Each call that runs is one line of `ran.log` in the workspace: what reached the tool.
TOOLS = """
    from __future__ import annotations

    import json
    from typing import Annotated, Any

    from pydantic import Field

    from harness.tools import ToolContext, tool

    Path = Annotated[str, Field(description="A path in the workspace", json_schema_extra={"format": "path"})]
    Dest = Annotated[str, Field(description="Where to", json_schema_extra={"x-path": True})]


    def _ran(ctx: ToolContext, name: str, args: dict[str, Any]) -> str:
        with (ctx.workspace / "ran.log").open("a", encoding="utf-8") as log:
            log.write(json.dumps({"tool": name, **args}) + "\\n")
        return f"{name} done"


    @tool()
    def copy(ctx: ToolContext, path: Path, destination: Dest) -> str:
        \"\"\"Copy a file.\"\"\"
        return _ran(ctx, "copy", {"path": path, "destination": destination})


    @tool()
    def transfer(ctx: ToolContext, path: Path, options: dict[str, Any]) -> str:
        \"\"\"Transfer a file, with options.\"\"\"
        return _ran(ctx, "transfer", {"path": path, "options": options})


    @tool()
    def read_many(ctx: ToolContext, paths: list[Path]) -> str:
        \"\"\"Read several files.\"\"\"
        return _ran(ctx, "read_many", {"paths": paths})


    @tool()
    def publish(ctx: ToolContext, path: Path, note: str) -> str:
        \"\"\"Publish a file with a note.\"\"\"
        return _ran(ctx, "publish", {"path": path, "note": note})
"""


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Approvers UALICE, UANN, UBEN; grants of 30 minutes and at most 2 calls; docs/private/ denied;
    the tools of `scope_tools` offered."""
    modules = tmp_path_factory.mktemp("modules")
    (modules / "scope_tools.py").write_text(textwrap.dedent(TOOLS), encoding="utf-8")
    env = {"PYTHONPATH": f"{ROOT}:{modules}"}
    yield from running_stack(redis_server, tmp_path_factory.mktemp("grants"), CONFIG, DB, extra_env=env)


def grant_keys(stack: Stack) -> list[str]:
    found: list[bytes] = redis.Redis.from_url(stack.redis_url).keys("harness:grant:*")  # type: ignore[assignment]
    return sorted(k.decode() for k in found)


def entries_about(stack: Stack, needle: str) -> list[dict[str, Any]]:
    return [e for e in Store(redis.Redis.from_url(stack.redis_url)).audit.entries(10_000) if needle in str(e)]


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


# --- issue 30: every value, not names -------------------------------------------------------------


def park_calls(
    stack: Stack, marker: str, calls: list[tuple[str, dict[str, Any]]], then: list[Any]
) -> tuple[str, str, list[dict[str, Any]]]:
    """UALICE asks for `calls` (one reply): the channel, the mention's ts and the cards."""
    channel = new_channel()
    stack.model.script_for(marker, reply(*[tool_use(name, args) for name, args in calls]), *then)
    status, ts, _ = stack.mention(f"{marker}: please", channel=channel, user="UALICE")
    assert status == 200
    wait_until(lambda: len(cards(stack, channel, ts)) == len(calls))
    return channel, ts, cards(stack, channel, ts)


def button_text(card: dict[str, Any], action_id: str) -> str:
    return str(
        next(
            e["text"]["text"]
            for b in card["blocks"]
            if b["type"] == "actions"
            for e in b["elements"]
            if e["action_id"] == action_id
        )
    )


def ran(stack: Stack) -> list[dict[str, Any]]:
    """Every call that reached a tool of `scope_tools`."""
    log = stack.workspace / "ran.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def granted_then_asked(
    stack: Stack,
    marker: str,
    first: tuple[str, dict[str, Any]],
    inside: dict[str, Any],
    outside: list[dict[str, Any]],
) -> None:
    """`first` approved under `docs/`; a later call `inside` runs without a card; each of `outside`
    gets a card of its own, is declined, and never reaches the tool."""
    tool = first[0]
    channel, ts, [card] = park_calls(
        stack,
        marker,
        [first],
        then=[
            reply(text(f"{marker} first done")),
            reply(tool_use(tool, inside)),
            reply(text(f"{marker} inside done")),
            reply(*[tool_use(tool, args) for args in outside]),
            reply(text(f"{marker} outside done")),
        ],
    )
    assert "under docs/" in button_text(card, "approve_dir")
    stack.click(card, "approve_dir", user="UANN")
    done(stack, channel, ts, marker, "first done")
    wait_post(stack, channel, ts, lambda m: "revoke_grant" in action_ids(m))

    before = len(cards(stack, channel, ts))
    stack.mention("and inside", channel=channel, thread_ts=ts, user="UALICE")
    done(stack, channel, ts, marker, "inside done")
    assert {"tool": tool, **inside} in ran(stack)
    stack.settled()
    assert len(cards(stack, channel, ts)) == before  # the grant let it run

    stack.mention("and outside", channel=channel, thread_ts=ts, user="UALICE")
    wait_until(lambda: len(cards(stack, channel, ts)) == before + len(outside))
    stack.settled()
    asking = cards(stack, channel, ts)[before:]
    assert all(has_actions(now(stack, channel, m)) for m in asking)
    reached = [{"tool": tool, **args} for args in outside]
    assert not [r for r in ran(stack) if r in reached]
    for card_out in asking:
        stack.click(card_out, "decline")
    done(stack, channel, ts, marker, "outside done")
    assert not [r for r in ran(stack) if r in reached]


def test_a_copy_approved_under_docs_asks_for_a_destination_outside_it(stack: Stack) -> None:
    granted_then_asked(
        stack,
        "scopecopy",
        ("copy", {"path": "docs/a.md", "destination": "docs/b.md"}),
        {"path": "docs/e.md", "destination": "docs/sub/f.md"},
        [
            {"path": "docs/c.md", "destination": "/etc/cron.d/evil"},
            {"path": "docs/d.md", "destination": "../../home/alice/.ssh/authorized_keys"},
        ],
    )


def test_a_grant_under_docs_asks_for_a_path_nested_in_another_argument(stack: Stack) -> None:
    granted_then_asked(
        stack,
        "scopenested",
        ("transfer", {"path": "docs/a.md", "options": {"mode": "fast"}}),
        {"path": "docs/b.md", "options": {"mode": "slow"}},
        [{"path": "docs/c.md", "options": {"dest": "/etc/x"}}],
    )


def test_a_grant_under_docs_asks_for_a_list_with_one_path_outside_it(stack: Stack) -> None:
    granted_then_asked(
        stack,
        "scopelist",
        ("read_many", {"paths": ["docs/a.md", "docs/sub/b.md"]}),
        {"paths": ["docs/c.md"]},
        [{"paths": ["docs/d.md", "../../etc/passwd"]}, {"paths": ["docs/e.md", "~/.ssh/id_ed25519"]}],
    )


def test_a_call_with_a_path_the_policy_cannot_place_gets_no_scoped_grant_nor_is_covered(stack: Stack) -> None:
    marker = "scopeunplaced"
    channel, ts, [card] = park_calls(
        stack,
        marker,
        [("publish", {"path": "docs/a.md", "note": "hello"})],
        then=[
            reply(text(f"{marker} first done")),
            reply(tool_use("publish", {"path": "docs/b.md", "note": "and mirror it to /etc/cron.d/evil"})),
            reply(text(f"{marker} second done")),
        ],
    )
    stack.click(card, "approve_dir", user="UANN")  # `note` holds no path here: a grant under docs/
    done(stack, channel, ts, marker, "first done")
    wait_post(stack, channel, ts, lambda m: "revoke_grant" in action_ids(m))
    before = grant_keys(stack)

    stack.mention("and b", channel=channel, thread_ts=ts, user="UALICE")
    asking = wait_post(stack, channel, ts, lambda m: is_card(m) and "docs/b.md" in shown(m))
    assert "approve_thread" in action_ids(asking) and "approve_dir" not in action_ids(asking)
    value = next(
        e["value"]
        for b in asking["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["action_id"] == "approve"
    )
    status, _ = stack.click_value(asking, "approve_dir", value, user="UANN")  # forged: no such button
    assert status == 200
    wait_until(
        lambda: any("no directory" in e["text"] for e in stack.slack.ephemerals if e["user"] == "UANN")
    )
    stack.settled()
    assert grant_keys(stack) == before and has_actions(now(stack, channel, asking))
    assert not [r for r in ran(stack) if (r["tool"], r.get("path")) == ("publish", "docs/b.md")]
    stack.click(asking, "decline")
    done(stack, channel, ts, marker, "second done")
    assert not [r for r in ran(stack) if (r["tool"], r.get("path")) == ("publish", "docs/b.md")]


_ = new_channel  # the channels come from the same counter as test_approvals's
