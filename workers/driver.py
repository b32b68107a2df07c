"""The driver of one run: it holds the run's lease, and every write of the run goes through it.

Exactly one driver holds a run's lease at a time. Every write is fenced by the lease (a driver
that stalled past it can never overwrite the run), the lease is renewed by every write and by a
heartbeat while a model request or a tool runs, and a driver that dies lets it expire: the run
stays in `harness:active`, where the watchdog finds it and hands it to another worker.
"""

from __future__ import annotations

import contextvars
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from harness.state import NewerRecord, PendingCall, RunState, StateError
from messages import texts, turns
from messages.blocks import Message, notice
from store import (
    DAY,
    FINISHED_RUN_TTL,
    LIMIT_CALL,
    Beside,
    FinishResult,
    RecordEncoder,
    RunRecord,
    RunStatus,
    Settled,
    unpack,
)
from workers import outbox, thread_status
from workers.live import LiveView
from workers.live_ledger import RunLedger
from workers.services import Services

log = logging.getLogger(__name__)


WORKING = "~working"  # outbox key of the Working message while it is delivered (never a call id)
# How long the Stop read by a save stands in for a fresh look, if the driver did nothing in between
# that took its time (a delivery to Slack). A Stop reaches Redis through Slack and the bot, which
# takes longer than this: a read this recent and one made now cannot be told apart.
STOP_SEEN_SECONDS = 0.02


# What the courier changes while it pays: only it writes them until `Driver.collect`.
_COURIERS_OWN = frozenset({"outbox", "cards", "failure_ts", "status_shown", "working_ts"})


class LostLease(Exception):
    """Another driver took this run over (this one stalled past its lease); stop at once."""


def lease_seconds() -> float:
    """How long a silent driver keeps its run before another worker takes it over."""
    return float(os.environ.get("HARNESS_LEASE_SECONDS") or 30)


def park_ttl(minutes: float) -> int:
    """How long a parked run and its approvals are kept: its expiry plus a day."""
    return int(minutes * 60) + DAY


class Driver:
    """Holds a run's lease while a job drives it (a context manager: None when someone else drives)."""

    def __init__(self, svc: Services, run_id: str) -> None:
        self.svc = svc
        self.run_id = run_id
        self._record: RunRecord  # read by all, changed only by the driver's verbs below
        self.token = uuid.uuid4().hex
        self.seconds = lease_seconds()
        self.released = False
        self._reconcile = False
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._beat: threading.Thread | None = None
        self._courier: _Courier | None = None
        self._handed = 0  # debts at the head of the outbox handed to the courier, not yet collected
        self._stop_seen: tuple[str | None, float] | None = None  # (who pressed Stop, when) per the last save
        self._beside: list[Beside] = []  # what the next save carries (a step's metrics)
        self._encoder = RecordEncoder()  # packs the conversation a message at a time, save after save
        self._live: LiveView | None = None  # what Slack shows of the run as it happens (workers.live)

    def __enter__(self) -> Driver | None:
        """The driver, once it holds the lease; None when someone else drives the run, or there
        is none. `NewerRecord` (the lease let go) when a newer release wrote its record."""
        took, raw = self.svc.store.runs.acquire_and_read(self.run_id, self.token, self.seconds)
        if not took:
            return None
        try:  # read under the lease: nobody else writes it now
            record = None if raw is None else RunRecord.from_json(unpack(raw))
        except NewerRecord:  # a newer release's run: let go, changing nothing (`workers.newer`)
            self.svc.store.runs.release_lease(self.run_id, self.token)
            raise
        except StateError as exc:
            log.error("run %s cannot be read: %s", self.run_id, exc)  # nowhere to post: refuse quietly
            record = None
        if record is None:
            self.svc.store.runs.release_lease(self.run_id, self.token)
            self.svc.store.runs.forget_active(self.run_id)
            return None
        self._record = record
        # Debts found at the start may have been paid by a driver that died before saving so.
        self._reconcile = bool(record.outbox)
        self._beat = threading.Thread(target=self._heartbeat, name="lease", daemon=True)
        self._beat.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if self._live is not None:
            self._live.close()  # its streams stopped: the job leaves no writer behind
        if self._courier is not None:
            self._courier.close()  # what it still carries is paid first (the next driver would else)
        self._write_besides()
        self._stop.set()
        if self._beat is not None:
            self._beat.join(5)
        if not self.released:
            # Whatever happened, the run stays active: the watchdog hands it to another worker.
            self.svc.store.runs.release_lease(self.run_id, self.token)

    def _heartbeat(self) -> None:
        """Renews the lease while a long model request or tool runs between saves.

        A Redis error is retried on the next beat; once the lease may have expired without a
        renewal, the lease counts as lost, so the next save stops the driver.
        """
        renewed = time.monotonic()
        while not self._stop.wait(self.seconds / 3):
            try:
                if not self.svc.store.runs.renew_lease(self.run_id, self.token, self.seconds):
                    break
                renewed = time.monotonic()
            except Exception as exc:  # a dead heartbeat must never go unnoticed
                log.warning("run %s: cannot renew its lease (%s)", self.run_id, exc)
                if time.monotonic() - renewed >= self.seconds:
                    break
        else:
            return
        self._lost.set()

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    @property
    def record(self) -> RunRecord:
        """The run as this driver knows it: what was saved, and what the next write carries.

        Read-only: every change goes through a verb of the driver, so what a write carries, what
        the courier owns meanwhile and what Slack was shown are decided in this one class.
        """
        return self._record

    @property
    def live(self) -> LiveView | None:
        """The run's live view, once its first step made it (`live_view`)."""
        return self._live

    # --- writes ---------------------------------------------------------------------------------

    def save(self, *, ttl: int = FINISHED_RUN_TTL, promise: str | None = None, **changes: Any) -> None:
        """Write the run with `changes` (fenced by the lease), outbox included. `promise`: what rests
        on this write (a call's write-ahead mark), which then waits for a replica (`store.runs.save`)."""
        if _COURIERS_OWN.intersection(changes):
            self.collect()
        record = replace(self.record, **changes)
        beside, self._beside = self._beside, []
        if self.lost:
            raise LostLease(self.run_id)
        store = self.svc.store
        saved = store.runs.save(
            record, self.token, self.seconds, ttl=ttl, beside=beside, encoder=self._encoder, promise=promise
        )
        if not saved:
            raise LostLease(self.run_id)
        self._record = record
        self._stop_seen = (saved.stop_by, time.monotonic())

    def beside_next_save(self, write: Beside) -> None:
        """Send `write` (a step's metrics) in the round trip of the next save rather than one of
        its own. A run's other writes (park, finish) send it alone first; so does the driver's end."""
        self._beside.append(write)

    def _write_besides(self) -> None:
        beside, self._beside = self._beside, []
        if beside:
            self.svc.store.runs.write_besides(beside)

    def stop_requested(self) -> str | None:
        """Who pressed Stop, if anyone: as the last save read it when that was just now, else from Redis.

        A save's reading serves one check only, so every model request and every call is still
        preceded by a look of its own.
        """
        seen, self._stop_seen = self._stop_seen, None
        if seen is not None and time.monotonic() - seen[1] <= STOP_SEEN_SECONDS:
            return seen[0]
        return self.svc.store.runs.stop_requested(self.run_id)

    def owe(
        self, msg: Message, role: str = outbox.MESSAGE, call: str | None = None, *, live: str | None = None
    ) -> None:
        """Owe Slack a post in the thread (settling live message `live`, if given); the next save
        stores the debt, `deliver` pays it."""
        self._record = outbox.owe_post(self.record, msg, role, call, live=live)

    def owe_update(self, ts: str, msg: Message) -> None:
        """Owe Slack the replacement of message `ts` (a card decided, the Working message closed)."""
        self._record = outbox.owe_update(self._record, ts, msg)

    def owe_ephemeral(self, user: str, msg: Message) -> None:
        """Owe Slack a message in the thread that only `user` sees."""
        self._record = outbox.owe_ephemeral(self._record, user, msg)

    def owe_discard(self, ts: str) -> None:
        """Owe Slack the removal of live message `ts` from the thread (stopped, then deleted)."""
        self._record = outbox.owe_discard(self._record, ts)

    def owe_decided(self, ts: str, call: PendingCall, at: float) -> None:
        """Owe Slack card `ts` showing `call`'s decision, rendered when paid (`outbox.owe_decided`)."""
        self._record = outbox.owe_decided(self._record, ts, call, at)

    def owe_reaction(self, name: str, *, remove: str | None = None) -> None:
        """Owe Slack a reaction on the message that started the run."""
        self._record = outbox.owe_reaction(self._record, name, remove=remove)

    def amend(self, **changes: Any) -> None:
        """Change the run in memory only, for the next write to carry (a park's cards, an ending's
        state). Fields the courier owns are taken back from it first, as `save` does."""
        if _COURIERS_OWN.intersection(changes):
            self.collect()
        self._record = replace(self._record, **changes)

    def show(self, phase: thread_status.Phase) -> None:
        """Show where the run is (working, waiting, ended) in Slack's status of its thread."""
        self._record = thread_status.show(self.svc, self._record, phase)

    def deliver(self) -> None:
        """Pay what the run owes Slack. Not saved here: the next write drops the paid debts."""
        self.collect()
        self._owe_working()
        if self.record.outbox:
            self._stop_seen = None  # Slack takes its time: the next Stop check looks again
        self._record = outbox.deliver(self.svc, self.record, reconcile=self._reconcile)
        self._reconcile = False
        self._keep_working_ts()

    def owes(self) -> bool:
        """Whether the run owes Slack something not yet handed to its courier."""
        return len(self.record.outbox) > self._handed

    def dispatch(self, then: Callable[[RunRecord], RunRecord] | None = None) -> None:
        """Hand what the run owes Slack now to its courier, which pays it while the run steps on
        (a model request, the tools), so that no Slack round trip waits in front of a step; `then`
        runs after those payments (showing the run's status, which a post in a DM clears).

        Saves meanwhile still carry the debts being paid, which is safe: a driver that dies before
        the next save pays them again, reconciled by their keys (an update or a reaction twice
        changes nothing). `collect` waits for the courier and drops what it paid.
        """
        self._owe_working()
        new = self.record.outbox[self._handed :]
        if not new and then is None:
            return
        if self._courier is None:
            self._courier = _Courier(self.svc, reconcile=self._reconcile)
            self._reconcile = False
        self._courier.send(replace(self.record, outbox=list(new)), then)
        self._handed += len(new)

    def collect(self) -> None:
        """Wait until the courier paid everything handed to it; the record then shows what it paid."""
        courier = self._courier
        if courier is None:
            return
        view, error = courier.wait()
        handed, self._handed = self._handed, 0
        if error is not None:
            self._reconcile = True  # some were paid, some not: look in the thread before paying again
            raise error
        if view is not None:
            self._record = replace(
                self.record,
                outbox=self.record.outbox[handed:],
                cards=view.cards,
                failure_ts=view.failure_ts,
                status_shown=view.status_shown,
            )
            self._keep_working_ts()

    def _keep_working_ts(self) -> None:
        if WORKING in self.record.cards:  # the Working message rode along as a card: keep its ts apart
            cards = dict(self.record.cards)
            self._record = replace(self.record, cards=cards, working_ts=cards.pop(WORKING))

    def _owe_working(self) -> None:
        """A working (or parked) run's "Working on it…" message with Stop, its first post.

        Its debt is saved by no write: a driver that dies before the next one owes it again under
        the same key, and reconciliation finds it if it was posted.
        """
        record = self.record
        working = record.status in (RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL)
        if record.working_ts or not working or any(e.get("call") == WORKING for e in record.outbox):
            return
        self._record = outbox.owe_post(record, turns.working(run_id=record.run_id), outbox.CARD, WORKING)

    def park_limit(self, state: RunState, ttl: int, expires_at: float) -> None:
        """Save the run waiting at a limit: one pseudo-call, `LIMIT_CALL`, decided Continue or Stop."""
        self.collect()
        self._write_besides()
        record = replace(
            self.record,
            status=RunStatus.AWAITING_APPROVAL,
            state=state.to_json(),
            park_id=self.record.park_id + 1,
            expires_at=expires_at,
            cards={},
            parked_since=time.time(),
        )
        if self.lost or not self.svc.store.parks.park(
            record, self.token, self.seconds, [LIMIT_CALL], ttl=ttl
        ):
            raise LostLease(self.run_id)
        self._record = record

    def park(
        self,
        state: RunState,
        calls: tuple[PendingCall, ...],
        ttl: int,
        expires_at: float,
        fingerprints: dict[str, str] | None = None,
    ) -> None:
        """Save the run awaiting decisions on `calls`, its cards owed and its expiry scheduled.
        `fingerprints`: what a decision of each must name (default: the call's own fingerprint)."""
        self.collect()
        self._write_besides()
        record = replace(
            self.record,
            status=RunStatus.AWAITING_APPROVAL,
            state=state.to_json(),
            park_id=self.record.park_id + 1,
            expires_at=expires_at,
            cards={},
            parked_since=time.time(),
        )
        fingerprints = fingerprints or {c.id: c.fingerprint for c in calls}
        ids = [c.id for c in calls]
        if self.lost or not self.svc.store.parks.park(
            record, self.token, self.seconds, ids, ttl=ttl, fingerprints=fingerprints, encoder=self._encoder
        ):
            raise LostLease(self.run_id)
        self._record = record

    def settle(self) -> bool:
        """Let go of a parked run; True when every decision is already in (keep driving it)."""
        self.collect()
        ttl = park_ttl(self.svc.settings_of(self.record).approvals.expire_after_minutes)
        outcome = self.svc.store.parks.settle(self.record, self.token, self.seconds, ttl=ttl)
        if outcome is Settled.LOST:
            raise LostLease(self.run_id)
        self.released = outcome is Settled.PARKED
        return outcome is Settled.READY

    def finish(self) -> str | None:
        """End the run: its history saved (if no newer run saved one), its thread handed on.

        Returns the run queued next in the thread, if any.
        """
        return self._finish(None).next_run

    def finish_failed(self) -> FinishResult:
        """End a failed run as `finish` does, unless the Retry of its failure was claimed already:
        then (`retry_claimed`) the run is still this driver's (lease, thread, the claim's counts),
        to retry it now.

        Its card reaches Slack before the record that knows its ts: a click in between is claimed
        against the card's ts, and the job it enqueues finds the lease held. The claim and this
        end are each one step in Redis, so one of them sees the other: the first click retries.
        """
        record = self.record
        failed = record.status is RunStatus.FAILED and record.failure_ts
        return self._finish(record.failure_ts if failed else None)

    def _finish(self, failure_ts: str | None) -> FinishResult:
        self.collect()
        self._write_besides()
        record = self.record
        history = None
        if record.status in (RunStatus.FINISHED, RunStatus.STOPPED) and record.state is not None:
            history = tuple(record.state["messages"])
        result = self.svc.store.runs.finish(record, self.token, history=history, failure_ts=failure_ts)
        if result is None:
            raise LostLease(self.run_id)
        if result.retry_claimed:
            return result
        self.released = True
        if history is not None and not result.history_saved:
            log.warning("run %s: a newer run saved this thread's history; it was kept", record.run_id)
        return result

    def leave(self) -> None:
        """Let go of a run queued behind another in its thread."""
        self.collect()
        self.svc.store.threads.leave(self.record, self.token)
        self.released = True

    def notify(self, text: str) -> None:
        """Owe a plain notice in the thread."""
        self.owe(notice(text))

    def refuse_text(self, reason: str) -> str:
        log.error("run %s refused: %s", self.run_id, reason)
        return texts.REFUSED_TO_CONTINUE.format(reason=reason)

    # --- the live view: what Slack shows while the run steps (workers.live) ---------------------

    def live_view(self) -> LiveView:
        """The run's live view, made at its first step."""
        if self._live is None:
            record = self._record
            where = (record.channel, record.thread_ts, record.team, record.requester)
            ledger = RunLedger(self.svc, self.run_id)
            self._live = LiveView(self.svc.courtesy_slack, self.svc.live_streams, where, ledger=ledger)
        return self._live

    def show_turn(self, calls: Sequence[PendingCall]) -> None:
        """Show the turn's `calls` live as they stand, before it goes on (or ends at a Stop).

        The message the turn parked in stopped, and a stopped stream takes no task update: its
        lines would say "waiting" for good. It is owed its removal (the cards below tell each
        decision, the summary keeps the model's words), and the calls show in a new message, which
        the turn's summary settles into. Shown again, after a driver died, the lines are whole
        again: that driver's message is taken out first (`drop_orphans`).
        """
        if self._record.live_ts:
            self.owe_discard(self._record.live_ts)
            self._record = replace(self._record, live_ts=None)
        if calls:
            self.live_view().requested(calls)

    def seal_live(self) -> str | None:
        """Seal the open live message, for a post to settle into: its ts, or None."""
        return self._live.seal() if self._live is not None else None

    def let_stand(self, *, discard: bool = False) -> None:
        """Seal the open live message with nothing to settle into it: it stays as it stopped (what the
        model wrote before a stop), or with `discard` goes (a reply that failed is asked for again)."""
        ts = self.seal_live()
        if ts is None:
            return
        if discard:
            self.svc.discard_live(self._record.channel, ts)
        else:
            self.svc.live_streams.forget(ts)
        self.svc.store.live.closed(self.run_id, ts)

    def seal_for_park(self, waiting: Sequence[PendingCall]) -> None:
        """The parking turn's message stops, showing what waits; the park's record keeps it, for
        the turn's summary to settle into after the decisions."""
        if self._live is not None:
            self._live.waiting(waiting)
            live_ts = self._live.seal() or self._record.live_ts
            self._record = replace(self._record, live_ts=live_ts)

    def hand_parked_live(self) -> None:
        """Once parked, the record keeps the turn's message, no longer the open set (its writer
        stops it meanwhile): a later driver settles into it rather than deleting it."""
        if self._record.live_ts:
            self.svc.live_streams.forget(self._record.live_ts)
            self.svc.store.live.closed(self.run_id, self._record.live_ts)

    def drop_orphans(self) -> None:
        """Take out the live messages of a driver that died: those no saved step owes a settlement.

        Those written down are in the store; one that opened as its driver died (or as a failover
        lost the write of its ts) is looked for in the thread, when its opening was marked: a
        stream of ours there that nothing tagged (`messages.metadata`) since the run was asked for.
        """
        record = self._record
        kept = {record.live_ts} | {e.get("live") for e in record.outbox}
        live = self.svc.store.live
        orphans = [ts for ts in live.open(record.run_id) if ts not in kept]
        found: list[str] | None = []
        if live.unfound(record.run_id):
            after = record.asked_ts or record.thread_ts
            found = self.svc.find_streams(record.channel, record.thread_ts, after)
            if found is None:
                log.warning(
                    "run %s: a stream it opened may stand in the thread beside what follows", self.run_id
                )
            else:
                orphans += [ts for ts in found if ts not in kept and ts not in orphans]
                if found:
                    log.info(
                        "run %s: found %d stream(s) its driver opened unrecorded", self.run_id, len(found)
                    )
        for ts in orphans:
            self.svc.discard_live(record.channel, ts)
            live.closed(record.run_id, ts)
        if found is not None:
            live.sought(record.run_id)


class _Courier:
    """One thread per driver that pays the run's debts to Slack in the order they were handed to it.

    Until the driver collects, the courier owns the fields a payment changes (cards, the failure
    message, the status shown): each batch starts from what the one before it left.
    """

    def __init__(self, svc: Services, *, reconcile: bool) -> None:
        self.svc = svc
        self.reconcile = reconcile
        self.inbox: queue.SimpleQueue[tuple[RunRecord, Callable[[RunRecord], RunRecord] | None] | None]
        self.inbox = queue.SimpleQueue()
        self.view: RunRecord | None = None
        self.error: BaseException | None = None
        self.pending = 0
        self.idle = threading.Condition()
        context = contextvars.copy_context()  # its log lines name the run, as the driver's do
        self.thread = threading.Thread(target=context.run, args=(self._work,), name="outbox", daemon=True)
        self.thread.start()

    def send(self, owed: RunRecord, then: Callable[[RunRecord], RunRecord] | None) -> None:
        with self.idle:
            self.pending += 1
        self.inbox.put((owed, then))

    def wait(self) -> tuple[RunRecord | None, BaseException | None]:
        """Block until every batch is paid; what the payments left, or the first error (both reset)."""
        with self.idle:
            while self.pending:
                self.idle.wait()
            view, error = self.view, self.error
            self.view, self.error = None, None
        return view, error

    def close(self) -> None:
        self.inbox.put(None)
        self.thread.join()

    def _work(self) -> None:
        while (item := self.inbox.get()) is not None:
            owed, then = item
            try:
                if self.error is None:  # after a failure the rest waits for the next driver
                    if self.view is not None:
                        owed = replace(
                            owed,
                            cards=self.view.cards,
                            failure_ts=self.view.failure_ts,
                            status_shown=self.view.status_shown,
                        )
                    done = outbox.deliver(self.svc, owed, reconcile=self.reconcile)
                    self.reconcile = False
                    self.view = then(done) if then is not None else done
            except BaseException as exc:  # handed to the driver when it collects
                self.error = exc
            finally:
                with self.idle:
                    self.pending -= 1
                    self.idle.notify_all()
