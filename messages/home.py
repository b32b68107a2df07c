"""The bot's Home tab: the approvals waiting on one person, the soonest to expire first, each with
a link to its card."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slack_sdk.models.blocks import DividerBlock, HeaderBlock, PlainTextObject
from slack_sdk.models.views import View

from harness.state import PendingCall
from messages import texts
from messages.arguments import args_json, arguments_of
from messages.blocks import context, section
from messages.text import code, escape, inert, inline, mention, slack_date

HOME_ITEMS_MAX = 20  # each item is two blocks; a Home view holds 100
SUGGESTIONS_MAX = 3  # suggested rules shown at most: one block each, after three of heading
SUGGEST_MIN_APPROVALS = 10  # as `ops.suggestions` counts them (said on the tab)
SUGGEST_DAYS = 30
_CHANNEL_ID = re.compile(r"[CDG][A-Z0-9]{1,30}")
# A card's link as chat.getPermalink gives it: anything else is not offered as a link.
PERMALINK = re.compile(r"https://[A-Za-z0-9.-]+/archives/[A-Z0-9]+/p[0-9]+(\?[A-Za-z0-9=&._-]*)?")


@dataclass(frozen=True)
class HomeItem:
    """One call waiting on the person whose Home tab lists it, and where its card is."""

    call: PendingCall
    requester: str
    channel: str
    expires_at: datetime
    card_ts: str | None = None  # where its approval card is
    link: str | None = None  # the card's permalink, from chat.getPermalink


def _home_item(item: HomeItem) -> dict[str, Any]:
    args = arguments_of(item.call)
    target = f" on {inline(args[0].text, 200)}" if args and args[0].target else ""
    where = f"<#{item.channel}>" if _CHANNEL_ID.fullmatch(item.channel) else inert(item.channel, 40)
    link = item.link if item.link and PERMALINK.fullmatch(item.link) else None
    lines = [
        f"*{inline(item.call.name, 120)}*{target}",
        inline(args_json(item.call), 400),
        f"Asked for by {mention(item.requester)} in {where} · expires {slack_date(item.expires_at)}",
        f"<{escape(link)}|{texts.HOME_OPEN_CARD}>" if link else texts.HOME_NO_LINK,
    ]
    return section("\n".join(lines))


@dataclass(frozen=True)
class SuggestedRule:
    """A rule the audit suggests (`ops.suggestions`): its TOML, and what replaying it would change."""

    snippet: str
    effect: str


def _suggested(rules: Sequence[SuggestedRule], capped: int | None) -> list[dict[str, Any]]:
    intro = texts.HOME_SUGGESTED_INTRO.format(n=SUGGEST_MIN_APPROVALS, days=SUGGEST_DAYS)
    if capped:
        intro += " " + texts.HOME_SUGGESTED_CAPPED.format(n=capped)
    blocks = [
        DividerBlock().to_dict(),
        HeaderBlock(text=PlainTextObject(text=texts.HOME_SUGGESTED_TITLE)).to_dict(),
        context(intro),
    ]
    for rule in rules[:SUGGESTIONS_MAX]:
        effect = texts.HOME_SUGGESTED_EFFECT.format(effect=inert(rule.effect, 600))
        blocks.append(section(f"{code(rule.snippet, 2000)}\n{effect}"))
    return blocks


def home_view(
    items: Sequence[HomeItem],
    *,
    more: bool = False,
    at: datetime,
    suggestions: Sequence[SuggestedRule] = (),
    capped: int | None = None,
) -> dict[str, Any]:
    """The bot's Home tab for one person: the approvals they may decide now, each with its card;
    then, for an approver, the rules the audit suggests (`capped`: the entries read, when capped)."""
    shown = list(items[:HOME_ITEMS_MAX])
    more = more or len(items) > len(shown)
    blocks: list[dict[str, Any]] = [
        HeaderBlock(text=PlainTextObject(text=texts.HOME_TITLE)).to_dict(),
        context(texts.HOME_UPDATED.format(at=slack_date(at))),
    ]
    if not shown:
        blocks.append(section(texts.HOME_EMPTY))
    for item in shown:
        blocks += [DividerBlock().to_dict(), _home_item(item)]
    if more:
        blocks.append(context(texts.HOME_MORE))
    if suggestions:
        blocks += _suggested(suggestions, capped)
    return View(type="home", blocks=blocks).to_dict()
