"""Approval receipts end to end: the real bot and `python -m workers` with `HARNESS_RECEIPT_KEY`, real
Redis, the loopback Slack and model. A person approves on a card and the module tool's receipt names
them; a call a grant lets run and an allowed one carry receipts that say so; `python -m workers audit
verify-receipt` checks what the tool got; and the key is in no log, no Redis key and no message."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from harness.receipts import verify
from tests.e2e.test_approvals import button_value, cards, done, new_channel
from tests.fakes.messages_api import reply, text, tool_use
from tests.stack import ROOT, RedisServer, Stack, running_stack, wait_until

pytestmark = pytest.mark.e2e

DB = 14  # a stack lives for its module only (see tests/e2e/test_groups_escalation_home.py)
MASTER = "e2e-receipts-master-key-0123456789abcdef"
CONFIG = """
[approvals]
approvers = ["UALICE", "UANN"]
grant_minutes = 30
[policy.tools]
count_tickets = "allow"
[limits]
max_runs_per_user = 1000
max_runs_per_channel = 1000
[tools]
modules = ["receipt_tools"]
"""
# Each call hands its receipt on (here: to a file in the workspace), as a tool would to its service.
TOOLS = """
    import json
    from typing import Annotated

    from pydantic import Field

    from harness.tools import ToolContext, tool


    def _handed(ctx: ToolContext, name: str, args: dict) -> None:
        with (ctx.workspace / "receipts.jsonl").open("a", encoding="utf-8") as out:
            out.write(json.dumps({"tool": name, "args": args, "receipt": ctx.receipt}) + "\\n")


    @tool()
    def open_ticket(ctx: ToolContext, title: Annotated[str, Field(description="What is wrong")]) -> str:
        \"\"\"Open a ticket.\"\"\"
        _handed(ctx, "open_ticket", {"title": title})
        return "T-1"


    @tool(side_effects=False)
    def count_tickets(ctx: ToolContext) -> str:
        \"\"\"How many tickets are open.\"\"\"
        _handed(ctx, "count_tickets", {})
        return "7"
"""


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    modules = tmp_path_factory.mktemp("modules")
    (modules / "receipt_tools.py").write_text(textwrap.dedent(TOOLS), encoding="utf-8")
    env = {
        "PYTHONPATH": f"{ROOT}:{modules}",
        "HARNESS_RECEIPT_KEY": MASTER,
        "HARNESS_RECEIPT_KEY_ID": "e2e-1",
    }
    yield from running_stack(redis_server, tmp_path_factory.mktemp("receipts"), CONFIG, DB, extra_env=env)


def handed(stack: Stack, title: str) -> dict[str, Any]:
    """What the tool got for the call with `title`, once it ran."""

    def found() -> dict[str, Any] | None:
        path = stack.workspace / "receipts.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return next((e for e in map(json.loads, lines) if e["args"].get("title") == title), None)

    return wait_until(found)


def verify_receipt(token: str, args: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """`python -m workers audit verify-receipt -` as an operator runs it, with the key."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HARNESS_RECEIPT_KEY": MASTER}
    return subprocess.run(
        [sys.executable, "-m", "workers", "audit", "verify-receipt", "-", "--args", json.dumps(args)],
        input=token,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


def everything_in(client: redis.Redis) -> str:
    """Every key and value of the stack's database, as text (DUMP would compress them)."""
    found: list[Any] = []
    for key in client.scan_iter("*"):
        kind = client.type(key).decode()
        if kind == "string":
            found.append(client.get(key))
        elif kind == "hash":
            found += [f for pair in client.hgetall(key).items() for f in pair]
        elif kind == "list":
            found += client.lrange(key, 0, -1)
        elif kind in ("set", "zset"):
            found += client.smembers(key) if kind == "set" else client.zrange(key, 0, -1)
        elif kind == "stream":
            found += [v for _, fields in client.xrange(key) for pair in fields.items() for v in pair]
        found.append(key)
    return "".join(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in found)


def test_a_person_approves_on_a_card_and_the_tool_s_receipt_names_them(stack: Stack) -> None:
    marker, channel = "rcptcard", new_channel()
    stack.model.script_for(
        marker, reply(tool_use("open_ticket", {"title": marker})), reply(text(f"{marker} done"))
    )
    status, ts, _ = stack.mention(f"{marker}: open a ticket", channel=channel, user="UALICE")
    assert status == 200
    [card] = wait_until(lambda: cards(stack, channel, ts) or None)
    value = button_value(card, "approve")
    assert value is not None
    run_id, call_id = value.split(":")[:2]
    assert stack.click(card, "approve", user="UANN") == 200
    done(stack, channel, ts, marker)

    token = handed(stack, marker)["receipt"]
    checked = verify(token, MASTER, time.time(), key_id="e2e-1", arguments={"title": marker})
    assert checked.valid and checked.claims is not None, checked.problem
    claims = checked.claims
    assert (claims["how"], claims["approvers"], claims["requester"]) == ("approved", ["UANN"], "UALICE")
    assert (claims["run"], claims["call"], claims["channel"]) == (run_id, call_id, channel)
    assert (claims["aud"], claims["sub"]) == ("module:receipt_tools", "open_ticket")

    checked_by_cli = verify_receipt(token, {"title": marker})
    assert checked_by_cli.returncode == 0, checked_by_cli.stdout + checked_by_cli.stderr
    assert "open_ticket (module:receipt_tools), approved by UANN" in checked_by_cli.stdout
    assert verify_receipt(token, {"title": "something else"}).returncode == 1


def test_a_call_under_a_grant_and_an_allowed_call_carry_receipts_that_say_so(stack: Stack) -> None:
    marker, channel = "rcptgrant", new_channel()
    first, second = f"{marker}-1", f"{marker}-2"
    stack.model.script_for(
        marker,
        reply(tool_use("open_ticket", {"title": first})),
        reply(text(f"{marker} first done")),
        reply(tool_use("open_ticket", {"title": second}), tool_use("count_tickets", {})),
        reply(text(f"{marker} second done")),
    )
    status, ts, _ = stack.mention(f"{marker}: open a ticket", channel=channel, user="UALICE")
    assert status == 200
    [card] = wait_until(lambda: cards(stack, channel, ts) or None)
    assert stack.click(card, "approve_thread", user="UANN") == 200
    done(stack, channel, ts, marker, "first done")
    stack.mention(f"{marker}: and another", channel=channel, user="UALICE", thread_ts=ts)
    done(stack, channel, ts, marker, "second done")

    granted = verify(handed(stack, second)["receipt"], MASTER, time.time()).claims
    assert granted is not None and (granted["how"], granted["approvers"]) == ("grant", ["UANN"])
    path = stack.workspace / "receipts.jsonl"
    [counted] = [e for e in map(json.loads, path.read_text().splitlines()) if e["tool"] == "count_tickets"]
    allowed = verify(counted["receipt"], MASTER, time.time()).claims
    assert allowed is not None and (allowed["how"], allowed["approvers"]) == ("allow", [])


def test_the_key_and_the_receipts_stay_out_of_logs_redis_and_slack(stack: Stack) -> None:
    marker, channel = "rcptquiet", new_channel()
    stack.model.script_for(marker, reply(tool_use("count_tickets", {})), reply(text(f"{marker} done")))
    stack.mention(f"{marker}: count", channel=channel, user="UALICE")
    wait_until(lambda: (stack.workspace / "receipts.jsonl").exists() or None)
    stack.settled()

    tokens = [
        json.loads(line)["receipt"] for line in (stack.workspace / "receipts.jsonl").read_text().splitlines()
    ]
    logs = "".join(p.output() for p in stack.processes)
    assert "approval receipts are on: every module or MCP tool call gets one (key id e2e-1)" in logs
    client = redis.Redis.from_url(stack.redis_url)
    stored = everything_in(client)
    assert marker in stored  # the scan reads what the runs wrote
    slack = json.dumps(stack.slack.messages(channel)) + json.dumps(stack.slack.ephemerals)
    model = json.dumps(stack.model.requests)
    for secret in (MASTER, *tokens):
        assert secret not in logs and secret not in stored and secret not in slack and secret not in model
