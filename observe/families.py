"""The metric families of `/metrics`: their names, help, labels (each a closed list, so a hostile
value becomes `other`, never a new series) and how a counter or bucket is named in Redis."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.policy import Tier
from harness.state import Verdict
from harness.valves import Valve
from store import DAY
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
MCP_SEPARATOR = "__"  # harness.tools.mcp_listing.SEPARATOR: an MCP tool is named SERVER__TOOL
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


def bucket_field(family: Family, values: tuple[str, ...], bound: float) -> str:
    return "|".join(("b", family.name, *values, le(bound)))


def sum_field(family: Family, values: tuple[str, ...]) -> str:
    return "|".join(("s", family.name, *values))


def le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


# --- writes: never raise -----------------------------------------------------------------------------
