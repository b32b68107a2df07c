"""What an operator sees of counting rules before a call meets them: `python -m harness
--explain-call` names the window it cannot read; `python -m workers explain-call` reads it in Redis
(or says it cannot); `python -m workers replay` replays the recorded calls in order, each meeting
the window the earlier ones filled under the draft. Real processes, real Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from gates.meters import RunMeter
from harness.config import load_config
from harness.counting import Count, Where
from harness.policy import Tier
from ops.replay import approved_calls, replay
from store import Store

pytestmark = pytest.mark.e2e  # real processes

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """
[tools]
builtin = ["get_time", "write_file"]
[policy.tools]
get_time = "allow"
[[policy.rules]]
tool = "get_time"
tier = "ask"
max_calls = 2
per = "1h"
scope = "channel"
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "harness.toml"
    path.write_text(CONFIG)
    return path


def run(config: Path, *args: str, redis_url: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "ANTHROPIC_", "REDIS_"))}
    env.update(HARNESS_CONFIG=str(config), PYTHONPATH=str(ROOT), HARNESS_WORKSPACE=str(config.parent))
    if redis_url:
        env["REDIS_URL"] = redis_url
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=config.parent, capture_output=True, text=True, timeout=60
    )


def test_the_terminal_explain_names_a_window_it_cannot_read(config: Path) -> None:
    done = run(config, "-m", "harness", "--explain-call", "get_time", "{}", "--channel", "C1")
    assert done.returncode == 0, done.stderr
    tier_line, counter = done.stdout.splitlines()[1:]
    assert tier_line == "get_time\tallow\tpolicy.tools.get_time"
    assert counter == (
        '# counter: policy.rules[1] (tool = "get_time"): max_calls = 2 per 1h by channel: not read '
        "(python -m harness reads no Redis; python -m workers explain-call does): the tier above assumes "
        "room in it; past it the call would be ask"
    )


def test_workers_explain_reads_the_window_a_call_would_meet(
    config: Path, redis_url: str, store: Store
) -> None:
    rule = load_config(config).policy.rules[0]
    meter = RunMeter(store, Where(uuid.uuid4().hex, "T1", "C1", "1.000100", "UA"))
    for call in ("a", "b"):
        assert meter.take(call, [Count(rule, 1.0)]) is None

    here = run(
        config,
        "-m",
        "workers",
        "explain-call",
        "get_time",
        "{}",
        "--team",
        "T1",
        "--channel",
        "C1",
        redis_url=redis_url,
    )
    assert here.returncode == 0, here.stderr
    lines = here.stdout.splitlines()
    assert (
        lines[1]
        == 'get_time\task\tpolicy.rules[1] (tool = "get_time"): max_calls = 2 per 1h by channel, 2 ran'
    )
    assert lines[2].endswith("2 in the channel window now, this call adds 1: past the limit, so ask")

    elsewhere = run(
        config,
        "-m",
        "workers",
        "explain-call",
        "get_time",
        "{}",
        "--team",
        "T1",
        "--channel",
        "C2",
        redis_url=redis_url,
    )
    assert elsewhere.stdout.splitlines()[1] == "get_time\tallow\tpolicy.tools.get_time"
    assert elsewhere.stdout.splitlines()[2].endswith(
        "0 in the channel window now, this call adds 1: within the limit"
    )

    unnamed = run(
        config, "-m", "workers", "explain-call", "get_time", "{}", "--channel", "C1", redis_url=redis_url
    )
    assert unnamed.stdout.splitlines()[2].endswith(
        "not read: give --team to name its window; the tier above assumes room in it"
    )


def test_workers_explain_says_when_it_cannot_read_a_window(config: Path) -> None:
    away = run(
        config,
        "-m",
        "workers",
        "explain-call",
        "get_time",
        "{}",
        "--team",
        "T1",
        "--channel",
        "C1",
        redis_url="redis://127.0.0.1:1/0",
    )
    assert away.returncode == 0, away.stderr
    lines = away.stdout.splitlines()
    assert lines[1].startswith("get_time\task\t") and lines[1].endswith("its counter could not be read")
    assert lines[2].endswith("could not be read (channel window): the tier above counts it as past its limit")


def ruled(call: str, channel: str, at: float, tool: str = "get_time", run_id: str = "r1") -> dict[str, Any]:
    return {
        "event": "ruled",
        "at": at,
        "run_id": run_id,
        "call_id": call,
        "team": "T1",
        "channel": channel,
        "thread_ts": "1.000100",
        "requester": "UA",
        "profile": "",
        "tool": tool,
        "source": "builtin",
        "tier": "allow",
        "why": "policy.tools.get_time",
        "input": {},
    }


def test_replay_counts_the_recorded_calls_in_order(config: Path) -> None:
    draft = load_config(config)
    entries = [
        ruled("c1", "C1", 1000.0),
        ruled("c2", "C1", 1001.0),
        ruled("o1", "C2", 1002.0),
        ruled("c3", "C1", 1003.0),
        ruled("c4", "C1", 1004.0),
        ruled("c5", "C1", 1002.0 + 3600),  # c1 and c2 have left the window
    ]
    results = list(
        replay(draft, entries, approved_calls([{"run_id": "r1", "call_id": "c3", "verdict": "approved"}]))
    )
    tiers = {r.entry["call_id"]: r.would_be for r in results}
    assert tiers == {
        "c1": Tier.ALLOW,
        "c2": Tier.ALLOW,
        "o1": Tier.ALLOW,
        "c3": Tier.ASK,
        "c4": Tier.ASK,
        "c5": Tier.ALLOW,
    }
    c3 = next(r for r in results if r.entry["call_id"] == "c3")
    assert c3.why.endswith("max_calls = 2 per 1h by channel, 2 ran") and c3.changed
    # c3 ran (a person approved it) and counts; c4 asked and nobody approved it: it does not.
    c5 = next(r for r in results if r.entry["call_id"] == "c5")
    assert c5.why == "policy.tools.get_time" and not c5.changed
