"""A real MCP server for the tests, written with the `mcp` package's server API.

    python tests/fakes/mcp_server.py stdio
    python tests/fakes/mcp_server.py http PORT
    python tests/fakes/mcp_server.py http-sessions PORT

It keeps a ticket desk: read-only, destructive and unannotated tools, one that raises, one
that is slow, one that kills its own process, one that returns an image and one that returns
only structured content. Every call it receives is appended as one JSON line to the file named
by `MCP_CALL_LOG` (when set), so a test can tell exactly what reached the server. Over HTTP,
`MCP_REQUIRED_TOKEN` (when set) must come as `Authorization: Bearer …` or the request is refused.

`http-sessions` refuses the newest protocol's `server/discover` probe (as servers of the 2025
protocol do), so a client falls back to the `initialize` handshake and gets a session id: an
unknown id then answers 404, as the spec says. A session's DELETE is written to the file named by
`MCP_HTTP_LOG` (when set). `research` is listed as needing to run as a task
(`execution.taskSupport: "required"`) and answers at once all the same; `bad_schema`, which a
client must not offer, has an invalid inputSchema.
`MCP_ALWAYS_ASK` (comma-separated tool names, when set): those tools' `_meta` says
`anthropic/requiresUserInteraction: true`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.types import Tool, ToolAnnotations, ToolExecution
from pydantic import Field


class _Desk(MCPServer):
    """The desk, with the two tools whose listing the SDK's decorator cannot spell."""

    async def list_tools(self) -> list[Tool]:
        tools = await super().list_tools()
        for tool in tools:
            if tool.name == "research":
                tool.execution = ToolExecution(task_support="required")
            elif tool.name == "bad_schema":
                tool.input_schema = {"type": "object", "properties": {"n": {"type": "a-number-please"}}}
            if tool.name in os.environ.get("MCP_ALWAYS_ASK", "").split(","):
                tool.meta = {**(tool.meta or {}), "anthropic/requiresUserInteraction": True}
        return tools


desk = _Desk("tickets")

# A 1x1 transparent PNG.
PIXEL = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
).decode()


# Which process answered: its pid alone does not say, since a stdio server runs in a PID namespace
# of its own (harness/tools/sandbox.py) and every one started there has the same pid.
PROCESS = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _log(tool: str, arguments: dict[str, Any]) -> None:
    path = os.environ.get("MCP_CALL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"tool": tool, "arguments": arguments, "pid": PROCESS}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


@desk.tool(title="Look up a ticket", annotations=ToolAnnotations(readOnlyHint=True))
def get_ticket(id: Annotated[str, Field(description="Ticket id, like T-1")]) -> str:
    """Read one ticket."""
    _log("get_ticket", {"id": id})
    return f"{id}: printer on fire (open)"


@desk.tool(
    title="Close a ticket",
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True),
)
def close_ticket(id: str, reason: str = "") -> str:
    """Close a ticket, with a reason."""
    _log("close_ticket", {"id": id, "reason": reason})
    return f"closed {id}"


@desk.tool(annotations=ToolAnnotations(destructiveHint=True))
def delete_ticket(id: str) -> str:
    """Delete a ticket for good."""
    _log("delete_ticket", {"id": id})
    return f"deleted {id}"


@desk.tool()
def comment(id: str, text: str) -> str:
    """Add a comment to a ticket (no annotations: the harness must assume side effects)."""
    _log("comment", {"id": id, "text": text})
    return f"commented on {id}"


@desk.tool(annotations=ToolAnnotations(readOnlyHint=True, destructiveHint=True))
def odd_hints() -> str:
    """Says it is read-only AND destructive: not to be trusted as read-only."""
    _log("odd_hints", {})
    return "odd"


@desk.tool(annotations=ToolAnnotations(readOnlyHint=True))
def explode() -> str:
    """Always raises."""
    _log("explode", {})
    raise RuntimeError("the ticket desk is on fire")


@desk.tool(annotations=ToolAnnotations(readOnlyHint=True))
def slow(seconds: float) -> str:
    """Takes `seconds` to answer."""
    _log("slow", {"seconds": seconds})
    time.sleep(seconds)  # the behaviour under test (a tool that takes long), not synchronisation
    return f"slept {seconds}"


@desk.tool()
def crash() -> str:
    """Kills the server's own process mid-call (after logging the call)."""
    _log("crash", {})
    os._exit(7)


@desk.tool(annotations=ToolAnnotations(readOnlyHint=True))
def picture() -> list[Any]:
    """A caption and a one-pixel image."""
    from mcp.types import ImageContent, TextContent

    _log("picture", {})
    return [
        TextContent(type="text", text="a pixel"),
        ImageContent(type="image", data=PIXEL, mimeType="image/png"),
    ]


@desk.tool(annotations=ToolAnnotations(readOnlyHint=True))
def stats() -> Any:
    """Only structured content, no text."""
    from mcp.types import CallToolResult

    _log("stats", {})
    return CallToolResult(content=[], structuredContent={"open": 3, "closed": 9})


@desk.tool(annotations=ToolAnnotations(readOnlyHint=True))
def flood(chars: int) -> str:
    """Returns `chars` characters."""
    _log("flood", {"chars": chars})
    return "x" * chars


@desk.tool(annotations=ToolAnnotations(readOnlyHint=True))
def env_seen(name: str) -> str:
    """Whether the server's environment has `name` (never its value)."""
    _log("env_seen", {"name": name})
    return "set" if os.environ.get(name) else "unset"


@desk.tool(name="tickets.export", annotations=ToolAnnotations(readOnlyHint=True))
def export() -> str:
    """A name MCP allows but the Messages API does not (the dot): never offered to the model."""
    _log("tickets.export", {})
    return "exported"


@desk.tool(annotations=ToolAnnotations(readOnlyHint=True))
def research(topic: str) -> str:
    """Listed as needing a task; this server answers it at once, whether called as one or not."""
    _log("research", {"topic": topic})
    return f"researched {topic}"


@desk.tool(annotations=ToolAnnotations(readOnlyHint=True))
def bad_schema(n: int = 0) -> str:
    """Listed with an inputSchema that is not a valid JSON schema."""
    _log("bad_schema", {"n": n})
    return f"n={n}"


def _http_app(port: int, sessions: bool) -> Any:
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.responses import PlainTextResponse

    app = desk.streamable_http_app()
    token = os.environ.get("MCP_REQUIRED_TOKEN")
    forgetful = bool(os.environ.get("MCP_FORGET_SESSIONS"))  # every session forgotten at its first call

    async def check(request: Any, call_next: Any) -> Any:
        if request.method == "GET" and request.url.path == "/pid":  # which process holds the port
            return PlainTextResponse(str(os.getpid()))
        if token and request.headers.get("authorization") != f"Bearer {token}":
            return PlainTextResponse("unauthorized", status_code=401)
        if sessions and request.method == "POST" and b'"server/discover"' in await request.body():
            return PlainTextResponse("unknown method", status_code=400)  # a 2025 server's answer
        forgotten = forgetful and request.method == "POST" and request.headers.get("mcp-session-id")
        if forgotten and b'"tools/call"' in await request.body():  # as if it had restarted since
            return PlainTextResponse("session not found", status_code=404)
        hold = os.environ.get("MCP_HOLD_INITIALIZE")  # a session's opening waits while this file is
        if hold and request.method == "POST" and b'"initialize"' in await request.body():
            while os.path.exists(hold):
                Path(hold + ".held").touch()  # the test sees the opening held
                await asyncio.sleep(0.02)
        if request.method == "DELETE" and os.environ.get("MCP_HTTP_LOG"):
            with open(os.environ["MCP_HTTP_LOG"], "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"delete": request.headers.get("mcp-session-id")}) + "\n")
        return await call_next(request)

    app.add_middleware(BaseHTTPMiddleware, dispatch=check)
    return app


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "stdio":
        desk.run("stdio")
        return
    import uvicorn

    port = int(sys.argv[2])
    uvicorn.run(
        _http_app(port, sessions=mode == "http-sessions"), host="127.0.0.1", port=port, log_level="warning"
    )


if __name__ == "__main__":
    main()
