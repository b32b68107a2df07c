"""The `[policy]` table of the config file (and a profile's), read strictly: its default tier,
its tools' tiers, its ordered `[[policy.rules]]` and `always_ask`. A bad tier or an unknown key
raises `ConfigError` with one line naming the key."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from harness.config.settings import ConfigError
from harness.policy import Policy, Rule, Tier

POLICY_KEYS = {"default", "tools", "rules", "always_ask"}
RULE_KEYS = {"tool", "args", "tier"}


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
    return Policy(default=default, tools=tools, rules=rules, always_ask=always_ask)


def _always_ask(raw: Any, key: str, where: str) -> tuple[str, ...]:
    """`[policy] always_ask`: tool names or globs, as in `[policy.tools]`."""
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
    rule = Rule(number=number, tool=tool, args=dict(args), tier=_tier(raw["tier"], f"{key}.tier", where))
    return rule if table == "policy.rules" else replace(rule, table=table)


def _tier(value: Any, key: str, where: str) -> Tier:
    try:
        return Tier(value)
    except ValueError:
        raise ConfigError(f'{where}: {key} must be one of "allow", "ask", "deny", got {value!r}') from None


def only_keys(raw: dict[str, Any], allowed: set[str], prefix: str, where: str) -> None:
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {prefix}{key} (allowed: {', '.join(sorted(allowed))})")
