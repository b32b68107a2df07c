"""Trace context on MCP requests (SEP-414): `traceparent` and `tracestate` in a call's `_meta`,
read by a real server (`tests/fakes/mcp_moving_server.py` writes down the `_meta` it received)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState, use_span

from harness.config import load_config
from harness.policy import Tier
from harness.state import PendingCall
from harness.tools.mcp import McpHub
from harness.tools.relay import RelayServer
from observe import tracing
from tests.mcp_support import calls, moving_table


@pytest.fixture(params=["2026-07-28", "2025"])
def hub(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[McpHub, Path]]:
    (tmp_path / "server").mkdir()
    log = tmp_path / "server" / "calls.jsonl"
    flags = () if request.param == "2026-07-28" else ("--legacy",)
    config_path = tmp_path / "harness.toml"
    config_path.write_text(moving_table(log, *flags))
    config = load_config(config_path, env={"HARNESS_WORKSPACE": str(tmp_path)})
    with McpHub(config.resolved_servers({})) as started:
        yield started, log


def traced() -> tuple[tracing.Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracing.Tracing(provider, provider.get_tracer("test"), False, ()), exporter


def received(log: Path, text: str) -> dict[str, Any]:
    """The `_meta` the server received with the `note` call that wrote `text`."""
    (found,) = [c for c in calls(log) if c["tool"] == "note" and c.get("text") == text]
    return found["meta"] or {}


def traceparent(context: SpanContext) -> str:
    """W3C's `version-traceid-parentid-flags` of `context`."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def test_a_run_s_tool_call_carries_the_run_s_trace_with_its_tool_span_as_parent(
    hub: tuple[McpHub, Path],
) -> None:
    started, log = hub
    state, exporter = traced()
    call = PendingCall("toolu_1", "moving__note", {"text": "traced"}, Tier.ALLOW)
    with state.tracer.start_as_current_span("job run") as job:
        result = tracing.RunTracer(state).tool(
            call, lambda: started.call("moving", "note", {"text": "traced"}, True)
        )
    assert not result.is_error

    (tool_span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool moving__note"]
    assert tool_span.context is not None
    run_trace = job.get_span_context().trace_id
    assert tool_span.context.trace_id == run_trace
    assert received(log, "traced")["traceparent"] == traceparent(tool_span.context)


def test_a_work_horse_s_call_through_the_relay_carries_its_trace(hub: tuple[McpHub, Path]) -> None:
    started, log = hub
    state, _ = traced()
    relay = RelayServer(started).start()
    try:
        with state.tracer.start_as_current_span("execute_tool moving__note") as span:
            assert not relay.client().call("moving", "note", {"text": "relayed"}, True).is_error
    finally:
        relay.close()
    assert received(log, "relayed")["traceparent"] == traceparent(span.get_span_context())


def test_a_trace_s_tracestate_goes_along(hub: tuple[McpHub, Path]) -> None:
    started, log = hub
    context = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "value")]),
    )
    with use_span(NonRecordingSpan(context)):
        assert not started.call("moving", "note", {"text": "stated"}, True).is_error
    meta = received(log, "stated")
    assert meta["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert meta["tracestate"] == "vendor=value"


def test_nothing_of_a_trace_is_sent_when_tracing_is_off(hub: tuple[McpHub, Path]) -> None:
    started, log = hub
    assert not started.call("moving", "note", {"text": "untraced"}, True).is_error
    relay = RelayServer(started).start()
    try:
        assert not relay.client().call("moving", "note", {"text": "untraced too"}, True).is_error
    finally:
        relay.close()
    for text in ("untraced", "untraced too"):
        meta = received(log, text)
        assert "traceparent" not in meta and "tracestate" not in meta
