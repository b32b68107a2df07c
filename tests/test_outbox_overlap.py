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

import pytest

from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import Stack, wait_until

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
