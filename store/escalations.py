"""The clock's side of parks: parks whose expiry has come (`expiries`, member `run:park`),
reminders due to `escalate_to` (`escalations`) and before expiry (`reminders`), read by the
watchdog, and Extend, which moves a park's expiry everywhere it is held."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from store.base import StorePart, as_text
from store.held import held_runs
from store.keys import DAY, Keys, check_id, park_member
from store.parks import park_indexes
from store.records import RunRecord, pack, unpack


class ExtendOutcome(StrEnum):
    EXTENDED = "extended"  # this click moved the expiry
    TAKEN = "taken"  # someone extended it since the reminder was posted (a double click)
    MOST = "most"  # it has been extended `max_extensions` times already
    EXPIRED = "expired"  # the park expired (or was decided and resumed) before the click
    MOVED = "moved"  # the run record changed between read and write: read it again


@dataclass(frozen=True)
class ExtendResult:
    outcome: ExtendOutcome
    expires_at: float = 0.0  # the park's expiry now (EXTENDED: the new one)
    extensions: int = 0  # how many times it has been extended now


# KEYS[1] approvals hash, KEYS[2] run record, KEYS[3] reminders, KEYS[4] thread lock, KEYS[5]
# expiries, KEYS[6..] the park's indexes (`park_indexes`). ARGV[1] now, ARGV[2] member `run:park`,
# ARGV[3] the extension count the click was made on, ARGV[4] max_extensions, ARGV[5] the record read,
# ARGV[6] the record to write, ARGV[7] the new expiry, ARGV[8] TTL s, ARGV[9] the next reminder's due
# time ('' none), ARGV[10] run id.
# Every place that holds a park's expiry moves in one step: the approvals hash (read by a click),
# `expiries` (read by the watchdog), the Home tab's indexes (XX: a park already gone stays gone),
# the run record (cards, reminders) and the lifetimes of all that. The count the click was made on
# must still be the count: a double click extends once. Run twice, the second finds its own count.
_EXTEND = """
local expires = tonumber(redis.call('HGET', KEYS[1], '~expires') or '0')
if expires == 0 or tonumber(ARGV[1]) >= expires then return {'expired', tostring(expires), '0'} end
if redis.call('ZSCORE', KEYS[5], ARGV[2]) == false then return {'expired', tostring(expires), '0'} end
local count = tonumber(redis.call('HGET', KEYS[1], '~extensions') or '0')
if count ~= tonumber(ARGV[3]) then return {'taken', tostring(expires), tostring(count)} end
if count >= tonumber(ARGV[4]) then return {'most', tostring(expires), tostring(count)} end
if redis.call('GET', KEYS[2]) ~= ARGV[5] then return {'moved', tostring(expires), tostring(count)} end
redis.call('HSET', KEYS[1], '~expires', ARGV[7], '~extensions', count + 1)
redis.call('EXPIRE', KEYS[1], ARGV[8])
redis.call('SET', KEYS[2], ARGV[6], 'EX', ARGV[8])
for i = 5, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', ARGV[7], ARGV[2])
  if i > 5 and redis.call('TTL', KEYS[i]) < tonumber(ARGV[8]) then redis.call('EXPIRE', KEYS[i], ARGV[8]) end
end
if ARGV[9] ~= '' then redis.call('ZADD', KEYS[3], ARGV[9], ARGV[2]) end
if redis.call('GET', KEYS[4]) == ARGV[10] then redis.call('EXPIRE', KEYS[4], ARGV[8]) end
return {'extended', ARGV[7], tostring(count + 1)}
"""


class EscalationStore(StorePart):
    """Parks by expiry, and reminders by when they are due, each claimed by one watchdog."""

    def due_expiries(self, now: float, limit: int = 100) -> list[tuple[str, int]]:
        """Parks whose expiry time has come: (run id, park id). Those of runs held for a newer
        release stay where they are, for it (`store.held`)."""
        due = []
        for member in self._due(Keys.expiries(), now, limit):
            run_id, _, park = member.partition(":")
            due.append((run_id, int(park or 0)))
        return due

    def _due(self, key: str, now: float, limit: int) -> list[str]:
        """The members of `key` due by `now` (at most `limit`), but those of held runs."""
        held = held_runs(self.redis)
        members = self.redis.zrangebyscore(key, "-inf", now, start=0, num=limit + len(held))
        due = [as_text(m) for m in members if as_text(m).partition(":")[0] not in held]
        return due[:limit]

    def forget_expiry(self, run_id: str, park_id: int) -> None:
        self.redis.zrem(Keys.expiries(), f"{check_id('run', run_id)}:{int(park_id)}")

    def parked(self, now: float, limit: int = 500) -> list[tuple[str, int]]:
        """Parks still open at `now` (run id, park id), soonest expiry first: the index of parked runs."""
        members = self.redis.zrangebyscore(Keys.expiries(), f"({now!r}", "+inf", start=0, num=limit)
        return [park_member(m) for m in members]

    def schedule_escalation(self, run_id: str, park_id: int, at: float) -> None:
        """Remind `escalate_to` of park `park_id` at `at`; scheduling it again keeps the first time."""
        self.redis.zadd(Keys.escalations(), {f"{check_id('run', run_id)}:{int(park_id)}": at}, nx=True)

    def claim_due_escalations(self, now: float, limit: int = 100) -> list[tuple[str, int]]:
        """Parks whose reminder is due, each returned to exactly one caller (whoever removes it);
        those of held runs stay due, for a release that reads them."""
        claimed = []
        for member in self._due(Keys.escalations(), now, limit):
            if self.redis.zrem(Keys.escalations(), member):  # two watchdogs: one removes it
                claimed.append(park_member(member))
        return claimed

    def schedule_reminder(self, run_id: str, park_id: int, at: float) -> None:
        """Remind park `park_id`'s deciders at `at` that it will expire (each expiry: one reminder)."""
        self.redis.zadd(Keys.reminders(), {f"{check_id('run', run_id)}:{int(park_id)}": at})

    def claim_due_reminders(self, now: float, limit: int = 100) -> list[tuple[str, int]]:
        """Parks whose reminder before expiry is due, each returned to exactly one caller (but
        those of held runs)."""
        claimed = []
        for member in self._due(Keys.reminders(), now, limit):
            if self.redis.zrem(Keys.reminders(), member):
                claimed.append(park_member(member))
        return claimed

    def extensions(self, run_id: str, park_id: int) -> tuple[float, int]:
        """A park's expiry as a click reads it, and how many times it has been extended."""
        expires, count = self.redis.hmget(Keys.approvals(run_id, park_id), "~expires", "~extensions")
        return float(as_text(expires) if expires else 0), int(as_text(count) if count else 0)

    def read_run(self, run_id: str) -> tuple[bytes | str, RunRecord] | None:
        """A run record and the bytes it was read from (what `extend_park` checks it against)."""
        raw = self.redis.get(Keys.run(run_id))
        return None if raw is None else (raw, RunRecord.from_json(unpack(raw)))

    def extend_park(
        self,
        raw: bytes | str,
        record: RunRecord,
        *,
        seen: int,
        most: int,
        seconds: float,
        remind_before: float,
        now: float | None = None,
    ) -> ExtendResult:
        """Move park `record.park_id`'s expiry `seconds` later, if still open, still at `seen`
        extensions and below `most`; `raw` is the record as read (a record saved since: MOVED)."""
        now = time.time() if now is None else now
        assert record.expires_at is not None
        new_expiry = record.expires_at + seconds
        moved = replace(record, expires_at=new_expiry, extensions=seen + 1)
        member = f"{check_id('run', record.run_id)}:{int(record.park_id)}"
        due = new_expiry - remind_before if remind_before > 0 else None
        keys = [
            Keys.approvals(record.run_id, record.park_id),
            Keys.run(record.run_id),
            Keys.reminders(),
            Keys.thread_lock(*record.thread),
            Keys.expiries(),
            *park_indexes(record),
        ]
        args: list[Any] = [
            repr(now),
            member,
            int(seen),
            int(most),
            raw,
            pack(moved.to_json()),
            repr(new_expiry),
            int(new_expiry - now) + DAY,
            "" if due is None else repr(max(due, now)),
            record.run_id,
        ]
        outcome, expires, count = self._script(_EXTEND)(keys=keys, args=args)
        return ExtendResult(ExtendOutcome(as_text(outcome)), float(as_text(expires)), int(as_text(count)))
