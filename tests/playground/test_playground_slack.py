"""The playground's stand-in for Slack, through the real `slack_sdk` client, and its page API's guards."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from harness import texts
from harness.config import load_config
from messages.home import PERMALINK
from playground import server as server_module
from playground.profiles import describe
from playground.server import Server
from playground.slack import BOT_USER_ID, CHANNEL_ID, CHANNELS, OPS_CHANNEL_ID, PEOPLE, TEAM_ID
from tests.playground_support import ALICE, BOB, CAROL, Page, stand_in

TOKEN = "xoxb-playground-test"


@pytest.fixture
def served() -> Iterator[tuple[Server, WebClient, Page]]:
    """A playground server with no bot behind it (the bot's address refuses connections)."""
    with stand_in(TOKEN, usergroups={"S01REVIEWERS": [ALICE]}) as server:
        url = server.playground.base_url
        yield server, WebClient(token=TOKEN, base_url=url + "api/"), Page(url)


def test_posts_updates_and_metadata_come_back_as_slack_returns_them(served: Any) -> None:
    server, client, page = served
    parent = page.state()  # nothing yet
    assert parent["messages"] == []
    ts = server.playground.workspace.post_as(ALICE, f"<@{BOT_USER_ID}> hi", None)["ts"]
    meta = {"event_type": "harness_post", "event_payload": {"run": "r1", "key": "turn:1"}}
    posted = client.chat_postMessage(
        channel=CHANNEL_ID, thread_ts=ts, text="t", blocks=[{"type": "divider"}], metadata=meta
    )
    assert posted["message"]["blocks"][0]["block_id"]  # Slack gives every block an id

    client.chat_update(channel=CHANNEL_ID, ts=posted["ts"], text="changed")  # blocks omitted: kept
    replies = client.conversations_replies(channel=CHANNEL_ID, ts=ts, include_all_metadata=True)
    assert [m["text"] for m in replies["messages"]] == [f"<@{BOT_USER_ID}> hi", "changed"]
    assert (
        replies["messages"][1]["metadata"] == meta
        and replies["messages"][1]["blocks"][0]["type"] == "divider"
    )
    without = client.conversations_replies(channel=CHANNEL_ID, ts=ts)
    assert "metadata" not in without["messages"][1]
    shown = page.thread(ts)
    assert shown[1]["edited"] is True and shown[1]["bot_id"]
    link = client.chat_getPermalink(channel=CHANNEL_ID, message_ts=posted["ts"])["permalink"]
    assert PERMALINK.fullmatch(link) and f"thread_ts={ts}" in link  # the Home tab links to cards


@pytest.mark.filterwarnings("ignore:The top-level `text` argument is missing")
def test_a_file_the_bot_uploads_lands_in_its_thread_and_on_the_page(served: Any) -> None:
    server, client, page = served
    ts = server.playground.workspace.post_as(ALICE, "hello", None)["ts"]
    text = "# The whole answer\n\n<!channel> stays text in a file\n"
    done = client.files_upload_v2(
        channel=CHANNEL_ID, thread_ts=ts, content=text, filename="a.md", title="Whole"
    )
    assert done["file"]["title"] == "Whole"
    (shared,) = [m for m in page.thread(ts) if m["files"]]
    assert shared["files"] == [{"name": "a.md", "title": "Whole", "text": text}]
    replies = client.conversations_replies(channel=CHANNEL_ID, ts=ts)["messages"]
    assert replies[1]["files"][0]["name"] == "a.md"  # how a recovering worker finds it again
    status, _ = page.request("POST", "upload/F0000000999", {"x": 1})
    assert status == 400  # no such upload


@pytest.mark.filterwarnings("ignore:The top-level `text` argument is missing")
def test_the_mistakes_slack_refuses_are_refused_with_slacks_error_names(served: Any) -> None:
    server, client, _ = served
    ts = server.playground.workspace.post_as(ALICE, "hello", None)["ts"]
    cases = [
        (lambda: WebClient(token="xoxb-wrong", base_url=client.base_url).auth_test(), "invalid_auth"),
        (lambda: client.chat_update(channel=CHANNEL_ID, ts=ts, text="x"), "cant_update_message"),
        (lambda: client.chat_postMessage(channel="C0OTHER", text="x"), "channel_not_found"),
        (lambda: client.chat_postMessage(channel=CHANNEL_ID, thread_ts="1.2", text="x"), "thread_not_found"),
        (lambda: client.chat_postMessage(channel=CHANNEL_ID), "no_text"),
        (lambda: client.views_open(trigger_id="made-up", view=_modal()), "invalid_trigger_id"),
        (lambda: client.usergroups_users_list(usergroup="S0NOPE"), "no_such_subteam"),
        (lambda: client.api_call("chat.scheduleMessage", json={}), "unknown_method"),
    ]
    for call, error in cases:
        with pytest.raises(SlackApiError) as refused:
            call()
        assert refused.value.response["error"] == error
    client.reactions_add(channel=CHANNEL_ID, timestamp=ts, name="eyes")
    with pytest.raises(SlackApiError, match="already_reacted"):
        client.reactions_add(channel=CHANNEL_ID, timestamp=ts, name="eyes")
    assert client.usergroups_users_list(usergroup="S01REVIEWERS")["users"] == [ALICE]
    assert server.playground.workspace.messages[0]["text"] == "hello"  # nothing changed it


def test_user_groups_are_listed_with_their_handles_over_get_as_slack_lists_them() -> None:
    groups = {"S01REVIEWERS": [ALICE], "S02ONCALL": [ALICE, BOB]}
    with stand_in(TOKEN, usergroups=groups, handles={"S02ONCALL": "oncall"}) as server:
        url = server.playground.base_url
        client = WebClient(token=TOKEN, base_url=url + "api/")
        listed = client.usergroups_list()  # slack_sdk sends it as a GET
        assert [(g["id"], g["handle"]) for g in listed["usergroups"]] == [
            ("S01REVIEWERS", "s01reviewers"),  # no handle given: its id in lower case
            ("S02ONCALL", "oncall"),
        ]
        assert all(g["team_id"] == TEAM_ID and "users" not in g for g in listed["usergroups"])
        assert client.usergroups_list(include_users=True)["usergroups"][1]["users"] == [ALICE, BOB]
        with pytest.raises(SlackApiError, match="invalid_auth"):
            WebClient(token="xoxb-wrong", base_url=url + "api/").usergroups_list()
        # The page shows a `<!subteam^…>` by its handle, as Slack's client does.
        assert {"id": "S02ONCALL", "handle": "oncall"} in Page(url).state()["groups"]


def test_the_status_methods_the_worker_calls_are_answered_and_kept(served: Any) -> None:
    server, client, _ = served
    workspace = server.playground.workspace
    ts = workspace.post_as(ALICE, f"<@{BOT_USER_ID}> hi", None)["ts"]
    for status in ("processing", "suspended", "closed"):
        answer = client.agents_sessions_setStatus(
            channel_id=CHANNEL_ID, thread_ts=ts, status=status, title="hi", initiator_user_id=ALICE
        )
        assert answer["status"] == status
    assert workspace.sessions == {ts: "closed"}
    client.assistant_threads_setStatus(channel_id=CHANNEL_ID, thread_ts=ts, status="is working on it…")
    client.assistant_threads_setStatus(channel_id=CHANNEL_ID, thread_ts=ts, status="")  # clears it
    assert [s["status"] for s in workspace.statuses] == ["is working on it…", ""]
    prompts = [{"title": "Time", "message": "What time is it?"}]
    client.assistant_threads_setSuggestedPrompts(channel_id=CHANNEL_ID, thread_ts=ts, prompts=prompts)
    assert workspace.suggestions == [{"thread_ts": ts, "prompts": prompts}]

    session, status = "agents.sessions.setStatus", "assistant.threads.setStatus"
    refused = [
        (session, {"channel_id": CHANNEL_ID, "thread_ts": ts, "status": "busy"}, "invalid_arguments"),
        (session, {"channel_id": "C0OTHER", "thread_ts": ts, "status": "closed"}, "channel_not_found"),
        (session, {"channel_id": CHANNEL_ID, "thread_ts": "1.2", "status": "closed"}, "invalid_thread_ts"),
        (status, {"thread_ts": ts, "status": "x"}, "invalid_arguments"),
        (
            "assistant.threads.setSuggestedPrompts",
            {"channel_id": CHANNEL_ID, "prompts": prompts * 5},
            "invalid_arguments",
        ),
    ]
    for method, params, error in refused:
        with pytest.raises(SlackApiError) as exc:
            client.api_call(method, json=params)
        assert exc.value.response["error"] == error, (method, params)
    assert workspace.sessions == {ts: "closed"} and len(workspace.statuses) == 2


def test_a_trigger_opens_one_modal_for_the_person_who_clicked(served: Any) -> None:
    server, client, page = served
    trigger = server.playground.workspace.new_trigger(CAROL)
    opened = client.views_open(trigger_id=trigger, view=_modal())["view"]
    with pytest.raises(SlackApiError, match="invalid_trigger_id"):
        client.views_open(trigger_id=trigger, view=_modal())  # used up
    views = page.state()["views"]
    assert [(v["id"], v["user"]) for v in views] == [(opened["id"], CAROL)]
    with pytest.raises(SlackApiError, match="hash_conflict"):
        client.views_update(view_id=opened["id"], hash="stale", view=_modal("Two"))
    client.views_update(view_id=opened["id"], hash=opened["hash"], view=_modal("Two"))
    assert page.state()["views"][0]["view"]["title"]["text"] == "Two"
    client.views_publish(user_id=ALICE, view={"type": "home", "blocks": []})
    assert page.state()["homes"][ALICE]["type"] == "home"


def _modal(title: str = "One") -> dict[str, Any]:
    return {
        "type": "modal",
        "callback_id": "c",
        "title": {"type": "plain_text", "text": title},
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "hi"}}],
    }


def test_a_clicks_response_url_replaces_the_message_or_answers_the_clicker_five_times_at_most(
    served: Any,
) -> None:
    server, client, page = served
    posted = client.chat_postMessage(channel=CHANNEL_ID, text="a card", blocks=[{"type": "divider"}])
    url = server.playground._response_url(ALICE, CHANNEL_ID, posted["ts"], None)
    path = url.split("/", 3)[3]
    assert page.request("POST", path, {"replace_original": True, "text": "replaced"})[0] == 200
    assert [m["text"] for m in page.state()["messages"]] == ["replaced"]
    assert page.request("POST", path, {"text": "only for you"})[0] == 200
    assert [(e["user"], e["text"]) for e in page.state()["ephemerals"]] == [(ALICE, "only for you")]
    for _ in range(3):
        assert page.request("POST", path, {"text": "again"})[0] == 200
    status, answer = page.request("POST", path, {"text": "a sixth time"})
    assert status == 404 and answer["error"] == "expired_url"


def test_a_stream_grows_on_the_page_then_settles_as_the_message_without_an_edit_mark(served: Any) -> None:
    server, client, page = served
    ts = server.playground.workspace.post_as(ALICE, "hello", None)["ts"]
    with pytest.raises(SlackApiError, match="invalid_arguments"):
        client.chat_startStream(channel=CHANNEL_ID, thread_ts=ts)  # a channel needs its recipient
    opened = client.chat_startStream(
        channel=CHANNEL_ID, thread_ts=ts, recipient_team_id="T0PLAYGND", recipient_user_id=ALICE
    )
    client.chat_appendStream(channel=CHANNEL_ID, ts=opened["ts"], markdown_text="Hello ")
    client.chat_appendStream(channel=CHANNEL_ID, ts=opened["ts"], markdown_text="world")
    assert page.thread(ts)[-1]["text"] == "Hello world"
    with pytest.raises(SlackApiError, match="message_is_streaming"):
        client.chat_update(channel=CHANNEL_ID, ts=opened["ts"], text="too early")
    client.chat_stopStream(channel=CHANNEL_ID, ts=opened["ts"])
    client.chat_update(channel=CHANNEL_ID, ts=opened["ts"], text="Hello world, settled")
    settled = page.thread(ts)[-1]
    assert (settled["text"], settled["edited"]) == ("Hello world, settled", False)
    with pytest.raises(SlackApiError, match="message_not_in_streaming_state"):
        client.chat_appendStream(channel=CHANNEL_ID, ts=opened["ts"], markdown_text="late")


def _task(task_id: str, title: str, status: str, **more: str) -> dict[str, str]:
    return {"type": "task_update", "id": task_id, "title": title, "status": status, **more}


def test_a_streams_chunks_grow_its_text_and_keep_its_tasks_by_id_through_stop_and_settling(
    served: Any,
) -> None:
    server, client, page = served
    ts = server.playground.workspace.post_as(ALICE, "hello", None)["ts"]
    opened = client.chat_startStream(
        channel=CHANNEL_ID,
        thread_ts=ts,
        recipient_team_id="T0PLAYGND",
        recipient_user_id=ALICE,
        markdown_text="Working",
        chunks=[_task("t1", "List the files", "pending")],
        task_display_mode="plan",
    )
    stream = {"channel": CHANNEL_ID, "ts": opened["ts"]}
    client.chat_appendStream(
        **stream, chunks=[_task("t1", "Listing the files", "in_progress", details="2 files")]
    )  # no text
    client.chat_appendStream(
        **stream,
        markdown_text=" on it",
        chunks=[{"type": "markdown_text", "text": "…"}, _task("t2", "Write notes.md", "pending")],
    )
    live = page.thread(ts)[-1]
    assert (live["text"], live["streaming"], live["task_display_mode"]) == ("Working on it…", True, "plan")
    assert [(t["id"], t["title"], t["status"]) for t in live["tasks"]] == [
        ("t1", "Listing the files", "in_progress"),
        ("t2", "Write notes.md", "pending"),
    ]
    client.chat_stopStream(
        **stream,
        chunks=[
            _task("t2", "Write notes.md", "error", output="declined"),
            _task("t1", "List the files", "complete", details=", both read"),
        ],
    )
    stopped = page.thread(ts)[-1]
    assert stopped["streaming"] is False and stopped["text"] == "Working on it…"
    assert stopped["tasks"] == [
        {"id": "t1", "title": "List the files", "status": "complete", "details": "2 files, both read"},
        {"id": "t2", "title": "Write notes.md", "status": "error", "output": "declined"},
    ]  # first-seen order, the latest title and status winning, details added to as Slack does
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "Done"}}]
    client.chat_update(**stream, text="Done", blocks=blocks)
    settled = page.thread(ts)[-1]
    assert (settled["text"], settled["blocks"][0]["text"]["text"]) == ("Done", "Done")
    assert settled["tasks"] == stopped["tasks"] and settled["edited"] is False  # Slack keeps them


@pytest.mark.parametrize(
    ("call", "arguments"),
    [
        ("chat_appendStream", {"chunks": [{"type": "plan_updat", "title": "x"}]}),
        ("chat_appendStream", {"chunks": [{"type": "task_update", "title": "x", "status": "pending"}]}),
        ("chat_appendStream", {"chunks": [{"type": "task_update", "id": "t", "status": "pending"}]}),
        ("chat_appendStream", {"chunks": [_task("t", "x", "done")]}),
        ("chat_appendStream", {"chunks": [{**_task("t", "x", "pending"), "output": ["not", "text"]}]}),
        ("chat_appendStream", {"chunks": [{"type": "markdown_text"}]}),
        ("chat_appendStream", {"chunks": "not a list"}),
        ("chat_appendStream", {"chunks": []}),  # neither text nor chunks: nothing to append
        ("chat_stopStream", {"chunks": [_task("t", "", "complete")]}),
        ("chat_startStream", {"chunks": [{"text": "no type"}]}),
        ("chat_startStream", {"task_display_mode": "carousel"}),
    ],
)
def test_malformed_chunks_are_refused_with_invalid_arguments_and_change_nothing(
    served: Any, call: str, arguments: dict[str, Any]
) -> None:
    server, client, page = served
    ts = server.playground.workspace.post_as(ALICE, "hello", None)["ts"]
    opened = client.chat_startStream(
        channel=CHANNEL_ID,
        thread_ts=ts,
        recipient_team_id="T0PLAYGND",
        recipient_user_id=ALICE,
        markdown_text="Hi",
        chunks=[_task("t", "A task", "pending")],
    )
    where = (
        {"thread_ts": ts, "recipient_team_id": "T0PLAYGND", "recipient_user_id": ALICE}
        if call == "chat_startStream"
        else {"ts": opened["ts"]}
    )
    before = page.state()["messages"]
    with pytest.raises(SlackApiError) as refused:
        getattr(client, call)(channel=CHANNEL_ID, **where, **arguments)
    assert refused.value.response["error"] == "invalid_arguments"
    after = page.state()["messages"]
    assert after == before and after[-1]["streaming"] is True
    assert after[-1]["tasks"] == [{"id": "t", "title": "A task", "status": "pending"}]


def test_the_page_api_refuses_other_sites_and_says_why(served: Any) -> None:
    server, _, page = served
    body = {"user": ALICE, "text": "write a note"}
    status, answer = page.request("POST", "play/mention", body, headers={"X-Playground": ""})
    assert status == 403 and "X-Playground" in answer["error"]
    status, answer = page.request("POST", "play/mention", body, headers={"Host": "evil.example:80"})
    assert status == 421 and "127.0.0.1" in answer["error"]
    status, _ = page.request("GET", "play/state", headers={"Host": "evil.example"})
    assert status == 421
    assert server.playground.workspace.messages == []  # nothing was posted


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("play/mention", {"user": ALICE, "text": "   "}, "write something"),
        ("play/mention", {"user": "U0NOBODY", "text": "hi"}, "no such user"),
        ("play/mention", {"user": ALICE, "text": "hi", "thread_ts": 5}, "thread_ts"),
        ("play/mention", {"user": ALICE, "text": "hi", "channel": "C0NOPE"}, "no such channel"),
        ("play/mention", {"user": ALICE, "text": "hi", "channel": ["C0OPS"]}, "no such channel"),
        (
            "play/action",
            {"user": ALICE, "action_id": "approve", "block_id": "b", "message_ts": "1.0"},
            "gone",
        ),
        ("play/submit", {"user": ALICE, "view_id": "V0NOPE", "values": {}}, "no longer open"),
        ("play/mention", [1, 2], "JSON object"),
    ],
)
def test_bad_page_requests_get_a_clear_error_and_change_nothing(
    served: Any, path: str, body: Any, says: str
) -> None:
    server, _, page = served
    status, answer = page.request("POST", path, body)
    assert status == 400 and says in answer["error"] and answer["ok"] is False
    assert server.playground.workspace.messages == [] and server.playground.workspace.version == 0


def test_a_mention_the_bot_cannot_hear_is_posted_and_kept_for_slacks_retries(served: Any) -> None:
    server, _, page = served
    status, answer = page.request("POST", "play/mention", {"user": ALICE, "text": "hello"})
    # tests/playground/test_playground_delivery.py: the rest
    assert status == 200 and answer["delivered"] is False
    assert [m["text"] for m in page.state()["messages"]] == [f"<@{BOT_USER_ID}> hello"]
    assert [k["reason"] for k in page.state()["delivery"]["kept"]] == ["connection_failed"]


def test_the_page_is_served_with_a_strict_content_security_policy(served: Any) -> None:
    _, _, page = served
    port = int(page.url.rsplit(":", 1)[1].strip("/"))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/")
    answer = conn.getresponse()
    html = answer.read().decode()
    assert answer.status == 200 and answer.getheader("Content-Type", "").startswith("text/html")
    assert "default-src 'self'" in (answer.getheader("Content-Security-Policy") or "")
    assert '<script type="module" src="/static/js/main.js">' in html and "/static/style.css" in html
    conn.request("GET", "/static/style.css")
    reply = conn.getresponse()
    assert reply.status == 200 and reply.read()


def test_every_module_the_page_imports_is_served_as_javascript_and_nothing_else_is(served: Any) -> None:
    """The page is ES modules: one that is missing, or served as another type, and nothing runs."""
    _, _, page = served
    port = int(page.url.rsplit(":", 1)[1].strip("/"))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    seen: set[str] = set()
    pending = ["main.js"]
    while pending:
        name = pending.pop()
        seen.add(name)
        conn.request("GET", f"/static/js/{name}")
        reply = conn.getresponse()
        source = reply.read().decode()
        assert reply.status == 200, name
        assert reply.getheader("Content-Type") == "text/javascript; charset=utf-8", name
        imported = re.findall(r"^import \{[^}]*\} from '\./([a-z]+\.js)';$", source, re.MULTILINE)
        assert len(imported) == source.count("\nimport "), name  # every import is a sibling module
        pending += [m for m in imported if m not in seen]
    on_disk = {p.name for p in (Path(server_module.__file__).parent / "static" / "js").iterdir()}
    assert seen == on_disk  # no module left behind that nothing loads
    for path in (
        "/static/js/nope.js",
        "/static/js/../server.py",
        "/static/js/%2e%2e/server.py",
        "/static/js/main.js/",
        "/static/js/Main.js",
        "/static/app.js",
        "/static/js/",
    ):
        conn.request("GET", path)
        reply = conn.getresponse()
        assert reply.status == 404 and b"import" not in reply.read(), path


def test_the_event_stream_sends_the_version_now_and_after_each_change(served: Any) -> None:
    server, _, page = served
    port = int(page.url.rsplit(":", 1)[1].strip("/"))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/play/events")
    stream = conn.getresponse()
    assert stream.getheader("Content-Type") == "text/event-stream"
    assert stream.readline() == b"data: 0\n" and stream.readline() == b"\n"
    server.playground.workspace.post_as(ALICE, "hello", None)
    assert stream.readline() == b"data: 1\n"
    conn.close()


def test_the_demo_model_answers_on_the_playground_only_when_it_is_on(served: Any) -> None:
    server, _, page = served
    request = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    status, answer = page.request("POST", "model/v1/messages", request)
    assert status == 200 and answer["type"] == "message"
    status, answer = page.request("POST", "model/v1/messages", {"messages": []})
    assert status == 400 and answer["type"] == "error"
    server.playground.demo = False
    status, _ = page.request("POST", "model/v1/messages", request)
    assert status == 404
    assert json.dumps(page.state()["model"]) == json.dumps({"demo": False, "label": "demo"})


def test_each_channel_says_its_profile_the_tools_it_offers_and_who_may_ask_there(served: Any) -> None:
    _, _, page = served
    status, body = page.request("GET", "play/channels")
    assert status == 200
    channels = {c["name"]: c for c in body["channels"]}
    assert list(channels) == ["playground", "ops"]
    ops, play = channels["ops"], channels["playground"]
    assert (ops["id"], ops["profile"]) == (OPS_CHANNEL_ID, "ops")
    assert ops["header"] == "# profile: ops (channel C0OPS is in profiles[ops].channels)"
    assert play["header"].startswith("# profile: playground (channel C0PLAYGND")
    tiers = {name: {t["name"]: t["tier"] for t in c["tools"]} for name, c in channels.items()}
    assert "delete_file" in tiers["ops"] and "delete_file" not in tiers["playground"]
    assert (tiers["playground"]["write_file"], tiers["ops"]["write_file"]) == ("ask", "allow")
    assert (
        next(t for t in ops["tools"] if t["name"] == "write_file")["why"]
        == "profiles[ops].policy.tools.write_file"
    )
    assert ops["restricted"] and not play["restricted"]
    assert ops["notes"][CAROL].startswith("may not ask here") and "may not" not in ops["notes"][BOB]
    assert play["notes"] == {ALICE: "approver", BOB: "approver", CAROL: "not an approver"}
    assert ops["budgets"]["per_channel_daily_tokens"] > 0 and play["budgets"]["per_channel_daily_tokens"] == 0
    status, _ = page.request("GET", "play/channels", headers={"Host": "evil.example"})
    assert status == 421  # the page's own endpoint: loopback names only


def test_what_the_page_says_of_a_channel_names_servers_never_their_secrets(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        """
[[mcp.servers]]
name = "tickets"
command = "tickets-server"
args = ["--token", "arg-secret-1"]
env = { TICKETS_TOKEN = "env-secret-2", OTHER = "${TICKETS_KEY}" }
[[mcp.servers]]
name = "wiki"
url = "https://wiki.example/mcp"
headers = { Authorization = "Bearer header-secret-3" }
[[profiles]]
name = "ops"
channels = ["C0OPS"]
[profiles.tools]
mcp = ["tickets"]
"""
    )
    tools = tmp_path / "tools"
    tools.mkdir()
    for program in ("tickets-server", "bwrap"):  # the sandbox a stdio server runs in, found on PATH too
        (tools / program).write_text("#!/bin/sh\n")
        (tools / program).chmod(0o755)
    loaded = load_config(config, env={"TICKETS_KEY": "var-secret-4"})
    described = describe(loaded, CHANNELS, PEOPLE, environ={"TICKETS_KEY": "k", "PATH": str(tools)})
    shown = json.dumps(described)
    assert described[OPS_CHANNEL_ID]["elsewhere"] == ["MCP server tickets"]
    assert described[CHANNEL_ID]["elsewhere"] == ["MCP server tickets", "MCP server wiki"]
    assert described[CHANNEL_ID]["down"] == []
    for secret in (
        "arg-secret-1",
        "env-secret-2",
        "header-secret-3",
        "var-secret-4",
        "tickets-server",
        "wiki.example",
    ):
        assert secret not in shown
    # Where its command is not there, the server is shown as down, and why, still without it.
    sandbox_only = tmp_path / "empty"
    sandbox_only.mkdir()
    (sandbox_only / "bwrap").symlink_to(tools / "bwrap")
    elsewhere = {"TICKETS_KEY": "k", "PATH": str(sandbox_only)}
    described = describe(loaded, CHANNELS, PEOPLE, environ=elsewhere)
    assert described[CHANNEL_ID]["elsewhere"] == ["MCP server wiki"]
    assert described[OPS_CHANNEL_ID]["elsewhere"] == []
    (down,) = described[OPS_CHANNEL_ID]["down"]
    assert down == {
        "name": "MCP server tickets",
        "why": "its command is not on the PATH it is given: install it, or set command to its absolute path, "
        "or give the server a PATH in its env",
    }
    assert described[CHANNEL_ID]["down"] == [down]
    assert "tickets-server" not in json.dumps(described) and "empty" not in json.dumps(described)
    # Without bubblewrap no stdio server starts (the worker goes on without it): down, and why.
    (tools / "bwrap").unlink()
    described = describe(loaded, CHANNELS, PEOPLE, environ={"TICKETS_KEY": "k", "PATH": str(tools)})
    assert described[OPS_CHANNEL_ID]["down"] == [{"name": "MCP server tickets", "why": texts.SANDBOX_MISSING}]
    assert described[CHANNEL_ID]["elsewhere"] == ["MCP server wiki"]


@pytest.mark.filterwarnings("ignore:The top-level `text` argument is missing")
def test_a_thread_lives_in_its_channel_and_the_page_says_which(served: Any) -> None:
    server, client, page = served
    workspace = server.playground.workspace
    ops = workspace.post_as(BOB, f"<@{BOT_USER_ID}> delete a file", None, OPS_CHANNEL_ID)["ts"]
    here = workspace.post_as(BOB, "hello", None)["ts"]
    reply = client.chat_postMessage(channel=OPS_CHANNEL_ID, thread_ts=ops, text="on it")
    assert reply["channel"] == OPS_CHANNEL_ID
    client.chat_postEphemeral(channel=OPS_CHANNEL_ID, user=CAROL, thread_ts=ops, text="not you")
    with pytest.raises(SlackApiError, match="thread_not_found"):
        client.conversations_replies(channel=CHANNEL_ID, ts=ops)  # not a message of #playground
    with pytest.raises(SlackApiError, match="message_not_found"):
        client.chat_getPermalink(channel=OPS_CHANNEL_ID, message_ts=here)
    link = client.chat_getPermalink(channel=OPS_CHANNEL_ID, message_ts=reply["ts"])["permalink"]
    assert f"/archives/{OPS_CHANNEL_ID}/" in link and PERMALINK.fullmatch(link)
    state = page.state()
    assert [c["id"] for c in state["channels"]] == [CHANNEL_ID, OPS_CHANNEL_ID]
    assert [(m["channel"], m["text"]) for m in state["messages"]] == [
        (OPS_CHANNEL_ID, f"<@{BOT_USER_ID}> delete a file"),
        (CHANNEL_ID, "hello"),
        (OPS_CHANNEL_ID, "on it"),
    ]
    assert [(e["channel"], e["user"]) for e in state["ephemerals"]] == [(OPS_CHANNEL_ID, CAROL)]
    assert workspace.channel_of(reply["ts"]).name == "ops"  # type: ignore[union-attr]
