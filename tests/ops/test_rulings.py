"""The audit entry of a call's tier decision (`ops.rulings`), how it is written (once per run
and call id) and printed, and replay's rules (`ops.replay`) over entries written by hand: a
tool the draft no longer offers, an MCP server's trust, a module, a cut argument, `--days`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness.config import load_config
from harness.policy import Tier
from harness.state import PendingCall
from harness.tools import BUILTIN_TOOLS, ToolResult
from harness.tools.base import Tool
from ops import audit as audit_lines
from ops import replay
from ops.rulings import ARG_CHARS, CUT_KEYS, INPUT_CHARS, KEY_CHARS, bounded_input, ruling_entry
from store import RunRecord, Store, rulings_write
from store.keys import Keys

ROOT = Path(__file__).resolve().parents[2]
RUN = "0123456789abcdef0123456789abcdef"
WRITE = next(t for t in BUILTIN_TOOLS if t.name == "write_file")


def record(**changes: Any) -> RunRecord:
    fields: dict[str, Any] = dict(
        run_id=RUN, team="T1", channel="COPS", thread_ts="1.2", requester="UANN", task="t", profile="ops"
    )
    return RunRecord(**{**fields, **changes})


def call(name: str = "write_file", input: dict[str, Any] | None = None, **changes: Any) -> PendingCall:  # noqa: A002
    args = {"path": "drafts/a.md", "content": "x"} if input is None else input
    call_id, tier = changes.pop("id", "toolu_1"), changes.pop("tier", Tier.ASK)
    return PendingCall(call_id, name, args, tier, why="tool's own tier (built-in)", **changes)


# --- the entry ---------------------------------------------------------------------------------


def test_an_entry_holds_where_who_what_and_why() -> None:
    entry = ruling_entry(record(), call(), WRITE, "builtin", now=1000.0)
    assert entry["event"] == "ruled" and entry["at"] == 1000.0
    assert (entry["run_id"], entry["call_id"], entry["team"], entry["channel"]) == (
        RUN,
        "toolu_1",
        "T1",
        "COPS",
    )
    assert (entry["thread_ts"], entry["requester"], entry["profile"]) == ("1.2", "UANN", "ops")
    assert (entry["tool"], entry["source"], entry["own_tier"]) == ("write_file", "builtin", "ask")
    assert entry["own_why"] == "tool's own tier (built-in)"
    assert (entry["tier"], entry["why"]) == ("ask", "tool's own tier (built-in)")
    assert entry["fingerprint"] == call().fingerprint
    assert entry["input"] == {"path": "drafts/a.md", "content": "x"} and "cut" not in entry
    assert "answered" not in entry


def test_a_call_answered_at_once_is_recorded_as_such() -> None:
    invented = call("launch", {"n": 1}, tier=Tier.DENY, result=ToolResult("no such tool", True))
    entry = ruling_entry(record(), invented, None, "")
    assert (entry["answered"], entry["own_tier"], entry["source"]) == ("not_offered", None, "")
    bad = call(result=ToolResult("invalid input", True))
    assert ruling_entry(record(), bad, WRITE, "builtin")["answered"] == "error"


def test_a_long_string_keeps_its_start_and_is_marked_cut() -> None:
    kept, cut = bounded_input({"path": "p" * (ARG_CHARS + 10), "mode": "w"})
    assert kept == {"path": "p" * ARG_CHARS, "mode": "w"} and cut == ["path"]
    entry = ruling_entry(record(), call(input={"path": "p" * 50_000}), WRITE, "builtin")
    assert entry["cut"] == ["path"] and entry["input_chars"] > 50_000  # the hash is of the whole


def test_a_big_value_that_is_not_a_string_is_left_out_and_marked() -> None:
    kept, cut = bounded_input({"rows": list(range(2000)), "n": 5})
    assert kept == {"n": 5} and cut == ["rows"]


def test_the_whole_entry_stays_bounded_whatever_the_model_sends() -> None:
    flood = {f"k{i}": "v" * 5000 for i in range(500)}
    flood["x" * 10_000] = "name too long"
    entry = ruling_entry(record(), call(input=flood), WRITE, "builtin")
    assert len(json.dumps(entry["input"], ensure_ascii=False)) <= INPUT_CHARS
    assert len(entry["cut"]) == CUT_KEYS and entry["cut_more"] == 501 - CUT_KEYS
    assert len(json.dumps(entry, ensure_ascii=False)) < INPUT_CHARS + 6000
    kept, cut = bounded_input({"y" * 500: 1})
    assert kept == {} and cut == ["y" * KEY_CHARS]


def test_arguments_that_are_not_an_object_are_not_kept() -> None:
    assert bounded_input(["a", "b"]) == (None, [])


def test_an_mcp_tool_records_its_read_only_claim() -> None:
    tool = Tool("desk__get", "d", {"type": "object"}, lambda c, a: "", annotations={"readOnlyHint": True})
    entry = ruling_entry(record(), call("desk__get", {}), tool, "mcp:desk")
    assert entry["claims_read_only"] is True and entry["source"] == "mcp:desk"


# --- written once, read back, printed ------------------------------------------------------------


def test_the_write_records_each_call_once_however_often_it_is_sent(store: Store) -> None:
    entries = [ruling_entry(record(), call(id=f"toolu_{i}"), WRITE, "builtin") for i in range(3)]
    write = rulings_write(RUN, entries)
    store.runs.write_besides([write, write])
    store.runs.write_besides([rulings_write(RUN, entries[:1])])
    got = list(store.audit.calls_since(0))
    assert [e["call_id"] for e in got] == ["toolu_0", "toolu_1", "toolu_2"]
    assert store.audit.call_entries(2) == got[1:] and store.audit.entries() == []  # decisions' audit apart
    assert store.redis.ttl(Keys.audit_ruled(RUN)) > 0  # the ids are forgotten in time


def test_calls_since_pages_through_everything_newer(store: Store) -> None:
    old = int((time.time() - 5 * 86400) * 1000)
    store.redis.xadd(Keys.audit_calls(), {"entry": json.dumps({"event": "ruled", "n": -1})}, id=f"{old}-0")
    for n in range(2500):
        store.redis.xadd(Keys.audit_calls(), {"entry": json.dumps({"event": "ruled", "n": n})})
    store.redis.xadd(Keys.audit_calls(), {"entry": b"not json"})
    got = list(store.audit.calls_since(time.time() - 86400))
    assert [e.get("n") for e in got[:-1]] == list(range(2500))
    assert "unreadable" in got[-1]


def test_a_ruled_entry_is_one_line_with_nothing_a_terminal_acts_on() -> None:
    entry = ruling_entry(record(), call(input={"path": "a\x1b[2J\nb", "content": "c"}), WRITE, "builtin")
    line = audit_lines.audit_line(entry)
    assert "\n" not in line and "\x1b" not in line
    assert " ruled    ask   write_file(" in line and "run=" + RUN in line and "profile=ops" in line
    assert "source=builtin" in line and f"input_sha256={entry['input_sha256']}" in line
    hostile = {"event": "ruled", "at": "x", "tool": ["x"], "cut": 3, "input": {"a": 1}}
    assert audit_lines.audit_line(hostile).startswith("(no time) ruled")


# --- replay's rules ----------------------------------------------------------------------------


def draft(tmp_path: Path, body: str) -> Any:
    path = tmp_path / "draft.toml"
    path.write_text(body)
    return load_config(path)


def ruled(tool: str, tier: str, source: str, **extra: Any) -> dict[str, Any]:
    base = {"event": "ruled", "at": 1.0, "channel": "COPS", "team": "T1", "profile": "ops", "tool": tool}
    return {**base, "tier": tier, "source": source, "input": {}, **extra}


OPS = '[[profiles]]\nname = "ops"\nchannels = ["COPS"]\n'


def test_a_tool_the_draft_no_longer_offers_would_be_deny_saying_why(tmp_path: Path) -> None:
    config = draft(tmp_path, OPS + '[profiles.tools]\nbuiltin = ["get_time"]\n')
    [result] = replay.replay(config, [ruled("read_file", "allow", "builtin")])
    assert (result.was, result.would_be) == (Tier.ALLOW, Tier.DENY)
    assert result.why == (
        "not offered in profile ops (channel COPS is in profiles[ops].channels): "
        "profiles[ops].tools.builtin does not list read_file"
    )


def test_a_server_gone_or_not_picked_and_a_module_not_listed_are_not_offered(tmp_path: Path) -> None:
    config = draft(
        tmp_path,
        '[[mcp.servers]]\nname = "desk"\ncommand = "x"\n'
        + OPS
        + '[profiles.tools]\nmcp = []\nmodules = ["ops_tools"]\n',
    )
    calls = [
        ruled("desk__close", "ask", "mcp:desk"),
        ruled("kube__get", "allow", "mcp:kube"),
        ruled("page", "ask", "pager_tools"),
        ruled("restart", "ask", "ops_tools"),
    ]
    why = [r.why.split("): ", 1)[-1] for r in replay.replay(config, calls)]
    assert why[:3] == [
        "profiles[ops].tools.mcp does not list desk",
        "no [[mcp.servers]] is named kube",
        "profiles[ops].tools.modules does not list pager_tools",
    ]
    assert why[3] == "policy.default"  # offered: the module is listed


def test_trusting_a_server_makes_its_read_only_claim_its_own_tier(tmp_path: Path) -> None:
    server = '[[mcp.servers]]\nname = "desk"\ncommand = "x"\n'
    entry = ruled("desk__get", "ask", "mcp:desk", claims_read_only=True)
    [trusted] = replay.replay(draft(tmp_path, server + "trust_annotations = true\n"), [entry])
    assert (trusted.would_be, trusted.changed) == (Tier.ALLOW, True)
    assert "trusted: trust_annotations = true for server desk" in trusted.why
    [untrusted] = replay.replay(draft(tmp_path, server), [entry])
    assert (untrusted.would_be, untrusted.changed) == (Tier.ASK, False)


def test_a_rule_over_a_cut_argument_is_uncertain(tmp_path: Path) -> None:
    rule = '[[policy.rules]]\ntool = "write_file"\nargs = { path = "drafts/**" }\ntier = "deny"\n'
    config = draft(tmp_path, rule)
    cut = ruled("write_file", "ask", "builtin", input={"path": "drafts/" + "p" * 10}, cut=["path"])
    whole = ruled("write_file", "ask", "builtin", input={"path": "drafts/a"})
    results = list(replay.replay(config, [cut, whole]))
    assert [r.uncertain for r in results] == [True, False]
    assert results[0].why.endswith("(uncertain: the audit kept only part of path)")
    assert replay.summary(results) == (
        "2 calls, 2 would change: 2 ask→deny; "
        "1 uncertain (a rule reads an argument the audit kept only in part)"
    )


def test_a_call_now_under_another_profile_says_so(tmp_path: Path) -> None:
    config = draft(
        tmp_path, '[[profiles]]\nname = "eng"\nchannels = ["COPS"]\n[profiles.policy]\ndefault = "deny"\n'
    )
    [moved] = replay.replay(config, [ruled("read_file", "allow", "builtin") | {"input": {"path": "x"}}])
    assert (
        moved.why
        == "tool's own tier (built-in) (now under profile eng: channel COPS is in profiles[eng].channels)"
    )


def test_entries_of_other_kinds_or_unreadable_tiers_are_passed_over(tmp_path: Path) -> None:
    config = draft(tmp_path, "")
    entries = [
        {"verdict": "approved", "tool": "write_file"},
        {"unreadable": "x"},
        ruled("read_file", "sometimes", "builtin"),
        ruled("read_file", "allow", "builtin"),
    ]
    results = list(replay.replay(config, entries))
    assert len(results) == 1 and replay.summary(results) == "1 calls, none would change"


@pytest.mark.e2e
def test_replay_reads_only_the_last_days(store: Store, redis_url: str, tmp_path: Path) -> None:
    old = int((time.time() - 3 * 86400) * 1000)
    entry = ruled("read_file", "allow", "builtin", channel="C9", profile="")
    store.redis.xadd(Keys.audit_calls(), {"entry": json.dumps(entry)}, id=f"{old}-0")
    store.redis.xadd(Keys.audit_calls(), {"entry": json.dumps({**entry, "tool": "get_time"})})
    path = tmp_path / "d.toml"
    path.write_text('[tools]\nbuiltin = ["list_files"]\n')
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "REDIS_URL": redis_url}

    def run(*days: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "workers", "replay", str(path), *days],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    recent = run("--days", "2")
    assert recent[-1] == "1 calls, 1 would change: 1 allow→deny" and "\tget_time\t" in recent[0]
    assert run()[-1] == "2 calls, 2 would change: 2 allow→deny"  # 30 days by default


@pytest.mark.parametrize("field", ["channel", "tool"])
def test_replay_lines_carry_no_control_characters(tmp_path: Path, field: str) -> None:
    entry = ruled("read_file", "allow", "builtin", channel="C9") | {field: "x\tY\x1b[31m"}
    [result] = replay.replay(draft(tmp_path, "[tools]\nbuiltin = []\n"), [entry])
    line = result.line()
    assert line.count("\t") == 5 and "\x1b" not in line
