"""Egress for a sandboxed stdio MCP server with `network = true`: an HTTP proxy on the host that
reaches public addresses only.

The server runs in a network namespace of its own, where nothing but its own loopback exists. A
tiny init inside the sandbox listens on 127.0.0.1:<port> there, and the server is started with
`HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY` pointing at it. The init does not proxy anything itself:
for each TCP connection it accepts, it hands the accepted socket to the host through a Unix socket
in a private directory, "the door" (one per server, `SOCK_STREAM`), with `SCM_RIGHTS`: it connects
once, then sends one byte carrying one fd per connection (`socket.send_fds(door, [b"c"], [fd])`).
This module serves the other side: it receives each socket and speaks HTTP proxy on it. The
decisions are all made here, on the host, where the server cannot reach them.

What a request may reach is `harness.tools.egress_hosts` (public addresses only, and a server's
allow-list); the HTTP it speaks is `harness.tools.egress_http`. This module holds the doors: their
bounds, who may use them, and the thread that serves them all.

What it speaks. `CONNECT host:port` (a tunnel: "200 Connection established", then bytes both ways,
a half-close passed on as a half-close) and absolute-form `http://` requests, forwarded in origin
form with `Host` set from the URL and `Connection: close`, so each client connection carries one
request to the one checked destination. A refusal is a 403 whose body says why, and is logged as
one WARNING line on `harness.mcp` naming the server and the destination (escaped: the host name is
the server's input). Nothing else of a stream is ever logged. A malformed request is a 400, a head
that does not arrive in time a 408, a destination that cannot be resolved or reached a 502.

Bounds, so that a hostile server pins nothing: a request head of `EgressLimits.head_bytes`, read
within `head_seconds`; resolution and each connect attempt time out; at most `connections`
proxied connections and `door_links` door connections at once per door (a socket over the cap is
answered 503 and closed); a door message carrying anything but exactly one stream socket is
dropped with every fd it carried.

Who may use a door. The door is mode 0600 in a directory that must be 0700 and ours, and a
connection whose peer is not this process's effective user (`SO_PEERCRED`) is closed unheard. A
sandbox that makes the server root in a user namespace still shows up as our uid here. Every
server's sandbox must see its own door only: the caller covers the directory and binds that one
socket in, or one server could borrow another's allow-list.

Threads. One thread of its own runs an asyncio loop that owns every socket; `open_door`,
`close_door` and `close` may be called from any other thread and wait for the loop to act. Name
resolution runs in a small pool of its own, since `getaddrinfo` blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import logging
import os
import re
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from harness.tools.egress_hosts import (
    IPAddress,
    Resolver,
    check_patterns,
    host_allowed,
    is_public,
    resolve_host,
)
from harness.tools.egress_http import CHUNK, ProxyAnswer, Request, answer_bytes, discard, parse_head, relay

log = logging.getLogger("harness.mcp")

_THREAD_NAME = "harness-egress"
_CALL_SECONDS = 30.0  # how long a caller waits for the loop to open or close a door


@dataclass(frozen=True)
class EgressLimits:
    """Every bound of the proxy, finite by default, per door where it says so."""

    head_bytes: int = 16 * 1024
    head_seconds: float = 30.0
    resolve_seconds: float = 10.0
    connect_seconds: float = 10.0
    connections: int = 64  # proxied connections at once, per door
    door_links: int = 8  # connections to the door at once (the init holds one)
    linger_seconds: float = 1.0  # reading on after an error answer, so a reset does not eat it


# Messages for the server (and its log); the host name in them has passed `HOST_NAME` or is an address.
_NOT_PUBLIC = "{address} is not a public address"
_RESOLVES_PRIVATE = "{host} resolves to {address}, which is not a public address"
_NOT_LISTED = "host {host} is not in this server's network allow-list"


def _printable(text: str) -> str:
    """Hostile text made safe for one log line: escaped, and not too long."""
    return text.encode("unicode_escape").decode("ascii")[:300]


# --- The proxy --------------------------------------------------------------------------------


# At most this many refusal lines a minute per server; the rest are counted in one line.
_LOG_BUDGET = 20
_LOG_WINDOW_SECONDS = 60.0


@dataclass
class _Door:
    """One server's door: its listening socket and every task that serves it."""

    server: str
    path: str
    hosts: tuple[str, ...] | None
    listener: socket.socket
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    sockets: set[socket.socket] = field(default_factory=set)  # links and clients, until closed
    links: int = 0
    active: int = 0
    said: int = 0  # refusal lines logged in the current minute
    unsaid: int = 0  # refusals past the budget, told in one line when the minute is over
    minute: float = 0.0  # when the current minute began

    def may_say(self, now: float) -> str | None:
        """Whether one more refusal line may be logged now ("" yes; a note of those left out
        first, when a minute ended with some; None: over the budget, counted instead)."""
        note = ""
        if now - self.minute >= _LOG_WINDOW_SECONDS:
            if self.unsaid:
                note = f"{self.unsaid:,} more egress refusals were not logged in the minute before"
            self.minute, self.said, self.unsaid = now, 0, 0
        if self.said >= _LOG_BUDGET:
            self.unsaid += 1
            return None
        self.said += 1
        return note


class EgressProxy:
    """The host side of `network = true`: one door per server, public destinations only."""

    def __init__(
        self,
        directory: str,
        *,
        allowed: Callable[[IPAddress], bool] = is_public,
        resolve: Resolver = resolve_host,
        limits: EgressLimits | None = None,
    ) -> None:
        # `allowed` and `resolve` are seams for tests only (a loopback destination that stands in
        # for the internet); production passes neither, and nothing else can change them.
        self.directory = directory
        self.limits = limits or EgressLimits()
        self._allowed = allowed
        self._resolve = resolve
        self._doors: dict[str, _Door] = {}
        self._serial = itertools.count(1)  # next() is atomic: callers may be on several threads
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    # The caller's side: any thread but the proxy's own.

    def start(self) -> EgressProxy:
        """Check the directory and start the proxy's thread; returns the proxy."""
        info = os.stat(self.directory)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise ValueError(f"{self.directory} is not a private directory (ours, mode 0700)")
        if self._thread is not None:
            raise RuntimeError("the egress proxy is already started")
        self._loop = asyncio.new_event_loop()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"{_THREAD_NAME}-dns")
        self._thread = threading.Thread(target=self._loop.run_forever, name=_THREAD_NAME, daemon=True)
        self._thread.start()
        return self

    def open_door(self, server: str, hosts: Sequence[str] | None = None) -> str:
        """A door for `server` (replacing the one it had): the path of a listening Unix socket."""
        patterns = None if hosts is None else check_patterns(hosts)
        stem = re.sub(r"[^A-Za-z0-9_-]", "_", server)[:32]
        path = os.path.join(self.directory, f"{stem}.{next(self._serial)}.door")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            os.chmod(path, 0o600)  # the directory (0700) already keeps others out meanwhile
            listener.listen(16)
            listener.setblocking(False)
            self._call(self._install(_Door(server, path, patterns, listener)))
        except BaseException:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        return path

    def close_door(self, server: str) -> None:
        """Close `server`'s door and every connection that came through it."""
        self._call(self._remove(server))

    def close(self) -> None:
        """Close every door and connection, and stop the thread."""
        if self._loop is None or self._thread is None:
            return
        loop, thread = self._loop, self._thread
        with contextlib.suppress(RuntimeError, TimeoutError):
            self._call(self._remove_all())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_CALL_SECONDS)
        self._loop = self._thread = None
        if not thread.is_alive():
            loop.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> EgressProxy:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a coroutine on the proxy's loop and wait for it."""
        if self._loop is None or self._thread is None or threading.current_thread() is self._thread:
            work.close()
            raise RuntimeError("the egress proxy is not started, or this is its own thread")
        asyncio.run_coroutine_threadsafe(work, self._loop).result(_CALL_SECONDS)

    # The loop's side.

    async def _install(self, door: _Door) -> None:
        await self._remove(door.server)
        self._doors[door.server] = door
        self._spawn(door, self._accept(door))

    async def _remove(self, server: str) -> None:
        door = self._doors.pop(server, None)
        if door is None:
            return
        for task in list(door.tasks):
            task.cancel()
        await asyncio.gather(*door.tasks, return_exceptions=True)
        for sock in door.sockets:  # those of tasks cancelled before they ever ran
            sock.close()
        door.listener.close()
        with contextlib.suppress(OSError):
            os.unlink(door.path)

    async def _remove_all(self) -> None:
        for server in list(self._doors):
            await self._remove(server)

    def _spawn(self, door: _Door, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)
        door.tasks.add(task)
        task.add_done_callback(door.tasks.discard)
        return task

    async def _accept(self, door: _Door) -> None:
        # Accepting by hand, not with `loop.sock_accept`: a task cancelled just after that accepted
        # would drop the new socket unclosed; here nothing is held across an await.
        while True:
            await _readable(door.listener)
            while True:
                try:
                    link, _ = door.listener.accept()
                except BlockingIOError:
                    break
                self._admit(door, link)

    def _admit(self, door: _Door, link: socket.socket) -> None:
        """Serve a connection to the door if it is our user's and there is room for it."""
        uid = _peer_uid(link)
        if uid != os.geteuid() or door.links >= self.limits.door_links:
            log.warning(
                "MCP server %s: egress door refused a connection (peer uid %s)", _printable(door.server), uid
            )
            link.close()
            return
        link.setblocking(False)
        door.links += 1
        door.sockets.add(link)
        self._spawn(door, self._link(door, link))

    async def _link(self, door: _Door, link: socket.socket) -> None:
        """Read one fd per one-byte message from the init until it hangs up."""
        try:
            while True:
                await _readable(link)  # once per message, so a flood cannot starve other doors
                try:
                    data, fds, flags, _ = socket.recv_fds(link, 1, 4, socket.MSG_CMSG_CLOEXEC)
                except BlockingIOError:
                    continue
                self._take(door, fds, flags)
                if not data:
                    return
        except OSError:
            return
        finally:
            door.links -= 1
            link.close()
            door.sockets.discard(link)

    def _take(self, door: _Door, fds: list[int], flags: int) -> None:
        """Serve the one socket a message carried; drop a message with any other cargo."""
        if len(fds) != 1 or flags & socket.MSG_CTRUNC:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            return
        sock = _adopt(fds[0])
        if sock is None:
            return
        if door.active >= self.limits.connections:
            log.warning(
                "MCP server %s: egress refused a connection: %d already open",
                _printable(door.server),
                door.active,
            )
            with contextlib.suppress(OSError):
                sock.send(answer_bytes(503, "too many connections at once"))
            sock.close()
            return
        door.active += 1
        door.sockets.add(sock)

        def served(_: asyncio.Task[None]) -> None:
            door.active -= 1

        self._spawn(door, self._serve(door, sock)).add_done_callback(served)

    async def _serve(self, door: _Door, sock: socket.socket) -> None:
        """One client connection: read its head, decide, then tunnel or forward."""
        try:
            reader, writer = await asyncio.open_connection(sock=sock, limit=self.limits.head_bytes)
        except OSError:
            sock.close()
            return
        try:
            try:
                request, (up_reader, up_writer) = await self._open(door, reader)
            except ProxyAnswer as answer:
                await self._refuse(reader, writer, answer)
                return
            try:
                if request.tunnel:
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                else:
                    up_writer.write(request.upstream_head)
                await relay(reader, writer, up_reader, up_writer)
            finally:
                up_writer.close()
        except (OSError, asyncio.IncompleteReadError):
            pass  # a client that left before its head was whole, or a side that failed
        finally:
            writer.close()
            door.sockets.discard(sock)

    async def _open(
        self, door: _Door, reader: asyncio.StreamReader
    ) -> tuple[Request, tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        """The request and a connection to where it may go; `ProxyAnswer` when it may not."""
        limits = self.limits
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), limits.head_seconds)
        except asyncio.LimitOverrunError:
            raise ProxyAnswer(400, f"request head over {limits.head_bytes} bytes") from None
        except TimeoutError:
            raise ProxyAnswer(408, f"no complete request head in {limits.head_seconds:g} s") from None
        request = parse_head(head)
        addresses = await self._destination(door, request)
        return request, await self._connect(request, addresses)

    async def _destination(self, door: _Door, request: Request) -> list[IPAddress]:
        """The checked addresses to try, in order; `ProxyAnswer` when the request may not go out."""
        host, port = request.host, request.port
        if door.hosts is not None and not host_allowed(host, door.hosts):
            raise _Refusal(door, request, _NOT_LISTED.format(host=host))
        loop = asyncio.get_running_loop()
        try:
            pending = loop.run_in_executor(self._pool, self._resolve, host, port)
            addresses = await asyncio.wait_for(pending, self.limits.resolve_seconds)
        except (OSError, TimeoutError, UnicodeError):
            raise ProxyAnswer(502, f"cannot resolve {host}") from None
        if not addresses:
            raise ProxyAnswer(502, f"cannot resolve {host}")
        for address in addresses:
            if not self._allowed(address):
                literal = host == str(address)  # both in normal form
                shown = _shown(address)
                why = (_NOT_PUBLIC if literal else _RESOLVES_PRIVATE).format(host=host, address=shown)
                raise _Refusal(door, request, why)
        return list(dict.fromkeys(addresses))

    async def _connect(
        self, request: Request, addresses: list[IPAddress]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the first of the checked addresses that answers (those, and no other)."""
        loop = asyncio.get_running_loop()
        for address in addresses:
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                connecting = loop.sock_connect(sock, (str(address), request.port))
                await asyncio.wait_for(connecting, self.limits.connect_seconds)
                return await asyncio.open_connection(sock=sock, limit=CHUNK)
            except (OSError, TimeoutError):
                sock.close()
            except BaseException:  # cancelled (the door closed): the socket is no one's
                sock.close()
                raise
        raise ProxyAnswer(502, f"cannot reach {request.host} port {request.port}")

    async def _refuse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: ProxyAnswer
    ) -> None:
        """Answer, log a refusal, and read on a moment so the answer is not lost to a reset."""
        if isinstance(answer, _Refusal):
            server, host = _printable(answer.door.server), _printable(answer.request.host)
            port, why = answer.request.port, _printable(answer.why)
            note = answer.door.may_say(time.monotonic())  # a hostile server may not flood the log
            if note:
                log.warning("MCP server %s: %s", server, note)
            if note is not None:
                log.warning("MCP server %s: egress to %s port %d refused: %s", server, host, port, why)
        try:
            writer.write(answer_bytes(answer.status, answer.why))
            await writer.drain()
            writer.write_eof()
            await asyncio.wait_for(discard(reader), self.limits.linger_seconds)
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()


class _Refusal(ProxyAnswer):
    """A 403: the request was understood and may not go out; it is logged."""

    def __init__(self, door: _Door, request: Request, why: str) -> None:
        super().__init__(403, why)
        self.door = door
        self.request = request


def _shown(address: IPAddress) -> str:
    """`address` for a message: a mapped IPv4 one as ::ffff:a.b.c.d (3.11 spells ::ffff:7f00:1)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return f"::ffff:{address.ipv4_mapped}"
    return str(address)


async def _readable(sock: socket.socket) -> None:
    """Wait until `sock` can be read (asyncio has no `recv_fds` of its own)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock, wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock)


def _adopt(fd: int) -> socket.socket | None:
    """The received fd as a socket, if it is a connected TCP one; closed otherwise."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.close(fd)
        return None
    try:
        tcp = sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM
        if tcp and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            sock.setblocking(False)
            return sock
    except OSError:
        pass
    sock.close()
    return None


def _peer_uid(sock: socket.socket) -> int | None:
    """The user of the process at the other end of a Unix socket (`SO_PEERCRED`); None if unknown."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return int(struct.unpack("3i", creds)[1])
