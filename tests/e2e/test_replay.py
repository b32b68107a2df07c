"""Replay against an audit a real run recorded: a real bot and worker (`python -m bot`, `python -m
workers`) run calls in two channels under two profiles, then `python -m workers replay DRAFT.toml`
runs as an operator would run it, against the same Redis, and prints what the draft would change.

The stack has a Redis server of its own: its audit holds only this module's calls.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from store.keys import Keys
from tests.fakes.messages_api import reply, text, tool_use
from tests.stack import BOT_TOKEN, SIGNING_SECRET, RedisServer, Stack, has_actions, running_stack, wait_post

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]

LIVE = """
[limits]
max_runs_per_user = 1000
max_runs_per_channel = 1000

[policy.tools]
get_time = "allow"

[[profiles]]
name = "ops"
channels = ["COPS"]
[profiles.tools]
builtin = ["get_time", "read_file", "list_files", "write_file"]

[[profiles]]
name = "general"
channels = ["CGEN"]
[profiles.tools]
builtin = ["get_time", "read_file", "list_files"]
"""

# ops: reads ask, writes under drafts/ are denied; general: no list_files any more, write_file now.
DRAFT = """
[policy.tools]
get_time = "allow"

[[profiles]]
name = "ops"
channels = ["COPS"]
[profiles.tools]
builtin = ["get_time", "read_file", "list_files", "write_file"]
[profiles.policy.tools]
read_file = "ask"
[[profiles.policy.rules]]
tool = "write_file"
args = { path = "drafts/**" }
tier = "deny"

[[profiles]]
name = "general"
channels = ["CGEN"]
[profiles.tools]
builtin = ["get_time", "read_file", "write_file"]
"""
WHEN = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack whose audit holds a run's calls in COPS (its write declined) and one's in CGEN."""
    server = RedisServer().start()
    try:
        for stack in running_stack(server, tmp_path_factory.mktemp("replay"), LIVE, 0):
            stack.model.check_tool_names = False  # the model invents a tool, and calls one not offered
            stack.model.script_for(
                "opsword",
                reply(
                    tool_use("read_file", {"path": "README.md"}),
                    tool_use("get_time", {}),
                    tool_use("write_file", {"path": "drafts/plan.md", "content": "the plan"}),
                ),
                reply(text("ops done")),
            )
            stack.model.script_for(
                "genword",
                reply(
                    tool_use("read_file", {"path": "README.md"}),
                    tool_use("list_files", {}),
                    tool_use("launch_rockets", {"count": 3}),
                    tool_use("write_file", {"path": "notes.md", "content": "hi"}),
                ),
                reply(text("general done")),
            )
            _, ops_ts, _ = stack.mention("opsword read, time, and draft the plan", channel="COPS")
            card = wait_post(stack, "COPS", ops_ts, has_actions)  # parked on the write
            assert stack.click(card, "decline") == 200
            wait_post(stack, "COPS", ops_ts, lambda m: "ops done" in m.get("text", ""))
            _, gen_ts, _ = stack.mention("genword look around", channel="CGEN")
            wait_post(stack, "CGEN", gen_ts, lambda m: "general done" in m.get("text", ""))
            stack.settled()
            yield stack
    finally:
        server.cleanup()


def workers_cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "REDIS_URL": stack.redis_url}
    return subprocess.run(
        [sys.executable, "-m", "workers", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_replay_prints_each_call_a_draft_would_change_then_the_summary(
    recorded: Stack, tmp_path: Path
) -> None:
    draft = tmp_path / "draft.toml"
    draft.write_text(DRAFT)
    done = workers_cli(recorded, "replay", str(draft))

    assert done.returncode == 0, done.stderr
    *changed, summary = done.stdout.splitlines()
    assert all(WHEN.fullmatch(line.split("\t")[0]) for line in changed), changed
    assert sorted(line.split("\t", 1)[1] for line in changed) == sorted(
        [
            "COPS\tread_file\tallow\task\tprofiles[ops].policy.tools.read_file",
            "COPS\twrite_file\task\tdeny\t"
            'profiles[ops].policy.rules[1] (tool = "write_file", path = "drafts/**")',
            "CGEN\tlist_files\tallow\tdeny\tnot offered in profile general (channel CGEN is in "
            "profiles[general].channels): profiles[general].tools.builtin does not list list_files",
            "CGEN\twrite_file\tdeny\task\ttool's own tier (built-in)",
        ]
    )
    assert summary == "7 calls, 4 would change: 1 allow→ask, 1 allow→deny, 1 ask→deny, 1 deny→ask"


def test_replay_under_the_live_config_changes_nothing(recorded: Stack) -> None:
    live = recorded.workdir / "harness.toml"
    done = workers_cli(recorded, "replay", str(live), "--days", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["7 calls, none would change"]


def test_a_bad_draft_exits_2_naming_the_key_and_replays_nothing(recorded: Stack, tmp_path: Path) -> None:
    draft = tmp_path / "bad.toml"
    draft.write_text(DRAFT + '\n[profiles.policy]\ndefault = "sometimes"\n')
    done = workers_cli(recorded, "replay", str(draft))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1
    assert "profiles[general].policy.default" in done.stderr


def test_a_bad_days_is_refused(recorded: Stack, tmp_path: Path) -> None:
    draft = tmp_path / "draft.toml"
    draft.write_text(DRAFT)
    for days in ("0", "-3", "soon"):
        done = workers_cli(recorded, "replay", str(draft), "--days", days)
        assert done.returncode == 2 and "--days" in done.stderr and done.stdout == ""


def test_the_audit_holds_one_entry_per_call_with_what_replay_needs_and_no_secret(recorded: Stack) -> None:
    client = redis.Redis.from_url(recorded.redis_url)
    raw = [fields[b"entry"].decode() for _, fields in client.xrange(Keys.audit_calls())]
    entries = [json.loads(r) for r in raw if json.loads(r).get("event") == "ruled"]
    assert len(entries) == 7  # each once, although the runs saved many times
    by_tool = {(e["channel"], e["tool"]): e for e in entries}
    write = by_tool[("COPS", "write_file")]
    assert write["profile"] == "ops" and write["source"] == "builtin" and write["requester"] == "UALICE"
    assert (write["tier"], write["why"], write["own_tier"]) == ("ask", "tool's own tier (built-in)", "ask")
    assert write["input"] == {"path": "drafts/plan.md", "content": "the plan"} and "cut" not in write
    assert re.fullmatch(r"[0-9a-f]{16}", write["fingerprint"]) and len(write["input_sha256"]) == 64
    rockets = by_tool[("CGEN", "launch_rockets")]
    assert (rockets["tier"], rockets["answered"], rockets["source"]) == ("deny", "not_offered", "")
    assert by_tool[("CGEN", "write_file")]["answered"] == "not_offered"  # not offered in general
    everything = "\n".join(raw)
    for secret in (BOT_TOKEN, SIGNING_SECRET, "sk-test"):
        assert secret not in everything
    decisions = [json.loads(fields[b"entry"]) for _, fields in client.xrange(Keys.audit())]
    assert [(d["verdict"], d["tool"]) for d in decisions] == [("declined", "write_file")]  # apart


def test_python_m_workers_audit_calls_prints_one_line_per_ruled_call(recorded: Stack) -> None:
    done = workers_cli(recorded, "audit", "--calls")
    assert done.returncode == 0, done.stderr
    ruled = [line for line in done.stdout.splitlines() if " ruled " in line]
    assert len(ruled) == len(done.stdout.splitlines()) == 7
    shown = next(line for line in ruled if "launch_rockets" in line)
    assert 'launch_rockets({"count": 3})' in shown and "channel=CGEN" in shown
    assert "answered=not_offered" in shown and "profile=general" in shown
