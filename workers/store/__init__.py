"""The Redis store: where runs are parked, decisions recorded and Slack retries absorbed.

Every key is built here, under `harness:`, from validated ids; every write takes an optional
`pipeline=` so callers can make several writes one atomic step. Check-and-set lives in small Lua
scripts that are safe to run twice (redis-py may retry a command whose reply was lost).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

import redis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from harness.state import Decision, RunState, StateError, Verdict

log = logging.getLogger(__name__)

PREFIX = "harness:"
RECORD_VERSION = 2  # 2: per-park approvals, the outbox
HISTORY_VERSION = 1
DAY = 24 * 3600
EVENT_TTL = DAY  # Slack retries for about 5 minutes; a day is plenty
THREAD_TTL = 30 * DAY
FINISHED_RUN_TTL = 7 * DAY
PENDING_TTL = 3600  # a queued job normally starts in well under this; past it the watchdog looks again
RUN_COUNT_HORIZON = 3 * DAY  # a run older than this no longer counts against its requester's bound
AUDIT_MAX_ENTRIES = 100_000
AUDIT_MAX_AGE = 90 * DAY
AUDIT_PREVIEW_CHARS = 500
FEEDBACK_MAX_ENTRIES = 100_000
FEEDBACK_PER_MINUTE = 10  # feedback clicks of one person recorded per minute, over every answer
EXPIRES_FIELD = "~expires"  # never a call id: those are [A-Za-z0-9_-]
LIMIT_CALL = "limit"  # the one "call" of a park at a limit (on_limit = "ask"); tool_use ids are toolu_…
IM = "im"  # RunRecord.surface of a run asked for in a direct message (or the assistant pane)
GROUP_TTL = 60  # seconds a user group's members are trusted before they are read from Slack again

_ID = {
    "run": re.compile(r"^[0-9a-f]{32}$"),
    "team": re.compile(r"^[A-Z0-9_-]{1,32}$"),
    "channel": re.compile(r"^[A-Z0-9]{1,32}$"),
    "ts": re.compile(r"^[0-9]{1,12}\.[0-9]{1,9}$"),
    "event": re.compile(r"^[A-Za-z0-9_-]{1,64}$"),
    "call": re.compile(r"^[A-Za-z0-9_-]{1,128}$"),
    "user": re.compile(r"^[A-Z][A-Z0-9]{1,31}$"),
    "tool": re.compile(r"^[A-Za-z0-9_-]{1,128}$"),
    "fingerprint": re.compile(r"^[0-9a-f]{16}$"),
    "group": re.compile(r"^S[A-Z0-9]{1,31}$"),
}


class BadId(ValueError):
    """An id from outside (Slack, a button value) that does not have the shape we write."""


def check_id(kind: str, value: Any) -> str:
    """`value` if it is a well-formed id of `kind`, else `BadId`."""
    if not isinstance(value, str) or not _ID[kind].fullmatch(value):
        raise BadId(f"not a valid {kind} id: {value!r}"[:200])
    return value


_PACKED = b"z1:"  # zlib, level 1: conversations shrink 3-10x (tests/bench/bench_state.py)
_SPLIT = b"z2:"  # zlib of the conversation first, then the rest of the record (`RecordEncoder`)
_PACK_ABOVE = 1024
_LEVEL = 1


def pack(text: str) -> bytes:
    """What a record is stored as: JSON, zlib-compressed (and tagged) when that pays."""
    raw = text.encode()
    return _PACKED + zlib.compress(raw, _LEVEL) if len(raw) > _PACK_ABOVE else raw


def unpack(stored: bytes | str) -> str:
    """The JSON text of a stored record, compressed or not; garbage raises `StateError`."""
    data = stored.encode() if isinstance(stored, str) else stored
    try:
        if data.startswith(_PACKED):
            data = zlib.decompress(data[len(_PACKED) :])
        elif data.startswith(_SPLIT):
            messages, newline, rest = zlib.decompress(data[len(_SPLIT) :]).partition(b"\n")
            if not newline:
                raise zlib.error("no end to its conversation")
            data = rest + messages + b"}}"  # the messages close the state, which closes the record
        return data.decode()
    except (zlib.error, UnicodeDecodeError) as exc:
        raise StateError(f"stored record cannot be decoded ({exc}); refusing to use it") from None


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class RecordEncoder:
    """Packs the records of one run save after save, encoding and compressing each message of its
    conversation once instead of the whole conversation on every save.

    A record is mostly its conversation, which only grows: `pack` re-encoded it to JSON and
    re-compressed it all on every save, twice a tool turn, so a worker's cost per turn grew with
    the conversation faster than the model request's own encoding (tests/bench/bench_overhead.py).
    Here a zlib compressor keeps the messages already seen; a save copies it and compresses only
    the messages after them and the rest of the record.

    Stored as `z2:` and zlib of `M "\n" R`: M is the JSON array of the messages, R the record's
    JSON up to where they go (the state last in the record, the messages last in the state), so the
    record's JSON is `R M "}}"` (`unpack`). JSON as `json.dumps` writes it has no raw newline.

    A message is recognised by identity: the harness never changes one in place (it builds new
    messages, as a `pause_turn` merge replaces the last one). Any other sequence (an older state,
    cleared results) starts the compressor again. The last message is kept out of the compressor
    until another follows it, since it is the one that may be replaced.
    """

    def __init__(self) -> None:
        self._restart()

    def _restart(self) -> None:
        self._kept: list[dict[str, Any]] = []  # the messages in the compressor, in order
        self._compressor = zlib.compressobj(_LEVEL)
        self._out = bytearray(_SPLIT)  # what the compressor gave out so far
        self._last: tuple[Any, bytes] | None = None  # the last message and its JSON, from the last save

    def encode(self, record: RunRecord) -> bytes:
        fields_ = record.json_fields()
        state = fields_.pop("state")
        messages = state.get("messages") if isinstance(state, dict) else None
        if not isinstance(messages, list) or not messages:
            return pack(_dumps({**fields_, "state": state}))
        kept = self._kept
        if len(messages) <= len(kept) or any(m is not k for m, k in zip(messages, kept, strict=False)):
            self._restart()
            kept = self._kept
        for message in messages[len(kept) : -1]:
            self._out += self._compressor.compress((b"," if kept else b"[") + self._json(message))
            kept.append(message)
        rest = {k: v for k, v in state.items() if k != "messages"}
        tail = b"".join(
            (
                b"," if kept else b"[",
                self._json(messages[-1], last=True),
                b"]\n",
                _dumps(fields_)[:-1].encode(),
                b',"state":',
                _dumps(rest)[:-1].encode(),
                b"," if rest else b"",
                b'"messages":',
            )
        )
        compressor = self._compressor.copy()
        return bytes(self._out) + compressor.compress(tail) + compressor.flush()

    def _json(self, message: Any, *, last: bool = False) -> bytes:
        if self._last is not None and self._last[0] is message:
            text = self._last[1]
        else:
            text = _dumps(message).encode()
        self._last = (message, text) if last else None
        return text


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
    def approvals(run_id: str, park_id: int) -> str:
        """One hash per park: a new park never touches (or wipes) an older park's decisions."""
        return f"{PREFIX}approvals:{check_id('run', run_id)}:{int(park_id)}"

    @staticmethod
    def cards_done(run_id: str, park_id: int) -> str:
        return f"{PREFIX}cards:{check_id('run', run_id)}:{int(park_id)}"

    @staticmethod
    def retry_claim(run_id: str, failure_ts: str) -> str:
        return f"{PREFIX}retry:{check_id('run', run_id)}:{check_id('ts', failure_ts)}"

    @staticmethod
    def event(team: str, event_id: str) -> str:
        return f"{PREFIX}event:{check_id('team', team)}:{check_id('event', event_id)}"

    @staticmethod
    def history(team: str, channel: str, thread_ts: str) -> str:
        """The thread's conversation (a hash: `data`, and `seq`, the count of runs that saved it)."""
        return f"{PREFIX}history:{_thread_id(team, channel, thread_ts)}"

    @staticmethod
    def thread_lock(team: str, channel: str, thread_ts: str) -> str:
        return f"{PREFIX}lock:{_thread_id(team, channel, thread_ts)}"

    @staticmethod
    def thread_waiting(team: str, channel: str, thread_ts: str) -> str:
        return f"{PREFIX}waiting:{_thread_id(team, channel, thread_ts)}"

    @staticmethod
    def user_runs(team: str, user: str) -> str:
        return f"{PREFIX}runs:user:{check_id('team', team)}:{check_id('user', user)}"

    @staticmethod
    def channel_runs(team: str, channel: str) -> str:
        return f"{PREFIX}runs:channel:{check_id('team', team)}:{check_id('channel', channel)}"

    @staticmethod
    def busy_notice(team: str, user: str) -> str:
        return f"{PREFIX}busy:{check_id('team', team)}:{check_id('user', user)}"

    @staticmethod
    def audit() -> str:
        return f"{PREFIX}audit"

    @staticmethod
    def feedback() -> str:
        """The answers' feedback stream: apart from the decisions' audit, with its own bounds."""
        return f"{PREFIX}feedback"

    @staticmethod
    def feedback_rate(team: str, user: str) -> str:
        """How many feedback clicks of a person were recorded in the current minute."""
        return f"{PREFIX}feedback:rate:{check_id('team', team)}:{check_id('user', user)}"

    @staticmethod
    def feedback_given(run_id: str, user: str) -> str:
        """A person's standing feedback on one answer (good or bad): the same click again is not news."""
        return f"{PREFIX}feedback:given:{check_id('run', run_id)}:{check_id('user', user)}"

    @staticmethod
    def lease(run_id: str) -> str:
        return f"{PREFIX}lease:{check_id('run', run_id)}"

    @staticmethod
    def pending(run_id: str) -> str:
        """Set while a job for the run waits in the queue: the watchdog leaves such a run alone."""
        return f"{PREFIX}pending:{check_id('run', run_id)}"

    @staticmethod
    def active() -> str:
        """Runs that need a driver now (score: when one was last heard from)."""
        return f"{PREFIX}active"

    @staticmethod
    def expiries() -> str:
        """Parks awaiting decisions (member `run:park`, score: when they expire)."""
        return f"{PREFIX}expiries"

    @staticmethod
    def grant(team: str, channel: str, thread_ts: str, tool: str) -> str:
        """An "Approve for this thread" grant of one tool (expires with the grant)."""
        return f"{PREFIX}grant:{_thread_id(team, channel, thread_ts)}:{check_id('tool', tool)}"

    @staticmethod
    def group_members(team: str, group: str) -> str:
        """The members of a user group as `usergroups.users.list` gave them (a short-lived cache)."""
        return f"{PREFIX}group:{check_id('team', team)}:{check_id('group', group)}"

    @staticmethod
    def team_parks(team: str) -> str:
        """The team's open parks (member `run:park`, score: when it expires): the Home tab's index
        for approvers and `escalate_to`, kept with `expiries` by the scripts that park and resume."""
        return f"{PREFIX}parks:team:{check_id('team', team)}"

    @staticmethod
    def user_parks(team: str, user: str) -> str:
        """The open parks of the runs `user` asked for (as `team_parks`): the requester's Home tab."""
        return f"{PREFIX}parks:user:{check_id('team', team)}:{check_id('user', user)}"

    @staticmethod
    def escalations() -> str:
        """Parks due a reminder to `escalate_to` (member `run:park`, score: when it is due)."""
        return f"{PREFIX}escalations"

    @staticmethod
    def stream(run_id: str, key: str) -> str:
        """The ts of a run's answer while it streams (a successor closes a stream left open)."""
        return f"{PREFIX}stream:{check_id('run', run_id)}:{int(key)}"

    @staticmethod
    def stop_request(run_id: str) -> str:
        """Someone asked the run to stop (the value: who); its driver stops before its next step."""
        return f"{PREFIX}stop:{check_id('run', run_id)}"


def _thread_id(team: str, channel: str, thread_ts: str) -> str:
    return f"{check_id('team', team)}:{check_id('channel', channel)}:{check_id('ts', thread_ts)}"


@dataclass(frozen=True)
class Grant:
    """ "Approve for this thread": `by` let later `ask` calls of `tool` by `requester` run until `until`."""

    key: str
    tool: str
    by: str
    requester: str
    until: float
    run_id: str = ""

    @property
    def seconds(self) -> float:
        return self.until - time.time()

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "tool": self.tool,
            "by": self.by,
            "requester": self.requester,
            "until": self.until,
            "run_id": self.run_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Grant:
        return cls(
            key=str(data["key"]),
            tool=str(data["tool"]),
            by=str(data["by"]),
            requester=str(data["requester"]),
            until=float(data["until"]),
            run_id=str(data.get("run_id", "")),
        )


@dataclass(frozen=True)
class OpenPark:
    """A park in the Home tab's index: its run, its number, when it expires."""

    run_id: str
    park_id: int
    expires_at: float


ParkRead = tuple["RunRecord | None", dict[str, Decision | None]]  # a park's record and decisions


def _park_indexes(record: RunRecord) -> tuple[str, str]:
    """The Home tab's index keys a park of `record` is kept in: its team's and its requester's."""
    return Keys.team_parks(record.team), Keys.user_parks(record.team, record.requester)


def _park_member(member: Any) -> tuple[str, int]:
    """(run id, park id) of a `run:park` member of the expiries or escalations set."""
    run_id, _, park = _text(member).partition(":")
    return run_id, int(park) if park.isdigit() else 0


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"


ENDED = (RunStatus.FINISHED, RunStatus.STOPPED, RunStatus.FAILED)


@dataclass
class RunRecord:
    """A run as the Slack side knows it: where it talks, who asked, its harness state, what it owes Slack."""

    run_id: str
    team: str
    channel: str
    thread_ts: str
    requester: str
    task: str
    status: RunStatus = RunStatus.QUEUED
    state: dict[str, Any] | None = None  # RunState.to_json(); None until the run starts
    cards: dict[str, str] = field(default_factory=dict)  # tool_use_id -> ts of its approval card
    park_id: int = 0  # increases every time the run parks; keys the park's approvals
    expires_at: float | None = None
    failure_ts: str | None = None
    error: str | None = None
    created_at: float = field(default_factory=time.time)
    # The transactional outbox: messages the run owes Slack, saved in the same write as the state
    # that owes them, removed once delivered (see workers.delivery).
    outbox: list[dict[str, Any]] = field(default_factory=list)
    posted: int = 0  # how many posts the run has queued so far: keys its messages for reconciliation
    recoveries: int = 0  # how often the watchdog re-drove it after its driver died
    history_seq: int = 0  # the thread history's `seq` this run continued; its save is refused if it moved on
    # For each parked call: what its card and the edit modal need of its tool (schema, own tier,
    # title, annotations) and of the reply (the model's words, a preview), kept from the park.
    call_tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    working_ts: str | None = None  # the "Working on it…" message that carries the Stop button
    stopped_by: str | None = None  # who pressed Stop, once the run ended because of it
    surface: str = "channel"  # where it was asked for: "channel" (a mention) or IM (a direct message)
    asked_ts: str | None = None  # the message that asked (it carries the :eyes:); None: thread_ts
    # What Slack shows of the run (workers.thread_status): per status method, the status it last
    # showed, or "refused" once Slack refused it for this run (then it is not called again).
    status_shown: dict[str, str] = field(default_factory=dict)

    @property
    def thread(self) -> tuple[str, str, str]:
        return (self.team, self.channel, self.thread_ts)

    def audit_fields(self, call: Any = None) -> dict[str, Any]:
        """What the audit log keeps besides who decided and how: where, what, the input's hash and preview."""
        raw_input = getattr(call, "input", None)
        text = json.dumps(raw_input, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        preview = text if len(text) <= AUDIT_PREVIEW_CHARS else text[:AUDIT_PREVIEW_CHARS] + "…"
        return {
            "team": self.team,
            "channel": self.channel,
            "thread_ts": self.thread_ts,
            "requester": self.requester,
            "tool": getattr(call, "name", None),
            "input_sha256": hashlib.sha256(text.encode("utf-8", "replace")).hexdigest(),
            "input_chars": len(text),
            "input_preview": preview,
            "tier_why": getattr(call, "why", "") or "",  # the policy step, key or rule that asked
            "fingerprint": getattr(call, "fingerprint", None),
        }

    def run_state(self) -> RunState:
        if self.state is None:
            raise StateError(f"run {self.run_id} has no harness state yet")
        return RunState.from_json(self.state)

    def to_json(self) -> str:
        return _dumps(self.json_fields())

    def json_fields(self) -> dict[str, Any]:
        """What `to_json` writes: the version and every field, as JSON values."""
        # Shallow: every field already holds JSON values, and `asdict` deep-copied the whole
        # conversation on every checkpoint (most of a worker's own cost per turn).
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["status"] = self.status.value
        return {"version": RECORD_VERSION, **data}

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


class Accepted(StrEnum):
    """What became of a mention delivered to the bot."""

    NEW = "new"  # a run was recorded and its job enqueued
    DUPLICATE = "duplicate"  # Slack delivered it before
    USER_BUSY = "user_busy"  # the requester already has their share of runs going
    CHANNEL_BUSY = "channel_busy"  # the channel already has its share of runs going


@dataclass(frozen=True)
class QueuedJob:
    """An RQ job as RQ writes it when it enqueues one: its hash, its id pushed on its queue, the
    queue named in RQ's set of queues. Built by RQ itself (`workers.services.queued_job`), so a
    stock `rq` worker takes it like any other; written by a script of ours, as RQ's own unique
    enqueue writes a job from a Lua script."""

    job_id: str
    key: str
    queue_key: str
    queues_key: str
    fields: tuple[str | bytes, ...]  # field, value, field, value, ...


class DecideOutcome(StrEnum):
    RECORDED = "recorded"  # this click decided the call
    TAKEN = "taken"  # someone (or the clock) decided it already
    EXPIRED = "expired"  # the click came after the park expired: the call is now expired
    UNKNOWN = "unknown"  # no such call awaits a decision in this park
    COUNTED = "counted"  # an approval counted towards the quorum; more are needed
    STALE = "stale"  # the click was made on another version of the call: nothing recorded


@dataclass(frozen=True)
class DecideResult:
    outcome: DecideOutcome
    decision: Decision | None = None  # the decision that stands
    votes: tuple[str, ...] = ()  # COUNTED: who has approved so far


def _decisions(raw: dict[Any, Any]) -> dict[str, Decision | None]:
    """A park's approvals hash as call id -> decision (None while it awaits one)."""
    return {
        _text(k): (Decision.from_json(json.loads(v)) if v else None)
        for k, v in raw.items()
        if not _text(k).startswith("~")
    }


@dataclass(frozen=True)
class ParkView:
    """What a resume reads of a park: who pressed Stop, every call's decision, the cards already updated."""

    stop_by: str | None
    decisions: dict[str, Decision | None]
    cards_updated: set[str]


@dataclass(frozen=True)
class Beside:
    """A write sent in the round trip of a run's next save: a Lua script that is idempotent (it
    may be sent again after Redis lost its scripts). Its failure is logged, never the save's."""

    what: str  # what it records, for the log
    script: str
    keys: tuple[str, ...]
    args: tuple[Any, ...]


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


# Lua helper: true when every call field of a park's approvals hash holds a decision.
_ALL_DECIDED = """
local function all_decided(key)
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then return false end
  for i = 1, #flat, 2 do
    if string.sub(flat[i], 1, 1) ~= '~' and flat[i + 1] == '' then return false end
  end
  return true
end
"""

# KEYS[1] approvals hash, KEYS[2] audit stream, KEYS[3] active set, KEYS[4] grant key. ARGV[1] call
# id, ARGV[2] decision JSON, ARGV[3] audit entry JSON, ARGV[4] now, ARGV[5] expired decision JSON,
# ARGV[6] expired audit entry JSON, ARGV[7] run id, ARGV[8] audit max length, ARGV[9] oldest audit
# id kept, ARGV[10] the fingerprint the click was made on ('*': not checked), ARGV[11] approvals
# required, ARGV[12] the voter of an approval that counts towards a quorum ('' otherwise),
# ARGV[13] grant JSON ('' none), ARGV[14] grant TTL s.
# A field holds "" while the call awaits a decision. A click on another version of the call
# (`~fp:<call>` differs) records nothing. A click at or after the park's expiry records the expiry
# instead. With a quorum, approvals gather in `~votes:<call>` (one per person) until enough.
# The decision, its audit entry and its grant are written together, and the park that this
# decision completes is marked active in the same step, so whatever recovers orphaned runs finds it
# even if the resume job dies. Running the script twice gives the same answer.
_DECIDE = (
    _ALL_DECIDED
    + """
local function audit(entry)
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[8], '*', 'entry', entry)
  redis.call('XTRIM', KEYS[2], 'MINID', '~', ARGV[9])
end
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then return {'unknown', ''} end
if current ~= '' then
  if current == ARGV[2] then return {'recorded', current} end
  return {'taken', current}
end
local expires = tonumber(redis.call('HGET', KEYS[1], '~expires') or '0')
local expired = expires > 0 and tonumber(ARGV[4]) >= expires
if not expired and ARGV[10] ~= '*' then
  local fp = redis.call('HGET', KEYS[1], '~fp:' .. ARGV[1])
  if fp and fp ~= ARGV[10] then return {'stale', ''} end
end
local decision, entry, outcome = ARGV[2], ARGV[3], 'recorded'
if expired then
  decision, entry, outcome = ARGV[5], ARGV[6], 'expired'
elseif ARGV[12] ~= '' then
  local field = '~votes:' .. ARGV[1]
  local votes = redis.call('HGET', KEYS[1], field) or ''
  local list = {}
  for voter in string.gmatch(votes, '[^,]+') do
    if voter == ARGV[12] then return {'counted', votes} end
    table.insert(list, voter)
  end
  table.insert(list, ARGV[12])
  votes = table.concat(list, ',')
  redis.call('HSET', KEYS[1], field, votes)
  local e = cjson.decode(entry)
  e['approvers'] = list
  if #list < tonumber(ARGV[11]) then
    e['verdict'] = 'approval_counted'
    e['count'] = #list
    e['required'] = tonumber(ARGV[11])
    audit(cjson.encode(e))
    return {'counted', votes}
  end
  local d = cjson.decode(decision)
  d['approvers'] = list
  decision, entry = cjson.encode(d), cjson.encode(e)
end
redis.call('HSET', KEYS[1], ARGV[1], decision)
audit(entry)
if outcome == 'recorded' and ARGV[13] ~= '' then
  redis.call('SET', KEYS[4], ARGV[13], 'EX', ARGV[14])
end
if all_decided(KEYS[1]) then redis.call('ZADD', KEYS[3], ARGV[4], ARGV[7]) end
return {outcome, decision}
"""
)

# KEYS[1] thread lock, KEYS[2] waiting list. ARGV[1] run id, ARGV[2] lock TTL, ARGV[3] list TTL,
# ARGV[4] "1" to queue behind the holder when the thread is taken.
_TAKE_THREAD = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('EXPIRE', KEYS[1], ARGV[2]) return 1 end
if ARGV[4] ~= '1' then return 0 end
if redis.call('LPOS', KEYS[2], ARGV[1]) == false then redis.call('RPUSH', KEYS[2], ARGV[1]) end
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 0
"""

# `_TAKE_THREAD` for a resumed run, its park forgotten first: KEYS[3..] expiries and the Home tab's
# indexes (team's, requester's), ARGV[5] the park's member there. Idempotent, as a write beside a
# save must be.
_RESUME_THREAD = "for i = 3, #KEYS do redis.call('ZREM', KEYS[i], ARGV[5]) end\n" + _TAKE_THREAD

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

# KEYS[1] lease, KEYS[2] run record, KEYS[3] active set, KEYS[4] approvals hash, KEYS[5] expiries,
# KEYS[6] thread lock, KEYS[7] the team's parks, KEYS[8] the requester's parks. ARGV[1] token,
# ARGV[2] lease ms, ARGV[3] record, ARGV[4] TTL s, ARGV[5] now, ARGV[6] run id, ARGV[7] expires at,
# ARGV[8] expiry member, ARGV[9..] pairs: call id, fingerprint.
# Parking is one fenced step: the record awaiting decisions (with the cards it owes in its outbox),
# one empty field per call, the expiry scheduled, the park in the Home tab's indexes (whose expired
# members go, and which live as long as their newest park), the thread kept. HSETNX: replayed, it
# never wipes a decision recorded in between.
_PARK = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[4])
for i = 9, #ARGV, 2 do
  redis.call('HSETNX', KEYS[4], ARGV[i], '')
  if ARGV[i + 1] ~= '' then redis.call('HSETNX', KEYS[4], '~fp:' .. ARGV[i], ARGV[i + 1]) end
end
redis.call('HSETNX', KEYS[4], '~expires', ARGV[7])
redis.call('EXPIRE', KEYS[4], ARGV[4])
redis.call('ZADD', KEYS[5], ARGV[7], ARGV[8])
for i = 7, 8 do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', ARGV[5])
  redis.call('ZADD', KEYS[i], ARGV[7], ARGV[8])
  if redis.call('TTL', KEYS[i]) < tonumber(ARGV[4]) then redis.call('EXPIRE', KEYS[i], ARGV[4]) end
end
if redis.call('GET', KEYS[6]) == ARGV[6] then redis.call('EXPIRE', KEYS[6], ARGV[4]) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[6])
return 1
"""

# KEYS[1] lease, KEYS[2] run record, KEYS[3] active set, KEYS[4] approvals hash, KEYS[5] stop
# request. ARGV[1] token, ARGV[2] record, ARGV[3] TTL s, ARGV[4] run id, ARGV[5] lease ms.
# After its cards are posted, a parked run lets go of its driver, unless every decision is already
# in (a quick click) or someone pressed Stop: then the driver keeps the lease and goes on at once.
# Atomic with the decide and stop scripts, so a decision or a Stop lands either before (ready) or
# after (it marks the run active itself, and its job finds the run parked).
_SETTLE = (
    _ALL_DECIDED
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 'lost' end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
if all_decided(KEYS[4]) or redis.call('EXISTS', KEYS[5]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return 'ready'
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[4])
return 'parked'
"""
)

# KEYS[1] lease, KEYS[2] run record, KEYS[3] active set, KEYS[4] thread lock, KEYS[5] waiting list,
# KEYS[6] requester's runs, KEYS[7] channel's runs, KEYS[8] thread history. ARGV[1] token,
# ARGV[2] record, ARGV[3] TTL s, ARGV[4] run id, ARGV[5] now, ARGV[6] history ('' for none),
# ARGV[7] the history seq the run continued, ARGV[8] history TTL s.
# The end of a run, in one fenced step: its record, the thread's history (only if no newer run saved
# one since this run began), the thread handed to the next run (marked active, so it is started even
# if the enqueue is lost), and the run no longer counted or driven.
_FINISH = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0, '', 0} end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
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

# KEYS[1] lease, KEYS[2] active set, KEYS[3] waiting list. ARGV[1] token, ARGV[2] run id.
# A run queued behind another in its thread lets go: no driver until the thread is handed to it
# (unless that already happened, in which case it stays active).
_LEAVE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
if redis.call('LPOS', KEYS[3], ARGV[2]) ~= false then redis.call('ZREM', KEYS[2], ARGV[2]) end
return 1
"""

# KEYS[1] lease, KEYS[2] active set. ARGV[1] token, ARGV[2] lease ms, ARGV[3] now, ARGV[4] run id.
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return 1
"""

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

# KEYS[1] the event's dedup mark, KEYS[2] the requester's runs, KEYS[3] the channel's runs, KEYS[4]
# the run record, KEYS[5] active runs, KEYS[6] the run's pending mark, KEYS[7] the job's hash,
# KEYS[8] its queue, KEYS[9] RQ's set of queues, KEYS[10] the metrics' counters. ARGV[1] run id,
# ARGV[2] mark TTL, ARGV[3] the horizon of the counts, ARGV[4] max per user, ARGV[5] max per
# channel, ARGV[6] created_at, ARGV[7] counts TTL, ARGV[8] record, ARGV[9] record TTL, ARGV[10] now,
# ARGV[11] job id, ARGV[12] pending TTL, ARGV[13..16] the counter field of each outcome (new,
# duplicate, user_busy, channel_busy; "": not counted), ARGV[17...] the job hash's fields and values.
# Every check comes before any write. Run twice (redis-py sends a command again when its reply was
# lost), it answers "new" again and writes nothing more.
_ACCEPT = """
local counted = {new = ARGV[13], duplicate = ARGV[14], user_busy = ARGV[15], channel_busy = ARGV[16]}
local function outcome(name)
  if counted[name] ~= '' then redis.call('HINCRBY', KEYS[10], counted[name], 1) end
  return name
end
local mark = redis.call('GET', KEYS[1])
if mark then
  if mark == ARGV[1] then return 'new' end
  return outcome('duplicate')
end
local busy = nil
if redis.call('ZCOUNT', KEYS[2], ARGV[3], '+inf') >= tonumber(ARGV[4]) then
  busy = 'user_busy'
elseif redis.call('ZCOUNT', KEYS[3], ARGV[3], '+inf') >= tonumber(ARGV[5]) then
  busy = 'channel_busy'
end
if busy then
  redis.call('SET', KEYS[1], busy, 'EX', ARGV[2])
  return outcome(busy)
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
for i = 2, 3 do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', ARGV[3])
  redis.call('ZADD', KEYS[i], ARGV[6], ARGV[1])
  redis.call('EXPIRE', KEYS[i], ARGV[7])
end
redis.call('SET', KEYS[4], ARGV[8], 'EX', ARGV[9])
redis.call('ZADD', KEYS[5], ARGV[10], ARGV[1])
redis.call('SET', KEYS[6], ARGV[11], 'EX', ARGV[12])
redis.call('HSET', KEYS[7], unpack(ARGV, 17))
redis.call('RPUSH', KEYS[8], ARGV[11])
redis.call('SADD', KEYS[9], KEYS[8])
return outcome('new')
"""

# KEYS[1] feedback stream, KEYS[2] the person's count this minute, KEYS[3] their standing feedback
# on the answer. ARGV[1] entry JSON, ARGV[2] good/bad, ARGV[3] most a person may give a minute,
# ARGV[4] that minute in s, ARGV[5] stream max length, ARGV[6] oldest id kept, ARGV[7] standing TTL s.
# The same feedback again on the same answer adds nothing (a double click, a replay, redis-py
# sending the script again); past the person's share of the minute nothing is written either.
_FEEDBACK = """
if redis.call('GET', KEYS[3]) == ARGV[2] then return 'same' end
local n = redis.call('INCR', KEYS[2])
if n == 1 then redis.call('EXPIRE', KEYS[2], ARGV[4]) end
if n > tonumber(ARGV[3]) then return 'limited' end
redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[7])
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[5], '*', 'entry', ARGV[1])
redis.call('XTRIM', KEYS[1], 'MINID', '~', ARGV[6])
return 'recorded'
"""


# KEYS[1] the failure's retry claim, KEYS[2] the requester's runs, KEYS[3] the channel's runs,
# KEYS[4] active runs. ARGV[1] who, ARGV[2] claim TTL, ARGV[3] the horizon of the counts, ARGV[4] max
# per user, ARGV[5] max per channel, ARGV[6] now, ARGV[7] counts TTL, ARGV[8] run id.
# A retry starts the run again, so it is counted as `_ACCEPT` counts a mention (the run's end takes it
# off again); every check comes before any write. The run itself never counts against its own retry.
_CLAIM_RETRY = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 'duplicate' end
local function full(key, most)
  if redis.call('ZSCORE', key, ARGV[8]) then return false end
  return redis.call('ZCOUNT', key, ARGV[3], '+inf') >= tonumber(most)
end
if full(KEYS[2], ARGV[4]) then return 'user_busy' end
if full(KEYS[3], ARGV[5]) then return 'channel_busy' end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
for i = 2, 3 do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', ARGV[3])
  redis.call('ZADD', KEYS[i], ARGV[6], ARGV[8])
  redis.call('EXPIRE', KEYS[i], ARGV[7])
end
redis.call('ZADD', KEYS[4], ARGV[6], ARGV[8])
return 'new'
"""


class FeedbackOutcome(StrEnum):
    """What became of a click on an answer's thumbs."""

    RECORDED = "recorded"
    SAME = "same"  # the person's standing feedback on this answer already says so
    LIMITED = "limited"  # past the person's share of the minute: not recorded


# KEYS[1] lease. ARGV[1] token.
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end return 0"


class Store:
    """Runs, threads, decisions and dedup marks in Redis."""

    def __init__(self, connection: redis.Redis) -> None:
        self.redis = connection
        self._decide = connection.register_script(_DECIDE)
        self._take = connection.register_script(_TAKE_THREAD)
        self._save = connection.register_script(_SAVE)
        self._park = connection.register_script(_PARK)
        self._settle = connection.register_script(_SETTLE)
        self._finish = connection.register_script(_FINISH)
        self._leave = connection.register_script(_LEAVE)
        self._renew = connection.register_script(_RENEW)
        self._release = connection.register_script(_RELEASE)
        self._request_stop = connection.register_script(_REQUEST_STOP)
        self._accept = connection.register_script(_ACCEPT)
        self._feedback = connection.register_script(_FEEDBACK)
        self._claim_retry = connection.register_script(_CLAIM_RETRY)
        self._besides: dict[str, Script] = {}  # scripts of `Beside` writes, registered once each

    # --- mentions -------------------------------------------------------------------------------

    def accept_event(
        self,
        team: str,
        event_id: str,
        record: RunRecord,
        job: QueuedJob,
        *,
        max_per_user: int,
        max_per_channel: int,
        counted_in: tuple[str, Mapping[Accepted, str]] | None = None,
    ) -> Accepted:
        """Record a mention once: dedup mark, run record, its counts and its job in one step.

        One Lua script, so either all of them are written or none is (a crash in between leaves
        nothing behind that would swallow Slack's retry), and no other delivery can slip between
        the checks and the writes. A requester or channel at its bound of runs gets no run (the
        dedup mark is still set, so Slack's retries are answered the same way). `job` is the run's
        first job as RQ would enqueue it (`workers.services.queued_job`). `counted_in`: a hash and
        its field for each outcome, counted in the same step (`workers.metrics.mention_counter`).
        """
        now = time.time()
        keys = [
            Keys.event(team, event_id),
            Keys.user_runs(team, record.requester),
            Keys.channel_runs(team, record.channel),
            Keys.run(record.run_id),
            Keys.active(),
            Keys.pending(record.run_id),
            job.key,
            job.queue_key,
            job.queues_key,
            counted_in[0] if counted_in else Keys.active(),  # a key all the same: unused unless counted
        ]
        counters = counted_in[1] if counted_in else {}
        args = [
            record.run_id,
            EVENT_TTL,
            repr(now - RUN_COUNT_HORIZON),
            max_per_user,
            max_per_channel,
            repr(record.created_at),
            RUN_COUNT_HORIZON,
            pack(record.to_json()),
            FINISHED_RUN_TTL,
            repr(now),  # active from the start: a job that dies before its driver takes the lease is noticed
            job.job_id,
            PENDING_TTL,
            *(counters.get(outcome, "") for outcome in Accepted),  # in the order the script reads them
            *job.fields,
        ]
        return Accepted(_text(self._accept(keys=keys, args=args)))

    def first_busy_notice(self, team: str, user: str, seconds: int = 60) -> bool:
        """True at most once a minute per requester: whether to tell them a mention was refused."""
        return bool(self.redis.set(Keys.busy_notice(team, user), "1", nx=True, ex=seconds))

    # --- runs -----------------------------------------------------------------------------------

    def load_run(self, run_id: str) -> RunRecord | None:
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

    # --- decisions ------------------------------------------------------------------------------

    def decide(
        self,
        run_id: str,
        park_id: int,
        call_id: str,
        decision: Decision,
        audit: dict[str, Any] | None = None,
        *,
        now: float | None = None,
        fingerprint: str = "*",
        required: int = 1,
        grant: Grant | None = None,
    ) -> DecideResult:
        """Record `decision` for a call of park `park_id`, unless unknown, decided, stale or expired; atomic.

        `fingerprint`: the version of the call the decider saw ("*": the clock, which needs none).
        `required` > 1: an approval counts towards a quorum of that many distinct approvers.
        `grant`: written with the decision when it is recorded. The first recording also appends
        `audit` (who, what, the input's hash and preview, when, outcome) to the audit stream.
        """
        now = time.time() if now is None else now
        payload = json.dumps(decision.to_json(), sort_keys=True)
        expired = json.dumps(Decision(Verdict.EXPIRED).to_json(), sort_keys=True)
        base = {"at": now, "run_id": run_id, "park_id": int(park_id), "call_id": call_id, **(audit or {})}
        entry = {**base, **decision.to_json()}
        expired_entry = {**base, **Decision(Verdict.EXPIRED).to_json(), "late_click_by": decision.by}
        oldest = f"{int((now - AUDIT_MAX_AGE) * 1000)}-0"
        grant_key = grant.key if grant else Keys.approvals(run_id, park_id)  # a key; unused without a grant
        keys = [Keys.approvals(run_id, park_id), Keys.audit(), Keys.active(), grant_key]
        voter = decision.by if decision.verdict is Verdict.APPROVED and required > 1 and decision.by else ""
        args: list[Any] = [
            check_id("call", call_id),
            payload,
            json.dumps(entry, ensure_ascii=False),
            repr(now),
            expired,
            json.dumps(expired_entry, ensure_ascii=False),
            run_id,
            AUDIT_MAX_ENTRIES,
            oldest,
            fingerprint,
            max(1, int(required)),
            voter,
            json.dumps(grant.to_json()) if grant else "",
            max(1, int(grant.seconds)) if grant else 1,
        ]
        outcome, stored = self._decide(keys=keys, args=args)
        result = DecideOutcome(_text(outcome))
        if result is DecideOutcome.COUNTED:
            return DecideResult(result, None, tuple(_text(stored).split(",")))
        standing = Decision.from_json(json.loads(stored)) if stored else None
        return DecideResult(result, standing)

    def votes(self, run_id: str, park_id: int) -> dict[str, tuple[str, ...]]:
        """Who has approved each call of the park so far (calls that need a quorum)."""
        raw = self.redis.hgetall(Keys.approvals(run_id, park_id))
        out = {}
        for key, value in raw.items():
            name = _text(key)
            if name.startswith("~votes:") and value:
                out[name[len("~votes:") :]] = tuple(_text(value).split(","))
        return out

    def grant(self, team: str, channel: str, thread_ts: str, tool: str) -> Grant | None:
        """The thread's standing grant of `tool`, if any (its key expires with it)."""
        raw = self.redis.get(Keys.grant(team, channel, thread_ts, tool))
        if not raw:
            return None
        try:
            found = Grant.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError):
            return None
        return found if found.until > time.time() else None

    def revoke_grant(self, team: str, channel: str, thread_ts: str, tool: str) -> bool:
        return bool(self.redis.delete(Keys.grant(team, channel, thread_ts, tool)))

    def decisions(self, run_id: str, park_id: int) -> dict[str, Decision | None]:
        """Every call of park `park_id`: its decision, or None while it still awaits one."""
        return _decisions(self.redis.hgetall(Keys.approvals(run_id, park_id)))

    def first_card_update(self, run_id: str, park_id: int, call_id: str, ttl: int = DAY) -> bool:
        """True once per call: whoever gets it updates the call's card after its decision."""
        key = Keys.cards_done(run_id, park_id)
        with self.redis.pipeline() as pipe:
            pipe.sadd(key, check_id("call", call_id))
            pipe.expire(key, ttl)
            added, _ = pipe.execute()
        return bool(added)

    def cards_updated(self, run_id: str, park_id: int) -> set[str]:
        return {_text(m) for m in self.redis.smembers(Keys.cards_done(run_id, park_id))}

    def due_expiries(self, now: float, limit: int = 100) -> list[tuple[str, int]]:
        """Parks whose expiry time has come: (run id, park id)."""
        members = self.redis.zrangebyscore(Keys.expiries(), "-inf", now, start=0, num=limit)
        due = []
        for member in members:
            run_id, _, park = _text(member).partition(":")
            due.append((run_id, int(park or 0)))
        return due

    def forget_expiry(self, run_id: str, park_id: int) -> None:
        self.redis.zrem(Keys.expiries(), f"{check_id('run', run_id)}:{int(park_id)}")

    def forget_park(self, record: RunRecord) -> None:
        """Park `record.park_id` is over (stopped, expired, answered at a limit): out of `expiries`
        and of the Home tab's indexes, in one round trip."""
        member = f"{check_id('run', record.run_id)}:{int(record.park_id)}"
        with self.redis.pipeline(transaction=False) as pipe:
            for key in (Keys.expiries(), *_park_indexes(record)):
                pipe.zrem(key, member)
            pipe.execute()

    def open_parks(
        self, team: str, *, requester: str | None = None, now: float, until: float | None = None, limit: int
    ) -> list[OpenPark]:
        """The team's open parks (only those of runs `requester` asked for, when given) expiring
        after `now` (and by `until`), soonest first: at most `limit`, whatever the number parked."""
        key = Keys.team_parks(team) if requester is None else Keys.user_parks(team, requester)
        high = "+inf" if until is None else repr(until)
        low = f"({now!r}"  # still open at `now`
        found: list[Any] = self.redis.zrangebyscore(key, low, high, start=0, num=limit, withscores=True)
        parks = []
        for member, score in found:
            run_id, park_id = _park_member(member)
            parks.append(OpenPark(run_id, park_id, float(score)))
        return parks

    def read_parks(self, parks: Sequence[OpenPark]) -> list[ParkRead]:
        """Each park's run record (None: gone or unreadable) and decisions, in one round trip."""
        with self.redis.pipeline(transaction=False) as pipe:
            for park in parks:
                pipe.get(Keys.run(park.run_id))
                pipe.hgetall(Keys.approvals(park.run_id, park.park_id))
            answers = pipe.execute()
        read: list[ParkRead] = []
        for raw, approvals in zip(answers[::2], answers[1::2], strict=True):
            try:
                record = None if raw is None else RunRecord.from_json(unpack(raw))
            except StateError:
                record = None
            read.append((record, _decisions(approvals)))
        return read

    def drop_from_index(self, team: str, parks: Sequence[OpenPark], requesters: Mapping[str, str]) -> None:
        """Take parks that are over (their run moved on, or every call is decided) out of the team's
        index and, for those whose requester is known, theirs: what a crash or a pending resume
        left there is paid for once."""
        if not parks:
            return
        with self.redis.pipeline(transaction=False) as pipe:
            for park in parks:
                member = f"{park.run_id}:{park.park_id}"
                pipe.zrem(Keys.team_parks(team), member)
                if park.run_id in requesters:
                    pipe.zrem(Keys.user_parks(team, requesters[park.run_id]), member)
            pipe.execute()

    def parked(self, now: float, limit: int = 500) -> list[tuple[str, int]]:
        """Parks still open at `now` (run id, park id), soonest expiry first: the index of parked runs."""
        members = self.redis.zrangebyscore(Keys.expiries(), f"({now!r}", "+inf", start=0, num=limit)
        return [_park_member(m) for m in members]

    # --- user groups ----------------------------------------------------------------------------

    def cached_group(self, team: str, group: str) -> frozenset[str] | None:
        """The members of `group` read from Slack less than `GROUP_TTL` ago, or None (read it again)."""
        raw = self.redis.get(Keys.group_members(team, group))
        if raw is None:
            return None
        try:
            members = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            return None
        return frozenset(members)

    def cache_group(self, team: str, group: str, members: frozenset[str], ttl: int = GROUP_TTL) -> None:
        self.redis.set(Keys.group_members(team, group), json.dumps(sorted(members)), ex=max(1, int(ttl)))

    # --- escalations ----------------------------------------------------------------------------

    def schedule_escalation(self, run_id: str, park_id: int, at: float) -> None:
        """Remind `escalate_to` of park `park_id` at `at`; scheduling it again keeps the first time."""
        self.redis.zadd(Keys.escalations(), {f"{check_id('run', run_id)}:{int(park_id)}": at}, nx=True)

    def claim_due_escalations(self, now: float, limit: int = 100) -> list[tuple[str, int]]:
        """Parks whose reminder is due, each returned to exactly one caller (whoever removes it)."""
        claimed = []
        for member in self.redis.zrangebyscore(Keys.escalations(), "-inf", now, start=0, num=limit):
            if self.redis.zrem(Keys.escalations(), _text(member)):  # two watchdogs: one removes it
                claimed.append(_park_member(member))
        return claimed

    # --- retries --------------------------------------------------------------------------------

    def claim_retry(
        self, record: RunRecord, failure_ts: str, by: str, *, max_per_user: int, max_per_channel: int
    ) -> Accepted:
        """Claim the one Retry of a failure of `record`, counted as a run of its requester and
        channel like a mention (`accept_event`): `Accepted.NEW` for exactly one click, which marks
        the run active and counts it; `DUPLICATE` once it is claimed; `USER_BUSY` or `CHANNEL_BUSY`
        (nothing written: the failure stays retryable) when it would pass a bound of runs."""
        now = time.time()
        keys = [
            Keys.retry_claim(record.run_id, failure_ts),
            Keys.user_runs(record.team, record.requester),
            Keys.channel_runs(record.team, record.channel),
            Keys.active(),
        ]
        args: list[Any] = [
            check_id("user", by),
            DAY,
            repr(now - RUN_COUNT_HORIZON),
            max_per_user,
            max_per_channel,
            repr(now),
            RUN_COUNT_HORIZON,
            record.run_id,
        ]
        return Accepted(_text(self._claim_retry(keys=keys, args=args)))

    def retry_claimed_by(self, run_id: str, failure_ts: str) -> str | None:
        raw = self.redis.get(Keys.retry_claim(run_id, failure_ts))
        return _text(raw) if raw else None

    def unclaim_retry(self, run_id: str, failure_ts: str) -> None:
        if failure_ts:
            self.redis.delete(Keys.retry_claim(run_id, failure_ts))

    # --- threads --------------------------------------------------------------------------------

    def load_history(self, team: str, channel: str, thread_ts: str) -> tuple[tuple[dict[str, Any], ...], int]:
        """The thread's conversation so far and its `seq` (0 for a new thread)."""
        data, seq = self.redis.hmget(Keys.history(team, channel, thread_ts), ["data", "seq"])
        if data is None:
            return (), int(seq or 0)
        try:
            parsed = json.loads(unpack(data))
        except ValueError as exc:
            raise StateError(f"stored thread is unreadable ({exc}); refusing to use it") from None
        if not isinstance(parsed, dict) or parsed.get("version") != HISTORY_VERSION:
            raise StateError("stored thread has an unknown format version; refusing to use it")
        return tuple(parsed["messages"]), int(seq or 0)

    def take_thread(self, record: RunRecord, ttl: int, *, queue: bool = True) -> bool:
        """Make `record` the active run of its thread, or (`queue`) queue it behind the one that is."""
        keys = [Keys.thread_lock(*record.thread), Keys.thread_waiting(*record.thread)]
        return bool(self._take(keys=keys, args=[record.run_id, ttl, THREAD_TTL, "1" if queue else "0"]))

    def thread_holder(self, record: RunRecord) -> str | None:
        raw = self.redis.get(Keys.thread_lock(*record.thread))
        return _text(raw) if raw else None

    def thread_run(self, team: str, channel: str, thread_ts: str) -> str | None:
        """The run working in (or parked in) a thread now, if any."""
        raw = self.redis.get(Keys.thread_lock(team, channel, thread_ts))
        return _text(raw) if raw else None

    # --- stop requests --------------------------------------------------------------------------

    def request_stop(self, run_id: str, by: str, ttl: int = DAY) -> str | None:
        """Ask `run_id` to stop on behalf of `by`: None if this is the first Stop, else who pressed first."""
        keys = [Keys.stop_request(run_id), Keys.active()]
        first = self._request_stop(keys=keys, args=[check_id("user", by), ttl, time.time(), run_id])
        return _text(first) if first else None

    def stop_requested(self, run_id: str) -> str | None:
        """Who asked `run_id` to stop, if anyone has."""
        raw = self.redis.get(Keys.stop_request(run_id))
        return _text(raw) if raw else None

    def first_delivery(self, team: str, event_id: str) -> bool:
        """True once per Slack event delivery (`SET NX` on its dedup mark): retries are absorbed."""
        return bool(self.redis.set(Keys.event(team, event_id), "1", nx=True, ex=EVENT_TTL))

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

    def park_view(self, run_id: str, park_id: int) -> ParkView:
        """Who pressed Stop, the park's decisions and the cards already updated: one round trip."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(Keys.stop_request(run_id))
            pipe.hgetall(Keys.approvals(run_id, park_id))
            pipe.smembers(Keys.cards_done(run_id, park_id))
            stop, raw, cards = pipe.execute()
        return ParkView(_text(stop) if stop else None, _decisions(raw), {_text(m) for m in cards})

    def resumed(self, record: RunRecord, ttl: int) -> Beside:
        """A resumed run's park expiry forgotten and its thread taken (`take_thread`, queued behind
        a holder that took it meanwhile), as a write for the resume's save to carry."""
        member = f"{check_id('run', record.run_id)}:{int(record.park_id)}"
        keys = (
            Keys.thread_lock(*record.thread),
            Keys.thread_waiting(*record.thread),
            Keys.expiries(),
            *_park_indexes(record),
        )
        return Beside(
            "the resumed run's thread and expiry",
            _RESUME_THREAD,
            keys,
            (record.run_id, ttl, THREAD_TTL, "1", member),
        )

    def renew_lease(self, run_id: str, token: str, seconds: float) -> bool:
        keys = [Keys.lease(run_id), Keys.active()]
        return bool(self._renew(keys=keys, args=[token, int(seconds * 1000), time.time(), run_id]))

    def release_lease(self, run_id: str, token: str) -> None:
        self._release(keys=[Keys.lease(run_id)], args=[token])

    def save(
        self,
        record: RunRecord,
        token: str,
        seconds: float,
        *,
        ttl: int = FINISHED_RUN_TTL,
        beside: Sequence[Beside] = (),
        encoder: RecordEncoder | None = None,
    ) -> Saved:
        """Save `record` if `token` still holds its lease (renewing it); falsy when it does not.

        `beside`: writes sent in the same round trip (a step's metrics), applied whatever the save's
        outcome. `encoder`: the run's, which packs its conversation a message at a time.
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
            ok, stop = self._save(keys=keys, args=args)
        else:
            ok, stop = self._with_besides(self._save, keys, args, beside)
        return Saved(bool(ok), _text(stop) or None)

    def write_besides(self, besides: Sequence[Beside]) -> None:
        """Send `besides` now, each on its own (no save to carry them); a failure is logged."""
        for b in besides:
            try:
                self._beside_script(b)(keys=list(b.keys), args=list(b.args))
            except Exception as exc:  # a figure is never worth a run
                log.warning("%s was not recorded (%s)", b.what, exc)

    def _beside_script(self, beside: Beside) -> Script:
        registered = self._besides.get(beside.script)
        if registered is None:
            registered = self._besides[beside.script] = self.redis.register_script(beside.script)
        return registered

    def _with_besides(
        self, script: Script, keys: list[str], args: list[Any], besides: Sequence[Beside]
    ) -> Any:
        """`script`'s answer, the `besides` sent in the same round trip (one pipeline of EVALSHAs).

        Not `Script.__call__` on a pipeline: redis-py then asks SCRIPT EXISTS first, a round trip
        of its own on every execute. A script Redis no longer has (it restarted) is loaded and sent
        again on its own: only those, so nothing is applied twice.
        """
        calls: list[tuple[Script, Sequence[Any], Sequence[Any], str | None]] = [(script, keys, args, None)]
        calls += [(self._beside_script(b), b.keys, b.args, b.what) for b in besides]
        with self.redis.pipeline(transaction=False) as pipe:
            for registered, k, a, _ in calls:
                pipe.evalsha(registered.sha, len(k), *k, *a)
            answers = pipe.execute(raise_on_error=False)
        for i, (registered, k, a, what) in enumerate(calls):
            if isinstance(answers[i], NoScriptError):
                try:
                    answers[i] = registered(keys=list(k), args=list(a))  # loads it, then sends it
                except redis.RedisError as exc:
                    answers[i] = exc
            if what is not None and isinstance(answers[i], Exception):
                log.warning("%s was not recorded beside a save (%s)", what, answers[i])
        if isinstance(answers[0], Exception):
            raise answers[0]
        return answers[0]

    def park(
        self,
        record: RunRecord,
        token: str,
        seconds: float,
        call_ids: list[str],
        *,
        ttl: int,
        fingerprints: dict[str, str] | None = None,
        encoder: RecordEncoder | None = None,
    ) -> bool:
        """Save a run awaiting decisions on `call_ids` (park `record.park_id`), fenced and atomic.

        `fingerprints`: what each decision must be made on (a click on another version is stale).
        """
        fingerprints = fingerprints or {}
        assert record.expires_at is not None
        keys = [
            Keys.lease(record.run_id),
            Keys.run(record.run_id),
            Keys.active(),
            Keys.approvals(record.run_id, record.park_id),
            Keys.expiries(),
            Keys.thread_lock(*record.thread),
            *_park_indexes(record),
        ]
        args: list[Any] = [
            token,
            int(seconds * 1000),
            encoder.encode(record) if encoder else pack(record.to_json()),
            ttl,
            time.time(),
            record.run_id,
            repr(record.expires_at),
            f"{record.run_id}:{record.park_id}",
            *(part for c in call_ids for part in (check_id("call", c), fingerprints.get(c, ""))),
        ]
        return bool(self._park(keys=keys, args=args))

    def settle_park(self, record: RunRecord, token: str, seconds: float, *, ttl: int) -> str:
        """'ready' (every decision is in: keep driving), 'parked' (let go) or 'lost' (not ours)."""
        keys = [
            Keys.lease(record.run_id),
            Keys.run(record.run_id),
            Keys.active(),
            Keys.approvals(record.run_id, record.park_id),
            Keys.stop_request(record.run_id),
        ]
        args: list[Any] = [token, pack(record.to_json()), ttl, record.run_id, int(seconds * 1000)]
        return _text(self._settle(keys=keys, args=args))

    def finish(
        self,
        record: RunRecord,
        token: str,
        *,
        history: tuple[dict[str, Any], ...] | None,
        ttl: int = FINISHED_RUN_TTL,
    ) -> FinishResult | None:
        """End the run (see `_FINISH`); None when `token` no longer holds its lease."""
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
        ]
        ok, nxt, saved = self._finish(keys=keys, args=args)
        if not ok:
            return None
        return FinishResult(_text(nxt) or None, bool(saved))

    def leave(self, record: RunRecord, token: str) -> None:
        """A run queued behind another in its thread lets go of its driver (see `_LEAVE`)."""
        keys = [Keys.lease(record.run_id), Keys.active(), Keys.thread_waiting(*record.thread)]
        self._leave(keys=keys, args=[token, record.run_id])

    def orphans(self, older_than: float, queued: Callable[[str], bool]) -> list[str]:
        """Runs that need a driver and have had none (no lease) since `older_than`.

        A run whose job still waits in the queue (`queued(job_id)`) is left alone: under a
        backlog the watchdog must not pile up jobs. A job that started and died, or vanished,
        does not count: that is exactly the run to recover.
        """
        stale = [_text(r) for r in self.redis.zrangebyscore(Keys.active(), "-inf", older_than)]
        found = []
        for run_id in stale:
            try:
                lease, pending = Keys.lease(run_id), Keys.pending(run_id)
            except BadId:
                self.redis.zrem(Keys.active(), run_id)  # not ours to drive: never written by us
                continue
            job_id = self.redis.get(pending)
            if not self.redis.exists(lease) and not (job_id and queued(_text(job_id))):
                found.append(run_id)
            self.redis.zadd(Keys.active(), {run_id: time.time()}, xx=True)  # don't report it again at once
        return found

    def forget_active(self, run_id: str) -> None:
        self.redis.zrem(Keys.active(), run_id)

    def append_audit(self, entry: dict[str, Any], *, now: float | None = None) -> None:
        """One audit entry written outside a decision (a call a grant let run)."""
        now = time.time() if now is None else now
        oldest = f"{int((now - AUDIT_MAX_AGE) * 1000)}-0"
        with self.redis.pipeline() as pipe:
            pipe.xadd(
                Keys.audit(),
                {"entry": json.dumps({"at": now, **entry}, ensure_ascii=False)},
                maxlen=AUDIT_MAX_ENTRIES,
                approximate=True,
            )
            pipe.xtrim(Keys.audit(), minid=oldest, approximate=True)
            pipe.execute()

    def audit_entries(self, count: int = 100) -> list[dict[str, Any]]:
        """The newest `count` audit entries, oldest first (see `_stream_entries`)."""
        return self._stream_entries(Keys.audit(), count)

    def _stream_entries(self, key: str, count: int) -> list[dict[str, Any]]:
        """The newest `count` entries of stream `key`, oldest first. An entry that is not a JSON
        object (written by hand, or by something else) comes back as `{"unreadable": ...}`."""
        rows: list[Any] = self.redis.xrevrange(key, count=count) or []
        out = []
        for _, fields_ in reversed(rows):
            raw = fields_.get(b"entry", b"")
            try:
                entry = json.loads(raw)
            except ValueError:
                entry = None
            out.append(entry if isinstance(entry, dict) else {"unreadable": _text(raw)[:200]})
        return out

    # --- feedback on answers --------------------------------------------------------------------

    def record_feedback(
        self, entry: dict[str, Any], *, team: str, user: str, run_id: str, now: float | None = None
    ) -> FeedbackOutcome:
        """Append a click on an answer's thumbs (`entry["feedback"]`: good or bad) to the feedback
        stream, unless it repeats `user`'s standing feedback on that answer or `user` has already
        given `FEEDBACK_PER_MINUTE` this minute. One script: the checks and the write are one step."""
        now = time.time() if now is None else now
        keys = [Keys.feedback(), Keys.feedback_rate(team, user), Keys.feedback_given(run_id, user)]
        args: list[Any] = [
            json.dumps({"at": now, **entry}, ensure_ascii=False),
            str(entry["feedback"]),
            FEEDBACK_PER_MINUTE,
            60,
            FEEDBACK_MAX_ENTRIES,
            f"{int((now - AUDIT_MAX_AGE) * 1000)}-0",
            FINISHED_RUN_TTL,
        ]
        return FeedbackOutcome(_text(self._feedback(keys=keys, args=args)))

    def feedback_entries(self, count: int = 100) -> list[dict[str, Any]]:
        """The newest `count` feedback entries, oldest first."""
        return self._stream_entries(Keys.feedback(), count)
