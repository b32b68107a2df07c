"""Where `make run`'s own Redis is, so that the operator's commands run beside it read that one.

`make run` starts a private, password-protected Redis on a random port (the playground's, or one
keeping its data in `.redis-data/`). `python -m workers status`, `audit` and `replay` are run from
another terminal, without its `REDIS_URL`: they would read whatever answers on localhost:6379 and
say "Parked: 0" while a card waits. So `make run` writes its Redis's address (password included)
to `.harness-redis` in the directory it runs in, readable by its user alone, and removes it when it
stops; an operator's command with no Redis setting of its own reads that file, and every one says
which Redis it read and why.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from runtime.connection import DEFAULT_REDIS_URL, where

FILE = ".harness-redis"


def announce(url: str, directory: Path | None = None) -> Path:
    """Write `url` for the operator's commands run in `directory` (the current one); 0600, atomically."""
    path = (directory or Path.cwd()) / FILE
    partial = path.with_name(f"{FILE}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(url + "\n")
    partial.replace(path)
    return path


def withdraw(path: Path) -> None:
    """Remove what `announce` wrote (its Redis is stopping)."""
    path.unlink(missing_ok=True)


def operator_env(env: Mapping[str, str], directory: Path | None = None) -> tuple[dict[str, str], str]:
    """The environment an operator's command reaches Redis with, and one line naming that Redis:
    its own setting, else `make run`'s (`.harness-redis` here), else the default."""
    found = dict(env)
    if found.get("REDIS_URL", "").strip() or found.get("REDIS_SENTINELS", "").strip():
        how = "REDIS_SENTINELS" if found.get("REDIS_SENTINELS", "").strip() else "REDIS_URL"
        return found, f"Redis: {where(found)} (from {how})"
    path = (directory or Path.cwd()) / FILE
    try:
        url = path.read_text(encoding="utf-8").strip()
    except OSError:
        url = ""
    if url:
        found["REDIS_URL"] = url
        return found, f"Redis: {where(found)} (make run's own, from ./{FILE}; set REDIS_URL to read another)"
    found["REDIS_URL"] = DEFAULT_REDIS_URL
    return found, f"Redis: {where(found)} (the default: no REDIS_URL, and no make run here wrote ./{FILE})"
