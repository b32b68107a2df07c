"""Grants ("Approve for this thread"): one tool in one thread, written by the decision that gave
it (`ParkStore.decide`), read before a later call of that tool asks for a card."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from workers.store.base import StorePart
from workers.store.keys import Keys


@dataclass(frozen=True)
class Grant:
    """ "Approve for this thread": `by` let later `ask` calls of `tool` by `requester` run until `until`."""

    key: str
    tool: str
    by: str
    requester: str
    until: float
    run_id: str = ""

    @property
    def seconds(self) -> float:
        return self.until - time.time()

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "tool": self.tool,
            "by": self.by,
            "requester": self.requester,
            "until": self.until,
            "run_id": self.run_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Grant:
        return cls(
            key=str(data["key"]),
            tool=str(data["tool"]),
            by=str(data["by"]),
            requester=str(data["requester"]),
            until=float(data["until"]),
            run_id=str(data.get("run_id", "")),
        )


class GrantStore(StorePart):
    """A thread's standing grants, read and revoked (each key expires with its grant)."""

    def grant(self, team: str, channel: str, thread_ts: str, tool: str) -> Grant | None:
        """The thread's standing grant of `tool`, if any (its key expires with it)."""
        raw = self.redis.get(Keys.grant(team, channel, thread_ts, tool))
        if not raw:
            return None
        try:
            found = Grant.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError):
            return None
        return found if found.until > time.time() else None

    def revoke_grant(self, team: str, channel: str, thread_ts: str, tool: str) -> bool:
        return bool(self.redis.delete(Keys.grant(team, channel, thread_ts, tool)))
