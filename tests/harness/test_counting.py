"""Rules with memory: a `[[policy.rules]]` table with `max_calls` or `max_sum`, `per` and `scope`
speaks only past its limit; the config refuses a bad one in one line naming the key; the loop
counts a call as it is let run, so a reply's fifth deploy waits for a person with a why that says
how many ran."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.config import ConfigError, load_config
from harness.config.policy_file import policy_of
from harness.counting import MemoryMeter, Seen, Window, parse_duration
from harness.loop import Agent, AwaitingApproval, Finished, drive, step
from harness.policy import Policy, Rule, Tier, limit_asks, read_why
from harness.state import Decision, RunState, Verdict, new_run, record_decisions
from harness.tools import BUILTIN_TOOLS, Tool, ToolRegistry
from messages.reasons import plain_why
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use

DEPLOY_RULE = {"tool": "deploy_*", "tier": "ask", "max_calls": 3, "per": "1h", "scope": "channel"}
REFUND_RULE = {
    "tool": "refund",
    "tier": "ask",
    "max_sum": {"amount": 500},
    "per": "1d",
    "scope": "requester",
}


def policy(*rules: dict[str, Any], tools: dict[str, str] | None = None) -> Policy:
    return policy_of({"rules": list(rules), "tools": tools or {}}, "test.toml")


# --- the config ---------------------------------------------------------------------------------


def test_a_counting_rule_is_read_with_its_window() -> None:
    calls, summed = policy(DEPLOY_RULE, REFUND_RULE).rules
    assert calls.window == Window(per="1h", scope="channel", max_calls=3)
    assert summed.window == Window(per="1d", scope="requester", sum_arg="amount", max_sum=500.0)
    assert (calls.window.seconds, summed.window.seconds) == (3600, 86400)
    assert policy({"tool": "x", "tier": "ask"}).rules[0].window is None


@pytest.mark.parametrize(
    ("value", "seconds"), [("30s", 30), ("15m", 900), ("1h", 3600), ("1d", 86400), ("31d", 31 * 86400)]
)
def test_a_duration_is_a_whole_number_and_a_unit(value: str, seconds: int) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"per": "1 hour"}, 'policy.rules[1].per must be a duration like "30s"'),
        ({"per": "0h"}, "policy.rules[1].per must be a duration"),
        ({"per": "32d"}, 'at most "31d"'),
        ({"per": 3600}, "policy.rules[1].per must be a duration"),
        ({"per": "1H"}, "policy.rules[1].per must be a duration"),
        (
            {"scope": "team"},
            "policy.rules[1].scope must be one of run, thread, channel, requester, workspace",
        ),
        ({"max_calls": 0}, "policy.rules[1].max_calls must be a whole number >= 1, got 0"),
        ({"max_calls": True}, "policy.rules[1].max_calls must be a whole number >= 1"),
        ({"max_calls": 2.5}, "policy.rules[1].max_calls must be a whole number >= 1"),
        ({"max_sum": 10}, "has both max_calls and max_sum"),
        ({"sum_arg": "amount"}, "unknown key policy.rules[1].sum_arg"),
        ({"tier": "allow"}, 'policy.rules[1].tier must be "ask" or "deny" in a rule with a limit'),
    ],
)
def test_a_bad_counting_rule_is_refused_naming_its_key(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        policy({**DEPLOY_RULE, **change})
    assert message in str(raised.value)
    assert str(raised.value).startswith("test.toml: ")


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (
            {"tool": "x", "tier": "ask", "per": "1h", "scope": "run"},
            "policy.rules[1].per needs max_calls or max_sum",
        ),
        ({"tool": "x", "tier": "ask", "max_calls": 3, "scope": "run"}, "policy.rules[1].per is missing"),
        ({"tool": "x", "tier": "ask", "max_calls": 3, "per": "1h"}, "policy.rules[1].scope is missing"),
        ({**REFUND_RULE, "max_sum": 500}, "policy.rules[1].max_sum must be a table of one argument"),
        ({**REFUND_RULE, "max_sum": {}}, "policy.rules[1].max_sum must be a table of one argument"),
        ({**REFUND_RULE, "max_sum": {"a": 1, "b": 2}}, "policy.rules[1].max_sum must be a table of one"),
        (
            {**REFUND_RULE, "max_sum": {"amount": -5}},
            "policy.rules[1].max_sum.amount must be a number > 0, got -5",
        ),
        (
            {**REFUND_RULE, "max_sum": {"amount": float("inf")}},
            "policy.rules[1].max_sum.amount must be a number > 0",
        ),
        ({**REFUND_RULE, "max_sum": {"amount": True}}, "policy.rules[1].max_sum.amount must be a number > 0"),
        (
            {**REFUND_RULE, "max_sum": {"a b": 5}},
            "policy.rules[1].max_sum names 'a b', which is no top-level",
        ),
    ],
)
def test_an_incomplete_counting_rule_is_refused(rule: dict[str, Any], message: str) -> None:
    rule = {k: v for k, v in rule.items() if v is not None}
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        policy(rule)


def test_a_profile_counts_with_its_own_rules_first(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[[policy.rules]]\ntool = "deploy_*"\ntier = "ask"\nmax_calls = 3\nper = "1h"\nscope = "channel"\n'
        '[[profiles]]\nname = "ops"\nchannels = ["C0OPS"]\n'
        '[[profiles.policy.rules]]\ntool = "deploy_*"\ntier = "deny"\nmax_calls = 10\n'
        'per = "1d"\nscope = "workspace"\n'
    )
    settings = load_config(path).match("C0OPS", "T1").settings
    own, top = settings.policy.rules
    assert (own.key, own.window and own.window.scope) == ("profiles[ops].policy.rules[1]", "workspace")
    assert (top.key, top.window and top.window.max_calls) == ("policy.rules[1]", 3)
    path.write_text(
        '[[profiles]]\nname = "ops"\n[[profiles.policy.rules]]\ntool = "x"\ntier = "ask"\nmax_calls = 1\n'
    )
    with pytest.raises(ConfigError, match=r"profiles\[ops\]\.policy\.rules\[1\]\.per is missing"):
        load_config(path)


# --- the decision -------------------------------------------------------------------------------


def seen_for(p: Policy, name: str, args: dict[str, Any], total: float) -> dict[str, Seen]:
    return {r.key: Seen(total) for r in p.counting_rules(name, args)}


def test_within_its_limit_a_counting_rule_is_passed_over() -> None:
    p = policy(DEPLOY_RULE, {"tool": "deploy_web", "tier": "allow"}, tools={"deploy_*": "ask"})
    ruling = p.decide("deploy_web", {}, seen=seen_for(p, "deploy_web", {}, 2))
    assert (ruling.tier, ruling.why) == (Tier.ALLOW, 'policy.rules[2] (tool = "deploy_web")')
    only = policy(DEPLOY_RULE, tools={"deploy_*": "allow"})
    assert only.decide("deploy_db", {}, seen=seen_for(only, "deploy_db", {}, 0)).tier is Tier.ALLOW


def test_past_its_limit_a_counting_rule_gives_its_tier_and_says_how_many_ran() -> None:
    p = policy(DEPLOY_RULE, tools={"deploy_*": "allow"})
    ruling = p.decide("deploy_web", {}, seen=seen_for(p, "deploy_web", {}, 3))
    assert ruling.tier is Tier.ASK
    assert ruling.why == 'policy.rules[1] (tool = "deploy_*"): max_calls = 3 per 1h by channel, 3 ran'
    source = read_why(ruling.why)
    assert (source.step, source.number, source.tool) == ("limit", 1, "deploy_*")
    assert source.limit is not None and (source.limit.seen, source.limit.limit) == ("3", "3")
    assert limit_asks(ruling.why) and not limit_asks('policy.rules[1] (tool = "deploy_*")')
    assert plain_why(ruling.why) == (
        "rule 1 of the policy: 3 of at most 3 calls of `deploy_*` ran in the last hour in this channel"
    )


def test_a_deny_past_its_limit_wins_over_an_earlier_ask() -> None:
    p = policy({"tool": "deploy_*", "tier": "ask"}, {**DEPLOY_RULE, "tier": "deny", "max_calls": 5})
    assert p.decide("deploy_x", {}, seen=seen_for(p, "deploy_x", {}, 4)).tier is Tier.ASK
    denied = p.decide("deploy_x", {}, seen=seen_for(p, "deploy_x", {}, 5))
    assert denied.tier is Tier.DENY and denied.why.startswith("policy.rules[2]")


def test_a_sum_counts_what_this_call_adds() -> None:
    p = policy(REFUND_RULE, tools={"refund": "allow"})
    assert p.decide("refund", {"amount": 50}, seen=seen_for(p, "refund", {}, 450)).tier is Tier.ALLOW
    past = p.decide("refund", {"amount": 80}, seen=seen_for(p, "refund", {}, 450))
    assert past.tier is Tier.ASK
    assert past.why.endswith("max_sum = 500 of amount per 1d by requester, 450 ran, this call adds 80")
    assert plain_why(past.why) == (
        "rule 1 of the policy: calls of `refund` add up `amount` to 450 of at most 500 in the last day "
        "for this requester, and this call adds 80"
    )
    alone = p.decide("refund", {"amount": 501}, seen=seen_for(p, "refund", {}, 0))
    assert alone.tier is Tier.ASK


@pytest.mark.parametrize("amount", [None, "80", True, -1, float("nan"), [80]])
def test_a_sum_whose_argument_is_not_a_number_asks_and_says_why(amount: Any) -> None:
    p = policy(REFUND_RULE, tools={"refund": "allow"})
    args = {} if amount is None else {"amount": amount}
    ruling = p.decide("refund", args, seen=seen_for(p, "refund", args, 0))
    assert ruling.tier is Tier.ASK
    assert ruling.why.endswith("this call's amount is missing or not a number")
    assert "`amount` is missing or not a number" in plain_why(ruling.why)


def test_a_window_not_read_counts_as_past_its_limit() -> None:
    p = policy(DEPLOY_RULE, tools={"deploy_*": "allow"})
    ruling = p.decide("deploy_web", {}, seen={})
    assert ruling.tier is Tier.ASK and ruling.why.endswith("its counter could not be read")
    # No counter consulted at all (--list-tools): the rule is passed over.
    assert p.decide("deploy_web", {}).tier is Tier.ALLOW


def test_a_rule_counts_the_same_calls_whatever_its_number_limit_or_tier() -> None:
    a = policy(DEPLOY_RULE).rules[0]
    b = policy(
        {"tool": "x", "tier": "ask"}, {**DEPLOY_RULE, "max_calls": 9, "tier": "deny", "per": "1d"}
    ).rules[1]
    assert a.counter_id == b.counter_id
    other = policy({**DEPLOY_RULE, "args": {"env": "prod"}}).rules[0]
    assert other.counter_id != a.counter_id


# --- the loop -----------------------------------------------------------------------------------


def deploy_tool(ran: list[dict[str, Any]]) -> Tool:
    def call(_ctx: Any, args: dict[str, Any]) -> str:
        ran.append(args)
        return "deployed"

    schema = {"type": "object", "properties": {"service": {"type": "string"}}}
    return Tool(name="deploy_web", description="deploy", input_schema=schema, call=call)


def deploying_agent(model: FakeMessagesAPI, workspace: Path, ran: list[dict[str, Any]], **kw: Any) -> Agent:
    agent = make_agent(model, workspace)
    tools = ToolRegistry([*BUILTIN_TOOLS, deploy_tool(ran)], timeout_seconds=5.0)
    return replace(agent, tools=tools, policy=policy(DEPLOY_RULE, tools={"deploy_*": "allow"}), **kw)


def five_deploys(model: FakeMessagesAPI) -> None:
    calls = [tool_use("deploy_web", {"service": f"s{i}"}, id=f"toolu_{i}") for i in range(5)]
    model.script(reply(*calls), reply(text("done")))


def test_the_fourth_deploy_of_a_reply_waits_for_a_person_and_says_why(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    ran: list[dict[str, Any]] = []
    agent = deploying_agent(model, workspace, ran, meter=MemoryMeter())
    five_deploys(model)
    parked, outcome = drive(new_run("deploy all"), agent, lambda e: None)

    assert isinstance(outcome, AwaitingApproval)
    assert [a["service"] for a in ran] == ["s0", "s1", "s2"]
    (waiting,) = outcome.calls
    assert waiting.id == "toolu_3" and waiting.tier is Tier.ASK
    assert (
        "max_calls = 3 per 1h by channel, 3 ran (decided again right before running; it was allow)"
        in waiting.why
    )

    # A person says yes: it runs, and is counted; the fifth is then asked about too.
    approved = record_decisions(parked, {"toolu_3": Decision(Verdict.APPROVED, by="U1")})
    resumed, outcome = drive(approved, agent, lambda e: None)
    assert [a["service"] for a in ran] == ["s0", "s1", "s2", "s3"]
    assert isinstance(outcome, AwaitingApproval) and [c.id for c in outcome.calls] == ["toolu_4"]
    assert limit_asks(outcome.calls[0].why)  # ruled again at the resume: past the limit already
    declined = record_decisions(resumed, {"toolu_4": Decision(Verdict.DECLINED, by="U1")})
    _, outcome = drive(declined, agent, lambda e: None)
    assert isinstance(outcome, Finished) and len(ran) == 4


def test_without_a_meter_a_counted_tool_asks(model: FakeMessagesAPI, workspace: Path) -> None:
    ran: list[dict[str, Any]] = []
    agent = deploying_agent(model, workspace, ran)  # no meter: no window can be read
    five_deploys(model)
    _, outcome = drive(new_run("deploy all"), agent, lambda e: None)
    assert isinstance(outcome, AwaitingApproval) and len(outcome.calls) == 5 and ran == []
    assert all(c.why.endswith("its counter could not be read") for c in outcome.calls)


def test_a_stop_before_a_counted_call_starts_gives_its_place_back(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    ran: list[dict[str, Any]] = []
    meter = MemoryMeter()
    stops: list[bool] = []

    def before_tool(_state: RunState, _call: Any) -> None:
        stops.append(True)

    agent = deploying_agent(model, workspace, ran, meter=meter, before_tool=before_tool)
    agent = replace(agent, stop_check=lambda: _stop() if stops else None)
    model.script(reply(tool_use("deploy_web", {"service": "s"}, id="toolu_a")), reply(text("done")))
    state = step(new_run("deploy"), agent).state
    state = step(state, agent).state
    assert ran == [] and stops == [True]
    rule = agent.policy.rules[0]
    assert meter.seen(rule, "other").total == 0


def _stop() -> Any:
    from harness.valves import Stop, Valve

    return Stop(Valve.STOPPED_BY_USER, "stopped")


def test_a_window_slides(workspace: Path) -> None:
    now = [1000.0]
    meter = MemoryMeter(clock=lambda: now[0])
    rule: Rule = policy(DEPLOY_RULE).rules[0]
    from harness.counting import Count

    for i in range(3):
        assert meter.take(f"c{i}", [Count(rule, 1.0)]) is None
    over = meter.take("c3", [Count(rule, 1.0)])
    assert over is not None and over[1].total == 3
    assert meter.take("c0", [Count(rule, 1.0)]) is None  # counted already: not again
    assert meter.take("c3", [Count(rule, 1.0, forced=True)]) is None  # a person said yes
    now[0] += 3600
    assert meter.seen(rule, "c9").total == 0


def test_list_tools_says_a_counting_rule_may_decide(tmp_path: Path) -> None:
    from harness.cli import list_tools
    from harness.tools.catalog import Catalog

    path = tmp_path / "c.toml"
    path.write_text(
        '[tools]\nbuiltin = ["get_time"]\n[[policy.rules]]\ntool = "get_time"\ntier = "ask"\n'
        'max_calls = 5\nper = "1m"\nscope = "run"\n'
    )
    config = load_config(path)
    import io

    out = io.StringIO()
    list_tools(Catalog.from_config(config), config.policy, out)
    assert out.getvalue().splitlines()[0] == (
        "get_time\tallow\ttool's own tier (built-in); policy.rules[1] may decide a call past a limit "
        "(what already ran)"
    )
