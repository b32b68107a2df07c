"""The clock's side of parks: parks whose expiry has come (`expiries`, member `run:park`) and
reminders due to `escalate_to` (`escalations`), read by the watchdog."""

from __future__ import annotations

from workers.store.base import StorePart, as_text
from workers.store.keys import Keys, check_id, park_member


class EscalationStore(StorePart):
    """Parks by expiry, and reminders by when they are due, each claimed by one watchdog."""

    def due_expiries(self, now: float, limit: int = 100) -> list[tuple[str, int]]:
        """Parks whose expiry time has come: (run id, park id)."""
        members = self.redis.zrangebyscore(Keys.expiries(), "-inf", now, start=0, num=limit)
        due = []
        for member in members:
            run_id, _, park = as_text(member).partition(":")
            due.append((run_id, int(park or 0)))
        return due

    def forget_expiry(self, run_id: str, park_id: int) -> None:
        self.redis.zrem(Keys.expiries(), f"{check_id('run', run_id)}:{int(park_id)}")

    def parked(self, now: float, limit: int = 500) -> list[tuple[str, int]]:
        """Parks still open at `now` (run id, park id), soonest expiry first: the index of parked runs."""
        members = self.redis.zrangebyscore(Keys.expiries(), f"({now!r}", "+inf", start=0, num=limit)
        return [park_member(m) for m in members]

    def schedule_escalation(self, run_id: str, park_id: int, at: float) -> None:
        """Remind `escalate_to` of park `park_id` at `at`; scheduling it again keeps the first time."""
        self.redis.zadd(Keys.escalations(), {f"{check_id('run', run_id)}:{int(park_id)}": at}, nx=True)

    def claim_due_escalations(self, now: float, limit: int = 100) -> list[tuple[str, int]]:
        """Parks whose reminder is due, each returned to exactly one caller (whoever removes it)."""
        claimed = []
        for member in self.redis.zrangebyscore(Keys.escalations(), "-inf", now, start=0, num=limit):
            if self.redis.zrem(Keys.escalations(), as_text(member)):  # two watchdogs: one removes it
                claimed.append(park_member(member))
        return claimed
