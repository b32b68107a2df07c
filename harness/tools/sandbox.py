"""Where a stdio MCP server runs: a bubblewrap sandbox that keeps the filesystem and hides the rest.

A stdio server is a program the operator names, but what it does is its own (and its package's,
and whatever a prompt talks it into). It must not reach the secrets of the process that starts it
(the worker, or the terminal agent): the Slack tokens, the signing secret, the API key, the Redis
password, the other servers' `${VAR}` values, the relay's token. Without a sandbox it runs as
that process's child and user and reads them all in `/proc/<parent>/environ` or `/mem`.

So every stdio server runs under bubblewrap (`bwrap`, Debian's `bubblewrap`):

- in a PID namespace of its own with a fresh `/proc`: it sees its own processes and nothing
  else, not the worker, not its horses, not another server. What it could read of a process it
  cannot see is nothing. This holds whatever user the worker runs as, root included, which a
  second user account or `PR_SET_DUMPABLE` alone would not give (root reads every `/proc` entry);
- with the environment it is owed and no more: `PATH`, `HOME`, `LANG`, `TZ` (those the process
  has) and its own configured `env`. bwrap itself is started with that environment too, since its
  first process (PID 1 in the namespace) is one the server can read;
- with the whole filesystem where it was (`--bind / /`): its command, arguments, `cwd` and the
  files they name work as before. Only the relay's private directory is covered by an empty
  tmpfs (`hidden`), so it cannot even reach that socket, which also wants a token;
- as root (a worker in a container), without root's capabilities beyond the filesystem ones
  (`CAP_CHOWN`, `CAP_DAC_OVERRIDE`, `CAP_FOWNER`, `CAP_FSETID`, where the process has them), and
  with `/proc/sys`, `/sys` and `/proc/sysrq-trigger` read-only: root's uid alone may write
  `core_pattern` or `uevent_helper`, which would make the kernel run a program outside;
- in a new session (no terminal to inject keystrokes into) and dying with its parent, so a
  worker killed with SIGKILL leaves no server behind.

When bubblewrap is missing, or the kernel or a container refuses it namespaces, the server is not
started: it is away, with one log line per attempt that says why and how to fix it. That is the
fail-closed choice a security reviewer expects: an opt-out would be the first thing an attacker
asks for, and the contract has no key for one.

The worker and the terminal agent also call `protect_process()` first: not dumpable, their own
`/proc` entries (environment, memory) are closed to every other process of their user that lacks
`CAP_SYS_PTRACE`, sandboxed or not. Defence in depth: the sandbox alone already hides them.

A server's stderr is not the process's stderr: `StderrLog` reads it from a pipe and logs each line
as data under the server's name (control characters escaped, cut at `LINE_BYTES`), at most
`STDERR_BUDGET_BYTES` every `STDERR_WINDOW_SECONDS`, and says how much it dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
import shutil
import subprocess
import time
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from harness import texts

log = logging.getLogger("harness.mcp")
stderr_log = logging.getLogger("harness.mcp.stderr")

ALLOWED_ENV = ("PATH", "HOME", "LANG", "TZ")
# Root's capabilities a server keeps: those that make up root's access to files, nothing else.
_FILE_CAPS = {"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_FSETID": 4}
_PROBE_SECONDS = 10.0
_PR_SET_DUMPABLE = 4

STDERR_BUDGET_BYTES = 64 * 1024
STDERR_WINDOW_SECONDS = 60.0
LINE_BYTES = 2000
_ESCAPED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot make a sandbox here: no stdio server is started."""


def server_environment(own: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """A server's whole environment: the allowed variables the process has, then its own `env`."""
    return {**{k: environ[k] for k in ALLOWED_ENV if k in environ}, **own}


@dataclass(frozen=True)
class Confined:
    """What to start instead of a server's command: bwrap, its arguments, the environment to give it."""

    command: str
    args: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)


@dataclass
class Sandbox:
    """Confines stdio servers; `hidden` directories are empty inside (the relay's)."""

    hidden: tuple[str, ...] = ()
    _works: str | None = None  # the bwrap found to work here, once a probe said so

    def confine(
        self,
        command: str,
        args: Sequence[str],
        own_env: Mapping[str, str],
        cwd: str | None,
        environ: Mapping[str, str] | None = None,
    ) -> Confined:
        """bwrap running `command` confined; `SandboxUnavailable` or `FileNotFoundError` if it cannot."""
        environ = os.environ if environ is None else environ
        env = server_environment(own_env, environ)
        program = _resolve(command, env.get("PATH"), cwd)
        bwrap = self._bwrap(environ)
        where = os.path.abspath(cwd) if cwd else os.getcwd()
        flags = [*self._flags(), "--chdir", where]
        # The MCP SDK adds a few variables of its own to the environment it starts bwrap with.
        flags += [a for name in sorted(_sdk_defaults() - set(env)) for a in ("--unsetenv", name)]
        # bwrap sets PWD after it changes directory, whatever it was told; `env -u` takes it out.
        unset_pwd = () if "PWD" in env else _without_pwd(env.get("PATH"))
        return Confined(bwrap, (*flags, "--", *unset_pwd, program, *args), env)

    def _flags(self) -> list[str]:
        flags = ["--die-with-parent", "--new-session", "--unshare-pid", "--bind", "/", "/"]
        flags += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
        flags += ["--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
        flags += ["--ro-bind-try", "/sys", "/sys", "--dev", "/dev"]
        for directory in self.hidden:
            if os.path.isdir(directory):
                flags += ["--tmpfs", directory]
        if os.geteuid() == 0:
            flags += ["--cap-drop", "ALL"]
            for name in _own_caps(_FILE_CAPS):
                flags += ["--cap-add", name]
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
        """Start a sandbox that does nothing: a kernel or a container may refuse its namespaces."""
        true = shutil.which("true", path=environ.get("PATH")) or "/bin/true"
        try:
            done = subprocess.run(
                [bwrap, *self._flags(), "--", true],
                env=server_environment({}, environ),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=_PROBE_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise SandboxUnavailable(texts.SANDBOX_REFUSED.format(error=error)) from exc
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            error = escape(said[-1])[:200] if said else f"exit status {done.returncode}"
            raise SandboxUnavailable(texts.SANDBOX_REFUSED.format(error=error))


def _resolve(command: str, path: str | None, cwd: str | None) -> str:
    """The program `command` names, found as the spawn would find it, or `FileNotFoundError`."""
    if os.sep in command:
        full = os.path.join(cwd or os.getcwd(), command)
        if os.path.isfile(full) and os.access(full, os.X_OK):
            return os.path.abspath(full)
    elif (found := shutil.which(command, path=path)) is not None:
        return found
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)


def _without_pwd(path: str | None) -> tuple[str, ...]:
    """`env -u PWD --`, to start the program with; nothing where there is no `env` (PWD stays)."""
    env = shutil.which("env", path=path) or shutil.which("env", path=os.defpath)
    return (env, "-u", "PWD", "--") if env else ()


def _sdk_defaults() -> set[str]:
    from mcp.client.stdio import get_default_environment

    return set(get_default_environment())


def _own_caps(wanted: Mapping[str, int]) -> list[str]:
    """The capabilities of `wanted` this process has in its effective set (bwrap cannot add others)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            line = next(row for row in status if row.startswith("CapEff:"))
    except (OSError, StopIteration):
        return []
    effective = int(line.split()[1], 16)
    return [name for name, bit in wanted.items() if effective >> bit & 1]


def protect_process() -> bool:
    """Make this process not dumpable: its `/proc` entries close to other processes of its user.

    Forked children (RQ's work horses) keep it; a program it executes does not (its servers are
    started with a clean environment instead). False where the kernel has no `prctl`.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


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

    def _line(self, raw: bytes) -> None:
        now = self._clock()
        if now - self._since >= self._window:
            self._report()
            self._since, self._spent = now, 0
        if raw.endswith(b"\r"):
            raw = raw[:-1]  # a CRLF line ending, not a trick
        if not raw:
            return
        shown, cut = raw[:LINE_BYTES], len(raw) - LINE_BYTES
        if self._spent + len(shown) > self._budget:
            self._dropped += len(raw) + 1
            self._report_later()
            return
        self._spent += len(shown)
        text = escape(shown.decode("utf-8", "backslashreplace"))
        if cut > 0:
            text += texts.MCP_STDERR_CUT.format(bytes=cut)
        stderr_log.info("MCP server %s stderr: %s", self.server, text)

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


async def read_stderr(server: str, fd: int) -> StderrLog:
    """Start logging the pipe `fd` (a server's stderr) on the running loop; the log owns the fd."""
    pipe = open(fd, "rb", buffering=0)  # noqa: SIM115 - the loop's transport closes it
    try:
        _, protocol = await asyncio.get_running_loop().connect_read_pipe(lambda: StderrLog(server), pipe)
    except BaseException:
        pipe.close()
        raise
    return protocol
