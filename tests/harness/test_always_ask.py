"""Tools that always ask (issue 30): `[policy] always_ask` and an MCP tool's `_meta`
`anthropic/requiresUserInteraction: true` make every call `ask` unless the policy denies it.

Here the parts on their own: the policy, the config file, `--list-tools` over a real stdio MCP
server, the relay between a worker and its horses, the card and the batch message, and suggested
rules. End to end (real bot, worker, Redis and MCP server): tests/e2e/test_always_ask.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from harness.config import Config, ConfigError, load_config
from harness.loop import AwaitingApproval, Finished, drive
from harness.policy import Policy, Rule, Tier, always_asks, read_why
from harness.state import Decision, GrantUse, PendingCall, Verdict, record_decisions
from harness.texts import WHY_MCP_ALWAYS_ASK
from harness.tools import BUILTIN_TOOLS
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from harness.tools.mcp_listing import McpTool
from harness.tools.relay import RelayServer
from messages.batch_cards import batch_card
from messages.cards import CallCard, approval_card
from messages.reasons import plain_why
from ops.replay import rule_again
from ops.suggestions import MIN_APPROVALS
from tests.fakes.messages_api import FakeMessagesAPI, reply, text
from tests.harness.test_tier_at_execution import agent_with, approve, park_on_write
from tests.mcp_support import out, stdio_table
from tests.ops.test_suggestions import NOW, Audit
from tests.stack import ROOT

DESK_ASKS = WHY_MCP_ALWAYS_ASK.format(server="desk")


def config_of(tmp_path: Path, toml: str) -> Config:
    path = tmp_path / "harness.toml"
    path.write_text(toml, encoding="utf-8")
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})


# --- the policy ----------------------------------------------------------------------------------


def test_always_ask_turns_every_allow_into_ask_and_names_the_entry() -> None:
    policy = Policy(
        default=Tier.ALLOW,
        tools={"deploy_prod": Tier.ALLOW},
        rules=(Rule(1, "deploy_*", {"env": "staging"}, Tier.ALLOW),),
        always_ask=("deploy_*", "deploy_prod", "read_*"),
    )
    assert policy.decide("deploy_prod", {}) == (ruling := policy.decide("deploy_prod", {"env": "x"}))
    assert (ruling.tier, ruling.why) == (Tier.ASK, 'policy.always_ask["deploy_prod"]')  # exact beats glob
    by_rule = policy.decide("deploy_web", {"env": "staging"})
    assert (by_rule.tier, by_rule.why) == (Tier.ASK, 'policy.always_ask["deploy_*"]')
    own = policy.decide("read_file", {}, Tier.ALLOW, "tool's own tier (built-in)")
    assert (own.tier, own.why) == (Tier.ASK, 'policy.always_ask["read_*"]')
    by_default = policy.decide("other", {})
    assert (by_default.tier, by_default.why) == (Tier.ALLOW, "policy.default")


def test_a_deny_from_any_step_still_wins_over_always_ask() -> None:
    policy = Policy(
        tools={"deploy_prod": Tier.DENY},
        rules=(Rule(1, "deploy_*", {"env": "prod*"}, Tier.DENY),),
        always_ask=("deploy_*",),
        default=Tier.DENY,
    )
    assert policy.decide("deploy_prod", {}).tier is Tier.DENY
    assert policy.decide("deploy_web", {"env": "prod-eu"}).tier is Tier.DENY
    assert policy.decide("other", {}, always_ask_why=DESK_ASKS).tier is Tier.DENY


def test_the_tools_own_claim_makes_it_ask_even_when_trusted_read_only_or_allowed() -> None:
    policy = Policy(tools={"desk__comment": Tier.ALLOW})
    ruling = policy.decide("desk__comment", {}, always_ask_why=DESK_ASKS)
    assert (ruling.tier, ruling.why) == (Tier.ASK, DESK_ASKS)
    trusted = Policy().decide("desk__get", {}, Tier.ALLOW, "tool's own tier (MCP readOnlyHint)", DESK_ASKS)
    assert trusted.tier is Tier.ASK


def test_a_why_that_always_asks_is_read_back_and_said_plainly() -> None:
    assert always_asks('policy.always_ask["deploy_*"]')
    assert always_asks('profiles[ops].policy.always_ask["deploy_*"]')
    assert always_asks(DESK_ASKS)
    assert always_asks('policy.always_ask["x"] (decided again right before running; it was allow)')
    assert not always_asks("policy.tools.deploy_prod") and not always_asks("policy.default")
    assert not always_asks('policy.tools."policy.always_ask[x]"')
    assert read_why('profiles[ops].policy.always_ask["deploy_*"]').profile == "ops"
    assert "asks a person to approve every call of this tool" in plain_why(DESK_ASKS)
    assert "desk" in plain_why(DESK_ASKS)
    said = plain_why('profiles[ops].policy.always_ask["deploy_*"]')
    assert "always_ask" in said and "ops" in said and "deploy_*" in said


# --- the config file -----------------------------------------------------------------------------


def test_always_ask_is_read_from_policy_and_a_profile_adds_to_it(tmp_path: Path) -> None:
    config = config_of(
        tmp_path,
        '[policy]\nalways_ask = ["deploy_*"]\n[policy.tools]\nget_time = "allow"\n'
        '[[profiles]]\nname = "ops"\nchannels = ["COPS"]\n[profiles.policy]\nalways_ask = ["get_*"]\n',
    )
    assert config.policy.decide("get_time", {}).tier is Tier.ALLOW
    ops = config.for_profile("ops")
    assert ops is not None
    assert ops.policy.decide("get_time", {}).why == 'profiles[ops].policy.always_ask["get_*"]'
    assert ops.policy.decide("deploy_x", {}).why == 'policy.always_ask["deploy_*"]'  # inherited


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ('[policy]\nalways_ask = "deploy_*"\n', "policy.always_ask must be a list"),
        ("[policy]\nalways_ask = [1]\n", "policy.always_ask[0] must be a tool name or glob"),
        ('[policy]\nalways_ask = ["ok", ""]\n', "policy.always_ask[1] must be a tool name or glob"),
        (
            '[[profiles]]\nname = "ops"\n[profiles.policy]\nalways_ask = { x = 1 }\n',
            "profiles[ops].policy.always_ask must be a list",
        ),
    ],
)
@pytest.mark.e2e
def test_a_bad_always_ask_stops_the_process_with_one_line_naming_the_key(
    tmp_path: Path, toml: str, key: str
) -> None:
    with pytest.raises(ConfigError, match=r"^[^\n]*$") as raised:
        config_of(tmp_path, toml)
    assert key in str(raised.value)
    done = list_tools(tmp_path, toml)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and key in done.stderr


# --- --list-tools over a real MCP server, and the relay ------------------------------------------


def list_tools(tmp_path: Path, toml: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "harness.toml"
    config.write_text(toml, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "HARNESS_", "SLACK_"))}
    env.update(PYTHONPATH=str(ROOT), HARNESS_CONFIG=str(config), HARNESS_WORKSPACE=str(tmp_path))
    return subprocess.run(
        [sys.executable, "-m", "harness", "--list-tools"], capture_output=True, text=True, env=env, timeout=90
    )


def desk_config(log: Path) -> str:
    return (
        '[tools]\nbuiltin = ["get_time"]\n'
        + stdio_table("desk", log, MCP_ALWAYS_ASK="comment")
        + "trust_annotations = true\n"
        + '[policy]\nalways_ask = ["desk__close_*", "desk__delete_*"]\n'
        + '[policy.tools]\n"desk__*" = "allow"\ndesk__delete_ticket = "deny"\n'
    )


@pytest.mark.e2e
def test_list_tools_says_why_a_tool_always_asks(tmp_path: Path) -> None:
    done = list_tools(tmp_path, desk_config(out(tmp_path, "calls.jsonl")))
    assert done.returncode == 0, done.stderr
    lines = {line.split("\t")[0]: line.split("\t")[1:] for line in done.stdout.splitlines()}
    assert lines["desk__comment"] == ["ask", "MCP _meta anthropic/requiresUserInteraction (server desk)"]
    assert lines["desk__close_ticket"] == ["ask", 'policy.always_ask["desk__close_*"]']
    assert lines["desk__delete_ticket"] == ["deny", "policy.tools.desk__delete_ticket"]  # deny wins
    assert lines["desk__get_ticket"] == ["allow", 'policy.tools."desk__*"']
    assert lines["get_time"][0] == "allow"


def test_the_meta_flag_crosses_the_relay_to_a_work_horses_tools(tmp_path: Path) -> None:
    config = config_of(tmp_path, desk_config(tmp_path / "calls.jsonl"))
    with McpHub(config.resolved_servers({})) as hub:
        relay = RelayServer(hub).start()
        try:
            listing = relay.client().listing()
            flagged = {t.name for t in listing.tools if t.requires_interaction}
            assert flagged == {"comment"}
            catalog = Catalog.from_config(config, host=relay.client())
            comment = catalog.registry().get("desk__comment")
            get_ticket = catalog.registry().get("desk__get_ticket")
            assert comment is not None and comment.always_ask_why == DESK_ASKS
            assert get_ticket is not None and get_ticket.always_ask_why == ""
        finally:
            relay.close()


def test_a_listing_without_the_flag_reads_as_not_asking() -> None:
    data = McpTool("desk", "comment", "", {"type": "object"}, requires_interaction=True).to_json()
    assert McpTool.from_json(data).requires_interaction is True
    del data["requires_interaction"]  # a listing written before the flag existed
    assert McpTool.from_json(data).requires_interaction is False


# --- the card and the batch message --------------------------------------------------------------


def call(why: str, name: str = "write_file", n: int = 1) -> PendingCall:
    path_args = next(t.path_args for t in BUILTIN_TOOLS if t.name == "write_file")
    args = {"path": f"docs/{n}.md", "content": "x"}
    return PendingCall(f"toolu_{n}", name, args, Tier.ASK, why=why, path_args=path_args)


def card_of(why: str) -> dict[str, Any]:
    msg = approval_card(
        CallCard(
            run_id="r1",
            call=call(why),
            requester="UALICE",
            tier_source=why,
            approvers=[],
            expires_at=datetime(2030, 1, 1, tzinfo=UTC),
            grant_minutes=30,
        )
    )
    return {"text": msg.text, "blocks": msg.blocks}


def buttons(card: dict[str, Any]) -> set[str]:
    return {e["action_id"] for b in card["blocks"] if b["type"] == "actions" for e in b["elements"]}


def test_a_card_that_always_asks_offers_no_grant_and_says_why() -> None:
    assert {"approve_thread", "approve_dir"} <= buttons(card_of("policy.default"))
    for why, words in (
        ('policy.always_ask["write_*"]', "lists it in always_ask"),
        (DESK_ASKS, "asks a person to approve every call of this tool"),
    ):
        card = card_of(why)
        assert buttons(card) == {"approve", "decline", "edit", "decline_with_reason"}
        shown = str(card["blocks"])
        assert words in shown and "no grant or *Approve all* covers this tool" in shown


def test_the_batch_message_marks_the_calls_approve_all_leaves_open() -> None:
    msg = batch_card(
        run_id="r1",
        park_id=1,
        calls=[call(DESK_ASKS, "desk__comment", 1), call("policy.default", "write_file", 2)],
        requester="UALICE",
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
    )
    listed = str(msg.blocks[1])
    [comment] = [line for line in listed.split("\\n") if "desk__comment" in line]
    [write] = [line for line in listed.split("\\n") if "write_file" in line]
    assert "approve it on its own card" in comment and "approve it on its own card" not in write


# --- suggested rules -----------------------------------------------------------------------------


def test_suggestions_never_suggest_allowing_a_tool_that_always_asks(tmp_path: Path) -> None:
    plain = config_of(tmp_path, '[tools]\nbuiltin = ["write_file"]\n')
    listed = config_of(tmp_path, '[tools]\nbuiltin = ["write_file"]\n[policy]\nalways_ask = ["write_*"]\n')
    audit = Audit()
    for _ in range(MIN_APPROVALS + 2):
        audit.add("approved", profile="", channel="C1", at=NOW - 60)
    assert [s.tool for s in audit.suggest(plain)] == ["write_file"]  # the same calls, an ordinary tool
    assert audit.suggest(listed) == []  # listed now

    asked_then = Audit()  # it always asked when it was approved (its server said so, say)
    for _ in range(MIN_APPROVALS + 2):
        asked_then.add("approved", profile="", channel="C1", at=NOW - 60, tier_why=DESK_ASKS)
    assert asked_then.suggest(plain) == []


# --- replay --------------------------------------------------------------------------------------


def test_replay_keeps_a_tool_its_server_said_always_asks_at_ask(tmp_path: Path) -> None:
    draft = config_of(tmp_path, desk_config(tmp_path / "calls.jsonl"))
    entry = {"tool": "desk__comment", "source": "mcp:desk", "channel": "C1", "team": "T1", "input": {}}
    before = rule_again(draft, entry, Tier.ALLOW)
    assert (before.would_be, before.why) == (Tier.ALLOW, 'policy.tools."desk__*"')  # not recorded as asking
    asked = rule_again(draft, {**entry, "requires_interaction": True}, Tier.ASK)
    assert (asked.would_be, asked.why, asked.changed) == (Tier.ASK, DESK_ASKS, False)
    listed = rule_again(draft, {**entry, "tool": "desk__close_ticket"}, Tier.ALLOW)
    assert (listed.would_be, listed.why) == (Tier.ASK, 'policy.always_ask["desk__close_*"]')


# --- decided again right before it runs ----------------------------------------------------------


def test_an_approval_a_grant_gave_does_not_run_a_call_that_now_always_asks(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    """The tier is decided again at execution: a grant's approval (recorded while the tool did not
    always ask) leaves the call waiting for a person; a person's own approval runs it."""
    parked = park_on_write(model, agent_with(model, workspace, [], {"write_file": "ask"}))
    strict = agent_with(model, workspace, [], {"write_file": "allow"})
    strict = replace(strict, policy=replace(strict.policy, always_ask=("write_*",)))
    by_grant = record_decisions(parked, {"toolu_w": Decision(Verdict.APPROVED, by="U1", grant=GrantUse.USED)})
    state, outcome = drive(by_grant, strict, lambda e: None)
    assert isinstance(outcome, AwaitingApproval) and not (workspace / "x.txt").exists()
    [waiting] = outcome.calls
    assert waiting.decision is None and always_asks(waiting.why)

    model.script(reply(text("done")))
    state, outcome = drive(approve(state, "toolu_w"), strict, lambda e: None)
    assert isinstance(outcome, Finished) and (workspace / "x.txt").read_text() == "hi"
