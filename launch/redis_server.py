"""The Redis `make run` gives the bot and the worker: one named and checked (``REDIS_URL``, or
Redis Sentinel), one found on localhost:6379, or a private ``redis-server`` it starts with a fresh
password, and what an earlier start left in it.

Apart from `launch.local`, which only picks among these, since reaching, probing and starting a
Redis is a concept of its own (and the only part of `make run` that reads the store: what an earlier
start left, `store.counters.runs_held`).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from launch.children import POLL_INTERVAL, DevError, PrefixedOutput, free_port, spawn, stop_children
from runtime.connection import DEFAULT_REDIS_URL, RedisTarget, redact
from store import counters

DEFAULT_PROBE = ("localhost", 6379)
DEFAULT_DATA_DIR = Path(".redis-data")
REDIS_START_TIMEOUT = 10.0
REDIS_CHECK_TIMEOUT = 2.0
UNREACHABLE_SENTINELS = (
    "{where} does not answer ({error}): start those sentinels or correct REDIS_SENTINELS and "
    "REDIS_SENTINEL_MASTER"
)
UNREACHABLE_REDIS_URL = (
    "REDIS_URL={url} does not answer ({error}): start that Redis or correct REDIS_URL "
    "(unset, `make run` uses the one on localhost:6379 or starts its own)"
)
MISSING_REDIS_SERVER = (
    "redis-server is not on PATH and no Redis answers on {probe}: install Redis "
    "(apt install redis-server / brew install redis) or set REDIS_URL"
)
MISSING_PLAYGROUND_REDIS = (
    "redis-server is not on PATH: the playground starts a Redis of its own; install Redis "
    "(apt install redis-server / brew install redis) or set REDIS_URL"
)


def redis_answers(host: str, port: int, password: str | None = None, timeout: float = 0.5) -> bool:
    """True when a Redis on host:port replies PONG to PING, after AUTH with `password` when one is given.

    Without a password, a protected server's -NOAUTH is not an answer.
    """
    request = resp_command("PING")
    if password is not None:
        request = resp_command("AUTH", password) + request
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock, sock.makefile("rb") as replies:
            sock.sendall(request)
            if password is not None and replies.readline() != b"+OK\r\n":
                return False
            return replies.readline().startswith(b"+PONG")
    except OSError:
        return False


def resp_command(*args: str) -> bytes:
    """One command in RESP, the protocol Redis speaks."""
    encoded = [arg.encode() for arg in args]
    return f"*{len(args)}\r\n".encode() + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in encoded)


def names_redis(env: Mapping[str, str]) -> bool:
    """Whether the settings name a Redis (`REDIS_URL`, or Redis Sentinel's `REDIS_SENTINELS`)."""
    return bool(env.get("REDIS_URL", "").strip() or env.get("REDIS_SENTINELS", "").strip())


def short_client(
    url: str, env: Mapping[str, str] | None = None, timeout: float = REDIS_CHECK_TIMEOUT
) -> redis.Redis:
    """A client of the Redis the children will use (`url`, or the master `env`'s sentinels name),
    with a short timeout and no retry: for the checks made before anything starts."""
    sentinels = {k: v for k, v in (env or {}).items() if k in ("REDIS_SENTINELS", "REDIS_SENTINEL_MASTER")}
    target = RedisTarget.from_env({**sentinels, "REDIS_URL": url})
    return target.connect(socket_timeout=timeout, connect_timeout=timeout, retry=Retry(NoBackoff(), 0))


def where_is(url: str, env: Mapping[str, str]) -> str:
    """Where the children's Redis is, for a line of `make run`'s: never its password."""
    if env.get("REDIS_SENTINELS", "").strip():
        return RedisTarget.from_env({**env, "REDIS_URL": url}).describe()
    return redact(url)


def given_redis_problem(
    url: str, timeout: float = REDIS_CHECK_TIMEOUT, env: Mapping[str, str] | None = None
) -> str | None:
    """One line naming REDIS_URL (its password redacted), or the sentinels of `env`, when that Redis
    does not answer PING, else None.

    Asked before anything starts, with the client the children use (so TLS, ACL users, Unix
    sockets and Sentinel count) but a short timeout and no retry: otherwise the bot serves 503 on
    /healthz and `make run` waits a minute for it, then blames the web process.
    """
    try:
        with short_client(url, env, timeout) as client:
            client.ping()
    except (redis.RedisError, OSError, ValueError) as error:
        reason = str(error) or type(error).__name__
        password = urlsplit(url).password
        if password:
            reason = reason.replace(password, "***")
        if env and env.get("REDIS_SENTINELS", "").strip():
            target = RedisTarget.from_env({**env, "REDIS_URL": url})
            return UNREACHABLE_SENTINELS.format(where=target.describe(), error=reason)
        return UNREACHABLE_REDIS_URL.format(url=redact(url), error=reason)
    return None


def parse_probe(value: str | None) -> tuple[str, int]:
    """Read `HARNESS_DEV_REDIS_PROBE` (``host:port``); localhost:6379 when unset."""
    if not value:
        return DEFAULT_PROBE
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise DevError(f"HARNESS_DEV_REDIS_PROBE must be host:port, not {value!r}")
    return host, int(port)


def find_redis(env: Mapping[str, str], probe: tuple[str, int] = DEFAULT_PROBE) -> str | None:
    """Return the Redis URL to use, or None when a private redis-server has to be started. With
    Redis Sentinel (`REDIS_SENTINELS`) the URL gives only the password and database."""
    if env.get("REDIS_URL", "").strip():
        return env["REDIS_URL"].strip()
    if env.get("REDIS_SENTINELS", "").strip():
        return DEFAULT_REDIS_URL
    host, port = probe
    if redis_answers(host, port):
        return f"redis://{host}:{port}/0"
    return None


def start_private_redis(
    data_dir: Path, *, output: PrefixedOutput | None = None, attempts: int = 3, keep: bool = True
) -> tuple[subprocess.Popen[bytes], str]:
    """Start redis-server on 127.0.0.1 and a free port, its data in `data_dir`; wait until it answers.

    With `keep` false it writes nothing to disk (no append-only file, no snapshot): whatever it
    holds ends with it.

    It gets a fresh random password, which it reads from its standard input (``redis-server -``)
    so that it never shows in its command line (``ps``). Returns the process and the
    ``redis://:PASSWORD@127.0.0.1:PORT/0`` URL for the children; print it only through `redact`.
    Retries on another port when the chosen one was taken in the meantime.
    """
    server = shutil.which("redis-server")
    if server is None:
        raise DevError(MISSING_REDIS_SERVER.format(probe="localhost:6379"))
    data_dir.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(32)  # URL-safe, so it needs no quoting in the URL or the config
    for _ in range(attempts):
        port = free_port()
        cmd = [server, "-", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data_dir.resolve())]
        cmd += ["--appendonly", "yes", "--appendfsync", "everysec"] if keep else ["--appendonly", "no"]
        cmd += ["--save", "", "--daemonize", "no"]
        child = spawn("redis", cmd, os.environ, output, stdin=f"requirepass {password}\n".encode())
        if _wait_until_answering(child.proc, port, password):
            return child.proc, f"redis://:{password}@127.0.0.1:{port}/0"
        stop_children([child], 2.0)
    raise DevError(f"redis-server did not start (tried {attempts} ports); see its output above")


def _wait_until_answering(proc: subprocess.Popen[bytes], port: int, password: str) -> bool:
    deadline = time.monotonic() + REDIS_START_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        if redis_answers("127.0.0.1", port, password):
            return True
        time.sleep(POLL_INTERVAL)
    return False


def lock_data_dir(data_dir: Path) -> IO[str]:
    """Hold a lock on `data_dir` so that two private Redis servers never write the same files."""
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = (data_dir / ".dev.lock").open("w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise DevError(
            f"another `python -m launch` keeps its Redis data in {data_dir}; stop it first"
        ) from None
    return handle


def carried_over(url: str, env: Mapping[str, str] | None = None) -> str:
    """What an earlier start left in the Redis at `url` (or the master `env`'s sentinels name):
    runs queued or running, runs waiting for approval, in words; or why it could not be read."""
    try:
        with short_client(url, env) as client:
            active, parked = counters.runs_held(client)
    except (redis.RedisError, OSError, ValueError) as error:
        return f"could not count the runs it holds ({type(error).__name__})"
    return (
        f"carried over from earlier starts: {active} run{'s' if active != 1 else ''} queued or running, "
        f"{parked} waiting for approval"
    )


def redis_database(url: str) -> str:
    """The database number a Redis URL selects (0 when it names none)."""
    parts = urlsplit(url)
    path = parts.path.strip("/")
    for key, value in (pair.split("=", 1) for pair in parts.query.split("&") if "=" in pair):
        if key == "db":
            return value
    return path if path.isdigit() else "0"
