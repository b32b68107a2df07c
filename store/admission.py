"""What lets a run start: a mention accepted once, and a Retry claimed once.

A mention's dedup mark, run record, counts and first job are written by one script, a Retry's
claim and counts by another; each checks the bounds of runs per requester and per channel
(`max_runs_per_user`, `max_runs_per_channel`) before it writes anything. A run's end (`finish`)
takes it off the counts again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from store.base import StorePart, as_text
from store.keys import DAY, Keys, check_id
from store.records import FINISHED_RUN_TTL, RunRecord, pack
from store.runs import PENDING_TTL

EVENT_TTL = DAY  # Slack retries for about 5 minutes; a day is plenty
RUN_COUNT_HORIZON = 3 * DAY  # a run older than this no longer counts against its requester's bound


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


class AdmissionStore(StorePart):
    """Mentions accepted and retries claimed, each exactly once, within the bounds of runs."""

    def accept_event(
        self,
        team: str,
        event_id: str,
        record: RunRecord,
        job: QueuedJob,
        *,
        max_per_user: int,
        max_per_channel: int,
        counted_in: Mapping[Accepted, str] | None = None,
    ) -> Accepted:
        """Record a mention once: dedup mark, run record, its counts and its job in one step.

        One Lua script, so either all of them are written or none is (a crash in between leaves
        nothing behind that would swallow Slack's retry), and no other delivery can slip between
        the checks and the writes. A requester or channel at its bound of runs gets no run (the
        dedup mark is still set, so Slack's retries are answered the same way). `job` is the run's
        first job as RQ would enqueue it (`workers.services.queued_job`). `counted_in`: the counter
        field of each outcome (`observe.metrics.mention_counter`), counted in the same step into the
        metrics' hash (`store.counters`).
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
            Keys.metric_counters(),  # written only when `counted_in` names the outcome's field
        ]
        counters = counted_in or {}
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
        return Accepted(as_text(self._promise(_ACCEPT, keys, args, "mention")))

    def first_delivery(self, team: str, event_id: str) -> bool:
        """True once per Slack event delivery (`SET NX` on its dedup mark): retries are absorbed."""
        return bool(self.redis.set(Keys.event(team, event_id), "1", nx=True, ex=EVENT_TTL))

    def first_busy_notice(self, team: str, user: str, seconds: int = 60) -> bool:
        """True at most once a minute per requester: whether to tell them a mention was refused."""
        return bool(self.redis.set(Keys.busy_notice(team, user), "1", nx=True, ex=seconds))

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
        return Accepted(as_text(self._promise(_CLAIM_RETRY, keys, args, "retry")))

    def retry_claimed_by(self, run_id: str, failure_ts: str) -> str | None:
        raw = self.redis.get(Keys.retry_claim(run_id, failure_ts))
        return as_text(raw) if raw else None

    def unclaim_retry(self, run_id: str, failure_ts: str) -> None:
        if failure_ts:
            self.redis.delete(Keys.retry_claim(run_id, failure_ts))
