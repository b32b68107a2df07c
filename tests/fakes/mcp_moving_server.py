"""A real MCP stdio server whose tools change while it runs, written with the `mcp` package.

    python tests/fakes/mcp_moving_server.py [--legacy] [--junk] [--crash-at-start]
    python tests/fakes/mcp_moving_server.py http PORT

Its tools: `note` (side effects, unannotated), `add(name, description)`, `drop(name)` and
`redescribe(name, description)`, which change its tool list and then say so
(`notifications/tools/list_changed`: on a `subscriptions/listen` stream at the 2026-07-28
protocol, on the connection at the 2025 one), `hang(seconds)`, which waits and writes down a
cancellation, and `junk(text)`, which writes `text` as a line of its own on stdout (not JSON-RPC)
before it answers. An added tool answers its own name.

Every call it receives is appended as one JSON line to the file named by `MCP_CALL_LOG` (when
set), with the request's `_meta` (so a test can read the trace context that came with it), and so
is each listing of its tools (`"tool": "tools/list"`).

`RECEIPT_KEY` (when set): `note` checks the approval receipt its request's `_meta` carries as a
downstream service would, with PyJWT and that key alone (its audience's key, not the harness's), and
writes down what it found (`receipt`: the claims and whether its own hash of the arguments matches,
or the error), with the names of its environment's variables (`environ`).

`--legacy`: it refuses the newest protocol's `server/discover` probe, as a 2025 server does, so
a client falls back to the `initialize` handshake. `--junk`: a line that is not JSON-RPC goes to
stdout before it serves. `--crash-at-start`: it writes a traceback to stderr (its last line in
terminal colours) and exits 1 before it reads anything, as a server written for `mcp` 1.x does under
`mcp` 2.x.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations


class _Moving(MCPServer):
    """Writes down each listing of its tools (`tools/list`), so a test sees the client list again."""

    async def list_tools(self) -> list[Any]:
        _log("tools/list", None)
        return await super().list_tools()


server = _Moving("moving")

# The wire itself: the SDK's stdio server points fd 1 at stderr while it serves (so that a stray
# print cannot break the protocol); a server of another SDK, or of none, writes junk on the wire.
WIRE = os.dup(1)


def _log(tool: str, ctx: Context | None, **entry: Any) -> None:
    path = os.environ.get("MCP_CALL_LOG")
    if not path:
        return
    meta = None
    if ctx is not None:
        meta = ctx.request_context.meta
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"tool": tool, "meta": meta, **entry}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


async def _changed(ctx: Context) -> None:
    """Say the tool list changed, the way each protocol era hears it."""
    await ctx.notify_tools_changed()  # 2026-07-28: to the client's subscriptions/listen stream
    await ctx.session.send_tool_list_changed()  # 2025: on the connection (dropped at 2026-07-28)


def _added(name: str) -> Any:
    def answer() -> str:
        _log(name, None)
        return f"I am {name}"

    return answer


RECEIPT_META = "io.github.slack-harness/approval-receipt"


def _receipt(ctx: Context, arguments: dict[str, Any]) -> dict[str, Any] | None:
    """What a careful service makes of the call's receipt: checked with its own key, then its hash."""
    key = os.environ.get("RECEIPT_KEY")
    if not key:
        return None
    import jwt

    token = (ctx.request_context.meta or {}).get(RECEIPT_META)
    if not token:
        return {"error": "no receipt"}
    try:
        claims = jwt.decode(token, key, algorithms=["HS256"], audience="mcp:moving", issuer="slack-harness")
    except jwt.PyJWTError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return {"claims": claims, "matches": hashlib.sha256(text.encode()).hexdigest() == claims["input_sha256"]}


@server.tool()
def note(text: str, ctx: Context) -> str:
    """Write a note down."""
    receipt = _receipt(ctx, {"text": text})
    if receipt is None:
        _log("note", ctx, text=text)
    else:
        _log("note", ctx, text=text, receipt=receipt, environ=sorted(os.environ))
    return f"noted {text}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def add(name: str, description: str, ctx: Context) -> str:
    """Add a tool named `name`."""
    _log("add", ctx, name=name)
    server.add_tool(_added(name), name=name, description=description)
    await _changed(ctx)
    return f"added {name}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def drop(name: str, ctx: Context) -> str:
    """Remove the tool named `name`."""
    _log("drop", ctx, name=name)
    server.remove_tool(name)
    await _changed(ctx)
    return f"dropped {name}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def redescribe(name: str, description: str, ctx: Context) -> str:
    """Give the tool named `name` a new description (its name stays)."""
    _log("redescribe", ctx, name=name)
    server._tool_manager._tools[name].description = description
    await _changed(ctx)
    return f"redescribed {name}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def flood(count: int, every: float, ctx: Context) -> str:
    """Say the tool list changed `count` times, `every` seconds apart (nothing changed)."""
    _log("flood", ctx, count=count)
    for _ in range(count):
        await _changed(ctx)
        await anyio.sleep(every)
    return f"said it {count} times"


@server.tool()
async def hang(seconds: float, ctx: Context) -> str:
    """Wait `seconds`; a cancellation that arrives meanwhile is written down."""
    _log("hang", ctx, seconds=seconds)
    try:
        await anyio.sleep(seconds)  # the behaviour under test: a call that takes too long
    except anyio.get_cancelled_exc_class():
        _log("hang", None, cancelled=True)
        raise
    return "done"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def junk(text: str, ctx: Context, count: int = 1) -> str:
    """Write `text` on the wire (its real stdout) as a line of its own, `count` times, outside
    JSON-RPC, then answer."""
    _log("junk", ctx, text=text)
    for _ in range(count):
        os.write(WIRE, text.encode() + b"\n")
    return "junk written"


@server.custom_route("/pid", methods=["GET"])
async def pid(_request: Any) -> Any:
    """Which process holds the port (`tests.mcp_support.HttpDesk` asks)."""
    from starlette.responses import PlainTextResponse

    return PlainTextResponse(str(os.getpid()))


def main() -> None:
    if sys.argv[1:2] == ["http"]:
        import uvicorn

        uvicorn.run(
            server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning"
        )
        return
    if "--crash-at-start" in sys.argv:
        sys.stderr.write(
            "Traceback (most recent call last):\n"
            '  File "/srv/old_server.py", line 3, in <module>\n'
            "    from mcp.server.fastmcp import FastMCP\n"
            "\x1b[31mModuleNotFoundError: No module named 'mcp.server.fastmcp'\x1b[0m\n"
        )
        sys.stderr.flush()
        sys.exit(1)
    if "--junk" in sys.argv:
        os.write(1, b"Starting moving server v1.0 \x1b[31m(not JSON-RPC)\x1b[0m\n")
    if "--legacy" in sys.argv:
        anyio.run(_serve_legacy)
        return
    server.run("stdio")


async def _serve_legacy() -> None:
    """Serve stdio as a 2025 server: `server/discover` is answered "method not found" before the
    server sees it (the client's first request would otherwise open the 2026-07-28 era)."""
    from mcp.server.stdio import stdio_server
    from mcp.shared.message import SessionMessage
    from mcp.types import METHOD_NOT_FOUND, ErrorData, JSONRPCError, JSONRPCRequest

    async with stdio_server() as (read_stream, write_stream):
        send, receive = anyio.create_memory_object_stream[Any](0)

        async def sieve() -> None:
            async with send:
                async for item in read_stream:
                    message = getattr(item, "message", None)
                    if isinstance(message, JSONRPCRequest) and message.method == "server/discover":
                        error = ErrorData(code=METHOD_NOT_FOUND, message="Method not found")
                        refusal = JSONRPCError(jsonrpc="2.0", id=message.id, error=error)
                        await write_stream.send(SessionMessage(refusal))
                        continue
                    await send.send(item)

        async with anyio.create_task_group() as group:
            group.start_soon(sieve)
            lowlevel = server._lowlevel_server
            await lowlevel.run(receive, write_stream, lowlevel.create_initialization_options())
            group.cancel_scope.cancel()


if __name__ == "__main__":
    main()
