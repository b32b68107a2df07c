"""Who may decide has one home, `gates.deciders`: the bot's clicks and Home tab and
`python -m workers status` all read it, so they can never disagree about a park. (Group
membership, read from Slack and cached, is tested through the bot in test_groups.py.)"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
import redis

from bot.listening import BotDeps
from gates.deciders import GroupDirectory, deciders, may_decide, named, self_approval_refused
from harness.config import Approvals, Config
from harness.policy import Tier
from harness.state import PendingCall, Status, new_run
from ops import status
from runtime.queue import make_queue
from store import RunRecord, RunStatus, Store, new_run_id, pack
from store.keys import Keys

EXPIRE = 60.0  # minutes a park stays open
ESCALATE = 10.0  # minutes after which escalate_to may decide too


def parked(conn: redis.Redis, minutes_ago: float) -> RunRecord:
    """A run of UALICE's parked `minutes_ago` on one write_file call, stored as a worker parks it."""
    call = PendingCall("toolu_1", "write_file", {"path": "a"}, Tier.ASK)
    state = replace(new_run("write a"), status=Status.AWAITING_APPROVAL, pending=(call,))
    expires_at = time.time() + (EXPIRE - minutes_ago) * 60
    record = RunRecord(
        new_run_id(),
        "T1",
        "C1",
        "1.2",
        "UALICE",
        "write a",
        status=RunStatus.AWAITING_APPROVAL,
        state=state.to_json(),
        park_id=1,
        expires_at=expires_at,
    )
    conn.set(Keys.run(record.run_id), pack(record.to_json()))
    conn.hset(Keys.approvals(record.run_id, 1), mapping={"toolu_1": "", "~expires": repr(expires_at)})
    conn.zadd(Keys.expiries(), {f"{record.run_id}:1": expires_at})
    return record


CASES = [
    ({}, 1, ["UALICE"]),  # nobody named: the requester decides
    ({"approvers": ("UANN", "S0OPS")}, 1, ["UANN", "S0OPS"]),
    ({"approvers": ("UANN",), "escalate_to": ("SLEADS", "UANN", "UBOSS")}, ESCALATE - 2, ["UANN"]),
    (
        {"approvers": ("UANN",), "escalate_to": ("SLEADS", "UANN", "UBOSS")},
        ESCALATE + 2,
        ["UANN", "SLEADS", "UBOSS"],
    ),
    ({"escalate_to": ("UBOSS",)}, ESCALATE + 2, ["UALICE", "UBOSS"]),
]


@pytest.mark.parametrize(("approvals", "minutes_ago", "expected"), CASES)
def test_the_bot_and_the_status_command_name_the_same_deciders(
    store: Store, conn: redis.Redis, approvals: dict[str, Any], minutes_ago: float, expected: list[str]
) -> None:
    escalating = {"escalate_after_minutes": ESCALATE} if "escalate_to" in approvals else {}
    config = Config(approvals=Approvals(expire_after_minutes=EXPIRE, **escalating, **approvals))
    record = parked(conn, minutes_ago)
    assert deciders(config.approvals, record) == expected
    assert BotDeps(store=store, queue=make_queue(conn), config=config).deciders(record) == expected
    line = next(line for line in status.report(store, config).splitlines() if record.run_id in line)
    assert line.endswith(f"must decide: {', '.join(expected)}")


def test_a_run_that_is_not_parked_is_never_escalated(conn: redis.Redis) -> None:
    approvals = Approvals(approvers=("UANN",), escalate_to=("UBOSS",), escalate_after_minutes=ESCALATE)
    record = parked(conn, ESCALATE + 2)
    assert deciders(approvals, replace(record, status=RunStatus.FAILED)) == ["UANN"]  # a Retry's deciders
    assert named(approvals, "UALICE") == ["UANN"] and named(Approvals(), "UALICE") == ["UALICE"]


def test_four_eyes_refuse_only_the_requester_and_only_without_self_approval(conn: redis.Redis) -> None:
    record = parked(conn, 1)
    assert not self_approval_refused(Approvals(), "UALICE", record)
    assert self_approval_refused(Approvals(self_approval=False), "UALICE", record)
    assert not self_approval_refused(Approvals(self_approval=False), "UANN", record)


@pytest.mark.parametrize("clicker", ["", "UANN ", " UANN", "UANN\n", "uann", "<@UANN>", "S0OPS", "UANN,UBOB"])
def test_only_a_well_formed_user_id_may_decide(store: Store, conn: redis.Redis, clicker: str) -> None:
    # A hostile payload's user field that merely contains a named id (or is a group's) decides nothing.
    approvals = Approvals(approvers=("UANN", "S0OPS", clicker))
    record = parked(conn, 1)
    assert not may_decide(clicker, record, approvals=approvals, groups=GroupDirectory(), store=store)
    assert may_decide("UANN", record, approvals=approvals, groups=GroupDirectory(), store=store)
