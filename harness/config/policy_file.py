"""The `[policy]` table of the config file (and a profile's), read strictly: its default tier,
its tools' tiers, its ordered `[[policy.rules]]` and `always_ask`. A bad tier or an unknown key
raises `ConfigError` with one line naming the key."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from harness.config.settings import ConfigError
from harness.counting import ARG_NAME, SCOPES, Window, parse_duration
from harness.flows import Flows
from harness.policy import Policy, Rule, Tier

POLICY_KEYS = {"default", "tools", "rules", "always_ask", "flows"}
FLOWS_KEYS = {"untrusted_output", "sends_out"}
RULE_KEYS = {"tool", "args", "tier", "max_calls", "max_sum", "per", "scope"}
COUNTING_KEYS = ("max_calls", "max_sum", "per", "scope")


def policy_of(raw: Any, where: str, prefix: str = "policy") -> Policy:
    if raw is None:
        return Policy()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: [{prefix}] must be a table")
    only_keys(raw, POLICY_KEYS, f"{prefix}.", where)
    default = _tier(raw.get("default", Tier.ASK.value), f"{prefix}.default", where)
    tools_raw = raw.get("tools", {})
    if not isinstance(tools_raw, dict):
        raise ConfigError(f'{where}: [{prefix}.tools] must be a table of tool = "tier"')
    tools = {name: _tier(value, f"{prefix}.tools.{name}", where) for name, value in tools_raw.items()}
    rules_raw = raw.get("rules", [])
    if not isinstance(rules_raw, list) or not all(isinstance(r, dict) for r in rules_raw):
        raise ConfigError(f"{where}: {prefix}.rules must be an array of tables ([[{prefix}.rules]])")
    rules = tuple(_rule(i + 1, r, where, f"{prefix}.rules") for i, r in enumerate(rules_raw))
    always_ask = _always_ask(raw.get("always_ask", []), f"{prefix}.always_ask", where)
    flows = _flows(raw.get("flows", {}), f"{prefix}.flows", where)
    if prefix == "policy":  # a profile's lists are checked with the top level's (`_merged`)
        check_flows(flows, "policy.flows", where)
    return Policy(default=default, tools=tools, rules=rules, always_ask=always_ask, flows=flows)


def _flows(raw: Any, key: str, where: str) -> Flows:
    """`[policy.flows]`: `untrusted_output` and `sends_out`, lists of tool names or globs."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: [{key}] must be a table of untrusted_output and sends_out")
    only_keys(raw, FLOWS_KEYS, f"{key}.", where)
    untrusted = _always_ask(raw.get("untrusted_output", []), f"{key}.untrusted_output", where)
    sends = _always_ask(raw.get("sends_out", []), f"{key}.sends_out", where)
    return Flows(untrusted_output=untrusted, sends_out=sends)


def check_flows(flows: Flows, key: str, where: str) -> Flows:
    """`flows` as a policy holds them (a profile's with the top level's): one list without the other
    would guard nothing, so it is refused."""
    if bool(flows.untrusted_output) != bool(flows.sends_out):
        given, missing = (
            ("untrusted_output", "sends_out") if flows.untrusted_output else ("sends_out", "untrusted_output")
        )
        raise ConfigError(f"{where}: {key}.{given} is given without {key}.{missing}: a flow needs both")
    return flows


def _always_ask(raw: Any, key: str, where: str) -> tuple[str, ...]:
    """`[policy] always_ask` (and each list of `[policy.flows]`): tool names or globs, as in
    `[policy.tools]`."""
    if not isinstance(raw, list):
        raise ConfigError(
            f'{where}: {key} must be a list of tool names or globs, like ["deploy_*"], got {raw!r}'
        )
    for i, value in enumerate(raw):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: {key}[{i}] must be a tool name or glob, got {value!r}")
    return tuple(dict.fromkeys(raw))


def _rule(number: int, raw: dict[str, Any], where: str, table: str = "policy.rules") -> Rule:
    key = f"{table}[{number}]"
    only_keys(raw, RULE_KEYS, f"{key}.", where)
    for needed in ("tool", "tier"):
        if needed not in raw:
            raise ConfigError(f"{where}: {key}.{needed} is missing")
    tool = raw["tool"]
    if not isinstance(tool, str) or not tool:
        raise ConfigError(f"{where}: {key}.tool must be a tool name or glob, got {tool!r}")
    args = raw.get("args", {})
    if not isinstance(args, dict):
        raise ConfigError(f'{where}: {key}.args must be a table of argument = "glob"')
    for arg, pattern in args.items():
        if not isinstance(pattern, str):
            raise ConfigError(f"{where}: {key}.args.{arg} must be a glob string, got {pattern!r}")
    tier = _tier(raw["tier"], f"{key}.tier", where)
    window = _window(raw, key, where)
    if window is not None and tier is Tier.ALLOW:
        raise ConfigError(
            f'{where}: {key}.tier must be "ask" or "deny" in a rule with a limit (it applies past the '
            'limit; "allow" would lift nothing)'
        )
    rule = Rule(number=number, tool=tool, args=dict(args), tier=tier, window=window)
    return rule if table == "policy.rules" else replace(rule, table=table)


def _window(raw: dict[str, Any], key: str, where: str) -> Window | None:
    """A rule's limit (`max_calls`, or `max_sum = { argument = limit }`, `per` a duration, within
    `scope`); None for a rule without one (then none of those keys may be given)."""
    given = [k for k in COUNTING_KEYS if k in raw]
    if not given:
        return None
    if "max_calls" not in raw and "max_sum" not in raw:
        raise ConfigError(f"{where}: {key}.{given[0]} needs max_calls or max_sum in the same rule")
    if "max_calls" in raw and "max_sum" in raw:
        raise ConfigError(f"{where}: {key} has both max_calls and max_sum: give one per rule")
    for needed in ("per", "scope"):
        if needed not in raw:
            raise ConfigError(f"{where}: {key}.{needed} is missing (a rule with a limit needs per and scope)")
    try:
        parse_duration(raw["per"])
    except ValueError:
        raise ConfigError(
            f'{where}: {key}.per must be a duration like "30s", "15m", "1h" or "1d" (at most "31d"), '
            f"got {raw['per']!r}"
        ) from None
    if raw["scope"] not in SCOPES:
        raise ConfigError(f"{where}: {key}.scope must be one of {', '.join(SCOPES)}, got {raw['scope']!r}")
    if "max_calls" in raw:
        calls = raw["max_calls"]
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
            raise ConfigError(f"{where}: {key}.max_calls must be a whole number >= 1, got {calls!r}")
        return Window(per=raw["per"], scope=raw["scope"], max_calls=calls)
    table = raw["max_sum"]
    if not isinstance(table, dict) or len(table) != 1:
        raise ConfigError(
            f"{where}: {key}.max_sum must be a table of one argument and its limit, like "
            f"{{ amount = 500 }}, got {table!r}"
        )
    ((arg, limit),) = table.items()
    if not ARG_NAME.fullmatch(arg):
        raise ConfigError(f"{where}: {key}.max_sum names {arg!r}, which is no top-level argument's name")
    number = isinstance(limit, int | float) and not isinstance(limit, bool)
    if not number or not math.isfinite(limit) or limit <= 0:
        raise ConfigError(f"{where}: {key}.max_sum.{arg} must be a number > 0, got {limit!r}")
    return Window(per=raw["per"], scope=raw["scope"], sum_arg=arg, max_sum=float(limit))


def _tier(value: Any, key: str, where: str) -> Tier:
    try:
        return Tier(value)
    except ValueError:
        raise ConfigError(f'{where}: {key} must be one of "allow", "ask", "deny", got {value!r}') from None


def only_keys(raw: dict[str, Any], allowed: set[str], prefix: str, where: str) -> None:
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {prefix}{key} (allowed: {', '.join(sorted(allowed))})")
