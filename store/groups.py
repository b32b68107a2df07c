"""The members of Slack user groups named in `approvers` or `escalate_to`, as
`usergroups.users.list` gave them, trusted for `GROUP_TTL` seconds; and the handles the team's
groups are shown by (`usergroups.list`), trusted for `HANDLE_TTL` seconds."""

from __future__ import annotations

import json
from collections.abc import Mapping

from store.base import StorePart
from store.keys import BadId, Keys, check_id

GROUP_TTL = 60  # seconds a user group's members are trusted before they are read from Slack again
# Seconds the team's group handles are trusted; a read that failed is remembered (as no handles)
# for `GROUP_TTL`, so a missing scope costs one Slack call a minute, not one per card.
HANDLE_TTL = 300


class GroupStore(StorePart):
    """A short-lived cache of user groups' members and of the team's groups' handles."""

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

    def handles(self, team: str) -> dict[str, str] | None:
        """Group id -> handle of the team's groups, as last read from Slack; None: read them again.

        Only the entries that have the shapes written are returned (a handle is still untrusted
        text: whoever shows it escapes it)."""
        raw = self.redis.get(Keys.group_handles(team))
        if raw is None:
            return None
        try:
            stored = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(stored, dict):
            return None
        return {k: v for k, v in stored.items() if isinstance(v, str) and _is_group(k)}

    def cache_handles(self, team: str, handles: Mapping[str, str], ttl: int = HANDLE_TTL) -> None:
        """Keep the team's group handles (empty: the read failed) for `ttl` seconds."""
        self.redis.set(
            Keys.group_handles(team), json.dumps(dict(sorted(handles.items()))), ex=max(1, int(ttl))
        )


def _is_group(value: object) -> bool:
    """Whether `value` is a user group's id as the store's keys take it."""
    try:
        check_id("group", value)
    except BadId:
        return False
    return True
