"""Where a driver writes down its run's live messages (`workers.live.LiveLedger`, over `store.live`):
a stream's opening promised before it starts, its ts once it did, and the tag it carries once it
stopped (`messages.metadata`), so a driver after a crash finds every one of them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis

from messages.metadata import LIVE_KEY, tagged
from workers.services import Services

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunLedger:
    """Where a driver's live messages are written down (`workers.live.LiveLedger`, `store.live`)."""

    svc: Services
    run_id: str

    @property
    def tag(self) -> dict[str, Any]:
        return tagged(self.run_id, LIVE_KEY)

    def opening(self) -> None:
        self.svc.store.live.opening(self.run_id)

    def opened(self, ts: str) -> None:
        """Recorded before anything can owe its settlement, so a driver after a crash finds it."""
        try:
            self.svc.store.live.opened(self.run_id, ts)
        except redis.RedisError as exc:  # Redis away (a failover): the stream goes on regardless
            log.warning(
                "run %s: live message %s is not recorded (%s): this driver settles it; a driver "
                "after a crash looks for it in the thread",
                self.run_id,
                ts,
                exc,
            )
