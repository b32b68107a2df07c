"""Runs left for a newer release: a worker that meets a record of a run it cannot read because a
newer release wrote it (`harness.state.NewerRecord`) changes nothing of the run and holds it here.

While a run is held no watchdog recovers it, expires its park or posts its reminders (`RunStore.orphans`
and `EscalationStore` skip it), so an older worker never spins on it. Every watchdog pass looks at
the held runs again (`workers.newer.take_back`): a worker that reads them all (a newer one, or any
once the record was written again in a format it reads) takes the run back and hands it a driver.
"""

from __future__ import annotations

import redis

from store.base import StorePart, as_text
from store.keys import Keys, check_id

HELD_SCAN = 500  # a pass looks at this many held runs at most (the longest held first)


def held_runs(connection: redis.Redis) -> set[str]:
    """Every run held for a newer release now (what the watchdog's reads skip)."""
    return {as_text(member) for member in connection.zrange(Keys.held(), 0, -1)}


class HeldStore(StorePart):
    """The runs held for a newer release (a sorted set: run id, and when it was first held)."""

    def hold(self, run_id: str, now: float) -> bool:
        """Hold `run_id` for a newer release; True when it was not held already (say so, once)."""
        return bool(self.redis.zadd(Keys.held(), {check_id("run", run_id): now}, nx=True))

    def held(self, limit: int = HELD_SCAN) -> list[tuple[str, float]]:
        """The held runs and since when, the longest held first (at most `limit`)."""
        found: list[tuple[bytes, float]] = self.redis.zrange(  # type: ignore[assignment]
            Keys.held(), 0, limit - 1, withscores=True
        )
        return [(as_text(member), float(score)) for member, score in found]

    def ids(self) -> set[str]:
        """Every held run's id."""
        return held_runs(self.redis)

    def release(self, run_id: str) -> bool:
        """`run_id` is no longer held (a worker reads it now, or it is gone); True if it was."""
        return bool(self.redis.zrem(Keys.held(), run_id))
