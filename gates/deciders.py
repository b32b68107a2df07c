"""Who may decide a parked run: one rule for the bot's clicks and Home tab, the cards the workers
post, and `python -m workers status`.

A run's calls (and its Continue or Stop at a limit) are decided by the `[approvals] approvers`,
or by the person who asked for the run when there are none (`named`); once a park is past
`escalate_after_minutes`, by `escalate_to` as well (`deciders`). A user group (S…) among them
stands for its members, read from Slack (`usergroups.users.list`) and cached in Redis for
`GROUP_TTL` seconds (`GroupDirectory`); a group that cannot be read lets nobody in. Where deciders
are listed a group is shown by its handle (`GroupDirectory.handles`, from `usergroups.list`),
never pinged; one whose handle cannot be read is shown by its id. A clicker is
always a user id: a group id never decides (`may_decide`). With `self_approval = false` the
requester may decline their own run's calls, or Stop it at a limit, never approve or Continue
(`self_approval_refused`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Sequence

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from harness.config import Approvals
from runtime.slack_http import KeepAliveWebClient
from store import GROUP_TTL, HANDLE_TTL, BadId, RunRecord, RunStatus, Store

log = logging.getLogger(__name__)

GROUP_LOOKUP_SECONDS = 2  # a group read on a click happens before Slack gets its answer (3 s)
USER_ID = re.compile(r"[UW][A-Z0-9]{1,31}")
GROUP_ID = re.compile(r"S[A-Z0-9]{1,31}")


def named(approvals: Approvals, requester: str) -> list[str]:
    """Who decides a run's parks from the start: `approvers`, or its requester when there are none."""
    return list(approvals.approvers or (requester,))


def escalated(approvals: Approvals, record: RunRecord, now: float | None = None) -> bool:
    """Whether `record` is parked and past its escalation time (`escalate_after_minutes`)."""
    parked_at = record.parked_at(approvals.expire_after_minutes)
    if not approvals.escalate_after_minutes or parked_at is None:
        return False
    if record.status is not RunStatus.AWAITING_APPROVAL:
        return False
    return (time.time() if now is None else now) >= parked_at + approvals.escalate_after_minutes * 60


def deciders(approvals: Approvals, record: RunRecord, now: float | None = None) -> list[str]:
    """Who may decide `record` now, as the "who may decide" reply names them: users and groups (S…).

    `named` first; once the park is `escalated`, `escalate_to` as well: the people its reminder pings.
    """
    who = named(approvals, record.requester)
    if escalated(approvals, record, now):
        who += [w for w in approvals.escalate_to if w not in who]
    return who


def self_approval_refused(approvals: Approvals, user: str, record: RunRecord) -> bool:
    """Whether four eyes forbid `user` to approve (or Continue) `record`: its requester, with
    `self_approval = false`. Their decline (or Stop) still counts."""
    return not approvals.self_approval and user == record.requester


class GroupDirectory:
    """Who is in a Slack user group (`usergroups.users.list`), cached in Redis for `GROUP_TTL` s.

    A group that cannot be read (no such group, no `usergroups:read` scope, Slack slow or down)
    lets nobody in: fail closed. A failure is not cached, so the next click reads it again.
    """

    def __init__(self) -> None:
        self._client: WebClient | None = None

    def bind(self, client: WebClient) -> None:
        """Read groups with `client`'s token and URL, on a short timeout and with no retries."""
        self._client = KeepAliveWebClient(
            token=client.token,
            base_url=client.base_url,
            timeout=GROUP_LOOKUP_SECONDS,
            ssl=client.ssl,
            headers=client.headers,
        )

    def members(self, store: Store, team: str, group: str) -> frozenset[str]:
        """The members of `group`: from the cache, else from Slack (then cached); empty if unreadable."""
        try:
            cached = store.groups.cached(team, group)
        except BadId:
            return frozenset()
        if cached is not None:
            return cached
        if self._client is None:
            return frozenset()
        try:
            users = self._client.usergroups_users_list(usergroup=group).get("users")
        except (SlackClientError, OSError, ValueError) as exc:
            error = exc.response.get("error") if isinstance(exc, SlackApiError) else type(exc).__name__
            log.warning("cannot read user group %s (%s): nobody in it may decide for now", group, error)
            return frozenset()
        if not isinstance(users, list):
            log.warning("user group %s came back without a list of users: nobody in it may decide", group)
            return frozenset()
        members = frozenset(u for u in users if isinstance(u, str) and USER_ID.fullmatch(u))
        store.groups.cache(team, group, members)
        return members

    def handles(self, store: Store, team: str, names: Iterable[str]) -> dict[str, str]:
        """Group id -> handle of the user groups among `names` (`usergroups.list`, cached in Redis
        for `HANDLE_TTL` s); a group not read (no scope, Slack slow or down, no such group) is left
        out, to be shown by its id. Slack is asked only when a group is named and nothing is cached,
        and never without a client (`bind`): `python -m workers status` may read the cache alone."""
        groups = [n for n in dict.fromkeys(names) if GROUP_ID.fullmatch(n or "")]
        if not groups:
            return {}
        try:
            known = store.groups.handles(team)
        except BadId:
            return {}
        if known is None:
            if self._client is None:
                return {}
            known = self._read_handles()
            store.groups.cache_handles(team, known or {}, HANDLE_TTL if known is not None else GROUP_TTL)
        return {g: known[g] for g in groups if known and g in known}

    def _read_handles(self) -> dict[str, str] | None:
        """Every group's handle, from Slack; None when they cannot be read."""
        assert self._client is not None
        try:
            listed = self._client.usergroups_list(include_disabled=True).get("usergroups")
        except (SlackClientError, OSError, ValueError) as exc:
            error = exc.response.get("error") if isinstance(exc, SlackApiError) else type(exc).__name__
            log.warning("cannot read the user groups' handles (%s): groups are shown by their ids", error)
            return None
        if not isinstance(listed, list):
            log.warning("usergroups.list came back without a list: groups are shown by their ids")
            return None
        found = {}
        for group in listed:
            if not isinstance(group, dict):
                continue
            gid, handle = group.get("id"), group.get("handle")
            if isinstance(gid, str) and GROUP_ID.fullmatch(gid) and isinstance(handle, str) and handle:
                found[gid] = handle[:200]  # untrusted text: whoever shows it makes it inert
        return found

    def includes(self, store: Store, team: str, user: str, names: Sequence[str]) -> bool:
        """`user` is one of `names`, or a member of a user group among them."""
        if user in names:
            return True
        return any(user in self.members(store, team, g) for g in names if g.startswith("S"))


def may_decide(
    user: str, record: RunRecord, *, approvals: Approvals, groups: GroupDirectory, store: Store
) -> bool:
    """Whether `user` is among `deciders(record)` now, in person or as a member of a named group."""
    if not USER_ID.fullmatch(user or ""):
        return False  # a group id (or anything else) is never a clicker
    return groups.includes(store, record.team, user, deciders(approvals, record))
