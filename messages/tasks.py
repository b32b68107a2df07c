"""A call as a Slack task: the line a streamed message shows for it (a `task_update` chunk).

A line follows its call to the end: pending when the model asks for it, waiting while a person
decides, approved, in progress while it runs, then complete or error; a call that never runs says
why (declined, nobody decided in time, denied by the policy, the run stopped) and is never drawn
as pending or running.

Slack shows a task's fields as they are sent. The task card block's reference (docs.slack.dev,
"Task card block") gives its title as plain text and its details and output as rich text: none of
them is mrkdwn, so an entity shows as its characters (`&gt;`, never `>`), and `<!channel>` or
`<https://x|label>` are only text there, which can neither ping nor hide an address. So nothing
here is escaped: what the model or a tool wrote is made visible and cut (`messages.text.plain`).

A later update of a task replaces its title and status but adds its details and output to what it
showed (Slack does so, see `tests/fakes/slack_api.py`). A line's details are therefore a list of
sentences, each true from when it is said on ("Approved.", then "Denied by the policy: not run."
when a call approved is denied as it is about to run); `workers.live` sends only those not yet
sent, and the output once.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.policy import Tier
from harness.state import GrantUse, PendingCall, Verdict
from harness.texts import WHY_UNKNOWN_TOOL
from harness.tools.tasks import TaskHandle
from messages import texts
from messages.arguments import args_json
from messages.reasons import stopped_before
from messages.text import plain

TITLE_CHARS = 120
OUTPUT_CHARS = 200
REASON_CHARS = 150  # a decline's reason in a task's details, which Slack keeps under 256 characters
PENDING, IN_PROGRESS, COMPLETE, ERROR = "pending", "in_progress", "complete", "error"


@dataclass(frozen=True)
class TaskLine:
    """What a task shows: its title and status, the sentences of its details, and its output."""

    title: str
    status: str
    details: tuple[str, ...] = ()
    output: str | None = None


def task_title(call: PendingCall) -> str:
    """A call as a task's title: the tool and its arguments on one line, plain text, cut."""
    return plain(" ".join(f"{call.name} {args_json(call)}".split()), TITLE_CHARS)


def task_line(call: PendingCall, *, running: bool = False, waiting: bool = False) -> TaskLine:
    """The line of `call` as it stands: `running`, it is about to run (unless it never will);
    `waiting`, it waits for a person's decision on its card."""
    title = task_title(call)
    said = _decided(call)
    result = call.result
    if result is not None:
        if stopped_before(result.text):
            return TaskLine(title, ERROR, (*said, texts.TASK_STOPPED))
        if (never := _never_runs(call)) is not None:
            return TaskLine(title, ERROR, (*said, never))
        output = plain(" ".join(result.text.split()), OUTPUT_CHARS) or None
        return TaskLine(title, ERROR if result.is_error else COMPLETE, said, output)
    if (never := _never_runs(call)) is not None:
        return TaskLine(title, ERROR, (*said, never))
    if call.waits_for_input and call.asking is not None:  # its server asked a person something
        return TaskLine(
            title, PENDING, (*said, texts.TASK_WAITING_INPUT.format(server=plain(call.asking.server, 40)))
        )
    if call.waits_on_task and call.tasking is not None:  # its server works on it as a task
        return TaskLine(title, IN_PROGRESS, (*said, _waiting_on(call.tasking)))
    if waiting and call.decision is None:
        return TaskLine(title, PENDING, (texts.TASK_WAITING,))
    return TaskLine(title, IN_PROGRESS if running or call.started else PENDING, said)


def _waiting_on(handle: TaskHandle) -> str:
    """The sentence of a call its server works on as a task: the server's status message, cut."""
    server = plain(handle.server, 40)
    if not handle.message:
        return texts.TASK_WAITING_ON_QUIET.format(server=server)
    return texts.TASK_WAITING_ON.format(
        server=server, message=plain(" ".join(handle.message.split()), REASON_CHARS)
    )


def task_update(
    task_id: str, line: TaskLine, shown: TaskLine | None
) -> tuple[dict[str, str] | None, TaskLine]:
    """The `task_update` chunk that takes task `task_id` from `shown` (what its message showed of
    it so far; None: nothing yet) to `line`, and what the message shows after it. The chunk holds
    the title and status, the sentences of the details not shown yet, and the output unless one
    was shown; None when it would change nothing."""
    said = shown.details if shown is not None else ()
    kept = shown.output if shown is not None else None
    new = tuple(sentence for sentence in line.details if sentence not in said)
    output = None if kept else line.output
    after = TaskLine(line.title, line.status, (*said, *new), kept or output)
    if shown is not None and after == shown:
        return None, shown
    chunk = {"type": "task_update", "id": task_id, "title": line.title, "status": line.status}
    if new:
        chunk["details"] = (" " if said else "") + " ".join(new)  # added to what the task shows
    if output:
        chunk["output"] = output
    return chunk, after


def _decided(call: PendingCall) -> tuple[str, ...]:
    """What a person (or a standing grant) decided that let the call run, as its first sentence."""
    decision = call.decision
    if decision is None or decision.verdict is not Verdict.APPROVED:
        return ()
    if decision.grant is GrantUse.USED:
        return (texts.TASK_GRANT_USED,)
    if decision.edited_input is not None:
        return (texts.TASK_APPROVED_EDITED,)
    return (texts.TASK_APPROVED,)


def _never_runs(call: PendingCall) -> str | None:
    """Why `call` does not run, when it never will: denied, declined, or nobody decided in time.
    A tool not offered says so in its result, which is its output."""
    decision = call.decision
    if call.tier is Tier.DENY:
        return None if WHY_UNKNOWN_TOOL in call.why else texts.TASK_DENIED
    if decision is None or decision.verdict is Verdict.APPROVED:
        return None
    if decision.verdict is Verdict.EXPIRED:
        return texts.TASK_EXPIRED
    if decision.reason:
        reason = plain(" ".join(decision.reason.split()), REASON_CHARS)
        return texts.TASK_DECLINED_REASON.format(reason=f"“{reason}”")
    return texts.TASK_DECLINED
