"""Where a stdio MCP server runs: behind walls (bubblewrap, seccomp, an egress proxy), never beside us.

A stdio server is a program the operator names, but what it does is its own (and its package's,
and whatever a prompt talks it into). It must not reach the secrets of the process that starts it
(the worker, or the terminal agent): the Slack tokens, the signing secret, the API key, the Redis
password, the other servers' `${VAR}` values, the relay's token; nor change what decides what runs
(the config, the audit, the code, Redis). Without walls it runs as that process's child and user:
it reads them in `/proc/<parent>/environ`, in `.env`, and writes a grant into Redis on loopback.

So every stdio server runs under bubblewrap (`bwrap`, Debian's `bubblewrap`):

- in PID, network, IPC and UTS namespaces of its own with a fresh `/proc`: it sees its own
  processes and nothing else, and has no network but a loopback of its own (no Redis, no bot, no
  `/metrics`, no cloud metadata). With `network = true` it reaches public addresses through the
  worker's egress proxy (`harness.tools.egress`), never loopback or private ones;
- with the environment it is owed and no more: `PATH`, `LANG`, `TZ` (those the process has), `HOME`
  (its own directory) and its own configured `env`; with `network`, the proxy's variables. bwrap
  itself is started with that environment too, since its first process is one the server can read;
- with the machine's files read-only, secrets not there at all, its own temporary directories, and
  only its `cwd` and `writable` directories writable: `harness.tools.walls` makes that view;
- under a seccomp filter its first program installs (`harness/tools/sandbox_init.py`): no new Unix
  socket (a read-only mount does not stop a connect to one), no namespaces, mounts, ptrace, keyrings
  or io_uring, only the native system call ABI;
- as root (a worker in a container), with no capability at all, and with `/proc/sys`, `/sys` and
  `/proc/sysrq-trigger` read-only: root's uid alone may write `core_pattern` or `uevent_helper`,
  which would make the kernel run a program outside;
- in a new session (no terminal to inject keystrokes into) and dying with its parent, so a
  worker killed with SIGKILL leaves no server behind.

When bubblewrap is missing, or the kernel or a container refuses it namespaces or seccomp, or the
server's settings would put a hole in its walls (a `writable` directory holding the config), the
server is not started: it is away, with one log line per attempt that says why and how to fix it.
That is the fail-closed choice a security reviewer expects: an opt-out would be the first thing an
attacker asks for, and the contract has no key for one.

The worker and the terminal agent also call `harness.tools.undumpable.protect_process()` first.

A server's stderr is not the process's stderr: `StderrLog` reads it from a pipe and logs each line
as data under the server's name (control characters escaped, cut at `LINE_BYTES`), at most
`STDERR_BUDGET_BYTES` every `STDERR_WINDOW_SECONDS`, and says how much it dropped. A line of its
stdout that is not JSON-RPC (`harness.tools.mcp_bounds.WholeLines`) is logged the same way, within
the same budget, at WARNING; and its last `TAIL_LINES` stderr lines are kept (`tail`), for the reason
given when it exits before its session opened (a server that crashes at start says why there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness import texts
from harness.tools import walls
from harness.tools.mcp_command import find_program, shebang

log = logging.getLogger("harness.mcp")
stderr_log = logging.getLogger("harness.mcp.stderr")

ALLOWED_ENV = ("PATH", "HOME", "LANG", "TZ")
_PROBE_SECONDS = 10.0

STDERR_BUDGET_BYTES = 64 * 1024
STDERR_WINDOW_SECONDS = 60.0
LINE_BYTES = 2000
TAIL_LINES, TAIL_CHARS = 4, 200  # the stderr lines kept for `StderrLog.tail`, each cut to this
_ESCAPED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


class SandboxUnavailable(RuntimeError):
    """A stdio server cannot be started behind its walls here: it is not started.

    Its message is the whole log line's reason, with how to fix it: it is never cut.
    """


def server_environment(own: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """A server's whole environment: the allowed variables the process has, then its own `env`."""
    return {**{k: environ[k] for k in ALLOWED_ENV if k in environ}, **own}


@dataclass(frozen=True)
class Confined:
    """What to start instead of a server's command: bwrap, its arguments, environment and cwd."""

    command: str
    args: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)
    cwd: str = "/"


@dataclass(frozen=True)
class Server:
    """What the walls of one stdio server are made from: its `[[mcp.servers]]` table's keys."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)  # resolved: secrets
    cwd: str | None = None
    writable: tuple[str, ...] = ()
    network: bool | tuple[str, ...] = False  # True: any public host; a tuple: only these hosts


@dataclass
class Sandbox:
    """Puts stdio servers behind walls; `hidden` directories are not in their view (the relay's)."""

    hidden: tuple[str, ...] = ()
    state_dir: str | None = None  # where servers' own directories live (default: walls.state_directory)
    egress: Any = None  # the EgressProxy of servers with `network`, started at the first one
    _works: str | None = None  # the bwrap found to work here, once a probe said so
    _places: walls.Places | None = None

    def confine(self, server: Server, environ: Mapping[str, str] | None = None) -> Confined:
        """bwrap running `server` behind its walls; `SandboxUnavailable` or `CommandMissing` if not."""
        environ = os.environ if environ is None else environ
        bwrap = self._bwrap(environ)
        door = self._door(server) if server.network else None  # first: its directory is hidden too
        places = self._places or walls.Places.of_process(environ, self.hidden)
        self._places = places
        home = walls.private_home(self.state_dir or walls.state_directory(environ), server.name)
        cwd = os.path.abspath(server.cwd) if server.cwd else home
        env = server_environment({"HOME": cwd, **server.env}, environ)
        # Without a `cwd`, relative paths in `command` and `args` are read from the worker's working
        # directory, as they always were; the server itself starts in its own directory.
        base = cwd if server.cwd else places.workdir
        program = find_program(server.command, env.get("PATH"), base)
        args = server.args if server.cwd else _from_workdir(server.args, places.workdir)
        for directory in (cwd, *server.writable):
            if not os.path.isdir(directory):
                raise SandboxUnavailable(texts.SANDBOX_NO_DIRECTORY.format(path=escape(directory)))
        interpreter = os.path.realpath(sys.executable)
        init = [interpreter, "-I", "-S", _INIT]
        bound: list[tuple[str, str]] = []
        if door is not None:
            bound.append((door, _DOOR))
            init += ["--egress", _DOOR, "--port", str(_PROXY_PORT)]
            env.update(_PROXY_ENVIRONMENT)
        runs = [program, *filter(None, [_interpreter(program)])]  # a script, and the interpreter it names
        needed = [
            *runs,
            *(v for r in runs for v in _venv(r)),
            *_named(args, cwd),
            interpreter,
            sys.base_prefix,
            _INIT,
        ]
        try:
            view = walls.plan(
                places,
                cwd=cwd,
                writable=server.writable,
                needed=needed,
                programs=[*runs, *(os.path.realpath(r) for r in runs)],
                bound=bound,
            )
        except walls.WallsRefused as exc:
            raise SandboxUnavailable(texts.SANDBOX_WALLS_REFUSED.format(why=exc)) from None
        flags = [*self._flags(), *view.args, "--chdir", view.cwd]
        # The MCP SDK adds a few variables of its own to the environment it starts bwrap with.
        flags += [a for name in sorted(_sdk_defaults() - set(env)) for a in ("--unsetenv", name)]
        return Confined(bwrap, (*flags, "--", *init, "--", program, *args), env, view.cwd)

    def close(self) -> None:
        """Close the egress proxy, if one was started, and remove its doors' directory."""
        if self.egress is not None:
            self.egress.close()
            shutil.rmtree(self.egress.directory, ignore_errors=True)
            self.egress = None

    def _door(self, server: Server) -> str:
        if self.egress is None:
            from harness.tools.egress import EgressProxy

            directory = tempfile.mkdtemp(prefix="harness-egress-")
            self.hidden, self._places = (*self.hidden, directory), None  # no server sees the doors
            self.egress = EgressProxy(directory).start()
        hosts = None if server.network is True else tuple(server.network or ())
        return str(self.egress.open_door(server.name, hosts))

    @staticmethod
    def _flags() -> list[str]:
        flags = ["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
        flags += ["--unshare-uts", "--unshare-cgroup-try"]
        if os.geteuid() == 0:
            flags += ["--cap-drop", "ALL"]  # root only as the owner of root's files, no more
        return flags

    def _bwrap(self, environ: Mapping[str, str]) -> str:
        bwrap = shutil.which("bwrap", path=environ.get("PATH"))
        if bwrap is None:
            raise SandboxUnavailable(texts.SANDBOX_MISSING)
        if bwrap != self._works:
            self._probe(bwrap, environ)
            self._works = bwrap
        return bwrap

    def _probe(self, bwrap: str, environ: Mapping[str, str]) -> None:
        """Start the walls around `true`: a kernel or a container may refuse namespaces or seccomp."""
        true = shutil.which("true", path=environ.get("PATH")) or "/bin/true"
        interpreter = os.path.realpath(sys.executable)
        places = walls.Places(workdir="/")
        view = walls.plan(places, cwd="/tmp", needed=[interpreter, sys.base_prefix, _INIT, true])
        try:
            done = subprocess.run(
                [bwrap, *self._flags(), *view.args, "--", interpreter, "-I", "-S", _INIT, "--", true],
                env=server_environment({}, environ),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=_PROBE_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise SandboxUnavailable(texts.SANDBOX_REFUSED.format(error=escape(error)[:200])) from exc
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            error = escape(said[-1])[:200] if said else f"exit status {done.returncode}"
            raise SandboxUnavailable(texts.SANDBOX_REFUSED.format(error=error))


_INIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_init.py")
_DOOR = "/run/harness-egress.sock"  # where the egress door is bound inside the sandbox
_PROXY_PORT = 3128  # the sandbox's own loopback: nothing else listens there
_PROXY_URL = f"http://127.0.0.1:{_PROXY_PORT}"
# What a server with `network` is told: where its one way out is (Node's fetch heeds it when told to).
_PROXY_ENVIRONMENT = {
    **dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"), _PROXY_URL),
    **dict.fromkeys(("ALL_PROXY", "all_proxy"), _PROXY_URL),
    "NODE_USE_ENV_PROXY": "1",
}


_SCRIPTS = (".py", ".js", ".mjs", ".cjs", ".ts", ".sh", ".rb", ".pl")


def _from_workdir(args: Sequence[str], workdir: str) -> tuple[str, ...]:
    """`args` with each relative path to a file of the worker's working directory made absolute:
    one with a `/` in it, or a script's name, that names an existing file there."""
    out = []
    for arg in args:
        relative = not arg.startswith(("-", "/", "~")) and ("/" in arg or arg.endswith(_SCRIPTS))
        path = os.path.join(workdir, arg)
        out.append(os.path.normpath(path) if relative and os.path.isfile(path) else arg)
    return tuple(out)


def _interpreter(program: str) -> str | None:
    """The interpreter a script's `#!` line names by its absolute path (`#!/usr/bin/env NAME` finds
    NAME on the PATH, which is in view anyway); None for a program that is no such script."""
    words = shebang(program)
    if not words or not os.path.isabs(words[0]) or os.path.basename(words[0]) == "env":
        return None
    return words[0]


def _venv(program: str) -> list[str]:
    """The virtual environment `program` is in (`…/bin/python` beside a `pyvenv.cfg`), if any."""
    root = os.path.dirname(os.path.dirname(program))
    return [root] if os.path.isfile(os.path.join(root, "pyvenv.cfg")) else []


def _named(args: Sequence[str], cwd: str) -> list[str]:
    """The existing paths the arguments name (`--flag=PATH` too), absolute or from `cwd`."""
    found = []
    for arg in args:
        for value in (arg, arg.partition("=")[2]):
            if value and not value.startswith("-"):
                path = os.path.join(cwd, os.path.expanduser(value))
                if os.path.lexists(path):
                    found.append(os.path.abspath(path))
    return found


def _sdk_defaults() -> set[str]:
    from mcp.client.stdio import get_default_environment

    return set(get_default_environment())


# --- the server's stderr, as data ----------------------------------------------------------------


def escape(text: str) -> str:
    """`text` with every control, format and line-separator character written as an escape.

    No `\\r`, ANSI sequence, newline or bidi override of a server can move, hide or start a line.
    """
    if text.isprintable():
        return text
    return "".join(
        _escape_char(ch) if ch != " " and unicodedata.category(ch)[0] in "CZ" else ch for ch in text
    )


def _escape_char(ch: str) -> str:
    if ch in _ESCAPED:
        return _ESCAPED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class StderrLog(asyncio.Protocol):
    """Reads a server's stderr pipe on the hub's loop; logs each line as data, within a budget."""

    def __init__(
        self,
        server: str,
        *,
        budget: int = STDERR_BUDGET_BYTES,
        window: float = STDERR_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server = server
        self._budget, self._window, self._clock = budget, window, clock
        self._pending = bytearray()
        self._skipping = False  # inside the rest of a line already logged cut
        self._spent = self._dropped = 0
        self._since = clock()
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.ReadTransport | None = None
        self.ended = asyncio.Event()
        self._recent: deque[str] = deque(maxlen=TAIL_LINES)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.ReadTransport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._pending += data
        while (end := self._pending.find(b"\n")) >= 0:
            line = bytes(self._pending[:end])
            del self._pending[: end + 1]
            if self._skipping:
                self._skipping = False
                self._dropped += len(line) + 1
                self._report_later()
            else:
                self._line(line)
        if len(self._pending) > LINE_BYTES:  # a line that does not end: log its start, drop the rest
            if self._skipping:
                self._dropped += len(self._pending)
                self._report_later()
            else:
                self._line(bytes(self._pending))
                self._skipping = True
            self._pending.clear()

    def eof_received(self) -> bool | None:
        self.ended.set()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.finish()

    async def close(self, wait: float) -> None:
        """Read what is left (up to `wait` seconds: the server is gone), then `finish`."""
        if self._transport is not None and not self.ended.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ended.wait(), wait)
        self.finish()

    def finish(self) -> None:
        """Log the last line and what was dropped; close the pipe. Idempotent."""
        if self._pending and not self._skipping:
            self._line(bytes(self._pending))
        self._pending.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._report()
        if self._transport is not None:
            transport, self._transport = self._transport, None
            transport.close()
        self.ended.set()

    def junk(self, raw: bytes) -> None:
        """A line of the server's stdout that is not JSON-RPC: logged as data, within the budget."""
        self._line(raw.rstrip(b"\r\n"), "stdout, not JSON-RPC")

    def tail(self) -> str:
        """The server's last stderr lines, escaped and cut ("" when it wrote none)."""
        return " | ".join(self._recent)

    def _line(self, raw: bytes, stream: str = "stderr") -> None:
        now = self._clock()
        if now - self._since >= self._window:
            self._report()
            self._since, self._spent = now, 0
        if raw.endswith(b"\r"):
            raw = raw[:-1]  # a CRLF line ending, not a trick
        if not raw:
            return
        if stream == "stderr":
            self._recent.append(escape(raw[:TAIL_CHARS].decode("utf-8", "backslashreplace")))
        shown, cut = raw[:LINE_BYTES], len(raw) - LINE_BYTES
        if self._spent + len(shown) > self._budget:
            self._dropped += len(raw) + 1
            self._report_later()
            return
        self._spent += len(shown)
        text = escape(shown.decode("utf-8", "backslashreplace"))
        if cut > 0:
            text += texts.MCP_STDERR_CUT.format(bytes=cut)
        said = stderr_log.info if stream == "stderr" else stderr_log.warning
        said("MCP server %s %s: %s", self.server, stream, text)

    def _report_later(self) -> None:
        """Say what was dropped when the window ends, even if the server says nothing more."""
        if self._timer is None and self._transport is not None:
            delay = max(0.0, self._since + self._window - self._clock())
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_window)

    def _on_window(self) -> None:
        self._timer = None
        self._report()
        self._since, self._spent = self._clock(), 0

    def _report(self) -> None:
        if self._dropped:
            stderr_log.warning(
                "MCP server %s stderr dropped: %s bytes (more than %s bytes in %.0f s)",
                self.server,
                f"{self._dropped:,}",
                f"{self._budget:,}",
                self._window,
            )
            self._dropped = 0


async def read_stderr(server: str, fd: int, into: StderrLog | None = None) -> StderrLog:
    """Start logging the pipe `fd` (a server's stderr) on the running loop, into `into` (or a new
    log); the log owns the fd."""
    pipe = open(fd, "rb", buffering=0)  # noqa: SIM115 - the loop's transport closes it
    made = into if into is not None else StderrLog(server)
    try:
        _, protocol = await asyncio.get_running_loop().connect_read_pipe(lambda: made, pipe)
    except BaseException:
        pipe.close()
        raise
    return protocol
