"""The playground end to end: `python -m launch.local` with no Slack settings and no API key.

The real bot, worker and Redis behind the playground's own Slack and its offline demo model, driven
through the page's API exactly as the page's JavaScript drives it (the browser tests drive the page
itself). One playground serves the module; every test starts its own thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.playground_support import ALICE, BOB, CAROL, Page, Running, playground

pytestmark = pytest.mark.e2e

FOOTER = "That took"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("playground-workspace")


@pytest.fixture(scope="module")
def running(
    redis_server: Any, workspace: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    url = redis_server.url.rsplit("/", 1)[0] + "/14"
    with playground(url, workspace, cwd=tmp_path_factory.mktemp("playground-cwd")) as started:
        yield started


@pytest.fixture
def page(running: Running) -> Page:
    return Page(running.url)


def card_of(page: Page, ts: str) -> Any:
    """The thread's approval card, once it is there."""
    return page.wait(lambda s: next((m for m in page.thread(ts, s) if _has(m, "approve")), None))


def _has(message: dict[str, Any], action_id: str) -> bool:
    return any(
        e.get("action_id") == action_id for b in message.get("blocks") or [] for e in b.get("elements") or []
    )


def test_a_first_approval_from_mention_to_answer(page: Page, running: Running, workspace: Path) -> None:
    assert page.state()["model"]["demo"] is True
    ts = page.mention(ALICE, "write a note about today's plan")
    card = card_of(page, ts)
    assert "write_file" in card["text"] and "notes.md" in card["text"]
    mention = page.thread(ts)[0]
    assert [r["name"] for r in mention["reactions"]] == ["eyes"]
    summary = page.wait_text(ts, "Turn 1")
    assert "get_time" in summary["text"] and "list_files" in summary["text"]
    assert not (workspace / "notes.md").exists()  # nothing runs before its approval

    page.click(CAROL, card, "approve")  # Carol is not an approver
    refused = page.wait(lambda s: [e for e in s["ephemerals"] if e["user"] == CAROL and e["thread_ts"] == ts])
    assert "may decide" in refused[0]["text"]
    assert _has(next(m for m in page.thread(ts) if m["ts"] == card["ts"]), "approve")  # unchanged

    page.click(ALICE, card, "approve")
    answer = page.wait_text(ts, FOOTER)
    assert "notes.md" in answer["text"] and "offline demo model" in answer["text"]
    decided = next(m for m in page.thread(ts) if m["ts"] == card["ts"])
    assert not _has(decided, "approve") and "Approved by" in decided["text"] and decided["edited"]
    assert "write a note about today" in (workspace / "notes.md").read_text()


def test_decline_with_a_reason_through_the_modal(page: Page, workspace: Path) -> None:
    before = sorted(p.name for p in workspace.iterdir())
    ts = page.mention(BOB, "write a note for the standup")
    card = card_of(page, ts)
    page.click(BOB, card, "decline_with_reason")
    modal = page.wait(lambda s: next((v for v in s["views"] if v["user"] == BOB), None))
    reason = next(b for b in modal["view"]["blocks"] if b["type"] == "input")
    typed = {reason["block_id"]: {reason["element"]["action_id"]: "not before the standup"}}
    assert page.post("play/submit", {"user": BOB, "view_id": modal["id"], "values": typed}) == {"ok": True}

    answer = page.wait_text(ts, FOOTER)
    assert "did not write" in answer["text"] and "not before the standup" in answer["text"]
    decided = next(m for m in page.thread(ts) if m["ts"] == card["ts"])
    assert "Declined" in decided["text"] and not _has(decided, "approve")
    assert not [v for v in page.state()["views"] if v["user"] == BOB]
    assert sorted(p.name for p in workspace.iterdir()) == before  # nothing was written


def test_an_edit_the_policy_denies_is_refused_in_the_modal_then_a_good_one_runs(
    page: Page, workspace: Path
) -> None:
    ts = page.mention(ALICE, "write a note about the release")
    card = card_of(page, ts)
    page.click(ALICE, card, "edit")
    modal = page.wait(lambda s: next((v for v in s["views"] if v["user"] == ALICE), None))
    inputs = {
        b["block_id"]: b["element"]["action_id"] for b in modal["view"]["blocks"] if b["type"] == "input"
    }
    assert set(inputs) >= {"path", "content"}

    def submit(path: str) -> tuple[int, Any]:
        values = {"path": {inputs["path"]: path}, "content": {inputs["content"]: "edited by a reviewer"}}
        return page.request("POST", "play/submit", {"user": ALICE, "view_id": modal["id"], "values": values})

    status, refused = submit("secrets/leak.txt")
    assert status == 200 and refused["ok"] is False and "path" in refused["errors"]
    still = page.state()["views"]
    assert [v["id"] for v in still if v["user"] == ALICE] == [modal["id"]] and still[0]["errors"]
    assert not (workspace / "secrets").exists()

    status, accepted = submit("release.md")
    assert (status, accepted) == (200, {"ok": True})
    answer = page.wait_text(ts, FOOTER)
    assert (workspace / "release.md").read_text() == "edited by a reviewer"
    # The demo model follows the edit: it reads back the file that was written, not the one it asked for.
    assert "I wrote `release.md`. Reading it back" in answer["text"]
    assert "edited by a reviewer" in answer["text"] and "notes.md" not in answer["text"]
    decided = next(m for m in page.thread(ts) if m["ts"] == card["ts"])
    assert "with edits" in decided["text"]


def test_a_valve_and_a_deny_show_in_the_thread(page: Page, workspace: Path) -> None:
    looping = page.mention(CAROL, "list the files forever")
    stopped = page.wait_text(looping, "for no progress")
    assert "for no progress" in stopped["text"]

    secret = page.mention(CAROL, "write my secret to secrets/token.txt")
    answer = page.wait_text(secret, FOOTER)
    assert "policy refused" in answer["text"].lower()
    assert not any(_has(m, "approve") for m in page.thread(secret))  # a deny never asks
    assert not (workspace / "secrets").exists()


def test_a_long_report_shows_ten_rows_and_comes_whole_in_a_file_named_by_its_heading(page: Page) -> None:
    """Seen: a report put 226 table rows in the thread, then a file named by a hash."""
    ts = page.mention(ALICE, "write a long report on the folder")
    answer = page.wait_text(ts, FOOTER)
    assert "390 more rows: the whole table is in the file below" in str(answer["blocks"])
    assert "check 10 of" in str(answer["blocks"]) and "check 11 of" not in str(answer["blocks"])
    shared = page.wait(lambda s: [f for m in page.thread(ts, s) for f in m["files"]])
    assert shared[0]["title"] == "The whole answer" and "All 400 checks passed." in shared[0]["text"]
    assert shared[0]["name"].startswith("a-long-report-")
    assert "| 400 | check 400 of the workspace | fine |" in shared[0]["text"]


def test_a_mention_inside_the_thread_continues_the_conversation(page: Page) -> None:
    ts = page.mention(BOB, "list the files forever")
    page.wait_text(ts, "for no progress")
    again = page.mention(BOB, "now write a note", thread_ts=ts)
    card = card_of(page, ts)
    assert card["thread_ts"] == ts and again != ts
    assert sum(FOOTER in m["text"] for m in page.thread(ts)) == 1  # the first run's stop
    page.click(BOB, card, "decline")
    page.wait(lambda s: sum(FOOTER in m["text"] for m in page.thread(ts, s)) == 2)


def test_the_model_the_workers_are_given_streams_the_same_reply_it_answers_whole(running: Running) -> None:
    """`ANTHROPIC_BASE_URL` of the started playground: the worker's streamed call gets what create() gets."""
    body: dict[str, Any] = {
        "model": "claude-demo",
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": "write a note about streaming"}],
        "tools": [
            {"name": name, "input_schema": {"type": "object"}}
            for name in ("get_time", "list_files", "write_file", "read_file")
        ],
    }
    with anthropic.Anthropic(api_key="demo", base_url=running.url + "model", max_retries=0) as client:
        whole = client.messages.create(**body)
        with client.messages.stream(**body) as stream:
            pieces = [event.text for event in stream if event.type == "text"]
            streamed = stream.get_final_message()
    assert streamed.model_dump() == whole.model_dump()
    assert [b.name for b in streamed.content if b.type == "tool_use"] == ["get_time", "list_files"]
    assert len(pieces) > 1 and "".join(pieces) == streamed.content[0].text  # word by word


def test_after_a_restart_a_mention_past_the_bound_is_told_why_not_met_with_silence(
    redis_server: Any, tmp_path: Path
) -> None:
    """Issue 23: a restart against a Redis that kept an earlier start's runs (REDIS_URL given). Alice
    still has her five runs, and was told so in a thread less than a minute ago (before the
    restart): her next mention got no reply at all. It is told to her now, in a reply only she sees."""
    import redis

    from playground.slack import TEAM_ID
    from store.keys import Keys

    url = redis_server.url.rsplit("/", 1)[0] + "/13"
    client = redis.Redis.from_url(url)
    client.flushdb()
    runs = {f"{'0' * 31}{i}": time.time() - 30 for i in range(5)}
    client.zadd(Keys.user_runs(TEAM_ID, ALICE), runs)
    client.expire(Keys.user_runs(TEAM_ID, ALICE), 3600)
    client.set(Keys.busy_notice(TEAM_ID, ALICE), "1", ex=60)  # told in the earlier start's thread
    client.close()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    with playground(url, workspace, cwd=tmp_path) as started:
        assert "database 13: carried over from earlier starts" in started.output()
        page = Page(started.url)
        ts = page.mention(ALICE, "write a note about the restart")
        told = page.wait(
            lambda s: [e for e in s["ephemerals"] if e["user"] == ALICE and e["thread_ts"] == ts]
        )
        assert "You already have 5 requests going" in told[0]["text"]
        assert page.thread(ts)[1:] == []  # the thread itself was told within the minute
