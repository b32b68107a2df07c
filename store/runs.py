"""Runs as their drivers write them: one driver at a time, every write fenced by its lease.

A driver takes a run's lease (`acquire_lease`), saves the run turn after turn (`save`: renews the
lease, marks the run active, answers who pressed Stop, and carries `Beside` writes in the same
round trip) and ends it (`finish`: the record, the thread's history, the thread handed to the next
run, in one step). Runs that need a driver and have none are found by the watchdog (`orphans`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from harness.state import NewerRecord, StateError
from store.base import Beside, StorePart, as_text
from store.held import held_runs
from store.keys import DAY, BadId, Keys, check_id, run_of_key
from store.records import FINISHED_RUN_TTL, RecordEncoder, RunRecord, pack, peek, unpack
from store.threads import HISTORY_VERSION, THREAD_TTL

log = logging.getLogger("store")

PENDING_TTL = 3600  # a queued job normally starts in well under this; past it the watchdog looks again
# Told of a run record a newer release wrote: its run id, why, and what it shows of itself (`peek`).
NewerSeen = Callable[[str, NewerRecord, dict[str, str]], None]


@dataclass(frozen=True)
class Saved:
    """A fenced save: whether it was written (the lease still ours), and who had pressed Stop then."""

    ok: bool
    stop_by: str | None = None

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class FinishResult:
    next_run: str | None  # the run queued next in the thread, now marked active
    history_saved: bool
    retry_claimed: bool = False  # not ended: its failure's Retry was claimed first (`finish`)


# KEYS[1] lease, KEYS[2] run record, KEYS[3] active set, KEYS[4] stop request. ARGV[1] token,
# ARGV[2] lease ms, ARGV[3] record, ARGV[4] record TTL s, ARGV[5] now, ARGV[6] run id.
# A fenced write: only the lease holder may write the run (a driver that lost its lease stops).
# It answers who pressed Stop ('' nobody) too: the driver's next Stop check costs no round trip.
_SAVE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0, ''} end
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[6])
return {1, redis.call('GET', KEYS[4]) or ''}
"""

# KEYS[1] lease, KEYS[2] active set. ARGV[1] token, ARGV[2] lease ms, ARGV[3] now, ARGV[4] run id.
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return 1
"""

# KEYS[1] lease. ARGV[1] token.
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end return 0"

# KEYS[1] stop request, KEYS[2] active set. ARGV[1] who, ARGV[2] TTL s, ARGV[3] now, ARGV[4] run id.
# The first Stop of a run is recorded (and the run marked active, so the watchdog drives it even if
# the job asking for it is lost); a later one changes nothing and learns who pressed it first.
_REQUEST_STOP = """
local first = redis.call('GET', KEYS[1])
if first then return first end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return false
"""

# KEYS[1] lease, KEYS[2] run record, KEYS[3] active set, KEYS[4] thread lock, KEYS[5] waiting list,
# KEYS[6] requester's runs, KEYS[7] channel's runs, KEYS[8] thread history. ARGV[1] token,
# ARGV[2] record, ARGV[3] TTL s, ARGV[4] run id, ARGV[5] now, ARGV[6] history ('' for none),
# ARGV[7] the history seq the run continued, ARGV[8] history TTL s. KEYS[9] the Retry claim of a
# failed run's failure (ARGV[9] '1'; else any key, unread).
# The end of a run, in one fenced step: its record, the thread's history (only if no newer run saved
# one since this run began), the thread handed to the next run (marked active, so it is started even
# if the enqueue is lost), and the run no longer counted or driven. A failure whose Retry was claimed
# before this step (its card reached Slack before this record with its ts) is not ended: the record
# is written, and the lease, the thread and the claim's counts stay, for its driver to retry it.
_FINISH = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0, '', 0} end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
if ARGV[9] == '1' and redis.call('EXISTS', KEYS[9]) == 1 then return {2, '', 0} end
local saved = 0
if ARGV[6] ~= '' then
  local seq = tonumber(redis.call('HGET', KEYS[8], 'seq') or '0')
  if seq == tonumber(ARGV[7]) then
    redis.call('HSET', KEYS[8], 'data', ARGV[6], 'seq', seq + 1)
    redis.call('EXPIRE', KEYS[8], ARGV[8])
    saved = 1
  end
end
local nxt = ''
if redis.call('GET', KEYS[4]) == ARGV[4] then
  redis.call('DEL', KEYS[4])
  nxt = redis.call('LPOP', KEYS[5]) or ''
  if nxt ~= '' then redis.call('ZADD', KEYS[3], ARGV[5], nxt) end
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[4])
redis.call('ZREM', KEYS[6], ARGV[4])
redis.call('ZREM', KEYS[7], ARGV[4])
return {1, nxt, saved}
"""


class RunStore(StorePart):
    """Run records, their leases and saves, stop requests, a run's end, and runs without a driver."""

    def load(self, run_id: str) -> RunRecord | None:
        raw = self.redis.get(Keys.run(run_id))
        return None if raw is None else RunRecord.from_json(unpack(raw))

    def save_run(
        self, record: RunRecord, *, ttl: int = FINISHED_RUN_TTL, pipeline: Pipeline | None = None
    ) -> None:
        """Unfenced write of a record: only for a run nobody drives yet (a new mention)."""
        (pipeline or self.redis).set(Keys.run(record.run_id), pack(record.to_json()), ex=ttl)

    def mark_pending(self, run_id: str, job_id: str, pipeline: Pipeline | None = None) -> None:
        """Job `job_id` for `run_id` is on its way: while it waits, the watchdog sends no other."""
        (pipeline or self.redis).set(Keys.pending(run_id), job_id, ex=PENDING_TTL)

    def job_started(self, run_id: str) -> None:
        self.redis.delete(Keys.pending(run_id))

    # --- leases: exactly one driver per run, every write fenced ------------------------------

    def acquire_lease(self, run_id: str, token: str, seconds: float) -> bool:
        """Become the one driver of `run_id` for `seconds` (renewed by saves and heartbeats)."""
        return bool(self.redis.set(Keys.lease(run_id), token, nx=True, px=int(seconds * 1000)))

    def acquire_and_read(self, run_id: str, token: str, seconds: float) -> tuple[bool, bytes | None]:
        """`acquire_lease`, and the run's stored record read right after it in the same round trip.

        The read comes after the lease on one connection, so when the lease is ours it is a read
        under the lease, as `load_run` after `acquire_lease` was; when it is not, ignore it.
        """
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(Keys.lease(run_id), token, nx=True, px=int(seconds * 1000))
            pipe.get(Keys.run(run_id))
            took, raw = pipe.execute()
        return bool(took), raw if took else None

    def renew_lease(self, run_id: str, token: str, seconds: float) -> bool:
        keys = [Keys.lease(run_id), Keys.active()]
        return bool(self._script(_RENEW)(keys=keys, args=[token, int(seconds * 1000), time.time(), run_id]))

    def release_lease(self, run_id: str, token: str) -> None:
        self._script(_RELEASE)(keys=[Keys.lease(run_id)], args=[token])

    def save(
        self,
        record: RunRecord,
        token: str,
        seconds: float,
        *,
        ttl: int = FINISHED_RUN_TTL,
        beside: Sequence[Beside] = (),
        encoder: RecordEncoder | None = None,
        promise: str | None = None,
    ) -> Saved:
        """Save `record` if `token` still holds its lease (renewing it); falsy when it does not.

        `beside`: writes sent in the same round trip (a step's metrics), applied whatever the save's
        outcome. `encoder`: the run's, which packs its conversation a message at a time. `promise`:
        what rests on this save (a call's write-ahead mark): it then waits for a replica (`_promise`).
        """
        keys = [
            Keys.lease(record.run_id),
            Keys.run(record.run_id),
            Keys.active(),
            Keys.stop_request(record.run_id),
        ]
        args: list[Any] = [
            token,
            int(seconds * 1000),
            encoder.encode(record) if encoder else pack(record.to_json()),
            ttl,
            time.time(),
            record.run_id,
        ]
        if not beside:
            save = self._script(_SAVE)
            ok, stop = self.replicas.run(save, keys, args, promise) if promise else save(keys=keys, args=args)
        else:
            ok, stop = self._with_besides(self._script(_SAVE), keys, args, beside, promise)
        return Saved(bool(ok), as_text(stop) or None)

    def write_besides(self, besides: Sequence[Beside]) -> None:
        """Send `besides` now, each on its own (no save to carry them); a failure is logged."""
        for b in besides:
            try:
                self._script(b.script)(keys=list(b.keys), args=list(b.args))
            except Exception as exc:  # a figure is never worth a run
                log.warning("%s was not recorded (%s)", b.what, exc)

    def _with_besides(
        self,
        script: Script,
        keys: list[str],
        args: list[Any],
        besides: Sequence[Beside],
        promise: str | None = None,
    ) -> Any:
        """`script`'s answer, the `besides` sent in the same round trip (one pipeline of EVALSHAs).

        Not `Script.__call__` on a pipeline: redis-py then asks SCRIPT EXISTS first, a round trip
        of its own on every execute. A script Redis no longer has (it restarted) is loaded and sent
        again on its own: only those, so nothing is applied twice.
        """
        calls: list[tuple[Script, Sequence[Any], Sequence[Any], str | None]] = [(script, keys, args, None)]
        calls += [(self._script(b.script), b.keys, b.args, b.what) for b in besides]
        with self.redis.pipeline(transaction=False) as pipe:
            for registered, k, a, _ in calls:
                pipe.evalsha(registered.sha, len(k), *k, *a)
            waited = promise is not None and self.replicas.waits(pipe)
            answers = pipe.execute(raise_on_error=False)
        acked = answers.pop() if waited else None
        if waited and promise is not None and not isinstance(answers[0], NoScriptError):
            self.replicas.check(acked, promise)
        for i, (registered, k, a, what) in enumerate(calls):
            if isinstance(answers[i], NoScriptError):
                try:
                    if i == 0 and promise is not None:  # sent again with a WAIT of its own
                        answers[i] = self.replicas.run(registered, k, a, promise)
                    else:
                        answers[i] = registered(keys=list(k), args=list(a))  # loads it, then sends it
                except redis.RedisError as exc:
                    answers[i] = exc
            if what is not None and isinstance(answers[i], Exception):
                log.warning("%s was not recorded beside a save (%s)", what, answers[i])
        if isinstance(answers[0], Exception):
            raise answers[0]
        return answers[0]

    # --- stop requests --------------------------------------------------------------------------

    def request_stop(self, run_id: str, by: str, ttl: int = DAY) -> str | None:
        """Ask `run_id` to stop on behalf of `by`: None if this is the first Stop, else who pressed first."""
        keys = [Keys.stop_request(run_id), Keys.active()]
        first = self._promise(_REQUEST_STOP, keys, [check_id("user", by), ttl, time.time(), run_id], "stop")
        return as_text(first) if first else None

    def stop_requested(self, run_id: str) -> str | None:
        """Who asked `run_id` to stop, if anyone has."""
        raw = self.redis.get(Keys.stop_request(run_id))
        return as_text(raw) if raw else None

    # --- the end of a run, and runs left without a driver ---------------------------------------

    def finish(
        self,
        record: RunRecord,
        token: str,
        *,
        history: tuple[dict[str, Any], ...] | None,
        ttl: int = FINISHED_RUN_TTL,
        failure_ts: str | None = None,
    ) -> FinishResult | None:
        """End the run (see `_FINISH`); None when `token` no longer holds its lease.

        `failure_ts`: the card of the failure that ends the run; if its Retry was claimed already,
        the run is not ended (`FinishResult.retry_claimed`) and its driver keeps it, to retry it.
        """
        payload = b""
        if history is not None:
            text = json.dumps({"version": HISTORY_VERSION, "messages": list(history)}, ensure_ascii=False)
            payload = pack(text)
        keys = [
            Keys.lease(record.run_id),
            Keys.run(record.run_id),
            Keys.active(),
            Keys.thread_lock(*record.thread),
            Keys.thread_waiting(*record.thread),
            Keys.user_runs(record.team, record.requester),
            Keys.channel_runs(record.team, record.channel),
            Keys.history(*record.thread),
            Keys.retry_claim(record.run_id, failure_ts) if failure_ts else Keys.lease(record.run_id),
        ]
        args: list[Any] = [
            token,
            pack(record.to_json()),
            ttl,
            record.run_id,
            time.time(),
            payload,
            record.history_seq,
            THREAD_TTL,
            "1" if failure_ts else "0",
        ]
        ok, nxt, saved = self._promise(_FINISH, keys, args, "finish")
        if not ok:
            return None
        if ok == 2:
            return FinishResult(None, False, retry_claimed=True)
        return FinishResult(as_text(nxt) or None, bool(saved))

    def orphans(self, older_than: float, queued: Callable[[str], bool]) -> list[str]:
        """Runs that need a driver and have had none (no lease) since `older_than`.

        A run whose job still waits in the queue (`queued(job_id)`) is left alone: under a
        backlog the watchdog must not pile up jobs. A job that started and died, or vanished,
        does not count: that is exactly the run to recover. A run held for a newer release
        (`store.held`) is no orphan: it waits, untouched, for a worker that reads it.
        """
        stale = [as_text(r) for r in self.redis.zrangebyscore(Keys.active(), "-inf", older_than)]
        held = held_runs(self.redis) if stale else set()
        found = []
        for run_id in stale:
            if run_id in held:
                continue
            try:
                lease, pending = Keys.lease(run_id), Keys.pending(run_id)
            except BadId:
                self.redis.zrem(Keys.active(), run_id)  # not ours to drive: never written by us
                continue
            job_id = self.redis.get(pending)
            if not self.redis.exists(lease) and not (job_id and queued(as_text(job_id))):
                found.append(run_id)
            self.redis.zadd(Keys.active(), {run_id: time.time()}, xx=True)  # don't report it again at once
        return found

    def unattended(self, run_id: str, queued: Callable[[str], bool]) -> bool:
        """Whether `run_id` needs a driver and has none: marked active, no lease, no job on its way
        (`queued(job_id)`, as `orphans` asks)."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.zscore(Keys.active(), run_id)
            pipe.exists(Keys.lease(run_id))
            pipe.get(Keys.pending(run_id))
            active, leased, job_id = pipe.execute()
        return active is not None and not leased and not (job_id and queued(as_text(job_id)))

    def heard_from(self, run_id: str, now: float) -> None:
        """`run_id`, marked active, was just handed a driver: no orphan for a lease period yet."""
        self.redis.zadd(Keys.active(), {run_id: now}, xx=True)

    def forget_active(self, run_id: str) -> None:
        self.redis.zrem(Keys.active(), run_id)

    # --- an operator's reads (`python -m workers status`) --------------------------------------

    def active(self) -> list[str]:
        """Every run marked active: queued, running, or parked with every decision in."""
        return [as_text(member) for member in self.redis.zrange(Keys.active(), 0, -1)]

    def leased(self, run_id: str) -> bool:
        """Whether a driver holds `run_id` now (its lease)."""
        return bool(self.redis.exists(Keys.lease(run_id)))

    def every(self, batch: int = 200, newer: NewerSeen | None = None) -> Iterator[RunRecord]:
        """Every run record the store holds (those of the last days: a SCAN, then one MGET per
        `batch` keys), skipping those that cannot be read; `newer` is told of each a newer release
        wrote (its run id, why, and what it shows of itself). An operator's read, not one to poll."""
        keys: list[bytes] = []
        for key in self.redis.scan_iter(match=Keys.all_runs(), count=batch):
            keys.append(key)
            if len(keys) >= batch:
                yield from self._records(keys, newer)
                keys = []
        yield from self._records(keys, newer)

    def _records(self, keys: list[bytes], newer: NewerSeen | None) -> Iterator[RunRecord]:
        if not keys:
            return
        for key, raw in zip(keys, self.redis.mget(keys), strict=True):
            if raw is None:
                continue
            try:
                yield RunRecord.from_json(unpack(raw))
            except NewerRecord as exc:
                if newer is not None:
                    newer(run_of_key(key), exc, peek(raw))
            except StateError:
                continue
