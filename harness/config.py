"""The `HARNESS_CONFIG` TOML file: strict, every key optional, finite defaults.

An unknown key, a bad tier name or a wrong type raises `ConfigError` with one line naming the
key; the entry points print it and exit with status 2. Nothing is silently defaulted.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.policy import Policy, Tier

DEFAULT_MODEL = "claude-sonnet-5-5"
_USER_ID = re.compile(r"^[UW][A-Z0-9]{2,}$")


class ConfigError(ValueError):
    """The configuration is unusable; the message is one line that names the key."""


@dataclass(frozen=True)
class Limits:
    """The numeric valves. All finite; `check` lives in `harness.valves`."""

    max_turns: int = 8
    token_budget: int = 40_000
    max_tokens: int = 1024
    no_progress_window: int = 4
    tool_timeout_seconds: float = 30.0
    # How many runs one requester / one channel may have queued, running or parked at once.
    max_runs_per_user: int = 5
    max_runs_per_channel: int = 20


@dataclass(frozen=True)
class Approvals:
    """Who may decide an `ask` call, and for how long a request stays open."""

    approvers: tuple[str, ...] = ()
    expire_after_minutes: float = 1440.0


@dataclass(frozen=True)
class ToolsConfig:
    """The `[tools]` table: what the tools offered may do."""

    # Off by default: .env and .git/config would otherwise be one file-tool call away.
    allow_hidden: bool = False


@dataclass(frozen=True)
class Config:
    """Everything read from `HARNESS_CONFIG` plus the environment's model and workspace."""

    limits: Limits = field(default_factory=Limits)
    policy: Policy = field(default_factory=Policy)
    approvals: Approvals = field(default_factory=Approvals)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    model: str = DEFAULT_MODEL
    workspace: Path = field(default_factory=Path.cwd)


# key -> (python type(s) accepted, validator or None, description of the expected value)
_Spec = tuple[tuple[type, ...], Any, str]
_LIMITS: dict[str, _Spec] = {
    "max_turns": ((int,), lambda v: v >= 0, "a whole number >= 0"),
    "token_budget": ((int,), lambda v: v >= 1, "a whole number >= 1"),
    "max_tokens": ((int,), lambda v: 1 <= v <= 64_000, "a whole number from 1 to 64000"),
    "no_progress_window": ((int,), lambda v: 2 <= v <= 20, "a whole number from 2 to 20"),
    "tool_timeout_seconds": ((int, float), lambda v: 0 < v <= 3600, "a number of seconds > 0"),
    "max_runs_per_user": ((int,), lambda v: v >= 1, "a whole number >= 1"),
    "max_runs_per_channel": ((int,), lambda v: v >= 1, "a whole number >= 1"),
}
_TOOLS: dict[str, _Spec] = {
    "allow_hidden": ((bool,), None, "true or false"),
}
_APPROVALS: dict[str, _Spec] = {
    "approvers": ((list,), None, "a list of Slack user IDs"),
    "expire_after_minutes": ((int, float), lambda v: v > 0, "a number of minutes > 0"),
}


def load_config(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Read the config named by `path` (or `$HARNESS_CONFIG`), plus `HARNESS_MODEL`/`HARNESS_WORKSPACE`."""
    env = os.environ if env is None else env
    path = path if path is not None else env.get("HARNESS_CONFIG") or None
    data: dict[str, Any] = {}
    where = "built-in defaults"
    if path is not None:
        where = str(path)
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{where}: HARNESS_CONFIG names a file that does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read the file: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    return _parse(data, where, env)


def _parse(data: dict[str, Any], where: str, env: Mapping[str, str]) -> Config:
    _only_keys(data, {"limits", "policy", "approvals", "tools"}, "", where)
    limits = Limits(**_section(data, "limits", _LIMITS, where))
    tools = ToolsConfig(**_section(data, "tools", _TOOLS, where))
    approvals_raw = _section(data, "approvals", _APPROVALS, where)
    approvers = approvals_raw.pop("approvers", [])
    for i, user in enumerate(approvers):
        if not isinstance(user, str) or not _USER_ID.match(user):
            raise ConfigError(
                f"{where}: approvals.approvers[{i}] must be a Slack user ID like 'U012AB3CD', got {user!r}"
            )
    approvals = Approvals(approvers=tuple(approvers), **approvals_raw)
    return Config(
        limits=limits,
        policy=_policy(data.get("policy"), where),
        approvals=approvals,
        tools=tools,
        model=env.get("HARNESS_MODEL") or DEFAULT_MODEL,
        workspace=_workspace(env),
    )


def _section(data: dict[str, Any], name: str, spec: dict[str, _Spec], where: str) -> dict[str, Any]:
    raw = data.get(name, {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: [{name}] must be a table")
    _only_keys(raw, set(spec), f"{name}.", where)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        types, valid, expected = spec[key]
        # bool is an int subclass in Python; TOML's true/false is never a number here.
        wrong_bool = isinstance(value, bool) and bool not in types
        if wrong_bool or not isinstance(value, types) or (valid and not valid(value)):
            raise ConfigError(f"{where}: {name}.{key} must be {expected}, got {value!r}")
        out[key] = float(value) if float in types else value  # type: ignore[arg-type]
    return out


def _policy(raw: Any, where: str) -> Policy:
    if raw is None:
        return Policy()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: [policy] must be a table")
    _only_keys(raw, {"default", "tools"}, "policy.", where)
    default = _tier(raw.get("default", Tier.ASK.value), "policy.default", where)
    tools_raw = raw.get("tools", {})
    if not isinstance(tools_raw, dict):
        raise ConfigError(f'{where}: [policy.tools] must be a table of tool = "tier"')
    tools = {name: _tier(value, f"policy.tools.{name}", where) for name, value in tools_raw.items()}
    return Policy(default=default, tools=tools)


def _tier(value: Any, key: str, where: str) -> Tier:
    try:
        return Tier(value)
    except ValueError:
        raise ConfigError(f'{where}: {key} must be one of "allow", "ask", "deny", got {value!r}') from None


def _only_keys(raw: dict[str, Any], allowed: set[str], prefix: str, where: str) -> None:
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {prefix}{key} (allowed: {', '.join(sorted(allowed))})")


def _workspace(env: Mapping[str, str]) -> Path:
    raw = env.get("HARNESS_WORKSPACE")
    workspace = Path(raw) if raw else Path.cwd()
    if not workspace.is_dir():
        raise ConfigError(f"HARNESS_WORKSPACE: {workspace} is not a directory")
    return workspace.resolve()
