"""The Home tab with many parked runs: what one open costs the bot, from its index of what waits on whom.

A private redis-server holds `PARKS` parked runs of one team (each a short conversation with one
`ask` call, parked through `store.parks.park` as a worker parks them, by 200 requesters). One open is
what the bot does for `app_home_opened` before it calls Slack: read the candidates from the index,
the records and decisions of those it needs, check who may decide, build the view
(`bot.listeners.home.waiting_on` and `messages.home.home_view`; the permalinks and `views.publish` are Slack's
time, not ours). Timed for an approver (every park waits on them: the tab fills from the first
batch), a requester with three runs among them (no `approvers`), and someone nothing waits on.
For contrast, the scan the Home tab did before its index: the 500 soonest-expiring parks of the
whole workspace, every record read and parsed, one round trip each.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import redis
from slack_sdk import WebClient

from bot.listeners.home import waiting_on
from bot.listening import BotDeps
from harness.config import Approvals, Config
from harness.policy import Tier
from harness.state import PendingCall, RunState, StateError
from messages.home import HOME_ITEMS_MAX, home_view
from runtime.queue import make_queue
from store import DAY, RunRecord, RunStatus, Store, new_run_id
from tests.bench.common import summary_ms, table
from tests.stack import RedisServer

COMMAND = ".venv/bin/python -m tests.bench home"
PARKS = int(os.environ.get("BENCH_HOME_PARKS", "10000"))
OPENS = 300  # opens timed per person
GOAL_P99_MS = 50.0
TEAM = "T1"
OLD_SCAN = 500


@dataclass(frozen=True)
class Row:
    who: str
    shown: int
    samples: list[float]


@dataclass(frozen=True)
class Figures:
    parks: int
    rows: list[Row]


def _record(requester: str, expires_in: float) -> tuple[RunRecord, list[str]]:
    call = PendingCall("toolu_1", "write_file", {"path": "notes/plan.md", "content": "x" * 400}, Tier.ASK)
    messages = (
        {"role": "user", "content": "write the plan for today into notes/plan.md " * 4},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": call.input}],
        },
    )
    state = RunState(messages=messages, pending=(call,), turns=1, requests=1)
    record = RunRecord(
        run_id=new_run_id(),
        team=TEAM,
        channel="C1",
        thread_ts=f"1700000000.{uuid.uuid4().int % 10**6:06d}",
        requester=requester,
        task="write the plan",
        status=RunStatus.AWAITING_APPROVAL,
        state=state.to_json(),
        park_id=1,
        expires_at=time.time() + expires_in,
        cards={"toolu_1": "1700000000.000100"},
    )
    return record, [call.id]


def _park_many(store: Store, parks: int) -> None:
    for i in range(parks):
        record, calls = _record(f"UREQ{i % 200}", 3600 + i)
        token = uuid.uuid4().hex
        store.runs.acquire_lease(record.run_id, token, 30)
        store.parks.park(record, token, 30, calls, ttl=DAY)
        store.runs.release_lease(record.run_id, token)


def _old_scan(store: Store, deps: BotDeps, user: str) -> int:
    """The Home tab before its index (bot/app.py until issue 19): the soonest 500 parks of all."""
    found = 0
    for run_id, park_id in store.escalations.parked(time.time(), OLD_SCAN):
        record = store.runs.load(run_id)
        if record is None or record.park_id != park_id or not deps.may_decide(user, record):
            continue
        try:
            awaiting = record.run_state().awaiting
        except StateError:
            continue
        decisions = store.parks.decisions(run_id, park_id)
        found += sum(1 for c in awaiting if c.id in decisions and decisions[c.id] is None)
        if found > HOME_ITEMS_MAX:
            break
    return found


def _timed(opens: int, once: Callable[[], int]) -> tuple[int, list[float]]:
    shown = once()  # warm: scripts loaded, connections open
    samples = []
    for _ in range(opens):
        started = time.perf_counter()
        shown = once()
        samples.append(time.perf_counter() - started)
    return shown, samples


def measure(parks: int = PARKS, opens: int = OPENS) -> Figures:
    server = RedisServer().start()
    try:
        store = Store(redis.Redis.from_url(server.url))
        _park_many(store, parks)
        for i in range(3):  # UALICE's own three runs, expiring after everyone else's
            record, calls = _record("UALICE", 3600 + parks + i)
            token = uuid.uuid4().hex
            store.runs.acquire_lease(record.run_id, token, 30)
            store.parks.park(record, token, 30, calls, ttl=DAY)
        client = WebClient(token="xoxb-bench", base_url="http://127.0.0.1:9/")  # never called: no groups

        def deps(**approvals: object) -> BotDeps:
            made = BotDeps(store, make_queue(store.redis), Config(approvals=Approvals(**approvals)))  # type: ignore[arg-type]
            made.groups.bind(client)
            return made

        def open_tab(d: BotDeps, user: str) -> Callable[[], int]:
            def once() -> int:
                items, more = waiting_on(d, TEAM, user)
                home_view(items, more=more, at=datetime.now(UTC))
                return len(items)

            return once

        approvers, requesters = deps(approvers=("UANN",)), deps()
        rows = [
            Row("approver (every park waits on them)", *_timed(opens, open_tab(approvers, "UANN"))),
            Row("requester (3 of their runs among them)", *_timed(opens, open_tab(requesters, "UALICE"))),
            Row("nobody waits on them", *_timed(opens, open_tab(approvers, "UDAVE"))),
            Row(
                f"before: the scan of the {OLD_SCAN} soonest parks (requester)",
                *_timed(max(5, opens // 10), lambda: _old_scan(store, requesters, "UALICE")),
            ),
        ]
        return Figures(parks + 3, rows)
    finally:
        server.cleanup()


def report(figures: Figures) -> str:
    rows = []
    for row in figures.rows:
        ms = summary_ms(row.samples)
        rows.append([row.who, row.shown, len(row.samples), ms["p50"], ms["p99"], ms["max"]])
    ours = [summary_ms(r.samples)["p99"] for r in figures.rows if not r.who.startswith("before")]
    verdict = "met" if max(ours) < GOAL_P99_MS else "NOT met"
    return "\n".join(
        [
            f"## Home tab with {figures.parks:,} parked runs",
            "",
            f"`{COMMAND}` (one open: candidates from the index, records and decisions, who may decide, "
            "the view; Slack's calls excluded). Goal: p99 < 50 ms per open, whatever the number parked: "
            f"**{verdict}**.",
            "",
            table(["who opens it", "calls shown", "opens", "p50 ms", "p99 ms", "max ms"], rows),
        ]
    )


def run() -> str:
    return report(measure())
