"""How a process reaches Redis: one `REDIS_URL`, or the master Redis Sentinel names.

With ``REDIS_SENTINELS`` (``host:port,host:port``) the master of ``REDIS_SENTINEL_MASTER``
(``mymaster`` by default) is asked of the sentinels before each new connection, and ``REDIS_URL``
gives only what the master is reached with: its password (and ACL user), its database, TLS
(``rediss://``). Its host and port are not used. The sentinels themselves are reached without a
password, as redis-py does by default.

A failover needs no restart: redis-py's `SentinelConnectionPool` asks the sentinels again when a
connection fails or finds the old master demoted (READONLY), and a command is retried on a new
connection (the client's retry policy: ten tries, backing off from 10 ms to 1 s with jitter, about
6 s in all). What outlasts that fails as Redis down does: the bot answers 503 (Slack retries), a
horse dies and is forked again, the watchdog tries its next pass.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.connection import SSLConnection, parse_url
from redis.sentinel import Sentinel

from store.replicas import wait_ms_setting

DEFAULT_REDIS_URL = "redis://localhost:6379/0"
DEFAULT_MASTER = "mymaster"
SOCKET_TIMEOUT = 10.0
CONNECT_TIMEOUT = 5.0
HEALTH_CHECK_INTERVAL = 30


class RedisSettingsError(ValueError):
    """A Redis setting that cannot be used, in one line naming it."""


@dataclass(frozen=True)
class RedisTarget:
    """Where Redis is: a URL, or sentinels and the name of the master they watch."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    master: str = DEFAULT_MASTER

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RedisTarget:
        env = os.environ if env is None else env
        url = (env.get("REDIS_URL") or "").strip() or DEFAULT_REDIS_URL
        try:
            parse_url(url)
        except ValueError as exc:
            raise RedisSettingsError(f"REDIS_URL cannot be used ({exc})") from None
        try:
            wait_ms_setting(env)  # read by every store of the process: checked once, at start
        except ValueError as exc:
            raise RedisSettingsError(str(exc)) from None
        raw = (env.get("REDIS_SENTINELS") or "").strip()
        master = (env.get("REDIS_SENTINEL_MASTER") or "").strip() or DEFAULT_MASTER
        if not raw:
            return cls(url)
        if urlsplit(url).scheme == "unix":
            raise RedisSettingsError(
                "REDIS_URL must be redis:// or rediss:// with REDIS_SENTINELS, not unix://"
            )
        return cls(url, tuple(_address(part) for part in raw.split(",")), master)

    @property
    def uses_sentinel(self) -> bool:
        return bool(self.sentinels)

    def open_warning(self) -> str | None:
        """One line when Redis is reached with no password at an address other processes share.

        Whoever can write Redis can write a grant, a decision or a parked run: a password-less Redis
        is fit only for loopback on a machine of one's own (or a Unix socket whose mode keeps
        others out). Production needs `requirepass` (or an ACL user) and the password in REDIS_URL.
        """
        parts = urlsplit(self.url)
        if parts.scheme == "unix" or parts.password:
            return None
        hosts = (
            [host for host, _ in self.sentinels] if self.uses_sentinel else [parts.hostname or "localhost"]
        )
        shared = [h for h in hosts if not _loopback(h)]
        if not shared:
            return None
        setting = "REDIS_SENTINELS" if self.uses_sentinel else "REDIS_URL"
        return (
            f"warning: Redis at {', '.join(shared)} ({setting}) "
            "is reached with no password: anyone who reaches it can write a grant or a decision. Set "
            "requirepass (or an ACL user) and give it in REDIS_URL (redis://:PASSWORD@host:6379/0)"
        )

    def describe(self) -> str:
        """Which setting says where Redis is, for an error: never its password."""
        if self.uses_sentinel:
            where = ",".join(f"{host}:{port}" for host, port in self.sentinels)
            return f"the master {self.master!r} of Redis Sentinel at {where} (REDIS_SENTINELS)"
        return "REDIS_URL"

    def connect(
        self,
        *,
        socket_timeout: float = SOCKET_TIMEOUT,
        connect_timeout: float = CONNECT_TIMEOUT,
        health_check_interval: int = HEALTH_CHECK_INTERVAL,
        **extra: Any,
    ) -> redis.Redis:
        """A client of the master: reconnecting to whichever node is master when the sentinels say so."""
        options: dict[str, Any] = dict(
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            health_check_interval=health_check_interval,
            **extra,
        )
        if not self.uses_sentinel:
            return redis.Redis.from_url(self.url, **options)
        given = parse_url(self.url)
        master_options = {k: v for k, v in given.items() if k not in ("host", "port", "connection_class")}
        if given.get("connection_class") is SSLConnection:
            master_options["ssl"] = True
        sentinel_options = {
            "socket_timeout": min(socket_timeout, CONNECT_TIMEOUT),
            "socket_connect_timeout": min(connect_timeout, CONNECT_TIMEOUT),
        }
        sentinel = Sentinel(list(self.sentinels), sentinel_kwargs=sentinel_options, **options)
        return sentinel.master_for(self.master, **master_options)


def connect(env: Mapping[str, str] | None = None, **options: Any) -> redis.Redis:
    """The Redis client of this process, as the environment says (`RedisTarget`)."""
    return RedisTarget.from_env(env).connect(**options)


def _address(part: str) -> tuple[str, int]:
    host, sep, port = part.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RedisSettingsError(f"REDIS_SENTINELS must be host:port,host:port, not {part.strip()!r}")
    return host, int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def redact(url: str) -> str:
    """The URL without its password, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


def where(env: Mapping[str, str]) -> str:
    """Where the Redis of `env` is, for a line an operator reads: never its password."""
    target = RedisTarget.from_env(env)
    if target.uses_sentinel:
        return target.describe()
    return redact(env.get("REDIS_URL", "").strip() or DEFAULT_REDIS_URL)
