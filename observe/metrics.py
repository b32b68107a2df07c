"""The product's figures, kept in Redis so that the bot's `/metrics` shows every process's.

Why Redis and not prometheus_client's multiprocess mode: that mode sums files that the processes of
ONE host write into a shared directory. Our figures come from gunicorn's workers, from RQ work
horses that are forked per job and exit when it ends, from watchdogs, and from workers that may
run on other hosts than the bot. They all share one thing, Redis, so that is where the figures live
(`store.counters` keeps them; this module names their fields and works out what each write adds):

- one hash holding every counter and every histogram bucket. A write is one HINCRBY (a histogram:
  a bucket and its sum, in one pipeline); a scrape is one HGETALL, pipelined with the gauges it
  computes (`observe.scrape.Collector`). No TTL: the label sets are bounded (every label takes its
  values from a fixed list here, or for `profile` from the config's profile names, anything else
  counts as `other`; never a run id, user id or channel), so the hash stays a few hundred fields,
  forever.
- per run, what of it has been counted already: a run's turns, model requests and tokens are
  counted as deltas of its state's own totals, and its tool calls once per turn, so a run resumed,
  retried or re-driven after a crash is never counted twice.
- per park, when the click that completed it happened, so the worker that resumes it can observe
  the click-to-resume time.

A metrics write never fails a run or an ack: every function here catches and logs (once per
process, then at debug level) and goes on.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import redis

from harness import texts as harness_texts
from harness.config import Approvals
from harness.loop import TurnDone
from harness.policy import Tier
from harness.state import PendingCall, RunState, Verdict
from harness.valves import Valve
from observe.families import (
    BUDGET_TOKENS,
    CLICK_TTL,
    DECISION_SECONDS,
    DECISIONS,
    IN_FLIGHT,
    MENTIONS,
    NONE,
    REPLICA_SHORTFALLS,
    REQUESTS,
    RESUME_SECONDS,
    RUN_MARK_TTL,
    RUNS,
    SLOT_WAIT,
    TOKEN_KINDS,
    TOKENS,
    TOOL_CALLS,
    TURNS,
    WAIT_SECONDS,
    Family,
    bucket_field,
    counter_field,
    sum_field,
    tool_label,
)
from store import Accepted, Beside, Store, counters

log = logging.getLogger(__name__)


class _Warned:
    """Log the first failed write of this process as a warning, later ones at debug level."""

    done = False


def failed(what: str, exc: Exception) -> None:
    if _Warned.done:
        log.debug("metrics: cannot record %s (%s)", what, exc)
        return
    _Warned.done = True
    log.warning("metrics: cannot record %s (%s); going on without it (said once per process)", what, exc)


def counting_store(connection: redis.Redis) -> Store:
    """A store that counts its writes no replica acknowledged in time (`store.replicas`), built so
    from the start: nothing is patched into it later, on whatever thread first touches it."""
    return Store(connection, shortfall=lambda promise: incr(connection, REPLICA_SHORTFALLS, write=promise))


def incr(connection: redis.Redis, family: Family, amount: int = 1, **labels: Any) -> None:
    """Add `amount` to a counter."""
    try:
        counters.incr(connection, counter_field(family, **labels), amount)
    except Exception as exc:  # a figure is never worth a failed run or ack
        failed(family.name, exc)


def observe_slot_wait(connection: redis.Redis, waited: float | None, in_flight: int) -> None:
    """A job started on a slot: how long it waited for one (None: unknown), and how many jobs its
    horse drives now, itself included; one round trip."""
    try:
        observations = [(IN_FLIGHT, float(in_flight))]
        if waited is not None:
            observations.append((SLOT_WAIT, max(0.0, waited)))
        counts: list[tuple[str, int]] = []
        sums: list[tuple[str, float]] = []
        for family, value in observations:
            bound = next((b for b in family.buckets if value <= b), float("inf"))
            counts.append((bucket_field(family, (), bound), 1))
            sums.append((sum_field(family, ()), value))
        counters.add(connection, counts, sums)
    except Exception as exc:
        failed(SLOT_WAIT.name, exc)


def observe(connection: redis.Redis, family: Family, seconds: float, **labels: Any) -> None:
    """Count one observation of a histogram (its bucket and its sum, in one round trip)."""
    try:
        values = family.values(labels)
        seconds = max(0.0, float(seconds))
        bound = next((b for b in family.buckets if seconds <= b), float("inf"))
        counters.add(
            connection, [(bucket_field(family, values, bound), 1)], [(sum_field(family, values), seconds)]
        )
    except Exception as exc:
        failed(family.name, exc)


class Gathered:
    """Histogram observations gathered in this process and written together, one round trip at
    most `every` seconds after the first of them (a timer thread; at exit, at once).

    For what is observed on every request, after its answer: the bot's ack times. A round trip per
    answer was a fifth of an acked mention's CPU (tests/bench/ack_inprocess.py); gathered, it is
    a dictionary update. What a process killed outright had not written yet (at most `every`
    seconds of observations) is lost, as a scrape between two writes would not have seen it yet.
    """

    def __init__(self, connection: redis.Redis, every: float = 1.0) -> None:
        self._connection = connection
        self._every = every
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._sums: dict[str, float] = {}
        self._armed_in = 0  # the pid whose timer is armed (a forked child arms its own)
        atexit.register(self.flush)

    def observe(self, family: Family, seconds: float, **labels: Any) -> None:
        try:
            values = family.values(labels)
            seconds = max(0.0, float(seconds))
            bound = next((b for b in family.buckets if seconds <= b), float("inf"))
            bucket, total = bucket_field(family, values, bound), sum_field(family, values)
        except Exception as exc:
            failed(family.name, exc)
            return
        with self._lock:
            self._counts[bucket] = self._counts.get(bucket, 0) + 1
            self._sums[total] = self._sums.get(total, 0.0) + seconds
            if self._armed_in == os.getpid():
                return
            self._armed_in = os.getpid()
        timer = threading.Timer(self._every, self.flush)
        timer.name, timer.daemon = "metrics-gathered", True
        timer.start()

    def flush(self) -> None:
        """Write what was gathered, in one round trip."""
        with self._lock:
            counts, sums, self._counts, self._sums = self._counts, self._sums, {}, {}
            self._armed_in = 0
        if not counts:
            return
        try:
            counters.add(self._connection, counts.items(), sums.items())
        except Exception as exc:
            failed("gathered observations", exc)


def step_account(
    run_id: str,
    state: RunState,
    events: Iterable[Any] = (),
    *,
    profile: str = "",
    source_of: Callable[[str], str] | None = None,
) -> Beside:
    """What a step of `run_id` added, as a write for the run's next save to carry: turns, requests
    and tokens (as deltas of the state's totals) and the calls of a turn just done (once per turn
    number), those that asked for approval also by their decision, tool and `profile`.
    Idempotent, so a save sent again counts it once.

    `source_of`: where a tool comes from (`Catalog.source`), which bounds the tool label; None:
    every tool is `other`."""
    usage = state.usage
    totals = [
        ("turns", state.turns, counter_field(TURNS)),
        ("requests", state.requests, counter_field(REQUESTS)),
        *((kind, getattr(usage, kind), counter_field(TOKENS, kind=kind)) for kind in TOKEN_KINDS),
    ]
    turn, calls = 0, tuple[PendingCall, ...]()
    for event in events:
        if isinstance(event, TurnDone):
            turn, calls = event.turn, event.calls
    counted = [counter_field(TOOL_CALLS, tier=c.tier.value, outcome=call_outcome(c)) for c in calls]
    for c in calls:
        if c.tier is Tier.ASK and c.decision is not None:
            tool = tool_label(c.name, source_of(c.name) if source_of else "")
            verdict = c.decision.verdict.value
            counted.append(counter_field(DECISIONS, verdict=verdict, tool=tool, profile=profile))
    return counters.step_counted(run_id, RUN_MARK_TTL, totals, turn, counted)


def stepped(
    connection: redis.Redis,
    run_id: str,
    state: RunState,
    events: Iterable[Any] = (),
    *,
    profile: str = "",
    source_of: Callable[[str], str] | None = None,
) -> None:
    """Count what a step of `run_id` added (`step_account`), now, in a round trip of its own."""
    try:
        step_account(run_id, state, events, profile=profile, source_of=source_of).send(connection)
    except Exception as exc:
        failed("a run's step", exc)


def call_outcome(call: PendingCall) -> str:
    """What became of a call whose turn is done: ran, error, declined, denied, expired, not_run, unknown."""
    if call.tier is Tier.DENY:
        return "denied"
    decision = call.decision
    if call.tier is Tier.ASK and decision is not None and decision.verdict is not Verdict.APPROVED:
        return "expired" if decision.verdict is Verdict.EXPIRED else "declined"
    result = call.result
    if result is None:
        return "not_run"
    if result.is_error and isinstance(result.content, str):
        if result.content == harness_texts.RESULT_OUTCOME_UNKNOWN.format(name=call.name):
            return "unknown"
        if result.content in _NOT_RUN:
            return "not_run"
    return "error" if result.is_error else "ran"


_NOT_RUN = frozenset(harness_texts.RESULT_NOT_RUN_STOPPED.format(valve=v.value) for v in Valve)


def run_ended(connection: redis.Redis, record: Any, valve: str = "") -> None:
    """Count a run that ended (`record.status`: finished, stopped or failed), and log it."""
    status = getattr(record.status, "value", str(record.status))
    label = str(getattr(valve, "value", valve) or NONE)
    incr(connection, RUNS, outcome=status, valve=label)
    log.info("run ended: %s%s", status, f" ({label})" if label != NONE else "")


def decided(
    connection: redis.Redis, record: Any, verdict: Verdict, approvals: Approvals, calls: int = 1
) -> None:
    """A click decided a park's call (or its limit; `calls` of them, for Approve all): observe the
    time since the park (its expiry less `expire_after_minutes`) once per call, and note when it
    happened for the click-to-resume time. One round trip."""
    try:
        now = time.time()
        if record.expires_at is None:
            return
        parked_at = record.parked_at(approvals.expire_after_minutes)  # each Extend included
        seconds = max(0.0, now - parked_at)
        bound = next((b for b in DECISION_SECONDS.buckets if seconds <= b), float("inf"))
        counts: list[tuple[str, int]] = []
        sums: list[tuple[str, float]] = []
        for family, labels in (
            (DECISION_SECONDS, {"verdict": verdict.value}),
            (WAIT_SECONDS, {"profile": getattr(record, "profile", "")}),
        ):
            values = family.values(labels)
            counts.append((bucket_field(family, values, bound), calls))
            sums.append((sum_field(family, values), seconds * calls))
        clicked = counters.Clicked(record.run_id, record.park_id, now, CLICK_TTL)
        counters.add(connection, counts, sums, clicked=clicked)
    except Exception as exc:
        failed(DECISION_SECONDS.name, exc)


def resume_account(run_id: str, park_id: int, decisions: Mapping[str, Any]) -> Beside:
    """Every decision of a park is in and a worker resumes the run: the time since the click that
    completed it, observed once (the click's note is taken), as a write for the resume's save to
    carry. A park completed by its expiry is not a click's: its note is only forgotten."""
    expired = any(getattr(d, "verdict", None) is Verdict.EXPIRED for d in decisions.values())
    values = RESUME_SECONDS.values({})
    buckets = [(b, bucket_field(RESUME_SECONDS, values, b)) for b in (*RESUME_SECONDS.buckets, float("inf"))]
    sums = sum_field(RESUME_SECONDS, values)
    return counters.resume_counted(run_id, park_id, time.time(), not expired, sums, buckets)


def resumed(connection: redis.Redis, run_id: str, park_id: int, decisions: Mapping[str, Any]) -> None:
    """`resume_account`, now, in a round trip of its own."""
    try:
        resume_account(run_id, park_id, decisions).send(connection)
    except Exception as exc:
        failed(RESUME_SECONDS.name, exc)


def mention(connection: redis.Redis, result: str) -> None:
    """Count a mention delivered to the bot, by what became of it (`Accepted`)."""
    incr(connection, MENTIONS, result=result)


def mention_counter() -> dict[Accepted, str]:
    """Where `store.admission.accept_event` counts a mention as `mention` would, in the same step as it
    records it: the counter field of each outcome."""
    return {a: counter_field(MENTIONS, result=a.value) for a in Accepted}


def budget_counter(profile: str) -> str:
    """Where `store.budgets.settle` counts a request's cost for `harness_budget_tokens`, in the same
    step as it counts it against the budgets: the counter field of `profile`."""
    return counter_field(BUDGET_TOKENS, profile=profile)
