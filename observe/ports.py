"""Which port a process could not listen on, and who holds it: one line an operator can act on.

The holder is read from Linux's /proc: the listening socket's inode in /proc/net/tcp (and tcp6),
then the process whose file descriptors include that socket. Another user's process cannot be
looked into without privileges: then the line says the port is taken and not by whom.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def taken(host: str, port: int) -> bool:
    """Whether `host`:`port` cannot be listened on because something else listens there."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is no holder
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def holder(port: int, proc: Path = Path("/proc")) -> str | None:
    """The process listening on TCP `port`, as "pid N (its name)", if this process may see it."""
    inodes = _listening_inodes(port, proc)
    if not inodes:
        return None
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            fds = list((pid_dir / "fd").iterdir())
        except OSError:
            continue  # gone, or another user's
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return f"pid {pid_dir.name} ({_command(pid_dir)})"
    return None


def taken_line(what: str, host: str, port: int, proc: Path = Path("/proc")) -> str:
    """The one line said when `what` cannot listen on `host`:`port` because it is taken."""
    by = holder(port, proc)
    who = f" by {by}" if by else ""
    return (
        f"error: {what} cannot listen on {host}:{port}: the port is taken{who}; "
        f"stop that, or choose another port with PORT (e.g. PORT={port + 1})"
    )


def _listening_inodes(port: int, proc: Path) -> set[str]:
    found: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            local_port = fields[1].rpartition(":")[2]
            if int(local_port, 16) == port:
                found.add(fields[9])
    return found


def _command(pid_dir: Path) -> str:
    """The process's name (`comm`), never its arguments: another program's may carry a secret."""
    try:
        return (pid_dir / "comm").read_text().strip() or "?"
    except OSError:
        return "?"
