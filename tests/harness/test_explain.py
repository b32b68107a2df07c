"""`python -m harness --list-tools` and `--explain-call` with `--channel`, `--team`, `--user`: the
profile that applies comes first, then exactly what a run there is offered, with that profile's
policy; with a user, whether they may start a run there and the budgets in force. A real process,
as an operator runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # `python -m harness --list-tools` as a process, in every test

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """
[policy.tools]
get_time = "allow"

[[policy.rules]]
tool = "write_file"
args = { path = "drafts/**" }
tier = "allow"

[[profiles]]
name = "ops"
channels = ["C0PS"]
requesters = ["UANN", "S0SRE"]
[profiles.tools]
builtin = ["get_time", "read_file", "write_file", "delete_file"]
[profiles.policy.tools]
delete_file = "deny"
[profiles.budgets]
per_user_daily_tokens = 50000

[[profiles]]
name = "general"
channels = ["CGEN"]
requesters = ["UANN", "UBOB"]
[profiles.tools]
builtin = ["get_time", "read_file", "list_files"]
[profiles.policy]
default = "deny"
[profiles.policy.tools]
read_file = "ask"

[[profiles]]
name = "direct"
channels = ["im"]
[profiles.tools]
builtin = ["get_time"]
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "harness.toml"
    path.write_text(CONFIG)
    return path


def harness(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "HARNESS_", "SLACK_"))}
    env.update(PYTHONPATH=str(ROOT), HARNESS_CONFIG=str(config), HARNESS_WORKSPACE=str(config.parent))
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_two_channels_two_profiles_show_their_own_tools_and_tiers(config: Path) -> None:
    ops = harness(config, "--list-tools", "--channel", "C0PS")
    assert ops.returncode == 0, ops.stderr
    assert ops.stdout.splitlines() == [
        "# profile: ops (channel C0PS is in profiles[ops].channels)",
        "get_time\tallow\tpolicy.tools.get_time",
        "read_file\tallow\ttool's own tier (built-in)",
        "write_file\task\ttool's own tier (built-in); policy.rules[1] may decide a call by its arguments",
        "delete_file\tdeny\tprofiles[ops].policy.tools.delete_file",
    ]
    general = harness(config, "--channel", "CGEN", "--list-tools")  # the flags in any order
    assert general.returncode == 0, general.stderr
    assert general.stdout.splitlines() == [
        "# profile: general (channel CGEN is in profiles[general].channels)",
        "get_time\tallow\tpolicy.tools.get_time",
        "read_file\task\tprofiles[general].policy.tools.read_file",
        "list_files\tallow\ttool's own tier (built-in)",
    ]


def test_explain_call_uses_the_profile_and_says_when_a_tool_is_not_offered_there(config: Path) -> None:
    allowed = harness(config, "--explain-call", "write_file", '{"path": "drafts/x.md"}', "--channel", "C0PS")
    assert allowed.stdout.splitlines() == [
        "# profile: ops (channel C0PS is in profiles[ops].channels)",
        'write_file\tallow\tpolicy.rules[1] (tool = "write_file", path = "drafts/**")',
    ]
    absent = harness(config, "--channel", "CGEN", "--explain-call", "write_file", '{"path": "drafts/x.md"}')
    assert absent.returncode == 1
    assert absent.stdout.splitlines()[1] == (
        "write_file\t-\tnot offered under profile general: answered as an error, never run"
    )
    invented = harness(config, "--explain-call", "launch", "{}", "--channel", "CGEN")
    assert invented.returncode == 1
    assert (
        invented.stdout.splitlines()[1]
        == "launch\t-\tno tool of that name is offered: answered as an error, never run"
    )


def test_a_direct_message_matches_the_im_profile_and_other_channels_the_top_level(config: Path) -> None:
    dm = harness(config, "--list-tools", "--channel", "D0123")
    assert dm.stdout.splitlines() == [
        '# profile: direct (a direct message: profiles[direct].channels has "im")',
        "get_time\tallow\tpolicy.tools.get_time",
    ]
    elsewhere = harness(config, "--list-tools", "--channel", "CELSE", "--team", "T9")
    lines = elsewhere.stdout.splitlines()
    assert lines[0] == "# profile: none"
    assert [line.split("\t")[0] for line in lines[1:]] == [
        "get_time",
        "read_file",
        "list_files",
        "write_file",
        "delete_file",
    ]


def test_a_user_left_out_is_refused_and_the_budgets_are_shown(config: Path) -> None:
    refused = harness(config, "--list-tools", "--channel", "CGEN", "--user", "UZED")
    assert refused.returncode == 0, refused.stderr
    assert refused.stdout.splitlines()[:3] == [
        "# profile: general (channel CGEN is in profiles[general].channels)",
        "# requester: UZED may not start a run here (profiles[general].requesters lists only UANN, UBOB): "
        "their mention gets an ephemeral reply and starts nothing",
        "# budgets: per user none, per channel none (UTC days; profiles[general].budgets)",
    ]
    listed = harness(config, "--user", "UBOB", "--channel", "CGEN", "--list-tools")
    assert listed.stdout.splitlines()[1] == (
        "# requester: UBOB may start a run here (profiles[general].requesters lists UBOB)"
    )


def test_a_user_group_in_requesters_is_not_guessed(config: Path) -> None:
    done = harness(config, "--list-tools", "--channel", "C0PS", "--user", "UZED")
    lines = done.stdout.splitlines()
    assert lines[1] == (
        "# requester: UZED is not listed in profiles[ops].requesters; they may start a run here only "
        "as a member of S0SRE (user groups cannot be resolved offline: ask Slack)"
    )
    assert (
        lines[2]
        == "# budgets: per user 50,000 tokens a day, per channel none (UTC days; profiles[ops].budgets)"
    )
    anyone = harness(config, "--list-tools", "--channel", "D0123", "--user", "WZED")
    assert anyone.stdout.splitlines()[1] == (
        "# requester: WZED may start a run here (profiles[direct].requesters is empty: anyone may)"
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--channel", "general"], "--channel must be a channel ID"),
        (["--channel", "U123"], "--channel must be a channel ID"),
        (["--team", "C123"], "--team must be a workspace ID"),
        (["--user", "S0SRE"], "--user must be a user ID"),
        (["--user", "u123"], "--user must be a user ID"),
        (["--user"], "--user needs a value"),
        (["--channel", "C1", "--channel", "C2"], "--channel is given twice"),
    ],
)
def test_a_bad_id_is_exit_2_with_one_clear_line(config: Path, args: list[str], said: str) -> None:
    done = harness(config, "--list-tools", *args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"error: {said}") and len(done.stderr.strip().splitlines()) == 1


def test_a_where_flag_without_list_or_explain_is_refused(config: Path) -> None:
    done = harness(config, "--channel", "C0PS")
    assert done.returncode == 2 and "--list-tools or --explain-call" in done.stderr and done.stdout == ""


def test_without_the_new_flags_nothing_changes(config: Path) -> None:
    done = harness(config, "--list-tools")
    assert done.returncode == 0, done.stderr
    assert not any(line.startswith("#") for line in done.stdout.splitlines())
    assert done.stdout.splitlines()[0] == "get_time\tallow\tpolicy.tools.get_time"
    explained = harness(config, "--explain-call", "write_file", '{"path": "drafts/a"}')
    assert (
        explained.stdout == 'write_file\tallow\tpolicy.rules[1] (tool = "write_file", path = "drafts/**")\n'
    )
