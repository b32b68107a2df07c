"""A parked run is a value: written to JSON, resumed in another process, it ends as if never parked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.loop import AwaitingApproval, drive
from harness.state import Decision, RunState, StateError, Verdict, new_run, record_decisions
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, Reply, reply, text, tool_use

ROOT = Path(__file__).resolve().parents[2]

RESUME = """
import json, sys
from pathlib import Path
from harness.loop import drive
from harness.state import Decision, RunState, Verdict, record_decisions
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI

class Remote(FakeMessagesAPI):
    base_url = sys.argv[1]

state = RunState.loads(Path(sys.argv[2]).read_text())
decisions = json.loads(sys.argv[4])
state = record_decisions(state, {k: Decision(Verdict(v), by="U1") for k, v in decisions.items()})
state, outcome = drive(state, make_agent(Remote(), Path(sys.argv[3])), lambda e: None)
print(state.dumps())
"""


def script() -> list[Reply]:
    return [
        reply(
            tool_use("read_file", {"path": "README.md"}, id="toolu_r"),
            tool_use("write_file", {"path": "out.txt", "content": "42"}, id="toolu_w"),
            tool_use("get_time", {}, id="toolu_t"),
        ),
        reply(tool_use("delete_file", {"path": "README.md"}, id="toolu_d")),
        reply(text("done")),
    ]


def freeze_time(messages: tuple[dict[str, Any], ...]) -> str:
    """The conversation as text, with get_time's answer (which differs run to run) blanked."""
    data = json.loads(json.dumps(list(messages)))
    for message in data:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block.get("tool_use_id") == "toolu_t":
                block["content"] = "<time>"
    return json.dumps(data, sort_keys=True)


def test_park_to_json_resume_in_a_new_process_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    decisions = {"toolu_w": "approved", "toolu_d": "declined"}

    # Uninterrupted: decisions applied the moment they are asked for, in this process.
    straight_ws = tmp_path / "straight"
    straight_ws.mkdir()
    (straight_ws / "README.md").write_text("# My project\n")
    with FakeMessagesAPI() as model:
        model.script(*script())
        agent = make_agent(model, straight_ws)
        state = new_run("do it")
        while True:
            state, outcome = drive(state, agent, lambda e: None)
            if not isinstance(outcome, AwaitingApproval):
                break
            state = record_decisions(
                state, {c.id: Decision(Verdict(decisions[c.id]), by="U1") for c in outcome.calls}
            )
        straight = state

    # Parked: every approval round trip goes through JSON on disk and a fresh interpreter.
    parked_ws = tmp_path / "parked"
    parked_ws.mkdir()
    (parked_ws / "README.md").write_text("# My project\n")
    with FakeMessagesAPI() as model:
        model.script(*script())
        state, outcome = drive(new_run("do it"), make_agent(model, parked_ws), lambda e: None)
        rounds = 0
        while isinstance(outcome, AwaitingApproval):
            rounds += 1
            saved = tmp_path / f"state{rounds}.json"
            saved.write_text(state.dumps())
            mine = {c.id: decisions[c.id] for c in outcome.calls}
            done = subprocess.run(
                [sys.executable, "-c", RESUME, model.base_url, str(saved), str(parked_ws), json.dumps(mine)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            state = RunState.loads(done.stdout)
            outcome = AwaitingApproval(state.awaiting) if state.awaiting else None
        assert model.errors == []

    assert rounds == 2
    assert freeze_time(state.messages) == freeze_time(straight.messages)
    assert (state.turns, state.requests, state.status) == (straight.turns, straight.requests, straight.status)
    assert (parked_ws / "out.txt").read_text() == "42" and (parked_ws / "README.md").exists()


def test_a_parked_state_round_trips_through_json(model: FakeMessagesAPI, workspace: Path) -> None:
    model.script(*script())
    state, _ = drive(new_run("do it"), make_agent(model, workspace), lambda e: None)
    assert RunState.loads(state.dumps()) == state
    assert json.loads(state.dumps())["version"] == 1


@pytest.mark.parametrize(
    "stored",
    [
        '{"version": 0, "messages": []}',
        '{"messages": []}',
        '{"version": 1, "messages": []}',
        '{"version": 1, "messages": [], "status": "dancing", "turns": 0, "requests": 0, '
        '"usage": [0,0,0,0], "signatures": [], "pending": []}',
        "not json",
        "[]",
    ],
)
def test_an_old_or_unreadable_state_is_refused_loudly(stored: str) -> None:
    with pytest.raises(StateError, match="refusing|cannot be resumed"):
        RunState.loads(stored)
