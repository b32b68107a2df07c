"""The deep health check (`GET /healthz?deep=1` on the bot): is a worker alive, and how deep is the queue.

"Alive" is RQ's own notion: a worker registered on our queue whose key still exists. A worker
writes `last_heartbeat` into its key and renews the key's TTL at every heartbeat (`python -m
workers` asks for `WORKER_TTL`: a heartbeat at least every 45 s while idle, every 30 s during a
job, the key gone 60 s after a missed one), so a worker that died, even by SIGKILL, stops counting
within `WORKER_TTL + 60` seconds. One that stopped cleanly unregisters at once.
"""

from __future__ import annotations

from typing import Any

import redis
import rq
from rq.utils import utcparse
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from store import counters

WORKER_TTL = 60  # seconds; RQ's default is 420, so a dead worker would count as alive for 8 minutes


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _age(stamp: Any, now: float) -> float | None:
    """Seconds since an RQ timestamp, or None if there is none (or it cannot be read)."""
    if not stamp:
        return None
    try:
        when = utcparse(_text(stamp))
    except ValueError:
        return None
    return round(max(0.0, now - when.timestamp()), 1)


def deep_health(connection: redis.Redis, queue: rq.Queue, now: float) -> tuple[bool, dict[str, Any]]:
    """(healthy, report): healthy when at least one worker on the queue is alive. Two round trips.

    Raises `redis.RedisError` when Redis does not answer (the caller says so, with a 503).
    """
    keys = sorted(_text(k) for k in connection.smembers(WORKERS_BY_QUEUE_KEY % queue.name))
    fields = ("last_heartbeat", "state", "hostname", "pid")
    with connection.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hmget(key, list(fields))
        pipe.llen(queue.key)
        pipe.zcard(queue.scheduled_job_registry.key)
        pipe.zcard(queue.failed_job_registry.key)
        counters.queue_run_counts(pipe, now)
        *rows, depth, scheduled, failed, active, parked, tasks = pipe.execute()
    workers = []
    for key, row in zip(keys, rows, strict=True):
        beat, state, host, pid = row
        if beat is None and state is None:
            continue  # registered, but its key expired: it died without unregistering
        workers.append(
            {
                "name": key.rsplit(":", 1)[-1],
                "state": _text(state) if state else None,
                "hostname": _text(host) if host else None,
                "pid": int(pid) if pid else None,
                "seconds_since_heartbeat": _age(beat, now),
            }
        )
    report = {
        "ok": bool(workers),
        "redis": "ok",
        "workers_alive": len(workers),
        "workers": workers,
        "queue": {"name": queue.name, "depth": depth, "scheduled": scheduled, "failed_jobs": failed},
        "runs": {"active": active, "parked": parked, "on_tasks": tasks},
    }
    return bool(workers), report
