"""The tools of a run, by name: runs a call and always returns a `ToolResult`, never raises."""

from __future__ import annotations

import copy
import os
import queue
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from harness import texts
from harness.tools.base import (
    RESULT_LIMIT_CHARS,
    BadInput,
    Tool,
    ToolContext,
    ToolError,
    ToolResult,
    bounded,
    cut,
)
from harness.tools.tool_search import request_tools

# Answers a call to a name no tool has, when the name belongs to a source that is away (an MCP
# server that is down); None when the name is simply unknown.
Absent = Callable[[str], "ToolResult | None"]


IDLE_LANE = "tool-lane"  # the name of a lane thread, until a call on it times out
_API_TOOL_NAME = re.compile("^[a-zA-Z0-9_-]{1,64}$")  # the Messages API's rule for a tool's name


class _TimedOut(Exception):
    """A call that outlived the registry's timeout; its thread may still be running it."""


class DuplicateTool(ValueError):
    """Two tools of one name: the process stops at start rather than pick one."""


class ToolRegistry:
    """The tools of a run, by name; runs a call and always returns a `ToolResult`."""

    def __init__(
        self, tools: Iterable[Tool], timeout_seconds: float = 30.0, absent: Absent | None = None
    ) -> None:
        self._tools: dict[str, Tool] = {}
        for found in tools:
            if found.name in self._tools:
                raise DuplicateTool(f"two tools are named {found.name!r}")
            self._tools[found.name] = found
        self._timeout = timeout_seconds
        self._absent = absent
        # Built once: rebuilding JSON schemas on every request was most of the loop's own cost.
        offered = self._tools.values()
        self._deferred = frozenset(t.name for t in offered if t.deferred)
        self._schemas = request_tools([t.schema() for t in offered], self._deferred)
        self._lanes = threading.local()
        self._retired: dict[str, dict[str, Any]] = {}  # defined for the history only: see `keeping`

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Any:
        return iter(self._tools.values())

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """The request's `tools`: deferred ones marked, and the tool search tool when any is."""
        return self._schemas

    def deferred(self) -> frozenset[str]:
        """The tools sent through the tool search (`Tool.deferred`)."""
        return self._deferred

    def keeping(self, named: Iterable[str], before: ToolRegistry | None = None) -> ToolRegistry:
        """This registry, also defining each tool of `named` it does not offer (an MCP server
        removed it, or went away): with `before`'s definition when it had one, else a placeholder.

        The API refuses a request whose history names a tool its `tools` do not define, so such a
        tool keeps a definition in `schemas()`, and nothing else: it is not offered (`get`, `run`,
        `in`), and a call of it is answered as one of a tool not offered. A name the API would
        refuse as a tool's (one a model invented) is left out.
        """
        gone = {}
        for name in dict.fromkeys(named):
            if name in self._tools or name in self._retired or not _API_TOOL_NAME.fullmatch(name):
                continue
            found = before._defined(name) if before is not None else None
            gone[name] = found or {
                "name": name,
                "description": texts.TOOL_NO_LONGER_OFFERED,
                "input_schema": {"type": "object"},
            }
        if not gone:
            return self
        kept = copy.copy(self)
        kept._retired = {**self._retired, **gone}
        kept._schemas = [*self._schemas, *gone.values()]
        return kept

    def _defined(self, name: str) -> dict[str, Any] | None:
        found = self._tools.get(name)
        return found.schema() if found is not None else self._retired.get(name)

    def not_offered(self, name: str) -> ToolResult:
        """The answer to a call of a tool this registry does not offer (its server may be away)."""
        away = self._absent(name) if self._absent is not None else None
        if away is not None:
            return away
        names = ", ".join(self._tools) or "none"
        return ToolResult(texts.RESULT_NOT_OFFERED.format(name=name, names=names), True)

    def run(self, name: str, raw_input: Any, ctx: ToolContext) -> ToolResult:
        """Validate `raw_input` against the tool's schema, run it, and cut what it returns."""
        found = self._tools.get(name)
        if found is None:
            return self.not_offered(name)
        try:
            args = found.checked(raw_input)
        except BadInput as exc:
            return ToolResult(texts.RESULT_BAD_INPUT.format(name=name, problems=exc), True)
        try:
            output = self._call_with_timeout(found, ctx, args)
        except _TimedOut:
            # A side effect may still land after this answer; a retry by the model could apply it twice.
            text = texts.RESULT_TIMED_OUT_OUTCOME_UNKNOWN if found.side_effects else texts.RESULT_TIMED_OUT
            return ToolResult(text.format(name=name, seconds=self._timeout), True)
        except ToolError as exc:
            return ToolResult(f"Error: {exc}", True)
        except Exception as exc:  # a tool's bug must reach the model, not crash the run
            error = f"{type(exc).__name__}: {exc}"
            return ToolResult(texts.RESULT_TOOL_RAISED.format(name=name, error=error), True)
        if isinstance(output, ToolResult):
            return bounded(output)  # an MCP result is bounded where it is converted; a module's is here
        return ToolResult(cut(str(output), RESULT_LIMIT_CHARS))

    def _call_with_timeout(self, found: Tool, ctx: ToolContext, args: dict[str, Any]) -> ToolResult | str:
        if found.timeout_seconds is not None:
            # It bounds itself (an MCP call is cancelled on its server, and its wait has a deadline):
            # no lane thread, which was most of the harness's cost per MCP call.
            return found.call(ctx, args)
        lane: _Lane | None = getattr(self._lanes, "lane", None)
        if lane is None or not lane.usable():
            lane = self._lanes.lane = _Lane()
        call = _Call(found.call, (ctx, args))
        lane.inbox.put(call)
        if not call.done.wait(self._timeout):
            # A thread cannot be killed: the hung call keeps its lane, the next call gets a new one.
            self._lanes.lane = None
            lane.thread.name = f"{IDLE_LANE} (hung in {found.name})"  # a worker counts hung lanes
            raise _TimedOut(found.name)
        if call.error is not None:
            raise call.error
        return call.value


@dataclass
class _Call:
    fn: Callable[..., ToolResult | str]
    args: tuple[Any, ...]
    done: threading.Event = field(default_factory=threading.Event)
    value: ToolResult | str = ""
    error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn(*self.args)
        except BaseException as exc:  # handed back to the caller's thread
            self.error = exc
        finally:
            self.done.set()


class _Lane:
    """A daemon thread that runs tool calls one at a time, so a call can be given a timeout.

    Cheaper than a thread per call; daemon, so a hung tool never blocks the process's exit.
    """

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self.pid = os.getpid()
        self.thread = threading.Thread(target=self._work, name=IDLE_LANE, daemon=True)
        self.thread.start()

    def usable(self) -> bool:
        return self.pid == os.getpid()  # a forked child has the object but not the thread

    def _work(self) -> None:
        while True:
            self.inbox.get().run()
