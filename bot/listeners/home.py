"""The Home tab: who is waiting on me, read from the index of open parks after Slack has its answer."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from slack_bolt import App, BoltContext
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.listening import (
    BotDeps,
    Then,
)
from gates import deciders
from harness.state import StateError
from messages.home import HOME_ITEMS_MAX, HomeItem, SuggestedRule, home_view
from ops import suggestions
from store import (
    BadId,
    OpenPark,
    RunRecord,
    RunStatus,
)

log = logging.getLogger(__name__)

HOME_SCAN = 200  # open parks read at most for one Home tab (from its index), the soonest to expire first
HOME_FOR = "home_for"  # context key: whose Home tab to publish after Slack has its answer


@dataclass(frozen=True)
class HomeFor:
    team: str
    user: str


HOME_BATCH = 25  # parks read per round trip: about one tab's worth (HOME_ITEMS_MAX + 1)


def _on_home_opened(body: dict[str, Any], event: dict[str, Any], context: BoltContext) -> None:
    """Note whose Home tab to publish; the publish itself happens after Slack has its answer."""
    user, team = event.get("user"), body.get("team_id") or context.team_id
    if event.get("tab") != "home" or not isinstance(user, str) or not deciders.USER_ID.fullmatch(user):
        return  # the Messages tab, or a shape Slack does not send
    if isinstance(team, str):
        context[HOME_FOR] = HomeFor(team, user)


def _home_publisher(deps: BotDeps) -> Callable[..., None]:
    def publish_home(body: dict[str, Any], context: BoltContext, client: WebClient) -> None:
        wanted = context.get(HOME_FOR)
        if not isinstance(wanted, HomeFor):
            return
        team, user = wanted.team, wanted.user
        items, more = waiting_on(deps, team, user)
        items = [replace(item, link=_permalink(client, item)) for item in items]
        rules, capped = suggested_rules(deps, team, user)
        view = home_view(items, more=more, at=datetime.now(UTC), suggestions=rules, capped=capped)
        try:
            client.views_publish(user_id=user, view=view)
        except SlackApiError as exc:
            log.warning("could not publish the Home tab: %s", exc.response.get("error"))

    return publish_home


def waiting_on(deps: BotDeps, team: str, user: str) -> tuple[list[HomeItem], bool]:
    """The undecided calls of open parks that `user` may decide now, soonest expiry first; and
    whether there are more than the Home tab shows.

    Read from the index of what waits on whom (`store.parks.open_parks`), never by scanning every parked
    run: an approver's candidates are the team's open parks, a requester's (with no `approvers`)
    their own runs' parks, an `escalate_to`'s the team's parks past their escalation time (those
    expiring soonest: escalation comes a fixed time after a park). At most `HOME_SCAN` candidates
    are read, a batch at a time, until the tab is full; `may_decide` has the last word on each.
    """
    now = time.time()
    items: list[HomeItem] = []
    over: list[OpenPark] = []  # parks the index still holds but that wait on nobody any more
    requesters: dict[str, str] = {}
    try:
        candidates = _home_candidates(deps, team, user, now)
    except BadId:
        return [], False  # a team id of a shape we never write: nothing is parked there
    for start in range(0, len(candidates), HOME_BATCH):
        batch = candidates[start : start + HOME_BATCH]
        for park, read in zip(batch, deps.store.parks.read_parks(batch), strict=True):
            record, decisions = read.record, read.decisions
            if read.newer:
                continue  # a newer release's park: not shown here, and left in the index for it
            if record is not None:
                requesters[park.run_id] = record.requester
            if not _still_open(record, park, decisions):
                over.append(park)
                continue
            assert record is not None and record.expires_at is not None  # _still_open checked it
            if not deps.may_decide(user, record):
                continue
            try:
                awaiting = record.run_state().awaiting
            except StateError:
                continue
            expires_at = datetime.fromtimestamp(record.expires_at, UTC)
            for call in awaiting:
                if call.id in decisions and decisions[call.id] is None:
                    card = record.cards.get(call.id)
                    items.append(HomeItem(call, record.requester, record.channel, expires_at, card))
        if len(items) > HOME_ITEMS_MAX:
            break  # enough to fill the tab and to know there is more
    deps.store.parks.drop_from_index(team, over, requesters)
    return items[:HOME_ITEMS_MAX], len(items) > HOME_ITEMS_MAX


def suggested_rules(deps: BotDeps, team: str, user: str) -> tuple[list[SuggestedRule], int | None]:
    """The rules the audit suggests for the levels (the top level, each profile) whose approvers
    name `user`, and how many entries were read when that was capped; nothing for anyone else.

    At most `suggestions.SCAN_MAX` of the newest entries of each stream are read (two round trips).
    """
    config = deps.config
    levels = {"": config.approvals, **{p.name: p.settings.approvals for p in config.profiles}}
    mine = {name for name, a in levels.items() if a.approvers and _is_named(deps, team, user, a.approvers)}
    if not mine:
        return [], None
    decisions = deps.store.audit.entries(suggestions.SCAN_MAX)
    calls = deps.store.audit.call_entries(suggestions.SCAN_MAX)
    found = suggestions.suggest(config, decisions, calls, now=time.time(), team=team, profiles=mine)
    capped = max(len(decisions), len(calls)) >= suggestions.SCAN_MAX
    return [SuggestedRule(s.snippet, s.effect) for s in found], suggestions.SCAN_MAX if capped else None


def _home_candidates(deps: BotDeps, team: str, user: str, now: float) -> list[OpenPark]:
    """The open parks that may wait on `user`, soonest expiry first, at most `HOME_SCAN` of them."""
    config = deps.config
    found: list[OpenPark] = []
    # Each profile may name its own approvers: the candidates of every level are read, once each.
    levels = {a: None for a in (config.approvals, *(p.settings.approvals for p in config.profiles))}
    if any(not approvals.approvers for approvals in levels):  # each run's requester decides it
        found += deps.store.parks.open_parks(team, requester=user, now=now, limit=HOME_SCAN)
    if any(a.approvers and _is_named(deps, team, user, a.approvers) for a in levels):
        found += deps.store.parks.open_parks(team, now=now, limit=HOME_SCAN)
    for approvals in levels:
        if approvals.escalate_after_minutes and _is_named(deps, team, user, approvals.escalate_to):
            # `deciders.escalated`: parked at expires_at - expire_after, escalated escalate_after later
            horizon = now + (approvals.expire_after_minutes - approvals.escalate_after_minutes) * 60
            found += deps.store.parks.open_parks(team, now=now, until=horizon, limit=HOME_SCAN)
    unique = {(p.run_id, p.park_id): p for p in found}
    return sorted(unique.values(), key=lambda p: p.expires_at)[:HOME_SCAN]


def _is_named(deps: BotDeps, team: str, user: str, names: Sequence[str]) -> bool:
    """`user` is one of `names`, or a member of a user group among them (as `may_decide` reads it)."""
    return deps.groups.includes(deps.store, team, user, names)


def _still_open(record: RunRecord | None, park: OpenPark, decisions: dict[str, Any]) -> bool:
    """Whether the indexed park still waits on someone: its run parked there, a call undecided."""
    if record is None or record.status is not RunStatus.AWAITING_APPROVAL or record.park_id != park.park_id:
        return False
    return record.expires_at is not None and any(d is None for d in decisions.values())


def _permalink(client: WebClient, item: HomeItem) -> str | None:
    """The link to the call's card, if Slack gives one."""
    if not item.card_ts:
        return None
    try:
        link = client.chat_getPermalink(channel=item.channel, message_ts=item.card_ts).get("permalink")
    except SlackApiError as exc:
        log.info("no permalink for a card in %s: %s", item.channel, exc.response.get("error"))
        return None
    return link if isinstance(link, str) else None


def register(app: App, deps: BotDeps, then: Then) -> None:
    """Register this surface's listeners."""
    app.event("app_home_opened")(then(_on_home_opened, _home_publisher(deps)))
