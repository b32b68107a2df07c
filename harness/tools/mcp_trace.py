"""The trace context an MCP request carries: W3C `traceparent` (and `tracestate`) in its `_meta`.

SEP-414 reserves those `_meta` keys (no DNS prefix) for W3C Trace Context, so a server's own spans
join the trace of the run that called it. They are read from the OpenTelemetry span current where a
call is made (a worker's `execute_tool` span, under the run's trace: `observe/tracing.py`), in the
caller's thread: the hub's loop, or the worker across the relay, has no span of the run. Untraced
(no span, as when tracing is off), nothing is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KEYS = ("traceparent", "tracestate")


def trace_meta() -> dict[str, str]:
    """The current span's `traceparent` (and `tracestate`, when it has one); {} untraced."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


def checked(value: Any) -> dict[str, str]:
    """Only the trace keys of `value`, as strings (what crossed the relay from a work horse)."""
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k in KEYS if isinstance(v := value.get(k), str) and v}
