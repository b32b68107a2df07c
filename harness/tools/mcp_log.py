"""What the hub says of a server's sessions: up (and after how long down), down (at WARNING once
per reason, then at DEBUG), and each failure in one line, bounded; and how a session's end is told
from a call's own failure. Read defensively: what the SDK keeps is not all public."""

from __future__ import annotations

import logging
from typing import Any

from harness.tools.mcp_command import CommandMissing
from harness.tools.sandbox import SandboxUnavailable

log = logging.getLogger("harness.mcp")


def log_up(server: Any, tools: int, failures: int, down_for: float) -> None:
    """The server is up: said at INFO, with how long it was down when it was."""
    name = server.resolved.config.describe()
    if not failures:
        log.info("MCP server %s is up: %d tools", name, tools)
        return
    log.info(
        "MCP server %s is up again after %.0f s down (%d failed tries): %d tools",
        name,
        down_for,
        failures,
        tools,
    )


def log_down(server: Any, reason: str, delay: float, cannot_start: bool, backoff_max: float) -> None:
    """A try failed: at WARNING the first time for this reason, at DEBUG while the reason stays."""
    why = f"cannot start: {reason}" if cannot_start else f"is not reachable ({reason})"
    name = server.resolved.config.describe()
    if reason == server.logged:
        log.debug(
            "MCP server %s still %s; %d tries failed, trying again in %.1f s",
            name,
            why,
            server.failures,
            delay,
        )
        return
    server.logged = reason
    log.warning(
        "MCP server %s %s; trying again in %.1f s and less often after (up to every %.0f s), "
        "said again only if the reason changes",
        name,
        why,
        delay,
        backoff_max,
    )


def closed(client: Any) -> bool:
    """Whether the session's connection is known to be closed.

    The SDK keeps this on its dispatcher (`_closed`, set when the read stream ends); read
    defensively, since it is not public: unknown reads as open, and a call then finds out.
    """
    try:
        dispatcher = client.session._dispatcher
    except (AttributeError, RuntimeError):
        return True
    return bool(getattr(dispatcher, "_closed", False))


def is_connection_error(exc: BaseException) -> bool:
    from mcp.shared.exceptions import MCPError

    if isinstance(exc, MCPError):
        return getattr(exc, "code", None) == -32000  # CONNECTION_CLOSED
    return isinstance(exc, OSError | EOFError)


def first(exc: BaseException) -> BaseException:
    """The first exception inside `exc` (a task group raises a group of them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    exc = first(exc)
    if isinstance(exc, SandboxUnavailable | CommandMissing):
        return str(exc)  # bounded where it is made, and never cut: its end says how to fix it
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__
