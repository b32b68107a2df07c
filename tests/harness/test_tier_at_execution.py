"""The policy decides again right before a call runs, over the tools offered at that moment.

A run is parked between the reply that asked for its calls and the job that runs them; the tools
offered (an MCP server's list) and the policy (a redeployed config) may change in between. These
tests step the real loop over the real SDK and the Messages API stand-in, with the agent of the
resume built anew as a worker's next job builds it.
"""

from __future__ import annotations

import base64
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.loop import Agent, AwaitingApproval, Finished, drive, step
from harness.policy import Policy, Tier
from harness.state import Decision, RunState, Status, Verdict, new_run, record_decisions
from harness.tools import BUILTIN_TOOLS, Tool, ToolRegistry, ToolResult
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use


def recording_tool(name: str, ran: list[dict[str, Any]], *, schema: dict[str, Any] | None = None) -> Tool:
    """A tool of no tier of its own that records every call it really runs."""

    def call(_ctx: Any, args: dict[str, Any]) -> str:
        ran.append(args)
        return f"{name} ran"

    return Tool(
        name=name,
        description=f"the {name} tool",
        input_schema=schema or {"type": "object", "properties": {}},
        call=call,
    )


def agent_with(
    model: FakeMessagesAPI, workspace: Path, extra: list[Tool], policy: dict[str, str], default: str = "ask"
) -> Agent:
    agent = make_agent(model, workspace, policy=policy, default=default)
    return replace(agent, tools=ToolRegistry([*BUILTIN_TOOLS, *extra], timeout_seconds=5.0))


def park_on_write(model: FakeMessagesAPI, agent: Agent, *calls: dict[str, Any]) -> RunState:
    """Run until the reply's `write_file` call (an ask) parks the run."""
    model.check_tool_names = False
    ask = tool_use("write_file", {"path": "x.txt", "content": "hi"}, id="toolu_w")
    model.script(reply(ask, *calls), reply(text("done")))
    parked, outcome = drive(new_run("task"), agent, lambda e: None)
    assert isinstance(outcome, AwaitingApproval), outcome
    return parked


def approve(state: RunState, *ids: str) -> RunState:
    return record_decisions(state, {i: Decision(Verdict.APPROVED, by="U1") for i in ids})


def result_of(state: RunState, call_id: str) -> dict[str, Any]:
    for message in state.messages:
        if message["role"] == "user" and isinstance(message["content"], list):
            for block in message["content"]:
                if block.get("type") == "tool_result" and block["tool_use_id"] == call_id:
                    return block
    raise AssertionError(f"no result for {call_id}")


def test_a_tool_not_offered_when_the_reply_came_never_runs_once_it_is_offered(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    """The issue's attack: `desk__wipe` unknown at the reply, listed by the resume; policy deny."""
    ran: list[dict[str, Any]] = []
    at_reply = agent_with(model, workspace, [], {"desk__wipe": "deny", "write_file": "ask"}, default="allow")
    parked = park_on_write(model, at_reply, tool_use("desk__wipe", {}, id="toolu_x"))

    wipe = next(c for c in parked.pending if c.id == "toolu_x")
    assert wipe.tier is not Tier.ALLOW and wipe.result is not None and wipe.result.is_error
    # The resume's job: the server now lists the tool, and even a policy that allows it is too late.
    for policy in ({"desk__wipe": "deny"}, {"desk__wipe": "allow"}):
        later = agent_with(model, workspace, [recording_tool("desk__wipe", ran)], policy, default="allow")
        model.script(reply(text("done")))
        state, outcome = drive(approve(parked, "toolu_w"), later, lambda e: None)
        assert isinstance(outcome, Finished)
        answer = result_of(state, "toolu_x")
        assert answer["is_error"] is True and "no tool named 'desk__wipe'" in answer["content"]
    assert ran == []
    assert (workspace / "x.txt").read_text() == "hi"  # the approved call did run


def test_a_call_allowed_at_the_reply_but_denied_at_execution_does_not_run(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    ran: list[dict[str, Any]] = []
    tools = [recording_tool("desk__wipe", ran)]
    parked = park_on_write(
        model,
        agent_with(model, workspace, tools, {"desk__wipe": "allow"}),
        tool_use("desk__wipe", {}, id="toolu_x"),
    )
    assert next(c for c in parked.pending if c.id == "toolu_x").tier is Tier.ALLOW

    later = agent_with(model, workspace, tools, {"desk__wipe": "deny"})
    events: list[Any] = []
    state, outcome = drive(approve(parked, "toolu_w"), later, events.append)

    assert isinstance(outcome, Finished) and ran == []
    answer = result_of(state, "toolu_x")
    assert answer["is_error"] is True and "forbidden by policy" in answer["content"]
    summary = next(e for e in events if type(e).__name__ == "TurnDone")
    wipe = next(c for c in summary.calls if c.id == "toolu_x")
    assert wipe.tier is Tier.DENY and "decided again" in wipe.why and "it was allow" in wipe.why


def test_a_call_allowed_at_the_reply_but_ask_at_execution_waits_for_its_own_approval(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    ran: list[dict[str, Any]] = []
    tools = [recording_tool("deploy", ran)]
    parked = park_on_write(
        model, agent_with(model, workspace, tools, {"deploy": "allow"}), tool_use("deploy", {}, id="toolu_d")
    )
    later = agent_with(model, workspace, tools, {"deploy": "ask"})

    again = drive(approve(parked, "toolu_w"), later, lambda e: None)
    state, outcome = again
    assert isinstance(outcome, AwaitingApproval) and [c.id for c in outcome.calls] == ["toolu_d"]
    assert ran == [] and (workspace / "x.txt").read_text() == "hi"
    assert state.status is Status.AWAITING_APPROVAL

    declined = record_decisions(state, {"toolu_d": Decision(Verdict.DECLINED, by="U2")})
    _, outcome = drive(declined, later, lambda e: None)
    assert isinstance(outcome, Finished) and ran == []

    model.script(reply(text("done")))
    _, outcome = drive(approve(state, "toolu_d"), later, lambda e: None)
    assert isinstance(outcome, Finished) and ran == [{}]


def test_an_approved_call_whose_tool_is_no_longer_offered_answers_an_error(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    ran: list[dict[str, Any]] = []
    tools = [recording_tool("tickets__close", ran)]
    parked = park_on_write(
        model,
        agent_with(model, workspace, tools, {"tickets__close": "ask"}),
        tool_use("tickets__close", {}, id="toolu_t"),
    )
    later = agent_with(model, workspace, [], {"tickets__close": "ask"})  # its server is gone
    state, outcome = drive(approve(parked, "toolu_w", "toolu_t"), later, lambda e: None)

    assert isinstance(outcome, Finished) and ran == []
    answer = result_of(state, "toolu_t")
    assert answer["is_error"] is True and "is offered now" in answer["content"]


def test_an_approved_call_now_denied_does_not_run_and_a_decline_stands_when_now_allowed(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    ran: list[dict[str, Any]] = []
    tools = [recording_tool("deploy", ran)]
    parked = park_on_write(
        model, agent_with(model, workspace, tools, {"deploy": "ask"}), tool_use("deploy", {}, id="toolu_d")
    )
    approved = approve(parked, "toolu_w", "toolu_d")
    state, outcome = drive(approved, agent_with(model, workspace, tools, {"deploy": "deny"}), lambda e: None)
    assert isinstance(outcome, Finished) and ran == []
    assert "forbidden by policy" in result_of(state, "toolu_d")["content"]

    declined = record_decisions(
        parked,
        {"toolu_w": Decision(Verdict.APPROVED, by="U1"), "toolu_d": Decision(Verdict.DECLINED, by="U1")},
    )
    model.script(reply(text("done")))
    state, outcome = drive(declined, agent_with(model, workspace, tools, {"deploy": "allow"}), lambda e: None)
    assert isinstance(outcome, Finished) and ran == []
    assert "declined" in result_of(state, "toolu_d")["content"]


def test_an_edit_now_denied_by_an_argument_rule_does_not_run(model: FakeMessagesAPI, workspace: Path) -> None:
    from harness.policy import Rule

    agent = make_agent(model, workspace)
    parked = park_on_write(model, agent)
    edited = Decision(Verdict.APPROVED, by="U1", edited_input={"path": "secrets/x.txt", "content": "hi"})
    rule = Rule(1, "write_file", {"path": "secrets/**"}, Tier.DENY)
    later = replace(agent, policy=Policy(rules=(rule,)))
    state, outcome = drive(record_decisions(parked, {"toolu_w": edited}), later, lambda e: None)
    assert isinstance(outcome, Finished)
    assert "edited arguments" in result_of(state, "toolu_w")["content"]
    assert not (workspace / "secrets").exists()


def test_no_unknown_tool_is_ever_allow_even_with_a_default_of_allow(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    model.check_tool_names = False
    model.script(reply(tool_use("launch_rockets", {}, id="toolu_r")), reply(text("ok")))
    agent = make_agent(model, workspace, policy={}, default="allow")
    result = step(new_run("task"), agent)
    (call,) = result.state.pending
    assert call.tier is Tier.DENY and call.result is not None and call.result.is_error
    assert "no tool of that name is offered" in call.why


def test_input_the_schema_refuses_is_answered_before_anyone_is_asked(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    """An `ask` call with bad arguments never becomes a card: a person would approve a call that fails."""
    model.script(reply(tool_use("write_file", {"path": 7}, id="toolu_bad")), reply(text("ok")))
    state, outcome = drive(new_run("task"), make_agent(model, workspace), lambda e: None)
    assert isinstance(outcome, Finished)  # never AwaitingApproval
    answer = result_of(state, "toolu_bad")
    assert answer["is_error"] is True and "invalid input for write_file" in answer["content"]


# --- images: only the turn being answered carries them ------------------------------------------


def image_tool(size: int) -> Tool:
    data = base64.b64encode(b"\x89PNG" + b"\0" * size).decode()

    def call(_ctx: Any, _args: dict[str, Any]) -> ToolResult:
        block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
        return ToolResult([{"type": "text", "text": "a picture"}, block])

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    return Tool("snap", "takes a picture", schema, call, side_effects=False)


def images_in(request: dict[str, Any]) -> int:
    count = 0
    for message in request["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else ():
            inner = block.get("content") if block.get("type") == "tool_result" else None
            count += sum(1 for b in inner or () if b.get("type") == "image")
    return count


def test_images_of_earlier_turns_leave_later_requests_and_the_stored_run(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    """Ten turns of a 3 MB picture each: every request stays far under the API's 32 MB."""
    turns = 10
    snaps = [reply(tool_use("snap", {"n": i}, id=f"toolu_{i}")) for i in range(turns)]
    model.script(*snaps, reply(text("done")))
    agent = replace(
        make_agent(model, workspace, policy={"snap": "allow"}, max_turns=turns + 1, token_budget=10**9),
        tools=ToolRegistry([image_tool(3_000_000)]),
    )
    state, outcome = drive(new_run("snap away"), agent, lambda e: None)

    assert isinstance(outcome, Finished) and model.errors == []
    requests = model.requests
    assert [images_in(r) for r in requests] == [0] + [1] * turns
    stored = sum(len(str(m)) for m in state.to_json()["messages"])
    assert stored < 5_000_000  # one picture's worth, not ten
    assert "earlier turn" in str(state.messages[2])


def test_one_turns_images_are_held_to_what_one_request_may_carry(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    """Five parallel calls of 7 MB pictures: the turn keeps what fits, the rest become a note."""
    calls = [tool_use("snap", {}, id=f"toolu_{i}") for i in range(5)]
    model.script(reply(*calls), reply(text("done")))
    agent = replace(
        make_agent(model, workspace, policy={"snap": "allow"}, token_budget=10**9),
        tools=ToolRegistry([image_tool(5_000_000)]),
    )
    state, outcome = drive(new_run("snap"), agent, lambda e: None)
    assert isinstance(outcome, Finished) and model.errors == []
    last = model.requests[-1]
    assert 1 <= images_in(last) < 5
    assert "left out" in str(state.messages[2])
