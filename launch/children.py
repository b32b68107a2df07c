"""The processes `make run` starts and watches: spawned in groups of their own, their output copied
line by line behind a prefix, watched until one exits or a signal comes, and stopped in order.

Apart from what `make run` decides to start (`launch.local`), so that the promises about stopping
(web, then worker, then Redis, each alone until the grace ends) can be read in one place.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, TextIO

from observe import logs

STOP_TIMEOUT = 10.0
POLL_INTERVAL = 0.1
PREFIXES = {
    "web": "web  | ",
    "worker": "worker | ",
    "redis": "redis | ",
    "dev": "dev  | ",
    "playground": "play | ",
}


class DevError(Exception):
    """A problem that stops `launch.local` before or while starting, with a message for the user."""


@dataclass
class PrefixedOutput:
    """Copies each child's output to one stream, line by line, behind the child's prefix.

    With LOG_FORMAT=json (which the children inherit) every line is a JSON object instead, naming
    its `process`: a child's JSON line gains that field, any other line becomes the message of one.
    """

    stream: TextIO
    lock: threading.Lock = field(default_factory=threading.Lock)
    pumps: list[threading.Thread] = field(default_factory=list)
    json_lines: bool = field(default_factory=logs.json_mode)

    def say(self, name: str, line: str) -> None:
        """Write one line behind the prefix of `name` (or as a JSON object naming it)."""
        text = line.rstrip("\r\n")
        out = logs.as_json_line(name, text) if self.json_lines else PREFIXES.get(name, f"{name} | ") + text
        with self.lock:
            self.stream.write(out + "\n")
            self.stream.flush()

    def follow(self, name: str, pipe: IO[bytes]) -> None:
        """Copy `pipe` to the stream in a daemon thread until it closes."""

        def pump() -> None:
            with pipe:
                for raw in iter(pipe.readline, b""):
                    self.say(name, raw.decode("utf-8", errors="replace"))

        thread = threading.Thread(target=pump, name=f"dev-{name}-output", daemon=True)
        thread.start()
        self.pumps.append(thread)

    def drain(self, timeout: float = 2.0) -> None:
        """Wait (bounded) for the pumps to copy what the children wrote last."""
        deadline = time.monotonic() + timeout
        for thread in self.pumps:
            thread.join(max(0.0, deadline - time.monotonic()))


@dataclass
class Child:
    """One process started by `launch.local`."""

    name: str
    proc: subprocess.Popen[bytes]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(
    name: str,
    cmd: Sequence[str],
    env: Mapping[str, str],
    output: PrefixedOutput | None,
    stdin: bytes | None = None,
) -> Child:
    """Start one child in its own process group, its output (stdout and stderr) behind its prefix.

    Its own process group, so that Ctrl-C in the terminal reaches only us and we stop the
    children in order, rather than all of them at once. `stdin`, when given, is written to the
    child's standard input, which is then closed.
    """
    proc = subprocess.Popen(
        list(cmd),
        env=dict(env),
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE if output else None,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    if output and proc.stdout is not None:
        output.follow(name, proc.stdout)
    if stdin is not None and proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError), proc.stdin:  # a child that died early: seen by the caller
            proc.stdin.write(stdin)
    return Child(name, proc)


def stop_children(
    children: Sequence[Child], timeout: float, interrupted: threading.Event | None = None
) -> None:
    """SIGTERM the children in the order given, wait up to `timeout` s for all, then SIGKILL the rest.

    SIGTERM goes to the child alone: it is the graceful stop of gunicorn, rq and redis-server alike,
    while a work horse or gunicorn worker that got it directly would die mid-request. Whatever is
    left in a child's process group afterwards is SIGKILLed, so nothing outlives us.
    """
    for child in children:
        if child.proc.poll() is None:
            _signal(child.proc.pid, signal.SIGTERM, group=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(c.proc.poll() is None for c in children):
        if interrupted is not None and interrupted.is_set():
            break  # a second Ctrl-C: no more waiting
        time.sleep(POLL_INTERVAL)
    for child in children:
        _signal(child.proc.pid, signal.SIGKILL, group=True)
        child.proc.wait()


def _signal(pid: int, signum: int, *, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone already
        (os.killpg if group else os.kill)(pid, signum)


@contextlib.contextmanager
def stop_signals() -> Iterator[tuple[threading.Event, threading.Event]]:
    """Ctrl-C, SIGTERM or a closed terminal set the first event; a second one sets the other too.

    The previous handlers come back on exit.
    """
    stop, again = threading.Event(), threading.Event()

    def handle(signum: int, frame: object) -> None:
        if stop.is_set():
            again.set()
        stop.set()

    signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, handle) for signum in signums}
    try:
        yield stop, again
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def supervise(children: Sequence[Child], stop: threading.Event) -> Child | None:
    """Wait until `stop` is set (None) or a child exits on its own (that child)."""
    while not stop.is_set():
        for child in children:
            if child.proc.poll() is not None:
                return child
        stop.wait(POLL_INTERVAL)
    return None
