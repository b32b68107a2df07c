"""A Redis master, its replica and three sentinels on loopback: what a team running Sentinel runs.

Every node requires a password (the sentinels reach the nodes with it, the nodes each other), so
the product is shown to take it from `REDIS_URL`. The sentinels call a master down after
`DOWN_AFTER_MS` without an answer and fail over with a quorum of two.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tests.stack import free_port, wait_until

MASTER_NAME = "mymaster"
PASSWORD = "sentinel-test-pw"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000


@dataclass
class Node:
    role: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class SentinelGroup:
    """One master, one replica, three sentinels; `kill_master` SIGKILLs whichever node is master."""

    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="harness-sentinel-")))
    nodes: list[Node] = field(default_factory=list)
    sentinels: list[Node] = field(default_factory=list)

    def start(self) -> SentinelGroup:
        binary = shutil.which("redis-server")
        assert binary, "redis-server must be on PATH for the tests"
        master = self._server(binary, "master", None)
        self._server(binary, "replica", master.port)
        for i in range(3):
            port = free_port()
            conf = self.dir / f"sentinel-{i}.conf"  # a sentinel rewrites its file: one each
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master.port} 2\n"
                f"sentinel auth-pass {MASTER_NAME} {PASSWORD}\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n"
            )
            self.sentinels.append(self._spawn("sentinel", port, [binary, str(conf), "--sentinel"]))
        # Ready: the sentinels know each other and the replica, and the replica is in sync.
        wait_until(lambda: all(self._sees_all(s.port) for s in self.sentinels), timeout=30)
        wait_until(lambda: self.replicas_in_sync() == 1, timeout=30)
        return self

    def _server(self, binary: str, role: str, master_port: int | None) -> Node:
        port = free_port()
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.dir / role)]
        (self.dir / role).mkdir()
        args += ["--save", "", "--appendonly", "no", "--requirepass", PASSWORD, "--masterauth", PASSWORD]
        if master_port is not None:
            args += ["--replicaof", "127.0.0.1", str(master_port)]
        node = self._spawn(role, port, args)
        client = redis.Redis(port=port, password=PASSWORD, socket_connect_timeout=0.5)
        wait_until(lambda: _answers(client), timeout=30)
        self.nodes.append(node)
        return node

    def _spawn(self, role: str, port: int, args: list[str]) -> Node:
        log = self.dir / f"{role}-{port}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        node = Node(role, port, proc, log)
        if role == "sentinel":
            wait_until(lambda: _answers(redis.Redis(port=port, socket_connect_timeout=0.5)), timeout=30)
        return node

    def _sees_all(self, port: int) -> bool:
        try:
            state: Any = redis.Redis(port=port, socket_timeout=1).sentinel_master(MASTER_NAME)
        except redis.RedisError:
            return False
        return int(state["num-other-sentinels"]) == 2 and int(state["num-slaves"]) == 1

    @property
    def addresses(self) -> str:
        """`REDIS_SENTINELS` for this group."""
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    def env(self, db: int = 0) -> dict[str, str]:
        """The product's environment for this group: sentinels, master name, and REDIS_URL giving
        only the password and the database (its host and port point nowhere on purpose)."""
        return {
            "REDIS_SENTINELS": self.addresses,
            "REDIS_SENTINEL_MASTER": MASTER_NAME,
            "REDIS_URL": f"redis://:{PASSWORD}@127.0.0.1:1/{db}",
        }

    def master_port(self) -> int:
        """The master's port as a sentinel that answers says now."""
        for s in self.sentinels:
            with contextlib.suppress(redis.RedisError):
                sentinel = redis.Redis(port=s.port, socket_timeout=1)
                address: Any = sentinel.sentinel_get_master_addr_by_name(MASTER_NAME)
                return int(address[1])
        raise AssertionError("no sentinel answers")

    def url(self, db: int = 0) -> str:
        """A plain URL of the master now, for the test's own checks."""
        return f"redis://:{PASSWORD}@127.0.0.1:{self.master_port()}/{db}"

    def replicas_in_sync(self) -> int:
        """How many replicas the master has connected and streaming (`INFO replication`)."""
        try:
            master = redis.Redis(port=self.master_port(), password=PASSWORD, socket_timeout=1)
            info = master.info("replication")
        except redis.RedisError:
            return 0
        streaming = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return sum(1 for v in streaming if v.get("state") == "online")

    def node(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def kill_master(self) -> int:
        """SIGKILL the master (a machine lost: no shutdown, nothing flushed); its old port."""
        port = self.master_port()
        node = self.node(port)
        os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait(10)
        return port

    def stop(self) -> None:
        for node in [*self.sentinels, *self.nodes]:
            if node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
