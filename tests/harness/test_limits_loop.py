"""Limits that ask and an outside Stop, in the step function: real SDK, loopback Messages API."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.config import ConfigError, load_config
from harness.loop import (
    AwaitingLimit,
    Finished,
    Stopped,
    ToolsRequested,
    TurnDone,
    continue_at_limit,
    drive,
    step,
    stop_run,
)
from harness.state import RunState, Status, new_run
from harness.valves import Stop, Valve
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, Reply, reply, text, tool_use


def run(agent: Any, state: RunState | None = None) -> tuple[RunState, Any, list[Any]]:
    events: list[Any] = []
    state, outcome = drive(state or new_run("do the task"), agent, events.append)
    return state, outcome, events


def reading(i: int) -> Reply:
    return reply(tool_use("read_file", {"path": f"file{i}.txt"}))


def results_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    assert message["role"] == "user"
    return [b for b in message["content"] if b["type"] == "tool_result"]


# --- limits that ask ----------------------------------------------------------------------------


def test_at_max_turns_an_asking_run_waits_with_the_call_unrun(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    model.script(reading(0), reading(1))
    agent = make_agent(model, workspace, max_turns=1, on_limit="ask")
    state, outcome, _ = run(agent)

    assert outcome == AwaitingLimit(Valve.MAX_TURNS, outcome.reason, outcome.question, 1)
    assert "max turns" in outcome.reason and outcome.question.endswith("allowed only 1 turn.")
    assert (state.status, state.at_limit, state.turns, state.requests) == (
        Status.AWAITING_LIMIT,
        "max_turns",
        1,
        2,
    )
    assert state.pending == () and state.messages[-1]["role"] == "assistant"  # nothing ran
    with pytest.raises(ValueError):
        step(state, agent)  # only Continue or Stop moves it


def test_continue_grants_another_max_turns_and_starts_the_held_turn(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    model.script(reading(0), reading(1), reading(2), reading(3), reply(text("done")))
    agent = make_agent(model, workspace, max_turns=2, on_limit="ask")
    state, outcome, _ = run(agent)
    assert isinstance(outcome, AwaitingLimit) and outcome.allowance == 2

    resumed = continue_at_limit(state, agent)
    assert resumed.outcome is None and resumed.state.extra_turns == 2
    assert [type(e) for e in resumed.events] == [ToolsRequested]
    assert resumed.state.turns == 3 and resumed.state.pending[0].input == {"path": "file2.txt"}

    state, outcome, _ = run(agent, resumed.state)
    assert outcome == Finished("done", "end_turn")
    assert (state.turns, state.requests) == (4, 5)
    assert model.errors == []  # every tool_use got its tool_result


def test_a_second_limit_asks_again_after_the_allowance_is_used(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    model.script(reading(0), reading(1), reading(2))
    agent = make_agent(model, workspace, max_turns=1, on_limit="ask")
    state, first, _ = run(agent)
    resumed = continue_at_limit(state, agent)
    state, second, _ = run(agent, resumed.state)

    assert isinstance(first, AwaitingLimit) and isinstance(second, AwaitingLimit)
    assert "allowed only 2 turns" in second.question  # the limit now counts the allowance granted
    assert state.turns == 2 and state.extra_turns == 1


def test_stop_at_a_limit_answers_the_held_calls_and_the_thread_can_go_on(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    model.script(
        reading(0),
        reply(tool_use("read_file", {"path": "a"}, id="toolu_a"), tool_use("get_time", {}, id="toolu_b")),
        reply(text("carried on")),
    )
    agent = make_agent(model, workspace, max_turns=1, on_limit="ask")
    state, outcome, _ = run(agent)
    assert isinstance(outcome, AwaitingLimit)

    stopped = stop_run(state, outcome.valve, outcome.reason)
    assert stopped.status is Status.STOPPED and stopped.at_limit == ""
    results = results_of(stopped.messages[-1])
    assert [r["tool_use_id"] for r in results] == ["toolu_a", "toolu_b"]
    assert all(r["is_error"] and "max_turns" in r["content"] for r in results)

    later, done, _ = run(agent, new_run("go on", stopped.messages))
    assert done == Finished("carried on", "end_turn") and model.errors == []


def test_the_token_budget_asks_before_a_turn_and_continue_grants_a_budget_more(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    big = {"input_tokens": 900, "output_tokens": 200}
    model.script(reply(tool_use("get_time", {}), usage=big), reply(text("done"), usage=big))
    agent = make_agent(model, workspace, token_budget=1000, on_limit="ask")
    state, outcome, _ = run(agent)

    assert isinstance(outcome, AwaitingLimit) and outcome.valve is Valve.TOKEN_BUDGET
    assert outcome.allowance == 1000 and "1,100 tokens" in outcome.question
    assert outcome.reason.startswith("Stopped at the token budget: ")
    assert len(model.requests) == 1 and state.turns == 0  # the call has not run

    resumed = continue_at_limit(state, agent)
    assert resumed.state.extra_tokens == 1000 and [type(e) for e in resumed.events] == [ToolsRequested]
    state, outcome, _ = run(agent, resumed.state)
    assert outcome == Finished("done", "end_turn") and len(model.requests) == 2 and model.errors == []


def test_the_token_budget_asks_before_a_request_too(model: FakeMessagesAPI, workspace: Path) -> None:
    big = {"input_tokens": 900, "output_tokens": 200}
    model.script(reply(text("Searching…"), stop_reason="pause_turn", usage=big), reply(text("done")))
    agent = make_agent(model, workspace, token_budget=1000, on_limit="ask")
    state, outcome, _ = run(agent)

    assert isinstance(outcome, AwaitingLimit) and outcome.valve is Valve.TOKEN_BUDGET
    assert len(model.requests) == 1  # the paused reply is not sent back until Continue

    resumed = continue_at_limit(state, agent)
    assert resumed.events == () and resumed.outcome is None
    state, outcome, _ = run(agent, resumed.state)
    assert outcome == Finished("Searching…\n\ndone", "end_turn") and len(model.requests) == 2


def test_continue_still_checks_for_no_progress(model: FakeMessagesAPI, workspace: Path) -> None:
    model.script(reading(0), reading(0))
    agent = make_agent(model, workspace, max_turns=1, on_limit="ask")
    state, _, _ = run(agent)
    resumed = continue_at_limit(state, agent)

    assert isinstance(resumed.outcome, Stopped) and resumed.outcome.valve is Valve.NO_PROGRESS
    assert results_of(resumed.state.messages[-1])[0]["is_error"] is True


def test_on_limit_stop_is_the_default_and_never_asks(model: FakeMessagesAPI, workspace: Path) -> None:
    model.script(reading(0), reading(1))
    _, outcome, _ = run(make_agent(model, workspace, max_turns=1))
    assert isinstance(outcome, Stopped) and outcome.valve is Valve.MAX_TURNS


def test_a_state_at_a_limit_round_trips_and_an_older_state_reads_as_nothing_granted(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    model.script(reading(0), reading(1))
    agent = make_agent(model, workspace, max_turns=1, on_limit="ask")
    state, _, _ = run(agent)
    state = replace(state, extra_turns=3, extra_tokens=500)
    assert RunState.loads(state.dumps()) == state

    older = json.loads(state.dumps())
    for key in ("extra_turns", "extra_tokens", "at_limit"):
        del older[key]
    read = RunState.from_json({**older, "status": "running"})
    assert (read.extra_turns, read.extra_tokens, read.at_limit) == (0, 0, "")


def test_on_limit_is_read_from_the_config_and_a_bad_value_names_the_key(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[limits]\non_limit = "ask"\n')
    assert load_config(good, env={}).limits.on_limit == "ask"
    assert load_config(None, env={}).limits.on_limit == "stop"
    bad = tmp_path / "bad.toml"
    bad.write_text('[limits]\non_limit = "pause"\n')
    with pytest.raises(ConfigError, match=r"limits\.on_limit must be \"stop\" or \"ask\", got 'pause'"):
        load_config(bad, env={})


# --- a Stop from outside the loop --------------------------------------------------------------------


def test_a_stop_asked_before_a_request_makes_no_request(model: FakeMessagesAPI, workspace: Path) -> None:
    stop = Stop(Valve.STOPPED_BY_USER, "stop now")
    agent = replace(make_agent(model, workspace), stop_check=lambda: stop)
    state, outcome, _ = run(agent)

    assert outcome == Stopped(Valve.STOPPED_BY_USER, "stop now")
    assert model.requests == [] and state.status is Status.STOPPED


def test_a_stop_between_calls_lets_the_running_call_finish_and_runs_no_other(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    model.script(
        reply(
            tool_use("read_file", {"path": "README.md"}, id="toolu_1"),
            tool_use("write_file", {"path": "never.txt", "content": "x"}, id="toolu_2"),
        ),
        reply(text("after the stop")),
    )
    ran: list[str] = []
    agent = make_agent(model, workspace, policy={"read_file": "allow", "write_file": "allow"})
    agent = replace(
        agent,
        # Stop is pressed while the first call runs: it is seen before the second starts.
        stop_check=lambda: Stop(Valve.STOPPED_BY_USER, "pressed") if ran else None,
    )
    original = agent.tools.run

    def run_and_note(name: str, arguments: Any, ctx: Any) -> Any:
        ran.append(name)
        return original(name, arguments, ctx)

    agent = replace(agent, tools=_Recording(agent.tools, run_and_note))
    state, outcome, events = run(agent)

    assert outcome == Stopped(Valve.STOPPED_BY_USER, "pressed")
    assert ran == ["read_file"] and not (workspace / "never.txt").exists()
    first, second = results_of(state.messages[-1])
    assert first["tool_use_id"] == "toolu_1" and first["content"].startswith("# My project")
    assert second["is_error"] is True and "stopped_by_user" in second["content"]
    [done] = [e for e in events if isinstance(e, TurnDone)]
    assert [c.result.is_error for c in done.calls if c.result] == [False, True]

    _, after, _ = run(replace(agent, stop_check=None), new_run("and now?", state.messages))
    assert after == Finished("after the stop", "end_turn") and model.errors == []


class _Recording:
    """A tool registry that runs every call through `run` (the real registry underneath)."""

    def __init__(self, registry: Any, run: Any) -> None:
        self._registry = registry
        self.run = run

    def __getattr__(self, name: str) -> Any:
        return getattr(self._registry, name)


# --- the terminal --------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_the_terminal_asks_at_a_limit_enter_continues_and_a_closed_stdin_stops(
    model: FakeMessagesAPI, workspace: Path, tmp_path: Path
) -> None:
    from tests.harness.test_cli import cli_env, harness

    config = tmp_path / "harness.toml"
    config.write_text('[limits]\nmax_turns = 1\non_limit = "ask"\n')
    env = cli_env(model, workspace, HARNESS_CONFIG=str(config))
    prompt = (
        "[limit] Reached max turns: the model asked for another turn of tool calls, but this run is "
        "allowed only 1 turn. Continue with 1 more turn of tool calls? "
        "Enter to continue / type n to stop: "
    )
    model.script_for("goon", reading(0), reply(tool_use("get_time", {})), reply(text("went on")))
    went_on = harness(env, "goon: read then time", stdin="\n")
    assert went_on.returncode == 0, went_on.stderr
    assert prompt in went_on.stdout
    assert went_on.stdout.splitlines()[-2:] == [
        "went on",
        "That took 2 turns of tool calls across 3 model requests.",
    ]

    model.script_for("halt", reading(0), reply(tool_use("get_time", {})))
    halted = harness(env, "halt: read then time", stdin="")
    assert halted.returncode == 3, halted.stderr
    assert prompt in halted.stdout
    assert "[turn 2] Stopped at max turns" in halted.stdout
    assert halted.stdout.splitlines()[-1] == "That took 1 turns of tool calls across 2 model requests."
    assert model.errors == []
