"""Approvers computed at the click, end to end: a mention, a real `python -m workers` parking a
`write_file` call, its card, and the example callable `gates.codeowners:may_approve` asked in the
real bot at each click, against the workspace's CODEOWNERS and a people file.

Ben (an approver, not an owner of docs/) is refused and the run stays parked; Ann (owner of docs/)
approves: the card shows the callable's answer and reason, the file is written, and the audit
entry carries the answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from store import Grant, Store
from tests.fakes.messages_api import reply, text, tool_use
from tests.stack import RedisServer, Stack, has_actions, running_stack, wait_post, wait_until

pytestmark = pytest.mark.e2e

DB = 15
CONFIG = """
[approvals]
approvers = ["UANN", "UBEN"]
grant_minutes = 30
[approvals.approvers_from_tools]
write_file = "gates.codeowners:may_approve"
[limits]
max_runs_per_user = 1000
max_runs_per_channel = 1000
"""
PEOPLE = '[users]\nUANN = "@ann"\nUBEN = "@ben"\n'
CODEOWNERS = "*  @ben\n/docs/  @ann\n"


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("approvers-from-e2e")
    people = workdir / "people.toml"
    people.write_text(PEOPLE)
    env = {"CODEOWNERS_PEOPLE": str(people)}
    for running in running_stack(redis_server, workdir, CONFIG, DB, extra_env=env):
        (running.workspace / ".github").mkdir(exist_ok=True)
        (running.workspace / ".github" / "CODEOWNERS").write_text(CODEOWNERS)
        (running.workspace / "docs").mkdir(exist_ok=True)
        yield running


def shown(message: dict[str, Any]) -> str:
    return message["text"] + json.dumps(message["blocks"], ensure_ascii=False)


def action_ids(message: dict[str, Any]) -> set[str]:
    return {
        e["action_id"] for b in message.get("blocks") or [] if b["type"] == "actions" for e in b["elements"]
    }


def test_only_a_code_owner_s_approval_runs_the_write_and_the_card_says_why(stack: Stack) -> None:
    channel = "C4400"
    stack.model.script_for(
        "owners",
        reply(tool_use("write_file", {"path": "docs/plan.md", "content": "# Plan\n"})),
        reply(text("owners done")),
    )
    status, ts, _ = stack.mention("owners: write the plan", channel=channel, user="UALICE")
    assert status == 200
    card = wait_post(stack, channel, ts, lambda m: "approve" in action_ids(m))
    assert "Checked at each approval:" in shown(card) and "gates.codeowners:may_approve" in shown(card)
    assert not {"approve_thread", "approve_dir"} & action_ids(card)  # no grant for its tool
    run_id = card_value(card).split(":")[0]

    assert stack.click(card, "approve", user="UBEN") == 200  # an approver, but docs/ is Ann's
    wait_until(lambda: any("@ann" in e["text"] and e["user"] == "UBEN" for e in stack.slack.ephemerals))
    store = Store(redis.Redis.from_url(stack.redis_url))
    record = store.runs.load(run_id)
    assert record is not None and record.status.value == "awaiting_approval"  # still parked
    assert store.parks.decisions(run_id, record.park_id) == {card_value(card).split(":")[1]: None}
    assert not (stack.workspace / "docs" / "plan.md").exists()

    assert stack.click(card, "approve", user="UANN") == 200
    decided = wait_until(lambda: decided_card(stack, channel, card["ts"]))
    assert "answered yes for <@UANN>: @ann owns every path (CODEOWNERS line 2)" in shown(decided)
    wait_post(stack, channel, ts, lambda m: "owners done" in m["text"])
    assert (stack.workspace / "docs" / "plan.md").read_text() == "# Plan\n"
    entries = [e for e in store.audit.entries(count=1000) if e.get("run_id") == run_id]
    assert [e["verdict"] for e in entries] == ["approval_refused", "approved"]
    assert entries[0]["by"] == "UBEN" and entries[0]["approvers_from"]["answer"] == "no"
    assert entries[1]["approvers_from"] == {
        "function": "gates.codeowners:may_approve",
        "answer": "yes",
        "reason": "@ann owns every path (CODEOWNERS line 2)",
    }


def card_value(card: dict[str, Any]) -> str:
    """`run:call:fingerprint`, as the card's Approve button carries it."""
    return str(
        next(
            e["value"]
            for b in card["blocks"]
            if b["type"] == "actions"
            for e in b["elements"]
            if e["action_id"] == "approve"
        )
    )


def decided_card(stack: Stack, channel: str, card_ts: str) -> dict[str, Any] | None:
    message = next((m for m in stack.slack.messages(channel) if m["ts"] == card_ts), None)
    return message if message is not None and not has_actions(message) else None


def test_a_grant_standing_in_the_thread_does_not_cover_a_tool_the_callable_decides(stack: Stack) -> None:
    """A grant given before a reload named the callable (here: written by hand) covers no call of
    that tool: the worker asks with a card, so only a click (and the callable) can approve it."""
    channel = "C4401"
    ts = stack.slack.add_message(channel, "<@UBOT> granted: write", user="UALICE")
    grant = Grant.given("T1", channel, ts, "write_file", "UANN", "UALICE", time.time() + 600, "r-earlier")
    conn = redis.Redis.from_url(stack.redis_url)
    conn.set(grant.key, json.dumps(grant.to_json()), ex=600)
    stack.model.script_for(
        "granted",
        reply(tool_use("write_file", {"path": "docs/granted.md", "content": "x"})),
        reply(text("granted done")),
    )
    status, _, _ = stack.mention("granted: write", channel=channel, user="UALICE", ts=ts)
    assert status == 200
    card = wait_post(stack, channel, ts, lambda m: "approve" in action_ids(m))
    assert "ran under" not in shown(card) and not (stack.workspace / "docs" / "granted.md").exists()
    assert Store(conn).grants.grant("T1", channel, ts, "write_file") is not None  # there, unused
