"""A run's thread as it happens: the model's words streamed while it writes them, its calls as tasks.

Each model reply, and the turn of tool calls that follows it, gets one streaming message
(`chat.startStream`, `chat.appendStream`, `chat.stopStream`). The reply's text is appended as the
SDK hands it over; each call shows as a Slack task (`task_update` chunks, drawn by
`messages.tasks`), its line following the call to the end: pending when the model asks for it,
waiting while a person decides, in progress while it runs, complete or error once it returned, or
why it never ran (declined, expired, denied, stopped). When the turn is done every line shows its
call's end, and the message settles (`chat.update`, through the outbox) into the turn summary, and
after the last reply into the final answer: the thread keeps what it always kept, and shows it
while it happens.

A stopped stream takes no task update, and Slack keeps what its tasks showed when it stopped. So
a turn that goes on after its message stopped (it parked for a decision, or its driver died) shows
its calls in a new message, and the stopped one, whose lines can no longer follow them, is taken
out of the thread (`Driver.show_turn`).

Slack's limits are kept by pacing: one writer thread per message, and per thread no stream write
(start, append, stop, the settling update) less than `PACE_SECONDS` after the one before. What the
model writes meanwhile is batched into the next write, so the first words go out at once and a
fast model never drives more than one write per `PACE_SECONDS`.

Streaming is a courtesy, never a condition. A workspace that refuses streams (or task chunks) gets
today's messages: the outbox posts the turn summary and the answer instead, and the run stops
trying for the rest of its drive. A stream that breaks midway (Slack errors) stops growing; its
message is then settled with the whole text, so the answer arrives whole, once. Every open stream
is in the store (`store.live`, kept by the driver: `Driver.live_view`), so a driver that dies
midway leaves its messages to the next driver, which stops and deletes those no saved step owes a
settlement to (`Driver.drop_orphans`).
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from harness.signals import CallRunning, LiveEvent, TextWritten, ToolReturned
from harness.state import PendingCall
from messages.streamed import LinkShower
from messages.tasks import TaskLine, task_line, task_update
from messages.text import escape, visible

log = logging.getLogger(__name__)

PACE_SECONDS = 0.305  # per thread, between two stream writes: Slack's 300 ms, and 5 ms for jitter
OPEN_WAIT_SECONDS = 6.0  # how long a seal waits for a message still opening (a courtesy call's timeout)
# Slack errors that mean "not here, not for this run": streams (or task chunks) are not tried again.
_TRANSIENT = {"ratelimited", "rate_limited", "internal_error", "fatal_error", "service_unavailable"}
# Errors that mean the chunks were refused (a workspace without task updates), not the stream.
_CHUNKS_REFUSED = {"invalid_chunks", "invalid_arguments", "unknown_chunk_type"}


def pace_seconds() -> float:
    """The pace of stream writes per thread: `HARNESS_STREAM_PACE_MS` (tests shorten it), else 305 ms."""
    raw = os.environ.get("HARNESS_STREAM_PACE_MS")
    return PACE_SECONDS if not raw else max(0.0, float(raw) / 1000)


class Pacer:
    """When each thread may next be written to: one stream write per `PACE_SECONDS` per thread."""

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = pace_seconds() if seconds is None else seconds
        self._next: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def note(self, channel: str, thread_ts: str) -> None:
        """A write just answered (a paced one, or one that does not wait: a post, a card): the next
        stream write goes no sooner than `seconds` after it. Counted from the answer, not the send,
        so Slack sees the writes that far apart however long each took to arrive."""
        with self._lock:
            now = time.monotonic()
            key = (channel, thread_ts)
            self._next[key] = max(self._next.get(key, now), now + self.seconds)

    def wait(self, channel: str, thread_ts: str) -> None:
        """Take the thread's next slot, waiting until it comes (pacing, not synchronisation)."""
        key = (channel, thread_ts)
        with self._lock:
            now = time.monotonic()
            at = max(now, self._next.get(key, now))
            self._next[key] = at + self.seconds
            if len(self._next) > 4096:  # forget threads long quiet
                self._next = {k: v for k, v in self._next.items() if v > now}
        if at > now:
            time.sleep(at - now)


class LiveLedger(Protocol):
    """Where a run's live messages are written down (the driver's, over `store.live`)."""

    @property
    def tag(self) -> dict[str, Any]:
        """The `metadata` a stream of the run carries once stopped (`messages.metadata`)."""

    def opening(self) -> None:
        """A stream is about to open: promised before `chat.startStream`, or raise (none opens)."""

    def opened(self, ts: str) -> None:
        """The stream opened as `ts` (never raises: the stream goes on regardless)."""


@dataclass
class _Batch:
    text: list[str] = field(default_factory=list)
    tasks: dict[str, TaskLine] = field(default_factory=dict)  # call id -> the latest line it should show

    def __bool__(self) -> bool:
        return bool(self.text or self.tasks)


class LiveMessage:
    """One streaming message and the thread that writes it, paced (see the module docstring)."""

    def __init__(
        self,
        slack: WebClient,
        pacer: Pacer,
        where: tuple[str, str, str, str],
        *,
        tasks: bool,
        ledger: LiveLedger,
        refused: Callable[[str], None],
    ) -> None:
        self.channel, self.thread_ts, self._team, self._user = where
        self.slack = slack
        self.pacer = pacer
        self.tasks_ok = tasks
        self.ts: str | None = None
        self.broken = False  # Slack refused a write: nothing more is sent (the settlement fixes it)
        self._ledger = ledger
        self._refused = refused
        self._pending = _Batch()
        self._shown: dict[str, TaskLine] = {}  # call id -> what its task shows (written by the writer only)
        self._links = LinkShower()  # a link shows its address, as in a posted answer
        self._closing = False
        self._done = False
        self._cond = threading.Condition()
        context = contextvars.copy_context()  # its log lines name the run
        self._thread = threading.Thread(target=context.run, args=(self._work,), name="live", daemon=True)
        self._thread.start()

    def text(self, piece: str) -> None:
        """Append `piece` (escaped Markdown) at the next write."""
        with self._cond:
            if not self._closing and (shown := self._links.feed(piece)):
                self._pending.text.append(shown)
                self._cond.notify()

    def task(self, call_id: str, line: TaskLine) -> None:
        """Show `line` as the task of call `call_id` at the next write; a later line of it wins."""
        if not self.tasks_ok:
            return
        with self._cond:
            if not self._closing:
                self._pending.tasks[call_id] = line
                self._cond.notify()

    def seal(self) -> str | None:
        """No more writes after what is pending; the stream is stopped meanwhile. Its ts, once
        open (waiting for a start still in flight), or None when it never opened."""
        with self._cond:
            if not self._closing and (rest := self._links.feed("", final=True)):
                self._pending.text.append(rest)  # a link still open when it stopped: shown as text
            self._closing = True
            self._cond.notify()
            deadline = time.monotonic() + OPEN_WAIT_SECONDS
            while self.ts is None and not self._done:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    break
            return self.ts

    def join(self) -> None:
        """Wait until the stream is stopped (`seal` first)."""
        self._thread.join(OPEN_WAIT_SECONDS + self.pacer.seconds * 2)

    def _work(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._closing:
                        self._cond.wait()
                if self.ts is None and not self._pending and self._closing:
                    return  # sealed before anything was written: nothing to open or stop
                self.pacer.wait(self.channel, self.thread_ts)
                with self._cond:
                    batch, self._pending = self._pending, _Batch()
                    last = self._closing
                wrote = self._write(batch, last)
                self.pacer.note(self.channel, self.thread_ts)
                if not wrote or last:
                    return
        except Exception:  # a live view is never worth the run
            log.exception("stream in %s/%s failed", self.channel, self.thread_ts)
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def _write(self, batch: _Batch, last: bool) -> bool:
        """One paced write of `batch`: the start, an append, or the stop. False: no more writes."""
        chunks, shown = self._chunks(batch)
        markdown = None if chunks else "".join(batch.text) or None
        if self.ts is None and not self._promised():
            return False
        try:
            if self.ts is None:
                opened = self.slack.chat_startStream(
                    channel=self.channel,
                    thread_ts=self.thread_ts,
                    recipient_team_id=self._team,
                    recipient_user_id=self._user,
                    markdown_text=markdown,
                    chunks=chunks,
                    task_display_mode="timeline" if chunks else None,
                )
                with self._cond:
                    self.ts = str(opened["ts"])
                    self._cond.notify_all()
                self._ledger.opened(self.ts)
                if last:  # opened and done in one batch: the stop still waits its turn
                    self.pacer.note(self.channel, self.thread_ts)
                    self.pacer.wait(self.channel, self.thread_ts)
                    self.slack.chat_stopStream(channel=self.channel, ts=self.ts, metadata=self._ledger.tag)
            elif last:
                self.slack.chat_stopStream(
                    channel=self.channel,
                    ts=self.ts,
                    markdown_text=markdown,
                    chunks=chunks,
                    metadata=self._ledger.tag,  # stopped, it is tagged as every other message of ours
                )
            elif chunks or markdown:
                self.slack.chat_appendStream(
                    channel=self.channel, ts=self.ts, markdown_text=markdown, chunks=chunks
                )
            self._shown.update(shown)
            return True
        except (SlackApiError, OSError) as exc:
            error = _error(exc)
            if shown and self.tasks_ok and error in _CHUNKS_REFUSED:
                # No task chunks here (refused at the start, or at the first tasks of a stream
                # opened with words alone): the words alone, in this stream and the next.
                self.tasks_ok = False
                self._refused("tasks")
                self.pacer.note(self.channel, self.thread_ts)  # a refused write is a write too
                self.pacer.wait(self.channel, self.thread_ts)
                return self._write(_Batch(text=batch.text), last)
            if self.ts is None:
                log.info(
                    "cannot stream into %s/%s (%s): posting instead", self.channel, self.thread_ts, error
                )
                if error not in _TRANSIENT:
                    self._refused("stream")
            else:
                log.warning("stream %s/%s broke off (%s); it is settled whole", self.channel, self.ts, error)
            self.broken = True
            with self._cond:
                self._cond.notify_all()
            return False

    def _promised(self) -> bool:
        """Whether the stream about to open is promised to the store first (`LiveLedger.opening`);
        when it cannot be, nothing opens (the reply is posted whole instead): a stream no driver
        after a crash could find is never started."""
        try:
            self._ledger.opening()
            return True
        except Exception as exc:
            log.warning(
                "cannot promise a stream in %s/%s (%s): posting instead", self.channel, self.thread_ts, exc
            )
            self.broken = True
            with self._cond:
                self._cond.notify_all()
            return False

    def _chunks(self, batch: _Batch) -> tuple[list[dict[str, Any]] | None, dict[str, TaskLine]]:
        """The batch as chunks when a task in it shows something new (the words first), and what
        those tasks show once written; None: text alone suffices. Each task's update carries only
        what it does not show yet: Slack adds a task's details and output to what it showed."""
        updates, shown = [], {}
        for call_id, line in batch.tasks.items():
            chunk, after = task_update(call_id, line, self._shown.get(call_id))
            if chunk is not None:
                updates.append(chunk)
                shown[call_id] = after
        if not updates:
            return None, {}
        words = "".join(batch.text)
        head = [{"type": "markdown_text", "text": words}] if words else []
        return head + updates, shown


class LiveStreams:
    """The process's open live messages by ts, so that the settlement waits for a stream's stop."""

    def __init__(self) -> None:
        self.pacer = Pacer()
        self._open: dict[str, LiveMessage] = {}
        self._lock = threading.Lock()

    def add(self, message: LiveMessage) -> None:
        if message.ts is not None:
            with self._lock:
                self._open[message.ts] = message

    def forget(self, ts: str) -> None:
        """Stop keeping `ts`: nothing will settle into it (its writer still stops it)."""
        with self._lock:
            self._open.pop(ts, None)

    def stopped(self, ts: str) -> bool:
        """Wait until the stream `ts` of this process stopped; False when it is not one of ours (a
        driver of another process, or one that died, wrote it: the caller stops it itself)."""
        with self._lock:
            message = self._open.pop(ts, None)
        if message is None:
            return False
        message.join()
        return True


class LiveView:
    """One driver's live view of its run (`Agent.live`): which message is open, and its tasks."""

    def __init__(
        self,
        slack: WebClient,
        streams: LiveStreams,
        where: tuple[str, str, str, str],
        *,
        ledger: LiveLedger,
    ) -> None:
        self.slack = slack
        self.streams = streams
        self.where = where
        self._ledger = ledger
        self.refused: set[str] = set()  # "stream", "tasks": what Slack refused for this run
        self.message: LiveMessage | None = None
        self._made: list[LiveMessage] = []  # every message of this view, for `close`

    def __call__(self, event: LiveEvent) -> None:
        """What the harness saw happen (a live event), shown in the open message."""
        if isinstance(event, TextWritten):
            if message := self._message():
                message.text(escape(visible(event.text, answer=True)))
        elif isinstance(event, CallRunning):  # about to run, unless it never will (denied, declined)
            self._task(event.call, task_line(event.call, running=True))
        elif isinstance(event, ToolReturned):
            self._task(event.call, task_line(event.call))

    def requested(self, calls: Sequence[PendingCall]) -> None:
        """Show each of `calls` as it stands: pending when just asked for, else how far it got
        or how it ended (a turn shown again after a park, or at its end)."""
        for call in calls:
            self._task(call, task_line(call))

    def waiting(self, calls: Sequence[PendingCall]) -> None:
        """`calls` wait for a person's decision (on their cards, below)."""
        for call in calls:
            self._task(call, task_line(call, waiting=True))

    def seal(self) -> str | None:
        """End the open message (it stops streaming meanwhile): its ts, None when nothing was open
        or it broke before it opened. The next event opens a new one."""
        message, self.message = self.message, None
        if message is None:
            return None
        ts = message.seal()
        if ts is not None:
            self.streams.add(message)
        return ts

    def close(self) -> None:
        """Seal the open message and wait until every writer of this view is done: a job leaves
        no thread behind (a prefork horse that finds one left running replaces itself)."""
        self.seal()
        for message in self._made:
            message.join()
        self._made.clear()

    def _message(self) -> LiveMessage | None:
        if "stream" in self.refused:
            return None
        if self.message is None or self.message.broken:
            if self.message is not None and self.message.broken:
                return None  # a broken one stays broken until it is sealed: its settlement is whole
            self.message = LiveMessage(
                self.slack,
                self.streams.pacer,
                self.where,
                tasks="tasks" not in self.refused,
                ledger=self._ledger,
                refused=self.refused.add,
            )
            self._made.append(self.message)
        return self.message

    def _task(self, call: PendingCall, line: TaskLine) -> None:
        if "tasks" in self.refused:
            return
        if message := self._message():
            message.task(call.id, line)


def _error(exc: Exception) -> str:
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error"))
    return type(exc).__name__
