"""MCP servers as tools: one warm session per server, kept by a hub for the life of the process.

The hub runs an asyncio loop on a thread of its own. Each configured server gets a supervisor
task that opens the session (a stdio child process or a streamable-HTTP connection), lists its
tools, and then watches it: a session that dies, at rest or in the middle of a call, is opened
again with backoff (0.5 s doubling to 30 s), and so is a server that could not start at all.
Nothing outside the hub ever starts a server; a call made while its server is away is answered
`is_error` naming the server, and nothing runs.

Its log says each change once: the first failure at WARNING (a stdio server whose command is not
there "cannot start", naming the command and how to fix it: `harness.tools.mcp_command`), every
later try that fails for the same reason at DEBUG, a new reason at WARNING again, and the server's
return at INFO. `health()` says where each server stands (up or down, why, since when), for the
worker to tell `python -m workers status`.

A streamable-HTTP server that forgot its session (it restarted, or the session expired: 404 for
the session id, as the spec has it, or 400 as some servers answer) is given a new session at once,
and a call it refused is sent once more on the new one: the server ran nothing on the old id.
Closing the hub ends each session as the spec asks (an HTTP session gets its DELETE).

A server that says its tools changed (`notifications/tools/list_changed`; at the 2026-07-28
protocol on a `subscriptions/listen` stream the hub keeps open) has them listed again at once; what
a new listing changes, and whether it is taken (`pin_tools`), is `harness.tools.mcp_changes`. A call
of a tool the server no longer offers is answered `is_error` and not sent. Each call carries the
caller's trace and its receipt (`harness.tools.mcp_meta`). A call a server answers with a task, and
`poll_task` / `cancel_task` of it, are `harness.tools.mcp_tasks`'s.

Callers on other threads use `listing()` and `call()`. A process that forks (RQ's work horse)
cannot use the hub's pipes or loop from the child: see `harness.tools.relay`.

What a server offers, and how it becomes a `Tool`, is `harness.tools.mcp_listing`; how a session is
opened (stdio in the sandbox, streamable HTTP) is `harness.tools.mcp_transports`. This module is the
hub: the supervisors, the sessions they keep, and the calls made over them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from mcp_types import ElicitResult, InputRequiredResult

from harness import texts
from harness.config import ResolvedServer
from harness.tools import mcp_tasks
from harness.tools.base import ToolResult
from harness.tools.inputs import InputReply, PersonAsker
from harness.tools.mcp_bounds import bound_stdio_reads, convert_result
from harness.tools.mcp_changes import Notified, ToolBook, listen
from harness.tools.mcp_command import CommandMissing
from harness.tools.mcp_inputs import asks_person, mid_call, rounds
from harness.tools.mcp_listing import SEPARATOR, Listing, McpTool, list_tools
from harness.tools.mcp_log import closed, describe, first, is_connection_error, log_down, log_up
from harness.tools.mcp_meta import call_meta
from harness.tools.mcp_transports import (
    HttpTransport,
    SessionGuard,
    StdioTransport,
    quiet_forgotten_deletes,
)
from harness.tools.sandbox import Sandbox, SandboxUnavailable
from harness.tools.tasks import TaskHandle, TaskPoll

if TYPE_CHECKING:
    from mcp.client.session import ElicitationFnT

log = logging.getLogger("harness.mcp")

_BACKOFF_FIRST, _BACKOFF_MAX = 0.5, 30.0
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
# An HTTP session at rest is pinged this often, so a server that restarted is noticed without a call.
_PING_SECONDS = 15.0
_PING_TIMEOUT_SECONDS = 10.0
_RELIST_EVERY = 1.0  # a server's tools are listed again at most this often (what it says coalesces)
# How long listing the tools again after `notifications/tools/list_changed` may take.
_RELIST_SECONDS = 30.0


# --- the hub ---------------------------------------------------------------------------------


@dataclass
class _Server:
    resolved: ResolvedServer
    client: Any = None  # an open `mcp.Client` while up
    tools: tuple[McpTool, ...] = ()
    # How its listings are taken (`pin_tools`), and the tools last taken, kept while it is down:
    # what a later listing is compared with (`harness.tools.mcp_changes`).
    book: ToolBook = field(default_factory=lambda: ToolBook(""))
    reason: str = "not started yet"
    broken: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # it said its tools changed
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # `broken` or `changed` was set
    tried: threading.Event = field(default_factory=threading.Event)  # first attempt over
    up: asyncio.Event = field(default_factory=asyncio.Event)  # `client` is usable
    guard: SessionGuard | None = None  # the current HTTP connection's
    stdio: StdioTransport | None = None  # the current stdio session's (its stderr's last lines)
    recovering: bool = False  # the server forgot the session: a new one is being opened now
    served: bool = False  # the current session answered a call (the server does keep sessions)
    failures: int = 0  # tries in a row that failed, since it was last up
    logged: str = ""  # the reason last logged at WARNING: the same again goes to DEBUG
    since: float = field(default_factory=time.time)  # when it last went up or down (wall clock)
    # The calls in flight on it: (the run each is for, the tool, its deadline on the hub's loop),
    # so a question the server asks mid-call (the older protocol) reaches the run's requester.
    in_flight: dict[int, tuple[str | None, str, float]] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)  # tools its globs leave out -> why

    def lose(self, reason: str, *, recovering: bool = False) -> None:
        """The session is dead: calls stop using it, and the supervisor opens another."""
        self.reason, self.recovering = reason, recovering
        self.up.clear()
        self.broken.set()
        self.wake.set()

    @property
    def name(self) -> str:
        return self.resolved.config.name


@dataclass(frozen=True)
class ServerHealth:
    """Where one server stands: up (its tools offered) or down, why, since when, after how many tries."""

    name: str
    up: bool
    reason: str  # why it is down ("" while up)
    since: float  # when it went up or down (wall clock)
    failures: int  # tries in a row that failed


class McpHub:
    """Warm sessions to every configured MCP server, on a loop thread of the hub's own."""

    def __init__(
        self,
        servers: Sequence[ResolvedServer],
        *,
        hidden: Sequence[str] = (),
        state_dir: str | None = None,
        ask_person: PersonAsker | None = None,
    ) -> None:
        """`hidden`: directories no stdio server may see into (the relay's; `harness.tools.sandbox`);
        `state_dir`: where stdio servers' own directories are kept (`harness.tools.walls`);
        `ask_person`: who answers a question a server asks in the middle of a call (the older
        protocol's `elicitation/create`): none, and every such question is answered cancel."""
        bound_stdio_reads()  # what a server sends is read in linear time, up to a limit
        quiet_forgotten_deletes()  # a restarted server's refusal of the old session's DELETE
        self._servers = {
            s.config.name: _Server(s, book=ToolBook(s.config.describe(), s.config.pin_tools)) for s in servers
        }
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-hub", daemon=True)
        self._lock = threading.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._sandbox = Sandbox(hidden=tuple(hidden), state_dir=state_dir)
        self._stopping = asyncio.Event()
        self._ask_person = ask_person
        self._calls = itertools.count()
        self.holder = uuid.uuid4().hex  # what a stdio server's task handles name (`TaskHost`)

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
            left_out: dict[str, str] = {}
            for server in self._servers.values():
                # A server that forgot its session keeps its tools while a new one opens: a call
                # then waits for that session (`_session`) rather than being answered "away".
                if server.client is not None or server.recovering:
                    tools.extend(server.tools)
                    left_out.update(server.left_out)
                else:
                    away[server.name] = server.reason
            timeouts = {s.name: s.resolved.config.timeout_seconds for s in self._servers.values()}
        return Listing(tuple(tools), away, timeouts, left_out)

    def health(self) -> tuple[ServerHealth, ...]:
        """Where each server stands now (a server being given a new session counts as up)."""
        found = []
        with self._lock:
            for s in self._servers.values():
                up = s.client is not None or s.recovering
                found.append(ServerHealth(s.name, up, "" if up else s.reason, s.since, s.failures))
        return tuple(found)

    def submit(self, coro: Any) -> Any:
        """Run `coro` on the hub's loop; a `concurrent.futures.Future` of its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def call_async(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        side_effects: bool,
        reply: InputReply | None = None,
        who: str | None = None,
        trace: dict[str, str] | None = None,
    ) -> ToolResult:
        """`call`, for code already on the hub's loop (the relay); `trace`: the caller's
        `harness.tools.mcp_meta.call_meta`, taken in its own thread."""
        found = self._servers.get(server)
        if found is None:
            reason = "not configured"
            return ToolResult(texts.MCP_SERVER_AWAY.format(server=server, name=tool, reason=reason), True)
        return await self._call(found, tool, arguments, side_effects, reply, who, trace or {})

    def call(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        side_effects: bool,
        reply: InputReply | None = None,
        who: str | None = None,
        receipt: str | None = None,
    ) -> ToolResult:
        """Call `tool` on `server`; every failure is an `is_error` result, never an exception.

        `reply`: a person's answers to the input request the server made of this call before (and
        its `requestState`), sent with the call again. A server that asks a person now answers a
        result whose `asks` says what (`harness.tools.inputs`). `who`: the run the call is for, to
        whom a question the server asks in the middle of the call is put (the older protocol). The
        request's `_meta` carries the calling thread's trace context and `receipt` (`mcp_meta`).
        """
        found = self._servers.get(server)
        if found is None:
            return ToolResult(
                texts.MCP_SERVER_AWAY.format(server=server, name=tool, reason="not configured"), True
            )
        timeout = found.resolved.config.timeout_seconds
        future = asyncio.run_coroutine_threadsafe(
            self._call(found, tool, arguments, side_effects, reply, who, call_meta(receipt)), self._loop
        )
        try:
            return future.result(timeout + _GRACE_SECONDS)
        except FutureTimeout:
            future.cancel()
            return _timed_out(server, tool, timeout, side_effects)

    def poll_task(self, handle: TaskHandle) -> TaskPoll:
        """Where `handle`'s task stands now (`tasks/get`); never raises (`mcp_tasks.poll`)."""
        return mcp_tasks.poll_on(self, handle)

    def cancel_task(self, handle: TaskHandle) -> bool:
        """Ask the server to cancel `handle`'s task (`tasks/cancel`); True once it acked."""
        return mcp_tasks.cancel_on(self, handle)

    # --- on the loop ---

    async def task_session(self, name: str) -> tuple[Any, float, str]:
        """For a task request to server `name`: its session, how long the request may take, and
        why there is no session."""
        server = self._servers.get(name)
        if server is None:
            return None, 0.0, "not configured"
        seconds = min(server.resolved.config.timeout_seconds, mcp_tasks.REQUEST_SECONDS)
        client, _ = await self._session(server, asyncio.get_running_loop().time() + seconds)
        return client, seconds, "" if client is not None else server.reason or "the session closed"

    async def _supervise(self, server: _Server) -> None:
        delay = _BACKOFF_FIRST
        reopened = False  # this session replaces one the server forgot
        while not self._stopping.is_set():
            steady, lost = False, ""
            try:
                # Leaving this block ends the session gracefully (an HTTP session's DELETE is sent).
                async with self._open(server) as client:
                    server.changed.clear()  # what the new session lists is the news
                    tools = self._settle(server, await self._list(server, client), "on a new session")
                    with self._lock:
                        server.client, server.tools, server.reason = client, tools, ""
                        failures, down_for = server.failures, time.time() - server.since
                        server.failures, server.logged = 0, ""
                        server.since = server.since if server.recovering else time.time()
                    server.broken.clear()
                    server.recovering = server.served = False
                    server.up.set()
                    server.tried.set()
                    delay = _BACKOFF_FIRST
                    log_up(server, len(tools), failures, down_for)
                    opened = time.monotonic()
                    listening = asyncio.ensure_future(listen(server, client))
                    try:
                        await self._watch(server, client)
                    finally:
                        listening.cancel()
                        await asyncio.gather(listening, return_exceptions=True)
                    steady = server.served or time.monotonic() - opened >= _STEADY_SECONDS
                    reason = lost = server.reason or "the session ended"
                    server.up.clear()
            except asyncio.CancelledError:
                server.up.clear()
                with self._lock:
                    server.client = None
                raise
            except BaseException as exc:  # noqa: BLE001 - whatever a server does, the hub goes on
                reason = lost or describe(exc)  # why a session was lost, not how its closing failed
                cannot_start = not lost and isinstance(first(exc), SandboxUnavailable | CommandMissing)
                tail = server.stdio.stderr_tail() if server.stdio is not None and not lost else ""
                if tail:  # it exited before its session opened ("Connection closed"): say why
                    reason = f"{reason}; its stderr ended: {tail}"
            else:
                cannot_start = False
            recovering = server.recovering and (steady or not reopened) and not self._stopping.is_set()
            server.up.clear()
            with self._lock:  # one step, as `listing` reads it: a recovering server is not away
                if not recovering and (server.client is not None or server.recovering or not server.failures):
                    server.since = time.time()  # it goes down now (or its very first try failed)
                server.client, server.reason, server.recovering = None, reason, recovering
                if not recovering:
                    server.tools = ()
                    server.failures += 1
            server.tried.set()
            if self._stopping.is_set():
                return
            if recovering:  # the server is there, it only forgot the session: a new one now
                log.info(
                    "MCP server %s: %s; opening a new session", server.resolved.config.describe(), reason
                )
                reopened = True  # calls wait for the new session rather than answer "away"
                continue
            reopened = False
            log_down(server, reason, delay, cannot_start, _BACKOFF_MAX)
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            delay = min(delay * 2, _BACKOFF_MAX)

    async def _watch(self, server: _Server, client: Any) -> None:
        """Return once the session is known to be dead: a call saw it, or it closed at rest.
        Meanwhile, list its tools again whenever it says they changed.

        A stdio session closes with its process; an HTTP one does not notice that its server
        restarted until a request is refused, so one with a session id (the 2025 protocol) is
        pinged now and then while it rests.
        """
        loop = asyncio.get_running_loop()
        pinged, relisted = loop.time(), float("-inf")
        while not server.broken.is_set():
            if closed(client):
                server.reason = "the session closed (the server exited?)"
                return
            if server.changed.is_set():
                early = relisted + _RELIST_EVERY - loop.time()
                if early > 0:  # a server that says so again and again is listed once a second
                    with suppress(TimeoutError):
                        await asyncio.wait_for(server.broken.wait(), early)
                    continue
                await self._relist(server, client)
                relisted = loop.time()
            due = loop.time() >= pinged + _PING_SECONDS  # read each time: a test shortens it
            if server.guard is not None and server.guard.has_session and due:
                await self._ping(server, client)
                pinged = loop.time()
            server.wake.clear()
            if server.broken.is_set() or server.changed.is_set():
                continue
            with suppress(TimeoutError):
                await asyncio.wait_for(server.wake.wait(), _LIVENESS_SECONDS)

    async def _list(self, server: _Server, client: Any) -> tuple[McpTool, ...]:
        """The server's tools its globs keep (those they leave out, named in `server.left_out`)."""
        tools, server.left_out = await list_tools(client, server.resolved.config)
        return tools

    def _settle(self, server: _Server, listed: tuple[McpTool, ...], why: str) -> tuple[McpTool, ...]:
        """The tools to offer after `listed` (pinned or taken: `harness.tools.mcp_changes`)."""
        return server.book.take(listed, why)

    async def _relist(self, server: _Server, client: Any) -> None:
        """The server said its tools changed: list them again, and offer them from now on."""
        server.changed.clear()
        try:
            listed = await asyncio.wait_for(self._list(server, client), _RELIST_SECONDS)
        except Exception as exc:  # the session may be dying: its watch sees that; the tools stay
            log.warning(
                "MCP server %s said its tools changed, and listing them failed (%s); the tools "
                "listed before are offered",
                server.resolved.config.describe(),
                describe(exc),
            )
            return
        tools = self._settle(server, listed, "notifications/tools/list_changed")
        with self._lock:
            if server.client is client:
                server.tools = tools

    async def _ping(self, server: _Server, client: Any) -> None:
        """Ping an HTTP session; one the server refused or did not answer is opened again."""
        try:
            await asyncio.wait_for(client.session.send_ping(), _PING_TIMEOUT_SECONDS)
        except Exception as exc:  # a refused session was already marked by its guard
            if not server.broken.is_set():
                server.lose(f"it did not answer a ping ({describe(exc)})")

    def _open(self, server: _Server) -> AbstractAsyncContextManager[Any]:
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        resolved = server.resolved
        config = resolved.config
        client = partial(
            Client,
            message_handler=Notified(server),
            elicitation_callback=self._asker(server),
            extensions=[mcp_tasks.TasksExtension()],  # a call may be answered with a task
        )
        if config.command is not None:
            server.guard = None
            server.stdio = StdioTransport(resolved, self._sandbox)
            return client(server.stdio)
        server.stdio = None
        assert config.url is not None
        http = create_mcp_http_client(headers=dict(resolved.headers) or None)
        guard = server.guard = SessionGuard(lambda refused: self._refused(server, refused))
        hooks = http.event_hooks
        http.event_hooks = {**hooks, "response": [*hooks.get("response", []), guard.response]}
        return client(HttpTransport(config.url, http, streamable_http_client))

    def _asker(self, server: _Server) -> ElicitationFnT:
        """The server's `elicitation_callback`: declaring it is what makes servers offer (and ask
        through) input requests; a question sent mid-call (the older protocol) is `_mid_call`'s."""

        async def asked(context: Any, params: Any) -> ElicitResult:
            return await self._mid_call(server, params)

        return cast("ElicitationFnT", asked)

    async def _mid_call(self, server: _Server, params: Any) -> ElicitResult:
        """A question the server asks while a call of it waits: `mcp_inputs.mid_call`'s."""
        calls = list(server.in_flight.values())
        return await mid_call(server.name, server.resolved.config.describe(), calls, params, self._ask_person)

    def _refused(self, server: _Server, guard: SessionGuard) -> None:
        """The server refused the session of `guard`'s connection: open a new one now."""
        if server.guard is guard and not self._stopping.is_set():
            server.lose("the server no longer knows the session (it restarted?)", recovering=True)

    async def _session(self, server: _Server, deadline: float) -> tuple[Any, SessionGuard | None]:
        """The server's usable session and its guard; (None, None) when it is away.

        While a forgotten session is being replaced, wait for the new one (within `deadline`).
        """
        if server.recovering and not server.up.is_set():
            log.info("MCP server %s: a call waits for the new session", server.resolved.config.describe())
            wait = min(deadline - asyncio.get_running_loop().time(), _RECOVER_SECONDS)
            with suppress(TimeoutError):
                await asyncio.wait_for(server.up.wait(), max(0.0, wait))
        client = server.client
        if client is not None and closed(client):
            server.lose("the session closed (the server exited?)")
        if client is None or not server.up.is_set():
            return None, None
        return client, server.guard

    async def _call(
        self,
        server: _Server,
        tool: str,
        arguments: dict[str, Any],
        side_effects: bool,
        reply: InputReply | None = None,
        who: str | None = None,
        trace: dict[str, str] | None = None,
    ) -> ToolResult:
        timeout = server.resolved.config.timeout_seconds
        deadline = asyncio.get_running_loop().time() + timeout
        token = next(self._calls)
        server.in_flight[token] = (who, tool, deadline)
        try:
            return await self._attempts(server, tool, arguments, side_effects, reply, deadline, trace or {})
        finally:
            server.in_flight.pop(token, None)

    async def _attempts(
        self,
        server: _Server,
        tool: str,
        arguments: dict[str, Any],
        side_effects: bool,
        reply: InputReply | None,
        deadline: float,
        trace: dict[str, str],
    ) -> ToolResult:
        qualified = f"{server.name}{SEPARATOR}{tool}"
        timeout = server.resolved.config.timeout_seconds
        since = time.time()
        for attempt in (1, 2):
            client, guard = await self._session(server, deadline)
            if client is None:
                reason = server.reason or "the session closed"
                return ToolResult(
                    texts.MCP_SERVER_AWAY.format(server=server.name, name=qualified, reason=reason), True
                )
            if all(t.name != tool for t in server.tools):  # removed since the caller's listing
                return ToolResult(texts.MCP_TOOL_GONE.format(server=server.name, name=qualified), True)
            try:
                left = max(0.0, deadline - asyncio.get_running_loop().time())
                meta = dict(trace) or None  # `_meta`: SEP-414's trace context, the receipt (`mcp_meta`)
                as_task = any(t.name == tool and t.task_only for t in server.tools)
                sent = mcp_tasks.call_as_task(client, tool, arguments, meta, timeout) if as_task else None
                result = await asyncio.wait_for(sent or rounds(client, tool, arguments, reply, meta), left)
            except TimeoutError:
                return _timed_out(server.name, tool, timeout, side_effects)
            except Exception as exc:
                if guard is not None and guard.refused and attempt == 1:
                    continue  # refused on the forgotten session, so nothing ran: once more on a new one
                if closed(client) or is_connection_error(exc):
                    server.lose(f"the connection broke during a call of {tool}")  # opened again
                    text = texts.MCP_LOST_OUTCOME_UNKNOWN if side_effects else texts.MCP_LOST
                    return ToolResult(text.format(server=server.name, name=qualified), True)
                return ToolResult(texts.MCP_CALL_FAILED.format(name=qualified, error=describe(exc)), True)
            server.served = True
            if isinstance(result, InputRequiredResult):
                return asks_person(server.name, qualified, result, reply)
            if isinstance(result, mcp_tasks.CreatedTask):  # the run parks on it; nobody waits here
                holder = self.holder if server.resolved.config.command is not None else ""
                call = mcp_tasks.TaskCall(server.name, tool, since, timeout, holder, side_effects)
                return mcp_tasks.task_answer(result, call, client.session.protocol_version or "")
            return convert_result(result)
        raise AssertionError("unreachable: the second attempt always returns")


def _timed_out(server: str, tool: str, seconds: float, side_effects: bool) -> ToolResult:
    """The answer to a call past its timeout. Its task is cancelled, and the SDK's request then
    sends the server `notifications/cancelled` (its "courtesy cancel"): whether the server stopped
    in time, and what it did before, is unknown."""
    text = texts.MCP_TIMED_OUT_OUTCOME_UNKNOWN if side_effects else texts.RESULT_TIMED_OUT
    return ToolResult(text.format(name=f"{server}{SEPARATOR}{tool}", seconds=seconds), True)
