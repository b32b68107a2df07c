"""When a server's tools change: what a new listing adds, removes or redefines, and whether it is taken.

A server says its tools changed (`notifications/tools/list_changed`), or a new session lists them
again. Without `pin_tools` the new listing is taken and its changes named in one INFO line: an added
tool is offered (and tiered by the policy like any other), a removed one no longer is, and a tool
whose description or schema changed under the same name is offered as now defined. With
`pin_tools = true` the tools first listed stay for the process's life: a listing that differs is
named in one WARNING line and not taken (a rug-pull guard: a tool approved as one thing cannot
quietly become another).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from harness.tools.mcp_listing import McpTool
from harness.tools.mcp_log import describe

log = logging.getLogger("harness.mcp")

_NAMED_MAX = 20  # tools named per kind of change in the one log line


@dataclass(frozen=True)
class Changes:
    """The tool names a new listing adds, removes, and redefines (same name, another definition)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def describe(self) -> str:
        """`added 'a'; removed 'b', 'c'; changed 'd'` (names as repr: they are the server's text)."""
        parts = []
        for label, names in (("added", self.added), ("removed", self.removed), ("changed", self.changed)):
            if names:
                shown = ", ".join(repr(n) for n in names[:_NAMED_MAX])
                more = f" and {len(names) - _NAMED_MAX} more" if len(names) > _NAMED_MAX else ""
                parts.append(f"{label} {shown}{more}")
        return "; ".join(parts)


def changes(old: tuple[McpTool, ...], new: tuple[McpTool, ...]) -> Changes:
    """What `new` changes of `old`: a definition is its description, schemas, title, annotations."""
    before = {t.name: t for t in old}
    after = {t.name: t for t in new}
    return Changes(
        added=tuple(n for n in after if n not in before),
        removed=tuple(n for n in before if n not in after),
        changed=tuple(n for n in after if n in before and after[n] != before[n]),
    )


@dataclass
class ToolBook:
    """A server's tools as the hub takes them, listing after listing, for the life of the process.

    `server`: how the log names it; `pinned`: its `pin_tools`.
    """

    server: str
    pinned: bool = False
    known: tuple[McpTool, ...] | None = field(default=None)  # the tools last taken (None: none yet)
    warned: str = ""  # the change last named at WARNING (pinned): the same again goes to DEBUG

    def take(self, listed: tuple[McpTool, ...], why: str) -> tuple[McpTool, ...]:
        """The tools to offer after `listed` (the first listing is taken as it is); `why`: what made
        the hub list them."""
        if self.known is None:
            self.known = listed
            return listed
        found = changes(self.known, listed)
        if not found:
            return self.known
        if self.pinned:
            described = found.describe()
            again, self.warned = self.warned == described, described
            (log.debug if again else log.warning)(
                "MCP server %s: its tools changed (%s): %s; not taken: pin_tools = true keeps the %d "
                "tools first listed",
                self.server,
                why,
                described,
                len(self.known),
            )
            return self.known
        log.info(
            "MCP server %s: its tools changed (%s): %s; %d tools offered",
            self.server,
            why,
            found.describe(),
            len(listed),
        )
        self.known = listed
        return listed


class Notified:
    """A session's message handler: `notifications/tools/list_changed` wakes its watch to list again."""

    def __init__(self, server: Any) -> None:
        self._server = server

    async def __call__(self, message: Any) -> None:
        from mcp.types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self._server.changed.set()
            self._server.wake.set()


async def listen(server: Any, client: Any) -> None:
    """Keep a `subscriptions/listen` stream open for tool changes, at the 2026-07-28 protocol: there
    a server sends `notifications/tools/list_changed` only on such a stream (an earlier protocol's
    server sends them on the connection). Its events reach `Notified` as well."""
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    tools = client.server_capabilities.tools
    if client.protocol_version not in MODERN_PROTOCOL_VERSIONS or tools is None or not tools.list_changed:
        return
    try:
        async with client.listen(tools_list_changed=True) as subscription:
            async for _event in subscription:
                server.changed.set()
                server.wake.set()
    except Exception as exc:  # the tools stay as listed; a dying session is seen by its watch
        if server.broken.is_set():
            return
        log.info(
            "MCP server %s: its tool changes are not heard (%s)",
            server.resolved.config.describe(),
            describe(exc),
        )
