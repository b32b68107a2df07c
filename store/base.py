"""What every part of the store shares: the one connection, a reply read as text, and `Beside`,
a write that rides on a run's next save (made by the parts and by `store.counters` for
`observe.metrics`, sent by `RunStore.save`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.commands.core import Script

from store.replicas import Replicas


def as_text(value: Any) -> str:
    """A Redis reply as text (redis-py answers bytes unless decode_responses is set)."""
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Beside:
    """A write sent in the round trip of a run's next save: a Lua script that is idempotent (it
    may be sent again after Redis lost its scripts). Its failure is logged, never the save's."""

    what: str  # what it records, for the log
    script: str
    keys: tuple[str, ...]
    args: tuple[Any, ...]

    def send(self, connection: redis.Redis) -> Any:
        """Send it now, on its own (no save to carry it): its script's answer; raises as Redis does."""
        return connection.register_script(self.script)(keys=list(self.keys), args=list(self.args))


class StorePart:
    """One part of the `Store`: a kind of record, its keys and its scripts, on the Store's connection.

    The `Store` holds one of each (`store.parks`, `store.runs`, ...), so a call site says which
    part it uses: `store.parks.decide(...)` is in `parks.py`. A part keeps its Lua scripts as
    module constants beside the methods that send them, and sends them with
    `self._script(SOURCE)(keys=..., args=...)`.
    """

    def __init__(self, connection: redis.Redis, replicas: Replicas) -> None:
        """`replicas`: the Store's, shared by its parts (how a promised write waits for a replica)."""
        self.redis = connection
        self._scripts: dict[str, Script] = {}  # by source: each registered once, on first use
        self.replicas = replicas

    def _script(self, source: str) -> Script:
        """`source` registered with the connection: sent by its SHA (EVALSHA), loaded again by
        redis-py when Redis has lost it (NOSCRIPT). Registering computes the SHA; no round trip."""
        registered = self._scripts.get(source)
        if registered is None:
            registered = self._scripts[source] = self.redis.register_script(source)
        return registered

    def _promise(self, source: str, keys: Sequence[Any], args: Sequence[Any], promise: str) -> Any:
        """`source`'s answer, as `_script`, for a write a promise rests on: it waits (boundedly) until
        a replica has it when the master has one (`replicas.Replicas`)."""
        return self.replicas.run(self._script(source), keys, args, promise)
