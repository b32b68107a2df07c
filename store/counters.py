"""The figures of `/metrics` as Redis holds them, and the counts of runs read beside them.

`observe.metrics` names every field (a counter, a histogram's bucket or sum) and works out what a
write adds; this module is where it lands, the one that knows the keys:

- `Keys.metric_counters()`, one hash holding every counter and every histogram bucket (`incr`,
  `add`; a mention's outcome and a request's cost are counted into it by the scripts of
  `store.admission` and `store.budgets`, given only the field). No TTL: its fields are bounded
  by the label values `observe.families` allows.
- `Keys.metric_run(run_id)`, what of a run has been counted already (`step_counted`): a run's
  totals are counted as deltas, its calls once per turn, so a run resumed, retried or re-driven
  after a crash is never counted twice.
- `Keys.metric_clicked(run_id, park)`, when the click that completed a park happened (`add`'s
  `clicked`), for the resume to observe the click-to-resume time once (`resume_counted`).

The scrape of `/metrics` and the deep health check read these, and counts of the runs the other
parts keep, with RQ's own keys in one round trip: `queue_counters`, `queue_run_counts` and
`queue_profile_parks` add their reads to the caller's pipeline. `make run` says what an earlier
start left with `runs_held`.

Nothing here catches: `observe.metrics` does, since a figure is never worth a failed run or ack.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from store.base import Beside, as_text
from store.keys import Keys, park_member


def incr(connection: redis.Redis, field: str, amount: int = 1) -> None:
    """Add `amount` to the counter `field` (one HINCRBY)."""
    connection.hincrby(Keys.metric_counters(), field, amount)


@dataclass(frozen=True)
class Clicked:
    """A click that completed park `park_id` of `run_id` at `at`, noted for `ttl` seconds: the
    worker that resumes the run observes the time since (`resume_counted`)."""

    run_id: str
    park_id: int
    at: float
    ttl: int


def add(
    connection: redis.Redis,
    counts: Iterable[tuple[str, int]] = (),
    sums: Iterable[tuple[str, float]] = (),
    *,
    clicked: Clicked | None = None,
) -> None:
    """Add each count (HINCRBY) and each sum (HINCRBYFLOAT) to its field, and note `clicked`, in one
    round trip (a pipeline, not a transaction: each write stands on its own)."""
    key = Keys.metric_counters()
    with connection.pipeline(transaction=False) as pipe:
        for field, count in counts:
            pipe.hincrby(key, field, count)
        for field, total in sums:
            pipe.hincrbyfloat(key, field, total)
        if clicked is not None:
            note = Keys.metric_clicked(clicked.run_id, clicked.park_id)
            pipe.set(note, repr(clicked.at), ex=clicked.ttl)
        pipe.execute()


# KEYS[1] the run's mark, KEYS[2] the counters. ARGV[1] mark TTL, ARGV[2] the turn whose calls follow
# (0: none), ARGV[3] n, then n triples (mark field, the run's total now, counter field), then the
# counter fields of the turn's calls. Idempotent: run twice, it counts once.
_ACCOUNT = """
local turn = tonumber(ARGV[2])
local i = 4
for _ = 1, tonumber(ARGV[3]) do
  local total = tonumber(ARGV[i + 1])
  local seen = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if total > seen then
    redis.call('HINCRBY', KEYS[2], ARGV[i + 2], total - seen)
    redis.call('HSET', KEYS[1], ARGV[i], total)
  end
  i = i + 3
end
if turn > tonumber(redis.call('HGET', KEYS[1], '~calls') or '0') then
  for j = i, #ARGV do redis.call('HINCRBY', KEYS[2], ARGV[j], 1) end
  redis.call('HSET', KEYS[1], '~calls', turn)
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return 1
"""


def step_counted(
    run_id: str, ttl: int, totals: Sequence[tuple[str, int, str]], turn: int, calls: Sequence[str]
) -> Beside:
    """A step of `run_id` counted, as a write for the run's next save to carry (or `Beside.send`).

    `totals`: (its name in the run's mark, the run's total now, the counter it adds to), each
    counted as the delta since the mark; `calls`: counter fields each counted once for turn `turn`
    (0: no turn done), whatever number of times it is sent. The mark lives `ttl` seconds."""
    args: list[Any] = [ttl, turn, len(totals)]
    for name, total, field in totals:
        args += [name, int(total), field]
    args += calls
    return Beside("a run's step", _ACCOUNT, (Keys.metric_run(run_id), Keys.metric_counters()), tuple(args))


# KEYS[1] the click's note, KEYS[2] the counters. ARGV[1] now, ARGV[2] observe (1) or only forget (0),
# ARGV[3] the sum's field, then pairs (bucket bound, its field), ascending, the last one `inf`.
# Idempotent: the note is taken, so sent twice it observes once.
_RESUMED = """
local clicked = redis.call('GET', KEYS[1])
if not clicked then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[2] ~= '1' then return 0 end
local seconds = math.max(0, tonumber(ARGV[1]) - tonumber(clicked))
for i = 4, #ARGV, 2 do
  if ARGV[i] == 'inf' or seconds <= tonumber(ARGV[i]) then
    redis.call('HINCRBY', KEYS[2], ARGV[i + 1], 1)
    break
  end
end
redis.call('HINCRBYFLOAT', KEYS[2], ARGV[3], string.format('%.6f', seconds))
return 1
"""


def resume_counted(
    run_id: str, park_id: int, now: float, observe: bool, sum_field: str, buckets: Sequence[tuple[float, str]]
) -> Beside:
    """The time from the click noted for park `park_id` (`Clicked`) to `now`, observed once in the
    histogram whose sum is `sum_field` and whose buckets are (upper bound, field), ascending, the
    last one infinite; the note is taken either way, so with `observe` false it is only forgotten.
    As a write for the resume's save to carry (or `Beside.send`)."""
    args: list[Any] = [repr(now), "1" if observe else "0", sum_field]
    for bound, field in buckets:
        args += ["inf" if bound == float("inf") else repr(float(bound)), field]
    keys = (Keys.metric_clicked(run_id, park_id), Keys.metric_counters())
    return Beside("the click-to-resume time", _RESUMED, keys, tuple(args))


# --- read at a scrape, beside RQ's keys --------------------------------------------------------


def queue_counters(pipe: redis.Redis) -> None:
    """Queue on `pipe` the read of every counter and bucket (one reply: read it with `counters_of`)."""
    pipe.hgetall(Keys.metric_counters())


def counters_of(reply: Mapping[Any, Any]) -> dict[str, str]:
    """`queue_counters`'s reply as text: field -> value."""
    return {as_text(k): as_text(v) for k, v in reply.items()}


def queue_run_counts(pipe: redis.Redis, now: float) -> None:
    """Queue on `pipe` three counts, in this order: the runs active (queued, running, or parked
    with every decision in), the parks still open at `now`, and those of them that wait on a
    server's task rather than a person (`store.tasks`)."""
    pipe.zcard(Keys.active())
    pipe.zcount(Keys.expiries(), f"({now!r}", "+inf")
    pipe.zcount(Keys.task_parks(), f"({now!r}", "+inf")


def queue_profile_parks(pipe: redis.Redis, profile: str, now: float, until: float | None = None) -> None:
    """Queue on `pipe` the count of the open parks of runs under `profile` ("": the top level) that
    expire after `now` (and by `until`, when given): one reply."""
    pipe.zcount(Keys.profile_parks(profile), f"({now!r}", "+inf" if until is None else repr(until))


def runs_held(connection: redis.Redis) -> tuple[int, int]:
    """What a Redis holds of earlier runs: (runs active, runs with a park, open or expired)."""
    active = connection.zcard(Keys.active())
    parked = {park_member(park)[0] for park in connection.zrange(Keys.expiries(), 0, -1)}
    return int(active), len(parked)
