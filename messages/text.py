"""Text safety: what came from the model or a tool made inert and visible, and what we write ourselves.

Text that came from the model or a tool (answers, arguments, results, errors, decline reasons)
is untrusted: it goes through `escape` before it lands in `text` or in any block, so it can
never ping (`<!channel>`, `<@U…>`, `<!subteam^…>`) or smuggle a labelled link. Only ids we
hold ourselves (`^[UW][A-Z0-9]+$`) are rendered as real mentions, and only dates we format
ourselves use `<!date^…>`.

Untrusted text also goes through `visible` first: a character a reader cannot see, or one that
changes the direction of the text around it (bidi controls, zero-width and other format
characters, controls, lone surrogates …), is shown as its code point, `[U+202E]`, so that
`evil[U+202E]txt.sh` cannot pass for `evilhs.txt`. Final answers keep the joiners and variation
selectors that emoji and some scripts are made of; arguments, results and everything else keep
nothing hidden (a spoofed path matters more than a pretty emoji).

Lengths are counted as Slack may count them, in UTF-16 code units and once escaped: `cut` and
`inert` never split an entity such as `&amp;`, and what they return fits the room they are given.
"""

from __future__ import annotations

import functools
import itertools
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Literal, get_args

from harness.texts import plural as plural  # re-exported: counts are said the same everywhere
from messages import markdown
from messages.markdown import FENCE, FENCE_SAFE, TICK_SAFE

ELLIPSIS = "…"

MARK = "[U+{:04X}]"  # how `visible` shows a character nobody could see

_USER_ID = re.compile(r"[UW][A-Z0-9]{1,30}")
_GROUP_ID = re.compile(r"S[A-Z0-9]{1,30}")

_ESCAPED_WEIGHT = {"&": 5, "<": 4, ">": 4}  # len("&amp;"), len("&lt;"), len("&gt;")


# --- characters nobody can see --------------------------------------------------------------------

# "block": what a ``` block or a message shows (line breaks and tabs are kept as they are);
# "inline": one line of `inline code`, where a line break or tab would hide in plain sight;
# "answer": a final answer, which keeps the joiners and selectors that emoji are built from.
Mode = Literal["block", "inline", "answer"]

# Not format characters, yet they render as nothing or as a blank: fillers, invisible vowels,
# the combining grapheme joiner, Mongolian selectors, the blank braille pattern.
_BLANK_LOOKING = (
    0x034F,
    0x115F,
    0x1160,
    0x17B4,
    0x17B5,
    0x180B,
    0x180C,
    0x180D,
    0x180F,
    0x2800,
    0x3164,
    0xFFA0,
)
_KEPT_IN_ANSWERS = frozenset({0x200C, 0x200D, *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)})
# Unassigned and private-use code points are shown in arguments (a newer Unicode may make one a
# format character Slack's clients honour); answers keep them, as they may be newer emoji.
_HIDDEN_CATEGORIES = {
    "block": frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}),
    "inline": frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}),
    "answer": frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"}),
}


@functools.cache
def _bmp_runs() -> tuple[tuple[int, int, str], ...]:
    """(first, last, category) runs of the BMP code points in a category that may hide (once, lazily)."""
    wanted = _HIDDEN_CATEGORIES["block"]
    runs = []
    first = 0
    for category, run in itertools.groupby(map(unicodedata.category, map(chr, range(0x10000)))):
        last = first + sum(1 for _ in run) - 1
        if category in wanted:
            runs.append((first, last, category))
        first = last + 1
    return tuple(runs)


def _without(first: int, last: int, keep: Iterable[int]) -> list[tuple[int, int]]:
    """The range first..last with the code points in `keep` taken out."""
    out = []
    for cp in sorted(k for k in keep if first <= k <= last):
        if first < cp:
            out.append((first, cp - 1))
        first = cp + 1
    return [*out, (first, last)] if first <= last else out


@functools.cache
def _unseen_bmp(mode: Mode) -> re.Pattern[str]:
    """A BMP character that `visible` shows as its code point.

    Only the BMP goes in a class: re looks a BMP class up in one table, but walks astral ranges
    one by one (hundreds of them), which made ordinary text many times slower.
    """
    ranges = [(a, b) for a, b, cat in _bmp_runs() if cat in _HIDDEN_CATEGORIES[mode]]
    ranges += [(cp, cp) for cp in _BLANK_LOOKING]
    if mode != "answer":
        ranges.append((0xFE00, 0xFE0F))
    keep = set() if mode == "inline" else {ord("\n"), ord("\t")}
    if mode == "answer":
        keep |= _KEPT_IN_ANSWERS
    pieces = sorted(piece for first, last in ranges for piece in _without(first, last, keep))
    return re.compile("[" + "".join(f"\\u{a:04x}-\\u{b:04x}" for a, b in pieces) + "]")


_ASTRAL = re.compile("[\\U00010000-\\U0010ffff]")


def warm() -> None:
    """Build the tables of hidden characters now: walking the BMP and compiling its classes takes
    about 100 ms of CPU, once per process. A long-lived process calls this before it forks, so the
    first card or click each of its children handles does not pay for it."""
    for mode in get_args(Mode):
        _unseen_bmp(mode)


@functools.lru_cache(maxsize=8192)
def _astral_unseen(ch: str, mode: Mode) -> bool:
    """Whether `visible` shows this character outside the BMP as its code point."""
    if 0xE0100 <= ord(ch) <= 0xE01EF:  # variation selectors (of ideographs, and for smuggling)
        return mode != "answer"
    return unicodedata.category(ch) in _HIDDEN_CATEGORIES[mode]


def _unseen(text: str, mode: Mode) -> set[str]:
    """The distinct characters of `text` that `visible` shows as code points."""
    found = set(_unseen_bmp(mode).findall(text))
    found.update(ch for ch in set(_ASTRAL.findall(text)) if _astral_unseen(ch, mode))
    return found


def _mark(ch: str) -> str:
    return MARK.format(ord(ch))


def visible_as(text: str, mode: Mode = "block") -> str:
    """`text` as `visible` shows it, in any `Mode` (`inline` shows line breaks and tabs too)."""
    found = _unseen(text, mode)
    return text.translate({ord(ch): _mark(ch) for ch in found}) if found else text


def shown_len(text: str, mode: Mode = "block") -> int:
    """`_escaped_len(visible_as(text, mode))`, without building the (possibly huge) visible text."""
    size = _escaped_len(text)
    for ch in _unseen(text, mode):
        size += text.count(ch) * (len(_mark(ch)) - units(ch))
    return size


def visible(text: str, *, answer: bool = False) -> str:
    """`text` with each character a reader cannot see, or that turns text around, as `[U+XXXX]`.

    Shown so: format characters (bidi controls and isolates, zero-width spaces and joiners, the
    BOM, soft hyphen, tags …), controls other than line break and tab, line and paragraph
    separators, lone surrogates, variation selectors, unassigned and private-use code points,
    and characters that render blank (Hangul fillers, U+034F, U+2800 …). With `answer=True` the
    zero-width (non-)joiner, variation selectors and unassigned or private-use code points stay,
    as emoji and some scripts are made of them; bidi controls are shown even then.
    """
    return visible_as(text, "answer" if answer else "block")


# --- escaping, cutting and quoting untrusted text -------------------------------------------------


def escape(text: str) -> str:
    """Slack mrkdwn escaping: `&`, `<`, `>` become entities, so no mention or link survives."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def units(text: str) -> int:
    """Length in UTF-16 code units: an emoji counts twice, in case Slack counts that way."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _escaped_len(text: str) -> int:
    return units(text) + 4 * text.count("&") + 3 * (text.count("<") + text.count(">"))


def _take(text: str, room: int) -> int:
    """How many leading characters of `text` fit in `room` characters once escaped."""
    used = 0
    for n, ch in enumerate(text):
        used += _ESCAPED_WEIGHT.get(ch, 1) if ch < "\U00010000" else 2
        if used > room:
            return n
    return len(text)


def prefix_len(text: str, room: int, mode: Mode = "block") -> int:
    """How many leading characters of `text` fit in `room` once made visible and escaped."""
    if room <= 0:
        return 0
    head = text[: room + 1]  # every character shows as one or more: no more than `room` can fit
    if len(head) <= room and shown_len(head, mode) <= room:
        return len(text)
    unseen = _unseen(head, mode)
    used = 0
    for n, ch in enumerate(head):
        if ch in unseen:
            used += len(_mark(ch))
        else:
            used += _ESCAPED_WEIGHT.get(ch, 1) if ch < "\U00010000" else 2
        if used > room:
            return n
    return len(head)


def cut(text: str, limit: int) -> str:
    """`text` shortened with a trailing "…" so that even `escape(result)` fits in `limit` characters.

    Characters outside the BMP (most emoji) count as two, as they do in UTF-16.
    Cut the raw text, then escape it: cutting escaped text could split an entity such as `&amp;`.
    """
    if _escaped_len(text) <= limit:
        return text
    if limit <= 0:
        return ""
    return text[: _take(text, limit - len(ELLIPSIS))] + ELLIPSIS


def inert(text: str, limit: int, mode: Mode = "block") -> str:
    """Untrusted text, made visible, cut and escaped: the result is at most `limit` characters."""
    return escape(cut(visible_as(text, mode), limit))


def plain(text: str, limit: int, mode: Mode = "block") -> str:
    """Untrusted text for a field Slack shows as plain text (a task's title, details and output):
    made visible and cut to at most `limit` characters, and not escaped. Slack reads no mrkdwn
    there, so nothing pings or links, and an entity would show as typed (`&gt;`, not `>`)."""
    shown = visible_as(text, mode)
    if units(shown) <= limit:
        return shown
    if limit <= 0:
        return ""
    room, used = limit - len(ELLIPSIS), 0
    for n, ch in enumerate(shown):
        used += units(ch)
        if used > room:
            return shown[:n] + ELLIPSIS
    return shown


def code(text: str, limit: int) -> str:
    """Escaped `text` in a ``` block of at most `limit` characters; a ``` inside cannot close it."""
    body = visible_as(text).replace(FENCE, FENCE_SAFE)
    inner = escape(cut(body, max(limit - 8, 1))) or " "  # "```\n" + inner + "\n```"
    return f"{FENCE}\n{inner}\n{FENCE}"


def inline(text: str, limit: int) -> str:
    """Untrusted text on one line in `inline code`, at most `limit` characters."""
    flat = " ".join(visible_as(text).split()).replace("`", TICK_SAFE) or " "
    return f"`{inert(flat, limit - 2)}`"


def quoted(text: str, limit: int) -> str:
    """Untrusted text on one line in double quotes, at most `limit` characters."""
    flat = " ".join(visible_as(text).split())
    return f'"{inert(flat, limit - 2)}"'


def code_span(text: str) -> str:
    """All of `text` in `inline code`, exactly: nothing flattened, nothing hidden, nothing cut."""
    return f"`{escape(visible_as(text, 'inline').replace('`', TICK_SAFE))}`"


def fence_safe(text: str) -> str:
    """Plain text inside a ``` block: escaped, and no fence of its own."""
    return escape(text).replace(FENCE, FENCE_SAFE)


def answer_mrkdwn(answer: str) -> str:
    """The model's Markdown as mrkdwn, every piece of its text made visible and escaped."""
    return markdown.to_mrkdwn(answer.strip(), lambda text: escape(visible_as(text, "answer")))


def mrkdwn_prefix_len(text: str, room: int) -> int:
    """How many leading characters of mrkdwn (already escaped) fit in `room`, never ending in an entity."""
    n = len(text)
    used = 0
    for i, ch in enumerate(text):
        used += 1 if ch < "\U00010000" else 2
        if used > room:
            n = i
            break
    entity = text.rfind("&", max(0, n - 4), n)  # "&amp;", "&lt;", "&gt;": never cut one in two
    if entity != -1 and ";" not in text[entity:n]:
        n = entity
    return n


# --- what we write ourselves: mentions, dates, counts ---------------------------------------------


def mention(user_id: str | None) -> str:
    """`<@U…>` for an id of ours that looks like one; anything else is shown inert."""
    if user_id and _USER_ID.fullmatch(user_id):
        return f"<@{user_id}>"
    return inert(user_id or "someone", 40)


def approver(who: str | None) -> str:
    """A user (`<@U…>`) or a user group (`<!subteam^S…>`) we named ourselves; anything else inert.

    Only for ids from our own config or records: a group mention notifies every member where it
    is posted, so it goes only where a ping is meant: the reminders that ask people to decide (the
    escalation reminder, the reminder before expiry). Everywhere else deciders are listed
    (cards, replies, the Home tab, status) a group is `decider`: its handle, pinging nobody.
    """
    if who and _GROUP_ID.fullmatch(who):
        return f"<!subteam^{who}>"
    return mention(who)


_HANDLE = re.compile(r"[\w.-]{1,80}")  # what Slack makes a handle of: letters, digits, . _ -
_SPECIAL = frozenset({"here", "channel", "everyone"})  # never shown as if it were a group's handle


def group_handle(who: str | None, handles: Mapping[str, str] | None) -> str | None:
    """The handle of user group `who` in `handles` (id -> handle, from Slack: untrusted), when it
    is one: letters, digits, `.`, `_` and `-` only, and not `here`, `channel` or `everyone`."""
    handle = (handles or {}).get(who or "") or ""
    return handle if _HANDLE.fullmatch(handle) and handle.lower() not in _SPECIAL else None


def decider(who: str | None, handles: Mapping[str, str] | None = None) -> str:
    """A user we named (`<@U…>`), or a user group shown by its handle as plain text (`@oncall`),
    which notifies nobody and links nowhere; a group whose handle is unknown, or is no handle,
    is shown by its id. Anything else inert."""
    if who and _GROUP_ID.fullmatch(who):
        handle = group_handle(who, handles)
        return "@" + escape(handle) if handle else who
    return mention(who)


def deciders_named(who: Sequence[str], handles: Mapping[str, str] | None = None, most: int = 20) -> str:
    """`who` as `decider` shows each, comma-separated, the first `most` of them and a count of the rest."""
    shown = ", ".join(decider(w, handles) for w in who[:most])
    return f"{shown} and {len(who) - most} more" if len(who) > most else shown


def slack_date(at: datetime) -> str:
    """A date Slack shows in the reader's time zone, with a UTC fallback (naive means UTC)."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    fallback = at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{int(at.timestamp())}^{{date_short_pretty}} at {{time}}|{fallback}>"
