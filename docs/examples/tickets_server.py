"""A tiny MCP server for docs/examples/company.toml: a ticket desk kept in memory.

    python docs/examples/tickets_server.py     # speaks MCP over stdio

Three tools, annotated as a real desk would: `search` only reads, `create` adds a ticket,
`close` closes one (destructive). It holds no secret and reaches nothing; it is here so that
`python -m harness --list-tools --channel C0OPS` has a real server to list.
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

desk = MCPServer("tickets")
TICKETS: dict[str, str] = {"T-1": "disk full on db-2 (open)"}


@desk.tool(annotations=ToolAnnotations(readOnlyHint=True))
def search(text: Annotated[str, Field(description="Words to look for")]) -> str:
    """Find tickets whose summary holds `text`."""
    found = [f"{key}: {summary}" for key, summary in TICKETS.items() if text.lower() in summary.lower()]
    return "\n".join(found) or "no ticket matches"


@desk.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
def create(summary: Annotated[str, Field(description="One line saying what is wrong")]) -> str:
    """Open a ticket."""
    key = f"T-{len(TICKETS) + 1}"
    TICKETS[key] = f"{summary} (open)"
    return f"opened {key}"


@desk.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def close(key: Annotated[str, Field(description="The ticket, like T-1")]) -> str:
    """Close a ticket."""
    if key not in TICKETS:
        return f"no ticket {key}"
    TICKETS[key] = TICKETS[key].replace("(open)", "(closed)")
    return f"closed {key}"


if __name__ == "__main__":
    desk.run("stdio")
