"""How the hub opens a session to an MCP server: a stdio child confined by the sandbox, or a
streamable-HTTP connection whose responses are watched for the server forgetting its session.

Apart from the hub, which only decides when to open, wait and open again: what is spawned and how
(under `SPAWNING`, which a forking process must respect) is read here on its own.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.config import ResolvedServer
from harness.tools.mcp_bounds import STDOUT_JUNK
from harness.tools.sandbox import Sandbox, Server, StderrLog, read_stderr

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


SESSION_HEADER = "mcp-session-id"

# What the SDK logs at WARNING when the DELETE that ends a session is answered 404 or 400: after a
# server restarted, the hub ends the session the server already forgot, which is expected.
_FORGOTTEN_DELETE = frozenset({"Session termination failed: 404", "Session termination failed: 400"})


class _ForgottenDelete(logging.Filter):
    """Lowers `_FORGOTTEN_DELETE` to DEBUG; every other line of the SDK stays as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and record.getMessage() in _FORGOTTEN_DELETE:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def quiet_forgotten_deletes() -> None:
    """Log a forgotten session's refused DELETE at DEBUG, not WARNING (idempotent; the hub calls it)."""
    sdk = logging.getLogger("mcp.client.streamable_http")
    if not any(isinstance(f, _ForgottenDelete) for f in sdk.filters):
        sdk.addFilter(_ForgottenDelete())


@dataclass
class SessionGuard:
    """Watches one HTTP connection's responses for the server refusing its session id.

    Per the spec a server that no longer knows a session answers 404 and the client must start a
    new one; some servers answer a POST with 400 instead. Either way the request was refused
    before anything ran. A GET (the SDK's listening stream) counts on 404 only: a server without
    that stream may answer it 400.
    """

    on_refused: Callable[[SessionGuard], None]
    refused: bool = False
    # The server gave a session id (the 2025 protocol; the newest one has no sessions to lose).
    has_session: bool = False

    async def response(self, response: Any) -> None:
        """An HTTP client response hook."""
        self.has_session = self.has_session or bool(response.headers.get(SESSION_HEADER))
        request = response.request
        if not request.headers.get(SESSION_HEADER) or request.method == "DELETE":
            return
        status = response.status_code
        if (status == 404 or (status == 400 and request.method == "POST")) and not self.refused:
            self.refused = True
            self.on_refused(self)


class StdioTransport:
    """`stdio_client` as a `Transport`: the server confined by the sandbox, its stderr (and any line
    of its stdout that is not JSON-RPC) logged as data."""

    def __init__(self, resolved: ResolvedServer, sandbox: Sandbox) -> None:
        self._resolved, self._sandbox = resolved, sandbox
        self._cm: Any = None
        self._stderr: StderrLog | None = None

    def stderr_tail(self) -> str:
        """The server's last stderr lines, escaped and cut ("" before it started, or if none)."""
        return self._stderr.tail() if self._stderr is not None else ""

    async def __aenter__(self) -> Any:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        config = self._resolved.config
        assert config.command is not None
        stderr = self._stderr = StderrLog(config.name)
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
                    junk = STDOUT_JUNK.set(stderr.junk)  # the SDK's stdout reader starts in here
                    try:
                        streams = await self._cm.__aenter__()
                    finally:
                        STDOUT_JUNK.reset(junk)
            except BaseException:
                os.close(read_end)
                raise
        try:
            await read_stderr(config.name, read_end, stderr)
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


class HttpTransport:
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
