"""The Redis store: where runs are parked, decisions recorded and Slack retries absorbed.

Every key is built in `keys`, under `harness:`, from validated ids, and is the store's own: no
module outside `store/` spells one or sends a command on one (`tests/project/test_layout.py`); it
calls a part's methods, or `counters`' functions on a connection or a pipeline. Check-and-set
lives in small Lua scripts that are safe to run twice (redis-py may retry a command whose reply
was lost), each in the module of the record it writes, beside the method that sends it:

- `keys`: every key name (the metrics' too), and the ids they are built from (`Keys`, `check_id`, `BadId`):
  `Keys` is not exported (tests import it from `store.keys`, to look at keys on purpose);
- `records`: the run record and how it is stored (`RunRecord`, `pack`, `unpack`, `RecordEncoder`);
- `admission`: a mention accepted once and a Retry claimed once, within the bounds of runs;
- `runs`: leases, fenced saves and the writes beside them, stop requests, a run's end, orphans;
- `threads`: a thread's lock, the runs queued behind it, its history;
- `parks`: parks, their decisions and votes, and the Home tab's index of who is waited on;
  `decisions`: a park's approvals hash and the decisions in it as stored (their format versions);
- `escalations`: parks whose expiry has come, reminders due to `escalate_to`;
- `held`: runs left as they were for a newer release, which wrote a record of theirs this one
  cannot read (`harness.state.NewerRecord`): no recovery, expiry or reminder touches them;
- `grants`: "Approve for this thread"; `groups`: user groups' members and handles, cached;
- `live`: a run's live messages still streaming or unsettled (what a later driver cleans up);
- `meters`: the windows of counting rules (`max_calls`, `max_sum`): what ran, per rule and scope;
- `budgets`: the daily token budgets: each user's and channel's spend today, holds of requests in flight;
- `counters`: the figures of `/metrics` (one hash, a run's marks, a click's note), and the counts of
  runs a scrape or a health check reads beside RQ's keys (functions on a connection or a pipeline);
- `config_source`: which config file the workers run with, as they said at start;
- `mcp_servers`: where each worker's MCP servers stand (up, or down and why), as it last said;
- `audit`: the audit stream of decisions (a hash chain, trimmed behind its files), the feedback
  stream of answers.

`Store` is one object on one connection, holding one part per module (`base.StorePart`):
`store.parks`, `store.runs`, `store.threads`, ...
"""

from __future__ import annotations

import redis

from store.admission import EVENT_TTL, RUN_COUNT_HORIZON, Accepted, AdmissionStore, QueuedJob
from store.audit import (
    AUDIT_MAX_AGE,
    AUDIT_MAX_ENTRIES,
    FEEDBACK_MAX_ENTRIES,
    FEEDBACK_PER_MINUTE,
    AuditLink,
    AuditStore,
    FeedbackOutcome,
    rulings_write,
)
from store.base import Beside
from store.budgets import (
    BUDGET_TTL,
    CHANNEL_SCOPE,
    HOLD_SECONDS,
    USER_SCOPE,
    Admission,
    Admitted,
    BudgetStore,
    Scope,
    SpentToday,
    budget_peaks,
    budget_settled,
    queue_budget_peaks,
    utc_day,
)
from store.config_source import ConfigSourceStore
from store.decisions import APPROVALS_VERSION, DECISION_VERSION
from store.escalations import EscalationStore, ExtendOutcome, ExtendResult
from store.grants import Grant, GrantStore, grant_slot
from store.groups import GROUP_TTL, HANDLE_TTL, GroupStore
from store.held import HeldStore
from store.inputs import InputStore
from store.keys import DAY, BadId, check_id, new_run_id
from store.live import LiveStore
from store.mcp_servers import McpServerStore, ServerState
from store.meters import Entry, MeterStore, Window
from store.parks import (
    BATCH,
    EXPIRES_FIELD,
    DecideOutcome,
    DecideResult,
    OpenPark,
    ParkRead,
    ParkStore,
    ParkView,
    Settled,
)
from store.questions import QuestionStore
from store.records import (
    AUDIT_PREVIEW_CHARS,
    ENDED,
    FINISHED_RUN_TTL,
    IM,
    LIMIT_CALL,
    RECORD_VERSION,
    RECORD_VERSIONS,
    CallTool,
    LimitAsk,
    RecordEncoder,
    RunRecord,
    RunStatus,
    pack,
    unpack,
)
from store.replicas import Replicas, Shortfall
from store.runs import PENDING_TTL, FinishResult, RunStore, Saved
from store.tasks import TaskEntry, TaskStore
from store.threads import HISTORY_VERSION, HISTORY_VERSIONS, THREAD_TTL, ThreadStore


class Store:
    """Runs, threads, decisions and dedup marks in Redis: one part per kind of record, one connection.

    A call site names the part it uses (`store.parks.decide(...)`, `store.runs.save(...)`), so the
    file a behaviour lives in is in the call; the parts share the connection and `replicas`.
    """

    def __init__(self, connection: redis.Redis, *, shortfall: Shortfall | None = None) -> None:
        """`shortfall`: what counts a promised write no replica acknowledged (the process's metrics)."""
        self.redis = connection
        self.replicas = Replicas(connection, shortfall=shortfall)
        self.admission = AdmissionStore(connection, self.replicas)
        self.runs = RunStore(connection, self.replicas)
        self.threads = ThreadStore(connection, self.replicas)
        self.parks = ParkStore(connection, self.replicas)
        self.escalations = EscalationStore(connection, self.replicas)
        self.held = HeldStore(connection, self.replicas)
        self.grants = GrantStore(connection, self.replicas)
        self.groups = GroupStore(connection, self.replicas)
        self.audit = AuditStore(connection, self.replicas)
        self.budgets = BudgetStore(connection, self.replicas)
        self.meters = MeterStore(connection, self.replicas)
        self.live = LiveStore(connection, self.replicas)
        self.inputs = InputStore(connection, self.replicas)
        self.questions = QuestionStore(connection, self.replicas)
        self.tasks = TaskStore(connection, self.replicas)
        self.config_source = ConfigSourceStore(connection, self.replicas)
        self.mcp_servers = McpServerStore(connection, self.replicas)


__all__ = [
    "APPROVALS_VERSION",
    "AUDIT_MAX_AGE",
    "AUDIT_MAX_ENTRIES",
    "AUDIT_PREVIEW_CHARS",
    "AuditLink",
    "BUDGET_TTL",
    "CHANNEL_SCOPE",
    "DAY",
    "DECISION_VERSION",
    "ENDED",
    "EVENT_TTL",
    "EXPIRES_FIELD",
    "ExtendOutcome",
    "ExtendResult",
    "FEEDBACK_MAX_ENTRIES",
    "FEEDBACK_PER_MINUTE",
    "FINISHED_RUN_TTL",
    "GROUP_TTL",
    "HANDLE_TTL",
    "HOLD_SECONDS",
    "HISTORY_VERSION",
    "HISTORY_VERSIONS",
    "IM",
    "BATCH",
    "LIMIT_CALL",
    "PENDING_TTL",
    "RECORD_VERSION",
    "RECORD_VERSIONS",
    "RUN_COUNT_HORIZON",
    "THREAD_TTL",
    "USER_SCOPE",
    "Accepted",
    "Admission",
    "Admitted",
    "BadId",
    "Beside",
    "CallTool",
    "LimitAsk",
    "BudgetStore",
    "DecideOutcome",
    "DecideResult",
    "Entry",
    "FeedbackOutcome",
    "FinishResult",
    "Grant",
    "OpenPark",
    "ParkRead",
    "ParkView",
    "Settled",
    "QueuedJob",
    "RecordEncoder",
    "RunRecord",
    "RunStatus",
    "Saved",
    "Scope",
    "ServerState",
    "SpentToday",
    "Store",
    "TaskEntry",
    "check_id",
    "grant_slot",
    "new_run_id",
    "pack",
    "rulings_write",
    "unpack",
    "budget_peaks",
    "budget_settled",
    "queue_budget_peaks",
    "utc_day",
    "Window",
]
