"""Daily token budgets (`[budgets]`): what each user and each channel spent today, and the holds of
the requests in flight against it, shared by every worker.

Tokens are counted as valve 2 counts them (input + output + cache creation + cache read), per UTC
day, per user (across every channel) and per channel (a D… channel is one DM conversation).

The check and the count are one Lua script each, so that concurrent requests on any number of
workers never spend a budget by more than one request's usage (docs/operations.md):

- `budget_admit` is sent right before a model request with an upper bound of what it may cost (its
  input estimate plus `max_tokens`). It is admitted when, for every budget it counts against,
  `spent + the holds of the other requests in flight < budget`, and then holds its bound on each.
  At `spent >= budget` it is refused (`SPENT`); below it but with the holds making it full, it must
  WAIT for them to settle. A hold carries a deadline: one left by a worker that died lapses.
- `budget_settle` is sent after the reply: it drops the request's holds and adds what it really
  cost, once (the request id goes into the day's set of settled ids, so a script redis-py sends again
  after losing its reply counts nothing twice). It also counts the spend per profile for `/metrics`.

A request is counted in the day it was admitted, even when its reply comes after midnight: that
day's admissions were the ones that reserved it.

Keys (`Keys.budget_*`), each living a bit over a day past its last write:
`harness:budget:{day}:spent` one hash, fields `user|TEAM|USER` and `channel|TEAM|CHANNEL` (the
day's total) and `profile|user|TEAM|USER|PROFILE` (the part spent under a profile, "" the top
level: what `python -m workers status` compares with that profile's budget);
`harness:budget:{day}:holds:{user|channel}:{TEAM}:{ID}` one hash per budget, request id ->
"tokens deadline"; `harness:budget:{day}:settled` the set of request ids counted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import redis

from store.base import Beside, StorePart, as_text
from store.keys import DAY, Keys, check_id

BUDGET_TTL = DAY + 6 * 3600  # a day's keys outlive it by a few hours (a reply that comes after midnight)
HOLD_SECONDS = 600  # a hold lapses after this: longer than a model request with the SDK's retries
USER_SCOPE, CHANNEL_SCOPE = "user", "channel"


def utc_day(now: float) -> str:
    """The UTC day of `now` (seconds since the epoch), as the keys spell it: YYYY-MM-DD."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")


@dataclass(frozen=True)
class Scope:
    """One budget a request counts against: a user's (across every channel) or a channel's."""

    kind: str  # USER_SCOPE or CHANNEL_SCOPE
    team: str
    who: str  # the user id or the channel id
    budget: int  # tokens per UTC day; 0: none (spend is still counted)

    @property
    def field(self) -> str:
        """The day's total of this user or channel in the `spent` hash."""
        return f"{self.kind}|{check_id('team', self.team)}|{check_id(self.kind, self.who)}"

    def profile_field(self, profile: str) -> str:
        """The part of the day's total spent under `profile` ("" the top level)."""
        return f"profile|{self.field}|{profile}"

    def holds(self, day: str) -> str:
        return Keys.budget_holds(day, self.kind, self.team, self.who)


class Admission(StrEnum):
    ADMITTED = "ok"  # its bound is held on every budget: make the request
    SPENT = "spent"  # a budget is spent today: no request
    WAIT = "wait"  # not spent, but the requests in flight hold the rest: ask again once they settle


@dataclass(frozen=True)
class Admitted:
    """The answer of `budget_admit`: the request's day, and for SPENT or WAIT which budget."""

    outcome: Admission
    day: str
    scope: Scope | None = None
    spent: int = 0
    held: int = 0  # what the other requests in flight hold on that budget


@dataclass(frozen=True)
class SpentToday:
    """One line of the day's spend: a user or a channel, and the part under one profile."""

    kind: str
    team: str
    who: str
    profile: str  # "" the top level
    under_profile: int  # spent under this profile
    total: int  # the day's total of the user or channel, every profile


# KEYS[1] the day's spend, KEYS[2…] the holds of each budget. ARGV[1] the request id, ARGV[2] its bound,
# ARGV[3] now, ARGV[4] the hold's deadline, ARGV[5] TTL, ARGV[6] "1": Continue granted it past the
# budgets (held, never refused), then for each budget its field and its size (0: none).
# Spent is checked on every budget before any waits, so a spent budget stops a run rather than
# making it wait. Lapsed holds are dropped on the way. Run twice, it holds the same bound again.
_ADMIT = """
local n = #KEYS - 1
local now = tonumber(ARGV[3])
local granted = ARGV[6] == '1'
local spent, held = {}, {}
for i = 1, n do
  spent[i] = tonumber(redis.call('HGET', KEYS[1], ARGV[5 + 2 * i]) or '0')
  held[i] = 0
  local holds = redis.call('HGETALL', KEYS[1 + i])
  for j = 1, #holds, 2 do
    local amount, deadline = string.match(holds[j + 1], '^(%d+) (%S+)$')
    if not amount or tonumber(deadline) <= now then
      redis.call('HDEL', KEYS[1 + i], holds[j])
    elseif holds[j] ~= ARGV[1] then
      held[i] = held[i] + tonumber(amount)
    end
  end
end
if not granted then
  for i = 1, n do
    local budget = tonumber(ARGV[6 + 2 * i])
    if budget > 0 and spent[i] >= budget then return {'spent', i, spent[i], held[i]} end
  end
  for i = 1, n do
    local budget = tonumber(ARGV[6 + 2 * i])
    if budget > 0 and spent[i] + held[i] >= budget then return {'wait', i, spent[i], held[i]} end
  end
end
for i = 1, n do
  redis.call('HSET', KEYS[1 + i], ARGV[1], ARGV[2] .. ' ' .. ARGV[4])
  redis.call('EXPIRE', KEYS[1 + i], ARGV[5])
end
return {'ok', 0, 0, 0}
"""

# KEYS[1] the day's spend, KEYS[2] the day's settled ids, KEYS[3] the metrics' counters, KEYS[4…] the
# holds of each budget. ARGV[1] the request id, ARGV[2] what it cost, ARGV[3] TTL, ARGV[4] the
# metrics' field of its profile ("": not counted there), ARGV[5…] the spend fields to add it to.
# Idempotent: the id goes into the settled set first, so sent again it counts nothing more.
_SETTLE = """
for i = 4, #KEYS do redis.call('HDEL', KEYS[i], ARGV[1]) end
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('EXPIRE', KEYS[2], ARGV[3])
local tokens = tonumber(ARGV[2])
if tokens > 0 then
  for j = 5, #ARGV do redis.call('HINCRBY', KEYS[1], ARGV[j], tokens) end
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  if ARGV[4] ~= '' then redis.call('HINCRBY', KEYS[3], ARGV[4], tokens) end
end
return 1
"""


class BudgetStore(StorePart):
    """The daily budgets' spend and holds: admitted and settled atomically, read by the bot and status."""

    def admit(
        self,
        scopes: Sequence[Scope],
        request_id: str,
        bound: int,
        *,
        granted: bool = False,
        now: float | None = None,
        hold_seconds: float = HOLD_SECONDS,
    ) -> Admitted:
        """Admit a request of at most `bound` tokens against `scopes` (and hold it), or say why not."""
        now = time.time() if now is None else now
        day = utc_day(now)
        keys = [Keys.budget_spent(day), *(s.holds(day) for s in scopes)]
        args: list[Any] = [
            check_id("request", request_id),
            max(0, int(bound)),
            repr(now),
            repr(now + hold_seconds),
            BUDGET_TTL,
            "1" if granted else "0",
        ]
        for each in scopes:
            args += [each.field, max(0, int(each.budget))]
        raw = self._script(_ADMIT)(keys=keys, args=args)
        outcome, index, spent, held = as_text(raw[0]), int(raw[1]), int(raw[2]), int(raw[3])
        scope = scopes[index - 1] if index > 0 else None
        return Admitted(Admission(outcome), day, scope, spent, held)

    def settle(
        self,
        day: str,
        scopes: Sequence[Scope],
        request_id: str,
        tokens: int,
        *,
        profile: str = "",
        counted_in: str = "",
    ) -> bool:
        """Count what request `request_id` of `day` cost against `scopes`, once; drop its holds.

        `counted_in`: the counter field where the spend of its profile is counted in the same step,
        in the metrics' hash (`observe.metrics.budget_counter`; "": not counted there). False when
        it was counted before.
        """
        write = budget_settled(day, scopes, request_id, tokens, profile=profile, counted_in=counted_in)
        return bool(self._script(write.script)(keys=list(write.keys), args=list(write.args)))

    def spent(self, scopes: Sequence[Scope], now: float | None = None) -> list[int]:
        """What each of `scopes` spent today (UTC)."""
        if not scopes:
            return []
        day = utc_day(time.time() if now is None else now)
        raw = self.redis.hmget(Keys.budget_spent(day), [s.field for s in scopes])
        return [int(v) if v is not None else 0 for v in raw]

    def today(self, now: float | None = None) -> list[SpentToday]:
        """Every user's and channel's spend today (UTC), one line per profile they spent under."""
        day = utc_day(time.time() if now is None else now)
        stored = {as_text(k): int(v) for k, v in self.redis.hgetall(Keys.budget_spent(day)).items()}
        return list(_lines(stored))


# KEYS[1] the day's spend. Returns pairs (`scope|profile`, tokens): for each scope (user, channel) and
# profile, the highest day total (every profile's spend) of a user or channel that spent under that
# profile, which is what `gates.budgets.near` compares with the profile's budget. Worked out in
# Redis, so that a scrape of `/metrics` reads a few numbers rather than every user's line.
BUDGET_PEAKS = """
local flat = redis.call('HGETALL', KEYS[1])
local totals, peaks, out = {}, {}, {}
for i = 1, #flat, 2 do totals[flat[i]] = tonumber(flat[i + 1]) end
for name, value in pairs(totals) do
  local kind, owner, profile = string.match(name, '^profile|(%a+)|([^|]*|[^|]*)|(.*)$')
  if kind then
    local total = totals[kind .. '|' .. owner] or value
    local key = kind .. '|' .. profile
    if total > (peaks[key] or -1) then peaks[key] = total end
  end
end
for key, total in pairs(peaks) do
  out[#out + 1] = key
  out[#out + 1] = tostring(total)
end
return out
"""


def queue_budget_peaks(pipe: redis.Redis, now: float) -> None:
    """Queue on `pipe` `BUDGET_PEAKS` over the spend of `now`'s day (one reply: read it with
    `budget_peaks`). An EVAL, not a registered script: redis-py checks those with a round trip of its
    own before each pipeline; Redis caches the script's compiled body anyway."""
    pipe.eval(BUDGET_PEAKS, 1, Keys.budget_spent(utc_day(now)))


def budget_peaks(raw: Sequence[Any]) -> dict[tuple[str, str], int]:
    """`BUDGET_PEAKS`'s answer as (scope, profile) -> the highest day total of that scope."""
    peaks = {}
    for key, value in zip(raw[::2], raw[1::2], strict=True):
        scope, _, profile = as_text(key).partition("|")
        peaks[(scope, profile)] = int(float(as_text(value)))
    return peaks


def _lines(stored: dict[str, int]) -> Iterable[SpentToday]:
    for name, value in sorted(stored.items()):
        parts = name.split("|")
        if len(parts) != 5 or parts[0] != "profile" or parts[1] not in (USER_SCOPE, CHANNEL_SCOPE):
            continue
        _, kind, team, who, profile = parts
        yield SpentToday(kind, team, who, profile, value, stored.get(f"{kind}|{team}|{who}", value))


def budget_settled(
    day: str,
    scopes: Sequence[Scope],
    request_id: str,
    tokens: int,
    *,
    profile: str = "",
    counted_in: str = "",
) -> Beside:
    """`BudgetStore.settle` as a write to send beside a run's next save (idempotent: a
    request is counted once, whichever round trip carries it)."""
    keys = (
        Keys.budget_spent(day),
        Keys.budget_settled(day),
        Keys.metric_counters(),  # written only when `counted_in` names a field
        *(s.holds(day) for s in scopes),
    )
    fields = [f for s in scopes for f in (s.field, s.profile_field(profile))]
    args = (
        check_id("request", request_id),
        max(0, int(tokens)),
        BUDGET_TTL,
        counted_in,
        *fields,
    )
    return Beside("a model request's cost, counted in the daily budgets", _SETTLE, keys, args)
