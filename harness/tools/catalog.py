"""The tools a config offers: the built-ins it keeps, its modules' tools, its MCP servers' tools."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace

from harness.config import Config, ConfigError
from harness.tools.base import Tool
from harness.tools.files import BUILTIN_TOOLS
from harness.tools.mcp import McpHub
from harness.tools.mcp_listing import (
    SEPARATOR,
    TOOL_NAME_RULE,
    Listing,
    McpHost,
    absent_answer,
    tools_of,
    valid_tool_name,
)
from harness.tools.modules import load_module_tools
from harness.tools.registry import ToolRegistry
from harness.tools.tool_search import ServerCost, server_costs

BUILTIN = "builtin"  # `Catalog.sources` of a built-in tool
log = logging.getLogger("harness.mcp")


class Catalog:
    """Built-in and module tools, fixed at start, plus the MCP tools its host lists right now."""

    def __init__(
        self,
        static: Sequence[Tool],
        *,
        host: McpHost | None = None,
        servers: Sequence[str] = (),
        timeout_seconds: float = 30.0,
        sources: Mapping[str, str] | None = None,
        path_arguments: Mapping[str, tuple[str, ...]] | None = None,
        deferral: Mapping[str, bool | None] | None = None,
        defer_over: int = 0,
        logged: set[str] | None = None,
    ) -> None:
        self.static = tuple(static)
        self.host = host
        self.servers = tuple(servers)
        self.timeout_seconds = timeout_seconds
        # Where each static tool comes from: BUILTIN, or the `[tools] modules` entry that offers it.
        self.sources: Mapping[str, str] = dict(sources or {t.name: BUILTIN for t in self.static})
        # `[[mcp.servers]] path_arguments`, by qualified tool name (`<server>__<tool>`).
        self.path_arguments: Mapping[str, tuple[str, ...]] = dict(path_arguments or {})
        # `[[mcp.servers]] defer_loading` by server, and `[limits] defer_tools_over_tokens`.
        self.deferral: Mapping[str, bool | None] = dict(deferral or {})
        self.defer_over = defer_over
        self._logged = logged if logged is not None else set()  # servers deferred by size, said once
        self._lock = threading.Lock()
        self._cached: tuple[Listing | None, ToolRegistry] = (None, ToolRegistry(self.static, timeout_seconds))
        self._narrowed: dict[tuple[object, ...], Catalog] = {}

    @classmethod
    def from_config(cls, config: Config, host: McpHost | None = None) -> Catalog:
        """Every tool `config` or one of its profiles offers (`narrowed` picks a run's); a module
        that fails or a clash of names is a `ConfigError`."""
        levels = [config, *(p.settings for p in config.profiles)]
        builtin = {name for level in levels for name in level.tools.builtin}
        static = [t for t in BUILTIN_TOOLS if t.name in builtin]
        sources = {t.name: BUILTIN for t in static}
        servers = [s.name for s in config.mcp_servers]
        modules = dict.fromkeys(m for level in levels for m in level.tools.modules)
        for module in modules:
            for found in load_module_tools((module,)):
                where = f"tools.modules: {found.module}.{found.name}"
                if found.name in sources:
                    raise ConfigError(f"{where}: two tools are named {found.name!r}")
                if not valid_tool_name(found.name):
                    raise ConfigError(
                        f"{where}: {found.name!r} breaks the API's tool-name rule {TOOL_NAME_RULE}"
                    )
                if any(found.name.startswith(s + SEPARATOR) for s in servers):
                    raise ConfigError(f"{where}: {found.name!r} would shadow a tool of an MCP server")
                sources[found.name] = module
                static.append(found)
        return cls(
            static,
            host=host,
            servers=servers,
            timeout_seconds=config.limits.tool_timeout_seconds,
            sources=sources,
            path_arguments={
                f"{s.name}{SEPARATOR}{tool}": names
                for s in config.mcp_servers
                for tool, names in s.path_arguments.items()
            },
            deferral={s.name: s.defer_loading for s in config.mcp_servers},
            defer_over=config.limits.defer_tools_over_tokens,
        )

    def with_host(self, host: McpHost) -> Catalog:
        """The same built-in and module tools, with MCP tools listed by `host`."""
        return Catalog(
            self.static,
            host=host,
            servers=self.servers,
            timeout_seconds=self.timeout_seconds,
            sources=self.sources,
            path_arguments=self.path_arguments,
            deferral=self.deferral,
            defer_over=self.defer_over,
            logged=self._logged,
        )

    def narrowed(self, settings: Config) -> Catalog:
        """The tools a run under `settings` (a profile's, or the top level's) is offered: its
        built-ins, its modules' tools and the tools of the MCP servers it picks. Kept, so that
        its registry is rebuilt only when the MCP listing changes."""
        key = (
            settings.tools.builtin,
            settings.tools.modules,
            settings.offered_servers,
            settings.limits.tool_timeout_seconds,
            settings.limits.defer_tools_over_tokens,
        )
        with self._lock:
            found = self._narrowed.get(key)
            if found is None:
                static = [
                    t
                    for t in self.static
                    if (self.sources[t.name] == BUILTIN and t.name in settings.tools.builtin)
                    or (self.sources[t.name] != BUILTIN and self.sources[t.name] in settings.tools.modules)
                ]
                found = Catalog(
                    static,
                    host=self.host,
                    servers=[s for s in self.servers if settings.offers_server(s)],
                    timeout_seconds=settings.limits.tool_timeout_seconds,
                    sources=self.sources,
                    path_arguments=self.path_arguments,
                    deferral=self.deferral,
                    defer_over=settings.limits.defer_tools_over_tokens,
                    logged=self._logged,
                )
                self._narrowed[key] = found
        return found

    def source(self, name: str) -> str:
        """Where tool `name` comes from: BUILTIN, a module's name, or "mcp:SERVER"."""
        if name in self.sources:
            return self.sources[name]
        server = next((s for s in self.servers if name.startswith(s + SEPARATOR)), None)
        return f"mcp:{server}" if server else ""

    def audience(self, name: str) -> str | None:
        """Who a receipt of a call of `name` is for (its `aud`): `mcp:<server>`, `module:<module>`;
        None for a built-in (it shows nobody a receipt) or a tool of no source known here."""
        source = self.source(name)
        if source.startswith("mcp:"):
            return source
        return f"module:{source}" if source and source != BUILTIN else None

    def left_out(self) -> dict[str, str]:
        """The tools of this catalog's servers that their `include_tools` / `exclude_tools` leave
        out, each with the key and glob that did (`--list-tools` says them)."""
        if self.host is None:
            return {}
        found = self.host.listing().left_out
        return {name: why for name, why in found.items() if name.split(SEPARATOR)[0] in self.servers}

    def registry(self) -> ToolRegistry:
        """The tools to offer now; rebuilt only when the MCP listing changed."""
        if self.host is None:
            return self._cached[1]
        listing = self.host.listing()
        with self._lock:
            previous, registry = self._cached
            if listing != previous:
                mine = Listing(
                    tools=tuple(t for t in listing.tools if t.server in self.servers),
                    away=listing.away,
                    timeouts=listing.timeouts,
                )
                tools = [*self.static, *self._deferred(tools_of(self.host, mine, self.path_arguments))]
                absent = absent_answer(self.servers, listing)
                registry = ToolRegistry(tools, self.timeout_seconds, absent=absent)
                self._cached = (listing, registry)
        return registry

    def costs(self) -> tuple[ServerCost, ...]:
        """What each MCP server of this catalog adds to every request now (`--list-tools`)."""
        listed = [t.schema() for t in self.registry() if self.source(t.name).startswith("mcp:")]
        return server_costs(listed, self.servers, self.deferral, self.defer_over)

    def _deferred(self, tools: list[Tool]) -> list[Tool]:
        """`tools` (MCP tools) with those of each deferred server marked so."""
        costs = server_costs([t.schema() for t in tools], self.servers, self.deferral, self.defer_over)
        deferred = {c.server: c for c in costs if c.deferred_why}
        for cost in deferred.values():
            if cost.deferred_why.startswith("over") and cost.server not in self._logged:
                self._logged.add(cost.server)
                log.info(
                    "MCP server %s: its %d tools' definitions are about %d tokens a request, %s: they go "
                    "through the Messages API's tool search, paid for once found "
                    "(defer_loading = false sends them whole with every request)",
                    cost.server,
                    cost.tools,
                    cost.tokens,
                    cost.deferred_why,
                )
        return [replace(t, deferred=True) if t.name.split(SEPARATOR)[0] in deferred else t for t in tools]


@contextmanager
def open_catalog(config: Config, environ: Mapping[str, str] | None = None) -> Iterator[Catalog]:
    """The catalog of `config` with its MCP servers started (in this process) for the block's life.

    The terminal agent's way; a worker keeps its hub for its whole life and relays it to its
    work horses (`workers.__main__`). A server that cannot start is logged and retried, never fatal.
    """
    servers = config.resolved_servers(environ)
    if not servers:
        yield Catalog.from_config(config)
        return
    catalog = Catalog.from_config(config)  # modules first: a ConfigError before any server starts
    with McpHub(servers) as hub:
        yield catalog.with_host(hub)
