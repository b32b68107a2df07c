"""Work a tool's server does as a task: the handle a call answers with, and what a poll finds.

A server may answer a call not with its result but with a task (MCP's Tasks: the
`io.modelcontextprotocol/tasks` extension of 2026-07-28, where the server decides per call, and the
2025-11-25 tasks, where a tool says it runs only as one). The run parks on the task rather than
holding a worker while it works; the worker that holds the server's session polls it (`tasks/get`)
at the server's pace, and its result, once the task ends, answers the call (`workers.tasks`). Stop
and a task past the server's `timeout_seconds` send `tasks/cancel`.

A stdio server's tasks live in its process, which only the worker that started it reaches: the
handle names that worker's hub (`holder`); an HTTP server's may be polled by any worker.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from harness import texts

if TYPE_CHECKING:
    from harness.tools.base import ToolResult

WORKING, INPUT_REQUIRED = "working", "input_required"
COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED})
UNREACHABLE = "unreachable"  # a poll's own status: the server could not be asked now (try again)

ID_MAX = 200  # characters of a task id kept; a longer one is refused as a bad handle
MESSAGE_MAX = 300  # characters of a status message kept (it is shown in Slack, cut)
POLL_MIN, POLL_MAX = 0.5, 60.0  # seconds between polls, whatever the server suggests
POLL_FIRST = 1.0  # seconds before the first poll when the server suggests none (then doubling)


class BadTask(ValueError):
    """A task handle this client cannot hold (no id, an id too long)."""


@dataclass(frozen=True)
class TaskHandle:
    """A call's task: which server holds it, its id, where it stands, and until when it may run.

    `since` and `deadline` are wall-clock seconds (the call's start, and that plus the server's
    `timeout_seconds`); `holder` is the hub that alone can reach it ("" for any worker's);
    `side_effects`: whether the call's tool has any, for what a timeout says. `tool`: the tool
    called (its name on the server); `protocol`: the protocol version of the session the task was
    made on (a task is only polled on a session of the same kind: `harness.tools.mcp_tasks`).
    """

    server: str
    task_id: str
    status: str = WORKING
    message: str = ""
    poll_seconds: float | None = None  # the server's `pollInterval`, if it gave one
    since: float = 0.0
    deadline: float = 0.0
    holder: str = ""
    side_effects: bool = True
    polls: int = 0  # polls made so far (the backoff when the server suggests no interval)
    tool: str = ""
    protocol: str = ""

    def __post_init__(self) -> None:
        if not self.task_id or len(self.task_id) > ID_MAX:
            raise BadTask("a task id must be 1 to 200 characters")

    def next_poll_in(self) -> float:
        """Seconds to the next poll: the server's interval, else doubling from one second; both
        within `POLL_MIN` and `POLL_MAX`."""
        if self.poll_seconds is not None and math.isfinite(self.poll_seconds):
            wanted = self.poll_seconds
        else:
            wanted = POLL_FIRST * 2 ** min(self.polls, 6)
        return min(max(wanted, POLL_MIN), POLL_MAX)

    def seen(self, status: str, message: str, poll_seconds: float | None) -> TaskHandle:
        """The handle after a poll that found the task `status`."""
        poll = poll_seconds if poll_seconds is not None else self.poll_seconds
        return replace(
            self, status=status, message=message[:MESSAGE_MAX], poll_seconds=poll, polls=self.polls + 1
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "task_id": self.task_id,
            "status": self.status,
            "message": self.message,
            "poll_seconds": self.poll_seconds,
            "since": self.since,
            "deadline": self.deadline,
            "holder": self.holder,
            "side_effects": self.side_effects,
            "polls": self.polls,
            "tool": self.tool,
            "protocol": self.protocol,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskHandle:
        poll = data.get("poll_seconds")
        return cls(
            server=str(data["server"]),
            task_id=str(data["task_id"]),
            status=str(data.get("status", WORKING)),
            message=str(data.get("message", ""))[:MESSAGE_MAX],
            poll_seconds=float(poll) if isinstance(poll, int | float) else None,
            since=float(data.get("since", 0.0)),
            deadline=float(data.get("deadline", 0.0)),
            holder=str(data.get("holder", "")),
            side_effects=bool(data.get("side_effects", True)),
            polls=int(data.get("polls", 0)),
            tool=str(data.get("tool", "")),
            protocol=str(data.get("protocol", "")),
        )


@dataclass(frozen=True)
class TaskPoll:
    """What one `tasks/get` found: the task's status and message, the server's suggested interval,
    and, once the task ended (or is gone, or asks what this client cannot answer), the result that
    answers the call. `UNREACHABLE`: the server could not be asked now (`message` says why)."""

    status: str
    message: str = ""
    poll_seconds: float | None = None
    result: ToolResult | None = None

    @property
    def ended(self) -> bool:
        return self.result is not None


def timed_out(handle: TaskHandle, name: str) -> ToolResult:
    """What answers a call whose task outlived its server's `timeout_seconds` (it was told to
    cancel): as a call past its timeout is answered (`harness.tools.mcp`)."""
    from harness.tools.base import ToolResult  # base imports this module: ToolResult is read late

    seconds = max(0.0, handle.deadline - handle.since)
    text = texts.MCP_TIMED_OUT_OUTCOME_UNKNOWN if handle.side_effects else texts.RESULT_TIMED_OUT
    return ToolResult(text.format(name=name, seconds=round(seconds)), True)


def stopped(handle: TaskHandle, name: str) -> ToolResult:
    """What answers a call whose run was stopped while its task worked (it was told to cancel)."""
    from harness.tools.base import ToolResult

    return ToolResult(texts.MCP_TASK_STOPPED.format(name=name, server=handle.server), True)


def follow(
    host: TaskHost,
    handle: TaskHandle,
    name: str,
    *,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.time,
    seen: Callable[[TaskHandle], object] = lambda handle: None,
) -> ToolResult:
    """Poll `handle` at its server's pace until its task ends (its result) or outlives its deadline
    (cancelled, and answered as timed out): the terminal's way, which may wait where it is. `seen`
    hears each poll that found the task still working."""
    while True:
        left = handle.deadline - clock()
        if left <= 0:
            host.cancel_task(handle)
            return timed_out(handle, name)
        sleep(min(handle.next_poll_in(), left))
        if clock() >= handle.deadline:
            continue  # its time ran out while we waited: cancelled above, not polled
        poll = host.poll_task(handle)
        if poll.result is not None:
            return poll.result
        if poll.status == UNREACHABLE:
            handle = replace(handle, polls=handle.polls + 1)
            continue
        handle = handle.seen(poll.status, poll.message, poll.poll_seconds)
        seen(handle)


@runtime_checkable
class TaskHost(Protocol):
    """Who reaches the servers' tasks: the hub of the worker (`harness.tools.mcp.McpHub`)."""

    @property
    def holder(self) -> str:
        """This hub's id: the `holder` of the tasks of its stdio servers."""
        ...

    def poll_task(self, handle: TaskHandle) -> TaskPoll:
        """Where the task stands now (`tasks/get`); never raises."""
        ...

    def cancel_task(self, handle: TaskHandle) -> bool:
        """Ask the server to cancel the task (`tasks/cancel`); True when it acknowledged."""
        ...
