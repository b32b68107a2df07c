"""OpenTelemetry traces of runs, after the GenAI semantic conventions, when `OTEL_*` asks for them.

One trace per run, across the processes that handle it:

- the bot opens it at the mention (`run_started`): the root span, `invoke_agent`, whose W3C
  traceparent the run keeps (`RunRecord.trace`);
- every job that drives the run opens `job <name>` under that root (`job_span`), and the harness'
  hooks (`RunTracer`, given to the agent) add `chat <model>` per model request and
  `execute_tool <tool>` per call under the job's span;
- a park is waited out by nobody, so no span is held open meanwhile: the park's time is kept with
  the run and each decision's in the park, and the job that resumes (or stops) the run emits one
  `await_approval <tool>` per call with those explicit times (`approvals_waited`).

With no `OTEL_EXPORTER_OTLP_ENDPOINT` (nor `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), or with
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`, nothing is traced: every function here
returns at once and the SDK is never imported. Otherwise the SDK is set up once per process, on
first use, in the process that uses it: a prefork horse or a gunicorn worker gets a provider and an
exporter thread of its own after the fork, never its parent's. Spans leave in batches over OTLP/HTTP
with protobuf; a work horse `flush`es before it exits (`os._exit` skips the SDK's atexit hook).

Prompts, replies, tool arguments and results are recorded only when
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` says so, and the process's secrets (Slack
tokens, signing secret, API key, Redis password) are cut out of anything recorded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.policy import Tier
from harness.state import Decision, PendingCall, Verdict
from harness.tools import ToolResult

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

PROVIDER = "anthropic"  # gen_ai.provider.name (and the older gen_ai.system)
CAPTURE_ON = frozenset({"true", "1", "yes", "span_only", "span_and_event"})
SECRET_ENV = (
    "SLACK_BOT_TOKEN",
    "SLACK_SIGNING_SECRET",
    "SLACK_APP_TOKEN",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "HARNESS_RECEIPT_KEY",
)
REDACTED = "[redacted]"
CONTENT_LIMIT = 16_000  # characters of one captured attribute (a backend refuses huge ones)


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the standard `OTEL_*` variables ask for traces (an OTLP endpoint, not switched off)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


@dataclass(frozen=True)
class Tracing:
    """This process's tracer provider, tracer and what it may record."""

    provider: TracerProvider
    tracer: Tracer
    capture: bool
    secrets: tuple[str, ...]

    def redact(self, text: str) -> str:
        """`text` without any of the process's secrets, cut to `CONTENT_LIMIT`."""
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text if len(text) <= CONTENT_LIMIT else text[:CONTENT_LIMIT] + "…"


_current: tuple[int, Tracing | None] | None = None  # (pid, its tracing): set up again after a fork
_setting_up = threading.Lock()


def _after_fork() -> None:
    global _setting_up
    _setting_up = threading.Lock()  # a thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_after_fork)


def current() -> Tracing | None:
    """This process's tracing, set up on first use when `OTEL_*` asks for it; None when it does not.

    A work horse sets it up before its slots start; the lock makes it one provider all the same when
    threads ask at once (a provider each would export each span's siblings apart)."""
    global _current
    pid = os.getpid()
    found = _current
    if found is not None and found[0] == pid:
        return found[1]
    with _setting_up:
        if _current is not None and _current[0] == pid:
            return _current[1]
        tracing = None
        if wanted():
            try:
                tracing = _set_up()
            except Exception:  # a collector misconfigured is never worth a run
                log.exception("traces are off: the OpenTelemetry SDK could not be set up")
        _current = (pid, tracing)
        return tracing


def _set_up() -> Tracing:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol.strip() != "http/protobuf":
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s: traces go over http/protobuf, the only one", protocol)
    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "slack-harness"}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    asked = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").strip().lower()
    capture = asked in CAPTURE_ON
    log.info("traces are exported over OTLP/HTTP (message content %s)", "kept" if capture else "left out")
    return Tracing(provider, provider.get_tracer("slack-harness"), capture, _secrets())


def _secrets() -> tuple[str, ...]:
    """The values no attribute may hold: the process's tokens, keys and Redis password."""
    found = [os.environ.get(name, "") for name in SECRET_ENV]
    for url in (os.environ.get("REDIS_URL", ""),):
        with contextlib.suppress(ValueError):
            found.append(urllib.parse.urlsplit(url).password or "")
    return tuple(sorted({s for s in found if len(s) >= 4}, key=len, reverse=True))


def flush(timeout_ms: int = 5000) -> None:
    """Send what this process has buffered (a work horse, before `os._exit`)."""
    if _current is not None and _current[0] == os.getpid() and _current[1] is not None:
        with contextlib.suppress(Exception):
            _current[1].provider.force_flush(timeout_ms)


# --- the run's root, at the mention ---------------------------------------------------------------


class RootSpan:
    """The root span of a run being accepted: its traceparent to keep with the run, and more attributes."""

    def __init__(self, span: Span | None) -> None:
        self.span = span

    @property
    def traceparent(self) -> str:
        """The W3C traceparent of the root ("" untraced): what every job of the run continues."""
        if self.span is None:
            return ""
        carrier: dict[str, str] = {}
        from opentelemetry.trace import set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        TraceContextTextMapPropagator().inject(carrier, set_span_in_context(self.span))
        return carrier.get("traceparent", "")

    def set(self, key: str, value: Any) -> None:
        if self.span is not None:
            self.span.set_attribute(key, value)


@contextlib.contextmanager
def run_started(run_id: str, *, model: str, team: str, channel: str, requester: str) -> Iterator[RootSpan]:
    """The root span of a run, `invoke_agent`, open while the bot accepts the mention."""
    tracing = current()
    if tracing is None:
        yield RootSpan(None)
        return
    from opentelemetry.trace import SpanKind

    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.system": PROVIDER,
        "gen_ai.request.model": model,
        "gen_ai.conversation.id": run_id,
        "harness.run.id": run_id,
        "slack.team.id": team,
        "slack.channel.id": channel,
        "slack.user.id": requester,
    }
    tracer = tracing.tracer
    with tracer.start_as_current_span("invoke_agent", kind=SpanKind.SERVER, attributes=attributes) as span:
        yield RootSpan(span)


# --- a job of the run -----------------------------------------------------------------------------


def _parent(traceparent: str) -> Any:
    """The OTel context a run's traceparent names (a fresh trace when it names none)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent} if traceparent else {})


@contextlib.contextmanager
def job_span(traceparent: str, name: str, run_id: str) -> Iterator[None]:
    """`job <name>` under the run's root while a job drives the run (nothing when untraced)."""
    tracing = current()
    if tracing is None:
        yield
        return
    attributes: dict[str, Any] = {"harness.run.id": run_id, "harness.job.name": name}
    attributes["process.pid"] = os.getpid()
    parent = _parent(traceparent)
    with tracing.tracer.start_as_current_span(
        f"job {name}",
        context=parent,
        attributes=attributes,
        record_exception=False,  # recorded below, secrets cut out
        set_status_on_exception=False,
    ) as span:
        try:
            yield
        except BaseException as exc:
            _failed(span, exc, tracing)
            raise


def run_tracer() -> RunTracer | None:
    """The hooks the harness calls around each request and call; None when untraced."""
    tracing = current()
    return RunTracer(tracing) if tracing is not None else None


class RunTracer:
    """`harness.tracing.Tracer` over OpenTelemetry: `chat <model>` and `execute_tool <tool>` spans."""

    def __init__(self, tracing: Tracing) -> None:
        from opentelemetry.trace import SpanKind

        self.tracing = tracing
        self.client = SpanKind.CLIENT

    # A chat span is not made current: nothing opens a span inside it, and attaching a context costs
    # as much as a third of the span (tests/bench/bench_tracing.py). A tool's span is, while its call
    # runs: an MCP request carries it as its parent (SEP-414 `traceparent`: harness/tools/mcp_meta.py).

    def chat(self, request: dict[str, Any], send: Callable[[], Any]) -> Any:
        model = str(request.get("model", ""))
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.system": PROVIDER,
            "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": int(request.get("max_tokens") or 0),
        }
        if self.tracing.capture:
            attributes["gen_ai.system_instructions"] = self._json(request.get("system"))
            attributes["gen_ai.input.messages"] = self._json(request.get("messages"))
        span = self.tracing.tracer.start_span(f"chat {model}", kind=self.client, attributes=attributes)
        try:
            message = send()
        except BaseException as exc:
            _failed(span, exc, self.tracing)
            span.end()
            raise
        span.set_attributes(self._reply_attributes(message))
        span.end()
        return message

    def _reply_attributes(self, message: Any) -> dict[str, Any]:
        usage = message.usage
        attributes: dict[str, Any] = {
            "gen_ai.response.id": str(getattr(message, "id", "") or ""),
            "gen_ai.response.model": str(getattr(message, "model", "") or ""),
            "gen_ai.response.finish_reasons": [str(message.stop_reason or "")],
            "gen_ai.usage.input_tokens": usage.input_tokens or 0,
            "gen_ai.usage.output_tokens": usage.output_tokens or 0,
            "gen_ai.usage.cache_creation.input_tokens": usage.cache_creation_input_tokens or 0,
            "gen_ai.usage.cache_read.input_tokens": usage.cache_read_input_tokens or 0,
        }
        if self.tracing.capture:
            content = [block.model_dump(mode="json", exclude_none=True) for block in message.content]
            attributes["gen_ai.output.messages"] = self._json([{"role": "assistant", "content": content}])
        return attributes

    def tool(self, call: PendingCall, answer: Callable[[], ToolResult]) -> ToolResult:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
            "harness.tool.tier": call.tier.value,
            "harness.tool.tier_why": call.why,
        }
        if call.decision is not None:
            attributes["harness.approval.decision"] = call.decision.verdict.value
            attributes["harness.approval.edited"] = call.decision.edited_input is not None
        if self.tracing.capture:
            edited = call.decision.edited_input if call.decision is not None else None
            arguments = edited if edited is not None else call.input
            attributes["gen_ai.tool.call.arguments"] = self._json(arguments)
        from opentelemetry.trace import use_span

        span = self.tracing.tracer.start_span(f"execute_tool {call.name}", attributes=attributes)
        try:
            with use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                result = answer()
        except BaseException as exc:  # the registry answers errors; this is a crash or a lost lease
            _failed(span, exc, self.tracing)
            span.end()
            raise
        outcome = tool_outcome(call, result)
        ended: dict[str, Any] = {"harness.tool.outcome": outcome}
        if outcome == "error":
            ended["error.type"] = "tool_error"
        if self.tracing.capture:
            ended["gen_ai.tool.call.result"] = self._json(result.content)
        span.set_attributes(ended)
        span.end()
        return result

    def _json(self, value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        return self.tracing.redact(text)


def _failed(span: Span, exc: BaseException, tracing: Tracing) -> None:
    """Mark `span` failed by `exc`, its message and stack trace without the process's secrets."""
    from opentelemetry.trace import Status, StatusCode

    kind, text = type(exc).__name__, tracing.redact(str(exc))
    stack = tracing.redact("".join(traceback.format_exception(exc)))
    span.set_attribute("error.type", kind)
    span.record_exception(exc, attributes={"exception.message": text, "exception.stacktrace": stack})
    span.set_status(Status(StatusCode.ERROR, f"{kind}: {text}"))


def tool_outcome(call: PendingCall, result: ToolResult) -> str:
    """What became of a call: ran (`ok`, `error`), or did not (`denied`, `declined`, `expired`)."""
    if call.tier is Tier.DENY:
        return "denied"
    verdict = call.decision.verdict if call.decision is not None else None
    if verdict is Verdict.EXPIRED:
        return "expired"
    if verdict is Verdict.DECLINED:
        return "declined"
    return "error" if result.is_error else "ok"


# --- the wait for people --------------------------------------------------------------------------


def approvals_waited(
    traceparent: str,
    run_id: str,
    calls: Sequence[PendingCall],
    decisions: Mapping[str, Decision | None],
    *,
    parked_since: float | None,
    decided_at: Mapping[str, float],
    stopped_by: str | None = None,
) -> None:
    """One `await_approval <tool>` per parked call, from the park to its decision (or to the Stop
    that ended the park), under the run's root; emitted when the run resumes, in whichever worker."""
    tracing = current()
    if tracing is None or parked_since is None:
        return
    parent, now = _parent(traceparent), time.time()
    for call in calls:
        decision = decisions.get(call.id)
        ended = decided_at.get(call.id, now) if decision is not None else now
        attributes: dict[str, Any] = {
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "harness.run.id": run_id,
            "harness.tool.tier": call.tier.value,
            "harness.approval.wait_seconds": round(max(0.0, ended - parked_since), 3),
        }
        if decision is not None:
            attributes["harness.approval.decision"] = decision.verdict.value
            attributes["harness.approval.edited"] = decision.edited_input is not None
            if decision.by:
                attributes["harness.approval.decided_by"] = decision.by
            if decision.approvers:
                attributes["harness.approval.approvers"] = list(decision.approvers)
            if decision.grant:
                attributes["harness.approval.grant"] = decision.grant
        elif stopped_by is not None:
            attributes["harness.approval.decision"] = "stopped"
            attributes["harness.approval.decided_by"] = stopped_by
        span = tracing.tracer.start_span(
            f"await_approval {call.name}",
            context=parent,
            attributes=attributes,
            start_time=int(parked_since * 1e9),
        )
        span.end(end_time=int(max(ended, parked_since) * 1e9))
