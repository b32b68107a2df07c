"""How a run leaves the loop at a valve: stopped, its open calls answered, or held at a limit.

Every way out keeps the conversation valid to continue (each `tool_use` gets its `tool_result`),
whether a valve, a person's Stop or the model's own stop reason ends the run; with
`on_limit = "ask"`, a limit holds it instead, with no call started.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from harness import texts
from harness.agent import Agent
from harness.calls import tool_result
from harness.config import Limits
from harness.signals import AwaitingLimit, Event, StepResult, Stopped, TurnDone
from harness.state import PendingCall, RunState, Status
from harness.tools import ToolResult
from harness.valves import ASKING_VALVES, Stop, Valve, allowance, token_limit, turn_limit


def stop_requested(agent: Agent) -> Stop | None:
    return agent.stop_check() if agent.stop_check is not None else None


def asks(agent: Agent, stop: Stop) -> bool:
    return agent.limits.on_limit == "ask" and stop.valve in ASKING_VALVES


def stop_or_ask(state: RunState, agent: Agent, stop: Stop) -> StepResult:
    return ask_at_limit(state, agent, stop) if asks(agent, stop) else stopped(state, stop)


def ask_at_limit(state: RunState, agent: Agent, stop: Stop) -> StepResult:
    """Hold the run at `stop`'s limit (with no call started) until Continue or Stop."""
    limits = agent.limits
    if stop.valve is Valve.MAX_TURNS:
        question = texts.LIMIT_MAX_TURNS.format(turns=texts.plural(turn_limit(state, limits), "turn"))
    elif stop.valve is Valve.BUDGET:
        question = texts.LIMIT_BUDGET.format(
            detail=stop.detail or stop.reason
        )  # which, its size, when it resets
    else:
        used, limit = state.usage.total, token_limit(state, limits)
        question = texts.LIMIT_TOKEN_BUDGET.format(
            used=texts.plural(used, "token"), limit=texts.plural(limit, "token")
        )
    held = replace(state, status=Status.AWAITING_LIMIT, at_limit=stop.valve.value, pending=())
    return StepResult(held, AwaitingLimit(stop.valve, stop.reason, question, allowance(stop.valve, limits)))


def held_calls(state: RunState) -> list[str]:
    """Ids of the `tool_use` blocks of a reply whose turn never started (held at a limit)."""
    last = state.messages[-1] if state.messages else None
    if state.pending or last is None or last["role"] != "assistant" or not isinstance(last["content"], list):
        return []
    return [b["id"] for b in last["content"] if b.get("type") == "tool_use"]


def stopped(state: RunState, stop: Stop) -> StepResult:
    """End the run, answering any call left open so the conversation stays valid to continue."""
    note = texts.RESULT_NOT_RUN_STOPPED.format(valve=stop.valve.value)
    if state.pending:
        results = [tool_result(c.id, _not_run(c, note)) for c in state.pending]
        state = replace(state, messages=(*state.messages, {"role": "user", "content": results}))
    elif held := held_calls(state):
        results = [tool_result(call_id, ToolResult(note, True)) for call_id in held]
        state = replace(state, messages=(*state.messages, {"role": "user", "content": results}))
    state = replace(state, status=Status.STOPPED, pending=(), at_limit="")
    return StepResult(state, Stopped(stop.valve, stop.reason))


def stop_mid_turn(state: RunState, stop: Stop, events: list[Event]) -> StepResult:
    """Stop between two calls of a turn: its summary shows what ran and what did not."""
    note = texts.RESULT_NOT_RUN_STOPPED.format(valve=stop.valve.value)
    calls = tuple(replace(c, result=_not_run(c, note)) for c in state.pending)
    done = TurnDone(state.turns, calls, state.usage.total)
    result = stopped(state, stop)
    return replace(result, events=(*events, done))


def _not_run(call: PendingCall, note: str) -> ToolResult:
    """The result of a call at a stop: its own if it ran; unknown if it was begun and not recorded."""
    if call.result is not None:
        return call.result
    if call.started:
        return ToolResult(texts.RESULT_OUTCOME_UNKNOWN.format(name=call.name), True)
    return ToolResult(note, True)


def terminal_stop(reason: str | None, limits: Limits, content: list[dict[str, Any]]) -> Stop:
    if reason == "max_tokens":
        cut = texts.STOP_MAX_TOKENS_CUT_TOOLS if any(b["type"] == "tool_use" for b in content) else ""
        limit = texts.plural(limits.max_tokens, "token")
        return Stop(Valve.MAX_TOKENS, texts.STOP_MAX_TOKENS.format(limit=limit, cut_tools=cut))
    if reason == "refusal":
        return Stop(Valve.REFUSAL, texts.STOP_REFUSAL)
    if reason == "model_context_window_exceeded":
        return Stop(Valve.CONTEXT_WINDOW, texts.STOP_CONTEXT_WINDOW)
    return Stop(Valve.UNKNOWN_STOP, texts.STOP_UNKNOWN_REASON.format(reason=reason))
