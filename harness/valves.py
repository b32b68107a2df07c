"""The numeric valves, checked at one chokepoint: before a turn's tools run, before a request."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from harness import texts
from harness.config import Limits
from harness.state import RunState, Usage


class Valve(StrEnum):
    """What stopped a run. The first three are ours; the rest are the model's stop reasons."""

    MAX_TURNS = "max_turns"
    TOKEN_BUDGET = "token_budget"
    NO_PROGRESS = "no_progress"
    MAX_TOKENS = "max_tokens"
    REFUSAL = "refusal"
    CONTEXT_WINDOW = "model_context_window_exceeded"
    UNKNOWN_STOP = "unknown_stop_reason"
    CRASHES = "crashes"  # the run took its worker down too often (set by the Slack driver)
    STOPPED_BY_USER = "stopped_by_user"  # a person pressed Stop (checked through `Agent.stop_check`)
    BUDGET = "budget"  # a daily budget of the user or the channel is spent (checked through `Agent.budget`)


# With `[limits] on_limit = "ask"` these valves ask to continue instead of stopping.
ASKING_VALVES = (Valve.MAX_TURNS, Valve.TOKEN_BUDGET, Valve.BUDGET)


@dataclass(frozen=True)
class Stop:
    """A valve closed: which one, and why in words a Slack user understands."""

    valve: Valve
    reason: str
    detail: str = ""  # the reason without its "Stopped by …" head: what a question at the limit says


class Budget(Protocol):
    """A spending gate kept outside the run (the workers' daily budgets, in Redis).

    `admit` is asked right before every model request, after the other valves, with an upper
    bound of what the request may cost (`estimate`: its input estimate plus `max_tokens`): None
    lets it go, a `Stop` (valve `budget`) holds it back. `granted`: Continue let this run go past
    the budget, so it is counted but never held back. Exactly one `spent` follows every admitted
    request, with what the reply cost (nothing when the request failed).
    """

    def admit(self, estimate: int, *, granted: bool) -> Stop | None: ...

    def spent(self, usage: Usage) -> None: ...


def turn_limit(state: RunState, limits: Limits) -> int:
    """Turns of tool calls the run may take: `max_turns` plus what Continue has granted."""
    return limits.max_turns + state.extra_turns


def token_limit(state: RunState, limits: Limits) -> int:
    """Tokens the run may use: `token_budget` plus what Continue has granted."""
    return limits.token_budget + state.extra_tokens


def allowance(valve: Valve, limits: Limits) -> int:
    """What one Continue at `valve` grants: one more `max_turns` (at least 1) or `token_budget`
    (at `budget`: this run may spend that many more tokens past the daily budget)."""
    return max(limits.max_turns, 1) if valve is Valve.MAX_TURNS else limits.token_budget


def check_budget(state: RunState, limits: Limits) -> Stop | None:
    """Valve 2: at or over the token budget, no further request is made."""
    limit = token_limit(state, limits)
    if state.usage.total >= limit:
        reason = texts.STOP_TOKEN_BUDGET.format(
            used=texts.plural(state.usage.total, "token"), limit=texts.plural(limit, "token")
        )
        return Stop(Valve.TOKEN_BUDGET, reason)
    return None


def check_turn(state: RunState, limits: Limits, signature: str) -> Stop | None:
    """Valves 1-3, checked when the model asks for tools, before the turn counter moves."""
    if state.turns >= turn_limit(state, limits):
        turns = texts.plural(turn_limit(state, limits), "turn")
        return Stop(Valve.MAX_TURNS, texts.STOP_MAX_TURNS.format(turns=turns))
    if stop := check_budget(state, limits):
        return stop
    return check_progress((*state.signatures, signature), limits.no_progress_window)


def check_progress(signatures: tuple[str, ...], window: int) -> Stop | None:
    """Valve 3: the newest turn repeats the one before, or the last turns repeat a short cycle."""
    if len(signatures) >= 2 and signatures[-1] == signatures[-2]:
        reason = texts.STOP_NO_PROGRESS_REPEAT.format(signature=_short(signatures[-1]))
        return Stop(Valve.NO_PROGRESS, reason)
    for period in range(2, window // 2 + 1):
        if len(signatures) >= 2 * period and signatures[-2 * period : -period] == signatures[-period:]:
            reason = texts.STOP_NO_PROGRESS_CYCLE.format(
                turns=texts.plural(2 * period, "turn"), period=texts.plural(period, "turn")
            )
            return Stop(Valve.NO_PROGRESS, reason)
    return None


def _short(signature: str, limit: int = 200) -> str:
    return signature if len(signature) <= limit else signature[:limit] + "…"
