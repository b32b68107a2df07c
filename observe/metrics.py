"""The product's figures, kept in Redis so that the bot's `/metrics` shows every process's.

Why Redis and not prometheus_client's multiprocess mode: that mode sums files that the processes of
ONE host write into a shared directory. Our figures come from gunicorn's workers, from RQ work
horses that are forked per job and exit when it ends, from watchdogs, and from workers that may
run on other hosts than the bot. They all share one thing, Redis, so that is where the figures live:

- `harness:metrics:counters`, one hash holding every counter and every histogram bucket. A write
  is one HINCRBY (a histogram: a bucket and its sum, in one pipeline); a scrape is one HGETALL,
  pipelined with the gauges it computes (`Collector`). No TTL: the label sets are bounded (every
  label takes its values from a fixed list here, or for `profile` from the config's profile names,
  anything else counts as `other`; never a run id, user id or channel), so the hash stays a few
  hundred fields, forever.
- `harness:metrics:run:{run_id}`, what of a run has been counted already: a run's turns, model
  requests and tokens are counted as deltas of its state's own totals, and its tool calls once per
  turn, so a run resumed, retried or re-driven after a crash is never counted twice.
- `harness:metrics:clicked:{run_id}:{park}`, when the click that completed a park happened, so the
  worker that resumes it can observe the click-to-resume time.

A metrics write never fails a run or an ack: every function here catches and logs (once per
process, then at debug level) and goes on.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from harness import texts as harness_texts
from harness.config import Approvals, Config
from harness.loop import TurnDone
from harness.policy import Tier
from harness.state import PendingCall, RunState, Verdict
from harness.valves import Valve
from observe import gauges
from store import DAY, Accepted, Beside, Keys, Store
from store.replicas import PROMISES

log = logging.getLogger(__name__)

OTHER = "other"  # the value a label takes when it is given one not in its list
NONE = "none"
RUN_MARK_TTL = 8 * DAY  # a run record lives 7 days after its last write; a retry can come until then
CLICK_TTL = DAY


@dataclass(frozen=True)
class ToolNames:
    """A label whose values are the names of the tools a config offers, as `tool_label` gives
    them (a built-in's or a module tool's name, `SERVER__*` for all of an MCP server's tools,
    `other`): the config bounds them, and the writer maps every name through `tool_label` first.
    `shape` is all the scrape can check of them."""

    shape: re.Pattern[str]


@dataclass(frozen=True)
class Family:
    """One metric: its name, help, labels (each with the only values it may take) and buckets."""

    name: str  # for a counter, without `_total` (prometheus_client adds it)
    help: str
    # Each label's allowed values: a fixed list, a pattern (values the config bounds: profile
    # names), or `ToolNames` (the tools a config offers, as `tool_label` names them).
    labels: Mapping[str, tuple[str, ...] | re.Pattern[str] | ToolNames] = field(default_factory=dict)
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds; empty: a counter

    @property
    def histogram(self) -> bool:
        return bool(self.buckets)

    def values(self, given: Mapping[str, Any]) -> tuple[str, ...]:
        """The label values of `given`, each one of its label's allowed values, else `other`."""
        out = []
        for name, allowed in self.labels.items():
            if isinstance(allowed, ToolNames):
                value = str(given.get(name) or "")
                out.append(value if allowed.shape.fullmatch(value) else OTHER)
                continue
            if isinstance(allowed, re.Pattern):
                value = str(given.get(name) or "")
                out.append(value if allowed.fullmatch(value) else OTHER)
                continue
            value = str(given.get(name) or NONE)
            out.append(value if value in allowed else OTHER)
        return tuple(out)


RUN_OUTCOMES = ("finished", "stopped", "failed", NONE)
RUN_VALVES = (*(v.value for v in Valve), "expired", "refused", NONE)
TOKEN_KINDS = ("input", "output", "cache_creation", "cache_read")
TIERS = tuple(t.value for t in Tier)
CALL_OUTCOMES = ("ran", "error", "declined", "denied", "expired", "not_run", "unknown")
MENTION_RESULTS = ("new", "duplicate", "user_busy", "channel_busy")
VERDICTS = tuple(v.value for v in Verdict)
ACK_KINDS = ("event", "interaction")

RUNS = Family(
    "harness_runs_ended",
    "Runs that ended, by outcome (finished, stopped, failed) and the valve that stopped them.",
    {"outcome": RUN_OUTCOMES, "valve": RUN_VALVES},
)
TURNS = Family("harness_turns", "Turns of tool calls taken by runs.")
REQUESTS = Family("harness_model_requests", "Model requests made by runs.")
TOKENS = Family("harness_tokens", "Tokens billed to runs, by kind.", {"kind": TOKEN_KINDS})
TOOL_CALLS = Family(
    "harness_tool_calls",
    "Tool calls the model asked for, by policy tier and what became of them.",
    {"tier": TIERS, "outcome": CALL_OUTCOMES},
)
MENTIONS = Family(
    "harness_mentions",
    "Mentions of the bot delivered by Slack: new (a run was started), duplicate, or refused by a bound.",
    {"result": MENTION_RESULTS},
)
JOBS_RETRIED = Family("harness_jobs_retried", "RQ jobs that failed and were scheduled to run again.")
JOBS_FAILED = Family("harness_jobs_failed", "RQ jobs that failed with no retry left.")
HORSES_REPLACED = Family(
    "harness_work_horses_replaced",
    "Prefork work horses replaced, by why: crashed, memory, threads (one a tool left running), jobs, "
    "loop (RQ quit on an error), stopped, reload (the config was read again).",
    {"reason": ("crashed", "memory", "threads", "jobs", "loop", "stopped", "reload")},
)
RECOVERED = Family(
    "harness_runs_recovered", "Runs whose driver died, handed to another worker by a watchdog."
)
DECISION_SECONDS = Family(
    "harness_approval_decision_seconds",
    "Time from a park (approval card or limit card posted) to the click that decided it.",
    {"verdict": VERDICTS},
    buckets=(5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, DAY),
)
RESUME_SECONDS = Family(
    "harness_click_to_resume_seconds",
    "Time from the click that completed a park to the worker resuming the run.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
ACK_SECONDS = Family(
    "harness_ack_seconds",
    "Time the bot took to answer a signed Slack request (events and interactivity), listeners included.",
    {"kind": ACK_KINDS},
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5),
)
FEEDBACK = Family(
    "harness_feedback",
    "Clicks on the thumbs under an answer, by which one.",
    {"feedback": ("good", "bad")},
)
# A profile's name (1-32 of a-z, 0-9, -) or "" for the top-level settings: what the config allows.
PROFILE_LABEL = re.compile(r"[a-z0-9-]{0,32}")
BUDGET_TOKENS = Family(
    "harness_budget_tokens",
    'Tokens spent by model requests (as [budgets] counts them), by the profile of the run; profile="" '
    "is the top-level settings.",
    {"profile": PROFILE_LABEL},
)
WAIT_SECONDS = Family(
    "harness_approval_wait_seconds",
    "Time from a park to the click that decided it (an expiry is no decision), by the run's profile; "
    'profile="" is the top-level settings.',
    {"profile": PROFILE_LABEL},
    buckets=DECISION_SECONDS.buckets,
)
EXPIRATIONS = Family(
    "harness_approval_expirations",
    "Calls (and limit questions) nobody decided before their park expired, by the run's profile; "
    'profile="" is the top-level settings.',
    {"profile": PROFILE_LABEL},
)
# An API tool name (`^[a-zA-Z0-9_-]{1,64}$`), or an MCP server's (1-32 of a-z, 0-9, -) then `__*`.
TOOL_LABEL = ToolNames(re.compile(r"[A-Za-z0-9_-]{1,64}|[a-z0-9-]{1,32}__\*"))
MCP_SEPARATOR = "__"  # harness.tools.mcp.SEPARATOR: an MCP tool is named SERVER__TOOL
DECISIONS = Family(
    "harness_approval_decisions",
    "Tool calls that asked for approval, by how they were decided (approved, declined, expired), the "
    "tool (SERVER__* for an MCP server's) and the run's profile; counted when the run goes on.",
    {"verdict": VERDICTS, "tool": TOOL_LABEL, "profile": PROFILE_LABEL},
)
SLOT_WAIT = Family(
    "harness_job_slot_wait_seconds",
    "Time a job waited in the queue until a worker's slot started it (enqueued, or retried, to start).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
IN_FLIGHT = Family(
    "harness_horse_runs_in_flight",
    "Jobs a work horse was driving at once, itself included, observed as each job started "
    "(at most HARNESS_WORKER_CONCURRENCY).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)
REPLICA_SHORTFALLS = Family(
    "harness_replica_wait_shortfalls",
    "Writes a promise rests on (a mention accepted, a decision, a Stop, a call's write-ahead mark, a park, "
    "a run's end) that no replica acknowledged within HARNESS_REPLICA_WAIT_MS: on the Redis master only.",
    {"write": PROMISES},
)
FAMILIES = (
    RUNS,
    TURNS,
    REQUESTS,
    TOKENS,
    TOOL_CALLS,
    MENTIONS,
    JOBS_RETRIED,
    JOBS_FAILED,
    HORSES_REPLACED,
    RECOVERED,
    DECISION_SECONDS,
    RESUME_SECONDS,
    ACK_SECONDS,
    FEEDBACK,
    BUDGET_TOKENS,
    WAIT_SECONDS,
    EXPIRATIONS,
    DECISIONS,
    REPLICA_SHORTFALLS,
    SLOT_WAIT,
    IN_FLIGHT,
)


def tool_label(name: str, source: str) -> str:
    """How the metrics name tool `name`, from where the catalog says it comes (`Catalog.source`:
    "builtin", a module, "mcp:SERVER", "" for a tool no config offers): its own name, its MCP
    server's `SERVER__*` (a server may list any number of tools, and change them), else `other`."""
    if source.startswith("mcp:"):
        return f"{source[len('mcp:') :]}{MCP_SEPARATOR}*"
    return name if source else OTHER


# --- the hash's fields -------------------------------------------------------------------------------
# counter   c|name|v1|v2…          histogram bucket   b|name|v1…|le      histogram sum   s|name|v1…


def counter_field(family: Family, **labels: Any) -> str:
    return "|".join(("c", family.name, *family.values(labels)))


def _bucket_field(family: Family, values: tuple[str, ...], bound: float) -> str:
    return "|".join(("b", family.name, *values, _le(bound)))


def _sum_field(family: Family, values: tuple[str, ...]) -> str:
    return "|".join(("s", family.name, *values))


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


# --- writes: never raise -----------------------------------------------------------------------------


class _Warned:
    """Log the first failed write of this process as a warning, later ones at debug level."""

    done = False


def _failed(what: str, exc: Exception) -> None:
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
        connection.hincrby(Keys.metric_counters(), counter_field(family, **labels), amount)
    except Exception as exc:  # a figure is never worth a failed run or ack
        _failed(family.name, exc)


def observe_slot_wait(connection: redis.Redis, waited: float | None, in_flight: int) -> None:
    """A job started on a slot: how long it waited for one (None: unknown), and how many jobs its
    horse drives now, itself included; one round trip."""
    try:
        with connection.pipeline(transaction=False) as pipe:
            observations = [(IN_FLIGHT, float(in_flight))]
            if waited is not None:
                observations.append((SLOT_WAIT, max(0.0, waited)))
            for family, value in observations:
                bound = next((b for b in family.buckets if value <= b), float("inf"))
                pipe.hincrby(Keys.metric_counters(), _bucket_field(family, (), bound), 1)
                pipe.hincrbyfloat(Keys.metric_counters(), _sum_field(family, ()), value)
            pipe.execute()
    except Exception as exc:
        _failed(SLOT_WAIT.name, exc)


def observe(connection: redis.Redis, family: Family, seconds: float, **labels: Any) -> None:
    """Count one observation of a histogram (its bucket and its sum, in one round trip)."""
    try:
        values = family.values(labels)
        seconds = max(0.0, float(seconds))
        bound = next((b for b in family.buckets if seconds <= b), float("inf"))
        with connection.pipeline(transaction=False) as pipe:
            pipe.hincrby(Keys.metric_counters(), _bucket_field(family, values, bound), 1)
            pipe.hincrbyfloat(Keys.metric_counters(), _sum_field(family, values), seconds)
            pipe.execute()
    except Exception as exc:
        _failed(family.name, exc)


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
            bucket, total = _bucket_field(family, values, bound), _sum_field(family, values)
        except Exception as exc:
            _failed(family.name, exc)
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
            with self._connection.pipeline(transaction=False) as pipe:
                for name, count in counts.items():
                    pipe.hincrby(Keys.metric_counters(), name, count)
                for name, total in sums.items():
                    pipe.hincrbyfloat(Keys.metric_counters(), name, total)
                pipe.execute()
        except Exception as exc:
            _failed("gathered observations", exc)


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
    args: list[Any] = [RUN_MARK_TTL, turn, len(totals)]
    for name, total, counter in totals:
        args += [name, int(total), counter]
    args += [counter_field(TOOL_CALLS, tier=c.tier.value, outcome=call_outcome(c)) for c in calls]
    for c in calls:
        if c.tier is Tier.ASK and c.decision is not None:
            tool = tool_label(c.name, source_of(c.name) if source_of else "")
            verdict = c.decision.verdict.value
            args.append(counter_field(DECISIONS, verdict=verdict, tool=tool, profile=profile))
    return Beside("a run's step", _ACCOUNT, (Keys.metric_run(run_id), Keys.metric_counters()), tuple(args))


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
        write = step_account(run_id, state, events, profile=profile, source_of=source_of)
        connection.register_script(write.script)(keys=list(write.keys), args=list(write.args))
    except Exception as exc:
        _failed("a run's step", exc)


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
        with connection.pipeline(transaction=False) as pipe:
            for family, labels in (
                (DECISION_SECONDS, {"verdict": verdict.value}),
                (WAIT_SECONDS, {"profile": getattr(record, "profile", "")}),
            ):
                values = family.values(labels)
                pipe.hincrby(Keys.metric_counters(), _bucket_field(family, values, bound), calls)
                pipe.hincrbyfloat(Keys.metric_counters(), _sum_field(family, values), seconds * calls)
            pipe.set(Keys.metric_clicked(record.run_id, record.park_id), repr(now), ex=CLICK_TTL)
            pipe.execute()
    except Exception as exc:
        _failed(DECISION_SECONDS.name, exc)


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


def resume_account(run_id: str, park_id: int, decisions: Mapping[str, Any]) -> Beside:
    """Every decision of a park is in and a worker resumes the run: the time since the click that
    completed it, observed once (the click's note is taken), as a write for the resume's save to
    carry. A park completed by its expiry is not a click's: its note is only forgotten."""
    expired = any(getattr(d, "verdict", None) is Verdict.EXPIRED for d in decisions.values())
    values = RESUME_SECONDS.values({})
    args: list[Any] = [repr(time.time()), "0" if expired else "1", _sum_field(RESUME_SECONDS, values)]
    for bound in (*RESUME_SECONDS.buckets, float("inf")):
        args += [
            "inf" if bound == float("inf") else repr(float(bound)),
            _bucket_field(RESUME_SECONDS, values, bound),
        ]
    keys = (Keys.metric_clicked(run_id, park_id), Keys.metric_counters())
    return Beside("the click-to-resume time", _RESUMED, keys, tuple(args))


def resumed(connection: redis.Redis, run_id: str, park_id: int, decisions: Mapping[str, Any]) -> None:
    """`resume_account`, now, in a round trip of its own."""
    try:
        write = resume_account(run_id, park_id, decisions)
        connection.register_script(write.script)(keys=list(write.keys), args=list(write.args))
    except Exception as exc:
        _failed(RESUME_SECONDS.name, exc)


def mention(connection: redis.Redis, result: str) -> None:
    """Count a mention delivered to the bot, by what became of it (`Accepted`)."""
    incr(connection, MENTIONS, result=result)


def mention_counter() -> tuple[str, dict[Accepted, str]]:
    """Where `Store.accept_event` counts a mention as `mention` would, in the same step as it
    records it: the counters' hash and the field of each outcome."""
    return Keys.metric_counters(), {a: counter_field(MENTIONS, result=a.value) for a in Accepted}


def budget_counter(profile: str) -> tuple[str, str]:
    """Where `Store.budget_settle` counts a request's cost for `harness_budget_tokens`, in the same
    step as it counts it against the budgets: the counters' hash and the field of `profile`."""
    return Keys.metric_counters(), counter_field(BUDGET_TOKENS, profile=profile)


# --- the scrape ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueKeys:
    """The RQ keys the gauges read: the queue's list, its scheduled registry, its workers' set."""

    queue: str
    scheduled: str
    workers: str

    @classmethod
    def of(cls, queue: Any) -> QueueKeys:
        from rq.worker_registration import WORKERS_BY_QUEUE_KEY

        return cls(queue.key, queue.scheduled_job_registry.key, WORKERS_BY_QUEUE_KEY % queue.name)


class Collector:
    """A prometheus_client collector of the figures in Redis plus gauges read at scrape time.

    One round trip per scrape: HGETALL of the counters pipelined with the gauges' reads (those
    whose labels the config gives, `observe.gauges`, with the config in force at the scrape). When
    Redis does not answer, the scrape raises (the bot answers 503: no figures rather than zeros).
    """

    def __init__(
        self, connection: redis.Redis, queue: QueueKeys, config: Callable[[], Config] | None = None
    ) -> None:
        self.connection = connection
        self.queue = queue
        default = Config()  # no config given (tests, tools): the built-in defaults
        self.config = config or (lambda: default)

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.hgetall(Keys.metric_counters())
            pipe.zcount(Keys.expiries(), f"({now!r}", "+inf")
            pipe.llen(self.queue.queue)
            pipe.zcard(self.queue.scheduled)
            pipe.zcard(Keys.active())
            pipe.scard(self.queue.workers)
            reads = gauges.queue_reads(pipe, self.config(), now)
            raw, parked, depth, scheduled, active, workers, *configured = pipe.execute()
        stored = {_text(k): _text(v) for k, v in raw.items()}
        for family in FAMILIES:
            yield _histogram(family, stored) if family.histogram else _counter(family, stored)
        yield GaugeMetricFamily(
            "harness_approvals_pending", "Parks waiting for a decision (approval or limit cards).", parked
        )
        yield GaugeMetricFamily("harness_queue_depth", "Jobs waiting in the RQ queue.", depth)
        yield GaugeMetricFamily(
            "harness_jobs_scheduled", "Jobs scheduled to run later (RQ retries).", scheduled
        )
        yield GaugeMetricFamily("harness_runs_active", "Runs that need a driver now, or have one.", active)
        yield GaugeMetricFamily(
            "harness_workers_registered", "RQ workers registered on the queue (see /healthz?deep=1).", workers
        )
        yield from gauges.families(reads, configured)


def _counter(family: Family, stored: Mapping[str, str]) -> Metric:
    metric = CounterMetricFamily(family.name, family.help, labels=list(family.labels))
    prefix = f"c|{family.name}|" if family.labels else f"c|{family.name}"
    for key, value in stored.items():
        if family.labels and key.startswith(prefix):
            values = key[len(prefix) :].split("|")
            if _allowed(family, values):
                metric.add_metric(values, float(value))
        elif not family.labels and key == prefix:
            metric.add_metric([], float(value))
    if not family.labels and not metric.samples:
        metric.add_metric([], 0.0)  # an unlabelled counter exists from the start
    return metric


def _histogram(family: Family, stored: Mapping[str, str]) -> Metric:
    metric = HistogramMetricFamily(family.name, family.help, labels=list(family.labels))
    bounds = [_le(b) for b in (*family.buckets, float("inf"))]
    series: dict[tuple[str, ...], dict[str, float]] = {}
    for key, value in stored.items():
        parts = key.split("|")
        if parts[0] == "b" and len(parts) == len(family.labels) + 3 and parts[1] == family.name:
            values, bound = tuple(parts[2:-1]), parts[-1]
            if _allowed(family, values) and bound in bounds:
                series.setdefault(values, {})[bound] = float(value)
    if not family.labels:
        series.setdefault((), {})
    for values, counts in sorted(series.items()):
        running, buckets = 0.0, []
        for bound in bounds:
            running += counts.get(bound, 0.0)
            buckets.append((bound, running))
        total = float(stored.get(_sum_field(family, values), 0.0))
        metric.add_metric(list(values), buckets, total)
    return metric


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _allowed(family: Family, values: Sequence[str]) -> bool:
    return len(values) == len(family.labels) and all(
        v == OTHER or _fits(v, allowed) for v, allowed in zip(values, family.labels.values(), strict=True)
    )


def _fits(value: str, allowed: tuple[str, ...] | re.Pattern[str] | ToolNames) -> bool:
    if isinstance(allowed, ToolNames):
        return bool(allowed.shape.fullmatch(value))
    if isinstance(allowed, re.Pattern):
        return bool(allowed.fullmatch(value))
    return value in allowed


def registry(
    connection: redis.Redis, queue: Any, config: Callable[[], Config] | None = None
) -> CollectorRegistry:
    """A registry holding only the product's collector (none of prometheus_client's process ones:
    they would describe one gunicorn worker of several, picked at random by each scrape).
    `config`: the config in force now (a reload may swap it), which labels some gauges."""
    found = CollectorRegistry(auto_describe=False)
    found.register(Collector(connection, QueueKeys.of(queue), config))
    return found
