"""Answers to a server's question (`bot.listeners.inputs`): only the requester, only the question
the run waits on now, only while the channel's profile still lets them start work; a refused answer
records nothing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from slack_bolt import BoltContext

from bot.listeners.inputs import _answer, _opening
from bot.listening import REPLY, BotDeps, Clicker, open_click
from harness.config import Config, load_config
from harness.policy import Tier
from harness.state import PendingCall, Status, Verdict, new_run
from harness.tools.inputs import InputAsk, InputQuestion
from messages import texts
from runtime.queue import make_queue
from store import RunRecord, Store
from tests.bot.test_clicks import parked as parked_run

ALICE = Clicker("UALICE", "T1")  # the requester
BOB = Clicker("UBOB", "T1")
QUESTION = InputQuestion("q", "form", "Title?", {"type": "object", "properties": {"t": {"type": "string"}}})
ASK = InputAsk("rooms", (QUESTION,), "state")
CALL = PendingCall("toolu_1", "rooms__book", {"room": "4B"}, Tier.ALLOW, asking=ASK)


def parked(conn: redis.Redis) -> RunRecord:
    """A run of UALICE's in C1, parked (park 1) on its call's question, as a worker parks it."""
    state = replace(new_run("book it"), status=Status.AWAITING_APPROVAL, pending=(CALL,))
    return parked_run(conn, state=state.to_json())  # test_clicks' run, its state this one


def answer(deps: BotDeps, record: RunRecord, clicker: Clicker, question_id: str | None = None) -> BoltContext:
    context = BoltContext()
    value = f"{record.run_id}:{CALL.id}:{question_id or ASK.question_id(QUESTION)}"
    click = open_click(deps, _opening(deps), value, clicker, "C1", context)
    if click is not None:
        _answer(deps, click, Verdict.APPROVED, context, {"t": "x"})
    return context


@pytest.fixture
def deps(store: Store, conn: redis.Redis) -> BotDeps:
    return BotDeps(store=store, queue=make_queue(conn), config=Config())


def test_someone_else_cannot_answer(deps: BotDeps, conn: redis.Redis) -> None:
    record = parked(conn)
    context = answer(deps, record, BOB)
    assert context[REPLY] == (texts.INPUT_ONLY_REQUESTER, {"who": "UALICE"})
    assert not conn.keys("harness:input:*") and make_queue(conn).count == 0


def test_an_earlier_or_forged_question_is_not_open(deps: BotDeps, conn: redis.Redis) -> None:
    record = parked(conn)
    context = answer(deps, record, ALICE, question_id="0" * 16)
    assert context[REPLY] == texts.INPUT_NOT_OPEN
    assert not conn.keys("harness:input:*") and make_queue(conn).count == 0


def test_a_requester_the_channel_no_longer_lets_work_cannot_resume_the_run(
    store: Store, conn: redis.Redis, tmp_path: Path
) -> None:
    path = tmp_path / "harness.toml"
    path.write_text('[[profiles]]\nname = "ops"\nchannels = ["C1"]\nrequesters = ["UOTHER"]\n')
    config = load_config(path, env={})
    deps = BotDeps(store=store, queue=make_queue(conn), config=config)
    record = parked(conn)
    context = answer(deps, record, ALICE)
    reply: Any = context[REPLY]
    assert reply[0] == texts.NOT_A_REQUESTER_NOW.format(profile="ops")
    assert not conn.keys("harness:input:*") and make_queue(conn).count == 0  # nothing kept, nothing resumed
