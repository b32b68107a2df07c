"""MCP tools end to end: through Slack (real bot, real `python -m workers`, real Redis) and the terminal.

The worker starts the real test MCP server once, over stdio, and keeps it; every call that
reaches the server is logged by the server itself, so "runs once" and "never sees the call"
are read from the server's side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.mcp_support import TOKEN, calls, odd_table, out, stdio_table
from tests.stack import ROOT, RedisServer, Stack, running_stack, thread, wait_until
from tests.stack import wait_post as wait_for_post

pytestmark = pytest.mark.e2e

MOVING = ROOT / "tests" / "fakes" / "mcp_moving_server.py"

POLICY = """
[policy]
default = "ask"
[policy.tools]
desk__crash = "allow"
odd__echo = "allow"
moving__add = "allow"
moving__extra = "allow"
moving__note = "allow"
moving__drop = "allow"
[[policy.rules]]
tool = "desk__delete_*"
tier = "deny"
[[policy.rules]]
tool = "desk__comment"
args = { id = "SANDBOX-*" }
tier = "allow"
[limits]
max_runs_per_user = 1000
max_runs_per_channel = 1000
"""


# The desk's readOnlyHint sets tiers here; an untrusted claim is tests/harness/test_mcp_hostile.py's.
TRUSTED = "trust_annotations = true\n"


@pytest.fixture(scope="module")
def desk_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("desk") / "calls.jsonl"


@pytest.fixture(scope="module")
def odd_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("odd") / "calls.jsonl"


@pytest.fixture(scope="module")
def moving_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("moving") / "calls.jsonl"


@pytest.fixture(scope="module")
def stack(
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
    desk_log: Path,
    odd_log: Path,
    moving_log: Path,
) -> Iterator[Stack]:
    never = '[[mcp.servers]]\nname = "gone"\ncommand = "/nonexistent/mcp-server"\n'
    # `odd` lists two tools of one name, and names the API refuses: no run may fail for it.
    odd = odd_table("odd", odd_log)
    desk = stdio_table("desk", desk_log, DESK_TOKEN="${DESK_TOKEN}") + TRUSTED
    # `moving` adds a tool when asked, and says so (notifications/tools/list_changed).
    moving = (
        f'[[mcp.servers]]\nname = "moving"\ncommand = {json.dumps(sys.executable)}\n'
        f"args = [{json.dumps(str(MOVING))}]\nenv = {{ MCP_CALL_LOG = {json.dumps(str(moving_log))} }}\n"
        f"writable = [{json.dumps(str(moving_log.parent))}]\n"
    )
    config = desk + never + odd + moving + POLICY
    workdir = tmp_path_factory.mktemp("mcp")
    yield from running_stack(redis_server, workdir, config, 5, extra_env={"DESK_TOKEN": TOKEN})


def wait_post(stack: Stack, channel: str, ts: str, needle: str) -> dict[str, Any]:
    return wait_for_post(stack, channel, ts, lambda m: needle in str(m), timeout=30)


def cards(stack: Stack, channel: str, ts: str) -> list[dict[str, Any]]:
    return [
        m
        for m in thread(stack, channel, ts)
        if any(b["type"] == "actions" and "approve" in str(b) for b in m.get("blocks") or [])
    ]


def tools_seen(log: Path) -> list[str]:
    return [c["tool"] for c in calls(log)]


def test_allow_ask_and_deny_in_one_turn_reach_the_server_exactly_as_the_policy_says(
    stack: Stack, desk_log: Path
) -> None:
    before = len(calls(desk_log))
    stack.model.script_for(
        "threetiers",
        reply(
            tool_use("desk__get_ticket", {"id": "T-1"}),
            tool_use("desk__close_ticket", {"id": "T-1", "reason": "fixed"}),
            tool_use("desk__delete_ticket", {"id": "T-1"}),
        ),
        reply(text("threetiers done")),
    )
    status, ts, _ = stack.mention("threetiers", channel="C901")
    assert status == 200
    card = wait_until(lambda: next(iter(cards(stack, "C901", ts)), None), 30)
    shown = str(card["blocks"])
    assert "desk__close_ticket" in shown and "Close a ticket" in shown and "destructiveHint: true" in shown
    assert "the default in the policy" in shown  # why it asks: nothing else gave it a tier
    # Parked: the allow call ran (before the card), the ask one waits, the deny one never will.
    assert tools_seen(desk_log)[before:] == ["get_ticket"]

    assert stack.click(card, "approve") == 200
    wait_post(stack, "C901", ts, "threetiers done")
    stack.settled()
    assert tools_seen(desk_log)[before:] == ["get_ticket", "close_ticket"]  # each once; delete never

    summary = wait_post(stack, "C901", ts, "desk__delete_ticket")
    said = json.dumps(summary["blocks"], ensure_ascii=False)
    assert "server `desk` says the tool only reads, and is trusted" in said  # why get_ticket ran at once
    assert "denied: rule 1 of the policy, for `desk__delete_*`" in said  # why delete_ticket was denied
    assert "own tier" not in said and "policy.rules" not in said  # the config's words stay in the CLI
    results = [r for r in stack.model.requests if "threetiers" in str(r["messages"][0])][-1]["messages"][-1]
    by_id = {b["tool_use_id"]: b for b in results["content"]}
    assert [b.get("is_error", False) for b in by_id.values()] == [False, False, True]


def test_decline_means_the_server_never_sees_the_call(stack: Stack, desk_log: Path) -> None:
    before = len(calls(desk_log))
    stack.model.script_for(
        "declinedesk",
        reply(tool_use("desk__comment", {"id": "PROD-1", "text": "hello"})),
        reply(text("declinedesk done")),
    )
    _, ts, _ = stack.mention("declinedesk", channel="C902")
    card = wait_until(lambda: next(iter(cards(stack, "C902", ts)), None), 30)
    assert stack.click(card, "decline") == 200
    wait_post(stack, "C902", ts, "declinedesk done")
    stack.settled()
    assert tools_seen(desk_log)[before:] == []


def test_an_argument_rule_lets_a_sandbox_call_run_without_asking(stack: Stack, desk_log: Path) -> None:
    before = len(calls(desk_log))
    stack.model.script_for(
        "sandboxdesk",
        reply(tool_use("desk__comment", {"id": "SANDBOX-7", "text": "hi"})),
        reply(text("sandboxdesk done")),
    )
    _, ts, _ = stack.mention("sandboxdesk", channel="C903")
    wait_post(stack, "C903", ts, "sandboxdesk done")
    assert cards(stack, "C903", ts) == []
    assert tools_seen(desk_log)[before:] == ["comment"]
    assert "allowed: rule 2 of the policy" in str(thread(stack, "C903", ts))


def test_a_server_that_dies_mid_run_answers_outcome_unknown_and_the_run_goes_on(
    stack: Stack, desk_log: Path
) -> None:
    before = len(calls(desk_log))
    stack.model.script_for(
        "crashdesk",
        reply(tool_use("desk__crash", {})),
        reply(text("crashdesk done")),
    )
    _, ts, _ = stack.mention("crashdesk", channel="C904")
    wait_post(stack, "C904", ts, "crashdesk done")
    result = [r for r in stack.model.requests if "crashdesk" in str(r["messages"][0])][-1]["messages"][-1]
    block = result["content"][0]
    assert block["is_error"] is True and "Outcome unknown" in block["content"]
    assert tools_seen(desk_log)[before:] == ["crash"]  # never sent twice

    # The worker starts the server again by itself; a later run's call reaches the new process.
    # Until it is back its tools are not offered, and a call of one answers that the server is away.
    crashed = calls(desk_log)[-1]["pid"]
    stack.model.check_tool_names = False

    def reached_again() -> bool:
        marker = f"againdesk{len(calls(desk_log))}"
        stack.model.script_for(marker, reply(tool_use("desk__get_ticket", {"id": "T-5"})), reply(text("ok")))
        _, ts2, _ = stack.mention(marker, channel="C905")
        wait_post(stack, "C905", ts2, "That took")
        return bool(calls(desk_log)) and calls(desk_log)[-1]["pid"] != crashed

    try:
        wait_until(reached_again, timeout=60, interval=0.5)
    finally:
        stack.model.check_tool_names = True


def test_a_tool_its_server_adds_mid_run_is_offered_to_the_same_run_on_a_later_request(
    stack: Stack, moving_log: Path
) -> None:
    """Turn 1 makes the server add a tool; the model then waits, turn after turn (one allowed
    `get_time` each, each asked for once the hub listed the server's tools again), until a request
    offers the new tool, and calls it: all in one job of one run, whose horse reads the listing
    through the worker's relay."""

    def listed_again() -> bool:
        seen = [c["tool"] for c in calls(moving_log)]
        return "add" in seen and "tools/list" in seen[seen.index("add") :]

    def respond(body: dict[str, Any]) -> Any:
        if "addmid" not in str(body["messages"][0]):
            return None
        if "I am extra" in json.dumps(body["messages"][-1]):
            return reply(text("addmid done"))
        if "moving__extra" in {t["name"] for t in body.get("tools", [])}:
            return reply(tool_use("moving__extra", {}))
        wait_until(listed_again, timeout=20)
        return reply(tool_use("get_time", {}))

    stack.model.script_for(
        "addmid", reply(tool_use("moving__add", {"name": "extra", "description": "More."}))
    )
    stack.model.responder = respond
    try:
        _, ts, _ = stack.mention("addmid", channel="C909")
        wait_post(stack, "C909", ts, "addmid done")
    finally:
        stack.model.responder = None
    assert [c["tool"] for c in calls(moving_log) if c["tool"] in ("add", "extra")] == ["add", "extra"]


def test_a_run_resumed_after_its_server_removed_a_tool_it_called_goes_on(
    stack: Stack, moving_log: Path
) -> None:
    """The API refuses a request whose history names a tool `tools` does not define. A run called
    `note`, then had the server remove it, and parked; the job that resumes it after the click
    (a new agent, which never had `note`) still defines it, as a tool no longer offered."""

    def listed_since_the_drop() -> bool:
        seen = [c["tool"] for c in calls(moving_log)]
        return "drop" in seen and "tools/list" in seen[seen.index("drop") :]

    stack.model.script_for(
        "dropmid",
        reply(tool_use("moving__note", {"text": "dropmid"})),
        reply(
            tool_use("moving__drop", {"name": "note"}),
            tool_use("write_file", {"path": "dropmid.txt", "content": "x"}),
        ),
        reply(text("dropmid done")),
    )
    _, ts, _ = stack.mention("dropmid", channel="C910")
    card = wait_until(lambda: next(iter(cards(stack, "C910", ts)), None), 30)
    wait_until(listed_since_the_drop, timeout=30)  # the worker's hub asked for the tools again
    assert stack.click(card, "approve") == 200
    wait_post(stack, "C910", ts, "dropmid done")
    last = [r for r in stack.model.requests if "dropmid" in str(r["messages"][0])][-1]
    (note,) = [t for t in last["tools"] if t["name"] == "moving__note"]
    assert note["description"].startswith("No longer offered")
    assert not [e for e in stack.model.errors if "moving__note" in e]


def status_of(stack: Stack) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "workers", "status"],
        env=stack.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def gone_down_for_a_while(stack: Stack) -> str | None:
    """Status's line of the server `gone` once it has been down 4 s or more (tried 4 times or more)."""
    for line in status_of(stack).splitlines():
        if line.startswith("  gone on ") and not line.split("down for ", 1)[1].startswith(
            ("0 s", "1 s", "2 s", "3 s")
        ):
            return line
    return None


def test_a_server_whose_command_is_not_there_is_said_once_and_status_shows_it_down(stack: Stack) -> None:
    worker = next(p for p in stack.processes if p.name == "worker")
    why = (
        "its command '/nonexistent/mcp-server' does not exist (/nonexistent/mcp-server): install it there, "
        "or set command to where it is"
    )
    down = wait_until(lambda: gone_down_for_a_while(stack), timeout=60, interval=1.0)
    assert down.endswith(f": {why}") and f":{worker.proc.pid}, down for " in down
    assert "MCP servers down: 1 (of 4, as 1 running worker said)" in status_of(stack).splitlines()
    said = [line for line in worker.output().splitlines() if "MCP server gone " in line]
    assert len(said) == 1, said  # one line at start, not one per try
    assert (
        "MCP server gone (stdio: /nonexistent/mcp-server) cannot start: " + why + "; trying again" in said[0]
    )
    assert "WARNING" in said[0]


def test_a_server_that_never_starts_leaves_the_worker_running_and_its_calls_name_it(stack: Stack) -> None:
    worker = next(p for p in stack.processes if p.name == "worker")
    assert worker.proc.poll() is None
    assert "gone (stdio: /nonexistent/mcp-server) cannot start: its command" in worker.output()
    stack.model.check_tool_names = False  # its tools are not offered; the model calls one anyway
    try:
        stack.model.script_for("gonedesk", reply(tool_use("gone__restart", {})), reply(text("gonedesk done")))
        _, ts, _ = stack.mention("gonedesk", channel="C907")
        wait_post(stack, "C907", ts, "gonedesk done")
    finally:
        stack.model.check_tool_names = True
    result = [r for r in stack.model.requests if "gonedesk" in str(r["messages"][0])][-1]["messages"][-1]
    block = result["content"][0]
    assert block["is_error"] is True and "'gone'" in block["content"] and "not reachable" in block["content"]
    assert cards(stack, "C907", ts) == []  # never asked about


def test_a_server_listing_two_tools_of_one_name_breaks_no_run(stack: Stack, odd_log: Path) -> None:
    """Each job builds its tool list: today a duplicate name raises there, and every run fails."""
    stack.model.script_for(
        "twinsdesk",
        reply(tool_use("get_time", {}), tool_use("odd__echo", {"text": "still here"})),
        reply(text("twinsdesk done")),
    )
    _, ts, _ = stack.mention("twinsdesk", channel="C908")
    wait_post(stack, "C908", ts, "twinsdesk done")
    request = [r for r in stack.model.requests if "twinsdesk" in str(r["messages"][0])][-1]
    offered = {t["name"] for t in request["tools"]}
    assert {"get_time", "odd__echo", "desk__get_ticket"} <= offered
    assert not any(n.startswith("odd__twin") or n.startswith("odd__has") or len(n) > 64 for n in offered)
    results = {b["tool_use_id"]: b for b in request["messages"][-1]["content"]}
    assert [b.get("is_error", False) for b in results.values()] == [False, False]
    assert "still here" in str(results)
    assert [c["tool"] for c in calls(odd_log)] == ["echo"]
    worker = next(p for p in stack.processes if p.name == "worker")
    assert "'twin' (2 tools share this name)" in worker.output()


def test_no_job_starts_a_server_and_no_secret_reaches_slack_or_the_log(stack: Stack, desk_log: Path) -> None:
    for n in range(2):
        stack.model.script_for(
            f"warmdesk{n}",
            reply(tool_use("desk__env_seen", {"name": "DESK_TOKEN"})),
            reply(text(f"warmdesk{n} done")),
        )
        _, ts, _ = stack.mention(f"warmdesk{n}", channel="C906")
        wait_post(stack, "C906", ts, f"warmdesk{n} done")
        assert "set" in str(thread(stack, "C906", ts))  # the secret reached the server's environment
    seen = [c for c in calls(desk_log) if c["tool"] == "env_seen"]
    assert len(seen) == 2 and seen[0]["pid"] == seen[1]["pid"]  # one server process across two jobs
    worker = next(p for p in stack.processes if p.name == "worker")
    everything_posted = str(stack.slack.messages("C906"))
    assert TOKEN not in worker.output() and TOKEN not in everything_posted
    assert TOKEN not in str(stack.model.requests)


# --- the terminal ----------------------------------------------------------------------------


def terminal(
    tmp_path: Path, model: FakeMessagesAPI, log: Path, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "harness.toml"
    config.write_text(stdio_table("desk", log) + TRUSTED + POLICY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "HARNESS_", "SLACK_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        HARNESS_CONFIG=str(config),
        HARNESS_WORKSPACE=str(tmp_path),
        ANTHROPIC_BASE_URL=model.base_url,
        ANTHROPIC_API_KEY="sk-test",
    )
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=tmp_path,
    )


def test_the_terminal_runs_allowed_mcp_calls_and_asks_before_the_rest(
    tmp_path: Path, model: FakeMessagesAPI
) -> None:
    log = out(tmp_path, "calls.jsonl")
    model.script(
        reply(tool_use("desk__get_ticket", {"id": "T-1"}), tool_use("desk__close_ticket", {"id": "T-1"})),
        reply(text("all done")),
    )
    done = terminal(tmp_path, model, log, "close T-1", stdin="n\n")
    assert done.returncode == 0, done.stderr
    assert "desk__get_ticket" in done.stdout and "printer on fire" in done.stdout
    assert "Enter to allow / type n to decline" in done.stdout + done.stderr
    assert tools_seen(log) == ["get_ticket"]  # the declined close never reached the server


def test_list_tools_prints_every_mcp_tool_with_its_tier_and_why(
    tmp_path: Path, model: FakeMessagesAPI
) -> None:
    done = terminal(tmp_path, model, out(tmp_path, "calls.jsonl"), "--list-tools")
    assert done.returncode == 0, done.stderr
    lines = {line.split("\t")[0]: line.split("\t")[1:] for line in done.stdout.splitlines()}
    assert lines["desk__get_ticket"] == [
        "allow",
        "tool's own tier (MCP readOnlyHint, trusted: trust_annotations = true for server desk)",
    ]
    assert lines["desk__close_ticket"] == ["ask", "policy.default"]
    assert lines["desk__delete_ticket"] == ["deny", 'policy.rules[1] (tool = "desk__delete_*")']
    assert lines["desk__crash"] == ["allow", "policy.tools.desk__crash"]
    assert lines["desk__comment"][0] == "ask" and "policy.rules[2]" in lines["desk__comment"][1]
    assert lines["read_file"] == ["allow", "tool's own tier (built-in)"]


def test_explain_call_reads_the_arguments(tmp_path: Path, model: FakeMessagesAPI) -> None:
    sandbox = terminal(
        tmp_path,
        model,
        out(tmp_path, "c.jsonl"),
        "--explain-call",
        "desk__comment",
        '{"id": "SANDBOX-1", "text": "x"}',
    )
    assert sandbox.stdout.split("\t")[:2] == ["desk__comment", "allow"], sandbox.stderr
    prod = terminal(
        tmp_path,
        model,
        out(tmp_path, "c.jsonl"),
        "--explain-call",
        "desk__comment",
        '{"id": "PROD-1", "text": "x"}',
    )
    assert prod.stdout.strip() == "desk__comment\task\tpolicy.default"
    bad = terminal(tmp_path, model, out(tmp_path, "c.jsonl"), "--explain-call", "desk__comment", "{not json")
    assert bad.returncode == 2 and "not a JSON object" in bad.stderr


def test_one_runs_slow_mcp_call_does_not_hold_another_runs_call_in_the_same_horse(
    stack: Stack, desk_log: Path
) -> None:
    """Issue 25: runs side by side in one horse each reach the worker's MCP hub on a connection of
    their own; a shared connection would queue the second run's call behind the first's."""
    before = len(calls(desk_log))
    stack.model.script_for(
        "slowdesk", reply(tool_use("desk__slow", {"seconds": 8})), reply(text("slowdesk done"))
    )
    stack.model.script_for(
        "quickodd", reply(tool_use("odd__echo", {"text": "hi"})), reply(text("quickodd done"))
    )
    _, slow_ts, _ = stack.mention("slowdesk: take your time", channel="C930")
    wait_until(lambda: tools_seen(desk_log)[before:] == ["slow"], timeout=30)  # its call is running
    _, quick_ts, _ = stack.mention("quickodd: be quick", channel="C931")
    wait_post(stack, "C931", quick_ts, "quickodd done")
    assert not any("slowdesk done" in str(m) for m in thread(stack, "C930", slow_ts))  # still in its call
    wait_post(stack, "C930", slow_ts, "slowdesk done")
