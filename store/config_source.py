"""Which config file the workers run with, as each says at start, so that `python -m workers
status`, run where `HARNESS_CONFIG` may not be set, reads the same one (`ops.status`)."""

from __future__ import annotations

import json
import time

from store.base import StorePart
from store.keys import Keys


class ConfigSourceStore(StorePart):
    """The workers' config file, as the last worker to start said it (JSON: its path and when)."""

    def announce(self, path: str, ttl: int) -> None:
        """Say that the workers run with `path` (absolute; "" for the built-in defaults), for `ttl`
        seconds (a worker says it again at every start)."""
        self.redis.set(Keys.config_source(), json.dumps({"path": path, "at": time.time()}), ex=ttl)

    def announced(self) -> str | None:
        """The workers' config path ("" for the built-in defaults); None when no worker said (or
        what it said cannot be read)."""
        raw = self.redis.get(Keys.config_source())
        try:
            path = json.loads(raw)["path"] if raw is not None else None
        except (ValueError, KeyError, TypeError):
            return None
        return path if isinstance(path, str) else None
