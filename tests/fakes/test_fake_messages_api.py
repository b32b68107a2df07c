"""Tests of the fake Messages API, driven by the real ``anthropic`` SDK client."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import pytest
from anthropic.types import (
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ThinkingConfigEnabledParam,
    ToolUseBlock,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fakes.messages_api import (
    FakeMessagesAPI,
    Reply,
    http_error,
    redacted_thinking,
    reply,
    text,
    thinking,
    tool_search,
    tool_use,
    validate_request,
)

MODEL = "claude-test-1"
TOOLS = [
    {"name": "read_file", "description": "Read", "input_schema": {"type": "object"}},
    {"name": "list_dir", "input_schema": {"type": "object", "properties": {}}},
]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as fake:
        yield fake


@pytest.fixture
def fake(server: FakeMessagesAPI) -> Iterator[FakeMessagesAPI]:
    server.reset()
    server.check_tool_names = True
    yield server
    server.reset()


@pytest.fixture(scope="module")
def client(server: FakeMessagesAPI) -> Iterator[anthropic.Anthropic]:
    """One SDK client per module: building one (TLS context included) costs ~30 ms."""
    with anthropic.Anthropic(base_url=server.base_url, api_key="test", max_retries=0) as sdk:
        yield sdk


def send(client: anthropic.Anthropic, body: dict[str, Any]) -> Message:
    """POST a raw body through the SDK (bypasses its argument checks, keeps its headers)."""
    return client.post("/v1/messages", body=body, cast_to=Message)


def base_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 256,
        "tools": copy.deepcopy(TOOLS),
        "messages": [{"role": "user", "content": "hello"}],
    }
    body.update(overrides)
    return body


def tool_loop_messages() -> list[dict[str, Any]]:
    """user -> assistant(2 tool_use) -> user(2 tool_result + text)."""
    return [
        {"role": "user", "content": [text("list and read")]},
        {
            "role": "assistant",
            "content": [
                text("Looking."),
                tool_use("list_dir", {}, id="toolu_a"),
                tool_use("read_file", {"path": "x"}, id="toolu_b"),
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": "a\nb"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_b",
                    "content": [text("data")],
                    "is_error": False,
                },
                text("continue"),
            ],
        },
    ]


# --------------------------------------------------------------------------- replies


def test_text_reply_parses_into_message(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    fake.script(reply(text("hi there")))
    msg = client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hello"}])
    assert isinstance(msg, Message)
    assert msg.model == MODEL and msg.role == "assistant" and msg.id.startswith("msg_")
    assert [type(b) for b in msg.content] == [TextBlock]
    assert msg.content[0].text == "hi there"
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    body = fake.requests[0]
    assert msg.usage.input_tokens == len(json.dumps(body["messages"])) // 4
    assert msg.usage.output_tokens == 10
    assert msg.usage.cache_creation_input_tokens == 0
    assert msg.usage.cache_read_input_tokens == 0
    assert fake.errors == []
    assert fake.valid_requests == fake.requests == [body]


def test_tool_use_reply_and_usage_override(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    fake.script(
        reply(
            text("Reading."),
            tool_use("read_file", {"path": "a.txt"}),
            usage={"input_tokens": 7, "cache_read_input_tokens": 3},
        )
    )
    msg = client.messages.create(
        model=MODEL, max_tokens=64, tools=TOOLS, messages=[{"role": "user", "content": "go"}]
    )
    assert msg.stop_reason == "tool_use"
    block = msg.content[1]
    assert isinstance(block, ToolUseBlock)
    assert block.name == "read_file" and block.input == {"path": "a.txt"}
    assert block.id.startswith("toolu_")
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (7, 10)
    assert (msg.usage.cache_read_input_tokens, msg.usage.cache_creation_input_tokens) == (3, 0)


def test_explicit_stop_reason(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    fake.script(reply(text("partial"), stop_reason="max_tokens"))
    assert send(client, base_body()).stop_reason == "max_tokens"


def test_tool_use_ids_unique_across_lifetime(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    same = reply(tool_use("read_file", {"path": "a"}, id="toolu_fixed"))
    fake.script(same, same)
    fake.responder = lambda body: same
    ids = [send(client, base_body()).content[0].id for _ in range(3)]  # type: ignore[union-attr]
    assert len(set(ids)) == 3 and "toolu_fixed" in ids
    assert tool_use("x", {})["id"] != tool_use("x", {})["id"]


def test_streaming_request_gets_sse(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    fake.script(reply(text("streamed"), tool_use("read_file", {"path": "s"}, id="toolu_s")))
    with client.messages.stream(
        model=MODEL, max_tokens=64, tools=TOOLS, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        msg = stream.get_final_message()
    assert fake.requests[0]["stream"] is True
    assert msg.content[0].text == "streamed"  # type: ignore[union-attr]
    assert msg.content[1].input == {"path": "s"}  # type: ignore[union-attr]
    assert msg.stop_reason == "tool_use" and msg.usage.output_tokens == 10


# --------------------------------------------------------------------------- scripting


def test_default_queue_is_fifo(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    fake.script(reply(text("one")))
    fake.script(reply(text("two")), reply(text("three")))
    got = [send(client, base_body()).content[0].text for _ in range(3)]  # type: ignore[union-attr]
    assert got == ["one", "two", "three"]


def test_marker_queue_checked_before_default(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    fake.script(reply(text("default")))
    fake.script_for("[run-7]", reply(text("marked")))
    marked = base_body(messages=[{"role": "user", "content": [text("task [run-7] please")]}])
    assert send(client, marked).content[0].text == "marked"  # type: ignore[union-attr]
    assert send(client, base_body()).content[0].text == "default"  # type: ignore[union-attr]


def test_marker_queues_with_concurrent_runs(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    markers = [f"<run-{i}>" for i in range(4)]
    for m in markers:
        fake.script_for(m, *(reply(text(f"{m}:{k}")) for k in range(3)))

    def run(marker: str) -> list[str]:
        body = base_body(messages=[{"role": "user", "content": f"job {marker}"}])
        return [send(client, body).content[0].text for _ in range(3)]  # type: ignore[union-attr]

    with ThreadPoolExecutor(len(markers)) as pool:
        results = list(pool.map(run, markers))
    assert results == [[f"{m}:{k}" for k in range(3)] for m in markers]
    assert len(fake.requests) == 12 and fake.errors == []


def test_responder_used_when_queues_empty(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    seen: list[dict[str, Any]] = []

    def responder(body: dict[str, Any]) -> Reply:
        seen.append(body)
        return reply(text(f"echo {body['messages'][0]['content']}"))

    fake.script(reply(text("scripted")))
    fake.responder = responder
    assert send(client, base_body()).content[0].text == "scripted"  # type: ignore[union-attr]
    assert send(client, base_body()).content[0].text == "echo hello"  # type: ignore[union-attr]
    assert len(seen) == 1


def test_script_exhausted_is_500_and_recorded(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.InternalServerError) as info:
        send(client, base_body())
    assert info.value.status_code == 500
    assert "script exhausted" in fake.errors[0]
    assert info.value.response.headers.get("request-id", "").startswith("req_")


def test_reset_clears_everything(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    fake.script(reply(text("a")))
    fake.script_for("m", reply(text("b")))
    fake.responder = lambda body: reply(text("c"))
    with pytest.raises(anthropic.BadRequestError):
        send(client, base_body(model=""))
    fake.reset()
    assert (fake.requests, fake.valid_requests, fake.errors) == ([], [], [])
    assert fake.responder is None
    with pytest.raises(anthropic.InternalServerError):
        send(client, base_body(messages=[{"role": "user", "content": "m"}]))


def test_wait_for_requests(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    assert fake.wait_for_requests(1, timeout=0.01) is False
    fake.script(reply(text("x")), reply(text("y")))
    worker = threading.Thread(target=lambda: [send(client, base_body()) for _ in range(2)])
    worker.start()
    assert fake.wait_for_requests(2, timeout=5)
    worker.join()
    assert len(fake.requests) == 2


def test_context_manager_and_stop() -> None:
    with FakeMessagesAPI() as other:
        url = other.base_url
        assert url.startswith("http://127.0.0.1:")
        other.script(reply(text("ok")))
        c = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
        assert send(c, base_body()).content[0].text == "ok"  # type: ignore[union-attr]
    with pytest.raises(RuntimeError):
        _ = other.base_url
    with pytest.raises(anthropic.APIConnectionError):
        send(anthropic.Anthropic(base_url=url, api_key="k", max_retries=0, timeout=2), base_body())


def test_client_in_another_process(fake: FakeMessagesAPI) -> None:
    fake.script(reply(text("from afar")))
    code = (
        "import json, os, urllib.request\n"
        "req = urllib.request.Request(os.environ['ANTHROPIC_BASE_URL'] + '/v1/messages',\n"
        f"    data=json.dumps({base_body()!r}).encode(),\n"
        "    headers={'x-api-key': 'k', 'anthropic-version': '2023-06-01'})\n"
        "print(json.load(urllib.request.urlopen(req))['content'][0]['text'])\n"
    )
    env = {"ANTHROPIC_BASE_URL": fake.base_url, "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=10)
    assert out.stdout.strip() == "from afar", out.stderr


# --------------------------------------------------------------------------- HTTP errors


def test_429_surfaces_as_rate_limit_error(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    fake.script(http_error(429, headers={"retry-after": "7"}, message="slow down"))
    with pytest.raises(anthropic.RateLimitError) as info:
        send(client, base_body())
    err = info.value
    assert err.status_code == 429 and err.response.headers["retry-after"] == "7"
    assert err.body == {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    assert err.response.headers["request-id"].startswith("req_")
    assert fake.errors == []


@pytest.mark.parametrize(
    ("status", "exc", "etype"),
    [
        (529, anthropic.OverloadedError, "overloaded_error"),
        (500, anthropic.InternalServerError, "api_error"),
        (401, anthropic.AuthenticationError, "authentication_error"),
        (400, anthropic.BadRequestError, "invalid_request_error"),
    ],
)
def test_error_statuses(
    fake: FakeMessagesAPI,
    client: anthropic.Anthropic,
    status: int,
    exc: type[anthropic.APIStatusError],
    etype: str,
) -> None:
    fake.script(http_error(status))
    with pytest.raises(exc) as info:
        send(client, base_body())
    assert info.value.status_code == status
    assert etype in json.dumps(info.value.body)


def test_sdk_retry_honours_retry_after(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    client = client.with_options(max_retries=2)
    fake.script(
        http_error(429, headers={"retry-after": "0.05"}),
        http_error(529, headers={"retry-after": "0.05"}),
        reply(text("finally")),
    )
    started = time.monotonic()
    msg = send(client, base_body())
    elapsed = time.monotonic() - started
    assert msg.content[0].text == "finally"  # type: ignore[union-attr]
    assert len(fake.requests) == 3
    # The SDK's own backoff would be >= ~1.1 s for two retries; retry-after makes it ~0.1 s.
    assert 0.1 <= elapsed < 0.9


def test_sdk_gives_up_after_max_retries(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    client = client.with_options(max_retries=2)
    fake.responder = lambda body: http_error(529, headers={"retry-after": "0.01"})
    with pytest.raises(anthropic.OverloadedError):
        send(client, base_body())
    assert len(fake.requests) == 3


# --------------------------------------------------------------------------- validation


def _raw(fake: FakeMessagesAPI, data: bytes, path: str = "/v1/messages", **headers: str) -> int:
    hdrs = {"x-api-key": "k", "anthropic-version": "2023-06-01", **headers}
    req = urllib.request.Request(fake.base_url + path, data=data, headers=hdrs)
    for name, value in headers.items():
        if not value:
            req.remove_header(name.capitalize())
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        assert json.load(err)["error"]["type"] == "invalid_request_error"
        return err.code


def test_http_level_validation(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    good = json.dumps(base_body()).encode()
    assert _raw(fake, b"{not json") == 400
    assert _raw(fake, b"[1, 2]") == 400
    assert _raw(fake, good, path="/v1/complete") == 400
    assert _raw(fake, good, **{"x-api-key": ""}) == 400
    assert _raw(fake, good, **{"anthropic-version": ""}) == 400
    with pytest.raises(anthropic.BadRequestError):
        client.get("/v1/messages", cast_to=Message)
    errors = fake.errors
    assert fake.valid_requests == []
    needles = ["JSON object", "JSON object", "/v1/complete", "x-api-key", "anthropic-version", "GET"]
    for needle in needles:
        assert needle in errors.pop(0)
    assert errors == ["request body must be a JSON object"]  # the GET had no body either
    assert len(fake.requests) == 6
    assert fake.requests[0] == {"_raw": "{not json"}


def _messages(*msgs: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def apply(body: dict[str, Any]) -> None:
        body["messages"] = list(msgs)

    return apply


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(body: dict[str, Any]) -> None:
        if value is _DELETE:
            body.pop(key, None)
        else:
            body[key] = value

    return apply


_DELETE = object()
U = {"role": "user", "content": "hi"}
A_TEXT = {"role": "assistant", "content": "ok"}


def _a(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def _u(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def _res(tid: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tid, "content": "out", **extra}


def _tu(tid: Any = "toolu_1", name: Any = "read_file", inp: Any = None) -> dict[str, Any]:
    return {"type": "tool_use", "id": tid, "name": name, "input": {} if inp is None else inp}


EPH = {"type": "ephemeral"}

INVALID: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("model-missing", _set("model", _DELETE), "model"),
    ("model-empty", _set("model", ""), "model"),
    ("max-tokens-missing", _set("max_tokens", _DELETE), "max_tokens"),
    ("max-tokens-zero", _set("max_tokens", 0), "max_tokens"),
    ("max-tokens-str", _set("max_tokens", "5"), "max_tokens"),
    ("max-tokens-bool", _set("max_tokens", True), "max_tokens"),
    ("messages-missing", _set("messages", _DELETE), "messages"),
    ("messages-empty", _set("messages", []), "messages"),
    ("system-int", _set("system", 3), "system"),
    ("system-empty-block", _set("system", [text("")]), "system.0.text"),
    ("system-image-block", _set("system", [{"type": "image"}]), "system.0"),
    ("tool-name-space", _set("tools", [{"name": "a b", "input_schema": {"type": "object"}}]), "tools.0.name"),
    (
        "tool-name-long",
        _set("tools", [{"name": "a" * 65, "input_schema": {"type": "object"}}]),
        "tools.0.name",
    ),
    ("tool-name-dup", _set("tools", TOOLS + [TOOLS[0]]), "unique"),
    ("tool-no-schema", _set("tools", [{"name": "t"}]), "input_schema"),
    ("tool-schema-array", _set("tools", [{"name": "t", "input_schema": {"type": "array"}}]), "input_schema"),
    ("first-assistant", _messages(A_TEXT, U), "first message"),
    ("two-users", _messages(U, U), "alternate"),
    ("two-assistants", _messages(U, A_TEXT, A_TEXT), "alternate"),
    ("bad-role", _messages({"role": "system", "content": "x"}), "role"),
    ("content-empty-str", _messages({"role": "user", "content": ""}), "content"),
    ("content-blank-str", _messages({"role": "user", "content": "  \n"}), "content"),
    ("content-empty-list", _messages(_u()), "content"),
    ("content-int", _messages({"role": "user", "content": 5}), "content"),
    ("text-empty", _messages(_u(text(""))), "non-empty"),
    ("text-blank", _messages(_u(text(" \t"))), "non-whitespace"),
    ("block-unknown", _messages(_u({"type": "video"})), "unknown content block type"),
    ("block-not-dict", _messages(_u("hi")), "content.0"),  # type: ignore[arg-type]
    ("tool-use-in-user", _messages(_u(_tu())), "not allowed in user"),
    ("tool-use-no-id", _messages(U, _a(_tu(tid=None)), _u(_res(None))), ".id"),
    ("tool-use-int-id", _messages(U, _a(_tu(tid=7))), ".id"),
    ("tool-use-no-name", _messages(U, _a(_tu(name=None)), _u(_res("toolu_1"))), ".name"),
    ("tool-use-unknown-name", _messages(U, _a(_tu(name="rm")), _u(_res("toolu_1"))), "not defined"),
    ("tool-use-input-list", _messages(U, _a(_tu(inp=[1])), _u(_res("toolu_1"))), ".input"),
    (
        "tool-use-dup-id",
        _messages(U, _a(_tu()), _u(_res("toolu_1")), _a(_tu()), _u(_res("toolu_1"))),
        "unique",
    ),
    ("tool-use-dup-id-same-msg", _messages(U, _a(_tu(), _tu()), _u(_res("toolu_1"))), "unique"),
    ("tool-use-last", _messages(U, _a(_tu())), "without `tool_result` blocks immediately after"),
    ("tool-use-then-text", _messages(U, _a(_tu()), U), "without `tool_result`"),
    (
        "tool-result-missing-one",
        _messages(U, _a(_tu("t1"), _tu("t2")), _u(_res("t1"))),
        "without `tool_result`",
    ),
    ("tool-result-order", _messages(U, _a(_tu("t1"), _tu("t2")), _u(_res("t2"), _res("t1"))), "same order"),
    ("tool-result-dup", _messages(U, _a(_tu("t1")), _u(_res("t1"), _res("t1"))), "duplicate"),
    (
        "tool-result-unknown",
        _messages(U, _a(_tu("t1")), _u(_res("t1"), _res("t9"))),
        "unexpected `tool_use_id`",
    ),
    ("text-before-result", _messages(U, _a(_tu("t1")), _u(text("x"), _res("t1"))), "must come before"),
    ("result-without-tool-use", _messages(_u(_res("t1"))), "unexpected `tool_use_id`"),
    (
        "result-stale",
        _messages(U, _a(_tu("t1")), _u(_res("t1")), A_TEXT, _u(_res("t1"))),
        "unexpected `tool_use_id`",
    ),
    ("result-in-assistant", _messages(U, _a(_res("t1"))), "not allowed in assistant"),
    ("result-no-id", _messages(U, _a(_tu("t1")), _u({"type": "tool_result", "content": "x"})), "tool_use_id"),
    ("result-is-error-str", _messages(U, _a(_tu("t1")), _u(_res("t1", is_error="yes"))), "is_error"),
    ("result-content-int", _messages(U, _a(_tu("t1")), _u(_res("t1", content=3))), ".content"),
    (
        "result-content-tool-use",
        _messages(U, _a(_tu("t1")), _u(_res("t1", content=[_tu("t2")]))),
        ".content.0",
    ),
    (
        "cache-control-5",
        _messages(_u(*(dict(text(f"b{i}"), cache_control=EPH) for i in range(5)))),
        "A maximum of 4 blocks with cache_control may be provided",
    ),
    (
        "cache-control-spread",
        lambda b: b.update(
            system=[dict(text("s"), cache_control=EPH)] * 2,
            tools=[dict(t, cache_control=EPH) for t in TOOLS],
            messages=[_u(dict(text("x"), cache_control=EPH))],
        ),
        "A maximum of 4 blocks with cache_control",
    ),
    (
        "cache-control-type",
        _messages(_u(dict(text("x"), cache_control={"type": "forever"}))),
        "cache_control",
    ),
    (
        "cache-control-ttl",
        _messages(_u(dict(text("x"), cache_control={**EPH, "ttl": "2h"}))),
        "cache_control",
    ),
    (
        "final-assistant-trailing-space",
        _messages(U, {"role": "assistant", "content": "ok "}),
        "trailing whitespace",
    ),
]


@pytest.mark.parametrize(("mutate", "needle"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_request_rejected(
    fake: FakeMessagesAPI,
    client: anthropic.Anthropic,
    mutate: Callable[[dict[str, Any]], None],
    needle: str,
) -> None:
    fake.script(reply(text("should not be used")))
    body = base_body()
    mutate(body)
    with pytest.raises(anthropic.BadRequestError) as info:
        send(client, body)
    assert info.value.status_code == 400
    assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert fake.errors, "validation failure must be recorded"
    assert any(needle in e for e in fake.errors), fake.errors
    assert needle in info.value.message
    assert fake.requests == [body] and fake.valid_requests == []
    assert validate_request(body) != []
    # The scripted reply was not consumed by the rejected request.
    assert send(client, base_body()).content[0].text == "should not be used"  # type: ignore[union-attr]


VALID: list[tuple[str, dict[str, Any]]] = [
    ("plain", base_body()),
    ("no-tools", base_body(tools=None)),
    ("tool-loop", base_body(messages=tool_loop_messages())),
    (
        "tool-loop-continued",
        base_body(
            messages=[
                *tool_loop_messages(),
                _a(text("done"), _tu("toolu_c")),
                _u(_res("toolu_c", is_error=True)),
            ]
        ),
    ),
    ("pause-turn-continuation", base_body(messages=[U, _a(text("Thinking so far"))])),
    ("system-str", base_body(system="You are helpful.")),
    (
        "system-blocks-cache-4",
        base_body(
            system=[dict(text("a"), cache_control=EPH), dict(text("b"), cache_control={**EPH, "ttl": "1h"})],
            tools=[TOOLS[0], dict(TOOLS[1], cache_control=EPH)],
            messages=[_u(dict(text("x"), cache_control=EPH))],
        ),
    ),
    ("result-content-list-empty", base_body(messages=[U, _a(_tu("t1")), _u(_res("t1", content=[]))])),
    (
        "result-no-content",
        base_body(messages=[U, _a(_tu("t1")), _u({"type": "tool_result", "tool_use_id": "t1"})]),
    ),
    ("server-tool", base_body(tools=[*TOOLS, {"type": "web_search_20250305", "name": "web_search"}])),
    (
        "extra-params",
        base_body(temperature=0.2, top_p=0.9, metadata={"user_id": "u"}, tool_choice={"type": "auto"}),
    ),
    (
        "thinking-block",
        base_body(messages=[U, _a({"type": "thinking", "thinking": "hm", "signature": "sig"}, text("x")), U]),
    ),
]


@pytest.mark.parametrize("body", [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_request_accepted(
    fake: FakeMessagesAPI, client: anthropic.Anthropic, body: dict[str, Any]
) -> None:
    body = {k: v for k, v in body.items() if v is not None}
    assert validate_request(body) == []
    fake.script(reply(text("fine")))
    assert send(client, body).content[0].text == "fine"  # type: ignore[union-attr]
    assert fake.errors == [] and fake.valid_requests == [body]


def test_check_tool_names_toggle(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    body = base_body(messages=[U, _a(_tu("t1", name="undeclared")), _u(_res("t1"))])
    with pytest.raises(anthropic.BadRequestError):
        send(client, body)
    fake.check_tool_names = False
    fake.script(reply(text("ok")))
    assert send(client, body).content[0].text == "ok"  # type: ignore[union-attr]
    assert validate_request(body, check_tool_names=False) == []


def test_validate_request_non_dict() -> None:
    assert validate_request([]) == ["request body must be a JSON object"]  # type: ignore[arg-type]


# --------------------------------------------------------------------------- properties

_names = st.sampled_from([t["name"] for t in TOOLS])


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Random well-formed agent conversations: text turns and parallel tool-use rounds."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": draw(st.text(min_size=1)) + "x"}]
    counter = 0
    for _ in range(draw(st.integers(0, 4))):
        n_tools = draw(st.integers(0, 3))
        blocks: list[dict[str, Any]] = []
        if draw(st.booleans()) or n_tools == 0:
            blocks.append(text("a" + draw(st.text())))
        ids = []
        for _ in range(n_tools):
            counter += 1
            ids.append(f"toolu_{counter}")
            blocks.append(_tu(ids[-1], draw(_names), {"k": draw(st.integers())}))
        msgs.append(_a(*blocks))
        results = [_res(i, is_error=draw(st.booleans())) for i in ids]
        if not results or draw(st.booleans()):
            results.append(text("next " + draw(st.text())))
        msgs.append(_u(*results))
    return msgs


@settings(max_examples=60, deadline=None)
@given(conversations())
def test_property_generated_conversations_valid(msgs: list[dict[str, Any]]) -> None:
    assert validate_request(base_body(messages=msgs)) == []


@settings(max_examples=60, deadline=None)
@given(conversations(), st.data())
def test_property_dropping_a_tool_result_is_invalid(msgs: list[dict[str, Any]], data: st.DataObject) -> None:
    spots = [
        (i, j)
        for i, m in enumerate(msgs)
        if isinstance(m["content"], list)
        for j, b in enumerate(m["content"])
        if b["type"] in ("tool_result", "tool_use")
    ]
    if not spots:
        return
    i, j = data.draw(st.sampled_from(spots))
    broken = copy.deepcopy(msgs)
    del broken[i]["content"][j]
    if not broken[i]["content"]:
        broken[i]["content"] = [text("filler")]
    assert validate_request(base_body(messages=broken)) != []


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=70))
def test_property_tool_name_pattern(name: str) -> None:
    body = base_body(tools=[{"name": name, "input_schema": {"type": "object"}}])
    ok = 1 <= len(name) <= 64 and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)
    assert (validate_request(body) == []) == ok


# --------------------------------------------------------------------------- extended thinking

THINK: ThinkingConfigEnabledParam = {"type": "enabled", "budget_tokens": 1024}
T1 = thinking("I should read x first.")


def thinking_body(*msgs: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    return base_body(max_tokens=2048, thinking=dict(THINK), messages=list(msgs), **overrides)


def continued(*lead: dict[str, Any]) -> dict[str, Any]:
    """A thinking request continuing a tool call whose assistant message starts with ``lead``."""
    return thinking_body(U, _a(*lead, _tu("t1")), _u(_res("t1")))


def test_thinking_reply_keeps_text_and_signature_through_the_sdk(
    fake: FakeMessagesAPI, client: anthropic.Anthropic
) -> None:
    fake.script(reply(T1, redacted_thinking(), tool_use("read_file", {"path": "x"})))
    msg = send(client, thinking_body(U))
    first, second = msg.content[0], msg.content[1]
    assert isinstance(first, ThinkingBlock) and isinstance(second, RedactedThinkingBlock)
    assert first.model_dump(mode="json", exclude_none=True) == T1
    assert second.data.startswith("fakeredacted:")
    assert fake.valid_requests[0]["thinking"] == THINK


def test_streamed_thinking_arrives_whole(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> None:
    fake.script(reply(T1, text("answer")))
    with client.messages.stream(
        model=MODEL, max_tokens=2048, thinking=THINK, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        msg = stream.get_final_message()
    assert msg.content[0].model_dump(mode="json", exclude_none=True) == T1
    assert msg.content[1].text == "answer"  # type: ignore[union-attr]


def _tampered(block: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**block, **changes}


THINKING_INVALID: list[tuple[str, dict[str, Any], str]] = [
    (
        "budget-below-1024",
        base_body(max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 1023}),
        "1024",
    ),
    (
        "budget-equal-max-tokens",
        base_body(max_tokens=1024, thinking=THINK),
        "greater than `thinking.budget_tokens`",
    ),
    ("budget-missing", base_body(max_tokens=4096, thinking={"type": "enabled"}), "budget_tokens"),
    ("thinking-type", base_body(thinking={"type": "sometimes"}), "thinking"),
    ("temperature", thinking_body(U, temperature=0.2), "`temperature`"),
    ("top-k", thinking_body(U, top_k=5), "`top_k`"),
    ("top-p-low", thinking_body(U, top_p=0.5), "`top_p`"),
    ("forced-tool", thinking_body(U, tool_choice={"type": "any"}), "tool_choice forces tool use"),
    ("dropped", continued(text("Reading.")), "Expected `thinking` or `redacted_thinking`, but found `text`"),
    ("dropped-bare-tool-use", continued(), "but found `tool_use`"),
    ("moved-after-text", continued(text("Reading."), T1), "Expected `thinking`"),
    (
        "tampered-signature",
        continued(_tampered(T1, signature=T1["signature"][:-4] + "AAA=")),
        "Invalid `signature`",
    ),
    ("tampered-thinking", continued(_tampered(T1, thinking="I should delete x.")), "Invalid `signature`"),
    ("no-signature", continued({"type": "thinking", "thinking": "hm"}), "signature"),
    (
        "tampered-redacted",
        continued(_tampered(redacted_thinking(), data="fakeredacted:eA==.bad")),
        "Invalid `data`",
    ),
    ("cache-control-on-thinking", continued(dict(T1, cache_control=EPH)), "cache_control"),
    (
        "joined-stop-message-still-continues-the-turn",
        thinking_body(U, _a(text("Reading."), _tu("t1")), _u(_res("t1"), text("and now?"))),
        "Expected `thinking`",
    ),
]


@pytest.mark.parametrize(
    ("body", "needle"), [c[1:] for c in THINKING_INVALID], ids=[c[0] for c in THINKING_INVALID]
)
def test_thinking_rules_refused_like_the_real_api(
    fake: FakeMessagesAPI, client: anthropic.Anthropic, body: dict[str, Any], needle: str
) -> None:
    fake.script(reply(text("should not be used")))
    with pytest.raises(anthropic.BadRequestError) as info:
        send(client, body)
    assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert needle in info.value.message, fake.errors
    assert fake.valid_requests == []


THINKING_VALID: list[tuple[str, dict[str, Any]]] = [
    ("first-request", thinking_body(U)),
    ("continued-with-its-thinking", continued(T1, text("Reading."))),
    ("continued-with-redacted-thinking", continued(redacted_thinking(), T1)),
    ("temperature-one-top-p-high", thinking_body(U, temperature=1, top_p=0.95, tool_choice={"type": "auto"})),
    ("disabled-ignores-thinking-rules", base_body(thinking={"type": "disabled"}, temperature=0.1)),
    (
        # Without interleaved thinking only the first reply of a turn thinks.
        "later-steps-of-the-turn-without-thinking",
        thinking_body(U, _a(T1, _tu("t1")), _u(_res("t1")), _a(_tu("t2")), _u(_res("t2"))),
    ),
    (
        # A finished turn's thinking may be left out; a new user message starts a new turn.
        "earlier-turn-without-thinking",
        thinking_body(U, _a(text("a"), _tu("t1")), _u(_res("t1")), _a(text("done")), U),
    ),
    (
        "earlier-turn-thinking-kept",
        thinking_body(U, _a(T1, _tu("t1")), _u(_res("t1")), _a(text("done")), U),
    ),
]


@pytest.mark.parametrize("body", [c[1] for c in THINKING_VALID], ids=[c[0] for c in THINKING_VALID])
def test_thinking_requests_the_real_api_accepts(
    fake: FakeMessagesAPI, client: anthropic.Anthropic, body: dict[str, Any]
) -> None:
    assert validate_request(body) == []
    fake.script(reply(text("fine")))
    assert send(client, body).content[0].text == "fine"  # type: ignore[union-attr]
    assert fake.errors == []


def _round_trip(fake: FakeMessagesAPI, client: anthropic.Anthropic) -> tuple[list[dict[str, Any]], str]:
    """One served reply with two thinking blocks and a tool call, as the SDK returns it."""
    fake.script(reply(thinking("first"), thinking("second"), tool_use("read_file", {"path": "x"})))
    msg = send(client, thinking_body(U))
    content = [b.model_dump(mode="json", exclude_none=True) for b in msg.content]
    return content, content[-1]["id"]


def test_served_thinking_sent_back_verbatim_is_accepted(
    fake: FakeMessagesAPI, client: anthropic.Anthropic
) -> None:
    content, tid = _round_trip(fake, client)
    fake.script(reply(text("done")))
    assert send(client, thinking_body(U, _a(*content), _u(_res(tid)))).content[0].text == "done"  # type: ignore[union-attr]
    assert fake.errors == []


@pytest.mark.parametrize("change", ["drop-second", "reorder"])
def test_served_thinking_dropped_or_reordered_is_refused(
    fake: FakeMessagesAPI, client: anthropic.Anthropic, change: str
) -> None:
    content, tid = _round_trip(fake, client)
    first, second, call = content
    lead = [first] if change == "drop-second" else [second, first]
    body = thinking_body(U, _a(*lead, call), _u(_res(tid)))
    assert validate_request(body) == []  # each block alone is genuine: only the record tells
    with pytest.raises(anthropic.BadRequestError) as info:
        send(client, body)
    assert "passed back unmodified and in their original order" in info.value.message


# --- tool search: deferred tools, as the real API takes them --------------------------------------

SEARCH_TOOL = {"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"}
BIG = {
    "name": "sheets__write_cells",
    "description": "Write cells of a sheet. " * 40,
    "input_schema": {"type": "object", "properties": {"cells": {"type": "array"}}},
}


def deferred(tool: dict[str, Any]) -> dict[str, Any]:
    return {**copy.deepcopy(tool), "defer_loading": True}


def test_a_deferred_tool_needs_a_tool_search_tool() -> None:
    problems = validate_request(base_body(tools=[*copy.deepcopy(TOOLS), deferred(BIG)]))
    assert problems == [
        "tools: tools with defer_loading require a tool search tool "
        "(tool_search_tool_regex_20251119 or tool_search_tool_bm25_20251119) in `tools`"
    ]
    assert validate_request(base_body(tools=[*copy.deepcopy(TOOLS), SEARCH_TOOL, deferred(BIG)])) == []


def test_every_tool_deferred_is_refused_and_the_search_tool_itself_is_never_deferred() -> None:
    alone = validate_request(base_body(tools=[deferred(t) for t in TOOLS]))
    assert "All tools have defer_loading set. At least one tool must be non-deferred." in alone
    searched = validate_request(base_body(tools=[deferred(SEARCH_TOOL), deferred(BIG)]))
    assert "tools.0: the tool search tool cannot have defer_loading set" in searched
    assert "All tools have defer_loading set. At least one tool must be non-deferred." in searched
    # The API's own example: the search tool loaded, every other tool deferred.
    assert validate_request(base_body(tools=[SEARCH_TOOL, deferred(BIG)])) == []


def test_the_tool_search_tool_is_declared_under_its_own_name() -> None:
    wrong = {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_bm25"}
    problems = validate_request(base_body(tools=[wrong, *copy.deepcopy(TOOLS)]))
    assert problems == [
        "tools.0.name: Input should be 'tool_search_tool_regex' "
        "for a tool of type tool_search_tool_regex_20251119"
    ]
    bad_flag = validate_request(base_body(tools=[SEARCH_TOOL, {**deferred(BIG), "defer_loading": "yes"}]))
    assert bad_flag == ["tools.1.defer_loading: Input should be a valid boolean"]


def searched_reply(
    fake: FakeMessagesAPI, client: anthropic.Anthropic, tools: list[dict[str, Any]]
) -> Message:
    use, found = tool_search("write cells in a sheet", "sheets__write_cells", id="srvtoolu_1")
    fake.script(
        reply(
            text("Let me look for a tool."),
            use,
            found,
            tool_use("sheets__write_cells", {"cells": []}, id="toolu_w"),
        )
    )
    return client.messages.create(
        model=MODEL, max_tokens=256, tools=tools, messages=[{"role": "user", "content": "fill A1"}]
    )  # type: ignore[arg-type]


def test_a_scripted_search_finds_a_deferred_tool_and_calls_it_in_the_same_reply(
    fake: FakeMessagesAPI, client: anthropic.Anthropic
) -> None:
    tools = [*copy.deepcopy(TOOLS), SEARCH_TOOL, deferred(BIG)]
    message = searched_reply(fake, client, tools)
    kinds = [b.type for b in message.content]
    assert kinds == ["text", "server_tool_use", "tool_search_tool_result", "tool_use"]
    assert message.stop_reason == "tool_use"
    result = message.content[2]
    assert result.content.tool_references[0].tool_name == "sheets__write_cells"  # type: ignore[union-attr]
    history = [b.model_dump(mode="json", exclude_none=True) for b in message.content]
    answered = {"type": "tool_result", "tool_use_id": history[3]["id"], "content": "done"}
    body = base_body(
        tools=tools,
        messages=[
            {"role": "user", "content": "fill A1"},
            {"role": "assistant", "content": history},
            {"role": "user", "content": [answered]},
        ],
    )
    assert validate_request(body) == []  # the search blocks go back as they came; only tool_use is answered
    body["messages"][2]["content"].append(
        {"type": "tool_result", "tool_use_id": "srvtoolu_1", "content": "x"}
    )
    assert any("unexpected `tool_use_id`" in p for p in validate_request(body))


def test_a_streamed_search_reply_reaches_the_sdk_whole(
    fake: FakeMessagesAPI, client: anthropic.Anthropic
) -> None:
    use, found = tool_search("sheet", "sheets__write_cells")
    fake.script(reply(use, found, tool_use("sheets__write_cells", {"cells": [1]})))
    tools = [*copy.deepcopy(TOOLS), SEARCH_TOOL, deferred(BIG)]
    with client.messages.stream(
        model=MODEL, max_tokens=256, tools=tools, messages=[{"role": "user", "content": "go"}]
    ) as stream:  # type: ignore[arg-type]
        message = stream.get_final_message()
    assert [b.type for b in message.content] == ["server_tool_use", "tool_search_tool_result", "tool_use"]
    assert message.content[0].input == {"query": "sheet"}  # type: ignore[union-attr]


def test_history_whose_search_found_a_tool_no_longer_defined_is_refused() -> None:
    use, found = tool_search("sheet", "sheets__write_cells")
    messages = [
        {"role": "user", "content": "fill A1"},
        {"role": "assistant", "content": [use, found, text("None fits.")]},
        {"role": "user", "content": "ok"},
    ]
    assert validate_request(base_body(tools=[*copy.deepcopy(TOOLS), SEARCH_TOOL], messages=messages)) == [
        "Tool reference 'sheets__write_cells' has no corresponding tool definition"
    ]
    without_search_tool = validate_request(base_body(messages=messages))
    assert (
        "messages.1.content.0: `server_tool_use` of 'tool_search_tool_bm25', which is not in `tools`"
        in without_search_tool
    )


def test_a_search_without_its_result_is_refused() -> None:
    use, _ = tool_search("sheet", "sheets__write_cells", id="srvtoolu_lone")
    messages = [
        {"role": "user", "content": "fill A1"},
        {"role": "assistant", "content": [use, text("Hm.")]},
        {"role": "user", "content": "ok"},
    ]
    problems = validate_request(
        base_body(tools=[*copy.deepcopy(TOOLS), SEARCH_TOOL, deferred(BIG)], messages=messages)
    )
    assert problems == [
        "messages.1: `server_tool_use` srvtoolu_lone has no `tool_search_tool_result` after it"
    ]


def test_a_reply_paused_mid_search_goes_back_to_be_continued() -> None:
    use, _ = tool_search("sheet", "sheets__write_cells", id="srvtoolu_paused")
    messages = [{"role": "user", "content": "fill A1"}, {"role": "assistant", "content": [use]}]
    assert (
        validate_request(
            base_body(tools=[*copy.deepcopy(TOOLS), SEARCH_TOOL, deferred(BIG)], messages=messages)
        )
        == []
    )


def test_a_script_that_finds_or_calls_what_the_model_could_not_is_a_test_bug(
    fake: FakeMessagesAPI, client: anthropic.Anthropic
) -> None:
    use, found = tool_search("read", "read_file")  # loaded, not deferred: no search returns it
    fake.script(reply(use, found), reply(tool_use("sheets__write_cells", {})))
    tools = [*copy.deepcopy(TOOLS), SEARCH_TOOL, deferred(BIG)]
    for _ in range(2):
        with pytest.raises(anthropic.InternalServerError):
            client.messages.create(
                model=MODEL, max_tokens=256, tools=tools, messages=[{"role": "user", "content": "go"}]
            )  # type: ignore[arg-type]
    assert fake.errors == [
        "script bug: a search found 'read_file', which the request does not defer",
        "script bug: the model calls deferred tool 'sheets__write_cells' before any search found it",
    ]


def test_input_tokens_count_loaded_tools_and_deferred_ones_only_once_found(
    fake: FakeMessagesAPI, client: anthropic.Anthropic
) -> None:
    fake.count_tools = True
    ask = [{"role": "user", "content": "go"}]
    fake.script(reply(text("a")), reply(text("b")))
    loaded = client.messages.create(
        model=MODEL, max_tokens=64, tools=[*copy.deepcopy(TOOLS), BIG], messages=ask
    )  # type: ignore[arg-type]
    lazy = client.messages.create(
        model=MODEL, max_tokens=64, tools=[*copy.deepcopy(TOOLS), SEARCH_TOOL, deferred(BIG)], messages=ask
    )  # type: ignore[arg-type]
    big = len(json.dumps(BIG)) // 4
    assert loaded.usage.input_tokens - lazy.usage.input_tokens > big - 30  # the big one costs nothing yet
    tools = [*copy.deepcopy(TOOLS), SEARCH_TOOL, deferred(BIG)]
    first = searched_reply(fake, client, tools)
    history = [b.model_dump(mode="json", exclude_none=True) for b in first.content]
    call_id = history[-1]["id"]  # the fake keeps ids unique: toolu_w was served before
    fake.script(reply(text("done")))
    after = client.messages.create(
        model=MODEL,
        max_tokens=64,
        tools=tools,  # type: ignore[arg-type]
        messages=[
            *ask,
            {"role": "assistant", "content": history},  # type: ignore[list-item]
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "ok"}]},
        ],
    )
    assert after.usage.input_tokens >= lazy.usage.input_tokens + big  # found: loaded from then on
