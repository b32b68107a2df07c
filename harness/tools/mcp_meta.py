"""What an MCP call carries in its request's `_meta`: the caller's trace context and the call's
approval receipt.

Trace context: SEP-414 reserves the `_meta` keys `traceparent` and `tracestate` (no DNS prefix) for
W3C Trace Context, so a server's own spans join the trace of the run that called it. They are read
from the OpenTelemetry span current where a call is made (a worker's `execute_tool` span, under the
run's trace: `observe/tracing.py`), in the caller's thread: the hub's loop, or the worker across the
relay, has no span of the run. Untraced (no span, as when tracing is off), nothing is sent.

Approval receipt: under `META_KEY` (reverse-DNS, as the spec asks of a `_meta` key of our own), the
receipt the call was given as it ran (`harness.receipts`); none when receipts are off. Both travel
from a work horse to the hub across the relay (`harness.tools.relay`), which keeps only these keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TRACE_KEYS = ("traceparent", "tracestate")
META_KEY = "io.github.slack-harness/approval-receipt"
KEYS = (*TRACE_KEYS, META_KEY)


def trace_meta() -> dict[str, str]:
    """The current span's `traceparent` (and `tracestate`, when it has one); {} untraced."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


def call_meta(receipt: str | None) -> dict[str, str]:
    """The `_meta` of a call made here and now: the current trace context, and `receipt` if any."""
    meta = trace_meta()
    if receipt:
        meta[META_KEY] = receipt
    return meta


def checked(value: Any) -> dict[str, str]:
    """Only the keys of `value` a call carries (`KEYS`), as strings (what crossed the relay from a
    work horse)."""
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k in KEYS if isinstance(v := value.get(k), str) and v}
