"""A server that asks a person, end to end: the real bot, a real `python -m workers`, real Redis,
and a real MCP server (`tests/fakes/mcp_asking_server.py`, the `mcp` package's own server API)
whose tools answer their first call with an input request (MCP 2026-07-28 `input_required`).

The run parks on the question; only the requester is asked (a message only they see, a modal for
a form, a link for a URL); their answer resumes the call on the worker, once, with the server's
state. The server logs every round it receives, so "reached the server once, with these values"
is read from its side. Values never show in a log, the audit or the run's record.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.e2e.test_faults import posts, wait_text
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.mcp_support import require_bwrap
from tests.stack import ROOT, Stack, wait_until

pytestmark = pytest.mark.e2e

SERVER = Path(__file__).resolve().parents[1] / "fakes" / "mcp_asking_server.py"
SECRET_TITLE = "Quarterly planning zq7"  # a value typed in the form: it must never reach a log
FOOTER_1 = "That took 1 turns of tool calls across 2 model requests."


@pytest.fixture
def rounds_log(tmp_path: Path) -> Path:
    (tmp_path / "server").mkdir()
    return tmp_path / "server" / "rounds.jsonl"


@pytest.fixture
def stack(redis_url: str, tmp_path: Path, rounds_log: Path) -> Iterator[Stack]:
    require_bwrap()
    config = (
        f'[[mcp.servers]]\nname = "rooms"\ncommand = {json.dumps(sys.executable)}\n'
        f'args = [{json.dumps(str(SERVER))}, "stdio"]\n'
        f"env = {{ MCP_CALL_LOG = {json.dumps(str(rounds_log))} }}\n"
        f"writable = [{json.dumps(str(rounds_log.parent))}]\ntimeout_seconds = 20\n"
        '[policy]\ndefault = "allow"\n[approvals]\napprovers = ["UBEN"]\n'
        '[[profiles]]\nname = "hurried"\nchannels = ["C54"]\n'
        "[profiles.approvals]\nexpire_after_minutes = 0.05\n"
    )
    yield from running(redis_url, tmp_path, config)


def running(
    redis_url: str, tmp_path: Path, config: str, env: dict[str, str] | None = None
) -> Iterator[Stack]:
    """A bot and a worker with `config` (and `env`), on loopback Slack and model stand-ins, stopped after."""
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        stack = Stack(redis_url, slack, model, tmp_path, config=config, extra_env=dict(env or {}))
        try:
            stack.start_bot()
            stack.start_worker()
            yield stack
        finally:
            stack.stop()


def rounds(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def prompt_for(stack: Stack, user: str) -> dict[str, Any]:
    """The ephemeral prompt `user` was shown, as a message a test can click."""
    found = wait_until(lambda: next((e for e in stack.slack.ephemerals if e["user"] == user), None), 30)
    return {**found, "ts": found.get("thread_ts") or "1.1", "channel": found["channel"]}


def buttons(message: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["action_id"]: e for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]}


def submit(stack: Stack, view: dict[str, Any], state: dict[str, Any], user: str = "UANN") -> tuple[int, str]:
    from tests.fakes.signing import action_body
    from tests.stack import interaction

    payload = {
        **interaction("view_submission", user),
        "view": {**view, "id": "V1", "state": {"values": state}},
    }
    return stack.post(action_body(payload), "application/x-www-form-urlencoded")


def form_state(**values: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name == "floor":
            out[name] = {"value": {"type": "static_select", "selected_option": {"value": value}}}
        elif name == "lunch":
            out[name] = {"value": {"type": "radio_buttons", "selected_option": {"value": value}}}
        elif name == "people":
            out[name] = {"value": {"type": "number_input", "value": value}}
        else:
            out[name] = {"value": {"type": "plain_text_input", "value": value}}
    return out


def start(stack: Stack, tool: str, args: dict[str, Any], answer: str, channel: str) -> str:
    stack.model.script(reply(tool_use(tool, args)), reply(text(answer)))
    _, ts, _ = stack.mention("book it", channel=channel, user="UANN")
    return ts


def test_a_form_is_answered_by_the_requester_in_a_modal_and_reaches_the_server_once(
    stack: Stack, rounds_log: Path
) -> None:
    ts = start(stack, "rooms__book_room", {"room": "4B"}, "Booked.", "C51")
    prompt = prompt_for(stack, "UANN")
    assert "rooms" in prompt["text"] and set(buttons(prompt)) == {"provide_input", "decline_input"}
    note = wait_text(stack, "C51", ts, "asked the requester something")
    assert "provide_input" in buttons(note)  # the prompt goes when Slack reloads: the note keeps it
    assert len(rounds(rounds_log)) == 1  # asked once; the run is parked, no worker waits
    # Someone else cannot answer, nor open the form.
    assert stack.click(note, "provide_input", user="UBEN") == 200
    wait_until(lambda: any(e["user"] == "UBEN" and "Only" in e["text"] for e in stack.slack.ephemerals))
    assert stack.slack.views == []
    assert stack.click(prompt, "provide_input", user="UANN") == 200
    opened = wait_until(lambda: stack.slack.views, 30)[-1]["view"]
    assert opened["callback_id"] == "mcp_input"
    blocks = {b.get("block_id") for b in opened["blocks"] if b["type"] == "input"}
    assert blocks == {"title", "people", "contact", "floor", "lunch", "day"}
    # Checked against the schema inside the modal: nothing is sent while it is wrong.
    status, body = submit(stack, opened, form_state(title="Q", people="forty", contact="nope"))
    assert status == 200 and json.loads(body)["response_action"] == "errors"
    assert set(json.loads(body)["errors"]) == {"title", "people", "contact"}
    good = form_state(title=SECRET_TITLE, people="5", contact="ann@example.com", floor="2", lunch="true")
    status, body = submit(stack, opened, good)
    assert status == 200 and "errors" not in body
    wait_text(stack, "C51", ts, FOOTER_1)
    final = rounds(rounds_log)
    assert len(final) == 2 and final[1]["state"] == "booking:4B"
    assert final[1]["answers"]["booking"] == {
        "action": "accept",
        "content": {
            "title": SECRET_TITLE,
            "people": 5,
            "contact": "ann@example.com",
            "floor": "2",
            "lunch": True,
        },
    }
    wait_until(
        lambda: any(
            "answered what" in m["text"] or "answered" in str(m["blocks"]) for m in posts(stack, "C51", ts)
        )
    )
    # A second submission changes nothing: the question is no longer open.
    assert submit(stack, opened, good)[0] == 200
    stack.settled()
    assert len(rounds(rounds_log)) == 2
    # The values reached the server only: not the logs, the audit, the run's record or Slack.
    conn = redis.Redis.from_url(stack.redis_url)
    stored = b"".join(conn.get(k) or b"" for k in conn.keys("harness:run:*"))
    audit = str(conn.xrange("harness:audit"))
    assert SECRET_TITLE.encode() not in stored and SECRET_TITLE not in audit
    assert "title" in audit  # the audit names the fields answered
    assert not conn.keys("harness:input:*")  # the values were dropped once sent
    for process in stack.processes:
        assert SECRET_TITLE not in process.output()
    assert SECRET_TITLE not in json.dumps(stack.slack.calls[-1].params)  # nothing posted carries it
    assert all(SECRET_TITLE not in str(m) for m in posts(stack, "C51", ts))


def test_a_url_question_shows_its_domain_and_i_have_finished_answers_accept(
    stack: Stack, rounds_log: Path
) -> None:
    ts = start(stack, "rooms__sign_in", {"service": "crm"}, "Signed in.", "C52")
    prompt = prompt_for(stack, "UANN")
    link = buttons(prompt)["open_input_url"]
    assert link["url"] == "https://auth.example.com/authorize?service=crm"
    assert "auth.example.com" in str(prompt["blocks"])
    note = wait_text(stack, "C52", ts, "asked the requester something")
    assert "auth.example.com" not in str(note)  # the address is the requester's alone
    assert stack.click(prompt, "provide_input", user="UANN") == 200
    wait_text(stack, "C52", ts, "Signed in.")
    assert [r["answers"].get("login", {}).get("action") for r in rounds(rounds_log)] == [None, "accept"]


def test_a_decline_reaches_the_server_as_a_decline(stack: Stack, rounds_log: Path) -> None:
    ts = start(stack, "rooms__book_room", {"room": "9"}, "Not booked.", "C53")
    prompt = prompt_for(stack, "UANN")
    assert stack.click(prompt, "decline_input", user="UANN") == 200
    wait_text(stack, "C53", ts, "Not booked.")
    assert rounds(rounds_log)[-1]["answers"]["booking"] == {"action": "decline"}
    tool_results = [
        b
        for m in stack.model.requests[-1]["messages"]
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    assert tool_results[-1]["content"] == "Room 9 was not booked: the person chose decline."


def test_nobody_answering_in_time_tells_the_server_cancel(stack: Stack, rounds_log: Path) -> None:
    ts = start(stack, "rooms__book_room", {"room": "7"}, "Nobody answered.", "C54")
    wait_text(stack, "C54", ts, "Nobody answered.", timeout=60)
    assert rounds(rounds_log)[-1]["answers"]["booking"] == {"action": "cancel"}
    wait_until(lambda: any("in time" in str(m["blocks"]) for m in posts(stack, "C54", ts)))


def test_a_secret_is_never_asked_for_in_a_form(stack: Stack, rounds_log: Path) -> None:
    start(stack, "rooms__ask_secret", {}, "No key.", "C55")
    prompt = prompt_for(stack, "UANN")
    assert set(buttons(prompt)) == {"decline_input"}  # nothing to type the secret into
    assert "never typed into Slack" in str(prompt["blocks"])
    forged = {
        **prompt,
        "blocks": [
            {
                "type": "actions",
                "elements": [{**buttons(prompt)["decline_input"], "action_id": "provide_input"}],
            }
        ],
    }
    assert stack.click(forged, "provide_input", user="UANN") == 200
    wait_until(lambda: any("never typed into Slack" in e["text"] for e in stack.slack.ephemerals[1:]))
    assert stack.slack.views == []


def test_a_stop_while_a_question_waits_tells_the_server_cancel_and_the_note_says_stopped(
    stack: Stack, rounds_log: Path
) -> None:
    ts = start(stack, "rooms__book_room", {"room": "5"}, "never said", "C56")
    prompt = prompt_for(stack, "UANN")
    working = wait_until(lambda: next((m for m in posts(stack, "C56", ts) if "stop" in buttons(m)), None), 30)
    assert stack.click(working, "stop", user="UANN") == 200
    wait_until(lambda: any("stopped" in m["text"].lower() for m in posts(stack, "C56", ts)), 30)
    stack.settled()
    assert [r["answers"].get("booking", {}).get("action") for r in rounds(rounds_log)] == [None, "cancel"]
    assert any("stopped by" in str(m["blocks"]) for m in posts(stack, "C56", ts))  # the note, settled
    assert stack.click(prompt, "provide_input", user="UANN") == 200  # too late: nothing more is sent
    wait_until(lambda: any("no longer open" in e["text"] for e in stack.slack.ephemerals))
    stack.settled()
    assert len(rounds(rounds_log)) == 2 and stack.slack.views == []
    assert len(stack.model.requests) == 1  # the model never saw the server's answer to the cancel


def test_the_terminal_asks_the_question_field_by_field_and_sends_the_answers(tmp_path: Path) -> None:
    require_bwrap()
    log = tmp_path / "server" / "rounds.jsonl"
    log.parent.mkdir()
    config = tmp_path / "harness.toml"
    config.write_text(
        f'[[mcp.servers]]\nname = "rooms"\ncommand = {json.dumps(sys.executable)}\n'
        f'args = [{json.dumps(str(SERVER))}, "stdio"]\nenv = {{ MCP_CALL_LOG = {json.dumps(str(log))} }}\n'
        f'writable = [{json.dumps(str(log.parent))}]\n[policy]\ndefault = "allow"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "HARNESS_", "SLACK_"))}
    with FakeMessagesAPI() as model:
        model.script(reply(tool_use("rooms__book_room", {"room": "3C"})), reply(text("Booked it.")))
        env.update(
            PYTHONPATH=str(ROOT),
            HARNESS_CONFIG=str(config),
            HARNESS_WORKSPACE=str(tmp_path),
            ANTHROPIC_BASE_URL=model.base_url,
            ANTHROPIC_API_KEY="sk-test",
        )
        # Enter to answer; a title; "many" is refused and asked again; an email; the rest skipped.
        stdin = "\nStandup\nmany\n4\nbo@example.com\n\n\n\n"
        done = subprocess.run(
            [sys.executable, "-m", "harness", "book 3C"],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            cwd=tmp_path,
        )
    assert done.returncode == 0, done.stderr
    assert "rooms asks, before rooms__book_room can go on: Who is room 3C for?" in done.stdout
    assert "Enter a whole number." in done.stdout and "Booked it." in done.stdout
    answers = rounds(log)[-1]["answers"]["booking"]
    assert answers == {
        "action": "accept",
        "content": {"title": "Standup", "people": 4, "contact": "bo@example.com"},
    }


# --- a question asked mid-call: server-everything speaks the 2025 protocol (`elicitation/create`) ---

EVERYTHING = ROOT / ".ci" / "node_modules" / ".bin" / "mcp-server-everything"


@pytest.fixture
def everything_stack(redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    require_bwrap()
    if not (os.access(EVERYTHING, os.X_OK) and shutil.which("node")):
        missing = f"@modelcontextprotocol/server-everything is not installed at {EVERYTHING}"
        pytest.skip(f"{missing}: `bash .ci/run` installs it")
    config = (
        f'[[mcp.servers]]\nname = "ev"\ncommand = {json.dumps(str(EVERYTHING))}\nargs = ["stdio"]\n'
        'timeout_seconds = 60\n[policy]\ndefault = "allow"\n'
    )
    yield from running(redis_url, tmp_path, config)


def test_a_question_asked_mid_call_is_answered_by_the_requester_while_the_call_waits(
    everything_stack: Stack,
) -> None:
    stack = everything_stack
    stack.model.script(reply(tool_use("ev__trigger-elicitation-request", {})), reply(text("Thanks, noted.")))
    _, ts, _ = stack.mention("ask me", channel="C61", user="UANN")
    prompt = prompt_for(stack, "UANN")
    note = wait_text(stack, "C61", ts, "asked the requester something")
    assert stack.click(note, "provide_input", user="UBEN") == 200  # not the requester
    wait_until(lambda: any(e["user"] == "UBEN" and "Only" in e["text"] for e in stack.slack.ephemerals))
    assert stack.click(prompt, "provide_input", user="UANN") == 200
    opened = wait_until(lambda: stack.slack.views, 30)[-1]["view"]
    fields = {b["block_id"] for b in opened["blocks"] if b["type"] == "input"}
    assert {
        "name",
        "check",
        "email",
        "integer",
        "untitledSingleSelectEnum",
        "titledMultipleSelectEnum",
    } <= fields
    state = {
        "name": {"value": {"type": "plain_text_input", "value": SECRET_TITLE}},
        "check": {"value": {"type": "radio_buttons", "selected_option": {"value": "true"}}},
        "integer": {"value": {"type": "number_input", "value": "7"}},
    }
    status, body = submit(stack, opened, state)
    assert status == 200 and "errors" not in body, body
    wait_text(stack, "C61", ts, "Thanks, noted.")
    results = [
        b
        for m in stack.model.requests[-1]["messages"]
        for b in (m["content"] if isinstance(m["content"], list) else [])
        if b.get("type") == "tool_result"
    ]
    said = json.dumps(results[-1]["content"])
    assert f"- Name: {SECRET_TITLE}" in said and "- Agreed to terms: true" in said
    assert submit(stack, opened, state)[0] == 200  # a second answer changes nothing
    wait_until(lambda: any("no longer open" in e["text"] for e in stack.slack.ephemerals))
    conn = redis.Redis.from_url(stack.redis_url)
    assert "mid-call question of MCP server ev" in str(conn.xrange("harness:audit"))
    for process in stack.processes:
        assert SECRET_TITLE not in process.output()
