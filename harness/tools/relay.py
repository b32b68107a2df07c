"""The MCP hub across a fork: a Unix socket from RQ's work horses to the worker that owns the hub.

A forked child inherits the hub's objects but not its loop thread, and the stdio pipes it
inherits are shared with the parent, so it must not speak on them. Instead the worker serves
its hub on a Unix socket in a private directory (mode 0700), and a job reaches it through a
`RelayClient`, which has the hub's two methods. One JSON line per request and per answer, after
a first line that proves the connection is one of the worker's own horses:

    {"op": "hello", "token": "..."}                        (no answer)
    {"op": "listing"}                                      -> {"listing": {...}}
    {"op": "call", "server", "tool", "arguments", "side_effects", "trace"} -> {"result": {...}}

(`trace`: the `_meta` the call carries, `harness.tools.mcp_meta`: the horse's trace context, as the
worker has no span of the run, and the call's approval receipt.)

Every session stays warm in the worker; a job never starts a server.

Who may connect. The token is drawn by the worker when it opens the relay, before it forks a
horse, and lives only in its memory and its horses' (never in an environment or a file); it is
compared in constant time. A connection whose first line does not carry it, or whose peer runs
as another user (`SO_PEERCRED`), is closed and gets nothing, not even a listing. Stdio servers
never see the socket at all: the sandbox covers the relay's directory (`harness.tools.sandbox`),
and they cannot read the token in any process's memory.

What a call through it is. The relay decides nothing: it has no policy, no tier, no approvals.
A call arrives here only from a horse's tool registry, after the policy of that horse's run
decided it (allowed, or approved by a person) right before it ran; the relay runs it on the
warm session as the horse's own call. That is why nothing but a horse may connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
import shutil
import socket
import struct
import tempfile
import threading
from typing import Any

from harness import texts
from harness.tools.base import ToolResult
from harness.tools.inputs import InputReply
from harness.tools.mcp import McpHub
from harness.tools.mcp_bounds import RELAY_LINE_MAX
from harness.tools.mcp_listing import SEPARATOR, Listing
from harness.tools.mcp_meta import call_meta, checked

log = logging.getLogger("harness.mcp")

# Every answer is a result already cut to the caps of `mcp_bounds` (or a listing); a longer line is
# never one of ours, and is not read.
_MAX_LINE = RELAY_LINE_MAX
_GRACE_SECONDS = 10.0
_HELLO_SECONDS = 10.0  # a horse says hello as it connects


def private_directory() -> str:
    """A new directory for a relay's socket (0700: no other user can connect); made before the hub
    starts, so that every stdio server is started with it hidden (`McpHub(hidden=...)`)."""
    return tempfile.mkdtemp(prefix="harness-mcp-")


class RelayServer:
    """Serves a hub on a Unix socket that only this user's holders of `token` can use, on the
    hub's own loop.

    No thread of its own: a request goes from the socket straight to the session it names.
    """

    def __init__(self, hub: McpHub, directory: str | None = None) -> None:
        self.hub = hub
        self._dir = directory or private_directory()
        self.path = os.path.join(self._dir, "hub.sock")
        self.token = secrets.token_hex(32)
        self._server: asyncio.AbstractServer | None = None

    def client(self, call_timeout: float = 3600.0) -> RelayClient:
        """The client a horse uses: this relay's path and token."""
        return RelayClient(self.path, self.token, call_timeout=call_timeout)

    def start(self) -> RelayServer:
        async def serve() -> asyncio.AbstractServer:
            return await asyncio.start_unix_server(self._handle, path=self.path, limit=_MAX_LINE)

        self._server = self.hub.submit(serve()).result(10)
        return self

    def close(self) -> None:
        server = self._server
        if server is not None:

            async def stop() -> None:
                server.close()

            with contextlib.suppress(Exception):
                self.hub.submit(stop()).result(5)
        shutil.rmtree(self._dir, ignore_errors=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = await asyncio.wait_for(reader.readline(), _HELLO_SECONDS)
            if not self._admits(writer.get_extra_info("socket"), hello):
                return
            while line := await reader.readline():
                answer = await self._answer(line)
                writer.write(json.dumps(answer, ensure_ascii=False).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, ValueError, TimeoutError):  # a horse that died mid-request, a line
            pass  # past the limit, or a connection that never said hello
        finally:
            writer.close()

    def _admits(self, sock: Any, hello: bytes) -> bool:
        """Whether the connection is a horse's: this user, and the token as its first line."""
        peer_uid = _peer_uid(sock)
        try:
            request = json.loads(hello)
        except ValueError:
            request = None
        hello_ok = isinstance(request, dict) and request.get("op") == "hello"
        token = request.get("token") if hello_ok else None
        if (
            peer_uid == os.geteuid()
            and isinstance(token, str)
            and hmac.compare_digest(token.encode(), self.token.encode())
        ):
            return True
        log.warning("MCP relay: refused a connection without the worker's token (peer uid %s)", peer_uid)
        return False

    async def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
            if request.get("op") == "listing":
                return {"listing": self.hub.listing().to_json()}
            if request.get("op") == "call":
                reply = request.get("reply")
                result = await self.hub.call_async(
                    str(request["server"]),
                    str(request["tool"]),
                    request["arguments"],
                    bool(request["side_effects"]),
                    InputReply.from_json(reply) if isinstance(reply, dict) else None,
                    str(request["who"]) if isinstance(request.get("who"), str) else None,
                    checked(request.get("trace")),
                )
                return {"result": result.to_json()}
            return {"error": f"unknown op {request.get('op')!r}"}
        except Exception as exc:  # noqa: BLE001 - a bad request must not end the relay
            log.exception("MCP relay: a request failed")
            return {"error": f"{type(exc).__name__}: {exc}"}


class RelayClient:
    """The hub as seen from a work horse: `listing()` and `call()` over the worker's socket.

    One connection per thread, opened lazily and again in every new process (a fork must not
    share the parent's socket): a horse driving several runs at once (`workers.process.slots`) makes their
    MCP calls side by side, each on its own connection, and the relay serves connections
    concurrently. One run's slow call never holds another's.
    """

    def __init__(self, path: str, token: str, call_timeout: float = 3600.0) -> None:
        self.path = path
        self._hello = json.dumps({"op": "hello", "token": token}).encode() + b"\n"
        self._call_timeout = call_timeout
        self._local = threading.local()

    def listing(self) -> Listing:
        try:
            return Listing.from_json(self._ask({"op": "listing"}, 30.0)["listing"])
        except (OSError, ValueError, KeyError) as exc:
            log.error("MCP relay at %s cannot be reached: %s", self.path, exc)
            return Listing()

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
        request: dict[str, Any] = {
            "op": "call",
            "server": server,
            "tool": tool,
            "arguments": arguments,
            "side_effects": side_effects,
            "trace": call_meta(receipt),
        }
        if reply is not None:  # a person's answers: over the worker's own socket, never logged
            request["reply"] = reply.to_json()
        if who is not None:
            request["who"] = who
        try:
            answer = self._ask(request, self._call_timeout + _GRACE_SECONDS)
            return ToolResult.from_json(answer["result"])
        except (OSError, ValueError, KeyError) as exc:
            # The call may have reached the hub: a side-effecting one's outcome is unknown.
            text = texts.MCP_LOST_OUTCOME_UNKNOWN if side_effects else texts.MCP_LOST
            log.error("MCP relay at %s failed during %s__%s: %s", self.path, server, tool, exc)
            return ToolResult(text.format(server=server, name=f"{server}{SEPARATOR}{tool}"), True)

    def _ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        mine = self._local
        if getattr(mine, "sock", None) is None or mine.pid != os.getpid():
            self._connect()
        try:
            mine.sock.settimeout(timeout)
            mine.sock.sendall(json.dumps(request, ensure_ascii=False).encode() + b"\n")
            line = mine.file.readline(_MAX_LINE)
        except OSError:
            self._drop()
            raise
        if not line:
            self._drop()
            raise ConnectionError("the relay closed the connection")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise ValueError(answer["error"])
        return answer

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
            sock.sendall(self._hello)  # no answer: the first request's answer says it was taken
        except OSError:
            sock.close()
            raise
        mine = self._local
        mine.sock, mine.file, mine.pid = sock, sock.makefile("rb"), os.getpid()

    def _drop(self) -> None:
        mine = self._local
        if getattr(mine, "sock", None) is not None and mine.pid == os.getpid():
            mine.sock.close()
        mine.sock = mine.file = None


def _peer_uid(sock: Any) -> int | None:
    """The user of the process at the other end of a Unix socket (`SO_PEERCRED`); None if unknown."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (AttributeError, OSError):
        return None
    return int(struct.unpack("3i", creds)[1])
