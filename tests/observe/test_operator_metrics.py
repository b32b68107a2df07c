"""The metrics that answer operators' questions, on a real Redis through the store's own scripts:
decisions by verdict, tool and profile; the runs waiting on each approver; the budgets' fullest
user and channel. Scraped as Prometheus scrapes them: the bot's WSGI `/metrics`, parsed by
prometheus_client's parser. (tests/e2e/test_slack_surface.py sees a decline counted by a real worker.)"""

from __future__ import annotations

import io
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from bot.web import wsgi_app
from harness.config import Approvals, Budgets, Config, McpServerConfig
from harness.config.settings import Profile
from harness.loop import TurnDone
from harness.policy import Tier
from harness.state import Decision, PendingCall, RunState, Usage, Verdict
from harness.tools.catalog import Catalog
from observe import metrics
from observe.gauges import REQUESTER
from store import (
    CHANNEL_SCOPE,
    DAY,
    USER_SCOPE,
    ExtendOutcome,
    RunRecord,
    RunStatus,
    Scope,
    Store,
    new_run_id,
    utc_day,
)
from tests.stack import SIGNING_SECRET

TEAM = "T1"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def profile(name: str, **settings: Any) -> Profile:
    settings_of = Config(profile=name, **settings)
    return Profile(name=name, channels=(f"C{name.upper()}",), teams=(), settings=settings_of)


def scrape(conn: redis.Redis, config: Config) -> Samples:
    """`GET /metrics` from loopback through the bot's WSGI callable, with `config` in force."""
    app = wsgi_app(None, conn, signing_secret=SIGNING_SECRET, config=lambda: config)  # type: ignore[arg-type]
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/metrics",
        "QUERY_STRING": "",
        "REMOTE_ADDR": "127.0.0.1",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "3000",
        "wsgi.input": io.BytesIO(b""),
    }
    status: list[str] = []
    body = b"".join(app(environ, lambda s, _headers: status.append(s)))
    assert status == ["200 OK"], (status, body[:300])
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (found, labels), value in samples.items() if found == name}


# --- decisions by verdict, tool and profile --------------------------------------------------------------


def asked(name: str, verdict: Verdict) -> PendingCall:
    return PendingCall(f"toolu_{uuid.uuid4().hex[:12]}", name, {}, Tier.ASK, Decision(verdict, by="UANN"))


def test_tool_labels_are_the_names_the_config_offers_an_mcp_servers_tools_one_label() -> None:
    assert metrics.tool_label("write_file", "builtin") == "write_file"
    assert metrics.tool_label("deploy", "ops_tools") == "deploy"  # a `[tools] modules` tool
    assert metrics.tool_label("github__create_issue", "mcp:github") == "github__*"
    assert metrics.tool_label("github__whatever_it_lists_next", "mcp:github") == "github__*"
    assert metrics.tool_label("made_up_by_the_model", "") == "other"


def test_decisions_count_once_per_call_by_verdict_tool_and_profile(conn: redis.Redis) -> None:
    config = Config(
        mcp_servers=(McpServerConfig(name="github", command="github-mcp"),),
        profiles=(profile("ops"),),
    )
    catalog = Catalog.from_config(config)
    calls = (
        asked("write_file", Verdict.DECLINED),
        asked("write_file", Verdict.DECLINED),
        asked("write_file", Verdict.APPROVED),
        asked("github__create_issue", Verdict.DECLINED),
        asked("github__merge_pr", Verdict.EXPIRED),
        asked("invented_tool", Verdict.APPROVED),
        PendingCall("toolu_allowed", "read_file", {}, Tier.ALLOW),  # asked nobody: no decision
    )
    state = RunState(messages=(), turns=1, requests=1, usage=Usage(10, 1))
    done = TurnDone(1, calls, 11)
    run_id = new_run_id()
    for _ in range(2):  # a driver re-doing the step after a crash counts nothing twice
        metrics.stepped(conn, run_id, state, (done,), profile="ops", source_of=catalog.source)
    other_run = (TurnDone(1, (asked("write_file", Verdict.DECLINED),), 5),)
    metrics.stepped(conn, new_run_id(), state, other_run, profile="", source_of=catalog.source)

    decisions = series(scrape(conn, config), "harness_approval_decisions_total")
    assert decisions == {
        (("profile", "ops"), ("tool", "write_file"), ("verdict", "declined")): 2,
        (("profile", "ops"), ("tool", "write_file"), ("verdict", "approved")): 1,
        (("profile", "ops"), ("tool", "github__*"), ("verdict", "declined")): 1,
        (("profile", "ops"), ("tool", "github__*"), ("verdict", "expired")): 1,
        (("profile", "ops"), ("tool", "other"), ("verdict", "approved")): 1,
        (("profile", ""), ("tool", "write_file"), ("verdict", "declined")): 1,
    }


# --- runs waiting on each approver ------------------------------------------------------------------


def park(store: Store, profile_name: str, *, expires_in: float = 3600, requester: str = "UREQ") -> RunRecord:
    """A run of `profile_name` parked on one ask-tier call, as a worker parks it (under its lease)."""
    pending = (PendingCall("toolu_1", "write_file", {"path": "a"}, Tier.ASK),)
    record = RunRecord(
        run_id=new_run_id(),
        team=TEAM,
        channel="C1",
        thread_ts=f"{int(time.time())}.{uuid.uuid4().int % 10**6:06d}",
        requester=requester,
        task="go",
        status=RunStatus.AWAITING_APPROVAL,
        state=RunState(messages=({"role": "user", "content": "go"},), pending=pending).to_json(),
        park_id=1,
        expires_at=time.time() + expires_in,
        profile=profile_name,
    )
    token = uuid.uuid4().hex
    assert store.runs.acquire_lease(record.run_id, token, 30)
    assert store.parks.park(record, token, 30, ["toolu_1"], ttl=DAY)
    store.runs.release_lease(record.run_id, token)
    return record


WAITING_CONFIG = Config(
    approvals=Approvals(approvers=("S0ADMINS", "UANN")),
    profiles=(
        profile(
            "ops",  # no approvers: each run's requester; after 30 of 60 minutes, on-call as well
            approvals=Approvals(
                expire_after_minutes=60, escalate_after_minutes=30, escalate_to=("S0ONCALL",)
            ),
        ),
        profile("fin", approvals=Approvals(approvers=("S0ADMINS",))),
        profile("quiet", approvals=Approvals(approvers=("UQUIET",))),
    ),
)


def test_runs_waiting_are_counted_per_approver_from_the_parks_of_each_profile(conn: redis.Redis) -> None:
    store = Store(conn)
    for _ in range(3):
        park(store, "")
    park(store, "", expires_in=-5)  # expired: waits on nobody
    resumed = park(store, "")
    store.runs.write_besides([store.threads.resumed(resumed, 60)])  # what the resume's save carries
    stopped = park(store, "")
    store.parks.forget(stopped)
    park(store, "ops", expires_in=50 * 60)  # parked 10 minutes ago
    park(store, "ops", expires_in=55 * 60)
    park(store, "ops", expires_in=20 * 60)  # parked 40 minutes ago: escalated
    park(store, "fin")

    samples = scrape(conn, WAITING_CONFIG)
    waiting = {dict(labels)["approvers"]: v for labels, v in series(samples, "harness_runs_waiting").items()}
    assert waiting == {"S0ADMINS": 4, "UANN": 3, REQUESTER: 3, "S0ONCALL": 1, "UQUIET": 0}
    assert samples[("harness_approvals_pending", ())] == 7  # the total: each run once


def test_an_extended_park_waits_on_until_its_new_expiry_and_leaves_escalation(conn: redis.Redis) -> None:
    store = Store(conn)
    record = park(store, "ops", expires_in=20 * 60)  # escalated
    raw, read = store.escalations.read_run(record.run_id) or (b"", record)
    extended = store.escalations.extend_park(raw, read, seen=0, most=1, seconds=3600, remind_before=0)
    assert extended.outcome is ExtendOutcome.EXTENDED
    waiting = series(scrape(conn, WAITING_CONFIG), "harness_runs_waiting")
    assert waiting[(("approvers", REQUESTER),)] == 1
    assert waiting[(("approvers", "S0ONCALL"),)] == 0  # parked anew by the Extend, as the deciders say


def test_a_scrape_costs_the_same_with_one_park_or_hundreds(conn: redis.Redis) -> None:
    store = Store(conn)
    park(store, "ops")

    def commands_of_a_scrape() -> int:
        before = conn.info("stats")["total_commands_processed"]
        scrape(conn, WAITING_CONFIG)
        return int(conn.info("stats")["total_commands_processed"] - before)

    few = commands_of_a_scrape()
    for i in range(400):
        park(store, ("", "ops", "fin")[i % 3], requester=f"U{i:04d}")
    started = time.perf_counter()
    many = commands_of_a_scrape()
    took = time.perf_counter() - started
    assert many == few
    waiting = series(scrape(conn, WAITING_CONFIG), "harness_runs_waiting")
    assert waiting[(("approvers", REQUESTER),)] == 1 + 133
    assert took < 0.5, took  # hundreds of parks read as a few counts, not one by one


# --- budgets: the fullest user and channel of each profile ------------------------------------------------


BUDGET_CONFIG = Config(
    budgets=Budgets(per_user_daily_tokens=2000),  # no channel budget at the top level
    profiles=(
        profile("ops", budgets=Budgets(per_user_daily_tokens=1000, per_channel_daily_tokens=4000)),
        profile("idle", budgets=Budgets(per_user_daily_tokens=500)),
        profile("free"),  # no budgets: no series
    ),
)


def spend(
    store: Store, user: str, channel: str, tokens: int, profile_name: str, day: str | None = None
) -> None:
    scopes = (Scope(USER_SCOPE, TEAM, user, 0), Scope(CHANNEL_SCOPE, TEAM, channel, 0))
    day = day or utc_day(time.time())
    assert store.budgets.settle(day, scopes, uuid.uuid4().hex, tokens, profile=profile_name)


def test_budget_use_is_the_fullest_user_and_channel_of_each_profile_today(conn: redis.Redis) -> None:
    store = Store(conn)
    spend(store, "UA", "C1", 900, "ops")
    spend(store, "UB", "C1", 100, "ops")
    spend(store, "UB", "C2", 500, "")  # UB's day: 600, under two profiles
    yesterday = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d")
    spend(store, "UC", "C3", 10**6, "ops", day=yesterday)  # yesterday's: reset at midnight

    used = series(scrape(conn, BUDGET_CONFIG), "harness_budget_used_ratio")
    assert used == {
        (("profile", ""), ("scope", "user")): pytest.approx(600 / 2000),  # UB, all of their day
        (("profile", "ops"), ("scope", "user")): pytest.approx(900 / 1000),  # UA
        (("profile", "ops"), ("scope", "channel")): pytest.approx(1000 / 4000),  # C1
        (("profile", "idle"), ("scope", "user")): 0.0,  # set, nothing spent: a series to alert on
    }


def test_budget_use_past_the_budget_shows_above_one_and_never_names_a_user(conn: redis.Redis) -> None:
    store = Store(conn)
    for i in range(50):
        spend(store, f"U{i:04d}", f"C{i:04d}", 10 * (i + 1), "idle")
    samples = scrape(conn, BUDGET_CONFIG)
    used = series(samples, "harness_budget_used_ratio")
    assert used[(("profile", "idle"), ("scope", "user"))] == pytest.approx(500 / 500)
    named = {v for labels in used for _, v in labels}
    assert named == {"", "ops", "idle", "user", "channel"}
