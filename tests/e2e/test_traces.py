"""Traces end to end: the real bot and `python -m workers` export OTLP/HTTP (protobuf) to a loopback
receiver that decodes what arrives with `opentelemetry-proto`, as a collector would.

A run that parks for approval and resumes on another worker is one trace, with the spans and
attributes of the GenAI conventions and none of the process's secrets; with no `OTEL_*` set nothing
is sent and the SDK is never loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from store import Store
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.fakes.otlp_receiver import OTLPReceiver, ReceivedSpan
from tests.fakes.slack_api import FakeSlackAPI
from tests.mcp_support import calls, moving_table
from tests.stack import BOT_TOKEN, ROOT, SIGNING_SECRET, RedisServer, Stack, has_actions, thread, wait_until

pytestmark = pytest.mark.e2e

REDIS_PASSWORD = "redis-pw-7f3a9c"
API_KEY = "sk-test"
CONFIG = "[limits]\nmax_runs_per_user = 100\nmax_runs_per_channel = 100\n"
SECRETS = (BOT_TOKEN, SIGNING_SECRET, API_KEY, REDIS_PASSWORD)


class PasswordRedis(RedisServer):
    """A throwaway redis-server that asks for a password, so the stack's REDIS_URL carries one."""

    @property
    def url(self) -> str:
        return f"redis://:{REDIS_PASSWORD}@127.0.0.1:{self.port}/0"

    def start(self) -> PasswordRedis:
        super().start()
        redis.Redis(port=self.port).config_set("requirepass", REDIS_PASSWORD)
        return self


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[PasswordRedis]:
    server = PasswordRedis().start()
    yield server
    server.cleanup()


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as server:
        yield server


def otel_env(receiver: OTLPReceiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms between batches: the spans arrive soon after the run
        "OTEL_SERVICE_NAME": "harness-under-test",
    }


def cards(stack: Stack, channel: str, ts: str) -> list[dict]:
    return [m for m in thread(stack, channel, ts) if has_actions(m)]


def spans_named(spans: list[ReceivedSpan], prefix: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def run_trace(receiver: OTLPReceiver, run_id: str, *, chats: int) -> list[ReceivedSpan]:
    """Every span of the trace whose root names `run_id`, once its `chats` model requests and every
    span they hang from have arrived (a job's span ends, and leaves, after the requests it made)."""

    def complete() -> list[ReceivedSpan] | None:
        spans = receiver.received()
        root = next(
            (s for s in spans if s.attributes.get("harness.run.id") == run_id and not s.parent_span_id), None
        )
        if root is None:
            return None
        mine = [s for s in spans if s.trace_id == root.trace_id]
        ids = {s.span_id for s in mine}
        whole = all(s.parent_span_id in ids for s in mine if s is not root)
        return mine if whole and len(spans_named(mine, "chat ")) >= chats else None

    try:
        return wait_until(complete, timeout=30)
    except AssertionError:
        shown = [(s.name, s.trace_id[:6], s.span_id[:6], s.parent_span_id[:6]) for s in receiver.received()]
        raise AssertionError(f"the run's trace is not whole: {shown}") from None


def test_a_run_parked_and_resumed_on_another_worker_is_one_trace(
    locked_redis: PasswordRedis, receiver: OTLPReceiver, tmp_path: Path
) -> None:
    marker = "traced-run"
    with FakeSlackAPI(bot_token=BOT_TOKEN) as slack, FakeMessagesAPI() as model:
        stack = Stack(locked_redis.url, slack, model, tmp_path, config=CONFIG, extra_env=otel_env(receiver))
        stack.model.script_for(
            marker,
            reply(
                tool_use("get_time", {}),
                tool_use("write_file", {"path": "notes.txt", "content": "hello"}),
                usage={"input_tokens": 120, "output_tokens": 30, "cache_read_input_tokens": 7},
            ),
            reply(text(f"{marker} all done"), usage={"cache_creation_input_tokens": 11}),
        )
        try:
            stack.start_bot()
            first = stack.start_worker()
            status, ts, _ = stack.mention(f"{marker}: write my notes", channel="C900")
            assert status == 200
            card = wait_until(lambda: next(iter(cards(stack, "C900", ts)), None), timeout=30)
            stack.settled()
            assert first.stop() == 0  # parked: the first worker leaves, flushing what it holds
            stack.start_worker()
            assert stack.click(card, "approve", user="UALICE") == 200
            wait_until(lambda: any(f"{marker} all done" in m["text"] for m in thread(stack, "C900", ts)), 30)
            stack.settled()
            run_id = approve_value(card).split(":")[0]  # `run:call:fingerprint`
            spans = run_trace(receiver, run_id, chats=2)
            logs = "".join(p.output() for p in stack.processes if p.name == "worker")
        finally:
            stack.stop()
    # The exporter's thread is the horse's own: no horse is replaced for a thread left behind.
    assert "leaves after this job (threads)" not in logs

    (root,) = [s for s in spans if not s.parent_span_id]
    assert root.name == "invoke_agent"
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.resource["service.name"] == "harness-under-test"

    jobs = spans_named(spans, "job ")
    assert {s.attributes["harness.job.name"] for s in jobs} >= {"start_run", "apply_decisions"}
    assert len({s.attributes["process.pid"] for s in jobs}) >= 2  # the resume ran in another worker

    first_chat, second_chat = sorted(spans_named(spans, "chat "), key=lambda s: s.start_ns)
    assert first_chat.name == f"chat {first_chat.attributes['gen_ai.request.model']}"
    assert first_chat.attributes["gen_ai.operation.name"] == "chat"
    assert first_chat.attributes["gen_ai.usage.input_tokens"] == 120
    assert first_chat.attributes["gen_ai.usage.output_tokens"] == 30
    assert first_chat.attributes["gen_ai.usage.cache_read.input_tokens"] == 7
    assert first_chat.attributes["gen_ai.response.finish_reasons"] == ["tool_use"]
    assert second_chat.attributes["gen_ai.usage.cache_creation.input_tokens"] == 11
    assert second_chat.attributes["gen_ai.response.finish_reasons"] == ["end_turn"]

    tools = {s.attributes["gen_ai.tool.name"]: s for s in spans_named(spans, "execute_tool ")}
    assert set(tools) == {"get_time", "write_file"}
    assert tools["get_time"].attributes["harness.tool.tier"] == "allow"
    assert tools["get_time"].attributes["harness.tool.outcome"] == "ok"
    write = tools["write_file"]
    assert write.name == "execute_tool write_file"
    assert write.attributes["harness.tool.tier"] == "ask"
    assert write.attributes["harness.tool.outcome"] == "ok"
    assert write.attributes["gen_ai.tool.call.id"].startswith("toolu_")

    (wait,) = spans_named(spans, "await_approval ")
    assert wait.name == "await_approval write_file"
    assert wait.attributes["gen_ai.tool.call.id"] == write.attributes["gen_ai.tool.call.id"]
    assert wait.attributes["harness.approval.decision"] == "approved"
    assert wait.attributes["harness.approval.decided_by"] == "UALICE"
    assert wait.parent_span_id == root.span_id
    # From the park (before the first worker left) to the click (after the second one started).
    assert wait.start_ns < min(
        s.start_ns for s in jobs if s.attributes["harness.job.name"] == "apply_decisions"
    )
    assert wait.end_ns <= write.start_ns
    assert wait.attributes["harness.approval.wait_seconds"] == pytest.approx(
        (wait.end_ns - wait.start_ns) / 1e9, abs=0.01
    )

    recorded = json.dumps([(s.attributes, s.resource) for s in spans])
    assert not [secret for secret in SECRETS if secret in recorded]
    assert "write my notes" not in recorded and "hello" not in recorded  # no content unless asked


def test_an_mcp_call_carries_the_run_s_trace_to_its_server(
    locked_redis: PasswordRedis, receiver: OTLPReceiver, tmp_path: Path
) -> None:
    """SEP-414: the server gets `_meta.traceparent` naming the run's trace and, as its parent, the
    call's `execute_tool` span (made in a work horse, carried across the worker's relay)."""
    marker = "traced-mcp"
    (tmp_path / "server").mkdir()
    log = tmp_path / "server" / "calls.jsonl"
    config = moving_table(log) + CONFIG + '[policy.tools]\nmoving__note = "allow"\n'
    with FakeSlackAPI(bot_token=BOT_TOKEN) as slack, FakeMessagesAPI() as model:
        url = locked_redis.url.rsplit("/", 1)[0] + "/1"
        stack = Stack(url, slack, model, tmp_path, config=config, extra_env=otel_env(receiver))
        stack.model.script_for(
            marker, reply(tool_use("moving__note", {"text": "traced"})), reply(text(f"{marker} done"))
        )
        try:
            stack.start_bot()
            stack.start_worker()
            status, ts, _ = stack.mention(f"{marker}: note it", channel="C902")
            assert status == 200
            wait_until(lambda: any(f"{marker} done" in m["text"] for m in thread(stack, "C902", ts)), 30)
            stack.settled()

            def run_of_the_root() -> str | None:
                roots = (s for s in receiver.received() if not s.parent_span_id)
                return next((s.attributes.get("harness.run.id") for s in roots), None)

            run_id = wait_until(run_of_the_root, timeout=30)
            spans = run_trace(receiver, run_id, chats=2)
        finally:
            stack.stop()
    (call,) = [c for c in calls(log) if c["tool"] == "note"]
    version, trace_id, parent_id, _flags = call["meta"]["traceparent"].split("-")
    (tool,) = spans_named(spans, "execute_tool moving__note")
    assert (version, trace_id, parent_id) == ("00", tool.trace_id, tool.span_id)
    (root,) = [s for s in spans if not s.parent_span_id]
    assert root.trace_id == trace_id  # the run's trace


def approve_value(card: dict) -> str:
    return next(
        e["value"]
        for b in card["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e.get("action_id") == "approve"
    )


def test_with_nothing_set_nothing_is_sent_and_the_sdk_is_never_loaded(
    redis_server: RedisServer, receiver: OTLPReceiver, tmp_path: Path
) -> None:
    marker = "untraced-run"
    url = redis_server.url.rsplit("/", 1)[0] + "/7"
    redis.Redis.from_url(url).flushdb()
    with FakeSlackAPI(bot_token=BOT_TOKEN) as slack, FakeMessagesAPI() as model:
        (tmp_path / "server").mkdir()
        log = tmp_path / "server" / "calls.jsonl"
        config = moving_table(log) + CONFIG + '[policy.tools]\nmoving__note = "allow"\n'
        stack = Stack(url, slack, model, tmp_path, config=config)
        stack.model.script_for(
            marker,
            reply(tool_use("get_time", {}), tool_use("moving__note", {"text": "untraced"})),
            reply(text(f"{marker} done")),
        )
        try:
            stack.start_bot()
            stack.start_worker()
            status, ts, _ = stack.mention(f"{marker}: what time is it", channel="C901")
            assert status == 200
            wait_until(lambda: any(f"{marker} done" in m["text"] for m in thread(stack, "C901", ts)), 30)
            stack.settled()
            client = redis.Redis.from_url(url, decode_responses=True)
            run_ids = [str(k).rsplit(":", 1)[-1] for k in client.keys("harness:run:*")]
            records = [Store(redis.Redis.from_url(url)).runs.load(r) for r in run_ids]
        finally:
            stack.stop()
    assert receiver.requests == 0 and receiver.received() == []
    (call,) = [c for c in calls(log) if c["tool"] == "note"]  # and nothing of a trace to the server
    assert "traceparent" not in (call["meta"] or {}) and "tracestate" not in (call["meta"] or {})
    assert records and all(r is not None and r.trace == "" for r in records)  # no trace kept either
    # The bot's and the jobs' own code paths load no tracing SDK nor exporter. (redis-py 8 imports
    # `opentelemetry.sdk.metrics` itself whenever it is installed, and sets nothing up with it.)
    probe = (
        "TRACING = ('opentelemetry.sdk.trace', 'opentelemetry.exporter')\n"
        "import sys, bot.listeners.mentions, workers.jobs, observe.tracing as t\n"
        "with t.run_started('r1', model='m', team='T1', channel='C1', requester='U1') as root:\n"
        "    assert root.traceparent == ''\n"
        "with t.job_span('', 'start_run', 'r1'):\n"
        "    pass\n"
        "assert t.run_tracer() is None and t.current() is None\n"
        "print(sorted(m for m in sys.modules if m.startswith(TRACING)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr
