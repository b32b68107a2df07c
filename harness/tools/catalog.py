"""The tools a config offers: the built-ins it keeps, its modules' tools, its MCP servers' tools."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from harness.config import Config, ConfigError
from harness.tools.base import Tool
from harness.tools.files import BUILTIN_TOOLS
from harness.tools.mcp import (
    SEPARATOR,
    TOOL_NAME_RULE,
    Listing,
    McpHost,
    McpHub,
    absent_answer,
    tools_of,
    valid_tool_name,
)
from harness.tools.modules import load_module_tools
from harness.tools.registry import ToolRegistry


class Catalog:
    """Built-in and module tools, fixed at start, plus the MCP tools its host lists right now."""

    def __init__(
        self,
        static: Sequence[Tool],
        *,
        host: McpHost | None = None,
        servers: Sequence[str] = (),
        timeout_seconds: float = 30.0,
    ) -> None:
        self.static = tuple(static)
        self.host = host
        self.servers = tuple(servers)
        self.timeout_seconds = timeout_seconds
        self._lock = threading.Lock()
        self._cached: tuple[Listing | None, ToolRegistry] = (None, ToolRegistry(self.static, timeout_seconds))

    @classmethod
    def from_config(cls, config: Config, host: McpHost | None = None) -> Catalog:
        """The catalog of `config`; a module that fails or a clash of names is a `ConfigError`."""
        static = [t for t in BUILTIN_TOOLS if t.name in config.tools.builtin]
        servers = [s.name for s in config.mcp_servers]
        seen = {t.name for t in static}
        for found in load_module_tools(config.tools.modules):
            where = f"tools.modules: {found.module}.{found.name}"
            if found.name in seen:
                raise ConfigError(f"{where}: two tools are named {found.name!r}")
            if not valid_tool_name(found.name):
                raise ConfigError(f"{where}: {found.name!r} breaks the API's tool-name rule {TOOL_NAME_RULE}")
            if any(found.name.startswith(s + SEPARATOR) for s in servers):
                raise ConfigError(f"{where}: {found.name!r} would shadow a tool of an MCP server")
            seen.add(found.name)
            static.append(found)
        return cls(static, host=host, servers=servers, timeout_seconds=config.limits.tool_timeout_seconds)

    def with_host(self, host: McpHost) -> Catalog:
        """The same built-in and module tools, with MCP tools listed by `host`."""
        return Catalog(self.static, host=host, servers=self.servers, timeout_seconds=self.timeout_seconds)

    def registry(self) -> ToolRegistry:
        """The tools to offer now; rebuilt only when the MCP listing changed."""
        if self.host is None:
            return self._cached[1]
        listing = self.host.listing()
        with self._lock:
            previous, registry = self._cached
            if listing != previous:
                tools = [*self.static, *tools_of(self.host, listing)]
                absent = absent_answer(self.servers, listing)
                registry = ToolRegistry(tools, self.timeout_seconds, absent=absent)
                self._cached = (listing, registry)
        return registry


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
