"""Approve all / Decline all, end to end: signed HTTP into the real bot (`python -m bot`), a real
`python -m workers`, real Redis, the loopback Slack and model.

A park of two or more calls posts one batch message beside its cards; a click decides every call
still open that the clicker may decide, as their own decision of each (quorum and four eyes per
call), then resumes the run once. One stack: channels of the profile `quorum` need two approvals
and refuse the requester's approval.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from messages import texts
from tests.e2e.test_approvals import (
    action_ids,
    asked,
    audit,
    call_id,
    cards,
    done,
    final,
    now,
    replies_to,
    shown,
    wait_reply,
)
from tests.fakes.messages_api import reply, text, tool_use
from tests.stack import RedisServer, Stack, has_actions, running_stack, thread, wait_post, wait_until

pytestmark = pytest.mark.e2e

DB = 12  # other stacks: see tests/e2e/test_groups_escalation_home.py and tests/e2e/test_approvals.py
QUORUM_CHANNELS = [f"C15{i:02d}" for i in range(10)]
BRIEF_CHANNELS = [f"C16{i:02d}" for i in range(10)]
CONFIG = f"""
[limits]
max_runs_per_user = 1000
max_runs_per_channel = 1000

[approvals]
approvers = ["UALICE", "UANN", "UBEN", "UCAROL"]

[[profiles]]
name = "quorum"
channels = {QUORUM_CHANNELS!r}
[profiles.approvals]
approvers = ["UALICE", "UANN", "UBEN"]
required = 2
self_approval = false

[[profiles]]
name = "brief"
channels = {BRIEF_CHANNELS!r}
[profiles.approvals]
expire_after_minutes = 0.1
""".replace("'", '"')
_channels = itertools.count(1400)
_quorum_channels = iter(QUORUM_CHANNELS)
_brief_channels = iter(BRIEF_CHANNELS)


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from running_stack(redis_server, tmp_path_factory.mktemp("batches"), CONFIG, DB)


def is_batch(message: dict[str, Any]) -> bool:
    return "approve_all" in action_ids(message)


def park(
    stack: Stack, marker: str, paths: list[str], *, quorum: bool = False, brief: bool = False
) -> tuple[str, str, list[dict[str, Any]], dict[str, Any] | None]:
    """UALICE asks for one write per path in one reply: the channel, the mention's ts, the cards in
    the model's order, and the batch message (None when there is none, once the cards are out)."""
    channel = next(_quorum_channels) if quorum else next(_brief_channels) if brief else f"C{next(_channels)}"
    calls = [tool_use("write_file", {"path": p, "content": f"{marker} {p}"}) for p in paths]
    stack.model.script_for(marker, reply(text("Writing."), *calls), reply(text(f"{marker} done")))
    status, ts, _ = stack.mention(f"{marker}: please write", channel=channel, user="UALICE")
    assert status == 200
    wait_until(lambda: len(cards(stack, channel, ts)) == len(paths))
    if len(paths) > 1:
        batch = wait_post(stack, channel, ts, is_batch)
    else:
        stack.settled()
        batch = next((m for m in thread(stack, channel, ts) if is_batch(m)), None)
    return channel, ts, cards(stack, channel, ts), batch


def ran(stack: Stack, path: str) -> str | None:
    file = stack.workspace / path
    return file.read_text() if file.exists() else None


def results_of(stack: Stack, marker: str) -> list[str]:
    """The tool_use ids answered in the resumed request, in the order the results were given."""
    resumed = asked(stack, marker)[-1]
    return [
        b["tool_use_id"]
        for m in resumed["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]


def test_approve_all_runs_every_call_in_the_models_order_in_one_resume(stack: Stack) -> None:
    marker = "batchyes"
    paths = ["b-one.txt", "b-two.txt", "b-three.txt"]
    channel, ts, [c1, c2, c3], batch = park(stack, marker, paths)
    assert batch is not None and {"approve_all", "decline_all"} <= action_ids(batch)
    assert "3 calls" in shown(batch) and all(p in shown(batch) for p in paths)

    assert stack.click(batch, "approve_all", user="UANN") == 200
    done(stack, channel, ts, marker)
    stack.settled()
    assert [ran(stack, p) for p in paths] == [f"{marker} {p}" for p in paths]
    assert len(asked(stack, marker)) == 2  # one resume
    ids = [call_id(c) for c in (c1, c2, c3)]
    assert results_of(stack, marker) == ids  # answered in the model's order
    for card, call in zip((c1, c2, c3), ids, strict=True):
        decided = now(stack, channel, card)
        assert not has_actions(decided) and "Approved" in shown(decided) and "<@UANN>" in shown(decided)
        [entry] = final(audit(stack, call))
        assert entry["verdict"] == "approved" and entry["by"] == "UANN"
    closed = now(stack, channel, batch)
    assert not has_actions(closed) and "3 approved" in shown(closed) and "<@UANN>" in shown(closed)
    assert replies_to(stack, "UANN", channel) == []  # a click that decided needs no reply

    stack.click_value(batch, "approve_all", batch_value(batch), user="UBEN", block_id="batch")
    wait_reply(stack, "UBEN", channel, "no longer waiting")  # a late click of the old buttons


def batch_value(batch: dict[str, Any]) -> str:
    return next(
        e["value"] for b in batch["blocks"] if b["type"] == "actions" for e in b["elements"] if "value" in e
    )


def test_decline_all_declines_every_open_call_and_runs_none(stack: Stack) -> None:
    marker = "batchno"
    paths = ["n-one.txt", "n-two.txt"]
    channel, ts, [c1, c2], batch = park(stack, marker, paths)
    assert batch is not None
    assert stack.click(c1, "approve", user="UCAROL") == 200  # one call decided on its card first
    wait_until(lambda: not has_actions(now(stack, channel, c1)))
    assert stack.click(batch, "decline_all", user="UBEN") == 200
    done(stack, channel, ts, marker)
    stack.settled()
    assert ran(stack, "n-one.txt") == f"{marker} n-one.txt" and ran(stack, "n-two.txt") is None
    assert [e["by"] for e in final(audit(stack, call_id(c1)))] == ["UCAROL"]
    [declined] = final(audit(stack, call_id(c2)))
    assert declined["verdict"] == "declined" and declined["by"] == "UBEN"
    assert "Declined" in shown(now(stack, channel, c2)) and "<@UBEN>" in shown(now(stack, channel, c2))
    closed = now(stack, channel, batch)
    assert not has_actions(closed) and "1 approved" in shown(closed) and "1 declined" in shown(closed)
    assert len(asked(stack, marker)) == 2


def test_a_one_call_park_has_no_batch_message(stack: Stack) -> None:
    marker = "batchone"
    channel, ts, [card], batch = park(stack, marker, ["one-only.txt"])
    assert batch is None
    assert stack.click(card, "decline", user="UANN") == 200
    done(stack, channel, ts, marker)


def test_a_batch_click_by_someone_not_allowed_or_forged_changes_nothing(stack: Stack) -> None:
    marker = "batchstranger"
    channel, ts, [c1, c2], batch = park(stack, marker, ["s-one.txt", "s-two.txt"])
    assert batch is not None
    assert stack.click(batch, "approve_all", user="UZED") == 200
    wait_reply(stack, "UZED", channel, "may decide")
    run_id = batch_value(batch).split(":")[0]
    for forged in (f"{run_id}:99", f"{run_id}:x", "nope", f"{run_id}:1:2"):
        stack.click_value(batch, "approve_all", forged, user="UANN", block_id="batch")
    wait_until(lambda: len(replies_to(stack, "UANN", channel)) == 4)
    stack.settled()
    assert has_actions(now(stack, channel, batch)) and has_actions(now(stack, channel, c1))
    assert audit(stack, call_id(c1)) == [] and audit(stack, call_id(c2)) == []
    assert len(asked(stack, marker)) == 1
    assert stack.click(batch, "decline_all", user="UANN") == 200
    done(stack, channel, ts, marker)


def test_approve_all_does_not_approve_a_call_too_large_to_review(stack: Stack) -> None:
    marker = "batchhuge"
    channel = f"C{next(_channels)}"
    huge = "".join(f"line {i:06d} of notes nobody reads in full\n" for i in range(8000))
    calls = [
        tool_use("write_file", {"path": "h-small.txt", "content": "small"}),
        tool_use("write_file", {"path": "h-huge.txt", "content": huge}),
    ]
    stack.model.script_for(marker, reply(*calls), reply(text(f"{marker} done")))
    status, ts, _ = stack.mention(f"{marker}: please write", channel=channel, user="UALICE")
    assert status == 200
    wait_until(lambda: len(cards(stack, channel, ts)) == 2)
    batch = wait_post(stack, channel, ts, is_batch)
    small, large = cards(stack, channel, ts)
    assert stack.click(batch, "approve_all", user="UANN") == 200
    wait_reply(stack, "UANN", channel, "too large to review")
    stack.settled()
    assert [e["verdict"] for e in final(audit(stack, call_id(small)))] == ["approved"]
    assert audit(stack, call_id(large)) == [] and has_actions(now(stack, channel, large))
    assert ran(stack, "h-small.txt") is None and len(asked(stack, marker)) == 1  # still parked
    assert stack.click(batch, "decline_all", user="UANN") == 200  # declines what is still open
    done(stack, channel, ts, marker)
    assert ran(stack, "h-small.txt") == "small" and ran(stack, "h-huge.txt") is None
    assert [e["verdict"] for e in final(audit(stack, call_id(large)))] == ["declined"]


@pytest.mark.parametrize("round_", range(3))
def test_a_batch_click_racing_single_clicks_decides_every_call_once(stack: Stack, round_: int) -> None:
    marker = f"batchrace{round_}"
    paths = [f"race{round_}-{i}.txt" for i in range(3)]
    channel, ts, calls, batch = park(stack, marker, paths)
    assert batch is not None
    clicks: list[tuple[dict[str, Any], str, str]] = [
        (batch, "approve_all", "UANN"),
        (batch, "decline_all", "UCAROL"),
        (calls[0], "decline", "UBEN"),
        (calls[1], "approve", "UBEN"),
        (calls[2], "approve", "UALICE"),
        (calls[(round_ + 1) % 3], "decline", "UALICE"),
    ]
    clicks = clicks[round_:] + clicks[:round_]
    barrier = threading.Barrier(len(clicks))
    statuses: list[int] = []

    def click(message: dict[str, Any], action: str, user: str) -> None:
        barrier.wait()
        statuses.append(stack.click(message, action, user=user))

    threads = [threading.Thread(target=click, args=c) for c in clicks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200] * len(clicks)
    done(stack, channel, ts, marker)
    stack.settled()
    assert len(asked(stack, marker)) == 2  # resumed once
    ids = [call_id(c) for c in calls]
    assert results_of(stack, marker) == ids  # each call answered once, in order
    for path, card, call in zip(paths, calls, ids, strict=True):
        [entry] = final(audit(stack, call))  # decided exactly once
        assert (ran(stack, path) is not None) == (entry["verdict"] == "approved")
        decided = now(stack, channel, card)
        assert not has_actions(decided) and f"<@{entry['by']}>" in shown(decided)
    assert not has_actions(now(stack, channel, batch))


def test_approve_all_counts_one_vote_per_call_under_a_quorum(stack: Stack) -> None:
    marker = "batchquorum"
    paths = ["q-one.txt", "q-two.txt"]
    channel, ts, [c1, c2], batch = park(stack, marker, paths, quorum=True)
    assert batch is not None

    assert stack.click(batch, "approve_all", user="UALICE") == 200  # the requester: four eyes
    wait_reply(stack, "UALICE", channel, "someone else must approve")
    stack.click(batch, "approve_all", user="UANN")
    wait_reply(stack, "UANN", channel, "counts on 2")
    wait_until(lambda: all("1 of 2" in shown(now(stack, channel, c)) for c in (c1, c2)))
    stack.click(batch, "approve_all", user="UANN")  # the same person again counts once
    wait_reply(stack, "UANN", channel, "already counts")
    stack.settled()
    assert ran(stack, "q-one.txt") is None and len(asked(stack, marker)) == 1
    assert has_actions(now(stack, channel, batch))

    stack.click(batch, "approve_all", user="UBEN")
    done(stack, channel, ts, marker)
    stack.settled()
    assert [ran(stack, p) for p in paths] == [f"{marker} {p}" for p in paths]
    for card in (c1, c2):
        entries = audit(stack, call_id(card))
        assert [e["verdict"] for e in entries] == ["approval_counted", "approved"]
        assert entries[0]["by"] == "UANN" and entries[1]["approvers"] == ["UANN", "UBEN"]
        assert not has_actions(now(stack, channel, card))
    closed = now(stack, channel, batch)
    assert not has_actions(closed) and "<@UANN>" in shown(closed) and "<@UBEN>" in shown(closed)


def test_the_requesters_decline_all_counts_without_self_approval(stack: Stack) -> None:
    marker = "batchselfno"
    channel, ts, [c1, c2], batch = park(stack, marker, ["sn-one.txt", "sn-two.txt"], quorum=True)
    assert batch is not None
    assert stack.click(batch, "decline_all", user="UALICE") == 200
    done(stack, channel, ts, marker)
    assert ran(stack, "sn-one.txt") is None and ran(stack, "sn-two.txt") is None
    for card in (c1, c2):
        [entry] = final(audit(stack, call_id(card)))
        assert entry["verdict"] == "declined" and entry["by"] == "UALICE"
    assert "2 declined" in shown(now(stack, channel, batch))


def test_a_batch_whose_park_expired_shows_it_and_a_late_click_changes_nothing(stack: Stack) -> None:
    marker = "batchexpired"
    channel, ts, [c1, c2], batch = park(stack, marker, ["e-one.txt", "e-two.txt"], brief=True)
    assert batch is not None
    wait_until(lambda: not has_actions(now(stack, channel, batch)), timeout=30)
    done(stack, channel, ts, marker)
    stack.settled()
    assert "2 expired" in shown(now(stack, channel, batch))
    stack.click_value(batch, "approve_all", batch_value(batch), user="UANN", block_id="batch")
    wait_reply(stack, "UANN", channel, "no longer waiting")
    stack.settled()
    assert ran(stack, "e-one.txt") is None and ran(stack, "e-two.txt") is None
    for card in (c1, c2):
        assert [e["verdict"] for e in final(audit(stack, call_id(card)))] == ["expired"]
    assert len(asked(stack, marker)) == 2


def test_texts_used_above_are_the_bots() -> None:
    assert "someone else must approve" in texts.NO_SELF_APPROVAL
    assert "no longer waiting" in texts.BATCH_CLOSED
    assert "counts on {calls}" in texts.BATCH_COUNTED
    assert "already counts" in texts.BATCH_ALREADY_COUNTED
    assert "too large to review" in texts.BATCH_NOT_REVIEWABLE
    assert "may decide" in texts.NOT_ALLOWED
