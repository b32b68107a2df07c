"""A prefork horse's slots: `HARNESS_WORKER_CONCURRENCY` jobs driven side by side, one per thread.

A run spends its life waiting: seconds for each model request, against about 3 ms of CPU per tool
turn. One job per process held a whole process (37 MiB of PSS for the worker tree) per run talking
to the model. A horse with slots drives that many jobs at once, each on a long-lived thread of its
own, and RQ stays the queue and the registry of what ran: the horse's RQ loop dequeues a job only
when a slot is free, prepares its execution as RQ does, and hands it to the slot, which performs it
with RQ's own `perform_job` (registries, retries, results).

Why threads and not an event loop: the harness, its tools (module tools are plain functions) and
the Slack and Anthropic clients are synchronous, and a tool that blocks must not stall the other
runs. With threads every guarantee stays per run exactly as it was (each job has its own driver,
lease heartbeat, write-ahead mark and Stop checks); the GIL is released while a thread waits on a
socket, which is all a run does for most of its life. An event loop would mean rewriting the loop
and every tool, for no memory saving that matters next to a thread's stack (a few hundred KiB).

Threads here live as long as the horse, so what is per thread stays warm: the keep-alive Slack
connection (`runtime.slack_http`), the MCP relay connection, the tool lane.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("workers.process.slots")

SLOT_NAME = "harness-slot"  # each slot thread is named "harness-slot-N"

Work = Callable[[], None]


class Slots:
    """`size` threads, each running one piece of work at a time; `submit` never queues behind a
    busy slot (the caller waits for `free` first), so a job is never held by a horse that cannot
    start it while another worker could."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a horse has at least one slot")
        self.size = size
        self._inbox: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        self._busy = 0
        self._changed = threading.Condition()
        self._threads = [
            threading.Thread(target=self._serve, name=f"{SLOT_NAME}-{i}", daemon=True) for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def busy(self) -> int:
        """Pieces of work running now."""
        with self._changed:
            return self._busy

    def submit(self, work: Work) -> None:
        """Run `work` on a free slot (the caller made sure one is: `wait_free`)."""
        with self._changed:
            self._busy += 1
        self._inbox.put(work)

    def wait_free(self, timeout: float) -> bool:
        """Whether a slot is free, waiting up to `timeout` seconds for one."""
        with self._changed:
            return self._changed.wait_for(lambda: self._busy < self.size, timeout)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Whether every slot is free, waiting up to `timeout` seconds (None: as long as it takes)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._busy == 0, timeout)

    def close(self) -> None:
        """Let the slot threads end once their work is done (they are daemons either way)."""
        for _ in self._threads:
            self._inbox.put(None)

    def _serve(self) -> None:
        while True:
            work = self._inbox.get()
            if work is None:
                return
            try:
                work()
            except BaseException:  # a job's failure is RQ's to record; the slot must outlive it
                log.exception("a slot's job raised past RQ's own handling")
            finally:
                with self._changed:
                    self._busy -= 1
                    self._changed.notify_all()
