"""The tools a config offers: the built-ins it keeps, its modules' tools, its MCP servers' tools."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from harness.config import Config, ConfigError
from harness.tools.base import Tool
from harness.tools.files import BUILTIN_TOOLS
from harness.tools.mcp import SEPARATOR, Listing, McpHost, absent_answer, tools_of, valid_tool_name
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
        self._timeout = timeout_seconds
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
                raise ConfigError(
                    f"{where}: {found.name!r} breaks the API's tool-name rule (1-128 of a-z A-Z 0-9 _ -)"
                )
            if any(found.name.startswith(s + SEPARATOR) for s in servers):
                raise ConfigError(f"{where}: {found.name!r} would shadow a tool of an MCP server")
            seen.add(found.name)
            static.append(found)
        return cls(static, host=host, servers=servers, timeout_seconds=config.limits.tool_timeout_seconds)

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
                registry = ToolRegistry(tools, self._timeout, absent=absent)
                self._cached = (listing, registry)
        return registry
