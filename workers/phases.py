"""The phases of a run's life (`workers.life`): each says what the run needs next, and carries
what that phase needs; a phase does its work and returns the next one, never calls it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from harness.loop import (
    Agent,
    AwaitingLimit,
    Outcome,
)
from harness.outcomes import NotRun
from harness.state import (
    Decision,
    PendingCall,
    RunState,
)
from store import (
    ParkView,
    RunStatus,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Arrive:
    """The lease just taken: pay what an earlier driver owed, then go where the record says."""

    recovering: bool = False  # the watchdog sent this job: its driver died (counted)


@dataclass(frozen=True)
class Start:
    """A queued run: it takes its thread and starts from the thread's memory, or waits its turn."""


@dataclass(frozen=True)
class Advance:
    """A running run, stepped from `state` until it leaves the loop."""

    state: RunState


@dataclass(frozen=True)
class Leave:
    """The loop left with `outcome`: the run parks, or ends with what its thread is owed."""

    state: RunState
    agent: Agent
    outcome: Outcome


@dataclass(frozen=True)
class Park:
    """`calls` ask for people (once the thread's standing grants took theirs): one card each."""

    state: RunState
    agent: Agent
    calls: tuple[PendingCall, ...]


@dataclass(frozen=True)
class ParkForInput:
    """`call`'s server asks the requester something: the run waits for their answer."""

    state: RunState
    call: PendingCall


@dataclass(frozen=True)
class ParkForTask:
    """`call`'s server works on it as a task: the run waits for the task to end."""

    state: RunState
    call: PendingCall


@dataclass(frozen=True)
class ParkAtLimit:
    """A limit that asks: one card, Continue or Stop."""

    state: RunState
    outcome: AwaitingLimit


@dataclass(frozen=True)
class Parked:
    """A parked run: stopped on a Stop, resumed once every decision is in, else let go."""


@dataclass(frozen=True)
class Resume:
    """Every call of the park is decided (`view`): the run goes on with the decisions in `state`."""

    state: RunState
    view: ParkView


@dataclass(frozen=True)
class ResumeAtLimit:
    """The limit's card is answered: Continue goes on, Stop or the expiry ends the run."""

    state: RunState
    decisions: dict[str, Decision | None]


@dataclass(frozen=True)
class StopParked:
    """Stop pressed (`by`) while the run waited for people."""

    by: str


@dataclass(frozen=True)
class RetryIfClicked:
    """A failed run: retried if its Retry was clicked, else its thread let go."""


@dataclass(frozen=True)
class End:
    """The run ends as `status` (`valve`: what stopped it; `not_run`: calls a finished run left)."""

    status: RunStatus
    valve: str = ""
    not_run: NotRun | None = None


@dataclass(frozen=True)
class Finish:
    """The ended run lets its thread go; a `failed` one first looks for a Retry clicked meanwhile."""

    failed: bool = False


@dataclass(frozen=True)
class Gone:
    """The run is let go: `next_run`, the run its thread starts next (only `Finish` knows one)."""

    next_run: str | None = None


Phase = (
    Arrive
    | Start
    | Advance
    | Leave
    | Park
    | ParkForInput
    | ParkForTask
    | ParkAtLimit
    | Parked
    | Resume
    | ResumeAtLimit
    | StopParked
    | RetryIfClicked
    | End
    | Finish
)
