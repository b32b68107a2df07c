"""A Slack message (`Message`) and the blocks every builder is made of.

`fit` shrinks the untrusted parts of a message until its blocks fit Slack's limits
(`messages.limits`); `with_tail` keeps the `text` fallback within its own. `notice` is the
plainest message: a sentence of ours, naming people.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slack_sdk.models.blocks import ContextBlock, MarkdownTextObject, SectionBlock

from messages.limits import BLOCKS_JSON_MAX, SECTION_MAX, TEXT_MAX
from messages.text import Mode, decider, inert


@dataclass(frozen=True)
class Attachment:
    """A file posted in the thread right after its message: what the message had to cut, whole."""

    filename: str
    title: str
    content: str


@dataclass(frozen=True)
class Message:
    """One Slack message: the notification/fallback `text`, its Block Kit `blocks`, and maybe the
    file that holds in full what it cut (`attachment`)."""

    text: str
    blocks: list[dict[str, Any]]
    attachment: Attachment | None = None


def section(mrkdwn: str) -> dict[str, Any]:
    """A section block of mrkdwn (escaped already), never empty."""
    return SectionBlock(text=MarkdownTextObject(text=mrkdwn or " ")).to_dict()


def context(*mrkdwn: str) -> dict[str, Any]:
    """A context block, one element per piece of mrkdwn (escaped already)."""
    return ContextBlock(elements=[MarkdownTextObject(text=t or " ") for t in mrkdwn]).to_dict()


def blocks_size(blocks: list[dict[str, Any]]) -> int:
    """Size of the blocks as slack_sdk sends them (ASCII JSON): what `msg_blocks_too_long` counts.

    Non-ASCII characters travel as `\\uXXXX` (an emoji as two of them), so a message of accents
    or emoji is up to twelve times longer on the wire than it looks.
    """
    return len(json.dumps(blocks))


def fit(build: Callable[[float], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """`build(scale)` at the largest scale (1, shrinking) whose blocks fit BLOCKS_JSON_MAX.

    JSON escaping (quotes, backslashes, newlines, non-ASCII) can make text longer than its
    characters, so the budget is checked on the real JSON and the untrusted parts shrunk to fit.
    """
    scale = 1.0
    for _ in range(12):
        blocks = build(scale)
        size = blocks_size(blocks)
        if size <= BLOCKS_JSON_MAX:
            return blocks
        scale *= BLOCKS_JSON_MAX / size * 0.9
    return build(0.0)


def scaled(limit: int, scale: float, floor: int = 20) -> int:
    """`limit` at `scale` (what `fit` tries), never below `floor`."""
    return max(floor, int(limit * scale))


def with_tail(body: str, tail: str, sep: str = "\n\n", mode: Mode = "block") -> str:
    """Escaped untrusted `body` then trusted `tail`, within TEXT_MAX, always ending with `tail`."""
    room = TEXT_MAX - len(tail) - len(sep)
    head = inert(body, room, mode).strip()
    return f"{head}{sep}{tail}" if head else tail


def notice(text: str, handles: Mapping[str, str] | None = None, **users: str | Sequence[str]) -> Message:
    """A plain message with text we wrote ourselves (escaped all the same).

    `{name}` placeholders are filled, after escaping, with real mentions of the trusted user ids
    given as `name=` (one id or several); a user group among them is shown by its handle in
    `handles` (id -> handle, from Slack), or its id, and pings nobody (`decider`).
    """

    def body(limit: int) -> str:
        out = inert(text, limit)
        for name, ids in users.items():
            ids = [ids] if isinstance(ids, str) else list(ids)
            out = out.replace("{" + name + "}", ", ".join(decider(u, handles) for u in ids[:20]))
        return out

    return Message(
        text=body(SECTION_MAX) or " ", blocks=fit(lambda scale: [section(body(scaled(SECTION_MAX, scale)))])
    )
