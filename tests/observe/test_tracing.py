"""The spans `observe.tracing` makes, read back from the SDK's in-memory exporter: what they carry
with and without content capture, secrets cut out of captured content, and each call's outcome."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import Message
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from harness.policy import Tier
from harness.state import Decision, PendingCall, Verdict
from harness.tools import ToolResult
from observe import tracing

SECRET = "xoxb-very-secret-token"


def traced(capture: bool) -> tuple[tracing.RunTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    state = tracing.Tracing(provider, provider.get_tracer("test"), capture, (SECRET,))
    return tracing.RunTracer(state), exporter


def message(stop_reason: str = "end_turn") -> Message:
    return Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [{"type": "text", "text": f"the token is {SECRET}"}],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 100,
                "output_tokens": 20,
                "cache_creation_input_tokens": 5,
                "cache_read_input_tokens": 60,
            },
        }
    )


REQUEST = {
    "model": "claude-test",
    "max_tokens": 512,
    "system": "be brief",
    "messages": [{"role": "user", "content": "hi"}],
}


def only(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = exporter.get_finished_spans()
    return span


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_a_chat_span_carries_the_model_usage_and_finish_reason_and_no_content_by_default() -> None:
    tracer, exporter = traced(capture=False)
    assert tracer.chat(REQUEST, lambda: message("tool_use")).id == "msg_1"
    span = only(exporter)
    assert span.name == "chat claude-test"
    got = attributes(span)
    assert got["gen_ai.operation.name"] == "chat"
    assert got["gen_ai.request.model"] == "claude-test"
    assert got["gen_ai.request.max_tokens"] == 512
    assert got["gen_ai.usage.input_tokens"] == 100
    assert got["gen_ai.usage.output_tokens"] == 20
    assert got["gen_ai.usage.cache_creation.input_tokens"] == 5
    assert got["gen_ai.usage.cache_read.input_tokens"] == 60
    assert got["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert not [k for k in got if k.endswith("messages") or k == "gen_ai.system_instructions"]


def test_captured_content_has_the_secrets_cut_out() -> None:
    tracer, exporter = traced(capture=True)
    tracer.chat({**REQUEST, "messages": [{"role": "user", "content": f"use {SECRET}"}]}, message)
    got = attributes(only(exporter))
    assert "hi" not in got["gen_ai.input.messages"] and tracing.REDACTED in got["gen_ai.input.messages"]
    assert tracing.REDACTED in got["gen_ai.output.messages"]
    assert SECRET not in repr(got)


def test_a_failed_request_is_recorded_as_an_error_without_secrets_and_raised() -> None:
    tracer, exporter = traced(capture=False)

    def fail() -> Any:
        raise TimeoutError(f"slow with {SECRET}")

    with pytest.raises(TimeoutError):
        tracer.chat(REQUEST, fail)
    span = only(exporter)
    assert attributes(span)["error.type"] == "TimeoutError"
    assert not span.status.is_ok
    (event,) = span.events
    assert event.name == "exception" and "slow with" in str(event.attributes)
    assert SECRET not in repr((span.status.description, dict(event.attributes or {})))


@pytest.mark.parametrize(
    ("tier", "decision", "result", "outcome"),
    [
        (Tier.ALLOW, None, ToolResult("ok"), "ok"),
        (Tier.ALLOW, None, ToolResult("boom", True), "error"),
        (Tier.DENY, None, ToolResult("denied", True), "denied"),
        (Tier.ASK, Decision(Verdict.APPROVED, "U1"), ToolResult("done"), "ok"),
        (Tier.ASK, Decision(Verdict.DECLINED, "U1"), ToolResult("declined", True), "declined"),
        (Tier.ASK, Decision(Verdict.EXPIRED), ToolResult("expired", True), "expired"),
    ],
)
def test_an_execute_tool_span_names_the_call_its_tier_and_outcome(
    tier: Tier, decision: Decision | None, result: ToolResult, outcome: str
) -> None:
    tracer, exporter = traced(capture=False)
    call = PendingCall("toolu_1", "write_file", {"path": "a", "content": SECRET}, tier, decision)
    assert tracer.tool(call, lambda: result) is result
    span = only(exporter)
    assert span.name == "execute_tool write_file"
    got = attributes(span)
    assert got["gen_ai.tool.name"] == "write_file" and got["gen_ai.tool.call.id"] == "toolu_1"
    assert got["harness.tool.tier"] == tier.value
    assert got["harness.tool.outcome"] == outcome
    assert ("error.type" in got) is (outcome == "error")
    assert "gen_ai.tool.call.arguments" not in got and SECRET not in repr(got)


def test_captured_tool_arguments_and_results_have_the_secrets_cut_out() -> None:
    tracer, exporter = traced(capture=True)
    call = PendingCall("toolu_1", "read_file", {"path": "env"}, Tier.ALLOW)
    tracer.tool(call, lambda: ToolResult(f"TOKEN={SECRET}"))
    got = attributes(only(exporter))
    assert got["gen_ai.tool.call.arguments"] == '{"path": "env"}'
    assert got["gen_ai.tool.call.result"] == f"TOKEN={tracing.REDACTED}"


def test_traces_are_wanted_only_with_an_endpoint_and_not_switched_off() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert not tracing.wanted({})
    assert tracing.wanted(endpoint)
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert not tracing.wanted({**endpoint, "OTEL_SDK_DISABLED": "true"})
    assert not tracing.wanted({**endpoint, "OTEL_TRACES_EXPORTER": "none"})
