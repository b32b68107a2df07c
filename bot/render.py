"""Every message the bot posts, as Block Kit: pure functions, no I/O.

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

An approval card shows each top-level argument on its own, in an order that does not depend on
the model's: first the arguments that name what the call acts on (`TARGET_WORDS`: a path, a URL,
a recipient, a command …), shortest first, then the others, shortest first. A target is shown
whole whenever it fits on the card. Whatever is cut says exactly how many characters are not
shown, and the card then offers "View all arguments" (`arguments_modal`), which shows every
character unless even a modal cannot hold them (`fully_reviewable`), which the card then says.

Every builder keeps within Slack's limits: 50 blocks (100 in a modal), section text 3000
characters, button text 75 and value 2000, context element text 2000, and a whole `blocks`
payload, measured as slack_sdk sends it (ASCII JSON), well under the ~13k characters at which
Slack answers `msg_blocks_too_long`. The `text` fallback stays within 3000 characters.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from slack_sdk.models.blocks import (
    ActionsBlock,
    ButtonElement,
    ConfirmObject,
    ContextActionsBlock,
    ContextBlock,
    DividerBlock,
    FeedbackButtonObject,
    FeedbackButtonsElement,
    HeaderBlock,
    InputBlock,
    MarkdownTextObject,
    PlainTextInputElement,
    PlainTextObject,
    SectionBlock,
)
from slack_sdk.models.views import View

from bot import markdown, texts
from bot.markdown import FENCE, FENCE_SAFE, TICK_SAFE
from harness.policy import Tier
from harness.state import PendingCall, Verdict
from harness.texts import FOOTER, WHY_UNKNOWN_TOOL

SECTION_MAX = 3000
CONTEXT_TEXT_MAX = 2000
BUTTON_VALUE_MAX = 2000
TEXT_MAX = 3000  # our own cap on the `text` fallback (Slack allows 40000)
BLOCKS_JSON_MAX = 11500  # Slack refuses blocks of ~13k characters; stay clear of 12k
PRIVATE_METADATA_MAX = 3000
MODAL_BLOCKS_MAX = 100

ARG_LIMIT = 300  # per call in a turn summary
RESULT_FILE_MIN = 2000  # a tool result longer than this also comes whole, in a file with its turn
RESULT_LIMIT = 300
ANSWER_LIMIT = 10500  # total escaped characters of a final answer across its sections
CARD_ARGS_BUDGET = 8000  # escaped characters of arguments on a card, before shrinking to fit
INLINE_MAX = 200  # a one-line value up to this long sits on its argument's line in `code`
CARD_NAME_MAX = 150  # escaped characters of an argument's name on a card
MODAL_NAME_MAX = 2000

ELLIPSIS = "…"
FEEDBACK_GOOD, FEEDBACK_BAD = "good", "bad"  # the feedback buttons' values: "good:RUN", "bad:RUN"
MARK = "[U+{:04X}]"  # how `visible` shows a character nobody could see

# An argument whose name is one of these words, or has one among its words (`file_path`,
# `toAddress`, `dest_url`), names what the call acts on: it is shown first and whole.
TARGET_WORDS = frozenset(
    {
        *("path", "paths", "file", "files", "filename", "filepath", "dir", "directory", "folder"),
        *("url", "urls", "uri", "href", "link", "endpoint", "host", "hostname", "domain", "server"),
        *("to", "cc", "bcc", "recipient", "recipients", "email", "emails", "address", "channel"),
        *("target", "destination", "dest", "repo", "repository", "branch", "ref", "bucket"),
        *("table", "database", "db", "command", "cmd", "script", "query", "sql", "id", "ids"),
    }
)

_USER_ID = re.compile(r"[UW][A-Z0-9]{1,30}")
_GROUP_ID = re.compile(r"S[A-Z0-9]{1,30}")
_CHANNEL_ID = re.compile(r"[CDG][A-Z0-9]{1,30}")
_ESCAPED_WEIGHT = {"&": 5, "<": 4, ">": 4}  # len("&amp;"), len("&lt;"), len("&gt;")
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


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
    stream: str | None = None  # Markdown to stream into the thread before the message settles as above


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


def _visible(text: str, mode: Mode = "block") -> str:
    found = _unseen(text, mode)
    return text.translate({ord(ch): _mark(ch) for ch in found}) if found else text


def _shown_len(text: str, mode: Mode = "block") -> int:
    """`_escaped_len(_visible(text, mode))`, without building the (possibly huge) visible text."""
    size = _escaped_len(text)
    for ch in _unseen(text, mode):
        size += text.count(ch) * (len(_mark(ch)) - _units(ch))
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
    return _visible(text, "answer" if answer else "block")


# --- text primitives ------------------------------------------------------------------------------


def escape(text: str) -> str:
    """Slack mrkdwn escaping: `&`, `<`, `>` become entities, so no mention or link survives."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _units(text: str) -> int:
    """Length in UTF-16 code units: an emoji counts twice, in case Slack counts that way."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _escaped_len(text: str) -> int:
    return _units(text) + 4 * text.count("&") + 3 * (text.count("<") + text.count(">"))


def _take(text: str, room: int) -> int:
    """How many leading characters of `text` fit in `room` characters once escaped."""
    used = 0
    for n, ch in enumerate(text):
        used += _ESCAPED_WEIGHT.get(ch, 1) if ch < "\U00010000" else 2
        if used > room:
            return n
    return len(text)


def _prefix(text: str, room: int, mode: Mode = "block") -> int:
    """How many leading characters of `text` fit in `room` once made visible and escaped."""
    if room <= 0:
        return 0
    head = text[: room + 1]  # every character shows as one or more: no more than `room` can fit
    if len(head) <= room and _shown_len(head, mode) <= room:
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


def _esc(text: str, limit: int, mode: Mode = "block") -> str:
    """Untrusted text, made visible, cut and escaped: the result is at most `limit` characters."""
    return escape(cut(_visible(text, mode), limit))


def code(text: str, limit: int) -> str:
    """Escaped `text` in a ``` block of at most `limit` characters; a ``` inside cannot close it."""
    body = _visible(text).replace(FENCE, FENCE_SAFE)
    inner = escape(cut(body, max(limit - 8, 1))) or " "  # "```\n" + inner + "\n```"
    return f"{FENCE}\n{inner}\n{FENCE}"


def _inline(text: str, limit: int) -> str:
    """Untrusted text on one line in `inline code`, at most `limit` characters."""
    flat = " ".join(_visible(text).split()).replace("`", TICK_SAFE) or " "
    return f"`{_esc(flat, limit - 2)}`"


def _quoted(text: str, limit: int) -> str:
    """Untrusted text on one line in double quotes, at most `limit` characters."""
    flat = " ".join(_visible(text).split())
    return f'"{_esc(flat, limit - 2)}"'


def _code_span(text: str) -> str:
    """All of `text` in `inline code`, exactly: nothing flattened, nothing hidden, nothing cut."""
    return f"`{escape(_visible(text, 'inline').replace('`', TICK_SAFE))}`"


def mention(user_id: str | None) -> str:
    """`<@U…>` for an id of ours that looks like one; anything else is shown inert."""
    if user_id and _USER_ID.fullmatch(user_id):
        return f"<@{user_id}>"
    return _esc(user_id or "someone", 40)


def approver(who: str | None) -> str:
    """A user (`<@U…>`) or a user group (`<!subteam^S…>`) we named ourselves; anything else inert.

    Only for ids from our own config or records: a group mention notifies every member where it
    is posted, so it goes only where a ping is meant (the escalation reminder) or pings nobody
    (an ephemeral reply, the Home tab).
    """
    if who and _GROUP_ID.fullmatch(who):
        return f"<!subteam^{who}>"
    return mention(who)


def slack_date(at: datetime) -> str:
    """A date Slack shows in the reader's time zone, with a UTC fallback (naive means UTC)."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    fallback = at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{int(at.timestamp())}^{{date_short_pretty}} at {{time}}|{fallback}>"


def _footer(turns: int, requests: int) -> str:
    return FOOTER.format(turns=turns, requests=requests)


def _with_tail(body: str, tail: str, sep: str = "\n\n", mode: Mode = "block") -> str:
    """Escaped untrusted `body` then trusted `tail`, within TEXT_MAX, always ending with `tail`."""
    room = TEXT_MAX - len(tail) - len(sep)
    head = _esc(body, room, mode).strip()
    return f"{head}{sep}{tail}" if head else tail


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


# --- blocks ---------------------------------------------------------------------------------------


def _section(mrkdwn: str) -> dict[str, Any]:
    return SectionBlock(text=MarkdownTextObject(text=mrkdwn or " ")).to_dict()


def _context(*mrkdwn: str) -> dict[str, Any]:
    return ContextBlock(elements=[MarkdownTextObject(text=t or " ") for t in mrkdwn]).to_dict()


def blocks_size(blocks: list[dict[str, Any]]) -> int:
    """Size of the blocks as slack_sdk sends them (ASCII JSON): what `msg_blocks_too_long` counts.

    Non-ASCII characters travel as `\\uXXXX` (an emoji as two of them), so a message of accents
    or emoji is up to twelve times longer on the wire than it looks.
    """
    return len(json.dumps(blocks))


def _fit(build: Callable[[float], list[dict[str, Any]]]) -> list[dict[str, Any]]:
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


def _n(limit: int, scale: float, floor: int = 20) -> int:
    return max(floor, int(limit * scale))


# --- arguments ------------------------------------------------------------------------------------

_Segment = tuple[bool, str]  # (is the body of a ``` block, text): the unit `_pack` lays out
_CONTINUES = "_(continues below, with no line break here)_"
_ENTRY_OVERHEAD = 70  # per argument: bullet, labels, its size, a "not shown" note (roughly)
_MIN_SHOWN = 60  # a value is given at least this much room, or listed among those not shown
_MIN_CODE_PIECE = 200  # a ``` block is not started in less room than this (one is closed early)
_MODAL_SECTIONS = MODAL_BLOCKS_MAX - 2  # leaves room for the opening line and a warning


def is_target(name: str) -> bool:
    """Whether an argument called `name` names what the call acts on (see `TARGET_WORDS`)."""
    joined = re.sub(r"[^a-z0-9]", "", name.lower())
    return joined in TARGET_WORDS or any(word.lower() in TARGET_WORDS for word in _WORDS.findall(name))


@dataclass(frozen=True)
class _Arg:
    """One top-level argument as shown: a string as itself, anything else as compact JSON."""

    name: str
    text: str
    is_text: bool
    target: bool

    @property
    def size(self) -> int:
        """Characters of its name and value: the unit of every "not shown" count."""
        return len(self.name) + len(self.text)

    @functools.cached_property
    def need(self) -> int:
        """Escaped characters its value takes when shown whole (in a ``` block)."""
        return _shown_len(self.text)

    @functools.cached_property
    def name_need(self) -> int:
        """Escaped characters its name takes when shown whole."""
        return _shown_len(self.name, "inline")


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _arguments(call: PendingCall) -> list[_Arg]:
    """The call's arguments, targets first, each group shortest first: never the model's order."""
    items = call.input.items() if isinstance(call.input, dict) else [("input", call.input)]
    args = [
        _Arg(str(k), v if isinstance(v, str) else _compact(v), isinstance(v, str), is_target(str(k)))
        for k, v in items
    ]
    return sorted(args, key=lambda a: (not a.target, len(a.text), a.name))


@dataclass(frozen=True)
class _Shown:
    """Arguments laid out for a card or the modal, and how many of their characters are not shown."""

    segments: tuple[_Segment, ...]
    hidden: int


def _entry(arg: _Arg, room: int, name_max: int, hint: str) -> tuple[list[_Segment], int]:
    """One argument: its name, then its value in at most `room` characters; and what is not shown."""
    n_name = _prefix(arg.name, name_max, "inline")
    name = _code_span(arg.name[:n_name] + (ELLIPSIS if n_name < len(arg.name) else ""))
    label = (" _(target)_" if arg.target else "") + ("" if arg.is_text else " _(JSON)_")
    name_cut = len(arg.name) - n_name
    notes: list[_Segment] = []
    if name_cut:
        notes.append((False, f"_↳ name cut: {_plural(name_cut, 'more character')} not shown{hint}_"))
    if arg.is_text and not arg.text:
        return [(False, f"• {name}{label}: _(empty)_"), *notes], name_cut
    n = _prefix(arg.text, room)
    cut_chars = len(arg.text) - n
    one_line = (
        len(arg.text) <= INLINE_MAX and "\n" not in arg.text and _shown_len(arg.text, "inline") <= INLINE_MAX
    )
    if not cut_chars and one_line:
        return [(False, f"• {name}{label}: {_code_span(arg.text)}"), *notes], name_cut
    lines: list[_Segment] = [(False, f"• {name}{label} — {_plural(len(arg.text), 'character')}:")]
    if n:
        lines.append((True, escape(_visible(arg.text[:n]).replace(FENCE, FENCE_SAFE))))
    if cut_chars:
        lines.append((False, f"_↳ {_plural(cut_chars, 'more character')} not shown{hint}_"))
    return [*lines, *notes], name_cut + cut_chars


def _present(args: Sequence[_Arg], budget: int, *, name_max: int, hint: str) -> _Shown:
    """`args` in about `budget` characters: each target whole if it fits, the rest sharing what is left.

    Sharing is water-filling: short values are shown whole, the long ones cut to equal shares.
    When not even a glimpse of the next argument fits, it and all after it are counted as not shown.
    """
    segments: list[_Segment] = []
    hidden = 0
    left = budget
    for i, arg in enumerate(args):
        over = _ENTRY_OVERHEAD + min(arg.name_need, name_max)
        need = arg.need
        share = left // (len(args) - i)
        if arg.target or over + need <= share:
            room = min(need, left - over)
        elif share - over >= _MIN_SHOWN:
            room = share - over
        else:
            room = min(need, left - over)
        if room < min(need, _MIN_SHOWN):
            rest = args[i:]
            chars = sum(a.size for a in rest)
            not_shown = f"{_plural(len(rest), 'more argument')} not shown ({_plural(chars, 'character')})"
            segments.append((False, f"_…and {not_shown}{hint}_"))
            return _Shown(tuple(segments), hidden + chars)
        entry, cut_chars = _entry(arg, room, name_max, hint)
        segments += entry
        hidden += cut_chars
        left -= over + room
    return _Shown(tuple(segments), hidden)


def _split(body: str, room: int) -> tuple[int, bool]:
    """Where to end the piece of a ``` block body that fits `room`; True if it ends mid-line."""
    if _units(body) <= room:
        return len(body), False
    n = min(len(body), room)
    while (excess := _units(body[:n]) - room) > 0:
        n -= (excess + 1) // 2  # an astral character is two units: never overshoot to nothing
    newline = body.rfind("\n", 0, n + 1)
    if newline > n // 2:
        return newline, False
    entity = body.rfind("&", max(0, n - 4), n)
    if entity >= 0 and ";" not in body[entity:n]:
        n = entity  # never split `&amp;` in two
    mark = body.rfind("[U+", max(0, n - 9), n)
    if mark > 0 and "]" not in body[mark:n]:
        n = mark  # nor a `[U+202E]`
    return n, True


def _pack(segments: Iterable[_Segment]) -> list[str]:
    """Segments laid out in section texts of at most SECTION_MAX characters.

    A ``` block too long for one section is closed and reopened in the next, where possible at a
    line break; where not, a note outside the block (which its text cannot forge) says that the
    line goes on, so a break between sections is never read as a line break of the value.
    """
    sections: list[str] = []
    lines: list[str] = []
    size = 0

    def put(text: str) -> None:
        nonlocal size
        size += _units(text) + (1 if lines else 0)
        lines.append(text)

    def flush() -> None:
        nonlocal size
        if lines:
            sections.append("\n".join(lines))
        lines.clear()
        size = 0

    for is_code, text in segments:
        if not is_code:
            text = text[:SECTION_MAX]  # never triggers: names are cut to 2000, inline values to 200
            if size + 1 + _units(text) > SECTION_MAX:
                flush()
            put(text)
            continue
        body = text
        while body:
            room = SECTION_MAX - size - 1 - len(FENCE) * 2 - 2 - len(_CONTINUES) - 1
            if room < _MIN_CODE_PIECE and lines:
                flush()
                continue
            n, mid_line = _split(body, room)
            put(f"{FENCE}\n{body[:n]}\n{FENCE}")
            if mid_line:
                put(_CONTINUES)
                body = body[n:]
            else:
                body = body[n + 1 :]
    flush()
    return sections


def _modal_layout(args: Sequence[_Arg]) -> tuple[list[str], _Shown]:
    """The modal's argument sections: everything, or as much as 98 sections hold."""
    budget = _MODAL_SECTIONS * SECTION_MAX
    while True:
        shown = _present(args, budget, name_max=MODAL_NAME_MAX, hint="")
        packed = _pack(shown.segments)
        if len(packed) <= _MODAL_SECTIONS or budget <= 0:
            return packed, shown
        budget = int(budget * _MODAL_SECTIONS / len(packed) * 0.97)


def fully_reviewable(call: PendingCall) -> bool:
    """Whether "View all arguments" can show every character of the call's input.

    When it cannot, nobody can review the call in Slack, and it must not be approved there.
    """
    return _reviewable(_arguments(call))


def _reviewable(args: Sequence[_Arg]) -> bool:
    if sum(a.need + a.name_need for a in args) > _MODAL_SECTIONS * SECTION_MAX:
        return False  # more than the sections could hold even if every one were full
    return _modal_layout(args)[1].hidden == 0


def arguments_modal(*, call: PendingCall, preview: str | None = None) -> dict[str, Any]:
    """The modal behind "View all arguments": every argument of `call` in full, nothing to submit.

    `preview`: what the call would change (a diff), shown whole after the arguments as far as the
    modal's blocks allow.
    """
    args = _arguments(call)
    packed, shown = _modal_layout(args)
    count = len(args)
    intro = (
        f"{_inline(call.name, 200)} with {_plural(count, 'argument')}, each in full, those naming what "
        "the call acts on first. Characters nobody could see, or that turn text around, are shown "
        "as `[U+XXXX]`."
    )
    blocks = [_section(intro), *(_section(s) for s in packed)]
    room = MODAL_BLOCKS_MAX - len(blocks) - 2
    if preview and room > 0:
        blocks += [_section(s) for s in _preview_sections(preview, room)]
    if shown.hidden:
        blocks.append(
            _section(
                "⛔ *These arguments are too large to review in Slack:* "
                f"{_plural(shown.hidden, 'character')} of them cannot be shown here, so this call "
                "cannot be approved in Slack."
            )
        )
    view = View(
        type="modal",
        callback_id="view_args",
        title=PlainTextObject(text="All arguments"),
        close=PlainTextObject(text="Close"),
        blocks=blocks,
    )
    return view.to_dict()


# --- turn summary ---------------------------------------------------------------------------------


def _args_json(call: PendingCall) -> str:
    """The input as JSON, its keys in the card's order (targets first) rather than the model's."""
    if not isinstance(call.input, dict):
        return json.dumps(call.input, ensure_ascii=False, default=str)
    ordered = {a.name: call.input[a.name] for a in _arguments(call)}
    return json.dumps(ordered, ensure_ascii=False, default=str)


def _outcome(call: PendingCall, limit: int) -> str:
    """What became of one call, for its line in the turn summary."""
    decision = call.decision
    if call.tier is Tier.DENY:
        if call.result is not None and WHY_UNKNOWN_TOOL in call.why:  # not offered: say why
            return f"⛔ {_quoted(call.result.text, limit)} (not run)"
        return "⛔ denied by policy (not run)"
    if decision is not None and decision.verdict is Verdict.EXPIRED:
        return "⌛ expired: nobody decided in time (not run)"
    if decision is not None and decision.verdict is Verdict.DECLINED:
        said = f": {_quoted(decision.reason, limit)}" if decision.reason else ""
        return f"❌ declined by {mention(decision.by)}{said} (not run)"
    result = call.result
    if result is None:
        return "_not run_"
    shown = _quoted(result.text, limit) if result.text.strip() else "_(empty)_"
    if result.is_error:
        shown = f"✗ {shown}"
    if decision is not None and decision.verdict is Verdict.APPROVED and decision.grant == "used":
        shown += f" (run under {mention(decision.by)}'s grant for this thread)"
    elif decision is not None and decision.verdict is Verdict.APPROVED and decision.edited_input is not None:
        shown += f" (approved with edits by {mention(decision.by)})"
    elif decision is not None and decision.verdict is Verdict.APPROVED:
        shown += f" (approved by {mention(decision.by)})"
    return shown


def _call_line(call: PendingCall, limit: int) -> str:
    name = _inline(call.name, 80)
    why = f" _({call.tier.value}: {_inline(call.why, 200)})_" if call.why else ""
    return f"• {name} {_inline(_args_json(call), limit)} → {_outcome(call, limit)}{why}"


def _pack_sections(lines: Sequence[str]) -> list[dict[str, Any]]:
    """Lines joined into as few sections as fit SECTION_MAX each (no line is split)."""
    sections: list[str] = []
    current = ""
    for line in lines:
        line = line[:SECTION_MAX]
        if current and len(current) + 1 + len(line) > SECTION_MAX:
            sections.append(current)
            current = line
        else:
            current = f"{current}\n{line}" if current else line
    if current:
        sections.append(current)
    return [_section(s) for s in sections]


def turn_summary(turn: int, calls: Sequence[PendingCall], tokens: int, budget: int) -> Message:
    """One message per turn: each call with its arguments and outcome, and the tokens used so far."""
    usage = f"{tokens:,} / {budget:,} tokens used"
    limit = max(60, min(ARG_LIMIT, 6000 // max(len(calls), 1)))
    lines = [_call_line(call, limit) for call in calls]
    head = f"*Turn {turn}*" + ("" if calls else " (no tool calls)")

    def build(shown: int) -> list[dict[str, Any]]:
        rest = len(lines) - shown
        tail = [f"…and {rest} more call{'s' if rest != 1 else ''}"] if rest else []
        return [*_pack_sections([head, *lines[:shown], *tail]), _context(usage)]

    def fits(blocks: list[dict[str, Any]]) -> bool:
        return len(blocks) <= 50 and blocks_size(blocks) <= BLOCKS_JSON_MAX

    lo, hi = 0, len(lines)  # the largest number of lines shown in full that still fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(build(mid)):
            lo = mid
        else:
            hi = mid - 1
    blocks = build(lo)
    long = [c for c in calls if c.result is not None and len(c.result.text) > RESULT_FILE_MIN]
    if long:  # the note goes above the token count, when it fits
        noted = [*blocks[:-1], _context(texts.RESULTS_IN_FILE), blocks[-1]]
        blocks = noted if fits(noted) else blocks
    names = ", ".join(call.name for call in calls) or "no tool calls"
    text = _with_tail(f"Turn {turn}: {names}", usage, " — ")
    whole = (
        Attachment(f"turn-{turn}.md", texts.RESULTS_FILE_TITLE.format(turn=turn), _turn_file(calls))
        if long
        else None
    )
    return Message(text=text, blocks=blocks, attachment=whole)


def _turn_file(calls: Sequence[PendingCall]) -> str:
    """Every call of a turn with its arguments and result in full, as a Markdown file (a file is
    not mrkdwn: nothing in it can ping, so it is not escaped; hidden characters are shown)."""
    parts = []
    for call in calls:
        arguments = json.dumps(call.input, ensure_ascii=False, indent=2, default=str).replace(
            FENCE, FENCE_SAFE
        )
        result = visible(call.result.text if call.result is not None else "(not run)").replace(
            FENCE, FENCE_SAFE
        )
        error = " (error)" if call.result is not None and call.result.is_error else ""
        parts.append(
            f"## {call.name}\n\nArguments:\n\n{FENCE}json\n{arguments}\n{FENCE}\n\n"
            f"Result{error}:\n\n{FENCE}\n{result}\n{FENCE}\n"
        )
    return "\n".join(parts)


# --- approvals ------------------------------------------------------------------------------------


def _button_value(run_id: str, call: PendingCall) -> str:
    """`run:call:fingerprint`: a click binds to the exact call its card shows."""
    value = f"{run_id}:{call.id}:{call.fingerprint}"
    if len(value) > BUTTON_VALUE_MAX:
        raise ValueError(f"button value of {len(value)} characters exceeds Slack's {BUTTON_VALUE_MAX}")
    return value


def _what_will_run(
    call: PendingCall, args: Sequence[_Arg], heading: str, requester: str, scale: float, hint: str
) -> tuple[list[dict[str, Any]], _Shown]:
    """The tool, each argument on its own (cut to fit, saying so), and who the run is for."""
    shown = _present(args, _n(CARD_ARGS_BUDGET, scale, 0), name_max=CARD_NAME_MAX, hint=hint)
    what = "with these arguments:" if args else "with no arguments."
    blocks = [
        _section(f"{heading} {_inline(call.name, 120)} {what}"),
        *(_section(s) for s in _pack(shown.segments)),
        _context(f"Asked for by {mention(requester)}"),
    ]
    return blocks, shown


def _target_text(args: Sequence[_Arg]) -> str:
    """The " on TARGET" of the `text` fallback: what the call acts on (raw, escaped later)."""
    return f" on {args[0].text}" if args and args[0].target else ""


def _who_decides(requester: str, approvers: Sequence[str]) -> str:
    people = [mention(a) for a in approvers] or [mention(requester)]
    shown = ", ".join(people[:20])
    if len(people) > 20:
        shown += f" and {len(people) - 20} more"
    return f"only {shown}"


def approval_card(
    *,
    run_id: str,
    call: PendingCall,
    requester: str,
    tier_source: str,
    approvers: Sequence[str],
    expires_at: datetime,
    title: str | None = None,
    annotations: Mapping[str, Any] | None = None,
    intent: str = "",
    preview: str | None = None,
    required: int = 1,
    votes: Sequence[str] = (),
    self_approval: bool = True,
    grant_minutes: float = 0,
) -> Message:
    """The card asking a human to approve or decline one `ask`-tier call.

    `title` and `annotations` are what an MCP server says of its tool: hints, shown as such.
    `intent`: the model's own words in the reply that made the call. `preview`: what the call
    would change (a diff), as plain text. `required` > 1: a quorum, with `votes` so far.
    """
    value = _button_value(run_id, call)
    expires = slack_date(expires_at)
    described = _tool_described(title, annotations)
    rules = []
    if required > 1:
        so_far = ", ".join(mention(v) for v in votes[:20]) if votes else "nobody yet"
        rules.append(
            f"*Approvals:* {len(votes)} of {required} needed (so far: {so_far}); one decline declines"
        )
    if not self_approval:
        rules.append(
            f"*Four eyes:* {mention(requester)} asked for this run and may decline it, not approve it"
        )
    details = "\n".join(
        [
            *described,
            f"*Why it needs approval:* {_inline(tier_source, 400)}",
            f"*Who may decide:* {_who_decides(requester, approvers)}",
            *rules,
            f"*Expires:* {expires} (the call will not run if nobody decides by then)",
        ]
    )
    buttons = [
        ButtonElement(text="Approve", action_id="approve", value=value, style="primary"),
        ButtonElement(text="Decline", action_id="decline", value=value, style="danger"),
        ButtonElement(text="Edit…", action_id="edit", value=value),
        ButtonElement(text="Decline with reason…", action_id="decline_with_reason", value=value),
    ]
    if grant_minutes > 0 and required <= 1:
        buttons.append(
            ButtonElement(
                text=f"Approve for this thread ({_duration(grant_minutes)})",
                action_id="approve_thread",
                value=value,
            )
        )
    view_all = ButtonElement(text="View all arguments", action_id="view_args", value=value)
    args = _arguments(call)
    reviewable = _reviewable(args)
    total = sum(a.size for a in args)

    def warning(shown: _Shown) -> list[dict[str, Any]]:
        if not reviewable:
            return [
                _section(
                    f"⛔ *These arguments are too large to review in Slack* ({_plural(total, 'character')}): "
                    "not even *View all arguments* can show them all, so this call cannot be approved "
                    "here. Decline it, and ask for something smaller."
                )
            ]
        if shown.hidden:
            return [
                _section(
                    f"⚠️ *Not everything fits on this card:* {_plural(shown.hidden, 'character')} of the "
                    "arguments are not shown. Press *View all arguments* to read every one in full "
                    "before you decide."
                )
            ]
        return []

    def build(scale: float) -> list[dict[str, Any]]:
        heading = ":raised_hand: *Approval needed:* the agent wants to run"
        blocks, shown = _what_will_run(call, args, heading, requester, scale, " (see View all arguments)")
        preview_cut = bool(preview) and len(preview or "") > _n(2400, scale, 100)
        more = [view_all] if shown.hidden or not reviewable or preview_cut else []
        actions = ActionsBlock(block_id="approval", elements=[*buttons, *more]).to_dict()
        said = []
        if intent.strip():
            words, room = _answer_mrkdwn(intent), _n(1200, scale, 80)
            if _units(words) > room:
                words = words[: _take_mrkdwn(words, room - len(ELLIPSIS))] + ELLIPSIS
            said = [_section(f"*What the model said with it:*\n>{words.replace(chr(10), chr(10) + '>')}")]
        change = []
        if preview:
            limit = _n(2400, scale, 100)
            body = cut(preview, limit)
            whole = "" if len(preview) <= limit else "\n_The whole change: *View all arguments*._"
            change = [
                _section(f"*What it would change:*\n{FENCE}\n{_fence_safe(_visible(body))}\n{FENCE}{whole}")
            ]
        return [*blocks, *said, *change, *warning(shown), _section(details), actions]

    text = _with_tail(
        f"Approval needed: the agent wants to run {call.name}{_target_text(args)}",
        f"(asked for by {mention(requester)}; expires {expires})",
        " ",
    )
    return Message(text=text, blocks=_fit(build))


_HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


def _tool_described(title: str | None, annotations: Mapping[str, Any] | None) -> list[str]:
    """The tool's title and annotations as its server gives them (hints, not guarantees)."""
    lines = []
    if title:
        lines.append(f"*Tool:* {_inline(title, 200)}")
    hints = [f"{k}: {str(annotations[k]).lower()}" for k in _HINTS if annotations and k in annotations]
    if hints:
        lines.append(f"*The server says of it:* {_inline(', '.join(hints), 300)}")
    return lines


def decided_card(
    *,
    call: PendingCall,
    requester: str,
    verdict: Verdict,
    by: str | None,
    at: datetime,
    reason: str | None = None,
    edited_input: Mapping[str, Any] | None = None,
    approvers: Sequence[str] = (),
    grant: str | None = None,
    grant_until: datetime | None = None,
) -> Message:
    """The approval card once decided: no buttons left, the outcome and who decided shown."""
    when = slack_date(at)
    who = f" by {mention(by)}" if by else ""
    if len(approvers) > 1:
        who = " by " + ", ".join(mention(a) for a in approvers[:20])
    args = _arguments(call)

    def outcome(scale: float) -> str:
        if verdict is Verdict.APPROVED and edited_input is not None:
            changes = _changes(call.input if isinstance(call.input, dict) else {}, edited_input)
            return f"✏️ Approved with edits{who} at {when}\n{cut(changes, _n(2400, scale, 100))}"
        if verdict is Verdict.APPROVED and grant == "used":
            return f"✅ Run under a grant for this thread{who} at {when}"
        if verdict is Verdict.APPROVED and grant == "given":
            until = f" until {slack_date(grant_until)}" if grant_until else ""
            return f"✅ Approved{who} at {when}, with later calls of this tool in this thread{until}"
        if verdict is Verdict.APPROVED:
            return f"✅ Approved{who} at {when}"
        if verdict is Verdict.EXPIRED:
            return f"⌛ Expired at {when} — nobody decided in time; the call was not run"
        said = f" — reason: {_esc(reason, _n(2000, scale, 100))}" if reason else ""
        return f"❌ Declined{who} at {when}{said}"

    def build(scale: float) -> list[dict[str, Any]]:
        blocks, shown = _what_will_run(call, args, "The agent asked to run", requester, scale, "")
        if shown.hidden:
            blocks.append(
                _context(f"_{_plural(shown.hidden, 'character')} of the arguments not shown here._")
            )
        return [*blocks, _section(outcome(scale))]

    text = _with_tail(f"{call.name}{_target_text(args)}", outcome(0.5), ": ")
    return Message(text=text, blocks=_fit(build))


# --- endings --------------------------------------------------------------------------------------


def _answer_mrkdwn(answer: str) -> str:
    """The model's Markdown as mrkdwn, every piece of its text made visible and escaped."""
    return markdown.to_mrkdwn(answer.strip(), lambda text: escape(_visible(text, "answer")))


def _take_mrkdwn(text: str, room: int) -> int:
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


def _answer_sections(answer: str, total: int) -> tuple[list[str], bool]:
    """`answer` (Markdown) as mrkdwn, cut to `total` and split into sections of <= SECTION_MAX, and
    whether it had to be cut.

    Splits prefer line breaks, never fall inside an escaped entity, and a ``` block that spans a
    split is closed at the end of one section and reopened at the start of the next.
    """
    rest = _answer_mrkdwn(answer)
    was_cut = _units(rest) > total
    if was_cut:
        rest = rest[: _take_mrkdwn(rest, total - len(ELLIPSIS))] + ELLIPSIS
    chunks: list[str] = []
    in_fence = False
    while rest:
        prefix = f"{FENCE}\n" if in_fence else ""
        room = SECTION_MAX - len(prefix) - len(FENCE) - 1
        n = _take_mrkdwn(rest, room)
        if n < len(rest):
            newline = rest.rfind("\n", 0, n)
            if newline > n // 2:
                n = newline
            back = 0
            while back < 2 and n > 1 and rest[n - 1] == "`":  # never split a fence in two
                n, back = n - 1, back + 1
        piece, rest = rest[:n], rest[n:].lstrip("\n")
        if in_fence:
            piece = piece.lstrip("\n")
        if not piece.strip() and not in_fence:
            continue
        in_fence = (piece.count(FENCE) % 2 == 1) != in_fence
        chunks.append(prefix + piece + (f"\n{FENCE}" if in_fence else ""))
    return chunks, was_cut


def final_answer(answer: str, turns: int, requests: int, *, run_id: str | None = None) -> Message:
    """The model's answer (its Markdown as mrkdwn, escaped, split over sections), the footer, and
    with `run_id` Slack's feedback buttons (`feedback`: ``good:RUN`` or ``bad:RUN``).

    An answer longer than a message can hold is cut, says so, and comes whole as a file. `stream`
    is the answer as Slack streams it first (escaped Markdown), before the message settles.
    """
    footer = _footer(turns, requests)
    feedback = [] if run_id is None else [feedback_buttons(run_id)]
    cut_off = [False]

    def build(scale: float) -> list[dict[str, Any]]:
        chunks, cut_off[0] = _answer_sections(answer, _n(ANSWER_LIMIT, scale, 500))
        chunks = chunks or ["_(the model gave no answer)_"]
        note = [_context(texts.ANSWER_IN_FILE)] if cut_off[0] else []
        return [*(_section(chunk) for chunk in chunks), *note, _context(footer), *feedback]

    blocks = _fit(build)
    whole = (
        Attachment("answer.md", texts.ANSWER_FILE_TITLE, visible(answer, answer=True)) if cut_off[0] else None
    )
    streamed = escape(visible(answer.strip(), answer=True)) or None  # inert while it streams too
    text = _with_tail(answer, footer, mode="answer")
    return Message(text=text, blocks=blocks, attachment=whole, stream=streamed)


def feedback_buttons(run_id: str) -> dict[str, Any]:
    """Thumbs up and down under an answer, as Slack shows them for AI apps (`context_actions`)."""
    return ContextActionsBlock(
        block_id="feedback",
        elements=[
            FeedbackButtonsElement(
                action_id="feedback",
                positive_button=FeedbackButtonObject(
                    text="👍", value=f"{FEEDBACK_GOOD}:{run_id}", accessibility_label="This answer helped"
                ),
                negative_button=FeedbackButtonObject(
                    text="👎",
                    value=f"{FEEDBACK_BAD}:{run_id}",
                    accessibility_label="This answer did not help",
                ),
            )
        ],
    ).to_dict()


def stopped(reason: str, turns: int, requests: int) -> Message:
    """A stop by a valve: which valve and why, and the footer."""
    footer = _footer(turns, requests)

    def build(scale: float) -> list[dict[str, Any]]:
        said = _esc(reason, _n(SECTION_MAX - 20, scale, 200))
        return [_section(f":octagonal_sign: {said}"), _context(footer)]

    return Message(text=_with_tail(":octagonal_sign: " + reason, footer), blocks=_fit(build))


def _failure_section(error: str, scale: float) -> dict[str, Any]:
    return _section(":warning: The run failed: " + _esc(error, _n(SECTION_MAX - 40, scale, 200)))


def failed(*, run_id: str, error: str) -> Message:
    """A run that failed on a model API error, with a Retry button (value: the run id)."""
    if len(run_id) > BUTTON_VALUE_MAX:
        raise ValueError(f"run id of {len(run_id)} characters does not fit a button value")
    actions = ActionsBlock(
        block_id="failure",
        elements=[ButtonElement(text="Retry", action_id="retry", value=run_id, style="primary")],
    ).to_dict()

    def build(scale: float) -> list[dict[str, Any]]:
        return [_failure_section(error, scale), actions]

    return Message(text=_esc("The run failed: " + error, TEXT_MAX), blocks=_fit(build))


def retried_card(*, error: str, by: str, at: datetime) -> Message:
    """The failure message after Retry was clicked: no button, who retried and when."""
    retried = f":repeat: Retried by {mention(by)} at {slack_date(at)}"

    def build(scale: float) -> list[dict[str, Any]]:
        return [_failure_section(error, scale), _context(retried)]

    return Message(text=_with_tail("The run failed: " + error, retried), blocks=_fit(build))


def notice(text: str, **users: str | Sequence[str]) -> Message:
    """A plain message with text we wrote ourselves (escaped all the same).

    `{name}` placeholders are filled, after escaping, with real mentions of the trusted user ids
    given as `name=` (one id or several).
    """

    def body(limit: int) -> str:
        out = _esc(text, limit)
        for name, ids in users.items():
            ids = [ids] if isinstance(ids, str) else list(ids)
            out = out.replace("{" + name + "}", ", ".join(approver(u) for u in ids[:20]))
        return out

    return Message(
        text=body(SECTION_MAX) or " ", blocks=_fit(lambda scale: [_section(body(_n(SECTION_MAX, scale)))])
    )


def _preview_sections(preview: str, room: int) -> list[str]:
    """The whole preview as fenced sections, at most `room` of them (the last says if it is cut)."""
    body = _fence_safe(_visible(preview))
    size = SECTION_MAX - 2 * len(FENCE) - 80
    chunks = [body[i : i + size] for i in range(0, len(body), size)] or [""]
    sections = []
    for n, chunk in enumerate(chunks[:room]):
        head = "*What it would change:*\n" if n == 0 else ""
        sections.append(f"{head}{FENCE}\n{chunk}\n{FENCE}")
    if len(chunks) > room:
        sections[-1] += (
            f"\n_…the rest of the change ({len(body) - room * size:,} characters) does not fit here._"
        )
    return sections


def _duration(minutes: float) -> str:
    if minutes >= 120 and minutes % 60 == 0:
        return f"{int(minutes // 60)} h"
    return f"{minutes:g} min"


def _fence_safe(text: str) -> str:
    """Plain text inside a ``` block: escaped, and no fence of its own."""
    return escape(text).replace(FENCE, FENCE_SAFE)


def _changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """What a reviewer changed, argument by argument: `name: old → new`, escaped."""
    lines = []
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            old = json.dumps(before.get(name), ensure_ascii=False) if name in before else "(absent)"
            new = json.dumps(after.get(name), ensure_ascii=False) if name in after else "(absent)"
            lines.append(f"• {_inline(name, 80)}: {_inline(old, 400)} → {_inline(new, 400)}")
    return "\n".join(lines) or "(no argument changed)"


EDIT_VALUE_MAX = 3000  # Slack's plain_text_input max_length


def edit_value(value: Any) -> str:
    """An argument as the edit modal shows it: strings as they are, anything else as JSON text."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def edit_modal(*, run_id: str, call: PendingCall, schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """The `edit_call` modal: one input per top-level argument, its current value to change.

    Every property of the tool's schema gets an input (absent ones start empty); strings are
    edited as they are, other values as JSON text. Submitting approves the edited call. A value too
    long for an input (`EDIT_VALUE_MAX`) gets none: the modal says it is kept as it is. Unless the
    call is too large to review (`fully_reviewable`): then the modal says it cannot be approved as
    it is, and such a value gets an empty input to replace it (left empty, it is kept, and the
    submission is refused while the call is still too large to review).
    """
    metadata = _button_value(run_id, call)
    properties = dict((schema or {}).get("properties") or {})
    names = list(call.input) if isinstance(call.input, dict) else []
    names += [n for n in properties if n not in names]
    required = set((schema or {}).get("required") or ())
    reviewable = fully_reviewable(call)
    intro = (
        f"Editing {_inline(call.name, 120)}: the call runs with what you submit, "
        "and the model is told a reviewer changed it. Strings as they are; other values as JSON."
    )
    if not reviewable:
        intro = f"{texts.EDIT_NOT_REVIEWABLE}\n{intro}"
    blocks: list[Any] = [ContextBlock(elements=[MarkdownTextObject(text=intro)])]
    kept = names[_MODAL_SECTIONS:]
    for name in names[:_MODAL_SECTIONS]:
        current = call.input.get(name) if isinstance(call.input, dict) else None
        initial = edit_value(current) if isinstance(call.input, dict) and name in call.input else None
        if initial is not None and len(initial) > EDIT_VALUE_MAX:
            if not reviewable:  # the one way to approve it here: replace what nobody could read
                blocks.append(_replace_input(name, len(initial)))
                continue
            kept.append(name)  # an input would hold it cut, and submitting would cut the argument
            continue
        kind = (properties.get(name) or {}).get("type")
        long = kind not in ("integer", "number", "boolean") and (initial is None or len(initial) > 60)
        element = PlainTextInputElement(
            action_id="value",
            multiline=long,
            initial_value=initial[:EDIT_VALUE_MAX] if initial is not None else None,
            max_length=EDIT_VALUE_MAX,
        )
        hint = (properties.get(name) or {}).get("description")
        blocks.append(
            InputBlock(
                block_id=name[:255],
                label=PlainTextObject(text=name[:2000]),
                element=element,
                optional=name not in required,
                hint=PlainTextObject(text=str(hint)[:2000]) if hint else None,
            )
        )
    if kept:
        listed = ", ".join(_inline(n, 80) for n in kept[:20]) + (" …" if len(kept) > 20 else "")
        note = f"Kept as they are (too long to edit here): {listed}"
        blocks.append(ContextBlock(elements=[MarkdownTextObject(text=note[:3000])]))
    view = View(
        type="modal",
        callback_id="edit_call",
        private_metadata=metadata,
        title=PlainTextObject(text="Edit, then approve"),
        submit=PlainTextObject(text="Approve edited"),
        close=PlainTextObject(text="Cancel"),
        blocks=blocks,
    )
    return view.to_dict()


def _replace_input(name: str, size: int) -> InputBlock:
    """An empty input for an argument too long to show in one: what is typed replaces it."""
    hint = texts.EDIT_REPLACE_HINT.format(size=f"{size:,}")
    element = PlainTextInputElement(action_id="value", multiline=True, max_length=EDIT_VALUE_MAX)
    return InputBlock(
        block_id=name[:255],
        label=PlainTextObject(text=name[:2000]),
        element=element,
        optional=True,
        hint=PlainTextObject(text=hint),
    )


def grant_notice(*, tool: str, by: str, requester: str, until: datetime, value: str) -> Message:
    """The thread's note of a grant, with the button that revokes it."""
    text = (
        f"🔓 {mention(by)} approved {_inline(tool, 120)} for this thread until {slack_date(until)}: later "
        f"calls of it in runs {mention(requester)} asks for here run without a card."
    )
    actions = ActionsBlock(
        block_id="grant",
        elements=[ButtonElement(text="Revoke", action_id="revoke_grant", value=value, style="danger")],
    ).to_dict()
    return Message(text=text, blocks=[_section(text), actions])


def grant_revoked(*, tool: str, by: str, at: datetime) -> Message:
    when = slack_date(at)
    text = f"🔒 The grant of {_inline(tool, 120)} in this thread was revoked by {mention(by)} at {when}."
    return Message(text=text, blocks=[_section(text)])


# --- escalation and the Home tab ------------------------------------------------------------------


def escalation_reminder(
    *, calls: Sequence[PendingCall], requester: str, escalate_to: Sequence[str], expires_at: datetime
) -> Message:
    """The one reminder of a park nobody decided in time: it mentions `escalate_to`, on purpose."""
    names = ", ".join(_inline(c.name, 120) for c in calls[:10]) or "a call"
    if len(calls) > 10:
        names += f" and {len(calls) - 10} more"
    who = ", ".join(approver(w) for w in escalate_to[:20])
    text = texts.ESCALATION.format(
        who=who, calls=names, requester=mention(requester), expires=slack_date(expires_at)
    )
    return Message(text=text, blocks=[_section(text)])


@dataclass(frozen=True)
class HomeItem:
    """One call waiting on the person whose Home tab lists it, and where its card is."""

    call: PendingCall
    requester: str
    channel: str
    expires_at: datetime
    card_ts: str | None = None  # where its approval card is
    link: str | None = None  # the card's permalink, from chat.getPermalink


HOME_ITEMS_MAX = 20  # each item is two blocks; a Home view holds 100
_PERMALINK = re.compile(r"https://[A-Za-z0-9.-]+/archives/[A-Z0-9]+/p[0-9]+(\?[A-Za-z0-9=&._-]*)?")


def _home_item(item: HomeItem) -> dict[str, Any]:
    args = _arguments(item.call)
    target = f" on {_inline(args[0].text, 200)}" if args and args[0].target else ""
    where = f"<#{item.channel}>" if _CHANNEL_ID.fullmatch(item.channel) else _esc(item.channel, 40)
    link = item.link if item.link and _PERMALINK.fullmatch(item.link) else None
    lines = [
        f"*{_inline(item.call.name, 120)}*{target}",
        _inline(_args_json(item.call), 400),
        f"Asked for by {mention(item.requester)} in {where} · expires {slack_date(item.expires_at)}",
        f"<{escape(link)}|{texts.HOME_OPEN_CARD}>" if link else texts.HOME_NO_LINK,
    ]
    return _section("\n".join(lines))


def home_view(items: Sequence[HomeItem], *, more: bool = False, at: datetime) -> dict[str, Any]:
    """The bot's Home tab for one person: the approvals they may decide now, each with its card."""
    shown = list(items[:HOME_ITEMS_MAX])
    more = more or len(items) > len(shown)
    blocks: list[dict[str, Any]] = [
        HeaderBlock(text=PlainTextObject(text=texts.HOME_TITLE)).to_dict(),
        _context(texts.HOME_UPDATED.format(at=slack_date(at))),
    ]
    if not shown:
        blocks.append(_section(texts.HOME_EMPTY))
    for item in shown:
        blocks += [DividerBlock().to_dict(), _home_item(item)]
    if more:
        blocks.append(_context(texts.HOME_MORE))
    return View(type="home", blocks=blocks).to_dict()


def decline_reason_modal(*, run_id: str, call: PendingCall) -> dict[str, Any]:
    """The modal behind "Decline with reason…": one multiline input the model will read."""
    metadata = _button_value(run_id, call)
    if len(metadata) > PRIVATE_METADATA_MAX:
        raise ValueError(f"private_metadata of {len(metadata)} characters exceeds {PRIVATE_METADATA_MAX}")
    view = View(
        type="modal",
        callback_id="decline_reason",
        private_metadata=metadata,
        title=PlainTextObject(text="Decline"),
        submit=PlainTextObject(text="Decline"),
        close=PlainTextObject(text="Cancel"),
        blocks=[
            ContextBlock(
                elements=[
                    MarkdownTextObject(
                        text=f"Declining {_inline(call.name, 120)}: the call will not run, "
                        "and the model is told why."
                    )
                ]
            ),
            InputBlock(
                block_id="reason",
                label=PlainTextObject(text="Why? (the model will read this)"),
                element=PlainTextInputElement(action_id="reason", multiline=True, max_length=500),
            ),
        ],
    )
    return view.to_dict()


# --- stopping a run, and limits that ask ------------------------------------------------------------


def working(*, run_id: str) -> Message:
    """The run's "Working on it…" message: its Stop button (value: the run id) while it works or waits.

    Posted first, before the run's first model request, so the thread has a Stop from the start.
    Its actions block is `working`, apart from the cards' `approval` blocks.
    """
    if len(run_id) > BUTTON_VALUE_MAX:
        raise ValueError(f"run id of {len(run_id)} characters does not fit a button value")
    stop = ButtonElement(
        text="Stop",
        action_id="stop",
        value=run_id,
        style="danger",
        confirm=ConfirmObject(
            title="Stop this run?",
            text="It ends before its next model request; a tool already running finishes first.",
            confirm="Stop it",
            deny="Keep going",
        ),
    )
    text = texts.WORKING
    actions = ActionsBlock(block_id="working", elements=[stop]).to_dict()
    return Message(text=text, blocks=[_section(text), actions, _context(texts.WORKING_WHO)])


def working_closed(*, outcome: str, by: str | None = None) -> Message:
    """The "Working on it…" message once the run stopped working: no button, how it ended.

    `outcome`: "finished", "stopped" or "failed"; `by`: who pressed Stop, if anyone did (a run can
    still finish when the request in flight was its last).
    """
    if outcome == "finished":
        text = texts.WORKING_DONE_BEFORE_STOP.format(who=mention(by)) if by else texts.WORKING_DONE
    elif outcome == "failed":
        text = texts.WORKING_FAILED
    elif by:
        text = texts.WORKING_STOPPED_BY.format(who=mention(by))
    else:
        text = texts.WORKING_STOPPED
    return Message(text=text, blocks=[_section(text)])


def stopped_by(*, by: str | None, turns: int, requests: int) -> Message:
    """A run a person stopped (Stop, or Slack's own stop button): who, and the footer."""
    footer = _footer(turns, requests)
    said = texts.STOPPED_BY.format(who=mention(by) if by else "someone")
    return Message(text=f"{said}\n\n{footer}", blocks=[_section(said), _context(footer)])


def limit_card(
    *,
    run_id: str,
    question: str,
    more: str,
    requester: str,
    deciders: Sequence[str],
    expires_at: datetime,
    required: int = 1,
    votes: Sequence[str] = (),
    self_approval: bool = True,
) -> Message:
    """A run waiting at a limit (`on_limit = "ask"`): Continue (one more allowance) or Stop.

    Continue is an approval like any other: `required` > 1 needs that many people (`votes` so far,
    shown), and without `self_approval` the requester may Stop, never Continue.
    """
    value = f"{run_id}:limit"
    if len(value) > BUTTON_VALUE_MAX:
        raise ValueError(f"button value of {len(value)} characters exceeds Slack's {BUTTON_VALUE_MAX}")
    who = ", ".join(mention(d) for d in deciders[:20]) or mention(requester)  # a group is named, never pinged
    head = f":raised_hand: {_esc(question, SECTION_MAX - 20)}"
    choice = texts.LIMIT_CHOICE.format(more=_esc(more, 200))
    rules = texts.LIMIT_RULES.format(requester=mention(requester), who=who, expires=slack_date(expires_at))
    if required > 1:
        so_far = ", ".join(mention(v) for v in votes[:20]) if votes else "nobody yet"
        rules += "\n" + texts.LIMIT_VOTES.format(count=len(votes), required=required, so_far=so_far)
    if not self_approval:
        rules += "\n" + texts.LIMIT_FOUR_EYES.format(requester=mention(requester))
    actions = ActionsBlock(
        block_id="limit",
        elements=[
            ButtonElement(text="Continue", action_id="continue", value=value, style="primary"),
            ButtonElement(text="Stop", action_id="stop", value=value, style="danger"),
        ],
    ).to_dict()
    return Message(
        text=_esc(question, TEXT_MAX), blocks=[_section(head), _section(choice), _context(rules), actions]
    )


def limit_decided(
    *,
    question: str,
    verdict: Verdict,
    by: str | None,
    at: datetime,
    more: str,
    approvers: Sequence[str] = (),
) -> Message:
    """The limit card once answered: no buttons, what was chosen, by whom (everyone who chose
    Continue, under a quorum) and when."""
    when = slack_date(at)
    if verdict is Verdict.APPROVED:
        who = ", ".join(mention(a) for a in approvers[:20]) if approvers else mention(by)
        outcome = texts.LIMIT_CONTINUED.format(who=who, when=when, more=_esc(more, 200))
    elif verdict is Verdict.EXPIRED:
        outcome = texts.LIMIT_EXPIRED.format(when=when)
    else:
        outcome = texts.LIMIT_STOPPED.format(who=mention(by) if by else "someone", when=when)
    head = f":raised_hand: {_esc(question, SECTION_MAX - 20)}"
    return Message(text=_with_tail(question, outcome, " — "), blocks=[_section(head), _section(outcome)])


def card_stopped(*, call: PendingCall, requester: str, by: str | None, at: datetime) -> Message:
    """An approval card of a parked run that was stopped: no buttons, the call was not run."""
    outcome = texts.CARD_STOPPED.format(who=mention(by) if by else "someone", when=slack_date(at))
    args = _arguments(call)

    def build(scale: float) -> list[dict[str, Any]]:
        blocks, _ = _what_will_run(call, args, "The agent asked to run", requester, scale, "")
        return [*blocks, _section(outcome)]

    return Message(text=_with_tail(f"{call.name}{_target_text(args)}", outcome, ": "), blocks=_fit(build))


__all__ = [
    "TARGET_WORDS",
    "Attachment",
    "HomeItem",
    "Message",
    "approval_card",
    "approver",
    "card_stopped",
    "arguments_modal",
    "blocks_size",
    "code",
    "cut",
    "decided_card",
    "decline_reason_modal",
    "escalation_reminder",
    "home_view",
    "edit_modal",
    "grant_notice",
    "escape",
    "failed",
    "feedback_buttons",
    "final_answer",
    "fully_reviewable",
    "is_target",
    "limit_card",
    "limit_decided",
    "mention",
    "notice",
    "retried_card",
    "slack_date",
    "stopped",
    "stopped_by",
    "turn_summary",
    "visible",
    "working",
    "working_closed",
]
