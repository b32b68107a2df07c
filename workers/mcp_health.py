"""A worker says where its MCP servers stand, so that `python -m workers status` can tell.

The hub knows (`McpHub.health`), but it lives in the worker process and status starts no server:
so the worker writes it into the store (`store.mcp_servers`) at start, on the watchdog's pass after
it changes, and every `SAY_EVERY` seconds meanwhile; and takes it back when it stops.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Sequence

import redis

from harness.tools.mcp import ServerHealth
from store import Store
from store.mcp_servers import SAY_EVERY

log = logging.getLogger(__name__)


def worker_name() -> str:
    """How status names this worker: its host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


class ServerReports:
    """What this worker last said of its servers, and when."""

    def __init__(self, health: Callable[[], Sequence[ServerHealth]], worker: str | None = None) -> None:
        self._health = health
        self.worker = worker or worker_name()
        self._said: dict[str, tuple[bool, str, float]] | None = None
        self._at = 0.0

    def say(self, store: Store, now: float) -> None:
        """Write where the servers stand, when it changed or `SAY_EVERY` seconds passed."""
        states = {h.name: (h.up, h.reason, h.since) for h in self._health()}
        if states == self._said and now - self._at < SAY_EVERY:
            return
        store.mcp_servers.say(self.worker, states, now)
        self._said, self._at = states, now

    def take_back(self, store: Store) -> None:
        """The worker stops: status no longer counts on what it said."""
        if self._said:
            try:
                store.mcp_servers.take_back(self.worker, list(self._said))
            except redis.RedisError as exc:
                log.info("could not take back what this worker said of its MCP servers: %s", exc)
