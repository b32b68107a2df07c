"""The windows of counting rules (`[[policy.rules]]` with `max_calls` or `max_sum`): what ran in the
last `per`, per rule and scope, counted atomically across workers.

`Keys.meter(counter, scope, ids)` is one sorted set per window: a member per call that ran,
`{amount}|{run}:{call}` (the amount 1 for a count), scored by when it was counted, by Redis's own
clock (`TIME`), so workers whose clocks differ count in one window. Entries older than `per` are
trimmed as the window is read or counted in; the key lives `per` plus a minute after its last entry.

`take` checks and counts a call in every window it matches in one Lua step: past a limit it counts
it in none and says which; a call counted already is not counted again (a reply lost and the script
sent again counts nothing more). Whatever is read back is checked: an entry whose amount is not a
number >= 0 counts as past any limit, and a total that is not a finite number is not known.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from store.base import StorePart, as_text
from store.keys import Keys

MARGIN = 60  # seconds a window's key outlives its newest entry's `per`

_AMOUNT = """
local function amount_of(m)
  local bar = string.find(m, '|', 1, true)
  local n = bar and tonumber(string.sub(m, 1, bar - 1))
  if not n or n ~= n or n < 0 or n == math.huge then return math.huge end
  return n
end
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function total_of(key, kind, skip)
  if kind == 'calls' then
    local n = redis.call('ZCARD', key)
    if skip ~= '' then
      for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
        if string.sub(m, -#skip) == skip then n = n - 1 end
      end
    end
    return n
  end
  local total = 0
  for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if skip == '' or string.sub(m, -#skip) ~= skip then total = total + amount_of(m) end
  end
  return total
end
"""

# KEYS[1] the window. ARGV[1] per (seconds), ARGV[2] 'calls' or 'sum', ARGV[3] the suffix of the
# members left out ("|run:call"). Returns the total as text. Only trims (idempotent).
_SEEN = (
    _AMOUNT
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.6f', now() - tonumber(ARGV[1])))
return string.format('%.17g', total_of(KEYS[1], ARGV[2], ARGV[3]))
"""
)

# KEYS: one window per count. ARGV[1] n, then per count: member, per, kind, limit, amount, forced
# ('1': counted whatever its window holds). Returns {0, ''} when the call is counted (or already
# was), else {i, total}: the first count it would go past and what its window held; then nothing
# is counted. Idempotent: a member already there is not added again.
_TAKE = (
    _AMOUNT
    + """
local at = now()
local add = {}
for i = 1, tonumber(ARGV[1]) do
  local a = 2 + (i - 1) * 6
  local key, member = KEYS[i], ARGV[a]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.6f', at - tonumber(ARGV[a + 1])))
  if not redis.call('ZSCORE', key, member) then
    local total = total_of(key, ARGV[a + 2], '')
    if ARGV[a + 5] ~= '1' and total + tonumber(ARGV[a + 4]) > tonumber(ARGV[a + 3]) then
      return {i, string.format('%.17g', total)}
    end
    add[#add + 1] = i
  end
end
for _, i in ipairs(add) do
  local a = 2 + (i - 1) * 6
  redis.call('ZADD', KEYS[i], string.format('%.6f', at), ARGV[a])
  redis.call('EXPIRE', KEYS[i], math.floor(tonumber(ARGV[a + 1])) + tonumber(ARGV[#ARGV]))
end
return {0, ''}
"""
)

# KEYS: windows. ARGV[1] the suffix of the call's members ("|run:call"). Removes them (idempotent).
_GIVE_BACK = """
for _, key in ipairs(KEYS) do
  for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if string.sub(m, -#ARGV[1]) == ARGV[1] then redis.call('ZREM', key, m) end
  end
end
return 1
"""


@dataclass(frozen=True)
class Window:
    """One window: a counting rule's counter (`harness.counting.counter_id`), its scope, and the
    ids naming the scope's instance (`harness.counting.Where.ids`). `key` raises `BadId` for ids
    the store does not write."""

    counter: str
    scope: str
    ids: tuple[str, ...]

    @property
    def key(self) -> str:
        return Keys.meter(self.counter, self.scope, self.ids)


@dataclass(frozen=True)
class Entry:
    """A call to count in one window: `amount` (1 for a count) against `limit` over `per` seconds;
    `forced`: counted whatever the window holds."""

    window: Window
    per: int
    kind: str  # "calls" or "sum"
    limit: float
    amount: float
    forced: bool = False


def _member(amount: float, run_id: str, call_id: str) -> str:
    return f"{amount!r}|{_suffix_id(run_id, call_id)}"


def _suffix_id(run_id: str, call_id: str) -> str:
    return f"{run_id}:{call_id}"


def _total(raw: Any) -> float | None:
    """A total read back: a finite number >= 0, else None (not known)."""
    try:
        value = float(as_text(raw))
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


class MeterStore(StorePart):
    """The windows of counting rules: read, counted in, given back."""

    def seen(self, window: Window, per: int, kind: str, run_id: str, call_id: str) -> float | None:
        """What `window` holds of the last `per` seconds, the call itself left out; None
        when what Redis answers is not a total."""
        suffix = "|" + _suffix_id(run_id, call_id)
        return _total(self._script(_SEEN)(keys=[window.key], args=[per, kind, suffix]))

    def take(self, run_id: str, call_id: str, entries: Sequence[Entry]) -> tuple[int, float | None] | None:
        """Count the call in every window of `entries`, or in none: None when counted (or counted
        already), else the index of the first entry it would go past and what that window held."""
        if not entries:
            return None
        args: list[Any] = [len(entries)]
        for e in entries:
            kind = "sum" if e.kind == "sum" else "calls"
            args += [_member(e.amount, run_id, call_id), e.per, kind, repr(e.limit), repr(e.amount)]
            args.append("1" if e.forced else "0")
        args.append(MARGIN)
        reply = self._script(_TAKE)(keys=[e.window.key for e in entries], args=args)
        index = int(reply[0]) if isinstance(reply, list) and len(reply) == 2 else -1
        if index == 0:
            return None
        if not 1 <= index <= len(entries):  # an answer we did not write: say past the first limit
            return 0, None
        return index - 1, _total(reply[1])

    def give_back(self, windows: Sequence[Window], run_id: str, call_id: str) -> None:
        """Uncount the call from `windows` (it was counted, then did not run)."""
        if windows:
            self._script(_GIVE_BACK)(keys=[w.key for w in windows], args=["|" + _suffix_id(run_id, call_id)])
