"""A server that asks a person (MCP 2026-07-28 `input_required`), against a real server process.

The hub turns the server's input request into a result that asks (`ToolResult.asks`), and sends
the call again with the answers and the server's `requestState`, exactly as it came; the loop parks
the run on the question and goes on with the answers. The server (`tests/fakes/mcp_asking_server.py`,
built with the `mcp` package) logs every round it receives.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from harness.agent import Agent
from harness.config import load_config
from harness.loop import AwaitingInput, Finished, step
from harness.state import RunState, new_run, record_input_answers
from harness.tools import ToolContext
from harness.tools.catalog import Catalog
from harness.tools.inputs import InputAnswer, InputAsk, InputReply, cancelled, reply_to
from harness.tools.mcp import McpHub
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.mcp_support import require_bwrap

SERVER = Path(__file__).resolve().parents[1] / "fakes" / "mcp_asking_server.py"


def rounds(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def log(tmp_path: Path) -> Path:
    (tmp_path / "server").mkdir()
    return tmp_path / "server" / "rounds.jsonl"


@pytest.fixture
def rooms(tmp_path: Path, log: Path) -> Iterator[tuple[Catalog, McpHub, Path]]:
    require_bwrap()
    toml = (
        f'[[mcp.servers]]\nname = "rooms"\ncommand = {json.dumps(sys.executable)}\n'
        f'args = [{json.dumps(str(SERVER))}, "stdio"]\nenv = {{ MCP_CALL_LOG = {json.dumps(str(log))} }}\n'
        f"writable = [{json.dumps(str(log.parent))}]\ntimeout_seconds = 20\n"
        '[policy]\ndefault = "allow"\n'
    )
    path = tmp_path / "harness.toml"
    path.write_text(toml)
    config = load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})
    with McpHub(config.resolved_servers({})) as hub:
        yield Catalog.from_config(config, host=hub), hub, tmp_path


def test_a_form_question_comes_back_as_an_ask_and_the_answers_reach_the_server(
    rooms: tuple[Catalog, McpHub, Path], log: Path
) -> None:
    catalog, _, tmp_path = rooms
    registry = catalog.registry()
    first = registry.run("rooms__book_room", {"room": "4B"}, ToolContext(workspace=tmp_path))
    assert first.asks is not None and not first.is_error
    (question,) = first.asks.questions
    assert question.mode == "form" and question.key == "booking" and question.message == "Who is room 4B for?"
    assert set(question.fields) == {"title", "people", "contact", "floor", "lunch", "day"}
    assert question.required == ("title", "people", "contact")
    assert first.asks.server == "rooms"
    assert first.asks.state and first.asks.state != "booking:4B"  # sealed by the server: opaque here
    ask = first.asks.answered("booking", InputAnswer("accept", by="UANN", ref="0123456789abcdef"))
    values = {"booking": {"title": "Planning", "people": 5, "contact": "ann@example.com"}}
    ctx = ToolContext(workspace=tmp_path, reply=reply_to(ask, values))
    done = registry.run("rooms__book_room", {"room": "4B"}, ctx)
    assert done.asks is None and not done.is_error
    assert done.content == "Booked room 4B: a 8-character title, 5 people."
    second = rounds(log)[-1]
    assert second["state"] == "booking:4B"  # the state went back exactly as it came (the server unsealed it)
    assert second["answers"]["booking"] == {"action": "accept", "content": values["booking"]}


def test_decline_and_cancel_reach_the_server_as_such(rooms: tuple[Catalog, McpHub, Path], log: Path) -> None:
    catalog, _, tmp_path = rooms
    registry = catalog.registry()
    asks = registry.run("rooms__book_room", {"room": "1A"}, ToolContext(workspace=tmp_path)).asks
    assert asks is not None
    declined = asks.answered("booking", InputAnswer("decline", by="UANN"))
    said = registry.run(
        "rooms__book_room", {"room": "1A"}, ToolContext(workspace=tmp_path, reply=reply_to(declined, {}))
    )
    assert said.content == "Room 1A was not booked: the person chose decline."
    said = registry.run(
        "rooms__book_room", {"room": "1A"}, ToolContext(workspace=tmp_path, reply=cancelled(asks))
    )
    assert said.content == "Room 1A was not booked: the person chose cancel."
    assert [r["answers"].get("booking", {}).get("action") for r in rounds(log)] == [None, "decline", "cancel"]


def test_a_url_question_keeps_its_address_and_names_its_domain(rooms: tuple[Catalog, McpHub, Path]) -> None:
    catalog, _, tmp_path = rooms
    asks = catalog.registry().run("rooms__sign_in", {"service": "crm"}, ToolContext(workspace=tmp_path)).asks
    assert asks is not None
    (question,) = asks.questions
    assert question.mode == "url" and question.domain == "auth.example.com"
    assert question.url == "https://auth.example.com/authorize?service=crm"


def test_a_secret_field_is_found_so_no_form_asks_for_it(rooms: tuple[Catalog, McpHub, Path]) -> None:
    catalog, _, tmp_path = rooms
    asks = catalog.registry().run("rooms__ask_secret", {}, ToolContext(workspace=tmp_path)).asks
    assert asks is not None and asks.questions[0].secret_fields == ("api_key",)


def test_an_ask_travels_as_json_whole(rooms: tuple[Catalog, McpHub, Path]) -> None:
    catalog, _, tmp_path = rooms
    asks = catalog.registry().run("rooms__book_room", {"room": "2"}, ToolContext(workspace=tmp_path)).asks
    assert asks is not None
    assert InputAsk.from_json(json.loads(json.dumps(asks.to_json()))) == asks
    reply_json = InputReply.from_json(json.loads(json.dumps(cancelled(asks).to_json())))
    assert reply_json == cancelled(asks)


def test_the_loop_parks_on_the_question_and_goes_on_with_the_answer(
    rooms: tuple[Catalog, McpHub, Path], log: Path
) -> None:
    catalog, _, tmp_path = rooms
    with FakeMessagesAPI() as model:
        model.script(
            reply(tool_use("rooms__ask_twice", {})),
            reply(text("Ann likes teal.")),
        )
        kept = {"r1": {"name": "Ann"}, "r2": {"colour": "teal"}}
        agent = Agent.from_config(
            load_config(tmp_path / "harness.toml", env={"HARNESS_WORKSPACE": str(tmp_path)}),
            catalog,
            client=anthropic.Anthropic(api_key="test", base_url=model.base_url, max_retries=0),
            input_values=lambda ask: {k: kept[a.ref] for k, a in ask.answers.items() if a.ref},
        )
        state: RunState = new_run("ask me twice")
        result = step(step(state, agent).state, agent)  # the reply, then its call
        assert isinstance(result.outcome, AwaitingInput)
        call = result.outcome.call
        assert call.asking is not None and call.asking.next_question is not None
        assert call.result is None and not call.started  # nothing ran: no outcome is unknown
        assert RunState.from_json(json.loads(json.dumps(result.state.to_json()))) == result.state
        assert result.state.to_json()["version"] == 2  # a release that cannot resume it leaves it
        state = record_input_answers(result.state, {call.id: InputAnswer("accept", "UANN", "r1")})
        result = step(state, agent)
        assert isinstance(result.outcome, AwaitingInput)  # its second question
        second = result.outcome.call
        assert second.asking is not None and second.asking.rounds == 2
        state = record_input_answers(result.state, {call.id: InputAnswer("accept", "UANN", "r2")})
        result = step(state, agent)
        assert result.outcome is None and result.state.to_json()["version"] == 1
        (tool_result,) = result.state.messages[-1]["content"]
        assert tool_result == {"type": "tool_result", "tool_use_id": call.id, "content": "Ann likes teal."}
        result = step(result.state, agent)
        assert isinstance(result.outcome, Finished) and result.outcome.answer == "Ann likes teal."
    assert len(rounds(log)) == 3


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("sampling", "it asked for 'sampling/createMessage', which this client does not offer"),
        ("http", "it asked the person to visit an address that is not https"),
        ("many", "it asked more than 8 questions at once"),
    ],
)
def test_a_question_no_person_may_be_asked_is_an_error_and_asks_nobody(
    rooms: tuple[Catalog, McpHub, Path], kind: str, why: str
) -> None:
    catalog, _, tmp_path = rooms
    said = catalog.registry().run("rooms__ask_hostile", {"kind": kind}, ToolContext(workspace=tmp_path))
    assert said.is_error and said.asks is None
    asked = "Error: rooms__ask_hostile asked for input this client cannot put to a person"
    assert said.content == f"{asked}: {why}. Nothing was asked."


def test_a_server_that_never_stops_asking_is_given_up_after_ten_rounds(
    rooms: tuple[Catalog, McpHub, Path], log: Path
) -> None:
    catalog, _, tmp_path = rooms
    registry = catalog.registry()
    result = registry.run("rooms__ask_hostile", {"kind": "forever"}, ToolContext(workspace=tmp_path))
    answered = 0
    while result.asks is not None:
        ask = result.asks
        question = ask.next_question
        assert question is not None
        ask = ask.answered(question.key, InputAnswer("accept", by="UANN", ref="r"))
        reply = reply_to(ask, {question.key: {"x": "y"}})
        result = registry.run(
            "rooms__ask_hostile", {"kind": "forever"}, ToolContext(workspace=tmp_path, reply=reply)
        )
        answered += 1
    assert answered == 10 and result.is_error
    assert (
        result.content
        == "Error: rooms__ask_hostile asked for input 10 times in one call; the call was given up."
    )
    assert len(rounds(log)) == 11
