"""Approvers computed at the click, in the real bot (`python -m bot`) over HTTP with Slack-signed
clicks, on runs parked in a real Redis (no worker: what a click records is read from the park).

A permitted clicker's approval is recorded with the callable's answer (in the park and the audit);
a refused one changes nothing but an ephemeral reply and an audit entry of its own; a callable that
raises, hangs or cannot say fails closed; declines never ask it; grants are refused for its tools;
Approve all asks it of each call; an edit asks it of the edited arguments; and the bot does not
start with a callable it cannot import.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from harness.policy import PathArgs, Tier
from harness.state import PendingCall, Status, new_run
from messages import texts
from runtime.queue import make_queue
from store import RunRecord, RunStatus, new_run_id, pack
from store.keys import Keys
from tests.fakes.messages_api import FakeMessagesAPI
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import ROOT, RedisServer, Stack, wait_until

pytestmark = pytest.mark.e2e

DB = 12
FAKES = "tests.fakes.approver_checks"
CONFIG = f"""
[approvals]
approvers = ["UALICE", "UANN", "UBEN"]
grant_minutes = 30
approvers_from_timeout_seconds = 0.5
[approvals.approvers_from_tools]
"ann_*" = "{FAKES}:only_ann"
"unsure_*" = "{FAKES}:not_sure"
"raise_*" = "{FAKES}:raises"
"hang_*" = "{FAKES}:stuck"
"docs_*" = "{FAKES}:under_docs"
"edit_*" = "{FAKES}:edited_only"
[limits]
max_runs_per_user = 1000
max_runs_per_channel = 1000
"""
PATHS = PathArgs(("path",), ("content",))
_threads = itertools.count(1)


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    url = redis_server.url.rsplit("/", 1)[0] + f"/{DB}"
    redis.Redis.from_url(url).flushdb()
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        stack = Stack(url, slack, model, Path(tmp_path_factory.mktemp("approvers-from")), config=CONFIG)
        try:
            stack.start_bot()
            yield stack
        finally:
            stack.stop()


@pytest.fixture
def conn(stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(stack.redis_url)
    yield client
    client.close()


def call(tool: str, path: str = "docs/a.md", call_id: str = "toolu_1") -> PendingCall:
    return PendingCall(call_id, tool, {"path": path, "content": "hello"}, Tier.ASK, path_args=PATHS)


def park(conn: redis.Redis, *calls: PendingCall) -> RunRecord:
    """A run of UALICE's in C1, parked on `calls` (park 1), stored as a worker parks it."""
    state = replace(new_run("write"), status=Status.AWAITING_APPROVAL, pending=calls)
    record = RunRecord(
        new_run_id(),
        "T1",
        "C1",
        f"{next(_threads)}.0",
        "UALICE",
        "write",
        status=RunStatus.AWAITING_APPROVAL,
        state=state.to_json(),
        park_id=1,
        expires_at=time.time() + 3600,
    )
    conn.set(Keys.run(record.run_id), pack(record.to_json()))
    fields = {"~expires": repr(time.time() + 3600), "~version": 1}
    for c in calls:
        fields |= {c.id: "", f"~fp:{c.id}": c.fingerprint}
    conn.hset(Keys.approvals(record.run_id, 1), mapping=fields)  # type: ignore[arg-type]
    return record


def card_of(record: RunRecord) -> dict[str, Any]:
    return {"ts": "9.9", "channel": record.channel, "text": "card", "thread_ts": record.thread_ts}


def click(
    stack: Stack, record: RunRecord, the_call: PendingCall, action: str = "approve", user: str = "UANN"
) -> None:
    value = f"{record.run_id}:{the_call.id}:{the_call.fingerprint}"
    status, _ = stack.click_value(card_of(record), action, value, user=user)
    assert status == 200


def decision(conn: redis.Redis, record: RunRecord, call_id: str = "toolu_1") -> dict[str, Any] | None:
    raw = conn.hget(Keys.approvals(record.run_id, 1), call_id)
    return json.loads(raw) if raw else None


def audit(conn: redis.Redis, run_id: str) -> list[dict[str, Any]]:
    entries = [json.loads(fields[b"entry"]) for _, fields in conn.xrange(Keys.audit())]
    return [e for e in entries if e.get("run_id") == run_id]


def told(stack: Stack, user: str, needle: str) -> str:
    """The ephemeral reply to `user` that holds `needle`, once it came."""
    found = wait_until(
        lambda: next(
            (e["text"] for e in stack.slack.ephemerals if e["user"] == user and needle in e["text"]), None
        )
    )
    return str(found)


def jobs(conn: redis.Redis, run_id: str) -> int:
    queue = make_queue(conn)
    return sum(1 for job in queue.get_jobs() if job.args and job.args[0] == run_id)


def test_a_yes_records_the_approval_with_the_answer_in_the_park_and_the_audit(
    stack: Stack, conn: redis.Redis
) -> None:
    the_call = call("ann_write")
    record = park(conn, the_call)
    click(stack, record, the_call, user="UANN")
    stored = decision(conn, record)
    assert stored is not None and stored["verdict"] == "approved" and stored["by"] == "UANN"
    assert stored["approvers_from"] == {
        "function": f"{FAKES}:only_ann",
        "answer": "yes",
        "reason": "UANN may approve ann_write <!channel> <@U999>",  # kept as said; escaped when shown
    }
    [entry] = audit(conn, record.run_id)
    assert entry["verdict"] == "approved" and entry["approvers_from"]["answer"] == "yes"
    assert jobs(conn, record.run_id) == 1  # the job that shows it and resumes the run


def test_a_no_records_nothing_and_tells_the_clicker_why_only_them(stack: Stack, conn: redis.Redis) -> None:
    the_call = call("ann_write")
    record = park(conn, the_call)
    click(stack, record, the_call, user="UBEN")
    text = told(stack, "UBEN", "only UANN may approve ann_write")
    assert f"`{FAKES}:only_ann` says you may not approve this call" in text
    assert decision(conn, record) is None and jobs(conn, record.run_id) == 0  # still parked
    assert conn.get(Keys.run(record.run_id)) is not None
    [entry] = audit(conn, record.run_id)
    assert entry["verdict"] == "approval_refused" and entry["by"] == "UBEN"
    assert entry["approvers_from"]["answer"] == "no" and entry["fingerprint"] == the_call.fingerprint
    click(stack, record, the_call, user="UANN")  # the card stayed open for someone else
    assert wait_until(lambda: decision(conn, record))["by"] == "UANN"


@pytest.mark.parametrize(
    ("tool", "reason"),
    [
        ("raise_write", "it raised KeyError"),
        ("hang_write", "it gave no answer within 0.5 s"),
        ("unsure_write", "the rota could not be read"),
    ],
)
def test_a_callable_that_raises_hangs_or_cannot_say_fails_closed(
    stack: Stack, conn: redis.Redis, tool: str, reason: str
) -> None:
    the_call = call(tool)
    record = park(conn, the_call)
    click(stack, record, the_call, user="UANN")
    text = told(stack, "UANN", reason)
    assert "could not say whether you may approve" in text and "secret-looking" not in text
    assert decision(conn, record) is None and jobs(conn, record.run_id) == 0
    assert audit(conn, record.run_id)[0]["approvers_from"]["answer"] == "unknown"


def test_a_decline_never_asks_the_callable(stack: Stack, conn: redis.Redis) -> None:
    the_call = call("raise_write")
    record = park(conn, the_call)
    click(stack, record, the_call, action="decline", user="UBEN")
    stored = wait_until(lambda: decision(conn, record))
    assert stored["verdict"] == "declined" and "approvers_from" not in stored


def test_a_tool_without_a_callable_is_approved_as_before(stack: Stack, conn: redis.Redis) -> None:
    the_call = call("plain_write")
    record = park(conn, the_call)
    click(stack, record, the_call, user="UBEN")
    stored = wait_until(lambda: decision(conn, record))
    assert stored["verdict"] == "approved" and "approvers_from" not in stored


@pytest.mark.parametrize("action", ["approve_thread", "approve_dir"])
def test_no_grant_for_a_tool_the_callable_decides(stack: Stack, conn: redis.Redis, action: str) -> None:
    the_call = call("ann_write")
    record = park(conn, the_call)
    click(stack, record, the_call, action=action, user="UANN")
    told(stack, "UANN", "a grant would let later calls run without asking it")
    assert decision(conn, record) is None
    assert not list(conn.scan_iter(f"harness:grant:T1:C1:{record.thread_ts}:*"))


def test_approve_all_asks_the_callable_of_each_call(stack: Stack, conn: redis.Redis) -> None:
    inside, outside = call("docs_write", "docs/a.md", "toolu_1"), call("docs_write", "src/b.md", "toolu_2")
    plain = call("plain_write", "x.md", "toolu_3")
    record = park(conn, inside, outside, plain)
    status, _ = stack.click_value(card_of(record), "approve_all", f"{record.run_id}:1", user="UBEN")
    assert status == 200
    text = told(stack, "UBEN", "Not approved (the card stays open for someone else)")
    assert "a path outside docs/" in text
    first, third = decision(conn, record, "toolu_1"), decision(conn, record, "toolu_3")
    assert first is not None and first["approvers_from"]["reason"] == "every path is under docs/"
    assert third is not None and "approvers_from" not in third
    assert decision(conn, record, "toolu_2") is None  # left open
    refused = [e for e in audit(conn, record.run_id) if e["verdict"] == "approval_refused"]
    assert [e["call_id"] for e in refused] == ["toolu_2"]


def test_an_edit_asks_the_callable_of_the_arguments_that_would_run(stack: Stack, conn: redis.Redis) -> None:
    the_call = call("edit_write", "bad.md")
    record = park(conn, the_call)
    view = {
        "type": "modal",
        "callback_id": "edit_call",
        "private_metadata": f"{record.run_id}:{the_call.id}:{the_call.fingerprint}",
    }
    status, body = stack.submit_values(view, {"path": "bad.md", "content": "hello"}, user="UANN")
    assert status == 200 and json.loads(body)["response_action"] == "errors"
    assert "answered no (not that)" in body and decision(conn, record) is None
    status, body = stack.submit_values(view, {"path": "ok.md", "content": "hello"}, user="UANN")
    assert status == 200 and "errors" not in body
    stored = wait_until(lambda: decision(conn, record))
    assert stored["edited_input"]["path"] == "ok.md" and stored["approvers_from"]["reason"] == "an edit"


def test_the_bot_does_not_start_with_a_callable_it_cannot_import(stack: Stack, tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(f'[approvals.approvers_from_tools]\nwrite_file = "{FAKES}:no_such_function"\n')
    done = subprocess.run(
        [sys.executable, "-m", "bot"],
        cwd=ROOT,
        env=stack.env(HARNESS_CONFIG=str(config)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: approvals.approvers_from_tools.write_file = '{FAKES}:no_such_function': "
        f"'{FAKES}' has no function 'no_such_function'"
    )
    assert texts.CHECK_SAID_NO  # the refusals' words live in messages/texts.py
