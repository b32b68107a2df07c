"""Extended thinking over the real SDK and the loopback Messages API, which checks thinking blocks
the way the real one does: signed, sent back unmodified in the turn they belong to."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.config import load_config
from harness.loop import Agent, Failed, Finished, TurnDone, drive, step
from harness.request import build_request
from harness.state import RunState, new_run
from harness.tools.catalog import Catalog
from messages.endings import final_answer
from messages.turns import turn_summary
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, redacted_thinking, reply, text, thinking, tool_use
from tests.harness.test_cli import cli_env, harness

SECRET = "SECRET-REASONING: the user must never read this"


def thinking_agent(model: FakeMessagesAPI, workspace: Path, budget: int = 1024) -> Agent:
    return replace(make_agent(model, workspace, max_tokens=2048, default="allow"), thinking_budget=budget)


def run(agent: Agent, task: str = "do the task", history: tuple[dict[str, Any], ...] = ()) -> Any:
    events: list[Any] = []
    state, outcome = drive(new_run(task, history), agent, events.append)
    return state, outcome, events


def no_thinking_cached(body: dict[str, Any]) -> bool:
    blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    return all("cache_control" not in b for b in blocks if b["type"] in ("thinking", "redacted_thinking"))


def test_a_two_turn_tool_run_sends_its_thinking_back_as_returned(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    first = thinking("I should read the README, then check the time.")
    model.script(
        reply(first, text("Reading."), tool_use("read_file", {"path": "README.md"})),
        # Without interleaved thinking only the first reply of a turn thinks.
        reply(tool_use("get_time", {})),
        reply(thinking("Both done."), text("It is '# My project' and late.")),
    )
    state, outcome, _ = run(thinking_agent(model, workspace))

    assert outcome == Finished("It is '# My project' and late.", "end_turn")
    assert model.errors == [] and len(model.valid_requests) == 3
    assert all(r["thinking"] == {"type": "enabled", "budget_tokens": 1024} for r in model.valid_requests)
    assert all("temperature" not in r and "top_k" not in r for r in model.valid_requests)
    assert state.messages[1]["content"][0] == first  # stored with its signature, exactly
    for later in model.valid_requests[1:]:
        assert later["messages"][1]["content"][0] == first  # sent back first in its turn, unchanged
        assert no_thinking_cached(later)


def test_redacted_thinking_goes_back_with_its_data(model: FakeMessagesAPI, workspace: Path) -> None:
    hidden = redacted_thinking("encrypted")
    model.script(reply(hidden, thinking("and more"), tool_use("get_time", {})), reply(text("done")))
    state, outcome, _ = run(thinking_agent(model, workspace))

    assert isinstance(outcome, Finished) and model.errors == []
    assert model.valid_requests[1]["messages"][1]["content"][0] == hidden


def test_a_paused_thinking_turn_continues_and_keeps_its_thinking_first(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    model.script(
        reply(thinking("long one"), text("Working."), stop_reason="pause_turn"),
        reply(tool_use("get_time", {})),
        reply(text("done")),
    )
    _, outcome, _ = run(thinking_agent(model, workspace))
    assert isinstance(outcome, Finished) and model.errors == []
    assert model.valid_requests[2]["messages"][1]["content"][0]["thinking"] == "long one"


def test_a_continued_thread_with_earlier_thinking_is_accepted(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    model.script(reply(thinking("one"), tool_use("get_time", {})), reply(text("first answer")))
    first_state, _, _ = run(thinking_agent(model, workspace), "first")
    model.script(reply(thinking("two"), tool_use("list_files", {})), reply(text("second answer")))
    state, outcome, _ = run(thinking_agent(model, workspace), "second", first_state.messages)

    assert outcome == Finished("second answer", "end_turn")
    assert model.errors == []
    assert state.messages[1]["content"][0]["thinking"] == "one"  # the old turn's thinking, kept


def test_a_tampered_signature_is_refused_and_the_run_fails_without_losing_state(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    agent = thinking_agent(model, workspace)
    model.script(reply(thinking("plan"), tool_use("get_time", {})), reply(text("never served")))
    state = step(step(new_run("go"), agent).state, agent).state  # reply stored, call answered
    block = state.messages[1]["content"][0]
    forged = {**block, "signature": block["signature"][:-8] + "AAAAAAA="}
    tampered = replace(
        state, messages=(state.messages[0], {**state.messages[1], "content": [forged]}, *state.messages[2:])
    )
    tampered = RunState.from_json(json.loads(json.dumps(tampered.to_json())))

    result = step(tampered, agent)

    assert isinstance(result.outcome, Failed) and result.outcome.status_code == 400
    assert "Invalid `signature` in `thinking` block" in result.outcome.error
    assert result.state.messages == tampered.messages
    assert step(state, agent).outcome == Finished("never served", "end_turn")  # the genuine one passes


def test_thinking_off_sends_no_thinking(model: FakeMessagesAPI, workspace: Path) -> None:
    agent = make_agent(model, workspace)
    assert "thinking" not in build_request(new_run("x"), agent)


def test_from_config_takes_the_budget_from_model_thinking_budget(tmp_path: Path, workspace: Path) -> None:
    path = tmp_path / "harness.toml"
    path.write_text("[model]\nthinking_budget = 2000\n[limits]\nmax_tokens = 4000\n", encoding="utf-8")
    config = load_config(path, env={"HARNESS_WORKSPACE": str(workspace)})
    agent = Agent.from_config(config, Catalog.from_config(config), client=object())
    assert agent.thinking_budget == 2000
    assert build_request(new_run("x"), agent)["thinking"] == {"type": "enabled", "budget_tokens": 2000}


# --- never shown to people ----------------------------------------------------------------------


def test_thinking_text_never_reaches_the_slack_messages(model: FakeMessagesAPI, workspace: Path) -> None:
    model.script(
        reply(thinking(SECRET), text("Checking."), tool_use("read_file", {"path": "README.md"})),
        reply(thinking(SECRET + " again"), text("The title is '# My project'.")),
    )
    state, outcome, events = run(thinking_agent(model, workspace))
    assert isinstance(outcome, Finished)
    assert SECRET in json.dumps(state.messages)  # it was there to leak

    turns = [e for e in events if isinstance(e, TurnDone)]
    shown = [turn_summary(e.turn, e.calls, e.tokens, 40_000) for e in turns]
    shown.append(final_answer(outcome.answer, state.turns, state.requests))
    assert len(shown) == 2
    for message in shown:
        assert "SECRET" not in message.text and "SECRET" not in json.dumps(message.blocks)
    assert "SECRET" not in outcome.answer and "# My project" in outcome.answer


@pytest.mark.e2e
def test_thinking_text_never_reaches_the_terminal(
    model: FakeMessagesAPI, workspace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "harness.toml"
    config.write_text("[model]\nthinking_budget = 1024\n[limits]\nmax_tokens = 2048\n", encoding="utf-8")
    model.script(
        reply(thinking(SECRET), tool_use("read_file", {"path": "README.md"})),
        reply(thinking(SECRET + " again"), text("The title is '# My project'.")),
    )
    done = harness(cli_env(model, workspace, HARNESS_CONFIG=str(config)), "what is the title?")

    assert done.returncode == 0, done.stderr
    assert "The title is '# My project'." in done.stdout
    assert "SECRET" not in done.stdout and "SECRET" not in done.stderr
    assert model.errors == []
    assert model.valid_requests[1]["thinking"]["budget_tokens"] == 1024
    assert model.valid_requests[1]["messages"][1]["content"][0]["thinking"] == SECRET
