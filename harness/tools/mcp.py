"""MCP servers as tools: one warm session per server, kept by a hub for the life of the process.

The hub runs an asyncio loop on a thread of its own. Each configured server gets a supervisor
task that opens the session (a stdio child process or a streamable-HTTP connection), lists its
tools, and then watches it: a session that dies, at rest or in the middle of a call, is opened
again with backoff (0.5 s doubling to 30 s), and so is a server that could not start at all.
Nothing outside the hub ever starts a server; a call made while its server is away is answered
`is_error` naming the server, and nothing runs.

A streamable-HTTP server that forgot its session (it restarted, or the session expired: 404 for
the session id, as the spec has it, or 400 as some servers answer) is given a new session at once,
and a call it refused is sent once more on the new one: the server ran nothing on the old id.
Closing the hub ends each session as the spec asks (an HTTP session gets its DELETE).

Callers on other threads use `listing()` and `call()`. A process that forks (RQ's work horse)
cannot use the hub's pipes or loop from the child: see `harness.tools.relay`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness import texts
from harness.config import ResolvedServer
from harness.policy import Tier
from harness.tools.base import Tool, ToolContext, ToolResult
from harness.tools.mcp_bounds import bound_stdio_reads, convert_result
from harness.tools.sandbox import Sandbox, SandboxUnavailable, Server, StderrLog, read_stderr
from harness.tools.schemas import input_checker, schema_problem

log = logging.getLogger("harness.mcp")

SEPARATOR = "__"
REQUIRES_INTERACTION = "anthropic/requiresUserInteraction"  # the `_meta` key of a tool that always asks
# The Messages API's rule for a tool name: a name that breaks it makes every request refused.
TOOL_NAME_RULE = "^[a-zA-Z0-9_-]{1,64}$"
_TOOL_NAME = re.compile(TOOL_NAME_RULE)
_NAMED_MAX = 20  # tools named in the one log line that says which were left out
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
# How long a call waits for the new session of a server that forgot its old one.
_RECOVER_SECONDS = 10.0
# A forgotten session is opened again at once. When that new session is forgotten too before it
# answered a call or lived this long (a server that refuses every session), the hub backs off as
# from a server that is down.
_STEADY_SECONDS = 2.0
# How long closing waits for the sessions to end gracefully before it cancels what is left.
_CLOSE_SECONDS = 5.0
_SESSION_HEADER = "mcp-session-id"
# An HTTP session at rest is pinged this often, so a server that restarted is noticed without a call.
_PING_SECONDS = 15.0
_PING_TIMEOUT_SECONDS = 10.0


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
    # `trust_annotations` of its server: whether `claims_read_only` may be believed.
    trusted: bool = False
    # Its `_meta` says `anthropic/requiresUserInteraction: true`: every call asks a person.
    requires_interaction: bool = False

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

    def call(_ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        return host.call(info.server, info.name, arguments, side_effects)

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


# --- the hub ---------------------------------------------------------------------------------


@dataclass
class _SessionGuard:
    """Watches one HTTP connection's responses for the server refusing its session id.

    Per the spec a server that no longer knows a session answers 404 and the client must start a
    new one; some servers answer a POST with 400 instead. Either way the request was refused
    before anything ran. A GET (the SDK's listening stream) counts on 404 only: a server without
    that stream may answer it 400.
    """

    on_refused: Callable[[_SessionGuard], None]
    refused: bool = False
    # The server gave a session id (the 2025 protocol; the newest one has no sessions to lose).
    has_session: bool = False

    async def response(self, response: Any) -> None:
        """An HTTP client response hook."""
        self.has_session = self.has_session or bool(response.headers.get(_SESSION_HEADER))
        request = response.request
        if not request.headers.get(_SESSION_HEADER) or request.method == "DELETE":
            return
        status = response.status_code
        if (status == 404 or (status == 400 and request.method == "POST")) and not self.refused:
            self.refused = True
            self.on_refused(self)


@dataclass
class _Server:
    resolved: ResolvedServer
    client: Any = None  # an open `mcp.Client` while up
    tools: tuple[McpTool, ...] = ()
    reason: str = "not started yet"
    broken: asyncio.Event = field(default_factory=asyncio.Event)
    tried: threading.Event = field(default_factory=threading.Event)  # first attempt over
    up: asyncio.Event = field(default_factory=asyncio.Event)  # `client` is usable
    guard: _SessionGuard | None = None  # the current HTTP connection's
    recovering: bool = False  # the server forgot the session: a new one is being opened now
    served: bool = False  # the current session answered a call (the server does keep sessions)

    def lose(self, reason: str, *, recovering: bool = False) -> None:
        """The session is dead: calls stop using it, and the supervisor opens another."""
        self.reason, self.recovering = reason, recovering
        self.up.clear()
        self.broken.set()

    @property
    def name(self) -> str:
        return self.resolved.config.name


class McpHub:
    """Warm sessions to every configured MCP server, on a loop thread of the hub's own."""

    def __init__(
        self, servers: Sequence[ResolvedServer], *, hidden: Sequence[str] = (), state_dir: str | None = None
    ) -> None:
        """`hidden`: directories no stdio server may see into (the relay's; `harness.tools.sandbox`);
        `state_dir`: where stdio servers' own directories are kept (`harness.tools.walls`)."""
        bound_stdio_reads()  # what a server sends is read in linear time, up to a limit
        self._servers = {s.config.name: _Server(s) for s in servers}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-hub", daemon=True)
        self._lock = threading.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._sandbox = Sandbox(hidden=tuple(hidden), state_dir=state_dir)
        self._stopping = asyncio.Event()

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
            # First the supervisors leave their sessions the way the spec asks (an HTTP session
            # gets its DELETE, a stdio server its closed stdin): a cancelled one sends nothing.
            self._stopping.set()
            for server in self._servers.values():
                server.lose("the hub is closing")
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=_CLOSE_SECONDS)
            # Then every task left: a supervisor that did not finish, and any relay connection
            # still open, so none is left for the garbage collector mid-await.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        with suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._sandbox.close()

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
        reopened = False  # this session replaces one the server forgot
        while not self._stopping.is_set():
            steady, lost = False, ""
            try:
                # Leaving this block ends the session gracefully (an HTTP session's DELETE is sent).
                async with self._open(server) as client:
                    tools = await _list_tools(client, server.name, server.resolved.config.trust_annotations)
                    with self._lock:
                        server.client, server.tools, server.reason = client, tools, ""
                    server.broken.clear()
                    server.recovering = server.served = False
                    server.up.set()
                    server.tried.set()
                    delay = _BACKOFF_FIRST
                    log.info("MCP server %s is up: %d tools", server.resolved.config.describe(), len(tools))
                    opened = time.monotonic()
                    await self._watch(server, client)
                    steady = server.served or time.monotonic() - opened >= _STEADY_SECONDS
                    reason = lost = server.reason or "the session ended"
                    server.up.clear()
            except asyncio.CancelledError:
                server.up.clear()
                with self._lock:
                    server.client = None
                raise
            except BaseException as exc:  # noqa: BLE001 - whatever a server does, the hub goes on
                reason = lost or _describe(exc)  # why a session was lost, not how its closing failed
            recovering, server.recovering = server.recovering and (steady or not reopened), False
            server.up.clear()
            with self._lock:
                server.client, server.tools, server.reason = None, (), reason
            server.tried.set()
            if self._stopping.is_set():
                return
            if recovering:  # the server is there, it only forgot the session: a new one now
                log.info(
                    "MCP server %s: %s; opening a new session", server.resolved.config.describe(), reason
                )
                server.recovering = True  # calls wait for it rather than answer "away"
                reopened = True
                continue
            reopened = False
            log.warning(
                "MCP server %s is not reachable (%s); trying again in %.1f s",
                server.resolved.config.describe(),
                reason,
                delay,
            )
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            delay = min(delay * 2, _BACKOFF_MAX)

    async def _watch(self, server: _Server, client: Any) -> None:
        """Return once the session is known to be dead: a call saw it, or it closed at rest.

        A stdio session closes with its process; an HTTP one does not notice that its server
        restarted until a request is refused, so one with a session id (the 2025 protocol) is
        pinged now and then while it rests.
        """
        loop = asyncio.get_running_loop()
        next_ping = loop.time() + _PING_SECONDS
        while not server.broken.is_set():
            if _closed(client):
                server.reason = "the session closed (the server exited?)"
                return
            if server.guard is not None and server.guard.has_session and loop.time() >= next_ping:
                await self._ping(server, client)
                next_ping = loop.time() + _PING_SECONDS
            with suppress(TimeoutError):
                await asyncio.wait_for(server.broken.wait(), _LIVENESS_SECONDS)

    async def _ping(self, server: _Server, client: Any) -> None:
        """Ping an HTTP session; one the server refused or did not answer is opened again."""
        try:
            await asyncio.wait_for(client.session.send_ping(), _PING_TIMEOUT_SECONDS)
        except Exception as exc:  # a refused session was already marked by its guard
            if not server.broken.is_set():
                server.lose(f"it did not answer a ping ({_describe(exc)})")

    def _open(self, server: _Server) -> AbstractAsyncContextManager[Any]:
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        resolved = server.resolved
        config = resolved.config
        if config.command is not None:
            server.guard = None
            return Client(_StdioTransport(resolved, self._sandbox))
        assert config.url is not None
        http = create_mcp_http_client(headers=dict(resolved.headers) or None)
        guard = server.guard = _SessionGuard(lambda refused: self._refused(server, refused))
        hooks = http.event_hooks
        http.event_hooks = {**hooks, "response": [*hooks.get("response", []), guard.response]}
        return Client(_HttpTransport(config.url, http, streamable_http_client))

    def _refused(self, server: _Server, guard: _SessionGuard) -> None:
        """The server refused the session of `guard`'s connection: open a new one now."""
        if server.guard is guard and not self._stopping.is_set():
            server.lose("the server no longer knows the session (it restarted?)", recovering=True)

    async def _session(self, server: _Server, deadline: float) -> tuple[Any, _SessionGuard | None]:
        """The server's usable session and its guard; (None, None) when it is away.

        While a forgotten session is being replaced, wait for the new one (within `deadline`).
        """
        if server.recovering and not server.up.is_set():
            wait = min(deadline - asyncio.get_running_loop().time(), _RECOVER_SECONDS)
            with suppress(TimeoutError):
                await asyncio.wait_for(server.up.wait(), max(0.0, wait))
        client = server.client
        if client is not None and _closed(client):
            server.lose("the session closed (the server exited?)")
        if client is None or not server.up.is_set():
            return None, None
        return client, server.guard

    async def _call(
        self, server: _Server, tool: str, arguments: dict[str, Any], side_effects: bool
    ) -> ToolResult:
        qualified = f"{server.name}{SEPARATOR}{tool}"
        timeout = server.resolved.config.timeout_seconds
        deadline = asyncio.get_running_loop().time() + timeout
        for attempt in (1, 2):
            client, guard = await self._session(server, deadline)
            if client is None:
                reason = server.reason or "the session closed"
                return ToolResult(
                    texts.MCP_SERVER_AWAY.format(server=server.name, name=qualified, reason=reason), True
                )
            try:
                left = max(0.0, deadline - asyncio.get_running_loop().time())
                result = await asyncio.wait_for(client.call_tool(tool, arguments), left)
            except TimeoutError:
                return _timed_out(server.name, tool, timeout, side_effects)
            except Exception as exc:
                if guard is not None and guard.refused and attempt == 1:
                    continue  # refused on the forgotten session, so nothing ran: once more on a new one
                if _closed(client) or _is_connection_error(exc):
                    server.lose(f"the connection broke during a call of {tool}")  # opened again
                    text = texts.MCP_LOST_OUTCOME_UNKNOWN if side_effects else texts.MCP_LOST
                    return ToolResult(text.format(server=server.name, name=qualified), True)
                return ToolResult(texts.MCP_CALL_FAILED.format(name=qualified, error=_describe(exc)), True)
            server.served = True
            return convert_result(result)
        raise AssertionError("unreachable: the second attempt always returns")


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
            server = Server(
                name=config.name,
                command=config.command,
                args=config.args,
                env=self._resolved.env,
                cwd=config.cwd,
                writable=config.writable,
                network=config.network,
            )
            confined = self._sandbox.confine(server)
            params = StdioServerParameters(
                command=confined.command, args=list(confined.args), env=dict(confined.env), cwd=confined.cwd
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


async def _list_tools(client: Any, server: str, trusted: bool = False) -> tuple[McpTool, ...]:
    """The server's tools the API can be offered; the others are named in one log line.

    A name the API refuses, or one two tools share (which of them would a call reach?), is left
    out; offering it would make every request of every run refused, built-in-only runs included.
    """
    found: list[McpTool] = []
    cursor = None
    for _ in range(100):  # pages; a server that pages forever is cut off
        page = await client.list_tools(cursor=cursor)
        for tool in page.tools:
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
                )
            )
        cursor = page.next_cursor
        if not cursor:
            break
    return _offerable(found, server)


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

    A tool that must run as a task would fail every call a person approved; an inputSchema that is
    not a valid JSON schema cannot be checked before a card is posted, and the Messages API may
    refuse every request that offers it.
    """
    execution = getattr(tool, "execution", None)
    if getattr(execution, "task_support", None) == "required":
        return "it runs only as a task (execution.taskSupport: required), and the harness does not run tasks"
    problem = schema_problem(tool.input_schema)
    if problem is not None:
        return f"its inputSchema is not a valid JSON schema: {problem}"
    return None


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
    if isinstance(exc, SandboxUnavailable):
        return str(exc)  # bounded where it is made, and never cut: its end says how to fix it
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__
