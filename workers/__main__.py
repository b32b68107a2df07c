"""`python -m workers`: an RQ worker (with its scheduler) for the bot's queue."""

from __future__ import annotations

import logging
import sys

import redis
from rq import Worker

from harness.config import ConfigError
from workers import jobs
from workers.services import QUEUE_NAME, Services, SettingsError


def main(argv: list[str] | None = None) -> int:
    """Check settings, then work the queue until SIGTERM/SIGINT (a warm shutdown)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
    worker = Worker([QUEUE_NAME], connection=svc.store.redis)
    worker.work(with_scheduler=True, logging_level="INFO")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
