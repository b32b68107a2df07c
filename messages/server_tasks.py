"""What the thread shows while a tool's server works on a call as a task (`harness.tools.tasks`).

One note, posted when the run parks on the task and kept current by the poller: which server works
on which call, the server's own status message, and until when the run waits; once the task is
over, the same note says how it ended (finished, ended in error, cancelled at its deadline, or
stopped). The call's line in the turn's message says the same in short (`messages.tasks`).

A status message is the server's words: untrusted, shown as escaped text, cut, never a link or a
mention.
"""

from __future__ import annotations

from datetime import UTC, datetime

from harness.tools.tasks import TaskHandle
from messages.blocks import Message, section
from messages.text import inert, inline, mention, plain, slack_date

MESSAGE_CHARS = 200  # of the server's status message, in the note


def task_note(*, tool: str, handle: TaskHandle) -> Message:
    """The note while the task works: its server, the call, the status message, the deadline."""
    server = f"*{inert(handle.server, 40)}*"
    line = f"⏳ {server} works on {inline(tool, 120)} as a task"
    if handle.message:
        line += f": {inert(' '.join(handle.message.split()), MESSAGE_CHARS)}"
    deadline = datetime.fromtimestamp(handle.deadline, UTC)
    line += f". The run goes on when it ends (cancelled if still working {slack_date(deadline)})."
    status = f"{handle.server} works on {tool} as a task"
    return Message(
        text=plain(f"{status}: {handle.message}" if handle.message else status, 300), blocks=[section(line)]
    )


def task_settled(*, tool: str, handle: TaskHandle, outcome: str, by: str | None, at: datetime) -> Message:
    """The note once the task is over: `outcome` is finished, error, timeout or stopped."""
    server = f"*{inert(handle.server, 40)}*"
    name = inline(tool, 120)
    said = {
        "finished": f"✅ {server} finished its task for {name}",
        "error": f"⚠️ {server}'s task for {name} ended in error",
        "timeout": f"⌛ {server}'s task for {name} outlived its time: the server was told to cancel it",
        "stopped": f"🛑 The run was stopped by {mention(by)} while {server} worked on {name}: "
        "the server was told to cancel its task",
    }[outcome]
    return Message(
        text=plain(f"{handle.server}'s task for {tool}: {outcome}", 300),
        blocks=[section(f"{said} · {slack_date(at)}")],
    )
