"""MCP servers as tools: one warm session per server, kept by a hub for the life of the process.

The hub runs an asyncio loop on a thread of its own. Each configured server gets a supervisor
task that opens the session (a stdio child process or a streamable-HTTP connection), lists its
tools, and then watches it: a session that dies, at rest or in the middle of a call, is opened
again with backoff (0.5 s doubling to 30 s), and so is a server that could not start at all.
Nothing outside the hub ever starts a server; a call made while its server is away is answered
`is_error` naming the server, and nothing runs.

Callers on other threads use `listing()` and `call()`. A process that forks (RQ's work horse)
cannot use the hub's pipes or loop from the child: see `harness.tools.relay`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness import texts
from harness.config import ResolvedServer
from harness.policy import Tier
from harness.tools.base import RESULT_LIMIT_CHARS, Tool, ToolContext, ToolResult
from harness.tools.sandbox import Sandbox, StderrLog, read_stderr

log = logging.getLogger("harness.mcp")

SEPARATOR = "__"
# The Messages API's rule for a tool name.
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_MAX_NAME = 128
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_MAX_IMAGE_BASE64 = 5 * 1024 * 1024 * 4 // 3  # the API's 5 MB per image, as base64
_MAX_IMAGES = 8
_BACKOFF_FIRST, _BACKOFF_MAX = 0.5, 30.0

# Held while a stdio server's process is being spawned. A process that also forks (an RQ worker
# forking a work horse per job) takes it around every fork (`guard_forks`): a fork made while
# `subprocess` waits on the spawn's error pipe would copy that pipe's write end into the work
# horse, and the spawn, and with it the hub's whole loop (the relay included), would wait until
# the horse exited. Reentrant: the loop thread may spawn two servers' processes at once.
SPAWNING = threading.RLock()


def guard_forks() -> None:
    """Make every later `os.fork` of this process wait for a stdio spawn in progress (`SPAWNING`)."""
    os.register_at_fork(
        before=SPAWNING.acquire, after_in_parent=SPAWNING.release, after_in_child=SPAWNING.release
    )


_LIVENESS_SECONDS = 0.5
_GRACE_SECONDS = 5.0


# --- what a server offers, as plain data (crosses the relay as JSON) -------------------------


@dataclass(frozen=True)
class McpTool:
    """One tool of one server, as listed."""

    server: str
    name: str
    description: str
    input_schema: Mapping[str, Any]
    title: str | None = None
    annotations: Mapping[str, Any] = field(default_factory=dict)

    @property
    def qualified(self) -> str:
        return f"{self.server}{SEPARATOR}{self.name}"

    @property
    def read_only(self) -> bool:
        """`readOnlyHint: true` and not `destructiveHint: true`: the contract's step 3 allow."""
        return (
            self.annotations.get("readOnlyHint") is True
            and self.annotations.get("destructiveHint") is not True
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "name": self.name,
            "description": self.description,
            "input_schema": dict(self.input_schema),
            "title": self.title,
            "annotations": dict(self.annotations),
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
        )


@dataclass(frozen=True)
class Listing:
    """The tools of every server that is up, and why each server that is not is away."""

    tools: tuple[McpTool, ...] = ()
    away: Mapping[str, str] = field(default_factory=dict)  # server -> reason
    timeouts: Mapping[str, float] = field(default_factory=dict)  # server -> call timeout (s)

    def to_json(self) -> dict[str, Any]:
        return {
            "tools": [t.to_json() for t in self.tools],
            "away": dict(self.away),
            "timeouts": dict(self.timeouts),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Listing:
        return cls(
            tools=tuple(McpTool.from_json(t) for t in data["tools"]),
            away=dict(data["away"]),
            timeouts={k: float(v) for k, v in data["timeouts"].items()},
        )


class McpHost(Protocol):
    """What tools need of MCP: the current listing, and a call (the hub itself, or its relay)."""

    def listing(self) -> Listing: ...

    def call(self, server: str, tool: str, arguments: dict[str, Any], side_effects: bool) -> ToolResult: ...


def tools_of(host: McpHost, listing: Listing) -> list[Tool]:
    """Each listed MCP tool as a `Tool` that calls through `host`."""
    return [_as_tool(host, t, listing.timeouts.get(t.server, 60.0)) for t in listing.tools]


def _as_tool(host: McpHost, info: McpTool, timeout: float) -> Tool:
    side_effects = not info.read_only  # fail safe: an unannotated tool may change the world

    def call(_ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        return host.call(info.server, info.name, arguments, side_effects)

    return Tool(
        name=info.qualified,
        description=info.description or info.title or info.name,
        input_schema=info.input_schema,
        call=call,
        side_effects=side_effects,
        own_tier=Tier.ALLOW if info.read_only else None,
        own_tier_why=texts.WHY_MCP_READ_ONLY if info.read_only else "",
        title=info.title,
        annotations=info.annotations,
        timeout_seconds=timeout,
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
    return 1 <= len(name) <= _MAX_NAME and set(name) <= _NAME_CHARS


# --- the hub ---------------------------------------------------------------------------------


@dataclass
class _Server:
    resolved: ResolvedServer
    client: Any = None  # an open `mcp.Client` while up
    tools: tuple[McpTool, ...] = ()
    reason: str = "not started yet"
    broken: asyncio.Event = field(default_factory=asyncio.Event)
    tried: threading.Event = field(default_factory=threading.Event)  # first attempt over

    @property
    def name(self) -> str:
        return self.resolved.config.name


class McpHub:
    """Warm sessions to every configured MCP server, on a loop thread of the hub's own."""

    def __init__(self, servers: Sequence[ResolvedServer], *, hidden: Sequence[str] = ()) -> None:
        """`hidden`: directories no stdio server may see into (the relay's; `harness.tools.sandbox`)."""
        self._servers = {s.config.name: _Server(s) for s in servers}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-hub", daemon=True)
        self._lock = threading.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._sandbox = Sandbox(hidden=tuple(hidden))

    @property
    def server_names(self) -> tuple[str, ...]:
        return tuple(self._servers)

    def start(self, wait_seconds: float = 20.0) -> McpHub:
        """Start every server; return once each is up or has failed its first try (or after `wait`)."""
        self._thread.start()

        async def launch() -> None:
            for server in self._servers.values():
                self._tasks.append(asyncio.ensure_future(self._supervise(server)))

        asyncio.run_coroutine_threadsafe(launch(), self._loop).result()
        deadline = time.monotonic() + wait_seconds
        for server in self._servers.values():
            server.tried.wait(max(0.0, deadline - time.monotonic()))
        return self

    def close(self) -> None:
        """Close every session (a stdio server's process ends with it) and stop the loop."""
        if not self._thread.is_alive():
            return

        async def stop() -> None:
            # Every task: the supervisors (their sessions close, a stdio server exits) and any
            # relay connection still open, so none is left for the garbage collector mid-await.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        with suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> McpHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def listing(self) -> Listing:
        with self._lock:
            tools: list[McpTool] = []
            away: dict[str, str] = {}
            for server in self._servers.values():
                if server.client is not None:
                    tools.extend(server.tools)
                else:
                    away[server.name] = server.reason
            timeouts = {s.name: s.resolved.config.timeout_seconds for s in self._servers.values()}
        return Listing(tuple(tools), away, timeouts)

    def submit(self, coro: Any) -> Any:
        """Run `coro` on the hub's loop; a `concurrent.futures.Future` of its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def call_async(
        self, server: str, tool: str, arguments: dict[str, Any], side_effects: bool
    ) -> ToolResult:
        """`call`, for code already on the hub's loop (the relay)."""
        found = self._servers.get(server)
        if found is None:
            reason = "not configured"
            return ToolResult(texts.MCP_SERVER_AWAY.format(server=server, name=tool, reason=reason), True)
        return await self._call(found, tool, arguments, side_effects)

    def call(self, server: str, tool: str, arguments: dict[str, Any], side_effects: bool) -> ToolResult:
        """Call `tool` on `server`; every failure is an `is_error` result, never an exception."""
        found = self._servers.get(server)
        if found is None:
            return ToolResult(
                texts.MCP_SERVER_AWAY.format(server=server, name=tool, reason="not configured"), True
            )
        timeout = found.resolved.config.timeout_seconds
        future = asyncio.run_coroutine_threadsafe(
            self._call(found, tool, arguments, side_effects), self._loop
        )
        try:
            return future.result(timeout + _GRACE_SECONDS)
        except FutureTimeout:
            future.cancel()
            return _timed_out(server, tool, timeout, side_effects)

    # --- on the loop ---

    async def _supervise(self, server: _Server) -> None:
        delay = _BACKOFF_FIRST
        while True:
            try:
                async with self._open(server.resolved) as client:
                    tools = await _list_tools(client, server.name)
                    with self._lock:
                        server.client, server.tools, server.reason = client, tools, ""
                    server.broken.clear()
                    server.tried.set()
                    delay = _BACKOFF_FIRST
                    log.info("MCP server %s is up: %d tools", server.resolved.config.describe(), len(tools))
                    await self._watch(server, client)
                    reason = server.reason or "the session ended"
            except asyncio.CancelledError:
                with self._lock:
                    server.client = None
                raise
            except BaseException as exc:  # noqa: BLE001 - whatever a server does, the hub goes on
                reason = _describe(exc)
            with self._lock:
                server.client, server.tools, server.reason = None, (), reason
            server.tried.set()
            log.warning(
                "MCP server %s is not reachable (%s); trying again in %.1f s",
                server.resolved.config.describe(),
                reason,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX)

    async def _watch(self, server: _Server, client: Any) -> None:
        """Return once the session is known to be dead: a call saw it, or it closed at rest."""
        while not server.broken.is_set():
            if _closed(client):
                server.reason = "the session closed (the server exited?)"
                return
            with suppress(TimeoutError):
                await asyncio.wait_for(server.broken.wait(), _LIVENESS_SECONDS)

    def _open(self, resolved: ResolvedServer) -> AbstractAsyncContextManager[Any]:
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        config = resolved.config
        if config.command is not None:
            return Client(_StdioTransport(resolved, self._sandbox))
        assert config.url is not None
        http = create_mcp_http_client(headers=dict(resolved.headers) or None)
        return Client(_HttpTransport(config.url, http, streamable_http_client))

    async def _call(
        self, server: _Server, tool: str, arguments: dict[str, Any], side_effects: bool
    ) -> ToolResult:
        client = server.client
        qualified = f"{server.name}{SEPARATOR}{tool}"
        if client is None or _closed(client):
            server.broken.set()
            reason = server.reason or "the session closed"
            return ToolResult(
                texts.MCP_SERVER_AWAY.format(server=server.name, name=qualified, reason=reason), True
            )
        timeout = server.resolved.config.timeout_seconds
        try:
            result = await asyncio.wait_for(client.call_tool(tool, arguments), timeout)
        except TimeoutError:
            return _timed_out(server.name, tool, timeout, side_effects)
        except Exception as exc:
            if _closed(client) or _is_connection_error(exc):
                server.reason = f"the connection broke during a call of {tool}"
                server.broken.set()  # the supervisor opens it again
                text = texts.MCP_LOST_OUTCOME_UNKNOWN if side_effects else texts.MCP_LOST
                return ToolResult(text.format(server=server.name, name=qualified), True)
            return ToolResult(texts.MCP_CALL_FAILED.format(name=qualified, error=_describe(exc)), True)
        return convert_result(result)


def _timed_out(server: str, tool: str, seconds: float, side_effects: bool) -> ToolResult:
    text = texts.RESULT_TIMED_OUT_OUTCOME_UNKNOWN if side_effects else texts.RESULT_TIMED_OUT
    return ToolResult(text.format(name=f"{server}{SEPARATOR}{tool}", seconds=seconds), True)


class _StdioTransport:
    """`stdio_client` as a `Transport`: the server confined by the sandbox, its stderr logged as data."""

    def __init__(self, resolved: ResolvedServer, sandbox: Sandbox) -> None:
        self._resolved, self._sandbox = resolved, sandbox
        self._cm: Any = None
        self._stderr: StderrLog | None = None

    async def __aenter__(self) -> Any:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        config = self._resolved.config
        assert config.command is not None
        # Entering spawns the process and sets up its pipes, the stderr one included; no await
        # waits on others. A fork meanwhile would copy the pipes' ends (see SPAWNING).
        with SPAWNING:
            confined = self._sandbox.confine(config.command, config.args, self._resolved.env, config.cwd)
            params = StdioServerParameters(
                command=confined.command, args=list(confined.args), env=dict(confined.env), cwd=config.cwd
            )
            read_end, write_end = os.pipe()
            try:
                with open(write_end, "w", encoding="utf-8") as errlog:  # the server holds its own copy
                    self._cm = stdio_client(params, errlog=errlog)
                    streams = await self._cm.__aenter__()
            except BaseException:
                os.close(read_end)
                raise
        try:
            self._stderr = await read_stderr(config.name, read_end)
        except BaseException:
            await self._cm.__aexit__(None, None, None)
            raise
        return streams

    async def __aexit__(self, *exc: Any) -> Any:
        try:
            return await self._cm.__aexit__(*exc)
        finally:
            if self._stderr is not None:
                await self._stderr.close(wait=1.0)  # the server is gone: read what it left


class _HttpTransport:
    """`streamable_http_client` over an HTTP client that carries the server's headers (its secrets)."""

    def __init__(self, url: str, http: Any, connect: Any) -> None:
        self._http = http
        self._cm = connect(url, http_client=http)

    async def __aenter__(self) -> Any:
        await self._http.__aenter__()
        try:
            return await self._cm.__aenter__()
        except BaseException:
            await self._http.__aexit__(None, None, None)
            raise

    async def __aexit__(self, *exc: Any) -> Any:
        try:
            return await self._cm.__aexit__(*exc)
        finally:
            await self._http.__aexit__(None, None, None)


async def _list_tools(client: Any, server: str) -> tuple[McpTool, ...]:
    found: list[McpTool] = []
    cursor = None
    for _ in range(100):  # pages; a server that pages forever is cut off
        page = await client.list_tools(cursor=cursor)
        for tool in page.tools:
            annotations = (
                tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}
            )
            info = McpTool(
                server=server,
                name=tool.name,
                description=tool.description or "",
                input_schema=tool.input_schema,
                title=tool.title or annotations.get("title"),
                annotations=annotations,
            )
            if not valid_tool_name(info.qualified):
                log.warning(
                    "MCP server %s: tool %r is not offered: %r breaks the API's tool-name rule "
                    "(1-128 characters of a-z, A-Z, 0-9, _ and -)",
                    server,
                    tool.name,
                    info.qualified,
                )
                continue
            found.append(info)
        cursor = page.next_cursor
        if not cursor:
            break
    return tuple(found)


def _closed(client: Any) -> bool:
    """Whether the session's connection is known to be closed.

    The SDK keeps this on its dispatcher (`_closed`, set when the read stream ends); read
    defensively, since it is not public: unknown reads as open, and a call then finds out.
    """
    try:
        dispatcher = client.session._dispatcher
    except (AttributeError, RuntimeError):
        return True
    return bool(getattr(dispatcher, "_closed", False))


def _is_connection_error(exc: BaseException) -> bool:
    from mcp.shared.exceptions import MCPError

    if isinstance(exc, MCPError):
        return getattr(exc, "code", None) == -32000  # CONNECTION_CLOSED
    return isinstance(exc, OSError | EOFError)


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


# --- results ---------------------------------------------------------------------------------


def convert_result(result: Any) -> ToolResult:
    """An MCP `CallToolResult` as a `tool_result`: text as text, images as images, cut to fit.

    `structuredContent` becomes JSON text when no text came with it; `isError` is `is_error`.
    """
    blocks: list[dict[str, Any]] = []
    images = 0
    for item in result.content:
        kind = getattr(item, "type", "")
        if kind == "text":
            blocks.append({"type": "text", "text": item.text})
        elif kind == "image" and item.mime_type in _IMAGE_TYPES and len(item.data) <= _MAX_IMAGE_BASE64:
            if images < _MAX_IMAGES:
                images += 1
                source = {"type": "base64", "media_type": item.mime_type, "data": item.data}
                blocks.append({"type": "image", "source": source})
            else:
                blocks.append({"type": "text", "text": texts.MCP_IMAGE_DROPPED.format(why="too many images")})
        elif kind == "image":
            why = f"{item.mime_type}, {len(item.data):,} base64 characters"
            blocks.append({"type": "text", "text": texts.MCP_IMAGE_DROPPED.format(why=why)})
        elif kind == "resource":
            resource = item.resource
            body = getattr(resource, "text", None)
            text = body if body is not None else texts.MCP_BLOB_RESOURCE.format(uri=resource.uri)
            blocks.append({"type": "text", "text": f"[resource {resource.uri}]\n{text}"})
        elif kind == "resource_link":
            blocks.append({"type": "text", "text": f"[resource link: {item.name} {item.uri}]"})
        else:
            blocks.append({"type": "text", "text": texts.MCP_CONTENT_DROPPED.format(kind=kind or "unknown")})
    has_text = any(b["type"] == "text" for b in blocks)
    if not has_text and result.structured_content is not None:
        blocks.insert(0, {"type": "text", "text": json.dumps(result.structured_content, ensure_ascii=False)})
    blocks = _cut_blocks(blocks)
    is_error = bool(result.is_error)
    if all(b["type"] == "text" for b in blocks):
        return ToolResult("\n".join(b["text"] for b in blocks) or texts.MCP_EMPTY_RESULT, is_error)
    return ToolResult(blocks, is_error)


def _cut_blocks(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Text blocks cut so that all of them together stay within `RESULT_LIMIT_CHARS`."""
    budget = RESULT_LIMIT_CHARS
    total = sum(len(b["text"]) for b in blocks if b["type"] == "text")
    if total <= budget:
        return blocks
    out = []
    for block in blocks:
        if block["type"] != "text":
            out.append(block)
            continue
        if budget <= 0:
            continue
        text = block["text"]
        budget -= len(text)
        if budget < 0:
            text = text[: len(text) + budget] + texts.RESULT_CUT.format(total=total, kept=RESULT_LIMIT_CHARS)
        out.append({"type": "text", "text": text})
    return out
