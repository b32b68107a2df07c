"""What a run owes Slack goes out while its next step runs, never in front of it.

A turn's summary is posted while the model reads that turn's results, and the decided approval
card is updated while the approved call runs and the model reads its result: Slack's round trips
(100-300 ms each in real life) are not added to a turn or to a click's resume. Each test freezes
the Slack call in the stand-in and shows the step going on without it, then that nothing is lost
or reordered once it answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from harness.policy import Tier
from harness.state import Decision, PendingCall, Verdict
from store import RunRecord, unpack
from store.keys import Keys
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import Stack, wait_until
from workers import outbox

pytestmark = pytest.mark.e2e


@pytest.fixture
def stack(redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        stack = Stack(redis_url, slack, model, tmp_path)
        try:
            yield stack
        finally:
            stack.stop()


def texts(stack: Stack, channel: str, ts: str) -> list[str]:
    return [m["text"] for m in stack.slack.messages(channel, ts) if m["ts"] != ts]


def test_a_turns_summary_is_posted_while_the_model_reads_its_results(stack: Stack) -> None:
    stack.model.script(reply(tool_use("get_time", {})), reply(text("It is late.")))
    # The turn's live message settles into its summary: the run's first chat.update.
    summary = stack.slack.hold_next("chat.update")
    stack.start_bot()
    stack.start_worker()
    _, ts, _ = stack.mention("what time is it?", channel="COV1")

    assert summary.arrived.wait(30)  # the turn's summary is on its way to Slack, frozen there
    assert stack.model.wait_for_requests(2, 30)  # and the model already has the turn's results
    summary.release.set()

    wait_until(lambda: any("It is late." in t for t in texts(stack, "COV1", ts)), 30)
    posted = texts(stack, "COV1", ts)
    turn = next(i for i, t in enumerate(posted) if "get_time" in t)
    answer = next(i for i, t in enumerate(posted) if "It is late." in t)
    assert turn < answer  # the thread still reads in order
    assert sum("get_time" in t for t in posted) == 1  # posted once
    assert len(stack.model.requests) == 2


def test_a_decided_card_is_updated_while_the_approved_call_and_the_next_request_run(stack: Stack) -> None:
    stack.model.script(
        reply(tool_use("write_file", {"path": "overlap.txt", "content": "written"})), reply(text("Done."))
    )
    stack.start_bot()
    stack.start_worker()
    _, ts, _ = stack.mention("write the file", channel="COV2")
    card = wait_until(
        lambda: next((m for m in stack.slack.messages("COV2", ts) if "approve" in str(m["blocks"])), None), 30
    )
    stack.settled()

    update = stack.slack.hold_next("chat.update")
    assert stack.click(card, "approve") == 200
    assert update.arrived.wait(30)  # the card's "Approved" is on its way, frozen in the stand-in
    target = stack.workspace / "overlap.txt"
    wait_until(lambda: target.exists() and target.read_text() == "written", 30)  # the call ran meanwhile
    assert stack.model.wait_for_requests(2, 30)  # and the model has its result: Slack waits behind
    update.release.set()

    wait_until(lambda: any("Done." in t for t in texts(stack, "COV2", ts)), 30)
    shown = next(m for m in stack.slack.messages("COV2", ts) if m["ts"] == card["ts"])
    assert "approve" not in str(shown["blocks"])  # the card was updated (its buttons gone)
    assert len(stack.model.requests) == 2


def batch_message(stack: Stack, channel: str, ts: str) -> dict[str, Any] | None:
    """The thread's Approve all / Decline all message, once posted."""
    return next((m for m in stack.slack.messages(channel, ts) if "approve_all" in str(m["blocks"])), None)


def test_approve_all_owes_each_decided_card_as_its_call_while_the_calls_run(stack: Stack) -> None:
    """Ten cards rendered in front of the resume, and carried by each of the ten write-ahead saves,
    were most of what set an Approve all apart from one Approve (tests/bench/bench_batch.py)."""
    paths = [f"many-{i}.txt" for i in range(10)]
    calls = [tool_use("write_file", {"path": p, "content": "x"}) for p in paths]
    stack.model.script(reply(*calls), reply(text("All written.")))
    stack.start_bot()
    stack.start_worker()
    _, ts, _ = stack.mention("write them all", channel="COV3")
    batch = wait_until(lambda: batch_message(stack, "COV3", ts), 30)
    stack.settled()
    run_id = next(
        e["value"] for b in batch["blocks"] if b["type"] == "actions" for e in b["elements"] if "value" in e
    ).partition(":")[0]

    update = stack.slack.hold_next("chat.update")
    assert stack.click(batch, "approve_all") == 200
    assert update.arrived.wait(30)  # the first card update is frozen in the stand-in
    assert stack.model.wait_for_requests(2, 30)  # every call ran meanwhile; the model has the results
    assert all((stack.workspace / p).read_text() == "x" for p in paths)
    raw = redis.Redis.from_url(stack.redis_url).get(Keys.run(run_id))
    assert raw is not None
    saved = RunRecord.from_json(unpack(raw))
    owed = [e for e in saved.outbox if e["op"] == "decided"]
    assert len(owed) == 10 and not any("blocks" in e for e in owed)  # calls, not rendered cards
    assert saved.call_tools == {}  # the park's tool info went with the resume
    update.release.set()

    wait_until(lambda: any("All written." in t for t in texts(stack, "COV3", ts)), 30)
    stack.settled()
    decided = [m for m in stack.slack.messages("COV3", ts) if "many-" in m["text"] and m["ts"] != batch["ts"]]
    assert len(decided) == 10
    for card in decided:
        assert "approve" not in str(card["blocks"]) and "Approved by <@UALICE>" in str(card["blocks"])
    assert len(stack.model.requests) == 2


def _decided_call(content: str) -> PendingCall:
    decision = Decision(Verdict.APPROVED, by="UANN")
    return PendingCall("toolu_big", "write_file", {"path": "big.txt", "content": content}, Tier.ASK, decision)


def test_a_decided_card_of_large_arguments_is_owed_rendered() -> None:
    """A card is cut to fit Slack and its call's arguments are not: a call larger than its card
    is owed as the card, so no save carries more than it used to."""
    record = RunRecord("run1", "T1", "C1", "1.0", "UALICE", "task")
    small = outbox.owe_decided(record, "2.0", _decided_call("x"), 1.0).outbox
    large = outbox.owe_decided(record, "2.0", _decided_call("x" * 50_000), 1.0).outbox
    assert [e["op"] for e in small] == ["decided"] and "blocks" not in small[0]
    assert [e["op"] for e in large] == ["update"] and "<@UANN>" in str(large[0]["blocks"])
    assert len(str(large[0])) < 20_000
