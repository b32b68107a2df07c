"""The `HARNESS_CONFIG` TOML file, read strictly: every key optional, finite defaults.

An unknown key, a bad tier name or a wrong type raises `ConfigError` with one line naming the
key; the entry points print it and exit with status 2. Nothing is silently defaulted. A
`[[profiles]]` table lays its keys over the top level's, key by key (`_merged`).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.config.policy_file import FLOWS_KEYS, POLICY_KEYS, RULE_KEYS, check_flows, only_keys, policy_of
from harness.config.settings import (
    BUILTIN_TOOL_NAMES,
    DEFAULT_MODEL,
    IM_CHANNELS,
    ON_LIMIT_CHOICES,
    VARIABLE,
    Approvals,
    Budgets,
    Config,
    ConfigError,
    Limits,
    McpServerConfig,
    ModelConfig,
    Profile,
    ToolsConfig,
)
from harness.flows import Flows
from harness.policy import Policy

# An approver is a user (U…, W…) or a user group (S…), which stands for its members.
_APPROVER_ID = re.compile(r"[UWS][A-Z0-9]{2,}")
_SERVER_NAME = re.compile(r"[a-z0-9-]{1,32}")
# A host a stdio server may reach with `network = [...]`: a name, or a name under a `*.` glob.
_HOST_GLOB = re.compile(
    r"(?:\*\.)?(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
)
_PROFILE_NAME = _SERVER_NAME
_CHANNEL_ID = re.compile(r"[CGD][A-Z0-9]{1,}")
_TEAM_ID = re.compile(r"[TE][A-Z0-9]{1,}")
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_CALLABLE_REF = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")

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
    "max_input_tokens": ((int,), lambda v: 1_000 <= v <= 2_000_000, "a whole number from 1000 to 2000000"),
    "on_limit": ((str,), lambda v: v in ON_LIMIT_CHOICES, '"stop" or "ask"'),
    "defer_tools_over_tokens": ((int,), lambda v: v >= 0, "a whole number >= 0 (0: never by size)"),
}
_TOOLS: dict[str, _Spec] = {
    "builtin": ((list,), None, "a list of built-in tool names"),
    "modules": ((list,), None, "a list of importable module names"),
    "allow_hidden": ((bool,), None, "true or false"),
}
_MODEL: dict[str, _Spec] = {
    "name": ((str,), lambda v: bool(v.strip()), "a model id"),
    "system": ((str,), lambda v: bool(v.strip()), "a non-empty system prompt"),
    "system_file": ((str,), lambda v: bool(v.strip()), "a path to a text file"),
    "thinking_budget": ((int,), lambda v: v == 0 or v >= 1024, "0 (off) or a whole number >= 1024"),
}
_SERVER: dict[str, _Spec] = {
    "name": ((str,), lambda v: bool(_SERVER_NAME.fullmatch(v)), "1-32 characters of a-z, 0-9, -"),
    "command": ((str,), lambda v: bool(v.strip()), "a command to run"),
    "args": ((list,), lambda v: all(isinstance(a, str) for a in v), "a list of strings"),
    "env": ((dict,), lambda v: all(isinstance(a, str) for a in v.values()), "a table of strings"),
    "cwd": ((str,), lambda v: bool(v.strip()), "a directory"),
    "url": ((str,), lambda v: v.startswith(("http://", "https://")), "an http:// or https:// URL"),
    "headers": ((dict,), lambda v: all(isinstance(a, str) for a in v.values()), "a table of strings"),
    "timeout_seconds": ((int, float), lambda v: 0 < v <= 3600, "a number of seconds > 0"),
    "trust_annotations": ((bool,), None, "true or false"),
    "pin_tools": ((bool,), None, "true or false"),
    "writable": (
        (list,),
        lambda v: all(isinstance(a, str) and a.strip() for a in v),
        "a list of directories",
    ),
    "network": (
        (bool, list),
        lambda v: isinstance(v, bool) or all(isinstance(a, str) and _HOST_GLOB.fullmatch(a) for a in v),
        'true, false, or a list of host names (globs: "*.example.com")',
    ),
    "path_arguments": ((dict,), None, 'a table of tool = ["argument", …]'),
    # Checked one by one in `_tool_globs`, so that the line names the bad entry.
    "include_tools": ((list,), None, 'a list of the server\'s tool names or globs, like ["read_*"]'),
    "exclude_tools": ((list,), None, 'a list of the server\'s tool names or globs, like ["write_*"]'),
    "defer_loading": ((bool,), None, "true or false"),
}
_APPROVALS: dict[str, _Spec] = {
    "approvers": ((list,), None, "a list of Slack user or user group IDs"),
    "self_approval": ((bool,), None, "true or false"),
    "required": ((int,), lambda v: v >= 1, "a whole number >= 1"),
    "expire_after_minutes": ((int, float), lambda v: v > 0, "a number of minutes > 0"),
    "escalate_after_minutes": ((int, float), lambda v: v >= 0, "a number of minutes >= 0"),
    "escalate_to": ((list,), None, "a list of Slack user or user group IDs"),
    "grant_minutes": ((int, float), lambda v: v >= 0, "a number of minutes >= 0"),
    "grant_uses": ((int,), lambda v: v >= 0, "a whole number >= 0 (0: no limit)"),
    "remind_before_minutes": ((int, float), lambda v: v >= 0, "a number of minutes >= 0"),
    "max_extensions": ((int,), lambda v: v >= 0, "a whole number >= 0"),
    "approvers_from": ((str,), None, '"module:function" (or "": none)'),
    "approvers_from_tools": ((dict,), None, 'a table of tool name or glob = "module:function"'),
    # Asked before Slack gets its answer (3 s), after the clicker's groups may have been read.
    "approvers_from_timeout_seconds": (
        (int, float),
        lambda v: 0 < v <= 2.5,
        "a number of seconds > 0, at most 2.5",
    ),
}
_BUDGETS: dict[str, _Spec] = {
    "per_user_daily_tokens": ((int,), lambda v: v >= 0, "a whole number >= 0 (0: no budget)"),
    "per_channel_daily_tokens": ((int,), lambda v: v >= 0, "a whole number >= 0 (0: no budget)"),
}
_PROFILE: dict[str, _Spec] = {
    "name": ((str,), lambda v: bool(_PROFILE_NAME.fullmatch(v)), "1-32 characters of a-z, 0-9, -"),
    "channels": ((list,), None, 'a list of channel IDs (C…, G…, D…) or "im"'),
    "teams": ((list,), None, "a list of workspace IDs (T…)"),
    "requesters": ((list,), None, "a list of Slack user or user group IDs"),
    "tools": ((dict,), None, "a table ([profiles.tools])"),
    "policy": ((dict,), None, "a table ([profiles.policy])"),
    "approvals": ((dict,), None, "a table ([profiles.approvals])"),
    "model": ((dict,), None, "a table ([profiles.model])"),
    "limits": ((dict,), None, "a table ([profiles.limits])"),
    "budgets": ((dict,), None, "a table ([profiles.budgets])"),
}
_PROFILE_TOOLS: dict[str, _Spec] = {
    **_TOOLS,
    "mcp": ((list,), lambda v: all(isinstance(a, str) for a in v), "a list of [[mcp.servers]] names"),
}
# The tables whose keys are checked by name rather than by a spec (their values are parsed by hand).
_SECTIONS = {"model", "limits", "policy", "approvals", "tools", "mcp", "budgets", "profiles"}
_MCP_KEYS = {"servers"}


def accepted_keys() -> frozenset[str]:
    """Every key the file accepts, dotted: `limits.max_turns`, `mcp.servers.name`, `policy.rules.tier`.

    Built from the very tables the parser checks keys against, so docs/configuration.md can be
    tested against it. A profile's tables (`profiles.limits`, …) take the top level's keys and are one
    key each. A table whose keys are the user's own (`policy.tools`, `policy.rules.args`,
    `mcp.servers.env`, `mcp.servers.headers`) is one key; an array of tables is named without an index.
    """
    tables: dict[str, Collection[str]] = {
        "model": _MODEL,
        "limits": _LIMITS,
        "tools": _TOOLS,
        "approvals": _APPROVALS,
        "policy": POLICY_KEYS,
        "policy.rules": RULE_KEYS,
        "policy.flows": FLOWS_KEYS,
        "mcp": _MCP_KEYS,
        "mcp.servers": _SERVER,
        "budgets": _BUDGETS,
        # A profile's tables take the top level's keys (each is one row: "as the top level's"),
        # and its tools table one more.
        "profiles": _PROFILE,
        "profiles.tools": set(_PROFILE_TOOLS) - set(_TOOLS),
    }
    return frozenset(f"{table}.{key}" for table, keys in tables.items() for key in keys)


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
    return _parse(data, where, env, Path(path).resolve().parent if path is not None else None)


def _parse(data: dict[str, Any], where: str, env: Mapping[str, str], base: Path | None = None) -> Config:
    only_keys(data, _SECTIONS, "", where)
    top = _settings(data, where, env, base)
    profiles = _profiles(data, where, env, base, top)
    return replace(top, profiles=profiles) if profiles else top


def _settings(
    data: dict[str, Any],
    where: str,
    env: Mapping[str, str],
    base: Path | None,
    policy: Policy | None = None,
    own_model: bool = False,
) -> Config:
    """The settings of one level (the top, or a profile merged over it): every table but profiles.

    `HARNESS_MODEL` wins over the top level's `model.name`; a profile that names its own model
    (`own_model`) keeps it: the more specific choice.
    """
    limits = Limits(**_section(data, "limits", _LIMITS, where))
    tools = _tools(_section(data, "tools", _TOOLS, where), where)
    model_raw = _section(data, "model", _MODEL, where)
    model_settings = _model(model_raw, where, base)
    if model_settings.thinking_budget and model_settings.thinking_budget >= limits.max_tokens:
        raise ConfigError(
            f"{where}: model.thinking_budget ({model_settings.thinking_budget}) must be less than "
            f"limits.max_tokens ({limits.max_tokens}): the API counts thinking inside max_tokens"
        )
    approvals = _approvals(_section(data, "approvals", _APPROVALS, where), where)
    return Config(
        limits=limits,
        policy=policy if policy is not None else policy_of(data.get("policy"), where),
        approvals=approvals,
        tools=tools,
        model=model_raw["name"]
        if own_model
        else env.get("HARNESS_MODEL") or model_raw.get("name") or DEFAULT_MODEL,
        workspace=_workspace(env),
        model_settings=model_settings,
        mcp_servers=_mcp(data.get("mcp"), where, tools),
        budgets=Budgets(**_section(data, "budgets", _BUDGETS, where)),
    )


def _profiles(
    data: dict[str, Any], where: str, env: Mapping[str, str], base: Path | None, top: Config
) -> tuple[Profile, ...]:
    """The `[[profiles]]`, each with the top level's settings and its own keys over them."""
    raw = data.get("profiles", [])
    if not isinstance(raw, list) or not all(isinstance(p, dict) for p in raw):
        raise ConfigError(f"{where}: profiles must be an array of tables ([[profiles]])")
    servers = {s.name for s in top.mcp_servers}
    profiles: list[Profile] = []
    owner: dict[str, str] = {}  # channel -> the profile that lists it
    for i, table in enumerate(raw):
        if "name" not in table:
            raise ConfigError(f"{where}: profiles[{i}].name is missing (every profile needs a name)")
        values = _section({f"profiles[{i}]": table}, f"profiles[{i}]", _PROFILE, where)
        name = values["name"]
        key = f"profiles[{name}]"
        if any(p.name == name for p in profiles):
            raise ConfigError(f"{where}: profiles[{i}].name {name!r} is used by two profiles")
        channels = _ids(
            values.get("channels", []),
            _CHANNEL_ID,
            f"{key}.channels",
            where,
            "a channel ID like 'C0123ABCD' or \"im\"",
            extra=(IM_CHANNELS,),
        )
        for channel in channels:
            if channel in owner:
                raise ConfigError(
                    f"{where}: {key}.channels: {channel} is also in profiles[{owner[channel]}].channels "
                    "(a channel belongs to one profile)"
                )
            owner[channel] = name
        teams = _ids(
            values.get("teams", []), _TEAM_ID, f"{key}.teams", where, "a workspace ID like 'T0123ABCD'"
        )
        requesters = _ids(
            values.get("requesters", []),
            _APPROVER_ID,
            f"{key}.requesters",
            where,
            "a Slack user ID like 'U012AB3CD' or user group ID like 'S012AB3CD'",
        )
        merged, offered, policy = _merged(data, values, key, servers, where)
        own_model = "name" in (table.get("model") or {})
        settings = _settings(merged, f"{where}: {key}", env, base, policy, own_model)
        settings = replace(settings, profile=name, offered_servers=offered, requesters=requesters)
        profiles.append(Profile(name=name, channels=channels, teams=teams, settings=settings))
    return tuple(profiles)


def _ids(
    values: list[Any],
    pattern: re.Pattern[str],
    key: str,
    where: str,
    expected: str,
    extra: tuple[str, ...] = (),
) -> tuple[str, ...]:
    for i, value in enumerate(values):
        if not isinstance(value, str) or not (value in extra or pattern.fullmatch(value)):
            raise ConfigError(f"{where}: {key}[{i}] must be {expected}, got {value!r}")
    return tuple(dict.fromkeys(values))


def _merged(
    data: dict[str, Any], profile: dict[str, Any], key: str, servers: set[str], where: str
) -> tuple[dict[str, Any], tuple[str, ...] | None, Policy]:
    """The top level's tables with the profile's keys over them (each key given replaces), the
    servers it offers (None: all) and its policy (its rules first, its tools over the top's)."""
    merged: dict[str, Any] = {"mcp": data.get("mcp")} if "mcp" in data else {}
    for table, spec in (
        ("limits", _LIMITS),
        ("approvals", _APPROVALS),
        ("model", _MODEL),
        ("budgets", _BUDGETS),
        ("tools", _PROFILE_TOOLS),
    ):
        own = _section(profile, table, spec, f"{where}", prefix=f"{key}.{table}")
        inherited = dict(data.get(table) or {})
        if table == "model" and {"system", "system_file"} & set(own):
            inherited.pop("system", None)  # one prompt: the profile's replaces the top's, whichever key
            inherited.pop("system_file", None)
        merged[table] = {**inherited, **own}
    offered: tuple[str, ...] | None = None
    if "mcp" in merged["tools"]:
        names = merged["tools"].pop("mcp")
        for i, name in enumerate(names):
            if name not in servers:
                known = ", ".join(sorted(servers)) or "none are defined"
                raise ConfigError(
                    f"{where}: {key}.tools.mcp[{i}]: no [[mcp.servers]] is named {name!r} ({known})"
                )
        offered = tuple(dict.fromkeys(names))
    top_policy = policy_of(data.get("policy"), where)
    own_policy = policy_of(profile.get("policy"), where, prefix=f"{key}.policy")
    raw_own = profile.get("policy") or {}
    policy = Policy(
        default=own_policy.default if "default" in raw_own else top_policy.default,
        tools={**top_policy.tools, **own_policy.tools},
        rules=(*own_policy.rules, *top_policy.rules),
        origins={name: f"{key}.policy.tools" for name in own_policy.tools},
        default_key=f"{key}.policy.default" if "default" in raw_own else "policy.default",
        # Added to the top level's list: a profile can make a tool stricter, never looser.
        always_ask=tuple(dict.fromkeys((*own_policy.always_ask, *top_policy.always_ask))),
        always_ask_origins={
            glob: f"{key}.policy.always_ask"
            for glob in own_policy.always_ask
            if glob not in top_policy.always_ask
        },
        # Added to the top level's lists too: a profile can only widen what a flow covers.
        flows=check_flows(
            Flows(
                untrusted_output=tuple(
                    dict.fromkeys((*own_policy.flows.untrusted_output, *top_policy.flows.untrusted_output))
                ),
                sends_out=tuple(dict.fromkeys((*own_policy.flows.sends_out, *top_policy.flows.sends_out))),
            ),
            f"{key}.policy.flows",
            where,
        ),
    )
    return merged, offered, policy


def _approvals(raw: dict[str, Any], where: str) -> Approvals:
    for key in ("approvers", "escalate_to"):
        ids = raw.get(key, [])
        for i, who in enumerate(ids):
            if not isinstance(who, str) or not _APPROVER_ID.fullmatch(who):
                raise ConfigError(
                    f"{where}: approvals.{key}[{i}] must be a Slack user ID like 'U012AB3CD' "
                    f"or user group ID like 'S012AB3CD', got {who!r}"
                )
        if key in raw:
            raw[key] = tuple(dict.fromkeys(ids))
    _callable_ref(raw.get("approvers_from", ""), "approvals.approvers_from", where)
    if "approvers_from_tools" in raw:
        tools = raw["approvers_from_tools"]
        for glob, ref in tools.items():
            if not glob.strip():
                raise ConfigError(
                    f"{where}: approvals.approvers_from_tools: a tool name or glob must not be empty"
                )
            _callable_ref(ref, f"approvals.approvers_from_tools.{glob}", where)
        raw["approvers_from_tools"] = tuple(tools.items())
    approvals = Approvals(**raw)
    if approvals.escalate_after_minutes:
        # A reminder that would come after the expiry, or that mentions nobody, would never help.
        if approvals.escalate_after_minutes >= approvals.expire_after_minutes:
            raise ConfigError(
                f"{where}: approvals.escalate_after_minutes ({approvals.escalate_after_minutes:g}) must be "
                f"less than approvals.expire_after_minutes ({approvals.expire_after_minutes:g})"
            )
        if not approvals.escalate_to:
            raise ConfigError(
                f"{where}: approvals.escalate_to must name at least one user or user group "
                "when approvals.escalate_after_minutes > 0"
            )
    if approvals.remind_before_minutes >= approvals.expire_after_minutes:
        # A reminder due before the park even exists would come at once and say nothing new.
        raise ConfigError(
            f"{where}: approvals.remind_before_minutes ({approvals.remind_before_minutes:g}) must be "
            f"less than approvals.expire_after_minutes ({approvals.expire_after_minutes:g})"
        )
    return approvals


def _callable_ref(value: Any, key: str, where: str) -> None:
    """`module:function` (a module name, a colon, a function's name), or "" for none."""
    if not isinstance(value, str) or (value and not _CALLABLE_REF.fullmatch(value)):
        raise ConfigError(
            f'{where}: {key} must be "module:function" like "myorg.approvers:may_approve" (or "": none), '
            f"got {value!r}"
        )


def _tools(raw: dict[str, Any], where: str) -> ToolsConfig:
    builtin = raw.pop("builtin", list(BUILTIN_TOOL_NAMES))
    for i, name in enumerate(builtin):
        if name not in BUILTIN_TOOL_NAMES:
            raise ConfigError(
                f"{where}: tools.builtin[{i}] must be one of {', '.join(BUILTIN_TOOL_NAMES)}, got {name!r}"
            )
    modules = raw.pop("modules", [])
    for i, name in enumerate(modules):
        if not isinstance(name, str) or not _MODULE_NAME.fullmatch(name):
            raise ConfigError(
                f"{where}: tools.modules[{i}] must be a module name like 'ops.tools', got {name!r}"
            )
    return ToolsConfig(builtin=tuple(dict.fromkeys(builtin)), modules=tuple(dict.fromkeys(modules)), **raw)


def _model(raw: dict[str, Any], where: str, base: Path | None) -> ModelConfig:
    if "system" in raw and "system_file" in raw:
        raise ConfigError(f"{where}: model.system and model.system_file are both set; keep one")
    system = raw.get("system")
    if "system_file" in raw:
        path = Path(raw["system_file"])
        if not path.is_absolute() and base is not None:
            path = base / path  # relative to the config file, wherever the process starts
        try:
            system = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: model.system_file: cannot read {path}: {exc}") from None
        if not system:
            raise ConfigError(f"{where}: model.system_file: {path} is empty")
    return ModelConfig(system=system, thinking_budget=int(raw.get("thinking_budget", 0)))


def _mcp(raw: Any, where: str, tools: ToolsConfig) -> tuple[McpServerConfig, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: [mcp] must be a table")
    only_keys(raw, _MCP_KEYS, "mcp.", where)
    servers_raw = raw.get("servers", [])
    if not isinstance(servers_raw, list) or not all(isinstance(s, dict) for s in servers_raw):
        raise ConfigError(f"{where}: mcp.servers must be an array of tables ([[mcp.servers]])")
    servers: list[McpServerConfig] = []
    for i, table in enumerate(servers_raw):
        key = f"mcp.servers[{i}]"
        if "name" not in table:
            raise ConfigError(f"{where}: {key}.name is missing")
        values = _section({key: table}, key, _SERVER, where)
        name = values["name"]
        if any(s.name == name for s in servers):
            raise ConfigError(f"{where}: {key}.name {name!r} is used by two servers")
        if ("command" in values) == ("url" in values):
            raise ConfigError(f"{where}: {key} ({name}) needs exactly one of command (stdio) or url (HTTP)")
        stdio_only = {"args", "env", "cwd", "writable", "network"} & set(values)
        if "url" in values and stdio_only:
            raise ConfigError(f"{where}: {key}.{min(stdio_only)} is for a command server, not a url one")
        if "command" in values and "headers" in values:
            raise ConfigError(f"{where}: {key}.headers is for a url server, not a command one")
        for field_name in ("env", "headers"):
            for k, v in values.get(field_name, {}).items():
                _check_template(v, where, f"{key}.{field_name}.{k}")
        path_arguments = _path_arguments(values.get("path_arguments", {}), name, where, key)
        include, exclude = (
            _tool_globs(values.get(k, []), name, f"{key}.{k}", where)
            for k in ("include_tools", "exclude_tools")
        )
        servers.append(
            McpServerConfig(
                name=name,
                command=values.get("command"),
                args=tuple(values.get("args", ())),
                env=dict(values.get("env", {})),
                cwd=values.get("cwd"),
                url=values.get("url"),
                headers=dict(values.get("headers", {})),
                timeout_seconds=float(values.get("timeout_seconds", 60.0)),
                trust_annotations=values.get("trust_annotations", False),
                pin_tools=values.get("pin_tools", False),
                writable=tuple(os.path.abspath(os.path.expanduser(w)) for w in values.get("writable", ())),
                network=_network(values.get("network", False)),
                path_arguments=path_arguments,
                include_tools=include,
                exclude_tools=exclude,
                defer_loading=values.get("defer_loading"),
            )
        )
    return tuple(servers)


def _tool_globs(raw: list[Any], server: str, key: str, where: str) -> tuple[str, ...]:
    """`include_tools` / `exclude_tools`: globs over the server's own tool names (no `<server>__`)."""
    for i, glob in enumerate(raw):
        if not isinstance(glob, str) or not glob.strip():
            raise ConfigError(
                f'{where}: {key}[{i}] must be a tool name or glob, like "write_*", got {glob!r}'
            )
        if glob.startswith(server + "__"):
            own = glob.removeprefix(server + "__")
            raise ConfigError(
                f"{where}: {key}[{i}]: name the server's own tools ({own!r}), without {server}__"
            )
    return tuple(dict.fromkeys(raw))


def _network(value: bool | list[str]) -> bool | tuple[str, ...]:
    """`network`: false, true (any public host), or the host names (lower case) it may reach."""
    if isinstance(value, bool):
        return value
    return tuple(dict.fromkeys(h.lower() for h in value)) or False


def _path_arguments(raw: dict[str, Any], server: str, where: str, key: str) -> dict[str, tuple[str, ...]]:
    """`path_arguments`: the server's own tool names (no `<server>__` prefix) -> argument names."""
    out: dict[str, tuple[str, ...]] = {}
    for tool, names in raw.items():
        at = f"{key}.path_arguments.{tool}"
        if tool.startswith(server + "__"):
            own = tool.removeprefix(server + "__")
            raise ConfigError(
                f"{where}: {at}: name the server's own tool ({own!r}), without the {server}__ prefix"
            )
        if not tool.strip():
            raise ConfigError(f"{where}: {key}.path_arguments: a tool name must not be empty")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise ConfigError(f"{where}: {at} must be a non-empty list of argument names, got {names!r}")
        out[tool] = tuple(dict.fromkeys(names))
    return out


def _check_template(value: str, where: str, key: str) -> None:
    leftover = VARIABLE.sub("", value)
    if "${" in leftover:
        raise ConfigError(f"{where}: {key}: a variable is written ${{NAME}} (letters, digits, _)")


def _section(
    data: dict[str, Any], name: str, spec: dict[str, _Spec], where: str, prefix: str | None = None
) -> dict[str, Any]:
    """The table `name` of `data`, its keys and values checked against `spec`; errors name it
    `prefix` (default: `name`)."""
    raw = data.get(name, {})
    name = prefix or name
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: [{name}] must be a table")
    only_keys(raw, set(spec), f"{name}.", where)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        types, valid, expected = spec[key]
        # bool is an int subclass in Python; TOML's true/false is never a number here.
        wrong_bool = isinstance(value, bool) and bool not in types
        if wrong_bool or not isinstance(value, types) or (valid and not valid(value)):
            raise ConfigError(f"{where}: {name}.{key} must be {expected}, got {value!r}")
        out[key] = float(value) if float in types else value  # type: ignore[arg-type]
    return out


def _workspace(env: Mapping[str, str]) -> Path:
    raw = env.get("HARNESS_WORKSPACE")
    workspace = Path(raw) if raw else Path.cwd()
    if not workspace.is_dir():
        raise ConfigError(f"HARNESS_WORKSPACE: {workspace} is not a directory")
    return workspace.resolve()
