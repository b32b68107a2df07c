"""`python -m workers`: an RQ worker (with its scheduler) for the bot's queue, plus its watchdog.

`python -m workers audit [--limit N]` prints the approval audit log instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from datetime import UTC, datetime

import redis
from rq import SimpleWorker, Worker

from harness.client import warm_up
from harness.config import ConfigError
from workers import jobs
from workers.services import QUEUE_NAME, Services, SettingsError, redis_connection
from workers.store import Store

log = logging.getLogger("workers.watchdog")


def watchdog(store: Store, queue_services: Services, stop: threading.Event) -> None:
    """Hand runs whose driver died (lease expired) to any worker, well inside two minutes."""
    seconds = jobs.lease_seconds()
    while not stop.wait(max(seconds / 2, 0.5)):
        try:
            for run_id in store.orphans(older_than=time.time() - seconds):
                log.warning("run %s lost its driver; continuing it on another worker", run_id)
                jobs.enqueue(queue_services, jobs.continue_run, run_id)
        except redis.RedisError as exc:
            log.warning("watchdog cannot reach Redis (%s); trying again", exc)


def work() -> int:
    """Check settings, then work the queue until SIGTERM/SIGINT (a warm shutdown)."""
    try:
        svc = Services.from_env()
        svc.store.redis.ping()
    except (ConfigError, SettingsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except redis.RedisError as exc:
        print(f"error: cannot reach Redis at REDIS_URL ({exc})", file=sys.stderr)
        return 2
    jobs.use_services(svc)  # forked work horses inherit it: no per-job setup
    warm_up()
    stop = threading.Event()
    watch_store = Store(redis_connection())  # its own connection: never shared with a fork
    threading.Thread(target=watchdog, args=(watch_store, svc, stop), name="watchdog", daemon=True).start()
    # fork (default): each job in a fresh work horse, isolated from the others' crashes and leaks.
    # simple: jobs in this process, no fork per job (faster; one bad job can take the worker down).
    kind = os.environ.get("HARNESS_WORKER_CLASS", "fork")
    worker_class = SimpleWorker if kind == "simple" else Worker
    try:
        worker_class([QUEUE_NAME], connection=svc.store.redis).work(with_scheduler=True, logging_level="INFO")
    finally:
        stop.set()
    return 0


def audit(limit: int) -> int:
    """Print the newest `limit` decisions: when, who, outcome, tool and input, where."""
    try:
        entries = Store(redis_connection()).audit_entries(limit)
    except redis.RedisError as exc:
        print(f"error: cannot reach Redis at REDIS_URL ({exc})", file=sys.stderr)
        return 2
    for entry in entries:
        when = datetime.fromtimestamp(entry["at"], UTC).isoformat(timespec="seconds")
        who = entry.get("by") or "(nobody: expired)"
        args = json.dumps(entry.get("input"), ensure_ascii=False, separators=(",", ":"))
        reason = f" reason={json.dumps(entry['reason'])}" if entry.get("reason") else ""
        print(
            f"{when} {entry['verdict']:<8} by {who} {entry.get('tool')}({args}) "
            f"run={entry['run_id']} channel={entry.get('channel')} asked_by={entry.get('requester')}{reason}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers")
    sub = parser.add_subparsers(dest="command")
    audit_parser = sub.add_parser("audit", help="print the approval audit log")
    audit_parser.add_argument("--limit", type=int, default=100)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "audit":
        return audit(args.limit)
    return work()


if __name__ == "__main__":
    raise SystemExit(main())
