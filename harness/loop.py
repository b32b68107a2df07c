"""The agent loop as a step function: `step(state, agent) -> StepResult`.

A step does one of two things. With calls pending, it resolves them in the model's order (run,
refuse, or wait for a human) and, once every call of the turn is answered, appends ONE user
message holding all their `tool_result` blocks. Otherwise it checks the valves and makes one
model request. It returns the next state, an outcome when the run must leave the loop, and the
events a front end shows. It touches no Slack and no Redis, so a driver can park the state
between any two steps.

This module is the loop itself, to be read on one screen; what it leans on has a module each:
the request (`harness.request`), each call (`harness.calls`), the ways out at a valve
(`harness.stops`), the outcomes and events (`harness.signals`) and the agent (`harness.agent`).
The outcomes, the events and the agent are importable from here too, as every driver imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import anthropic

from harness import texts
from harness.agent import Agent
from harness.calls import (
    answer_call,
    calls_in,
    marks_first,
    metered,
    needs_write_ahead,
    rule_open_calls,
    saves_first,
    tool_result,
    uncount,
    untrusted_read,
    with_call,
)
from harness.context import fit_images, within_input_limit, without_old_images
from harness.request import (
    append_assistant,
    build_request,
    create_message,
    over_budget,
    reply_content,
    usage_of,
)
from harness.signals import (
    AwaitingApproval,
    AwaitingInput,
    AwaitingLimit,
    AwaitingTask,
    CallRunning,
    Event,
    Failed,
    Finished,
    Outcome,
    StepResult,
    Stopped,
    ToolReturned,
    ToolsRequested,
    TurnDone,
    WrappedUp,
)
from harness.state import PendingCall, RunState, Status
from harness.stops import (
    ask_at_limit,
    asks,
    held_calls,
    stop_mid_turn,
    stop_or_ask,
    stop_requested,
    stopped,
    terminal_stop,
)
from harness.tools import ToolResult
from harness.valves import Stop, Valve, allowance, check_budget, check_turn

__all__ = [
    "Agent",
    "AwaitingApproval",
    "AwaitingInput",
    "AwaitingLimit",
    "AwaitingTask",
    "Event",
    "Failed",
    "Finished",
    "Outcome",
    "Stopped",
    "ToolReturned",
    "ToolsRequested",
    "TurnDone",
    "WrappedUp",
    "continue_at_limit",
    "drive",
    "saves_first",
    "step",
    "stop_run",
]


def step(state: RunState, agent: Agent) -> StepResult:
    """Advance `state` by one model request or by resolving the current turn's calls."""
    if state.status not in (Status.RUNNING, Status.AWAITING_APPROVAL, Status.FAILED):
        raise ValueError(f"a {state.status} run has nothing left to do")
    if state.pending:
        return _resolve_calls(state, agent)
    return _query(state, agent)


def drive(state: RunState, agent: Agent, on_event: Callable[[Event], None]) -> tuple[RunState, Outcome]:
    """Step until the run leaves the loop, handing every event to `on_event`."""
    while True:
        result = step(state, agent)
        for event in result.events:
            on_event(event)
        state = result.state
        if result.outcome is not None:
            return state, result.outcome


def _query(state: RunState, agent: Agent) -> StepResult:
    if stop := stop_requested(agent):
        return stopped(state, stop)
    if stop := check_budget(state, agent.limits):
        return stop_or_ask(state, agent, stop)
    # Cleared in the state, not just the request: the thread's saved history stays bounded too.
    aged = without_old_images(state.messages, agent.token_memo)
    if aged is not state.messages:
        state = replace(state, messages=aged)
    request = build_request(state, agent)
    limited = within_input_limit(state, request, agent.limits.max_input_tokens, agent.token_memo)
    if limited is not state:
        state, request = limited, build_request(limited, agent)
    if stop := over_budget(state, agent, request):
        return stop_or_ask(state, agent, stop)
    try:
        message = create_message(agent, request)
    except anthropic.APIStatusError as exc:
        return _failed(state, exc, exc.status_code)
    except anthropic.APIError as exc:
        return _failed(state, exc, None)
    content = reply_content(message)
    state = replace(
        state,
        status=Status.RUNNING,
        requests=state.requests + 1,
        usage=state.usage.plus(usage_of(message.usage)),
        messages=append_assistant(state.messages, content),
    )
    turn = state.turns + 1
    reason = message.stop_reason
    content = state.messages[-1]["content"]  # after a pause_turn, the whole merged message
    if reason == "tool_use":
        return _start_turn(state, agent, content)
    if reason in ("end_turn", "stop_sequence"):
        answer = "\n\n".join(b["text"] for b in content if b["type"] == "text").strip()
        done = replace(state, status=Status.FINISHED)
        return StepResult(done, Finished(answer, reason), (WrappedUp(turn, reason),))
    if reason == "pause_turn":
        return StepResult(state)  # the next step sends the paused reply back as it is
    # Terminal: a tool_use cut off by max_tokens is never run; `stopped` answers it as not run.
    return stopped(
        replace(state, pending=calls_in(content, agent, untrusted_read(state, agent))),
        terminal_stop(reason, agent.limits, content),
    )


def _start_turn(state: RunState, agent: Agent, content: list[dict[str, Any]]) -> StepResult:
    calls = calls_in(content, agent, untrusted_read(state, agent))
    signature = ",".join(sorted(c.signature for c in calls))
    if stop := check_turn(state, agent.limits, signature):
        if asks(agent, stop):  # the reply stays; its calls are started (or answered) after the answer
            return ask_at_limit(state, agent, stop)
        return stopped(replace(state, pending=calls), stop)
    state = replace(
        state,
        turns=state.turns + 1,
        signatures=(*state.signatures, signature),
        pending=calls,
    )
    return StepResult(state, None, (ToolsRequested(state.turns, calls),))


def _resolve_calls(state: RunState, agent: Agent) -> StepResult:
    events: list[Event] = []
    state = rule_open_calls(state, agent)
    for index, call in enumerate(state.pending):
        if call.result is not None:
            continue
        marks = marks_first(agent, call)
        # A call already running has finished; no other starts. A call that writes its mark first is
        # asked after the mark is written (a driver reads a Stop in that same write).
        if not marks and (stop := stop_requested(agent)):
            return stop_mid_turn(state, stop, events)
        if call.awaiting:
            # No call runs ahead of an earlier one still waiting; all waiting ones are asked at once.
            parked = replace(state, status=Status.AWAITING_APPROVAL)
            return StepResult(parked, AwaitingApproval(state.awaiting), tuple(events))
        if call.waits_for_input:  # its server's next question, still to a person
            return _await_input(state, call, events)
        if call.waits_on_task:  # it started as its server's task, which has not ended
            return _await_task(state, call, events)
        if not call.started and (counted := metered(agent, call)) is not call:  # past a limit now
            state = with_call(state, index, counted)
            if counted.awaiting:
                return StepResult(
                    replace(state, status=Status.AWAITING_APPROVAL),
                    AwaitingApproval(state.awaiting),
                    tuple(events),
                )
            events.append(ToolReturned(state.turns, counted))
            continue
        if needs_write_ahead(agent, call):
            if call.started:  # an earlier attempt began it and died before recording what happened
                result = ToolResult(texts.RESULT_OUTCOME_UNKNOWN.format(name=call.name), True)
                call = replace(call, result=result)
                state = with_call(state, index, call)
                events.append(ToolReturned(state.turns, call))
                continue
            marked = with_call(state, index, replace(call, started=True))
            if agent.before_tool is not None:
                agent.before_tool(marked, marked.pending[index])  # persists the mark; raising stops here
            if stop := stop_requested(agent):  # it never started: answered as not run, not as unknown
                uncount(agent, call)
                return stop_mid_turn(state, stop, events)
            state, call = marked, marked.pending[index]
        if agent.live is not None:
            agent.live(CallRunning(state.turns, call))
        if agent.tracer is None:
            result = answer_call(agent, call)
        else:
            result = agent.tracer.tool(call, partial(answer_call, agent, call))
        if result.asks is not None:  # the server asks a person first: nothing ran, so not `started`
            call = replace(call, asking=result.asks, started=False)
            state = with_call(state, index, call)
            return _await_input(state, call, events)
        if result.task is not None:  # the server works on it as a task: its result comes later
            call = replace(call, tasking=result.task)
            state = with_call(state, index, call)
            return _await_task(state, call, events)
        call = replace(call, result=result)
        state = with_call(state, index, call)
        returned = ToolReturned(state.turns, call)
        if agent.live is not None:
            agent.live(returned)
        events.append(returned)
    results = fit_images([tool_result(c.id, c.result) for c in state.pending if c.result is not None])
    events.append(TurnDone(state.turns, state.pending, state.usage.total))
    state = replace(
        state,
        status=Status.RUNNING,
        pending=(),
        messages=(*state.messages, {"role": "user", "content": results}),
    )
    return StepResult(state, None, tuple(events))


def _await_input(state: RunState, call: PendingCall, events: list[Event]) -> StepResult:
    """Park the turn on `call`'s question to a person; the calls before it keep their results."""
    parked = replace(state, status=Status.AWAITING_APPROVAL)
    return StepResult(parked, AwaitingInput(call), tuple(events))


def _await_task(state: RunState, call: PendingCall, events: list[Event]) -> StepResult:
    """Park the turn on `call`'s task; the calls before it keep their results."""
    parked = replace(state, status=Status.AWAITING_APPROVAL)
    return StepResult(parked, AwaitingTask(call), tuple(events))


def stop_run(state: RunState, valve: Valve, reason: str) -> RunState:
    """`state` ended by `valve` from outside the loop: open calls answered as not run."""
    return stopped(state, Stop(valve, reason)).state


def continue_at_limit(state: RunState, agent: Agent) -> StepResult:
    """Continue a run waiting at a limit: one more allowance of that limit, then on from where it was.

    A run held when the model asked for tools starts that turn now (the valves are checked again,
    so it may stop for no progress or wait at the other limit); one held before a request makes it
    on the next step.
    """
    if state.status is not Status.AWAITING_LIMIT:
        raise ValueError(f"a {state.status} run is not waiting at a limit")
    valve = Valve(state.at_limit)
    more = allowance(valve, agent.limits)
    if valve is Valve.MAX_TURNS:
        state = replace(state, extra_turns=state.extra_turns + more)
    elif valve is Valve.BUDGET:
        state = replace(state, past_budget_until=state.usage.total + more)
    else:
        state = replace(state, extra_tokens=state.extra_tokens + more)
    state = replace(state, status=Status.RUNNING, at_limit="")
    held = held_calls(state)
    if held:
        return _start_turn(state, agent, state.messages[-1]["content"])
    return StepResult(state)


def _failed(state: RunState, exc: Exception, status_code: int | None) -> StepResult:
    error = texts.FAILED_MODEL_API.format(error=_describe(exc))
    return StepResult(replace(state, status=Status.FAILED), Failed(error, status_code))


def _describe(exc: Exception) -> str:
    if isinstance(exc, anthropic.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        detail = body.get("error", {}) if isinstance(body.get("error"), dict) else {}
        kind = detail.get("type") or type(exc).__name__
        return f"{exc.status_code} {kind}: {detail.get('message') or exc.message}"
    return f"{type(exc).__name__}: {exc}"
