"""Starting the test MCP server (`tests/fakes/mcp_server.py`) over stdio or streamable HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.stack import free_port, wait_until

SERVER = Path(__file__).resolve().parent / "fakes" / "mcp_server.py"
TOKEN = "tok-4f1c9e-very-secret"


def calls(log: Path) -> list[dict[str, Any]]:
    """Every call the server received, in order."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def stdio_table(name: str, log: Path, **extra: str) -> str:
    """A `[[mcp.servers]]` table running the test server over stdio."""
    env = {"MCP_CALL_LOG": str(log), **extra}
    env_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    return (
        f'[[mcp.servers]]\nname = "{name}"\ncommand = {json.dumps(sys.executable)}\n'
        f'args = [{json.dumps(str(SERVER))}, "stdio"]\nenv = {{ {env_toml} }}\n'
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

    @property
    def http_log(self) -> Path:
        return self.log.with_suffix(".http.jsonl")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> HttpDesk:
        env = {**os.environ, "MCP_CALL_LOG": str(self.log), "MCP_REQUIRED_TOKEN": self.token}
        env["MCP_HTTP_LOG"] = str(self.http_log)
        mode = "http-sessions" if self.sessions else "http"
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), mode, str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._listening, timeout=20)
        return self

    def _listening(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the HTTP MCP server exited with {self.proc.returncode}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

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
    )
    return table if trust is None else table + f"trust_annotations = {str(trust).lower()}\n"
