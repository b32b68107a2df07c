"""`python -m workers explain-call NAME JSON [--channel C…] [--team T…] [--user U…] [--thread TS]`:
`python -m harness --explain-call`, with the windows of counting rules read from Redis.

The terminal agent reads no Redis (`harness/` imports none), so its `--explain-call` says a
counting rule's window is not read; this command, on the store's floor, reads each window the
flags name (a channel's needs `--team` and `--channel`; a requester's `--team` and `--user`; a
thread's those and `--thread`; a new run's own is empty) and says what it holds, whether this call
would go past it, and rules the call with what it read. A window that cannot be read (Redis away)
says so, and the call is ruled as past that limit, as a worker would rule it.
"""

from __future__ import annotations

import os
import sys

from gates.meters import RunMeter
from harness.cli import UsageError, inspect, parse_inspection
from harness.config import ConfigError, load_config
from harness.counting import Where
from harness.tools.catalog import open_catalog
from runtime import local_redis
from runtime.clients import SettingsError, redis_connection
from store import Store, new_run_id


def explain_call(argv: list[str]) -> int:
    """The command's exit status: 0, 1 (a tool not offered) or 2 (bad flags, config or Redis URL)."""
    try:
        inspection = parse_inspection(["--explain-call", *argv])
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        env, said = local_redis.operator_env(os.environ)
        print(said, file=sys.stderr)
        store = Store(redis_connection(env))
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        config = load_config()
        opened = open_catalog(config)
        catalog = opened.__enter__()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    where = inspection.where
    here = Where(
        new_run_id(),
        where.get("team", ""),
        where.get("channel", ""),
        where.get("thread", ""),
        where.get("user", ""),
    )
    try:
        return inspect(inspection, config, catalog, RunMeter(store, here))
    finally:
        opened.__exit__(None, None, None)
