"""The Redis store: where runs are parked, decisions recorded and Slack retries absorbed.

Every key is built here, under `harness:`, from validated ids; every write takes an optional
`pipeline=` so callers can make several writes one atomic step. Check-and-set lives in small Lua
scripts that are safe to run twice (redis-py may retry a command whose reply was lost).
"""

from __future__ import annotations

import json
import re
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

import redis
from redis.client import Pipeline

from harness.state import Decision, RunState, StateError

PREFIX = "harness:"
RECORD_VERSION = 1
DAY = 24 * 3600
EVENT_TTL = DAY  # Slack retries for about 5 minutes; a day is plenty
THREAD_TTL = 30 * DAY
FINISHED_RUN_TTL = 7 * DAY

_ID = {
    "run": re.compile(r"^[0-9a-f]{32}$"),
    "team": re.compile(r"^[A-Z0-9_-]{1,32}$"),
    "channel": re.compile(r"^[A-Z0-9]{1,32}$"),
    "ts": re.compile(r"^\d{1,12}\.\d{1,9}$"),
    "event": re.compile(r"^[A-Za-z0-9_-]{1,64}$"),
    "call": re.compile(r"^[A-Za-z0-9_-]{1,128}$"),
}


class BadId(ValueError):
    """An id from outside (Slack, a button value) that does not have the shape we write."""


def check_id(kind: str, value: Any) -> str:
    """`value` if it is a well-formed id of `kind`, else `BadId`."""
    if not isinstance(value, str) or not _ID[kind].match(value):
        raise BadId(f"not a valid {kind} id: {value!r}"[:200])
    return value


_PACKED = b"z1:"  # zlib, level 1: conversations shrink 3-10x (tests/bench/bench_state.py)
_PACK_ABOVE = 1024


def pack(text: str) -> bytes:
    """What a record is stored as: JSON, zlib-compressed (and tagged) when that pays."""
    raw = text.encode()
    return _PACKED + zlib.compress(raw, 1) if len(raw) > _PACK_ABOVE else raw


def unpack(stored: bytes | str) -> str:
    """The JSON text of a stored record, compressed or not; garbage raises `StateError`."""
    data = stored.encode() if isinstance(stored, str) else stored
    try:
        if data.startswith(_PACKED):
            data = zlib.decompress(data[len(_PACKED) :])
        return data.decode()
    except (zlib.error, UnicodeDecodeError) as exc:
        raise StateError(f"stored record cannot be decoded ({exc}); refusing to use it") from None


def _text(value: Any) -> str:
    """A Redis reply as text (redis-py answers bytes unless decode_responses is set)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def new_run_id() -> str:
    return uuid.uuid4().hex


class Keys:
    """The one home of every key name."""

    @staticmethod
    def run(run_id: str) -> str:
        return f"{PREFIX}run:{check_id('run', run_id)}"

    @staticmethod
    def approvals(run_id: str) -> str:
        return f"{PREFIX}approvals:{check_id('run', run_id)}"

    @staticmethod
    def resume_claim(run_id: str, park_id: int) -> str:
        return f"{PREFIX}resume:{check_id('run', run_id)}:{int(park_id)}"

    @staticmethod
    def cards_done(run_id: str) -> str:
        return f"{PREFIX}cards:{check_id('run', run_id)}"

    @staticmethod
    def retry_claim(run_id: str, failure_ts: str) -> str:
        return f"{PREFIX}retry:{check_id('run', run_id)}:{check_id('ts', failure_ts)}"

    @staticmethod
    def event(team: str, event_id: str) -> str:
        return f"{PREFIX}event:{check_id('team', team)}:{check_id('event', event_id)}"

    @staticmethod
    def thread(team: str, channel: str, thread_ts: str) -> str:
        return f"{PREFIX}thread:{_thread_id(team, channel, thread_ts)}"

    @staticmethod
    def thread_lock(team: str, channel: str, thread_ts: str) -> str:
        return f"{PREFIX}lock:{_thread_id(team, channel, thread_ts)}"

    @staticmethod
    def thread_waiting(team: str, channel: str, thread_ts: str) -> str:
        return f"{PREFIX}waiting:{_thread_id(team, channel, thread_ts)}"

    @staticmethod
    def audit() -> str:
        return f"{PREFIX}audit"

    @staticmethod
    def lease(run_id: str) -> str:
        return f"{PREFIX}lease:{check_id('run', run_id)}"

    @staticmethod
    def active() -> str:
        return f"{PREFIX}active"


def _thread_id(team: str, channel: str, thread_ts: str) -> str:
    return f"{check_id('team', team)}:{check_id('channel', channel)}:{check_id('ts', thread_ts)}"


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass
class RunRecord:
    """A run as the Slack side knows it: where it talks, who asked, and its harness state."""

    run_id: str
    team: str
    channel: str
    thread_ts: str
    requester: str
    task: str
    status: RunStatus = RunStatus.QUEUED
    state: dict[str, Any] | None = None  # RunState.to_json(); None until the run starts
    cards: dict[str, str] = field(default_factory=dict)  # tool_use_id -> ts of its approval card
    park_id: int = 0  # increases every time the run parks; keys the resume claim
    expires_at: float | None = None
    failure_ts: str | None = None
    error: str | None = None
    created_at: float = field(default_factory=time.time)

    @property
    def thread(self) -> tuple[str, str, str]:
        return (self.team, self.channel, self.thread_ts)

    def audit_fields(self, call: Any = None) -> dict[str, Any]:
        """What the audit log keeps besides who decided and how: where, what, with which input."""
        return {
            "team": self.team,
            "channel": self.channel,
            "thread_ts": self.thread_ts,
            "requester": self.requester,
            "tool": getattr(call, "name", None),
            "input": getattr(call, "input", None),
        }

    def run_state(self) -> RunState:
        if self.state is None:
            raise StateError(f"run {self.run_id} has no harness state yet")
        return RunState.from_json(self.state)

    def to_json(self) -> str:
        data = asdict(self)
        data["status"] = self.status.value
        return json.dumps({"version": RECORD_VERSION, **data}, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str | bytes) -> RunRecord:
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise StateError(f"stored run record is not JSON ({exc}); refusing to use it") from None
        if not isinstance(data, dict) or data.pop("version", None) != RECORD_VERSION:
            raise StateError("stored run record has an unknown format version; refusing to use it")
        try:
            data["status"] = RunStatus(data["status"])
            return cls(**data)
        except (TypeError, ValueError, KeyError) as exc:
            raise StateError(f"stored run record is malformed ({exc!r}); refusing to use it") from None


class DecideOutcome(StrEnum):
    RECORDED = "recorded"  # this click decided the call
    TAKEN = "taken"  # someone (or the clock) decided it already
    UNKNOWN = "unknown"  # no such call awaits a decision in this run


@dataclass(frozen=True)
class DecideResult:
    outcome: DecideOutcome
    decision: Decision | None = None  # the decision that stands


# KEYS[1] approvals hash, KEYS[2] audit stream. ARGV[1] call id, ARGV[2] decision JSON,
# ARGV[3] audit entry JSON. A field holds "" while the call awaits a decision. The decision and
# its audit entry are written together; running the script twice gives the same answer.
_DECIDE = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then return {'unknown', ''} end
if current == '' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', '1000000', '*', 'entry', ARGV[3])
  return {'recorded', ARGV[2]}
end
if current == ARGV[2] then return {'recorded', current} end
return {'taken', current}
"""

# KEYS[1] approvals hash, KEYS[2] resume claim. ARGV[1] claim TTL, ARGV[2] claimer.
# Claims the resume once every call is decided; the same claimer asking again gets it again.
_CLAIM = """
local values = redis.call('HVALS', KEYS[1])
if #values == 0 then return 0 end
for _, v in ipairs(values) do if v == '' then return 0 end end
if redis.call('SET', KEYS[2], ARGV[2], 'NX', 'EX', ARGV[1]) then return 1 end
if redis.call('GET', KEYS[2]) == ARGV[2] then return 1 end
return 0
"""

# KEYS[1] thread lock, KEYS[2] waiting list. ARGV[1] run id, ARGV[2] lock TTL, ARGV[3] list TTL.
_TAKE_THREAD = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('EXPIRE', KEYS[1], ARGV[2]) return 1 end
if redis.call('LPOS', KEYS[2], ARGV[1]) == false then redis.call('RPUSH', KEYS[2], ARGV[1]) end
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 0
"""

# KEYS[1] thread lock, KEYS[2] waiting list. ARGV[1] run id.
_RELEASE_THREAD = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
redis.call('DEL', KEYS[1])
return redis.call('LPOP', KEYS[2])
"""

# KEYS[1] lease, KEYS[2] run record, KEYS[3] active set. ARGV[1] token, ARGV[2] lease ms,
# ARGV[3] record JSON, ARGV[4] record TTL s, ARGV[5] now, ARGV[6] run id, ARGV[7] "1" to finish.
# A fenced write: only the lease holder may write the run (a driver that lost its lease stops).
_CHECKPOINT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[4])
if ARGV[7] == '1' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[3], ARGV[6])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[6])
end
return 1
"""

# KEYS[1] lease, KEYS[2] active set. ARGV[1] token, ARGV[2] lease ms, ARGV[3] now, ARGV[4] run id.
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return 1
"""


class Store:
    """Runs, threads, decisions and dedup marks in Redis."""

    def __init__(self, connection: redis.Redis) -> None:
        self.redis = connection
        self._decide = connection.register_script(_DECIDE)
        self._claim = connection.register_script(_CLAIM)
        self._take = connection.register_script(_TAKE_THREAD)
        self._release = connection.register_script(_RELEASE_THREAD)
        self._checkpoint = connection.register_script(_CHECKPOINT)
        self._renew = connection.register_script(_RENEW)

    # --- mentions -------------------------------------------------------------------------------

    def accept_event(
        self, team: str, event_id: str, record: RunRecord, enqueue: Callable[[Pipeline], Any]
    ) -> bool:
        """Record a mention once: dedup mark, run record and job in one transaction.

        Returns False for a delivery seen before. Either all three are written or none is, so a
        crash in between leaves nothing behind that would swallow Slack's retry.
        """
        key = Keys.event(team, event_id)
        with self.redis.pipeline() as pipe:
            try:
                pipe.watch(key)
                if pipe.exists(key):
                    return False
                pipe.multi()
                pipe.set(key, record.run_id, ex=EVENT_TTL)
                self.save_run(record, pipeline=pipe)
                enqueue(pipe)
                pipe.execute()
            except redis.WatchError:
                return False  # a concurrent delivery of the same event won
        return True

    # --- runs -----------------------------------------------------------------------------------

    def load_run(self, run_id: str) -> RunRecord | None:
        raw = self.redis.get(Keys.run(run_id))
        return None if raw is None else RunRecord.from_json(unpack(raw))

    def save_run(
        self, record: RunRecord, *, ttl: int = FINISHED_RUN_TTL, pipeline: Pipeline | None = None
    ) -> None:
        (pipeline or self.redis).set(Keys.run(record.run_id), pack(record.to_json()), ex=ttl)

    def open_approvals(self, run_id: str, call_ids: list[str], ttl: int) -> None:
        """A fresh approvals hash: one empty field per call awaiting a decision."""
        key = Keys.approvals(run_id)
        with self.redis.pipeline() as pipe:
            pipe.delete(key, Keys.cards_done(run_id))
            pipe.hset(key, mapping={check_id("call", c): "" for c in call_ids})
            pipe.expire(key, ttl)
            pipe.execute()

    def park(self, record: RunRecord, call_ids: list[str], ttl: int) -> RunRecord:
        """Save a run awaiting decisions on `call_ids` (unfenced; drivers use their lease)."""
        record = replace(record, status=RunStatus.AWAITING_APPROVAL, park_id=record.park_id + 1)
        self.open_approvals(record.run_id, call_ids, ttl)
        self.save_run(record, ttl=ttl)
        return record

    def decide(
        self, run_id: str, call_id: str, decision: Decision, audit: dict[str, Any] | None = None
    ) -> DecideResult:
        """Record `decision` for a call unless it is unknown or already decided; atomic.

        The first recording also appends `audit` (who, what, arguments, when, outcome) to the
        append-only audit stream, in the same step.
        """
        payload = json.dumps(decision.to_json(), sort_keys=True)
        entry = {
            "at": time.time(),
            "run_id": run_id,
            "call_id": call_id,
            **decision.to_json(),
            **(audit or {}),
        }
        keys = [Keys.approvals(run_id), Keys.audit()]
        args = [check_id("call", call_id), payload, json.dumps(entry, ensure_ascii=False)]
        outcome, stored = self._decide(keys=keys, args=args)
        outcome = DecideOutcome(outcome.decode() if isinstance(outcome, bytes) else outcome)
        standing = Decision.from_json(json.loads(stored)) if stored else None
        return DecideResult(outcome, standing)

    def decisions(self, run_id: str) -> dict[str, Decision | None]:
        """Every call of the current park: its decision, or None while it still awaits one."""
        raw = self.redis.hgetall(Keys.approvals(run_id))
        return {_text(k): (Decision.from_json(json.loads(v)) if v else None) for k, v in raw.items()}

    def claim_resume(self, run_id: str, park_id: int, claimer: str, ttl: int = DAY) -> bool:
        """True for exactly one claimer once every call of park `park_id` is decided."""
        keys = [Keys.approvals(run_id), Keys.resume_claim(run_id, park_id)]
        return bool(self._claim(keys=keys, args=[ttl, claimer]))

    def clear_approvals(self, run_id: str, pipeline: Pipeline | None = None) -> None:
        (pipeline or self.redis).delete(Keys.approvals(run_id), Keys.cards_done(run_id))

    def first_card_update(self, run_id: str, call_id: str, ttl: int = DAY) -> bool:
        """True once per call: whoever gets it updates the call's card after its decision."""
        key = Keys.cards_done(run_id)
        with self.redis.pipeline() as pipe:
            pipe.sadd(key, check_id("call", call_id))
            pipe.expire(key, ttl)
            added, _ = pipe.execute()
        return bool(added)

    def unclaim_retry(self, run_id: str, failure_ts: str) -> None:
        if failure_ts:
            self.redis.delete(Keys.retry_claim(run_id, failure_ts))

    def claim_retry(self, run_id: str, failure_ts: str) -> bool:
        """True for exactly one Retry click of one failure."""
        return bool(self.redis.set(Keys.retry_claim(run_id, failure_ts), "1", nx=True, ex=DAY))

    # --- threads --------------------------------------------------------------------------------

    def load_history(self, team: str, channel: str, thread_ts: str) -> tuple[dict[str, Any], ...]:
        raw = self.redis.get(Keys.thread(team, channel, thread_ts))
        if raw is None:
            return ()
        try:
            data = json.loads(unpack(raw))
        except ValueError as exc:
            raise StateError(f"stored thread is unreadable ({exc}); refusing to use it") from None
        if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
            raise StateError("stored thread has an unknown format version; refusing to use it")
        return tuple(data["messages"])

    def save_history(
        self, team: str, channel: str, thread_ts: str, messages: tuple[dict[str, Any], ...]
    ) -> None:
        payload = json.dumps({"version": RECORD_VERSION, "messages": list(messages)}, ensure_ascii=False)
        self.redis.set(Keys.thread(team, channel, thread_ts), pack(payload), ex=THREAD_TTL)

    def take_thread(self, record: RunRecord, ttl: int) -> bool:
        """Make `record` the active run of its thread, or queue it behind the one that is; atomic."""
        keys = [Keys.thread_lock(*record.thread), Keys.thread_waiting(*record.thread)]
        return bool(self._take(keys=keys, args=[record.run_id, ttl, THREAD_TTL]))

    def release_thread(self, record: RunRecord) -> str | None:
        """Free the thread if `record` holds it; returns the next queued run id, if any."""
        keys = [Keys.thread_lock(*record.thread), Keys.thread_waiting(*record.thread)]
        nxt = self._release(keys=keys, args=[record.run_id])
        return _text(nxt) if nxt else None

    def thread_holder(self, record: RunRecord) -> str | None:
        raw = self.redis.get(Keys.thread_lock(*record.thread))
        return _text(raw) if raw else None

    # --- leases: exactly one driver per run, and orphans noticed -------------------------------

    def acquire_lease(self, run_id: str, token: str, seconds: float) -> bool:
        """Become the one driver of `run_id` for `seconds` (renewed by checkpoints and heartbeats)."""
        if not self.redis.set(Keys.lease(run_id), token, nx=True, px=int(seconds * 1000)):
            return False
        self.redis.zadd(Keys.active(), {run_id: time.time()})
        return True

    def renew_lease(self, run_id: str, token: str, seconds: float) -> bool:
        keys = [Keys.lease(run_id), Keys.active()]
        return bool(self._renew(keys=keys, args=[token, int(seconds * 1000), time.time(), run_id]))

    def checkpoint(
        self,
        record: RunRecord,
        token: str,
        seconds: float,
        *,
        ttl: int = FINISHED_RUN_TTL,
        finish: bool = False,
    ) -> bool:
        """Save `record` if `token` still holds its lease (renewing it); `finish` also lets go."""
        keys = [Keys.lease(record.run_id), Keys.run(record.run_id), Keys.active()]
        args: list[Any] = [
            token,
            int(seconds * 1000),
            pack(record.to_json()),
            ttl,
            time.time(),
            record.run_id,
            "1" if finish else "0",
        ]
        return bool(self._checkpoint(keys=keys, args=args))

    def release_lease(self, run_id: str, token: str) -> None:
        script = "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end return 0"
        self.redis.eval(script, 1, Keys.lease(run_id), token)

    def orphans(self, older_than: float) -> list[str]:
        """Runs marked active whose driver has not been heard from since `older_than` and holds no lease."""
        stale = [_text(r) for r in self.redis.zrangebyscore(Keys.active(), "-inf", older_than)]
        found = []
        for run_id in stale:
            if not self.redis.exists(Keys.lease(run_id)):
                found.append(run_id)
            self.redis.zadd(Keys.active(), {run_id: time.time()}, xx=True)  # don't report it again at once
        return found

    def forget_active(self, run_id: str) -> None:
        self.redis.zrem(Keys.active(), run_id)

    def audit_entries(self, count: int = 100) -> list[dict[str, Any]]:
        """The newest `count` audit entries, oldest first."""
        rows: list[Any] = self.redis.xrevrange(Keys.audit(), count=count) or []
        return [json.loads(fields[b"entry"]) for _, fields in reversed(rows)]
