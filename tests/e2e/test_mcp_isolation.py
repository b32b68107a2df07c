"""The confinement of stdio MCP servers, end to end: a real `python -m workers` and `python -m harness`.

The hostile server (`tests/fakes/hostile_mcp_server.py`) is started by the worker (and by the
terminal agent), which hold real-looking secrets: the Slack token and signing secret, the API
key, a Redis password, and another server's `${VAR}`. A scripted model calls its tools; what it
found is read from the report file it writes, what it wrote to stderr from the worker's log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.mcp_support import FORGED, calls, hostile_table, mask, out, require_bwrap, stdio_table
from tests.stack import ROOT, SIGNING_SECRET, RedisServer, Stack, wait_post

pytestmark = pytest.mark.e2e

BOT_TOKEN = "xoxb-isolation-e2e-61d0c9a4"
API_KEY = "sk-ant-isolation-e2e-2b7f18c3"
REDIS_PASSWORD = "redis-pw-isolation-e2e-95ad04"
DESK_TOKEN = "desk-token-isolation-e2e-4e8c1f"
PLAIN = {
    "LANG": "C.UTF-8",
    "TZ": "UTC",
    "LOGNAME": "worker",
    "SHELL": "/bin/sh",
    "TERM": "xterm",
    "USER": "worker",
}
POLICY = '[policy]\ndefault = "allow"\n[policy.tools]\ndesk__delete_ticket = "deny"\n'


@pytest.fixture
def bwrap() -> None:
    require_bwrap()


def read_report(path: Path) -> dict[str, dict[str, Any]]:
    """The hostile server's findings, by tool."""
    return {entry["kind"]: entry for entry in map(json.loads, path.read_text().splitlines())}


def expected_environment(env: dict[str, str], own: dict[str, str], server: str) -> dict[str, str]:
    """PATH, LANG, TZ as the process has them, HOME the server's own directory, and its own env."""
    home = str(Path(env["HARNESS_STATE_DIR"]) / "mcp" / server)
    return {**{k: env[k] for k in ("PATH", "LANG", "TZ") if k in env}, "HOME": home, **own}


def test_a_worker_s_stdio_server_reads_no_secret_reaches_no_relay_and_forges_no_log(
    tmp_path: Path, bwrap: None
) -> None:
    server = RedisServer().start()
    try:
        redis.Redis(port=server.port).config_set("requirepass", REDIS_PASSWORD)
        url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{server.port}/0"
        run_everything(tmp_path, url)
    finally:
        server.cleanup()


def run_everything(tmp_path: Path, url: str) -> None:
    report, data, desk_log = out(tmp_path, "report.jsonl"), tmp_path / "data.txt", out(tmp_path, "desk.jsonl")
    data.write_text("what the server is for\n")
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    relay_glob = f"{private_tmp}/harness-mcp-*/*.sock"
    evil = hostile_table("evil", report, env={"EVIL_OWN": "mine"}, data=str(data), relay_glob=relay_glob)
    config = evil + stdio_table("desk", desk_log, DESK_TOKEN="${DESK_TOKEN}") + POLICY
    extra = {**PLAIN, "TMPDIR": str(private_tmp), "DESK_TOKEN": DESK_TOKEN, "ANTHROPIC_API_KEY": API_KEY}
    extra["SLACK_BOT_TOKEN"] = BOT_TOKEN
    secrets = [BOT_TOKEN, SIGNING_SECRET, API_KEY, REDIS_PASSWORD, DESK_TOKEN]
    with FakeSlackAPI(bot_token=BOT_TOKEN) as slack, FakeMessagesAPI() as model:
        stack = Stack(url, slack, model, tmp_path / "stack", config=config, extra_env=extra)
        try:
            stack.start_bot()
            worker = stack.start_worker()
            model.script_for(
                "isolation",
                reply(
                    tool_use("evil__snoop", {"masked": [mask(s) for s in secrets]}),
                    tool_use("evil__relay", {"server": "desk", "tool": "delete_ticket"}),
                    tool_use("evil__shout", {"lines": FORGED, "flood_bytes": 2_000_000}),
                    tool_use("evil__read_data", {}),
                ),
                reply(text("isolation done")),
            )
            status, ts, _ = stack.mention("isolation", channel="C990")
            assert status == 200
            wait_post(stack, "C990", ts, lambda m: "isolation done" in str(m), timeout=60)
            env = stack.env()
        finally:
            stack.stop()  # the worker closes its hub: the last of the server's stderr is accounted for
    found = read_report(report)
    assert found["snoop"]["found"] == []
    assert found["snoop"]["ppid"] == 1 and max(found["snoop"]["visible"]) < 100
    assert found["snoop"]["environment"] == expected_environment(env, {"EVIL_OWN": "mine"}, "evil")
    assert found["relay"]["sockets"] == []
    assert found["read_data"]["text"] == "what the server is for\n"
    assert [c["tool"] for c in calls(desk_log)] == []  # no call reached the other server

    log = worker.output()
    assert len(log) < 400_000  # of a 2 MB flood
    dropped = [
        int(n.replace(",", "")) for n in re.findall(r"MCP server evil stderr dropped: ([\d,]+) bytes", log)
    ]
    assert dropped and sum(dropped) > 1_500_000
    for line in log.splitlines():
        if "forged" in line:
            assert "harness.mcp.stderr: MCP server evil stderr: " in line, line
            assert not line.startswith(("2026-01-01", '{"time": "2026-01-01')), line
    assert "innocent\\rforged carriage return" in log and "\x1b" not in log and "\r" not in log
    for secret in secrets:
        assert secret not in log


def test_the_terminal_agent_s_stdio_server_reads_no_secret_of_the_terminal(
    tmp_path: Path, model: FakeMessagesAPI, bwrap: None
) -> None:
    report = out(tmp_path, "report.jsonl")
    config = tmp_path / "harness.toml"
    config.write_text(hostile_table("evil", report, env={"EVIL_OWN": "mine"}) + POLICY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "HARNESS_", "SLACK_"))}
    env.update(
        PLAIN,
        PYTHONPATH=str(ROOT),
        HARNESS_CONFIG=str(config),
        HARNESS_WORKSPACE=str(tmp_path),
        HARNESS_STATE_DIR=str(tmp_path / "state"),
        ANTHROPIC_BASE_URL=model.base_url,
        ANTHROPIC_API_KEY=API_KEY,
        SLACK_BOT_TOKEN=BOT_TOKEN,  # an operator's shell may hold anything
        REDIS_URL=f"redis://:{REDIS_PASSWORD}@127.0.0.1:1/0",
    )
    model.script(
        reply(
            tool_use("evil__snoop", {"masked": [mask(s) for s in (API_KEY, BOT_TOKEN, REDIS_PASSWORD)]}),
            tool_use("evil__shout", {"lines": FORGED[:2], "flood_bytes": 0}),
        ),
        reply(text("all done")),
    )
    done = subprocess.run(
        [sys.executable, "-m", "harness", "snoop"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    found = read_report(report)["snoop"]
    assert found["found"] == [] and found["ppid"] == 1
    assert found["environment"] == expected_environment(env, {"EVIL_OWN": "mine"}, "evil")
    # The server's stderr still shows in the terminal, as data under its name.
    assert "MCP server evil stderr: " + FORGED[1] in done.stderr
    assert not any(line.startswith("2026-01-01") for line in done.stderr.splitlines())
