"""`[[profiles]]`: strict parsing, which profile a run gets and why, and what it inherits.

A profile's tables lay its keys over the top level's, key by key; its rules come first (a matching
`deny` still wins); its `policy.tools` entries win over the top's for the same key; `tools.mcp`
picks among the servers defined once. Bad input stops the process with one line naming the key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import Budgets, Config, ConfigError, load_config
from harness.policy import Tier
from harness.state import StateError
from harness.tools.catalog import BUILTIN, Catalog
from store import RunRecord
from tests.stack import ROOT

SERVERS = """
[[mcp.servers]]
name = "tickets"
command = "python"
[[mcp.servers]]
name = "wiki"
url = "https://wiki.example.com/mcp"
"""

COMPANY = (
    """
[model]
name = "claude-top"
[limits]
max_turns = 8
token_budget = 40000
[tools]
builtin = ["get_time", "read_file", "list_files"]
[policy]
default = "ask"
[policy.tools]
get_time = "allow"
read_file = "allow"
"tickets__*" = "ask"
[[policy.rules]]
tool = "write_file"
args = { path = "drafts/**" }
tier = "allow"
[approvals]
approvers = ["UALICE"]
required = 1
[budgets]
per_user_daily_tokens = 100000
"""
    + SERVERS
    + """
[[profiles]]
name = "ops"
channels = ["C0OPS", "G0PRIV"]
teams = ["T1"]
requesters = ["S0SRE", "UBOB"]
[profiles.tools]
builtin = ["get_time", "read_file", "write_file"]
mcp = ["tickets"]
[profiles.policy]
default = "deny"
[profiles.policy.tools]
read_file = "ask"
"tickets__close" = "deny"
[[profiles.policy.rules]]
tool = "write_file"
args = { path = "drafts/secret/**" }
tier = "deny"
[[profiles.policy.rules]]
tool = "write_file"
args = { path = "runbooks/**" }
tier = "allow"
[profiles.approvals]
approvers = ["S0SRE"]
required = 2
[profiles.limits]
max_turns = 20
[profiles.budgets]
per_channel_daily_tokens = 500000
[profiles.model]
name = "claude-ops"

[[profiles]]
name = "dms"
channels = ["im"]
[profiles.tools]
builtin = ["get_time"]
mcp = []

[[profiles]]
name = "everything-else-in-t2"
teams = ["T2"]
"""
)


def config_of(tmp_path: Path, text: str, **env: str) -> Config:
    path = tmp_path / "harness.toml"
    path.write_text(text)
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path), **env})


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        config_of(tmp_path, text)
    message = str(caught.value)
    assert "\n" not in message  # one line
    return message


# --- which profile -----------------------------------------------------------------------------


def test_the_first_profile_that_matches_wins_and_says_why(tmp_path: Path) -> None:
    config = config_of(tmp_path, COMPANY)
    ops = config.match("C0OPS", "T1")
    assert ops.profile == "ops"
    assert ops.header() == "# profile: ops (channel C0OPS is in profiles[ops].channels)"
    assert config.match("G0PRIV", "T1").profile == "ops"
    dm = config.match("D0ALICE", "T1")
    assert dm.profile == "dms" and '"im"' in dm.why
    assert config.match("C0OPS", "T9").profile is None  # ops is for T1 only
    assert config.match("C0ANY", "T2").profile == "everything-else-in-t2"
    top = config.match("C0GENERAL", "T1")
    assert top.profile is None and top.settings is config
    assert top.header() == "# profile: none"  # the contract's words
    assert top.why.startswith("no profile matches channel C0GENERAL")


def test_a_profile_inherits_every_key_it_does_not_give(tmp_path: Path) -> None:
    config = config_of(tmp_path, COMPANY)
    ops = config.for_run("C0OPS", "T1")
    assert ops.limits.max_turns == 20 and ops.limits.token_budget == 40000
    assert ops.approvals.approvers == ("S0SRE",) and ops.approvals.required == 2
    assert ops.approvals.expire_after_minutes == config.approvals.expire_after_minutes
    assert ops.budgets == Budgets(per_user_daily_tokens=100000, per_channel_daily_tokens=500000)
    assert ops.model == "claude-ops" and config.model == "claude-top"
    assert ops.tools.builtin == ("get_time", "read_file", "write_file")
    assert ops.offered_servers == ("tickets",) and ops.offers_server("tickets")
    assert not ops.offers_server("wiki")
    assert config.offered_servers is None and config.offers_server("wiki")
    assert ops.requesters == ("S0SRE", "UBOB") and config.requesters == ()
    assert ops.mcp_servers == config.mcp_servers  # defined once; a profile only picks
    dms = config.for_run("D0X", "T1")
    assert dms.offered_servers == () and dms.approvals == config.approvals


def test_a_profiles_policy_lays_over_the_top_levels(tmp_path: Path) -> None:
    ops = config_of(tmp_path, COMPANY).for_run("C0OPS", "T1").policy
    # Its own policy.tools entry wins for the same key, and says where it was written.
    assert ops.decide("read_file", {}).tier is Tier.ASK
    assert ops.decide("read_file", {}).why == "profiles[ops].policy.tools.read_file"
    # The top level's entries it does not touch stay.
    assert ops.decide("get_time", {}).why == "policy.tools.get_time"
    # Its default replaces the top's.
    assert ops.decide("made_up", {}).tier is Tier.DENY
    assert ops.decide("made_up", {}).why == "profiles[ops].policy.default"
    # Its rules come first; a matching deny wins over the top level's allow for drafts/**.
    denied = ops.decide("write_file", {"path": "drafts/secret/x"})
    assert denied.tier is Tier.DENY and denied.why.startswith("profiles[ops].policy.rules[1]")
    allowed = ops.decide("write_file", {"path": "drafts/x"})
    assert allowed.tier is Tier.ALLOW and allowed.why.startswith("policy.rules[1]")
    assert ops.decide("write_file", {"path": "runbooks/a.md"}).why.startswith("profiles[ops].policy.rules[2]")
    assert ops.decide("tickets__close", {}).tier is Tier.DENY
    assert ops.decide("tickets__open", {}).tier is Tier.ASK


def test_harness_model_wins_over_the_top_level_but_not_over_a_profiles_own(tmp_path: Path) -> None:
    config = config_of(tmp_path, COMPANY, HARNESS_MODEL="claude-env")
    assert config.model == "claude-env"
    assert config.for_run("C0OPS", "T1").model == "claude-ops"
    assert config.for_run("D0X", "T1").model == "claude-env"


def test_a_profiles_system_prompt_replaces_the_top_levels_whichever_key(tmp_path: Path) -> None:
    (tmp_path / "ops.md").write_text("You are the ops agent.")
    config = config_of(
        tmp_path,
        '[model]\nsystem = "top prompt"\n[[profiles]]\nname = "ops"\nchannels = ["C0OPS"]\n'
        '[profiles.model]\nsystem_file = "ops.md"\n',
    )
    assert config.model_settings.system == "top prompt"
    assert config.for_run("C0OPS").model_settings.system == "You are the ops agent."


def test_a_merged_profile_is_checked_as_a_whole(tmp_path: Path) -> None:
    message = error_of(
        tmp_path,
        "[model]\nthinking_budget = 2048\n[limits]\nmax_tokens = 4096\n"
        '[[profiles]]\nname = "small"\n[profiles.limits]\nmax_tokens = 1024\n',
    )
    assert "profiles[small]" in message and "thinking_budget" in message


def test_settings_of_a_gone_profile_offer_nothing_and_deny_everything(tmp_path: Path) -> None:
    config = config_of(tmp_path, COMPANY)
    assert config.for_profile("ops") is config.profiles[0].settings
    assert config.for_profile("") is config and config.settings("") is config
    assert config.for_profile("renamed") is None
    closed = config.settings("renamed")
    assert closed.profile == "renamed"
    assert closed.tools.builtin == () and closed.tools.modules == () and closed.offered_servers == ()
    assert closed.policy.decide("anything", {}).tier is Tier.DENY


# --- bad input: one line naming the key ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[[profiles]]\nchannels = ["C0A"]\n', "profiles[0].name is missing"),
        ('[[profiles]]\nname = "Ops!"\n', "profiles[0].name"),
        (
            '[[profiles]]\nname = "a"\n[[profiles]]\nname = "a"\n',
            "profiles[1].name 'a' is used by two profiles",
        ),
        (
            '[[profiles]]\nname = "a"\nchannels = ["C0A"]\n[[profiles]]\nname = "b"\nchannels = ["C0A"]\n',
            "profiles[b].channels: C0A is also in profiles[a].channels",
        ),
        ('[[profiles]]\nname = "a"\ncolour = "blue"\n', "unknown key profiles[0].colour"),
        ('[[profiles]]\nname = "a"\nchannels = ["general"]\n', "profiles[a].channels[0]"),
        ('[[profiles]]\nname = "a"\nteams = ["X1"]\n', "profiles[a].teams[0]"),
        ('[[profiles]]\nname = "a"\nrequesters = ["alice"]\n', "profiles[a].requesters[0]"),
        ('[[profiles]]\nname = "a"\n[profiles.tools]\nmcp = ["nope"]\n', "profiles[a].tools.mcp[0]"),
        ('[[profiles]]\nname = "a"\n[profiles.tools]\nbuiltin = ["rm_rf"]\n', "tools.builtin[0]"),
        (
            '[[profiles]]\nname = "a"\n[profiles.limits]\nmax_turn = 3\n',
            "unknown key profiles[a].limits.max_turn",
        ),
        ('[[profiles]]\nname = "a"\n[profiles.limits]\nmax_turns = "3"\n', "profiles[a].limits.max_turns"),
        (
            '[[profiles]]\nname = "a"\n[profiles.policy.tools]\nget_time = "maybe"\n',
            "profiles[a].policy.tools.get_time",
        ),
        (
            '[[profiles]]\nname = "a"\n[profiles.policy]\nshade = "x"\n',
            "unknown key profiles[a].policy.shade",
        ),
        (
            '[[profiles]]\nname = "a"\n[[profiles.policy.rules]]\ntool = "x"\n',
            "profiles[a].policy.rules[1].tier is missing",
        ),
        ('[[profiles]]\nname = "a"\n[profiles.approvals]\nrequired = 0\n', "profiles[a].approvals.required"),
        (
            '[[profiles]]\nname = "a"\n[profiles.budgets]\nper_user_daily_tokens = -1\n',
            "profiles[a].budgets.per_user_daily_tokens",
        ),
        ("[budgets]\nper_channel_daily_tokens = 1.5\n", "budgets.per_channel_daily_tokens"),
        ("[budgets]\nweekly = 3\n", "unknown key budgets.weekly"),
        ('profiles = "ops"\n', "profiles must be an array of tables"),
        ('[[profiles]]\nname = "a"\ntools = "all"\n', "profiles[0].tools"),
    ],
)
def test_bad_profiles_stop_the_process_naming_the_key(tmp_path: Path, text: str, named: str) -> None:
    assert named in error_of(tmp_path, text + SERVERS)


def test_an_unknown_server_names_the_ones_defined(tmp_path: Path) -> None:
    message = error_of(
        tmp_path, SERVERS + '[[profiles]]\nname = "a"\n[profiles.tools]\nmcp = ["tickets", "jira"]\n'
    )
    assert "profiles[a].tools.mcp[1]" in message and "'jira'" in message and "tickets, wiki" in message


# --- what a run is offered ---------------------------------------------------------------------


def test_a_catalog_narrowed_to_a_profile_offers_only_its_tools(tmp_path: Path) -> None:
    config = config_of(
        tmp_path,
        '[tools]\nbuiltin = ["get_time"]\n'
        '[[profiles]]\nname = "files"\nchannels = ["C0F"]\n'
        '[profiles.tools]\nbuiltin = ["read_file", "write_file"]\n',
    )
    catalog = Catalog.from_config(config)  # every level's tools, once
    assert sorted(t.name for t in catalog.static) == ["get_time", "read_file", "write_file"]
    top = catalog.narrowed(config).registry()
    files = catalog.narrowed(config.for_run("C0F")).registry()
    assert sorted(top.names()) == ["get_time"]
    assert sorted(files.names()) == ["read_file", "write_file"]
    assert catalog.narrowed(config.for_run("C0F")) is catalog.narrowed(config.for_run("C0F"))  # kept
    assert catalog.source("read_file") == BUILTIN
    assert catalog.narrowed(config.settings("gone")).registry().names() == []


def test_a_stored_record_whose_profile_is_not_text_is_refused() -> None:
    record = RunRecord("r1", "T1", "C1", "1.0", "U1", "task", profile="ops")
    assert RunRecord.from_json(record.to_json()).profile == "ops"
    forged = json.dumps({**json.loads(record.to_json()), "profile": {"name": "ops"}})
    with pytest.raises(StateError):
        RunRecord.from_json(forged)


@pytest.mark.parametrize("command", [["harness", "--list-tools"], ["workers"], ["bot"]])
@pytest.mark.e2e
def test_each_process_refuses_a_bad_profile_at_start_in_one_line(tmp_path: Path, command: list[str]) -> None:
    """`python -m bot`, `python -m workers` and `python -m harness` stop with status 2 and one line
    naming the key, before they reach Slack, Redis or the model."""
    path = tmp_path / "harness.toml"
    path.write_text(
        '[[profiles]]\nname = "a"\nchannels = ["C0A"]\n[[profiles]]\nname = "b"\nchannels = ["C0A"]\n'
    )
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        "HARNESS_CONFIG": str(path),
        "HARNESS_WORKSPACE": str(tmp_path),
        "SLACK_BOT_TOKEN": "xoxb-test",
        "SLACK_SIGNING_SECRET": "secret",
        "SLACK_API_URL": "http://127.0.0.1:9/api/",
        "REDIS_URL": "redis://127.0.0.1:9/0",
    }
    done = subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "profiles[b].channels: C0A is also in profiles[a].channels" in lines[0]


def test_a_module_named_by_one_profile_is_offered_only_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "opsdesk_tools.py").write_text(
        "from harness.tools import ToolContext, tool\n\n"
        "@tool(side_effects=False)\n"
        "def page_oncall(ctx: ToolContext) -> str:\n"
        '    """Page the on-call engineer."""\n'
        '    return "paged"\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = config_of(
        tmp_path,
        '[[profiles]]\nname = "ops"\nchannels = ["C0OPS"]\n[profiles.tools]\nmodules = ["opsdesk_tools"]\n',
    )
    catalog = Catalog.from_config(config)  # the module is imported once, for every level
    assert catalog.source("page_oncall") == "opsdesk_tools"
    assert "page_oncall" in catalog.narrowed(config.for_run("C0OPS")).registry().names()
    assert "page_oncall" not in catalog.narrowed(config.for_run("C0ELSE")).registry().names()
