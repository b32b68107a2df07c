"""What a step hands its driver: an outcome when the run leaves the loop, and events to show.

The loop's control signals are a tiny family of typed values (STYLE.md), matched in one place by
each driver (`harness.cli`, the worker); they live apart from the loop so that what a step says
can be read without how it decides it.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness import texts
from harness.state import PendingCall, RunState
from harness.valves import Valve


@dataclass(frozen=True)
class Finished:
    """The model wrapped up; `answer` is the text of all its final text blocks."""

    answer: str
    stop_reason: str


@dataclass(frozen=True)
class Stopped:
    """A valve (or a terminal stop reason of the model) ended the run."""

    valve: Valve
    reason: str


@dataclass(frozen=True)
class AwaitingApproval:
    """The run is parked until every one of `calls` has a decision."""

    calls: tuple[PendingCall, ...]


@dataclass(frozen=True)
class AwaitingInput:
    """The run is parked until the requester answers what the server of `call` asks
    (`call.asking.next_question`); the call then goes again with the answers."""

    call: PendingCall


@dataclass(frozen=True)
class AwaitingTask:
    """The run is parked while the server of `call` works on it as a task (`call.tasking`); the
    task's result, once it ends, answers the call (`harness.tools.tasks`)."""

    call: PendingCall


@dataclass(frozen=True)
class AwaitingLimit:
    """With `on_limit = "ask"`: the run reached `valve` (max turns, token budget, a daily budget) and waits.

    `continue_at_limit` grants `allowance` more of it and carries on; `stop_run(state, valve,
    reason)` ends it as that valve's stop. `question` says what was reached, for the person asked.
    """

    valve: Valve
    reason: str
    question: str
    allowance: int

    @property
    def more(self) -> str:
        """What Continue grants, in words: "8 more turns of tool calls", "40,000 more tokens"."""
        words = {Valve.MAX_TURNS: texts.LIMIT_MORE_TURNS, Valve.BUDGET: texts.LIMIT_MORE_PAST_BUDGET}
        return words.get(self.valve, texts.LIMIT_MORE_TOKENS).format(
            more=self.allowance, s="" if self.allowance == 1 else "s"
        )


@dataclass(frozen=True)
class Failed:
    """A model API error survived the SDK's retries; stepping the same state again retries."""

    error: str
    status_code: int | None = None


Outcome = Finished | Stopped | AwaitingApproval | AwaitingInput | AwaitingTask | AwaitingLimit | Failed


# --- events: what a front end shows as the run goes ------------------------------------------


@dataclass(frozen=True)
class ToolsRequested:
    turn: int
    calls: tuple[PendingCall, ...]


@dataclass(frozen=True)
class ToolReturned:
    turn: int
    call: PendingCall


@dataclass(frozen=True)
class TurnDone:
    """Every call of `turn` is answered; `tokens` is the run's total so far."""

    turn: int
    calls: tuple[PendingCall, ...]
    tokens: int


@dataclass(frozen=True)
class WrappedUp:
    turn: int
    stop_reason: str


Event = ToolsRequested | ToolReturned | TurnDone | WrappedUp


@dataclass(frozen=True)
class TextWritten:
    """A piece of the reply's text, as the model writes it (before the reply is whole)."""

    text: str


@dataclass(frozen=True)
class CallRunning:
    """`call` of `turn` is about to run (its write-ahead mark, if it needs one, is saved)."""

    turn: int
    call: PendingCall


# What a front end with a live view (`Agent.live`) sees as it happens, before the step returns:
# the reply's words, and each call as it starts and as it returns.
LiveEvent = TextWritten | CallRunning | ToolReturned


@dataclass(frozen=True)
class StepResult:
    state: RunState
    outcome: Outcome | None = None
    events: tuple[Event, ...] = ()
