"""The members of Slack user groups named in `approvers` or `escalate_to`, as
`usergroups.users.list` gave them, trusted for `GROUP_TTL` seconds."""

from __future__ import annotations

import json

from store.base import StorePart
from store.keys import Keys

GROUP_TTL = 60  # seconds a user group's members are trusted before they are read from Slack again


class GroupStore(StorePart):
    """A short-lived cache of user groups' members."""

    def cached(self, team: str, group: str) -> frozenset[str] | None:
        """The members of `group` read from Slack less than `GROUP_TTL` ago, or None (read it again)."""
        raw = self.redis.get(Keys.group_members(team, group))
        if raw is None:
            return None
        try:
            members = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            return None
        return frozenset(members)

    def cache(self, team: str, group: str, members: frozenset[str], ttl: int = GROUP_TTL) -> None:
        self.redis.set(Keys.group_members(team, group), json.dumps(sorted(members)), ex=max(1, int(ttl)))
