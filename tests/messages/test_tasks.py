"""A call as a Slack task line (`messages.tasks`): plain text shown as written, and a line that
follows its call to the end (approved, running, done or failed; declined, expired, denied, stopped)."""

from __future__ import annotations

import pytest

from harness import texts as harness_texts
from harness.policy import Tier
from harness.state import Decision, GrantUse, PendingCall, Verdict
from harness.tools import ToolResult
from messages import texts
from messages.tasks import (
    COMPLETE,
    ERROR,
    IN_PROGRESS,
    OUTPUT_CHARS,
    PENDING,
    TITLE_CHARS,
    TaskLine,
    task_line,
    task_title,
    task_update,
)
from messages.text import units

HOSTILE = "a > b & c < d <!channel> <@U0BOSS> <https://evil.example|the docs>"
ENTITIES = ("&gt;", "&lt;", "&amp;")


def call(
    tier: Tier = Tier.ASK,
    *,
    verdict: Verdict | None = None,
    result: ToolResult | None = None,
    started: bool = False,
    why: str = "",
    **decided: object,
) -> PendingCall:
    decision = None if verdict is None else Decision(verdict, by="UANN", **decided)  # type: ignore[arg-type]
    args = {"path": "notes.md", "content": "The task:\n\n> Write a note & <b>bold</b>"}
    return PendingCall("toolu_1", "write_file", args, tier, decision, result, started, why)


def approved(**more: object) -> PendingCall:
    return call(verdict=Verdict.APPROVED, **more)  # type: ignore[arg-type]


def test_a_title_shows_the_arguments_as_written_with_no_entity() -> None:
    title = task_title(call())
    assert title.startswith("write_file ") and "> Write a note & <b>bold</b>" in title
    assert not any(entity in title for entity in ENTITIES)  # Slack shows a title as plain text
    assert "\n" not in title and units(title) <= TITLE_CHARS


def test_text_a_model_or_tool_wrote_is_shown_as_written_in_every_field() -> None:
    ran = task_line(approved(result=ToolResult(HOSTILE)))
    declined = task_line(call(verdict=Verdict.DECLINED, reason=HOSTILE))
    for line in (ran, declined):
        shown = " ".join((line.title, *line.details, line.output or ""))
        assert not any(entity in shown for entity in ENTITIES)
    # In plain text a mention or a link is only its characters: nothing pings, no label hides a link.
    assert ran.output == HOSTILE
    assert HOSTILE in declined.details[0] and declined.status == ERROR
    typed = task_line(approved(result=ToolResult("&gt; as typed")))
    assert typed.output == "&gt; as typed"  # what the tool wrote, not read as an entity either


def test_hidden_characters_are_shown_not_hidden() -> None:
    spoofed = "evil\u202etxt.sh <!chan\u200bnel>"
    line = task_line(approved(result=ToolResult(spoofed)))
    assert line.output == "evil[U+202E]txt.sh <!chan[U+200B]nel>"


def test_long_text_is_cut_to_what_a_task_holds() -> None:
    line = task_line(call(verdict=Verdict.DECLINED, reason="why " * 200, result=ToolResult("x", True)))
    assert units(line.details[0]) <= 256 and line.details[0].endswith("…”")
    ran = task_line(approved(result=ToolResult("out " * 200)))
    assert ran.output is not None and units(ran.output) <= OUTPUT_CHARS
    long_args = PendingCall("toolu_2", "write_file", {"content": "y" * 500}, Tier.ASK)
    assert units(task_title(long_args)) <= TITLE_CHARS and task_title(long_args).endswith("…")


def test_an_allowed_call_is_pending_then_in_progress_then_complete_or_error() -> None:
    allowed = call(Tier.ALLOW)
    assert task_line(allowed) == TaskLine(task_title(allowed), PENDING)
    assert task_line(allowed, running=True).status == IN_PROGRESS
    assert task_line(call(Tier.ALLOW, result=ToolResult("12:00"))).status == COMPLETE
    failed = task_line(call(Tier.ALLOW, result=ToolResult("no such file", True)))
    assert (failed.status, failed.output) == (ERROR, "no such file")


def test_an_asked_call_waits_then_is_approved_runs_and_ends() -> None:
    assert task_line(call(), waiting=True).details == (texts.TASK_WAITING,)
    assert task_line(approved()) == TaskLine(task_title(call()), PENDING, (texts.TASK_APPROVED,))
    assert task_line(approved(), running=True).status == IN_PROGRESS
    done = task_line(approved(result=ToolResult("wrote notes.md")))
    assert (done.status, done.details, done.output) == (COMPLETE, (texts.TASK_APPROVED,), "wrote notes.md")
    failed = task_line(approved(result=ToolResult("disk full", True)))
    assert (failed.status, failed.details, failed.output) == (ERROR, (texts.TASK_APPROVED,), "disk full")
    edited = task_line(approved(edited_input={"path": "b.md"}, result=ToolResult("ok")))
    assert edited.details == (texts.TASK_APPROVED_EDITED,)
    granted = task_line(approved(grant=GrantUse.USED), running=True)
    assert granted.details == (texts.TASK_GRANT_USED,)


@pytest.mark.parametrize(
    ("undone", "sentence"),
    [
        (call(verdict=Verdict.DECLINED), texts.TASK_DECLINED),
        (call(verdict=Verdict.EXPIRED), texts.TASK_EXPIRED),
        (call(Tier.DENY), texts.TASK_DENIED),
    ],
    ids=["declined", "expired", "denied"],
)
def test_a_call_that_never_runs_says_why_and_is_never_drawn_pending_or_running(
    undone: PendingCall, sentence: str
) -> None:
    for line in (task_line(undone), task_line(undone, running=True), task_line(undone, waiting=True)):
        assert (line.status, line.details, line.output) == (ERROR, (sentence,), None)
    answered = task_line(PendingCall(**{**undone.__dict__, "result": ToolResult("Not executed: …", True)}))
    assert (answered.status, answered.details, answered.output) == (ERROR, (sentence,), None)


def test_a_call_approved_then_denied_as_it_was_about_to_run_says_both() -> None:
    denied = approved(tier=Tier.DENY, result=ToolResult("Not executed: forbidden by policy", True))
    line = task_line(denied)
    assert (line.status, line.details) == (ERROR, (texts.TASK_APPROVED, texts.TASK_DENIED))


def test_a_call_left_open_by_a_stop_says_it_did_not_run() -> None:
    note = harness_texts.RESULT_NOT_RUN_STOPPED.format(valve="stopped_by_user")
    waiting = task_line(call(result=ToolResult(note, True)))
    assert (waiting.status, waiting.details, waiting.output) == (ERROR, (texts.TASK_STOPPED,), None)
    line = task_line(approved(result=ToolResult(note, True)))
    assert line.details == (texts.TASK_APPROVED, texts.TASK_STOPPED)


def test_a_tool_not_offered_or_an_outcome_unknown_shows_what_its_result_says() -> None:
    unknown = call(Tier.DENY, why=harness_texts.WHY_UNKNOWN_TOOL, result=ToolResult("no tool 'x' here", True))
    assert (task_line(unknown).status, task_line(unknown).output) == (ERROR, "no tool 'x' here")
    assert task_line(approved(started=True)).status == IN_PROGRESS  # begun by a driver that died


def test_an_update_carries_only_what_the_task_does_not_show_yet() -> None:
    first, shown = task_update("t1", task_line(approved()), None)
    assert first == {
        "type": "task_update",
        "id": "t1",
        "title": task_title(call()),
        "status": PENDING,
        "details": texts.TASK_APPROVED,
    }
    assert task_update("t1", task_line(approved()), shown) == (None, shown)  # nothing new: no update
    running, shown = task_update("t1", task_line(approved(), running=True), shown)
    assert running is not None and (running["status"], "details" in running) == (IN_PROGRESS, False)
    done, shown = task_update("t1", task_line(approved(result=ToolResult("ok"))), shown)
    assert done is not None and (done["status"], done["output"], "details" in done) == (COMPLETE, "ok", False)
    again, _ = task_update("t1", task_line(approved(result=ToolResult("ok"))), shown)
    assert again is None  # the output is shown once: Slack would add it a second time
    denied = approved(tier=Tier.DENY, result=ToolResult("Not executed", True))
    added, after = task_update("t1", task_line(denied), task_line(approved(), running=True))
    assert added is not None and added["details"] == " " + texts.TASK_DENIED  # added to "Approved."
    assert after.details == (texts.TASK_APPROVED, texts.TASK_DENIED)
