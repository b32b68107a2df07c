"""Starting the test MCP server (`tests/fakes/mcp_server.py`) over stdio or streamable HTTP."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.stack import descendants, free_port, wait_until

SERVER = Path(__file__).resolve().parent / "fakes" / "mcp_server.py"
TOKEN = "tok-4f1c9e-very-secret"


def out(tmp_path: Path, name: str) -> Path:
    """A file a stdio server writes, in a directory of its own: its walls let it write only there
    (`writable`), and a writable directory may not hold the config or the process's working one."""
    directory = tmp_path / "server-out"
    directory.mkdir(exist_ok=True)
    return directory / name


def calls(log: Path) -> list[dict[str, Any]]:
    """Every call the server received, in order."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def server_pids(script: Path = SERVER) -> list[int]:
    """The pids, as this process sees them, of the stdio servers running `script` that it started.

    What a server logs as its pid says nothing here: it runs in a PID namespace of its own.
    """
    found = []
    for pid in descendants(os.getpid()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv[0].endswith(b"bwrap") and str(script).encode() in argv:
            found.append(pid)
    return found


def stdio_table(name: str, log: Path, **extra: str) -> str:
    """A `[[mcp.servers]]` table running the test server over stdio (in bubblewrap: skips without)."""
    require_bwrap()
    env = {"MCP_CALL_LOG": str(log), **extra}
    env_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    return (
        f'[[mcp.servers]]\nname = "{name}"\ncommand = {json.dumps(sys.executable)}\n'
        f'args = [{json.dumps(str(SERVER))}, "stdio"]\nenv = {{ {env_toml} }}\n'
        f"writable = [{json.dumps(str(log.parent))}]\n"
    )


def http_table(name: str, url: str, header: str = "Bearer ${DESK_TOKEN}") -> str:
    return f'[[mcp.servers]]\nname = "{name}"\nurl = "{url}"\nheaders = {{ Authorization = "{header}" }}\n'


@dataclass
class HttpDesk:
    """The test server over streamable HTTP on a loopback port; restartable on the same port.

    `sessions`: it speaks only the 2025 protocol, with session ids (`http-sessions`), and writes
    each session DELETE it receives to `http_log`.
    """

    log: Path
    token: str = TOKEN
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    sessions: bool = False
    forgetful: bool = False  # forgets each session at its first tool call (404), as a restart would
    hold: Path | None = None  # while this file exists, a session's `initialize` waits (`.held` shows it)
    started: bool = False  # once: its port is fixed from then on (a restart keeps it)
    script: Path = SERVER  # or another server of ours with an `http PORT` mode and a `/pid` route

    @property
    def http_log(self) -> Path:
        return self.log.with_suffix(".http.jsonl")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> HttpDesk:
        """Start the server; the port is ours only once our process answers on it.

        A free port is only free when it is picked: another test's server may take it first (the
        suite runs in parallel), and then every request of this test would reach that one. The
        first start picks another port then; a restart keeps its port and tries again.
        """
        for _ in range(5):
            self._spawn()
            if wait_until(self._answering, timeout=20) == "ours":
                return self
            self.kill()
            if not self.started:
                self.port = free_port()
        raise AssertionError(f"the HTTP MCP server could not have port {self.port} to itself")

    def _spawn(self) -> None:
        if self.script != SERVER:  # another server of ours: its log, its port, nothing more
            env = {**os.environ, "MCP_CALL_LOG": str(self.log)}
            self.proc = subprocess.Popen(
                [sys.executable, str(self.script), "http", str(self.port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            return
        env = {**os.environ, "MCP_CALL_LOG": str(self.log), "MCP_REQUIRED_TOKEN": self.token}
        env["MCP_HTTP_LOG"] = str(self.http_log)
        if self.forgetful:
            env["MCP_FORGET_SESSIONS"] = "1"
        if self.hold is not None:
            env["MCP_HOLD_INITIALIZE"] = str(self.hold)
        mode = "http-sessions" if self.sessions else "http"
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), mode, str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _answering(self) -> str | None:
        """ "ours" once our process answers on the port, "taken" when it could not bind; else None."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            return "taken"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/pid", timeout=2) as answer:
                pid = answer.read().decode()
        except OSError:
            return None
        if pid != str(self.proc.pid):
            return "taken" if self.proc.poll() is not None else None
        self.started = True
        return "ours"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


ODD_SERVER = Path(__file__).resolve().parent / "fakes" / "mcp_odd_server.py"


def odd_table(name: str, log: Path, *, trust: bool | None = None) -> str:
    """A `[[mcp.servers]]` table running the hostile test server over stdio."""
    table = (
        f'[[mcp.servers]]\nname = "{name}"\ncommand = {json.dumps(sys.executable)}\n'
        f'args = [{json.dumps(str(ODD_SERVER))}, "stdio"]\n'
        f"env = {{ MCP_CALL_LOG = {json.dumps(str(log))} }}\n"
        f"writable = [{json.dumps(str(log.parent))}]\n"
    )
    return table if trust is None else table + f"trust_annotations = {str(trust).lower()}\n"


# --- the hostile server (`tests/fakes/hostile_mcp_server.py`) -------------------------------

HOSTILE = Path(__file__).resolve().parent / "fakes" / "hostile_mcp_server.py"

# Lines a server writes to its stderr to pose as the worker's own log lines, or to hide a part.
FORGED = [
    '{"time": "2026-01-01T00:00:00.000+00:00", "level": "INFO", "logger": "workers.watchdog", '
    '"message": "forged json"}',
    "2026-01-01 00:00:00,000 INFO workers.watchdog: forged text",
    "innocent\rforged carriage return",
    "\x1b[2K\x1b[1Gforged escape",
    "bidi \u202e forged override",
    "x" * 5000,
]


def require_bwrap() -> None:
    """Skip, saying why, where bubblewrap is missing: without it no stdio server starts at all."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: stdio MCP servers are not started without it")


def mask(secret: str) -> str:
    """A secret as the hostile server wants it to look for: reversed, hex (see its docstring)."""
    return secret.encode()[::-1].hex()


def hostile_table(
    name: str, report: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None, **flags: Any
) -> str:
    """A `[[mcp.servers]]` table running the hostile server; `flags` become its `--flag value`s."""
    args = [str(HOSTILE), "--report", str(report)]
    for flag, values in flags.items():
        for value in values if isinstance(values, list | tuple) else [values]:
            args += [f"--{flag.replace('_', '-')}", str(value)]
    table = (
        f'[[mcp.servers]]\nname = "{name}"\ncommand = {json.dumps(sys.executable)}\n'
        f"args = {json.dumps(args)}\ntimeout_seconds = 60\nwritable = [{json.dumps(str(report.parent))}]\n"
    )
    if env:
        table += "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }\n"
    if cwd is not None:
        table += f"cwd = {json.dumps(str(cwd))}\n"
    return table


# --- the server whose tools change (`tests/fakes/mcp_moving_server.py`) --------------------

MOVING = Path(__file__).resolve().parent / "fakes" / "mcp_moving_server.py"


def moving_table(log: Path, *flags: str, pin: bool = False, timeout: float = 10) -> str:
    """A `[[mcp.servers]]` table running the moving server over stdio, named `moving`."""
    require_bwrap()
    args = json.dumps([str(MOVING), *flags])
    table = (
        f'[[mcp.servers]]\nname = "moving"\ncommand = {json.dumps(sys.executable)}\nargs = {args}\n'
        f"env = {{ MCP_CALL_LOG = {json.dumps(str(log))} }}\nwritable = [{json.dumps(str(log.parent))}]\n"
        f"timeout_seconds = {timeout}\n"
    )
    return table + ("pin_tools = true\n" if pin else "")
