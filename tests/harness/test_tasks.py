"""A call its server works on as a task (`harness.tools.tasks`): the loop parks the turn on it,
the task's result answers it later, and the handle's pace and bounds hold whatever a server says.

The hub's side (a real server answering with a task, polled and cancelled) is
`tests/harness/test_mcp_tasks.py`; the worker's (park, poll, resume, Stop) is
`tests/e2e/test_mcp_tasks.py`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from harness.loop import AwaitingTask, Finished, drive, step
from harness.state import RunState, Status, new_run, record_task_result
from harness.tools import ToolContext, ToolRegistry, ToolResult, tool
from harness.tools.tasks import (
    COMPLETED,
    POLL_MAX,
    POLL_MIN,
    UNREACHABLE,
    WORKING,
    BadTask,
    TaskHandle,
    TaskPoll,
    follow,
)
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use

STARTED: list[str] = []


def handle(**changes: Any) -> TaskHandle:
    now = time.time()
    fields: dict[str, Any] = {"server": "jobs", "task_id": "t-1", "since": now, "deadline": now + 60}
    return TaskHandle(**{**fields, **changes})


@tool()
def build(ctx: ToolContext, target: str) -> ToolResult:
    """Start a build (as a task)."""
    STARTED.append(target)
    return ToolResult("(working)", task=handle(message="queued"))


@tool(side_effects=False)
def look(ctx: ToolContext, what: str) -> str:
    """Look at something."""
    return f"saw {what}"


def results_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in message["content"] if b["type"] == "tool_result"]


def test_a_call_answered_with_a_task_parks_the_turn_and_its_result_answers_it_later(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    STARTED.clear()
    model.script(
        reply(
            tool_use("look", {"what": "a"}, id="toolu_1"),
            tool_use("build", {"target": "x"}, id="toolu_2"),
            tool_use("look", {"what": "b"}, id="toolu_3"),
        ),
        reply(text("Built.")),
    )
    tools = ToolRegistry([build, look])
    agent = make_agent(model, workspace, policy={"build": "allow", "look": "allow"}, tools=tools)
    parked, outcome = drive(new_run("build x"), agent, lambda e: None)

    assert isinstance(outcome, AwaitingTask) and outcome.call.id == "toolu_2"
    assert parked.status is Status.AWAITING_APPROVAL
    first, waiting, later = parked.pending
    assert first.result is not None and first.result.content == "saw a"  # the call before it ran
    assert waiting.tasking is not None and waiting.result is None and waiting.started  # it did start
    assert later.result is None  # no call runs ahead of the task
    assert [c.id for c in parked.waiting_on_task] == ["toolu_2"]
    saved = parked.to_json()
    assert saved["version"] == 2  # a release that cannot hold a task never reads it as its own
    assert RunState.from_json(json.loads(json.dumps(saved))) == parked
    again = step(parked, agent)  # still waiting: nothing runs again, the build was started once
    assert isinstance(again.outcome, AwaitingTask) and STARTED == ["x"]

    state = record_task_result(parked, "toolu_2", ToolResult("build x: ok"))
    state, outcome = drive(state, agent, lambda e: None)
    assert outcome == Finished("Built.", "end_turn")
    assert STARTED == ["x"]
    results = results_of(state.messages[2])  # all three in one user message, in the model's order
    assert [(r["tool_use_id"], r["content"]) for r in results] == [
        ("toolu_1", "saw a"),
        ("toolu_2", "build x: ok"),
        ("toolu_3", "saw b"),
    ]
    assert state.to_json()["version"] == 1  # no task open any more


def test_a_result_for_a_call_not_waiting_on_a_task_changes_nothing() -> None:
    state = new_run("x")
    assert record_task_result(state, "toolu_nope", ToolResult("late")) == state


def test_the_servers_interval_is_kept_within_bounds_and_none_backs_off() -> None:
    assert handle(poll_seconds=5.0).next_poll_in() == 5.0
    assert handle(poll_seconds=0.0).next_poll_in() == POLL_MIN  # a server cannot make us spin
    assert handle(poll_seconds=1e9).next_poll_in() == POLL_MAX
    assert handle(poll_seconds=float("nan")).next_poll_in() == 1.0
    backoff = [handle(polls=n).next_poll_in() for n in range(9)]
    assert backoff == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, POLL_MAX, POLL_MAX, POLL_MAX]


def test_a_handle_from_a_hostile_server_or_record_is_bounded() -> None:
    with pytest.raises(BadTask):
        handle(task_id="")
    with pytest.raises(BadTask):
        handle(task_id="x" * 201)
    seen = handle().seen(WORKING, "m" * 5000, None)
    assert len(seen.message) == 300 and seen.polls == 1
    read = TaskHandle.from_json({**handle().to_json(), "message": "y" * 5000, "poll_seconds": "fast"})
    assert len(read.message) == 300 and read.poll_seconds is None


class Scripted:
    """A task host that answers polls from a script: the pace and deadline logic of `follow`."""

    holder = ""

    def __init__(self, *polls: TaskPoll) -> None:
        self.polls, self.cancelled = list(polls), 0

    def poll_task(self, handle: TaskHandle) -> TaskPoll:
        return self.polls.pop(0)

    def cancel_task(self, handle: TaskHandle) -> bool:
        self.cancelled += 1
        return True


def test_follow_waits_at_the_servers_pace_through_an_unreachable_poll_to_the_result() -> None:
    slept: list[float] = []
    seen: list[str] = []
    host = Scripted(
        TaskPoll(WORKING, "step 1", 2.0),
        TaskPoll(UNREACHABLE, "the session closed"),
        TaskPoll(WORKING, "step 2", None),
        TaskPoll(COMPLETED, "", None, ToolResult("done")),
    )
    got = follow(host, handle(), "jobs__build", sleep=slept.append, seen=lambda h: seen.append(h.message))
    assert got == ToolResult("done") and host.cancelled == 0
    assert slept == [1.0, 2.0, 2.0, 2.0]  # the server's interval, kept once it gave one
    assert seen == ["step 1", "step 2"]


def test_follow_cancels_a_task_past_its_deadline_and_answers_as_a_timeout() -> None:
    clock = iter([0.0, 30.0, 61.0])
    host = Scripted(TaskPoll(WORKING, "slow", 30.0))
    task = handle(since=0.0, deadline=60.0, side_effects=True)
    got = follow(host, task, "jobs__build", sleep=lambda s: None, clock=lambda: next(clock))
    assert got.is_error and host.cancelled == 1
    assert "did not finish within 60 seconds" in got.text and "cancel" in got.text
