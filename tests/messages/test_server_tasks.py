"""A call its server works on as a task, as the thread shows it (`messages.server_tasks`, and its
line in the turn's message): the server's status message is its words, shown inert and cut."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from harness.policy import Tier
from harness.state import PendingCall
from harness.tools import ToolResult
from harness.tools.tasks import TaskHandle
from messages import tasks
from messages.server_tasks import task_note, task_settled

HOSTILE = "<!channel> see <https://evil.example|the docs> *now* `x` " + "z" * 500


def call(message: str = "") -> PendingCall:
    handle = TaskHandle("jobs", "t-1", message=message[:300], since=0.0, deadline=3600.0)
    return PendingCall("toolu_1", "jobs__build", {"target": "x"}, Tier.ALLOW, started=True, tasking=handle)


def test_the_note_names_the_server_and_its_status_without_letting_it_ping_or_link() -> None:
    waiting = call(HOSTILE)
    assert waiting.tasking is not None
    note = task_note(tool=waiting.name, handle=waiting.tasking)
    shown = json.dumps(note.blocks)
    assert "*jobs*" in shown and "jobs__build" in shown
    assert "<!channel>" not in shown and "<https://evil.example" not in shown
    assert "&lt;!channel&gt;" in shown
    assert len(note.text) <= 300
    quiet = task_note(tool=waiting.name, handle=call().tasking)  # type: ignore[arg-type]
    assert "as a task." in json.dumps(quiet.blocks)


def test_the_line_of_a_call_on_a_task_is_in_progress_with_the_servers_words_cut() -> None:
    line = tasks.task_line(call(HOSTILE))
    assert line.status == tasks.IN_PROGRESS
    (said,) = line.details
    assert said.startswith("Waiting on jobs: <!channel>")  # a task's details are plain text in Slack
    assert len(said) < 200
    assert tasks.task_line(call()).details == ("Waiting on jobs, which works on it as a task.",)
    done = PendingCall(
        "toolu_1", "jobs__build", {}, Tier.ALLOW, result=ToolResult("ok"), tasking=call().tasking
    )
    assert tasks.task_line(done).status == tasks.COMPLETE


def test_the_settled_note_says_how_the_task_ended() -> None:
    handle = call().tasking
    assert handle is not None
    at = datetime(2026, 12, 5, tzinfo=UTC)
    said = {
        outcome: json.dumps(
            task_settled(tool="jobs__build", handle=handle, outcome=outcome, by="UANN", at=at).blocks
        )
        for outcome in ("finished", "error", "timeout", "stopped")
    }
    assert "finished" in said["finished"] and "ended in error" in said["error"]
    assert "cancel" in said["timeout"] and "<@UANN>" in said["stopped"]
