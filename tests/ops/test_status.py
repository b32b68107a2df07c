"""`python -m workers status` from a store holding one run of each kind (the end-to-end test, with
real processes, is in test_operations.py)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import redis

from gates.deciders import deciders
from harness.config import Approvals, load_config
from harness.policy import Tier
from harness.state import PendingCall, Status, new_run
from ops import status
from store import RECORD_VERSION, RunRecord, RunStatus, Store, new_run_id, pack
from store.keys import Keys
from tests.fakes.slack_api import FakeSlackAPI


def put(conn: redis.Redis, record: RunRecord) -> RunRecord:
    conn.set(Keys.run(record.run_id), pack(record.to_json()))
    return record


NOW = time.time()


def run(status_: RunStatus, channel: str, *, age: float, **fields: object) -> RunRecord:
    """A run record of `status_` created `age` seconds before `NOW`."""
    record = RunRecord(new_run_id(), "T1", channel, "1.2", "UALICE", "task", status=status_)
    return replace(record, created_at=NOW - age, **fields)  # type: ignore[arg-type]


def test_the_status_lists_runs_in_flight_parked_with_who_decides_and_failed(
    conn: redis.Redis, tmp_path: Path
) -> None:
    store, now = Store(conn), NOW
    config_file = tmp_path / "harness.toml"
    config_file.write_text('[approvals]\napprovers = ["UANN", "S0OPS"]\nexpire_after_minutes = 60\n')
    config = load_config(env={"HARNESS_CONFIG": str(config_file)})

    driven = put(conn, run(RunStatus.RUNNING, "C1", age=90))
    orphan = put(conn, run(RunStatus.QUEUED, "C2", age=5))
    conn.zadd(Keys.active(), {driven.run_id: now, orphan.run_id: now})
    conn.set(Keys.lease(driven.run_id), "token")

    call = PendingCall("toolu_1", "write_file", {"path": "a"}, Tier.ASK)
    state = replace(new_run("write a"), status=Status.AWAITING_APPROVAL, pending=(call,))
    waiting = put(
        conn,
        run(
            RunStatus.AWAITING_APPROVAL,
            "C3",
            age=600,
            state=state.to_json(),
            park_id=1,
            expires_at=now + 3000,
        ),
    )
    conn.hset(Keys.approvals(waiting.run_id, 1), mapping={"toolu_1": "", "~expires": repr(now + 3000)})
    conn.zadd(Keys.expiries(), {f"{waiting.run_id}:1": now + 3000})

    error = "Model API error: 529 overloaded_error\nmore"
    broken = put(conn, run(RunStatus.FAILED, "C4", age=7200, error=error))
    put(conn, run(RunStatus.FINISHED, "C5", age=60))

    out = status.report(store, config, now)
    lines = out.splitlines()
    assert "In flight: 2" in lines and "Parked: 1" in lines and "Failed: 1" in lines
    driven_line = next(line for line in lines if driven.run_id in line)
    assert "running, driven now, started 90 s ago" in driven_line and "T1/C1 thread 1.2" in driven_line
    assert "queued, waiting for a worker" in next(line for line in lines if orphan.run_id in line)
    parked_line = next(line for line in lines if waiting.run_id in line)
    assert "park 1, parked 10 min ago, expires in 50 min" in parked_line
    assert "waiting for: write_file" in parked_line and "must decide: UANN, S0OPS" in parked_line
    assert "must decide: UANN, S0OPS" in parked_line  # no handle read yet: the group by its id alone
    store.groups.cache_handles("T1", {"S0OPS": "oncall"})  # as the bot and the workers keep them
    named = next(line for line in status.report(store, config, now).splitlines() if waiting.run_id in line)
    assert "must decide: UANN, @oncall (S0OPS)" in named
    store.groups.cache_handles("T1", {"S0OPS": "on\x1b[31mcall"})  # a handle that is no handle
    named = next(line for line in status.report(store, config, now).splitlines() if waiting.run_id in line)
    assert "must decide: UANN, S0OPS" in named and "\x1b" not in named
    failed_line = next(line for line in lines if broken.run_id in line)
    assert failed_line.endswith("started 2 h ago: Model API error: 529 overloaded_error")
    assert "C5" not in out  # a finished run is none of these
    assert lines[-1] == "Queue harness: 0 waiting, 0 scheduled, 0 failed jobs"


def test_who_must_decide_is_the_requester_without_approvers_and_escalate_to_once_escalated() -> None:
    record = run(RunStatus.AWAITING_APPROVAL, "C1", age=0, expires_at=1000.0 + 3600)
    config = load_config(env={})
    assert deciders(config.approvals, record, now=1000.0) == ["UALICE"]
    escalating = replace(
        config,
        approvals=Approvals(
            approvers=("UANN",),
            expire_after_minutes=60,
            escalate_after_minutes=30,
            escalate_to=("UBOSS", "UANN"),
        ),
    )
    assert deciders(escalating.approvals, record, now=1000.0 + 29 * 60) == ["UANN"]
    assert deciders(escalating.approvals, record, now=1000.0 + 30 * 60) == ["UANN", "UBOSS"]


def test_the_status_lists_runs_waiting_for_a_newer_version(conn: redis.Redis) -> None:
    store, now = Store(conn), NOW
    config = load_config(env={})
    seen = put(conn, run(RunStatus.QUEUED, "C6", age=30))  # a newer release's; no worker met it yet
    data = json.loads(seen.to_json())
    data["version"] = RECORD_VERSION + 1
    conn.set(Keys.run(seen.run_id), pack(json.dumps(data)))
    held = put(conn, run(RunStatus.AWAITING_APPROVAL, "C7", age=60, park_id=1, expires_at=now + 60))
    conn.hset(Keys.approvals(held.run_id, 1), mapping={"toolu_1": "", "~version": 9})  # a newer park
    store.held.hold(held.run_id, now - 90)
    queued = put(conn, run(RunStatus.QUEUED, "C8", age=20))  # its thread's history is a newer release's
    conn.hset(Keys.history(*queued.thread), mapping={"data": pack('{"version": 5, "messages": []}')})
    conn.zadd(Keys.active(), {queued.run_id: now})
    store.held.hold(queued.run_id, now - 10)

    lines = status.report(store, config, now).splitlines()
    assert "In flight: 1" in lines and "Failed: 0" in lines
    assert "queued, waiting for a newer version (below)" in next(line for line in lines if "C8" in line)
    heading = lines.index("Waiting for a newer version: 3")
    first, second, third = lines[heading + 1 : heading + 4]  # the longest held first, then those met by none
    assert first.startswith(
        f"  run {held.run_id} in T1/C7 awaiting_approval: left by a worker 90 s ago; stored park's approvals"
    )
    assert "format version 9, newer than this release reads (version 1)" in first
    assert second.startswith(f"  run {queued.run_id} in T1/C8 queued: left by a worker 10 s ago")
    assert "stored thread history has format version 5" in second
    assert third.startswith(f"  run {seen.run_id} in T1/C6 queued: no worker has met it yet; stored run")
    assert f"format version {RECORD_VERSION + 1}" in third


def test_with_a_bot_token_status_reads_a_handle_slack_has_and_the_cache_has_not(
    conn: redis.Redis,
) -> None:
    with FakeSlackAPI(bot_token="xoxb-status") as slack:
        slack.set_usergroup("S0OPS", ["UCAROL"], "oncall")
        env = {"SLACK_BOT_TOKEN": "xoxb-status", "SLACK_API_URL": slack.base_url}
        assert status.group_directory(env).handles(Store(conn), "T1", ["UANN", "S0OPS"]) == {
            "S0OPS": "oncall"
        }
        conn.delete(Keys.group_handles("T1"))
        assert status.group_directory({}).handles(Store(conn), "T1", ["S0OPS"]) == {}  # no token: the cache
        assert [c.method for c in slack.calls] == ["usergroups.list"]


def test_status_lists_the_mcp_servers_a_worker_said_are_down_and_why(
    conn: redis.Redis, tmp_path: Path
) -> None:
    store, now = Store(conn), NOW
    config_file = tmp_path / "harness.toml"
    config_file.write_text(
        '[[mcp.servers]]\nname = "tickets"\ncommand = "tickets-mcp"\n'
        '[[mcp.servers]]\nname = "web"\nurl = "https://mcp.example.com/mcp"\n'
    )
    config = load_config(env={"HARNESS_CONFIG": str(config_file)})
    lines = status.report(store, config, now).splitlines()
    assert (
        "MCP servers down: unknown (no worker said how its 2 configured servers stand in the last 2 min: "
        in (next(line for line in lines if line.startswith("MCP servers down")))
    )
    why = "its command 'tickets-mcp' is not on the PATH it is given (/usr/bin:/bin): install it, …\x1b[2J"
    store.mcp_servers.say(
        "box:41", {"tickets": (False, why, now - 300), "web": (True, "", now - 600)}, now - 10
    )
    store.mcp_servers.say("box:42", {"tickets": (True, "", now - 30), "web": (True, "", now - 30)}, now - 5)
    lines = status.report(store, config, now).splitlines()
    at = lines.index("MCP servers down: 1 (of 2, as 2 running workers said)")
    assert lines[at + 1] == (
        "  tickets on box:41, down for 5 min: its command 'tickets-mcp' is not on the PATH it is given "
        "(/usr/bin:/bin): install it, …\\x1b[2J"
    )
    assert lines[at + 2].startswith("Queue harness:")
    assert not any("MCP" in line for line in status.report(store, load_config(env={}), now).splitlines())
