"""The writes behind a promise wait until a replica has them (`WAIT`), when the master has one.

Redis replicates asynchronously: a write the master answered may be lost when Sentinel promotes a
replica that had not received it yet. The writes this project makes a promise on (a mention's
acceptance, before Slack gets its 200; a decision, before the click is answered; a call's
write-ahead mark, before the call runs; a run's end; a live message opened, before it grows)
are sent in one round trip with ``WAIT 1 <ms>`` on the same connection, since WAIT counts the
writes of its own connection. Sentinel
promotes the replica with the most of the master's stream, so one replica acknowledging is enough.

A master with no replica (a single Redis, the playground's) is never asked to wait: the count of
replicas is read with ``INFO replication`` at most every `CHECK_SECONDS`, never per write. A WAIT
that times out leaves the write done on the master; it is logged and counted
(`harness_replica_wait_shortfalls_total`), and the caller goes on: a bounded wait, not a refusal.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError

log = logging.getLogger(__name__)

CHECK_SECONDS = 5.0  # how stale the count of replicas may be
DEFAULT_WAIT_MS = 1000  # HARNESS_REPLICA_WAIT_MS: a mention's ack and a click's answer fit in Slack's 3 s
PROMISES = ("mention", "retry", "decision", "stop", "write_ahead", "park", "finish", "live")

Shortfall = Callable[[str], None]  # told which promise's write no replica acknowledged in time


def wait_ms_setting(env: Mapping[str, str] | None = None) -> int:
    """``HARNESS_REPLICA_WAIT_MS``: how long a promised write waits for a replica; ValueError (one
    line) when it is not 1-60000. The processes check it at start (`runtime.connection`)."""
    raw = (os.environ if env is None else env).get("HARNESS_REPLICA_WAIT_MS", "").strip()
    if not raw:
        return DEFAULT_WAIT_MS
    if not raw.isdigit() or not 0 < int(raw) <= 60_000:
        raise ValueError(f"HARNESS_REPLICA_WAIT_MS must be milliseconds from 1 to 60000, not {raw!r}")
    return int(raw)


class Replicas:
    """How many replicas the master has (read now and then), and writes sent with a WAIT for one."""

    def __init__(
        self, connection: redis.Redis, *, wait_ms: int | None = None, shortfall: Shortfall | None = None
    ) -> None:
        self.redis = connection
        if wait_ms is None:
            try:
                wait_ms = wait_ms_setting()
            except ValueError:
                wait_ms = DEFAULT_WAIT_MS  # refused at start; a tool reading a store never fails on it
        self.wait_ms = wait_ms
        self.shortfall = shortfall  # the process's: counts them in its metrics
        self._count = 0
        self._checked = float("-inf")
        self._lock = threading.Lock()
        self._warned = False

    def count(self) -> int:
        """The master's connected replicas, as `INFO replication` said within `CHECK_SECONDS`."""
        now = time.monotonic()
        if now - self._checked < CHECK_SECONDS:
            return self._count
        with self._lock:
            if now - self._checked < CHECK_SECONDS:
                return self._count
            try:
                info = self.redis.info("replication")
                self._count = int(info.get("connected_slaves") or 0) if info.get("role") == "master" else 0
            except redis.ResponseError as exc:  # INFO refused (an ACL): no waiting, said once
                if not self._warned:
                    self._warned = True
                    log.warning("cannot read INFO replication (%s): writes will not wait for replicas", exc)
                self._count = 0
            self._checked = now
        return self._count

    def forget(self) -> None:
        """Read the count again on the next write (after a failover, say)."""
        self._checked = float("-inf")

    def run(self, script: Script, keys: Sequence[Any], args: Sequence[Any], promise: str) -> Any:
        """`script`'s answer, sent with a WAIT for one replica when the master has one."""
        if self.count() == 0:
            return script(keys=list(keys), args=list(args))
        answers = self._send(script, keys, args)
        if isinstance(answers[0], NoScriptError):  # Redis lost its scripts: it ran nothing, send again
            self.redis.script_load(script.script)
            answers = self._send(script, keys, args)
        answer, acked = answers
        if isinstance(answer, Exception):
            raise answer
        self.check(acked, promise)
        return answer

    def waits(self, pipe: Pipeline) -> bool:
        """Queue a WAIT at the end of `pipe` (its writes go first) when the master has a replica;
        `check` its answer, the pipeline's last, then. False when nothing was queued."""
        if self.count() == 0:
            return False
        pipe.execute_command("WAIT", 1, self.wait_ms)
        return True

    def _send(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        with self.redis.pipeline(transaction=False) as pipe:  # one connection: WAIT counts its writes
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", 1, self.wait_ms)
            return pipe.execute(raise_on_error=False)

    def check(self, acked: Any, promise: str) -> None:
        """Log and count a WAIT (its answer `acked`) that no replica answered in time."""
        if isinstance(acked, int) and acked >= 1:
            return
        self.forget()  # a replica gone, or a failover: ask again before the next write
        why = acked if isinstance(acked, Exception) else f"no replica acknowledged it in {self.wait_ms} ms"
        log.warning("the %s write is on the Redis master only: %s", promise, why)
        if self.shortfall is not None:
            try:
                self.shortfall(promise)
            except Exception as exc:  # a figure is never worth the write it counts
                log.debug("could not count the replica shortfall (%s)", exc)
