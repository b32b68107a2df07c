"""Runs a worker leaves for a newer release.

A record only a newer release reads (`harness.state.NewerRecord`: a run record, the state in it,
its packing, the thread's history, a park's approvals or a decision in them) is not malformed: the
worker that meets it changes nothing of the run. A queued run stays queued and a parked one parked;
no lease is kept, no status written, nothing refused. The run is held (`store.held`), which keeps
every watchdog's recovery, expiries and reminders off it (no worker spins on it), and the first
worker to hold it says so in one log line.

Every watchdog pass looks at the held runs again (`TakeBack`): the worker that reads all of a held
run's records (a newer one, or any once they were written in a format it reads) takes it back and
starts a driver for it if it needs one. While old and new workers run side by side, that job may
reach an old worker again, which holds the run again; the next pass of a new worker's watchdog
takes it back, until a new worker drives it.
"""

from __future__ import annotations

import logging
import time

import rq

from harness.state import NewerRecord, StateError
from runtime.queue import enqueue_run_job, job_waiting
from store import RunRecord, RunStatus, Store

log = logging.getLogger("workers.newer")

START_RUN = "workers.jobs.start_run"  # by name: a job every release since the first has


def leave(store: Store, run_id: str, exc: NewerRecord) -> None:
    """Leave `run_id` as it is for a newer release: held, and said in one line by whoever holds
    it first (a worker meeting it again while it is held says nothing more)."""
    if store.held.hold(run_id, time.time()):
        log.warning("run %s left untouched for a newer release: %s", run_id, exc)


def look(store: Store, record: RunRecord) -> None:
    """Raise `NewerRecord` when a record the run's next step reads was written by a newer release:
    its thread's history (queued) or its park's decisions (parked). One unreadable for another
    reason passes: it is refused where it is read, as before."""
    try:
        if record.status is RunStatus.QUEUED:
            store.threads.load_history(*record.thread)
        elif record.status is RunStatus.AWAITING_APPROVAL:
            store.parks.decisions(record.run_id, record.park_id)
    except NewerRecord:
        raise
    except StateError:
        pass


class TakeBack:
    """A watchdog's look at the held runs, each at most once every `every` seconds: one whose
    records this release reads now is no longer held, and gets a driver if it needs one."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._looked: dict[str, float] = {}  # run id -> when this watchdog last read it

    def run(self, store: Store, queue: rq.Queue, now: float) -> int:
        """One pass; how many runs it took back."""
        held = store.held.held()
        ids = {run_id for run_id, _ in held}
        self._looked = {run_id: at for run_id, at in self._looked.items() if run_id in ids}
        taken = 0
        for run_id, since in held:
            if now - self._looked.get(run_id, float("-inf")) < self.every:
                continue
            self._looked[run_id] = now
            try:
                readable = _readable(store, run_id)
            except NewerRecord:
                continue  # still a newer release's
            store.held.release(run_id)
            self._looked.pop(run_id, None)
            if not readable:
                continue  # gone, or refused where it is read
            taken += 1
            log.info(
                "run %s, held %.0f s for a newer release, is read by this one: it goes on",
                run_id,
                now - since,
            )
            if store.runs.unattended(run_id, lambda job_id: job_waiting(queue, job_id)):
                # Heard from now: the orphans of this very pass must not see it between its job's
                # start and its lease (its score is as old as its hold).
                store.runs.heard_from(run_id, now)
                enqueue_run_job(store, queue, START_RUN, run_id)
        return taken


def _readable(store: Store, run_id: str) -> bool:
    """Whether this release reads every record of `run_id` its next step reads (False: gone, or
    unreadable for another reason); `NewerRecord` when one is still a newer release's."""
    try:
        record = store.runs.load(run_id)
    except NewerRecord:
        raise
    except StateError:
        return False
    if record is None:
        return False
    look(store, record)
    return True
