"""Parks and decisions: a run parked on calls that await people, the clicks that decide them,
and the Home tab's index of what waits on whom.

`park` writes a run awaiting decisions in one fenced step (an empty field per call in the park's
approvals hash, its expiry, its place in the Home tab's indexes); `decide` records one click
(fingerprint, quorum, expiry, its audit entry and any grant, in one script); `settle_park` lets the
driver go unless every decision is in already; `park_view` is what the resume reads back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from harness.state import Decision, NewerRecord, StateError, Verdict
from store.audit import CHAIN_APPEND
from store.base import StorePart, as_text
from store.decisions import (
    APPROVALS_VERSION,
    APPROVALS_VERSIONS,
    check_approvals_version,
    decision_of,
    stored_decision,
)
from store.grants import Grant
from store.keys import DAY, Keys, check_id, park_member
from store.records import RecordEncoder, RunRecord, RunStatus, pack, unpack


class Settled(StrEnum):
    """What settling a park did (the words `_SETTLE` answers)."""

    READY = "ready"  # every decision is in already: the driver keeps the run and resumes it
    PARKED = "parked"  # let go: it waits, no lease held
    LOST = "lost"  # the lease is not ours: another driver has the run


EXPIRES_FIELD = "~expires"  # never a call id: those are [A-Za-z0-9_-]
BATCH = "~batch"  # RunRecord.cards key of a park's Approve all / Decline all message (never a call id)


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


@dataclass(frozen=True)
class ParkView:
    """What a resume reads of a park: who pressed Stop, every call's decision, the cards already updated."""

    stop_by: str | None
    decisions: dict[str, Decision | None]
    cards_updated: set[str]
    decided_at: dict[str, float] = field(default_factory=dict)  # call id -> when its decision was made


@dataclass(frozen=True)
class OpenPark:
    """A park in the Home tab's index: its run, its number, when it expires."""

    run_id: str
    park_id: int
    expires_at: float


@dataclass(frozen=True)
class ParkRead:
    """A park as the Home tab reads it: its record (None: gone or unreadable) and decisions, or
    `newer`: a newer release wrote it (neither shown nor dropped from the index)."""

    record: RunRecord | None
    decisions: dict[str, Decision | None]
    newer: bool = False


def decisions_of(raw: dict[Any, Any]) -> dict[str, Decision | None]:
    """A park's approvals hash as call id -> decision (None while it awaits one); `NewerRecord`
    when a newer release wrote the hash or a decision in it."""
    check_approvals_version(raw)
    return {
        as_text(k): (decision_of(v) if v else None) for k, v in raw.items() if not as_text(k).startswith("~")
    }


def decided_at_of(raw: dict[Any, Any]) -> dict[str, float]:
    """A park's approvals hash as call id -> when its decision was recorded (`~at:<call>`)."""
    prefix = "~at:"
    return {
        as_text(k)[len(prefix) :]: float(as_text(v)) for k, v in raw.items() if as_text(k).startswith(prefix)
    }


def votes_of(raw: dict[Any, Any]) -> dict[str, tuple[str, ...]]:
    """A park's approvals hash as call id -> who has approved it so far (calls under a quorum)."""
    out = {}
    for key, value in raw.items():
        name = as_text(key)
        if name.startswith("~votes:") and value:
            out[name[len("~votes:") :]] = tuple(as_text(value).split(","))
    return out


def park_indexes(record: RunRecord) -> tuple[str, str, str]:
    """The index keys a park of `record` is kept in: its team's and its requester's (the Home
    tab's), and its profile's (what `/metrics` counts as the runs waiting on its approvers)."""
    return (
        Keys.team_parks(record.team),
        Keys.user_parks(record.team, record.requester),
        Keys.profile_parks(record.profile),
    )


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

# KEYS[1] lease, KEYS[2] run record, KEYS[3] active set, KEYS[4] approvals hash, KEYS[5] expiries,
# KEYS[6] thread lock, KEYS[7..] the park's indexes (`park_indexes`). ARGV[1] token,
# ARGV[2] lease ms, ARGV[3] record, ARGV[4] TTL s, ARGV[5] now, ARGV[6] run id, ARGV[7] expires at,
# ARGV[8] expiry member, ARGV[9] the hash's format version, ARGV[10..] pairs: call id, fingerprint.
# Parking is one fenced step: the record awaiting decisions (with the cards it owes in its outbox),
# one empty field per call, the expiry scheduled, the park in the Home tab's indexes (whose expired
# members go, and which live as long as their newest park), the thread kept. HSETNX: replayed, it
# never wipes a decision recorded in between.
_PARK = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[4])
for i = 10, #ARGV, 2 do
  redis.call('HSETNX', KEYS[4], ARGV[i], '')
  if ARGV[i + 1] ~= '' then redis.call('HSETNX', KEYS[4], '~fp:' .. ARGV[i], ARGV[i + 1]) end
end
redis.call('HSETNX', KEYS[4], '~version', ARGV[9])
redis.call('HSETNX', KEYS[4], '~expires', ARGV[7])
redis.call('EXPIRE', KEYS[4], ARGV[4])
redis.call('ZADD', KEYS[5], ARGV[7], ARGV[8])
for i = 7, #KEYS do
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

# KEYS[1] approvals hash, KEYS[2] audit stream, KEYS[3] active set, KEYS[4] grant key, KEYS[5] the
# audit chain's head. ARGV[1] call id, ARGV[2] decision JSON, ARGV[3] audit entry JSON, ARGV[4] now,
# ARGV[5] expired decision JSON, ARGV[6] expired audit entry JSON, ARGV[7] run id, ARGV[8] the
# fingerprint the click was made on ('*': not checked), ARGV[9] approvals required, ARGV[10] the
# voter of an approval that counts towards a quorum ('' otherwise), ARGV[11] grant JSON ('' none),
# ARGV[12] grant TTL s, ARGV[13] the newest format of the hash this release writes.
# A park a newer release wrote (`~version` above ARGV[13]) is left as it is: nothing recorded.
# A field holds "" while the call awaits a decision. A click on another version of the call
# (`~fp:<call>` differs) records nothing. A click at or after the park's expiry records the expiry
# instead. With a quorum, approvals gather in `~votes:<call>` (one per person) until enough.
# `~at:<call>` keeps when the decision was made (the end of its `await_approval` span).
# The decision, its audit entry (the chain's next link) and its grant are written together, and the
# park that this decision completes is marked active in the same step, so whatever recovers
# orphaned runs finds it even if the resume job dies. Running the script twice gives the same answer.
_DECIDE = (
    _ALL_DECIDED
    + CHAIN_APPEND
    + """
local function audit(entry)
  chain_append(KEYS[2], KEYS[5], entry)
end
local version = tonumber(redis.call('HGET', KEYS[1], '~version') or '1')
if version and version > tonumber(ARGV[13]) then return {'newer', tostring(version)} end
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then return {'unknown', ''} end
if current ~= '' then
  if current == ARGV[2] then return {'recorded', current} end
  return {'taken', current}
end
local expires = tonumber(redis.call('HGET', KEYS[1], '~expires') or '0')
local expired = expires > 0 and tonumber(ARGV[4]) >= expires
if not expired and ARGV[8] ~= '*' then
  local fp = redis.call('HGET', KEYS[1], '~fp:' .. ARGV[1])
  if fp and fp ~= ARGV[8] then return {'stale', ''} end
end
local decision, entry, outcome = ARGV[2], ARGV[3], 'recorded'
if expired then
  decision, entry, outcome = ARGV[5], ARGV[6], 'expired'
elseif ARGV[10] ~= '' then
  local field = '~votes:' .. ARGV[1]
  local votes = redis.call('HGET', KEYS[1], field) or ''
  local list = {}
  for voter in string.gmatch(votes, '[^,]+') do
    if voter == ARGV[10] then return {'counted', votes} end
    table.insert(list, voter)
  end
  table.insert(list, ARGV[10])
  votes = table.concat(list, ',')
  redis.call('HSET', KEYS[1], field, votes)
  local e = cjson.decode(entry)
  e['approvers'] = list
  if #list < tonumber(ARGV[9]) then
    e['verdict'] = 'approval_counted'
    e['count'] = #list
    e['required'] = tonumber(ARGV[9])
    audit(cjson.encode(e))
    return {'counted', votes}
  end
  local d = cjson.decode(decision)
  d['approvers'] = list
  decision, entry = cjson.encode(d), cjson.encode(e)
end
redis.call('HSET', KEYS[1], ARGV[1], decision, '~at:' .. ARGV[1], ARGV[4])
audit(entry)
if outcome == 'recorded' and ARGV[11] ~= '' then
  redis.call('SET', KEYS[4], ARGV[11], 'EX', ARGV[12])
end
if all_decided(KEYS[1]) then redis.call('ZADD', KEYS[3], ARGV[4], ARGV[7]) end
return {outcome, decision}
"""
)


def _decide_call(
    run_id: str,
    park_id: int,
    call_id: str,
    decision: Decision,
    audit: dict[str, Any] | None,
    now: float,
    fingerprint: str,
    required: int,
    grant: Grant | None,
) -> tuple[list[str], list[Any]]:
    """The keys and arguments of the decide script for one call (see `_DECIDE`)."""
    payload = stored_decision(decision)
    expired = stored_decision(Decision(Verdict.EXPIRED))
    base = {"at": now, "run_id": run_id, "park_id": int(park_id), "call_id": call_id, **(audit or {})}
    entry = {**base, **decision.to_json()}
    expired_entry = {**base, **Decision(Verdict.EXPIRED).to_json(), "late_click_by": decision.by}
    grant_key = grant.key if grant else Keys.approvals(run_id, park_id)  # a key; unused without a grant
    keys = [Keys.approvals(run_id, park_id), Keys.audit(), Keys.active(), grant_key, Keys.audit_head()]
    voter = decision.by if decision.verdict is Verdict.APPROVED and required > 1 and decision.by else ""
    args: list[Any] = [
        check_id("call", call_id),
        payload,
        json.dumps(entry, ensure_ascii=False),
        repr(now),
        expired,
        json.dumps(expired_entry, ensure_ascii=False),
        run_id,
        fingerprint,
        max(1, int(required)),
        voter,
        json.dumps(grant.to_json()) if grant else "",
        max(1, int(grant.seconds)) if grant else 1,
        max(APPROVALS_VERSIONS),
    ]
    return keys, args


def _decide_result(raw: Any) -> DecideResult:
    """The decide script's answer; `NewerRecord` when a newer release wrote the park (nothing was
    recorded) or the decision that stands."""
    outcome, stored = raw
    if as_text(outcome) == "newer":
        raise NewerRecord("park's approvals", int(float(as_text(stored))), APPROVALS_VERSIONS)
    result = DecideOutcome(as_text(outcome))
    if result is DecideOutcome.COUNTED:
        return DecideResult(result, None, tuple(as_text(stored).split(",")))
    return DecideResult(result, decision_of(stored) if stored else None)


class ParkStore(StorePart):
    """Parks, the decisions and votes on their calls, the cards updated, and the Home tab's index."""

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
            *park_indexes(record),
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
            APPROVALS_VERSION,
            *(part for c in call_ids for part in (check_id("call", c), fingerprints.get(c, ""))),
        ]
        # A card is posted only once its park is on a replica: a failover never leaves people a
        # card whose park the new master never had (the run would park again, a second card).
        return bool(self.replicas.run(self._script(_PARK), keys, args, "park"))

    def settle(self, record: RunRecord, token: str, seconds: float, *, ttl: int) -> Settled:
        """Whether the parked run is let go, still driven (every decision is in), or not ours."""
        keys = [
            Keys.lease(record.run_id),
            Keys.run(record.run_id),
            Keys.active(),
            Keys.approvals(record.run_id, record.park_id),
            Keys.stop_request(record.run_id),
        ]
        args: list[Any] = [token, pack(record.to_json()), ttl, record.run_id, int(seconds * 1000)]
        return Settled(as_text(self._script(_SETTLE)(keys=keys, args=args)))

    def view(self, run_id: str, park_id: int) -> ParkView:
        """Who pressed Stop, the park's decisions and the cards already updated: one round trip."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(Keys.stop_request(run_id))
            pipe.hgetall(Keys.approvals(run_id, park_id))
            pipe.smembers(Keys.cards_done(run_id, park_id))
            stop, raw, cards = pipe.execute()
        return ParkView(
            as_text(stop) if stop else None,
            decisions_of(raw),
            {as_text(m) for m in cards},
            decided_at_of(raw),
        )

    def forget(self, record: RunRecord) -> None:
        """Park `record.park_id` is over (stopped, expired, answered at a limit): out of `expiries`
        and of the Home tab's indexes, in one round trip."""
        member = f"{check_id('run', record.run_id)}:{int(record.park_id)}"
        with self.redis.pipeline(transaction=False) as pipe:
            for key in (Keys.expiries(), *park_indexes(record)):
                pipe.zrem(key, member)
            pipe.execute()

    def unindex(self, record: RunRecord) -> None:
        """Park `record.park_id` waits on no person (a server's task): out of the Home tab's and the
        profile's indexes of what waits on whom; its expiry stays."""
        member = f"{check_id('run', record.run_id)}:{int(record.park_id)}"
        with self.redis.pipeline(transaction=False) as pipe:
            for key in park_indexes(record):
                pipe.zrem(key, member)
            pipe.execute()

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
        A park a newer release wrote records nothing and raises `NewerRecord`.

        `fingerprint`: the version of the call the decider saw ("*": the clock, which needs none).
        `required` > 1: an approval counts towards a quorum of that many distinct approvers.
        `grant`: written with the decision when it is recorded. The first recording also appends
        `audit` (who, what, the input's hash and preview, when, outcome) to the audit stream.
        """
        now = time.time() if now is None else now
        keys, args = _decide_call(
            run_id, park_id, call_id, decision, audit, now, fingerprint, required, grant
        )
        return _decide_result(self._promise(_DECIDE, keys, args, "decision"))

    def decide_each(
        self,
        run_id: str,
        park_id: int,
        calls: list[tuple[str, dict[str, Any], str, Decision]],
        *,
        required: int = 1,
    ) -> list[DecideResult]:
        """`decide` on each of `calls` (call id, audit, fingerprint, its decision), in order, in one
        round trip: each call's step is atomic on its own, as if clicked one after the other."""
        now = time.time()
        script = self._script(_DECIDE)
        with self.redis.pipeline(transaction=False) as pipe:
            for call_id, audit, fingerprint, decision in calls:
                keys, args = _decide_call(
                    run_id, park_id, call_id, decision, audit, now, fingerprint, required, None
                )
                script(keys=keys, args=args, client=pipe)
            waited = self.replicas.waits(pipe)
            answers = pipe.execute()
        if waited:
            self.replicas.check(answers.pop(), "decision")
        return [_decide_result(raw) for raw in answers]

    def votes(self, run_id: str, park_id: int) -> dict[str, tuple[str, ...]]:
        """Who has approved each call of the park so far (calls that need a quorum)."""
        return votes_of(self.redis.hgetall(Keys.approvals(run_id, park_id)))

    def ballot(
        self, run_id: str, park_id: int
    ) -> tuple[dict[str, Decision | None], dict[str, tuple[str, ...]]]:
        """`decisions` and `votes` of the park, in one read."""
        raw = self.redis.hgetall(Keys.approvals(run_id, park_id))
        return decisions_of(raw), votes_of(raw)

    def decisions(self, run_id: str, park_id: int) -> dict[str, Decision | None]:
        """Every call of park `park_id`: its decision, or None while it still awaits one."""
        return decisions_of(self.redis.hgetall(Keys.approvals(run_id, park_id)))

    def first_card_update(self, run_id: str, park_id: int, call_id: str, ttl: int = DAY) -> bool:
        """True once per call: whoever gets it updates the call's card after its decision."""
        key = Keys.cards_done(run_id, park_id)
        with self.redis.pipeline() as pipe:
            pipe.sadd(key, check_id("call", call_id))
            pipe.expire(key, ttl)
            added, _ = pipe.execute()
        return bool(added)

    def cards_updated(self, run_id: str, park_id: int) -> set[str]:
        return {as_text(m) for m in self.redis.smembers(Keys.cards_done(run_id, park_id))}

    # --- the Home tab's index -------------------------------------------------------------------

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
            run_id, park_id = park_member(member)
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
                read.append(ParkRead(record, decisions_of(approvals)))
            except NewerRecord:
                read.append(ParkRead(None, {}, newer=True))
            except StateError:
                read.append(ParkRead(None, {}))
        return read

    def index_older_parks(self, now: float) -> int | None:
        """`index_open_parks` once per Redis: parks made since are indexed by the park script, so a
        worker's start pays for the pass only until one has completed. None: it was done before."""
        if self.redis.exists(Keys.parks_indexed()):
            return None
        found = self.index_open_parks(now)
        self.redis.set(Keys.parks_indexed(), int(now))
        return found

    def index_open_parks(self, now: float, batch: int = 200) -> int:
        """Put every open park into the Home tab's index; how many were found. Idempotent.

        The park script writes the index with each park, but parks made by a version without the
        index (before an upgrade) are in `expiries` only: they would show on nobody's Home tab
        until they were parked again.
        """
        members: list[tuple[Any, float]] = self.redis.zrangebyscore(  # type: ignore[assignment]
            Keys.expiries(), now, "+inf", withscores=True
        )
        found = 0
        for start in range(0, len(members), batch):
            chunk = [(as_text(member), float(score)) for member, score in members[start : start + batch]]
            with self.redis.pipeline(transaction=False) as pipe:
                for member, _ in chunk:
                    pipe.get(Keys.run(member.partition(":")[0]))
                raws = pipe.execute()
            with self.redis.pipeline(transaction=False) as pipe:
                for (member, expires_at), raw in zip(chunk, raws, strict=True):
                    try:
                        record = None if raw is None else RunRecord.from_json(unpack(raw))
                    except StateError:
                        continue
                    if record is None or record.status is not RunStatus.AWAITING_APPROVAL:
                        continue
                    if park_member(member) != (record.run_id, record.park_id):
                        continue  # a park the run has moved on from
                    found += 1
                    for key in park_indexes(record):
                        pipe.zadd(key, {member: expires_at})
                        pipe.expire(key, int(expires_at - now) + DAY, gt=True)
                        pipe.expire(key, int(expires_at - now) + DAY, nx=True)
                pipe.execute()
        return found

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
