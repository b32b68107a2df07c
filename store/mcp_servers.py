"""Where each worker's MCP servers stand (up, or down and why), as the worker last said, so that
`python -m workers status`, which starts no server, can tell (`ops.status`).

One hash per server, `harness:mcp:{server}`: a field per worker (`host:pid`) holding JSON with
the format version, up or down, why, since when, and when the worker said it. A worker says it at
start, whenever it changes and every `SAY_EVERY` seconds, and takes its fields back when it stops;
what a worker said more than `STATE_TTL` seconds ago (it died) is not read, and is dropped at the
next write. The hash lives `STATE_TTL` seconds past the last word on it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from store.base import StorePart, as_text
from store.keys import Keys

STATE_VERSION = 1
SAY_EVERY = 30.0  # seconds: how often a worker says again where its servers stand
STATE_TTL = 120  # seconds what a worker said is believed (four times SAY_EVERY)


@dataclass(frozen=True)
class ServerState:
    """What one worker said of one of its servers."""

    worker: str
    up: bool
    reason: str  # why it is down ("" while up)
    since: float  # when it went up or down (the worker's clock)
    at: float  # when the worker said it


def _read(worker: str, raw: bytes | str) -> ServerState | None:
    """A field as written, or None (unreadable, or of a newer version: left for a newer reader)."""
    try:
        said = json.loads(raw)
        if not isinstance(said, dict) or said.get("v") != STATE_VERSION:
            return None
        up, reason, since, at = said["up"], said["reason"], said["since"], said["at"]
    except (ValueError, KeyError, TypeError):
        return None
    if not (isinstance(up, bool) and isinstance(reason, str)):
        return None
    if not (isinstance(since, int | float) and isinstance(at, int | float)):
        return None
    return ServerState(worker, up, reason[:2000], float(since), float(at))


class McpServerStore(StorePart):
    """What the workers said of their MCP servers."""

    def say(self, worker: str, states: Mapping[str, tuple[bool, str, float]], now: float) -> None:
        """`worker`'s servers, by name: (up, why it is down, since when); stale words dropped."""
        names = list(states)
        reading = self.redis.pipeline(transaction=False)
        for name in names:
            reading.hgetall(Keys.mcp_server(name))
        held = reading.execute()
        writing = self.redis.pipeline(transaction=False)
        for name, fields in zip(names, held, strict=True):
            key = Keys.mcp_server(name)
            up, reason, since = states[name]
            said = {"v": STATE_VERSION, "up": up, "reason": reason, "since": since, "at": now}
            writing.hset(key, worker, json.dumps(said))
            read = {f: _read(as_text(f), raw) for f, raw in fields.items()}
            stale = [f for f, state in read.items() if state is not None and state.at < now - STATE_TTL]
            if stale:
                writing.hdel(key, *stale)
            writing.expire(key, STATE_TTL)
        writing.execute()

    def take_back(self, worker: str, names: Iterable[str]) -> None:
        """`worker` stops: what it said of its servers goes with it."""
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.hdel(Keys.mcp_server(name), worker)
        pipe.execute()

    def said(self, names: Iterable[str], now: float) -> dict[str, list[ServerState]]:
        """Per server, what each worker said of it within `STATE_TTL` seconds, by worker."""
        names = list(dict.fromkeys(names))
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(Keys.mcp_server(name))
        found: dict[str, list[ServerState]] = {}
        for name, fields in zip(names, pipe.execute(), strict=True):
            states = [_read(as_text(worker), raw) for worker, raw in fields.items()]
            fresh = [s for s in states if s is not None and s.at >= now - STATE_TTL]
            found[name] = sorted(fresh, key=lambda s: s.worker)
        return found
