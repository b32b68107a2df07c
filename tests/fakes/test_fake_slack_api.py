"""Tests of the loopback Slack Web API fake, driven by the real ``slack_sdk.WebClient``."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry import builtin_handlers
from slack_sdk.http_retry.builtin_handlers import (
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)
from slack_sdk.http_retry.builtin_interval_calculators import FixedValueRetryIntervalCalculator
from slack_sdk.signature import Clock, SignatureVerifier
from slack_sdk.webhook import WebhookClient

from tests.fakes.signing import action_body, event_body, signed_headers
from tests.fakes.slack_api import Call, FakeSlackAPI, validate_blocks

TOKEN = "xoxb-test"
CH = "C1"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeSlackAPI]:
    with FakeSlackAPI(bot_token=TOKEN, bot_user_id="UBOT", bot_id="BBOT", team_id="T1") as fake:
        yield fake


@pytest.fixture
def fake(server: FakeSlackAPI) -> FakeSlackAPI:
    server.reset()
    return server


@pytest.fixture
def client(fake: FakeSlackAPI) -> WebClient:
    return WebClient(token=TOKEN, base_url=fake.base_url)


def section(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}, **extra}


def button(text: str, action_id: str, value: str = "v") -> dict[str, Any]:
    return {
        "type": "button",
        "text": {"type": "plain_text", "text": text},
        "action_id": action_id,
        "value": value,
    }


def modal(title: str = "Title", **extra: Any) -> dict[str, Any]:
    return {
        "type": "modal",
        "title": {"type": "plain_text", "text": title},
        "blocks": [section("body")],
        **extra,
    }


def raw_post(url: str, body: str, content_type: str, headers: dict[str, str] | None = None) -> Any:
    req = urllib.request.Request(
        url,
        data=body.encode(),
        headers={"Content-Type": content_type, **(headers or {})},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


# -- basics -------------------------------------------------------------------


def test_base_url_and_auth_test(fake: FakeSlackAPI, client: WebClient) -> None:
    assert fake.base_url.startswith("http://127.0.0.1:") and fake.base_url.endswith("/api/")
    resp = client.auth_test()
    assert resp["ok"] is True
    assert resp["user_id"] == "UBOT" and resp["bot_id"] == "BBOT" and resp["team_id"] == "T1"
    assert {"url", "team", "user"} <= set(resp.data)  # type: ignore[arg-type]
    assert fake.calls == [fake.calls[0]] and fake.calls[0].method == "auth.test"
    assert fake.calls[0].ok and fake.calls[0].error is None


def test_invalid_token_and_token_param(fake: FakeSlackAPI) -> None:
    bad = WebClient(token="xoxb-wrong", base_url=fake.base_url)
    with pytest.raises(SlackApiError) as exc:
        bad.chat_postMessage(channel=CH, text="hi")
    assert exc.value.response["error"] == "invalid_auth"
    assert fake.messages(CH) == []
    # A form-encoded body with a `token` param and blocks as a JSON string also works.
    body = urlencode({"token": TOKEN, "channel": CH, "text": "form", "blocks": json.dumps([section("f")])})
    resp = raw_post(fake.base_url + "chat.postMessage", body, "application/x-www-form-urlencoded")
    assert resp["ok"] is True
    [msg] = fake.messages(CH)
    assert msg["blocks"] == [section("f")] and msg["text"] == "form"
    assert "token" not in fake.calls[-1].params
    assert fake.calls[-1].params["blocks"] == [section("f")]


def test_unknown_method(client: WebClient, fake: FakeSlackAPI) -> None:
    with pytest.raises(SlackApiError) as exc:
        client.api_call("nope.nothing")
    assert exc.value.response["error"] == "unknown_method"
    last = fake.calls[-1]
    assert last == Call(
        method="nope.nothing",
        params={},
        ok=False,
        error="unknown_method",
        response={"ok": False, "error": "unknown_method"},
        at=last.at,
    )


# -- messages -------------------------------------------------------------------


def test_post_message_and_threading(fake: FakeSlackAPI, client: WebClient) -> None:
    parent = client.chat_postMessage(channel=CH, text="parent", blocks=[section("*p*")])
    assert parent["channel"] == CH and parent["message"]["text"] == "parent"
    assert parent["message"]["bot_id"] == "BBOT"
    r1 = client.chat_postMessage(channel=CH, text="reply 1", thread_ts=parent["ts"])
    r2 = client.chat_postMessage(channel=CH, text="reply 2", thread_ts=r1["ts"])  # reply-to-reply
    other = client.chat_postMessage(channel=CH, text="top 2")
    client.chat_postMessage(channel="C2", text="elsewhere")

    ts_values = [parent["ts"], r1["ts"], r2["ts"], other["ts"]]
    assert ts_values == sorted(ts_values) and len(set(ts_values)) == 4
    assert ts_values == sorted(ts_values, key=float)
    assert all(len(ts.split(".")[1]) == 6 for ts in ts_values)

    assert [m["text"] for m in fake.messages(CH)] == ["parent", "reply 1", "reply 2", "top 2"]
    thread = fake.messages(CH, thread_ts=parent["ts"])
    assert [m["text"] for m in thread] == ["parent", "reply 1", "reply 2"]
    assert thread[0] == {
        "channel": CH,
        "ts": parent["ts"],
        "thread_ts": None,
        "text": "parent",
        "blocks": [section("*p*")],
        "user": "UBOT",
    }
    assert thread[1]["thread_ts"] == thread[2]["thread_ts"] == parent["ts"]
    assert [m["text"] for m in fake.messages("C2")] == ["elsewhere"]

    replies = client.conversations_replies(channel=CH, ts=parent["ts"])
    assert [m["text"] for m in replies["messages"]] == ["parent", "reply 1", "reply 2"]
    assert all(m["thread_ts"] == parent["ts"] for m in replies["messages"])
    with pytest.raises(SlackApiError, match="thread_not_found"):
        client.conversations_replies(channel=CH, ts="1.000001")


def test_post_requires_channel_and_content(client: WebClient) -> None:
    with pytest.raises(SlackApiError, match="no_text"), pytest.warns(UserWarning):
        client.chat_postMessage(channel=CH, text="")
    with pytest.raises(SlackApiError, match="channel_not_found"):
        client.api_call("chat.postMessage", json={"text": "x"})


def test_update_replaces_text_and_keeps_omitted_blocks(fake: FakeSlackAPI, client: WebClient) -> None:
    ts = client.chat_postMessage(channel=CH, text="v1", blocks=[section("one")])["ts"]
    resp = client.chat_update(channel=CH, ts=ts, text="v2")
    assert resp["ts"] == ts and resp["text"] == "v2"
    [msg] = fake.messages(CH)
    assert msg["text"] == "v2" and msg["blocks"] == [section("one")]
    client.chat_update(channel=CH, ts=ts, text="v3", blocks=[section("two")])
    [msg] = fake.messages(CH)
    assert msg["text"] == "v3" and msg["blocks"] == [section("two")]
    with pytest.raises(SlackApiError, match="message_not_found"):
        client.chat_update(channel=CH, ts="1700000000.999999", text="x")
    human_ts = fake.add_message(CH, "from a human", user="U1")
    with pytest.raises(SlackApiError, match="cant_update_message"):
        client.chat_update(channel=CH, ts=human_ts, text="x")


def test_ephemeral(fake: FakeSlackAPI, client: WebClient) -> None:
    resp = client.chat_postEphemeral(
        channel=CH, user="U1", text="only you", blocks=[section("psst")], thread_ts="1.1"
    )
    assert resp["message_ts"]
    assert fake.ephemerals == [
        {
            "channel": CH,
            "user": "U1",
            "text": "only you",
            "blocks": [section("psst")],
            "thread_ts": "1.1",
        }
    ]
    assert fake.messages(CH) == []
    with pytest.raises(SlackApiError, match="user_not_found"):
        client.api_call("chat.postEphemeral", json={"channel": CH, "text": "x"})


def test_reactions(fake: FakeSlackAPI, client: WebClient) -> None:
    ts = client.chat_postMessage(channel=CH, text="hi")["ts"]
    client.reactions_add(channel=CH, timestamp=ts, name="eyes")
    assert fake.reactions == [(CH, ts, "eyes")]
    with pytest.raises(SlackApiError, match="already_reacted"):
        client.reactions_add(channel=CH, timestamp=ts, name="eyes")
    client.reactions_remove(channel=CH, timestamp=ts, name="eyes")
    assert fake.reactions == []
    with pytest.raises(SlackApiError, match="no_reaction"):
        client.reactions_remove(channel=CH, timestamp=ts, name="eyes")
    with pytest.raises(SlackApiError, match="message_not_found"):
        client.reactions_add(channel=CH, timestamp="1.000001", name="eyes")


def test_views_open_and_update(fake: FakeSlackAPI, client: WebClient) -> None:
    resp = client.views_open(trigger_id="trig-1", view=modal(callback_id="cb"))
    view_id = resp["view"]["id"]
    assert resp["view"]["callback_id"] == "cb"
    [entry] = fake.views
    assert entry["trigger_id"] == "trig-1" and entry["id"] == view_id
    assert entry["view"] == modal(callback_id="cb")
    client.views_update(view_id=view_id, view=modal(title="Second"))
    assert fake.views[0]["view"]["title"]["text"] == "Second"
    with pytest.raises(SlackApiError, match="not_found"):
        client.views_update(view_id="VNOPE", view=modal())
    with pytest.raises(SlackApiError) as exc:
        client.views_open(trigger_id="t", view={"type": "home", "blocks": [section("x")]})
    assert exc.value.response["error"] == "invalid_arguments"
    assert any("modal" in e for e in fake.calls[-1].errors)
    with pytest.raises(SlackApiError, match="invalid_arguments"):
        client.views_open(trigger_id="t", view={"type": "modal", "blocks": [section("x")]})
    with pytest.raises(SlackApiError, match="invalid_arguments"):
        client.views_open(trigger_id="t", view=modal(title="x" * 25))  # title > 24
    with pytest.raises(SlackApiError, match="invalid_arguments"):
        client.views_open(trigger_id="", view=modal())
    assert len(fake.views) == 1


def test_users_info(fake: FakeSlackAPI, client: WebClient) -> None:
    user = client.users_info(user="UABC")["user"]
    assert user["id"] == "UABC" and user["name"] == "uabc" and user["real_name"]


# -- the assistant pane and agent sessions ------------------------------------------------------------

DM = "D1ALICE"


def test_assistant_status_needs_channel_thread_and_status_and_an_empty_one_clears(
    fake: FakeSlackAPI, client: WebClient
) -> None:
    root = fake.add_message(DM, "hello", user="UALICE")
    client.assistant_threads_setStatus(channel_id=DM, thread_ts=root, status="is thinking...")
    client.assistant_threads_setStatus(channel_id=DM, thread_ts=root, status="")
    assert [s["status"] for s in fake.statuses] == ["is thinking...", ""]
    refused = [
        ({"thread_ts": root, "status": "x"}, "invalid_arguments"),  # no channel_id
        ({"channel_id": DM, "status": "x"}, "invalid_arguments"),  # no thread_ts
        ({"channel_id": DM, "thread_ts": root}, "invalid_arguments"),  # no status at all
        ({"channel_id": "DNOPE", "thread_ts": root, "status": "x"}, "channel_not_found"),
        ({"channel_id": DM, "thread_ts": "1.2", "status": "x"}, "invalid_thread_ts"),
    ]
    for params, error in refused:
        with pytest.raises(SlackApiError) as exc:
            client.api_call("assistant.threads.setStatus", json=params)
        assert exc.value.response["error"] == error, params
    assert len(fake.statuses) == 2


def test_suggested_prompts_take_one_to_four_prompts_of_title_and_message(
    fake: FakeSlackAPI, client: WebClient
) -> None:
    root = fake.add_message(DM, "thread root", user="UBOT")
    prompts = [{"title": "Time", "message": "What time is it?"}]
    client.assistant_threads_setSuggestedPrompts(channel_id=DM, thread_ts=root, title="Try", prompts=prompts)
    assert fake.suggestions == [{"channel_id": DM, "thread_ts": root, "title": "Try", "prompts": prompts}]
    for bad in ([], prompts * 5, [{"title": "Time"}], [{"title": "", "message": "x"}], ["What time?"]):
        with pytest.raises(SlackApiError, match="invalid_arguments"):
            client.assistant_threads_setSuggestedPrompts(channel_id=DM, thread_ts=root, prompts=bad)
    with pytest.raises(SlackApiError, match="invalid_thread_ts"):
        client.assistant_threads_setSuggestedPrompts(channel_id=DM, thread_ts="1.2", prompts=prompts)
    assert len(fake.suggestions) == 1


def test_agent_sessions_are_for_agents_and_take_the_four_statuses(
    fake: FakeSlackAPI, client: WebClient
) -> None:
    root = fake.add_message(CH, "<@UBOT> hi", user="UALICE")
    with pytest.raises(SlackApiError, match="not_an_agent"):
        client.agents_sessions_setStatus(channel_id=CH, thread_ts=root, status="processing")
    fake.agent = True
    try:
        for status in ("processing", "suspended", "active", "closed"):
            answer = client.agents_sessions_setStatus(
                channel_id=CH, thread_ts=root, status=status, title="hi", initiator_user_id="UALICE"
            )
            assert answer["status"] == status
        refused = [
            {"channel_id": CH, "thread_ts": root, "status": "busy"},
            {"channel_id": CH, "status": "processing"},
            {"thread_ts": root, "status": "processing"},
            {"channel_id": CH, "thread_ts": root, "status": "processing", "title": "x" * 201},
        ]
        for params in refused:
            with pytest.raises(SlackApiError, match="invalid_arguments"):
                client.api_call("agents.sessions.setStatus", json=params)
        with pytest.raises(SlackApiError, match="invalid_thread_ts"):
            client.agents_sessions_setStatus(channel_id=CH, thread_ts="1.2", status="closed")
    finally:
        fake.agent = False
    assert [s["status"] for s in fake.sessions] == ["processing", "suspended", "active", "closed"]
    assert fake.sessions[0] == {
        "channel_id": CH,
        "thread_ts": root,
        "status": "processing",
        "title": "hi",
        "initiator_user_id": "UALICE",
    }


@pytest.mark.parametrize(
    "method",
    ["agents.sessions.setStatus", "assistant.threads.setStatus", "assistant.threads.setSuggestedPrompts"],
)
def test_the_status_methods_can_be_rate_limited(fake: FakeSlackAPI, client: WebClient, method: str) -> None:
    fake.fail_next(method, status=429, headers={"Retry-After": "3"})
    with pytest.raises(SlackApiError) as exc:
        client.api_call(method, json={"channel_id": CH, "thread_ts": "1.2", "status": "processing"})
    assert exc.value.response.status_code == 429 and exc.value.response.headers.get("Retry-After") == "3"
    assert (fake.calls[-1].method, fake.calls[-1].error) == (method, "ratelimited")


def test_response_url(fake: FakeSlackAPI) -> None:
    resp = WebhookClient(fake.response_url("abc")).send(
        text="done", replace_original=True, blocks=[section("resp")]
    )
    assert resp.status_code == 200 and json.loads(resp.body) == {"ok": True}
    [body] = fake.responses
    assert body["text"] == "done" and body["replace_original"] is True
    assert body["blocks"] == [section("resp")]
    assert fake.find_texts("resp") == ["resp"]


def test_texts_recorded(fake: FakeSlackAPI, client: WebClient) -> None:
    client.chat_postMessage(
        channel=CH,
        text="fallback",
        blocks=[
            {"type": "header", "text": {"type": "plain_text", "text": "Head"}},
            section("body", fields=[{"type": "mrkdwn", "text": "field"}]),
            {"type": "actions", "elements": [button("Approve", "approve")]},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": "ctx"}]},
        ],
    )
    client.chat_postEphemeral(channel=CH, user="U1", text="secret-ish")
    assert fake.texts == ["fallback", "Head", "body", "field", "Approve", "ctx", "secret-ish"]
    assert fake.find_texts("secret") == ["secret-ish"]


# -- block validation -------------------------------------------------------------


def _actions(*elements: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "actions", "elements": list(elements), **extra}


INVALID_BLOCKS: dict[str, list[dict[str, Any]]] = {
    "unknown type": [{"type": "no_such_block"}],
    "missing type": [{"text": {"type": "mrkdwn", "text": "x"}}],
    "sdk validate_json": [{"type": "section"}],  # neither text nor fields
    "too many blocks": [{"type": "divider"}] * 51,
    "section text": [section("x" * 3001)],
    "section fields count": [{"type": "section", "fields": [{"type": "mrkdwn", "text": "f"}] * 11}],
    "section field text": [{"type": "section", "fields": [{"type": "mrkdwn", "text": "f" * 2001}]}],
    "header text": [{"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}],
    "context elements": [{"type": "context", "elements": [{"type": "mrkdwn", "text": "c"}] * 11}],
    "button text": [_actions(button("b" * 76, "a"))],
    "button value": [_actions(button("b", "a", value="v" * 2001))],
    "action_id length": [_actions(button("b", "a" * 256))],
    "block_id length": [section("x", block_id="b" * 256)],
    "duplicate action_id": [_actions(button("b", "same"), button("c", "same"))],
    "duplicate block_id": [section("x", block_id="dup"), section("y", block_id="dup")],
    "text not an object": [{"type": "section", "text": "plain string"}],
}


@pytest.mark.parametrize("case", sorted(INVALID_BLOCKS))
def test_invalid_blocks_rejected_on_post(case: str, fake: FakeSlackAPI, client: WebClient) -> None:
    blocks = INVALID_BLOCKS[case]
    assert validate_blocks(blocks), case
    with pytest.raises(SlackApiError) as exc:
        client.chat_postMessage(channel=CH, text="t", blocks=blocks)
    assert exc.value.response["error"] == "invalid_blocks"
    assert exc.value.response["errors"]
    assert all("[json-pointer:/blocks" in e for e in exc.value.response["errors"])
    last = fake.calls[-1]
    assert last.method == "chat.postMessage" and not last.ok and last.error == "invalid_blocks"
    assert last.errors == exc.value.response["errors"]
    assert fake.messages(CH) == []
    assert fake.texts == []


@pytest.mark.parametrize("method", ["chat.update", "chat.postEphemeral"])
def test_invalid_blocks_rejected_on_update_and_ephemeral(
    method: str, fake: FakeSlackAPI, client: WebClient
) -> None:
    ts = client.chat_postMessage(channel=CH, text="ok", blocks=[section("ok")])["ts"]
    for case, blocks in INVALID_BLOCKS.items():
        args = {"channel": CH, "text": "t", "blocks": blocks, "ts": ts, "user": "U1"}
        with pytest.raises(SlackApiError) as exc:
            client.api_call(method, json=args)
        assert exc.value.response["error"] == "invalid_blocks", case
    assert fake.messages(CH)[0]["blocks"] == [section("ok")]
    assert fake.ephemerals == []


def test_valid_blocks_accepted(fake: FakeSlackAPI, client: WebClient) -> None:
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": "h" * 150}},
        section("x" * 3000, block_id="b1", accessory=button("a" * 75, "acc", value="v" * 2000)),
        {"type": "section", "fields": [{"type": "mrkdwn", "text": "f" * 200}] * 10},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": "c"}] * 10},
        _actions(button("Approve", "approve"), button("Deny", "deny"), block_id="b2"),
        _actions(button("Approve", "approve"), block_id="b3"),  # same action_id, other block
        {"type": "divider"},
    ]
    assert validate_blocks(blocks) == []
    client.chat_postMessage(channel=CH, text="ok", blocks=blocks)
    assert fake.messages(CH)[0]["blocks"] == blocks
    client.chat_postMessage(channel=CH, text="fifty", blocks=[{"type": "divider"}] * 50)


def test_message_size_limits(fake: FakeSlackAPI, client: WebClient) -> None:
    big = [section("x" * 2900) for _ in range(5)]  # each valid, > 13000 chars of JSON
    with pytest.raises(SlackApiError, match="msg_blocks_too_long"):
        client.chat_postMessage(channel=CH, text="t", blocks=big)
    with pytest.raises(SlackApiError, match="msg_too_long"):
        client.chat_postMessage(channel=CH, text="x" * 40001)
    client.chat_postMessage(channel=CH, text="x" * 40000)
    assert len(fake.messages(CH)) == 1


# -- failure injection ------------------------------------------------------------------


def test_fail_next_error(fake: FakeSlackAPI, client: WebClient) -> None:
    fake.fail_next("chat.postMessage", error="channel_not_found", times=2)
    for _ in range(2):
        with pytest.raises(SlackApiError, match="channel_not_found"):
            client.chat_postMessage(channel=CH, text="x")
    client.chat_postMessage(channel=CH, text="x")
    assert [c.ok for c in fake.calls] == [False, False, True]
    assert fake.calls[0].error == "channel_not_found"
    assert len(fake.messages(CH)) == 1


def test_429_without_retry_handler_raises(fake: FakeSlackAPI, client: WebClient) -> None:
    fake.fail_next("chat.postMessage", status=429, headers={"Retry-After": "7"})
    with pytest.raises(SlackApiError) as exc:
        client.chat_postMessage(channel=CH, text="x")
    assert exc.value.response.status_code == 429
    assert exc.value.response["error"] == "ratelimited"
    assert exc.value.response.headers.get("Retry-After") == "7"
    assert fake.calls[-1].status == 429


def test_429_recovered_by_rate_limit_retry_handler(
    fake: FakeSlackAPI, client: WebClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The handler sleeps Retry-After + random() seconds; drop the jitter to stay fast.
    monkeypatch.setattr(builtin_handlers.random, "random", lambda: 0.0)
    client.retry_handlers.append(RateLimitErrorRetryHandler(max_retry_count=1))
    fake.fail_next("chat.postMessage", status=429, headers={"Retry-After": "0"})
    resp = client.chat_postMessage(channel=CH, text="after rate limit")
    assert resp["ok"] is True
    assert [(c.method, c.status, c.ok) for c in fake.calls] == [
        ("chat.postMessage", 429, False),
        ("chat.postMessage", 200, True),
    ]
    assert [m["text"] for m in fake.messages(CH)] == ["after rate limit"]


def test_500_recovered_by_server_error_retry_handler(fake: FakeSlackAPI, client: WebClient) -> None:
    ts = client.chat_postMessage(channel=CH, text="v1")["ts"]
    client.retry_handlers.append(
        ServerErrorRetryHandler(max_retry_count=2, interval_calculator=FixedValueRetryIntervalCalculator(0.0))
    )
    fake.fail_next("chat.update", status=500, times=2)
    resp = client.chat_update(channel=CH, ts=ts, text="v2")
    assert resp["ok"] is True
    assert [c.status for c in fake.calls if c.method == "chat.update"] == [500, 500, 200]
    assert fake.messages(CH)[0]["text"] == "v2"


# -- waiting, reset, other processes ----------------------------------------------------------


def test_wait_for_message_from_another_thread(fake: FakeSlackAPI, client: WebClient) -> None:
    go = threading.Event()

    def poster() -> None:
        go.wait(5)
        for i in range(3):
            client.chat_postMessage(channel=CH, text=f"msg {i}")

    thread = threading.Thread(target=poster)
    thread.start()
    assert fake.wait_for_message(CH, lambda m: m["text"] == "msg 2", timeout=0.01) is None
    go.set()
    msg = fake.wait_for_message(CH, lambda m: m["text"] == "msg 2", timeout=5)
    thread.join(5)
    assert msg is not None and msg["text"] == "msg 2" and msg["user"] == "UBOT"
    assert fake.wait_for(lambda f: len(f.calls) == 3, timeout=5)
    assert fake.wait_for(lambda f: len(f.calls) == 99, timeout=0.01) is False


def test_concurrent_posts_get_unique_ts(fake: FakeSlackAPI) -> None:
    def worker(n: int) -> None:
        c = WebClient(token=TOKEN, base_url=fake.base_url)
        for i in range(5):
            c.chat_postMessage(channel=CH, text=f"{n}-{i}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    assert fake.wait_for(lambda f: len(f.messages(CH)) == 40, timeout=10)
    for t in threads:
        t.join(5)
    ts_values = [m["ts"] for m in fake.messages(CH)]
    assert len(set(ts_values)) == 40 and ts_values == sorted(ts_values)


def test_reset_clears_state_but_ts_stays_unique(fake: FakeSlackAPI, client: WebClient) -> None:
    ts1 = client.chat_postMessage(channel=CH, text="x")["ts"]
    client.reactions_add(channel=CH, timestamp=ts1, name="eyes")
    fake.fail_next("auth.test", error="boom")
    fake.reset()
    assert fake.calls == [] and fake.messages(CH) == [] and fake.reactions == []
    assert client.auth_test()["ok"]  # the queued failure was dropped too
    ts2 = client.chat_postMessage(channel=CH, text="y")["ts"]
    assert float(ts2) > float(ts1)


def test_client_in_another_process(fake: FakeSlackAPI) -> None:
    code = (
        "import os\n"
        "from slack_sdk import WebClient\n"
        "c = WebClient(token='xoxb-test', base_url=os.environ['SLACK_API_URL'])\n"
        "c.chat_postMessage(channel='C9', text='from subprocess')\n"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        env={"SLACK_API_URL": fake.base_url, "PATH": ""},
        check=True,
        timeout=30,
    )
    assert [m["text"] for m in fake.messages("C9")] == ["from subprocess"]


# -- signing helpers ---------------------------------------------------------------------


class _FixedClock(Clock):
    def __init__(self, now: float) -> None:
        self._now = now

    def now(self) -> float:
        return self._now


def test_signed_headers_accepted_by_signature_verifier() -> None:
    secret = "shh-signing-secret"
    verifier = SignatureVerifier(secret)
    body = event_body({"type": "app_mention", "text": "<@UBOT> hi"}, event_id="Ev1")
    headers = signed_headers(secret, body)
    assert set(headers) == {"X-Slack-Request-Timestamp", "X-Slack-Signature"}
    assert verifier.is_valid_request(body, headers)
    assert verifier.is_valid_request(body.encode(), signed_headers(secret, body.encode()))
    assert not verifier.is_valid_request(body + " ", headers)
    assert not SignatureVerifier("other").is_valid_request(body, headers)
    stale = signed_headers(secret, body, timestamp=1_000_000_000)
    assert stale["X-Slack-Request-Timestamp"] == "1000000000"
    assert not verifier.is_valid_request(body, stale)  # too old
    then = SignatureVerifier(secret, clock=_FixedClock(1_000_000_030))
    assert then.is_valid(body, stale["X-Slack-Request-Timestamp"], stale["X-Slack-Signature"])


def test_event_and_action_bodies() -> None:
    envelope = json.loads(event_body({"type": "message", "text": "x"}, event_id="Ev9", team_id="T7"))
    assert envelope["type"] == "event_callback" and envelope["event_id"] == "Ev9"
    assert envelope["team_id"] == "T7" and envelope["api_app_id"] == "A1"
    assert envelope["event"] == {"type": "message", "text": "x"}
    payload = {"type": "block_actions", "actions": [{"action_id": "approve", "value": "1&2=3"}]}
    form = parse_qs(action_body(payload))
    assert list(form) == ["payload"] and json.loads(form["payload"][0]) == payload


def test_usergroups_users_list(fake: FakeSlackAPI, client: WebClient) -> None:
    fake.set_usergroup("S0OPS", ["UANN", "UBEN"])
    assert client.usergroups_users_list(usergroup="S0OPS")["users"] == ["UANN", "UBEN"]
    with pytest.raises(SlackApiError) as info:
        client.usergroups_users_list(usergroup="S0NONE")
    assert info.value.response["error"] == "no_such_subteam"
    with pytest.raises(SlackApiError) as info:
        client.api_call("usergroups.users.list", params={})
    assert info.value.response["error"] == "invalid_arguments"
    fake.set_usergroup("S0OPS", None)  # deleted
    with pytest.raises(SlackApiError):
        client.usergroups_users_list(usergroup="S0OPS")
    fake.set_usergroup("S0OPS", [])
    fake.fail_next("usergroups.users.list", error="missing_scope")
    with pytest.raises(SlackApiError) as info:
        client.usergroups_users_list(usergroup="S0OPS")
    assert info.value.response["error"] == "missing_scope"
    assert client.usergroups_users_list(usergroup="S0OPS")["users"] == []
    fake.fail_next("usergroups.users.list", times=100)
    fake.clear_failures("usergroups.users.list")
    assert client.usergroups_users_list(usergroup="S0OPS")["ok"]


def test_views_publish_keeps_one_home_per_user(fake: FakeSlackAPI, client: WebClient) -> None:
    home = {"type": "home", "blocks": [section("first")]}
    first = client.views_publish(user_id="UANN", view=home)["view"]
    assert first["type"] == "home" and fake.home("UANN") == home and fake.home("UBEN") is None
    second = client.views_publish(user_id="UANN", view={"type": "home", "blocks": [section("second")]})
    assert second["view"]["id"] == first["id"] and fake.home("UANN")["blocks"][0]["text"]["text"] == "second"
    with pytest.raises(SlackApiError) as info:
        client.views_publish(user_id="UANN", view=home, hash="stale.hash")
    assert info.value.response["error"] == "hash_conflict"
    for bad in (
        {"type": "modal", "title": {"type": "plain_text", "text": "x"}, "blocks": [section("x")]},
        {"type": "home", "blocks": [section("x" * 3001)]},
        {"type": "home", "blocks": [section(str(i)) for i in range(101)]},
    ):
        with pytest.raises(SlackApiError) as info:
            client.views_publish(user_id="UANN", view=bad)
        assert info.value.response["error"] == "invalid_arguments"
    with pytest.raises(SlackApiError) as info:
        client.api_call("views.publish", json={"view": home})
    assert info.value.response["error"] == "invalid_arguments"
    assert fake.home("UANN")["blocks"][0]["text"]["text"] == "second"


def test_chat_get_permalink(fake: FakeSlackAPI, client: WebClient) -> None:
    root = client.chat_postMessage(channel=CH, text="root")["ts"]
    reply = client.chat_postMessage(channel=CH, text="reply", thread_ts=root)["ts"]
    link = client.chat_getPermalink(channel=CH, message_ts=root)["permalink"]
    assert link == f"https://fake-workspace.slack.com/archives/{CH}/p{root.replace('.', '')}"
    threaded = client.chat_getPermalink(channel=CH, message_ts=reply)["permalink"]
    assert threaded.endswith(f"?thread_ts={root}&cid={CH}")
    for kwargs, error in (
        ({"channel": "C404", "message_ts": root}, "channel_not_found"),
        ({"channel": CH, "message_ts": "1.000001"}, "message_not_found"),
    ):
        with pytest.raises(SlackApiError) as info:
            client.chat_getPermalink(**kwargs)
        assert info.value.response["error"] == error


def test_a_task_update_replaces_title_and_status_and_adds_to_details_and_output(
    fake: FakeSlackAPI, client: WebClient
) -> None:
    root = client.chat_postMessage(channel=CH, text="ask")["ts"]

    def task(status: str, **more: str) -> dict[str, Any]:
        return {
            "type": "task_update",
            "id": "t1",
            "title": f"write_file ({status})",
            "status": status,
            **more,
        }

    ts = client.chat_startStream(
        channel=CH, thread_ts=root, recipient_team_id="T1", recipient_user_id="UA", chunks=[task("pending")]
    )["ts"]
    client.chat_appendStream(channel=CH, ts=ts, chunks=[task("in_progress", details="Approved.")])
    client.chat_stopStream(
        channel=CH, ts=ts, chunks=[task("complete", details=" Ran.", output="a > b & <!here>")]
    )
    (shown,) = fake.streams()[0]["tasks"].values()
    assert (shown["title"], shown["status"]) == ("write_file (complete)", "complete")
    assert (
        shown["details"] == "Approved. Ran." and shown["output"] == "a > b & <!here>"
    )  # plain text, as sent
    assert shown["history"] == ["pending", "in_progress", "complete"]
    with pytest.raises(SlackApiError) as info:  # a stopped stream takes no task update
        client.chat_appendStream(channel=CH, ts=ts, chunks=[task("error")])
    assert info.value.response["error"] == "message_not_in_streaming_state"
    client.chat_update(channel=CH, ts=ts, text="settled", blocks=[section("settled")])
    assert fake.streams()[0]["tasks"]["t1"]["status"] == "complete"  # kept as the stream stopped


def test_a_stream_write_gives_its_words_as_markdown_text_or_as_chunks_never_both(
    fake: FakeSlackAPI, client: WebClient
) -> None:
    root = client.chat_postMessage(channel=CH, text="ask")["ts"]
    words = {"type": "markdown_text", "text": "more"}
    with pytest.raises(SlackApiError) as info:
        client.chat_startStream(
            channel=CH,
            thread_ts=root,
            recipient_team_id="T1",
            recipient_user_id="UA",
            markdown_text="hi",
            chunks=[words],
        )
    assert info.value.response["error"] == "cannot_provide_both_markdown_text_and_chunks"
    ts = client.chat_startStream(
        channel=CH, thread_ts=root, recipient_team_id="T1", recipient_user_id="UA", markdown_text="hi"
    )["ts"]
    for method in (client.chat_appendStream, client.chat_stopStream):
        with pytest.raises(SlackApiError) as info:
            method(channel=CH, ts=ts, markdown_text=" there", chunks=[words])
        assert info.value.response["error"] == "cannot_provide_both_markdown_text_and_chunks"
    client.chat_appendStream(channel=CH, ts=ts, chunks=[words])
    assert fake.streams()[0]["text"] == "himore"


def test_usergroups_list_names_each_group_by_its_handle_as_slack_does(
    fake: FakeSlackAPI, client: WebClient
) -> None:
    fake.set_usergroup("S0OPS", ["UANN", "UBEN"], "oncall")
    fake.set_usergroup("S0OLD", ["UCAT"], "retired", disabled=True)
    fake.set_usergroup("S0DEV", [])  # no handle given: its id in lower case
    listed = client.usergroups_list()["usergroups"]
    assert [(g["id"], g["handle"], g["date_delete"]) for g in listed] == [
        ("S0OPS", "oncall", 0),
        ("S0DEV", "s0dev", 0),
    ]
    assert all(g["team_id"] == "T1" and g["is_usergroup"] and "users" not in g for g in listed)
    everything = client.usergroups_list(include_disabled=True, include_users=True, include_count=True)
    old = next(g for g in everything["usergroups"] if g["id"] == "S0OLD")
    assert old["handle"] == "retired" and old["date_delete"] > 0 and old["users"] == ["UCAT"]
    assert old["user_count"] == 1
    fake.set_usergroup("S0OPS", None)  # deleted: no longer listed
    assert "S0OPS" not in [g["id"] for g in client.usergroups_list()["usergroups"]]
    fake.fail_next("usergroups.list", error="missing_scope")
    with pytest.raises(SlackApiError) as info:
        client.usergroups_list()
    assert info.value.response["error"] == "missing_scope"
    assert fake.calls[-1].method == "usergroups.list"
