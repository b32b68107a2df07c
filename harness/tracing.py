"""What the loop tells a tracer: each model request and each tool call, as it happens.

The loop knows nothing of OpenTelemetry: a front end that traces (the workers, `observe/tracing.py`)
gives the agent a `Tracer`, whose two methods wrap the work itself, so a span can begin before and
end after it and read what it returned. Without one (`Agent.tracer is None`, the default) the loop
pays one attribute read per request and per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from harness.state import PendingCall
from harness.tools import ToolResult


class Tracer(Protocol):
    """Wraps the loop's model requests and tool calls; each method returns what its thunk returned."""

    def chat(self, request: dict[str, Any], send: Callable[[], Any]) -> Any:
        """Make the model request `request` by calling `send()`; its `Message` is returned as it is."""
        ...

    def tool(self, call: PendingCall, answer: Callable[[], ToolResult]) -> ToolResult:
        """Answer `call` (run it, or say why it does not run) by calling `answer()`."""
        ...
