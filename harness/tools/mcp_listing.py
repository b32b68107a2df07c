"""What MCP servers offer: each server's tools as listed, checked, and made into `Tool`s.

Plain data apart from the hub that keeps the sessions: a `Listing` crosses the relay as JSON to a
forked work horse, which makes its `Tool`s from it (`tools_of`) without a session of its own. A
tool the Messages API would refuse (a bad or shared name, a schema that is none) is left out
here, where the listing is read, and named in one log line; so is a tool the operator's
`include_tools` / `exclude_tools` globs leave out (`left_out_by`), which is then never offered
nor callable, and said by `--list-tools` with the glob that left it out. A tool that runs only
as a task (2025-11-25) is offered like any other, and called as one (`harness.tools.mcp_tasks`).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, NamedTuple, Protocol

from harness import texts
from harness.config import McpServerConfig
from harness.policy import Tier
from harness.tools.base import Tool, ToolContext, ToolResult
from harness.tools.inputs import InputReply
from harness.tools.schemas import input_checker, schema_problem

log = logging.getLogger("harness.mcp")

SEPARATOR = "__"
REQUIRES_INTERACTION = "anthropic/requiresUserInteraction"  # the `_meta` key of a tool that always asks
# The Messages API's rule for a tool name: a name that breaks it makes every request refused.
TOOL_NAME_RULE = "^[a-zA-Z0-9_-]{1,64}$"
_TOOL_NAME = re.compile(TOOL_NAME_RULE)
_NAMED_MAX = 20  # tools named in the one log line that says which were left out


@dataclass(frozen=True)
class McpTool:
    """One tool of one server, as listed."""

    server: str
    name: str
    description: str
    input_schema: Mapping[str, Any]
    title: str | None = None
    annotations: Mapping[str, Any] = field(default_factory=dict)
    # `trust_annotations` of its server: whether `claims_read_only` may be believed.
    trusted: bool = False
    # Its `_meta` says `anthropic/requiresUserInteraction: true`: every call asks a person.
    requires_interaction: bool = False
    # `execution.taskSupport: "required"` (2025-11-25): every call runs as a task
    # (`harness.tools.mcp_tasks`).
    task_only: bool = False

    @property
    def qualified(self) -> str:
        return f"{self.server}{SEPARATOR}{self.name}"

    @property
    def claims_read_only(self) -> bool:
        """`readOnlyHint: true` and not `destructiveHint: true`: what the server says, nothing more."""
        return (
            self.annotations.get("readOnlyHint") is True
            and self.annotations.get("destructiveHint") is not True
        )

    @property
    def read_only(self) -> bool:
        """A read-only claim of a server whose annotations are trusted: the contract's step 3 allow."""
        return self.trusted and self.claims_read_only

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "name": self.name,
            "description": self.description,
            "input_schema": dict(self.input_schema),
            "title": self.title,
            "annotations": dict(self.annotations),
            "trusted": self.trusted,
            "requires_interaction": self.requires_interaction,
            "task_only": self.task_only,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> McpTool:
        return cls(
            server=data["server"],
            name=data["name"],
            description=data["description"],
            input_schema=data["input_schema"],
            title=data.get("title"),
            annotations=data.get("annotations") or {},
            trusted=data.get("trusted") is True,  # missing: not trusted
            requires_interaction=data.get("requires_interaction") is True,
            task_only=data.get("task_only") is True,
        )


@dataclass(frozen=True)
class Listing:
    """The tools of every server that is up, and why each server that is not is away."""

    tools: tuple[McpTool, ...] = ()
    away: Mapping[str, str] = field(default_factory=dict)  # server -> reason
    timeouts: Mapping[str, float] = field(default_factory=dict)  # server -> call timeout (s)
    # `<server>__<tool>` -> the `include_tools` / `exclude_tools` key that left it out (not offered).
    left_out: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "tools": [t.to_json() for t in self.tools],
            "away": dict(self.away),
            "timeouts": dict(self.timeouts),
            "left_out": dict(self.left_out),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Listing:
        return cls(
            tools=tuple(McpTool.from_json(t) for t in data["tools"]),
            away=dict(data["away"]),
            timeouts={k: float(v) for k, v in data["timeouts"].items()},
            left_out=dict(data.get("left_out") or {}),
        )


class Listed(NamedTuple):
    """What one server lists: the tools it offers, and those its globs leave out (name -> why)."""

    tools: tuple[McpTool, ...]
    left_out: dict[str, str]


class McpHost(Protocol):
    """What tools need of MCP: the current listing, and a call (the hub itself, or its relay)."""

    def listing(self) -> Listing: ...

    def call(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        side_effects: bool,
        reply: InputReply | None = None,
        who: str | None = None,
        receipt: str | None = None,
    ) -> ToolResult: ...


def tools_of(
    host: McpHost, listing: Listing, path_arguments: Mapping[str, tuple[str, ...]] | None = None
) -> list[Tool]:
    """Each listed MCP tool as a `Tool` that calls through `host`; `path_arguments`: the
    operator's `path_arguments` by qualified name (`<server>__<tool>`)."""
    listed = path_arguments or {}
    return [
        _as_tool(host, t, listing.timeouts.get(t.server, 60.0), listed.get(t.qualified, ()))
        for t in listing.tools
    ]


def _as_tool(host: McpHost, info: McpTool, timeout: float, paths: tuple[str, ...] = ()) -> Tool:
    # Fail safe: an unannotated tool, or one whose claim is not trusted, may change the world, so
    # a call of it is never run twice after a crash (its outcome is reported unknown instead).
    side_effects = not info.read_only
    if info.read_only:
        own_why = texts.WHY_MCP_READ_ONLY.format(server=info.server)
    elif info.claims_read_only:  # no tier of its own; the policy's why says the claim was not believed
        own_why = texts.WHY_MCP_CLAIM_NOT_TRUSTED.format(server=info.server)
    else:
        own_why = ""

    def call(ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        return host.call(info.server, info.name, arguments, side_effects, ctx.reply, ctx.who, ctx.receipt)

    return Tool(
        name=info.qualified,
        description=info.description or info.title or info.name,
        input_schema=info.input_schema,
        call=call,
        side_effects=side_effects,
        own_tier=Tier.ALLOW if info.read_only else None,
        own_tier_why=own_why,
        always_ask_why=texts.WHY_MCP_ALWAYS_ASK.format(server=info.server)
        if info.requires_interaction
        else "",
        title=info.title,
        annotations=info.annotations,
        # Checked before a card is posted: a person never approves a call the server would refuse.
        validate=input_checker(info.input_schema),
        timeout_seconds=timeout,
        listed_paths=paths,
    )


def absent_answer(servers: Sequence[str], listing: Listing) -> Callable[[str], ToolResult | None]:
    """For the registry: a call to a tool of a configured server that is away names the server."""

    def answer(name: str) -> ToolResult | None:
        for server in servers:
            if name.startswith(server + SEPARATOR) and server in listing.away:
                reason = listing.away[server]
                return ToolResult(texts.MCP_SERVER_AWAY.format(server=server, name=name, reason=reason), True)
        return None

    return answer


def valid_tool_name(name: str) -> bool:
    """Whether the Messages API accepts `name` as a tool's name (`TOOL_NAME_RULE`)."""
    return _TOOL_NAME.fullmatch(name) is not None


def left_out_by(config: McpServerConfig, name: str) -> str:
    """Why the operator's globs leave tool `name` of `config`'s server out ("" when they keep it)."""
    key = f"mcp.servers[{config.name}]"
    glob = next((g for g in config.exclude_tools if fnmatchcase(name, g)), None)
    if glob is not None:
        return f'{key}.exclude_tools "{glob}"'
    if config.include_tools and not any(fnmatchcase(name, g) for g in config.include_tools):
        return f"{key}.include_tools (no glob matches it)"
    return ""


async def list_tools(client: Any, config: McpServerConfig) -> Listed:
    """The server's tools the API can be offered; the others are named in one log line.

    A tool the server's `include_tools` / `exclude_tools` leave out is never offered (and named
    in `Listed.left_out`). A name the API refuses, or one two tools share (which of them would a
    call reach?), is left out; offering it would make every request of every run refused,
    built-in-only runs included.
    """
    server, trusted = config.name, config.trust_annotations
    found: list[McpTool] = []
    left_out: dict[str, str] = {}
    names: list[str] = []
    cursor = None
    for _ in range(100):  # pages; a server that pages forever is cut off
        page = await client.list_tools(cursor=cursor)
        for tool in page.tools:
            names.append(tool.name)
            why = left_out_by(config, tool.name)
            if why:
                left_out[f"{server}{SEPARATOR}{tool.name}"] = why
                continue
            unusable = _unusable(tool)
            if unusable:
                log.warning("MCP server %s: tool %r is not offered: %s", server, tool.name, unusable)
                continue
            annotations = (
                tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}
            )
            found.append(
                McpTool(
                    server=server,
                    name=tool.name,
                    description=tool.description or "",
                    input_schema=tool.input_schema,
                    title=tool.title or annotations.get("title"),
                    annotations=annotations,
                    trusted=trusted,
                    requires_interaction=_requires_interaction(tool),
                    task_only=getattr(getattr(tool, "execution", None), "task_support", None) == "required",
                )
            )
        cursor = page.next_cursor
        if not cursor:
            break
    _unmatched_globs(config, names)
    return Listed(_offerable(found, server), left_out)


def _unmatched_globs(config: McpServerConfig, names: Sequence[str]) -> None:
    """One log line per glob of `include_tools` / `exclude_tools` that matches none of the tools listed
    (a typo, or a tool the server no longer has)."""
    for key in ("include_tools", "exclude_tools"):
        for glob in getattr(config, key):
            if not any(fnmatchcase(name, glob) for name in names):
                log.warning(
                    "MCP server %s: mcp.servers[%s].%s %r matches none of its %d tools",
                    config.name,
                    config.name,
                    key,
                    glob,
                    len(names),
                )


def _requires_interaction(tool: Any) -> bool:
    """Whether the tool's `_meta` says `anthropic/requiresUserInteraction: true`.

    Believed whatever `trust_annotations` says: a server can only make its own tool stricter by it.
    """
    meta = getattr(tool, "meta", None)
    return isinstance(meta, Mapping) and meta.get(REQUIRES_INTERACTION) is True


def _offerable(found: list[McpTool], server: str) -> tuple[McpTool, ...]:
    counts = Counter(t.name for t in found)
    refused: dict[str, str] = {}
    for info in found:
        if counts[info.name] > 1:
            refused[info.name] = f"{counts[info.name]} tools share this name"
        elif not valid_tool_name(info.qualified):
            refused[info.name] = f"{info.qualified!r} breaks the API's tool-name rule {TOOL_NAME_RULE}"
    if refused:
        # repr: a name is the server's text, and must not start a log line of its own.
        reasons = [f"{name!r} ({why})" for name, why in refused.items()]
        more = f"; and {len(reasons) - _NAMED_MAX} more" if len(reasons) > _NAMED_MAX else ""
        log.warning(
            "MCP server %s: %d tool(s) not offered: %s%s",
            server,
            len(refused),
            "; ".join(reasons[:_NAMED_MAX]),
            more,
        )
    return tuple(t for t in found if t.name not in refused)


def _unusable(tool: Any) -> str | None:
    """Why the harness cannot call `tool` as listed (None when it can).

    An inputSchema that is not a valid JSON schema cannot be checked before a card is posted, and
    the Messages API may refuse every request that offers it.
    """
    problem = schema_problem(tool.input_schema)
    if problem is not None:
        return f"its inputSchema is not a valid JSON schema: {problem}"
    return None
