"""What a run is given: the settings of the top level or of a profile, and which profile a run gets.

Read from the `HARNESS_CONFIG` file by `harness.config.file`; every value here is already checked.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from harness import texts
from harness.policy import Policy, Tier, glob_match

DEFAULT_MODEL = "claude-sonnet-5-5"
BUILTIN_TOOL_NAMES = ("get_time", "read_file", "list_files", "write_file", "delete_file")
IM_CHANNELS = "im"  # in a profile's `channels`: every direct message (a D… channel)
RECEIPT_KEY = "HARNESS_RECEIPT_KEY"  # never handed to a server (`harness.receipts`)
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # ${NAME} in a server's env and headers
ON_LIMIT_CHOICES = ("stop", "ask")


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
    # A request's estimated input size is kept under this by clearing the oldest tool results.
    max_input_tokens: int = 100_000
    # At max_turns or token_budget: "stop" ends the run; "ask" parks it until someone chooses
    # Continue (one more allowance of that limit) or Stop.
    on_limit: str = "stop"
    # An MCP server whose `defer_loading` is not set goes through the Messages API's tool search
    # when its tool definitions are estimated over this many tokens a request (0: never by size).
    defer_tools_over_tokens: int = 10_000


@dataclass(frozen=True)
class Approvals:
    """Who may decide an `ask` call, how many must agree, and for how long a request stays open."""

    # User IDs (U…, W…) and user group IDs (S…); empty: the person who mentioned the bot.
    approvers: tuple[str, ...] = ()
    # False: the requester may decline, never approve, calls of their own run.
    self_approval: bool = True
    # Distinct approvals a call needs; any one decline declines it.
    required: int = 1
    expire_after_minutes: float = 1440.0
    # > 0: a call still undecided after this long gets one reminder mentioning `escalate_to`.
    escalate_after_minutes: float = 0.0
    escalate_to: tuple[str, ...] = ()
    # > 0: cards also offer "Approve for this thread", good for this many minutes.
    grant_minutes: float = 0.0
    # > 0: a grant lets at most this many later calls run, then they ask again (0: no limit).
    grant_uses: int = 0
    # > 0: this long before a park expires, one reminder in its thread with an Extend button.
    remind_before_minutes: float = 0.0
    # How many times Extend may push a park's expiry `expire_after_minutes` later.
    max_extensions: int = 1
    # "module:function" asked at each approving click, in the bot, whether that clicker may approve
    # that call (gates.approvers_from); "": none. `approvers_from_tools`: (tool name or glob,
    # "module:function" or "") pairs in file order, for some tools instead (`approvers_from_for`).
    approvers_from: str = ""
    approvers_from_tools: tuple[tuple[str, str], ...] = ()
    approvers_from_timeout_seconds: float = 2.0

    def approvers_from_for(self, tool: str) -> str:
        """The callable asked at an approval of a call of `tool`: its entry in `approvers_from_tools`
        (the exact name, else the longest glob that matches, the first of equals), else
        `approvers_from`; "" when none is."""
        tools = dict(self.approvers_from_tools)
        if tool in tools:
            return tools[tool]
        globs = [(len(p), -i, p) for i, (p, _) in enumerate(self.approvers_from_tools) if _glob_of(p, tool)]
        return tools[max(globs)[2]] if globs else self.approvers_from

    def approvers_from_refs(self) -> tuple[tuple[str, str], ...]:
        """Every callable these approvals name, with the key that names it (its key's own words)."""
        found = [("approvals.approvers_from", self.approvers_from)] if self.approvers_from else []
        found += [
            (f"approvals.approvers_from_tools.{glob}", ref) for glob, ref in self.approvers_from_tools if ref
        ]
        return tuple(found)


@dataclass(frozen=True)
class ToolsConfig:
    """The `[tools]` table: which built-ins are offered, which modules add tools, what they may do."""

    builtin: tuple[str, ...] = BUILTIN_TOOL_NAMES
    modules: tuple[str, ...] = ()
    # Off by default: .env and .git/config would otherwise be one file-tool call away.
    allow_hidden: bool = False


@dataclass(frozen=True)
class McpServerConfig:
    """One `[[mcp.servers]]` table. `env` and `headers` keep their `${VAR}` text until `resolved`.

    Their expanded values are secrets: they never enter a log line, a card or the audit, so
    this value carries only the templates, and `describe` names the server without them.
    """

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_seconds: float = 60.0
    # Annotations are the server's own claims: only with true may its readOnlyHint make a tool allow.
    trust_annotations: bool = False
    # The tools first listed are kept for the process's life: a later listing that differs (after
    # `notifications/tools/list_changed` or a reconnect) is logged, never offered (a rug-pull guard).
    pin_tools: bool = False
    # stdio only: the directories it may write besides its cwd and temporary directory (absolute),
    # and where it may connect: nowhere (False), any public host (True), or only these host names.
    writable: tuple[str, ...] = ()
    network: bool | tuple[str, ...] = False
    # This server's tool name (without the `<name>__` prefix) -> its arguments that hold paths,
    # besides those its inputSchema marks: what a directory grant holds inside its directory.
    path_arguments: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Globs over its own tool names: only tools some `include_tools` glob matches are listed (empty:
    # all), and none an `exclude_tools` glob matches; a tool left out is never offered nor callable.
    include_tools: tuple[str, ...] = ()
    exclude_tools: tuple[str, ...] = ()
    # True: its tools go through the Messages API's tool search; False: never; None (not set):
    # when its definitions are estimated over `[limits] defer_tools_over_tokens`.
    defer_loading: bool | None = None

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def resolved(self, environ: Mapping[str, str]) -> ResolvedServer:
        """The server with `${VAR}` filled in from `environ`; a missing variable is a `ConfigError`."""
        key = f"mcp.servers[{self.name}]"
        env = {k: _expand(v, environ, f"{key}.env.{k}") for k, v in self.env.items()}
        headers = {k: _expand(v, environ, f"{key}.headers.{k}") for k, v in self.headers.items()}
        return ResolvedServer(self, env, headers)

    def describe(self) -> str:
        """How log lines name the server: its name and what it runs or where, never a secret."""
        if self.command is not None:
            return f"{self.name} (stdio: {self.command})"
        return f"{self.name} ({_url_without_secrets(self.url or '')})"


@dataclass(frozen=True)
class ResolvedServer:
    """A server with its secrets filled in; its repr shows none of them."""

    config: McpServerConfig
    env: Mapping[str, str] = field(repr=False)
    headers: Mapping[str, str] = field(repr=False)


@dataclass(frozen=True)
class Budgets:
    """The `[budgets]` table: tokens (as valve 2 counts them) per UTC day; 0 is no budget."""

    per_user_daily_tokens: int = 0
    per_channel_daily_tokens: int = 0

    def __bool__(self) -> bool:
        return bool(self.per_user_daily_tokens or self.per_channel_daily_tokens)


@dataclass(frozen=True)
class ModelConfig:
    """The `[model]` table (the name is `Config.model`)."""

    system: str | None = None  # None: the built-in system prompt
    thinking_budget: int = 0


@dataclass(frozen=True)
class Config:
    """Everything read from `HARNESS_CONFIG` plus the environment's model and workspace."""

    limits: Limits = field(default_factory=Limits)
    policy: Policy = field(default_factory=Policy)
    approvals: Approvals = field(default_factory=Approvals)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    model: str = DEFAULT_MODEL
    workspace: Path = field(default_factory=Path.cwd)
    model_settings: ModelConfig = field(default_factory=ModelConfig)
    mcp_servers: tuple[McpServerConfig, ...] = ()  # every server defined: a profile only picks
    budgets: Budgets = field(default_factory=Budgets)
    # The profile these are the settings of (None: the top level), the MCP servers it offers
    # (None: all) and who may start a run under it (empty: anyone).
    profile: str | None = None
    offered_servers: tuple[str, ...] | None = None
    requesters: tuple[str, ...] = ()
    # Top level only: the `[[profiles]]`, in file order, each with its whole settings.
    profiles: tuple[Profile, ...] = ()

    def match(self, channel: str, team: str = "") -> Match:
        """The profile a run in `channel` of workspace `team` gets (the first that matches), and why."""
        for profile in self.profiles:
            why = profile.why_matches(channel, team)
            if why:
                return Match(profile.settings, why)
        return Match(self, f"no profile matches channel {channel or '?'}: the top-level settings")

    def for_run(self, channel: str, team: str = "") -> Config:
        """The settings of a new run in `channel` of `team`."""
        return self.match(channel, team).settings

    def for_profile(self, name: str | None) -> Config | None:
        """The settings of profile `name` as configured now (None or "": the top level); None when
        there is no profile of that name (it was renamed or removed since). Ask the top level."""
        if not name:
            return self
        return next((p.settings for p in self.profiles if p.name == name), None)

    def settings(self, name: str | None) -> Config:
        """The settings a run started under profile `name` gets now: the profile as configured now
        (its tools, policy and approvals after a reload), or `closed` when it is gone."""
        return self.for_profile(name) or self.closed(name or "")

    def closed(self, name: str) -> Config:
        """The settings of a run whose profile `name` is no longer configured: nothing is offered
        and every call is `deny`, so it can only wrap up (fail closed, never the top level's tools)."""
        return replace(
            self,
            profile=name,
            policy=Policy(default=Tier.DENY),
            tools=ToolsConfig(builtin=(), modules=()),
            offered_servers=(),
            profiles=(),
        )

    def offers_server(self, name: str) -> bool:
        """Whether this config offers the tools of MCP server `name`."""
        return self.offered_servers is None or name in self.offered_servers

    @property
    def profile_label(self) -> str:
        """How metrics and the audit name the profile: its name, or "" for the top level."""
        return self.profile or ""

    def resolved_servers(self, environ: Mapping[str, str] | None = None) -> tuple[ResolvedServer, ...]:
        """Every MCP server with its `${VAR}`s filled in; the first missing variable is a `ConfigError`.

        Only a process that starts the servers (a worker, the terminal agent) resolves them: the
        bot never needs their secrets.
        """
        environ = os.environ if environ is None else environ
        return tuple(server.resolved(environ) for server in self.mcp_servers)


@dataclass(frozen=True)
class Profile:
    """One `[[profiles]]` table: which runs it matches, and their whole settings (inherited keys filled)."""

    name: str
    channels: tuple[str, ...]
    teams: tuple[str, ...]
    settings: Config = field(repr=False)

    def why_matches(self, channel: str, team: str) -> str:
        """Why a run in `channel` of `team` gets this profile, in words; "" when it does not."""
        if self.teams and team not in self.teams:
            return ""
        key = f"profiles[{self.name}]"
        if not self.channels:
            where = f"team {team}" if self.teams else "every channel"
            return f"{key} has no channels: it matches {where}"
        if channel in self.channels:
            return f"channel {channel} is in {key}.channels"
        if channel.startswith("D") and IM_CHANNELS in self.channels:
            return f'a direct message: {key}.channels has "{IM_CHANNELS}"'
        return ""


@dataclass(frozen=True)
class Match:
    """The settings a run gets and why: `settings.profile` names the profile (None: the top level)."""

    settings: Config
    why: str

    @property
    def profile(self) -> str | None:
        return self.settings.profile

    def header(self) -> str:
        """`# profile: NAME (WHY)`, or `# profile: none` (the contract's words) when no profile
        matches: the first line of an explanation."""
        return f"# profile: {self.profile} ({self.why})" if self.profile else "# profile: none"


def _glob_of(pattern: str, name: str) -> bool:
    """Whether `pattern` is a glob (as in `[policy.tools]`) that matches the tool name `name`."""
    return any(c in pattern for c in "*?") and glob_match(pattern, name)


def _expand(value: str, environ: Mapping[str, str], key: str) -> str:
    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == RECEIPT_KEY:  # whoever holds it could sign any receipt: each server gets its own
            raise ConfigError(texts.RECEIPT_KEY_TO_SERVER.format(key=key, name=name))
        if name not in environ:
            raise ConfigError(f"{key} uses ${{{name}}}, but the environment has no {name}")
        return environ[name]

    return VARIABLE.sub(fill, value)


def _url_without_secrets(url: str) -> str:
    """`url` without user info, query or fragment: where tokens hide."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
