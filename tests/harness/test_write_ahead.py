"""Write-ahead: a side-effecting call is marked started (and persisted) before it runs, never twice."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from harness.loop import Finished, drive, step
from harness.state import Decision, PendingCall, RunState, Verdict, new_run, record_decisions
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use


def test_the_mark_is_handed_over_before_the_call_runs(model: FakeMessagesAPI, workspace: Path) -> None:
    model.script(
        reply(
            tool_use("read_file", {"path": "README.md"}, id="toolu_r"),
            tool_use("write_file", {"path": "w.txt", "content": "w"}, id="toolu_w"),
        ),
        reply(text("ok")),
    )
    seen: list[tuple[str, bool, bool]] = []

    def before_tool(state: RunState, call: PendingCall) -> None:
        stored = RunState.loads(state.dumps())  # what a driver would persist
        mark = next(c for c in stored.pending if c.id == call.id)
        seen.append((call.id, mark.started, (workspace / "w.txt").exists()))

    agent = dataclasses.replace(
        make_agent(model, workspace, policy={"read_file": "allow", "write_file": "allow"}),
        before_tool=before_tool,
    )
    _, outcome = drive(new_run("go"), agent, lambda e: None)
    assert isinstance(outcome, Finished)
    assert seen == [("toolu_w", True, False)]  # only the side-effecting call; the file did not exist yet
    assert (workspace / "w.txt").exists()


def test_a_started_call_without_a_result_is_never_run_again(model: FakeMessagesAPI, workspace: Path) -> None:
    model.script(
        reply(tool_use("write_file", {"path": "w.txt", "content": "w"}, id="toolu_w")), reply(text("ok"))
    )
    captured: list[RunState] = []

    class Crash(Exception):
        pass

    def crash(state: RunState, call: PendingCall) -> None:
        captured.append(state)
        raise Crash  # the worker dies after persisting the mark

    agent = make_agent(model, workspace)
    parked, _ = drive(new_run("go"), agent, lambda e: None)
    approved = record_decisions(parked, {"toolu_w": Decision(Verdict.APPROVED, by="U1")})
    with pytest.raises(Crash):
        step(approved, dataclasses.replace(agent, before_tool=crash))
    assert not (workspace / "w.txt").exists()

    recovered = RunState.loads(captured[0].dumps())  # another process picks up the checkpoint
    state, outcome = drive(recovered, agent, lambda e: None)
    assert isinstance(outcome, Finished)
    assert not (workspace / "w.txt").exists()
    result: dict[str, Any] = state.messages[2]["content"][0]
    assert (
        result["is_error"] is True
        and "Outcome unknown" in result["content"]
        and "NOT run again" in result["content"]
    )
    assert model.errors == []


def test_read_only_calls_are_not_marked_and_may_run_again(model: FakeMessagesAPI, workspace: Path) -> None:
    model.script(reply(tool_use("read_file", {"path": "README.md"})), reply(text("ok")))
    marks: list[str] = []
    agent = dataclasses.replace(make_agent(model, workspace), before_tool=lambda s, c: marks.append(c.id))
    state, _ = drive(new_run("go"), agent, lambda e: None)
    assert marks == []
    assert "is_error" not in state.messages[2]["content"][0]


def test_a_stop_read_with_the_mark_answers_the_call_as_not_run(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    from harness.loop import Stopped, saves_first
    from harness.valves import Stop, Valve

    model.script(reply(tool_use("write_file", {"path": "w.txt", "content": "w"}, id="toolu_w")))
    marks: list[bool] = []
    agent = dataclasses.replace(
        make_agent(model, workspace, policy={"write_file": "allow"}),
        before_tool=lambda state, call: marks.append(call.started),
        # Pressed before the mark was written; a driver reads it in the mark's own write.
        stop_check=lambda: Stop(Valve.STOPPED_BY_USER, "pressed") if marks else None,
    )
    asked = step(new_run("go"), agent).state
    assert saves_first(asked, agent)  # the mark is the first write after the reply: one write, not two
    result = step(asked, agent)
    assert marks == [True] and not (workspace / "w.txt").exists()
    assert isinstance(result.outcome, Stopped)
    [answer] = result.state.messages[-1]["content"]
    assert answer["is_error"] is True and "stopped_by_user" in answer["content"]
    assert "Outcome unknown" not in answer["content"]  # it never started: nothing to be unsure of


def test_only_a_call_that_writes_its_mark_first_lets_the_reply_ride_with_it(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    from harness.loop import saves_first

    model.script(
        reply(
            tool_use("read_file", {"path": "README.md"}),
            tool_use("write_file", {"path": "w", "content": "w"}),
        )
    )
    agent = dataclasses.replace(
        make_agent(model, workspace, policy={"read_file": "allow", "write_file": "allow"}),
        before_tool=lambda state, call: None,
    )
    asked = step(new_run("go"), agent).state
    assert not saves_first(asked, agent)  # a read runs first: the reply must be saved before it
    assert not saves_first(asked, dataclasses.replace(agent, before_tool=None))
