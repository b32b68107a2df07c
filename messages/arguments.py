"""A call's arguments as a reviewer reads them: in an order of ours, each whole or saying what is cut.

An approval card shows each top-level argument on its own, in an order that does not depend on
the model's: first the arguments that name what the call acts on (`TARGET_WORDS`: a path, a URL,
a recipient, a command …), shortest first, then the others, shortest first. A target is shown
whole whenever it fits on the card. Whatever is cut says exactly how many characters are not
shown, and the card then offers "View all arguments" (`messages.modals.arguments_modal`), which
shows every character unless even a modal cannot hold them (`fully_reviewable`), which the card
then says.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.state import PendingCall
from messages.limits import MODAL_BLOCKS_MAX, SECTION_MAX
from messages.markdown import FENCE, FENCE_SAFE
from messages.text import ELLIPSIS, code_span, escape, plural, prefix_len, shown_len, units, visible_as

INLINE_MAX = 200  # a one-line value up to this long sits on its argument's line in `code`
MODAL_NAME_MAX = 2000

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

_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

_Segment = tuple[bool, str]  # (is the body of a ``` block, text): the unit `pack` lays out
_CONTINUES = "_(continues below, with no line break here)_"
_ENTRY_OVERHEAD = 70  # per argument: bullet, labels, its size, a "not shown" note (roughly)
_MIN_SHOWN = 60  # a value is given at least this much room, or listed among those not shown
_MIN_CODE_PIECE = 200  # a ``` block is not started in less room than this (one is closed early)
MODAL_SECTIONS = MODAL_BLOCKS_MAX - 2  # leaves room for the opening line and a warning


def is_target(name: str) -> bool:
    """Whether an argument called `name` names what the call acts on (see `TARGET_WORDS`)."""
    joined = re.sub(r"[^a-z0-9]", "", name.lower())
    return joined in TARGET_WORDS or any(word.lower() in TARGET_WORDS for word in _WORDS.findall(name))


@dataclass(frozen=True)
class Arg:
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
        return shown_len(self.text)

    @functools.cached_property
    def name_need(self) -> int:
        """Escaped characters its name takes when shown whole."""
        return shown_len(self.name, "inline")


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def arguments_of(call: PendingCall) -> list[Arg]:
    """The call's arguments, targets first, each group shortest first: never the model's order."""
    items = call.input.items() if isinstance(call.input, dict) else [("input", call.input)]
    args = [
        Arg(str(k), v if isinstance(v, str) else _compact(v), isinstance(v, str), is_target(str(k)))
        for k, v in items
    ]
    return sorted(args, key=lambda a: (not a.target, len(a.text), a.name))


def args_json(call: PendingCall) -> str:
    """The input as JSON, its keys in the card's order (targets first) rather than the model's."""
    if not isinstance(call.input, dict):
        return json.dumps(call.input, ensure_ascii=False, default=str)
    ordered = {a.name: call.input[a.name] for a in arguments_of(call)}
    return json.dumps(ordered, ensure_ascii=False, default=str)


@dataclass(frozen=True)
class Shown:
    """Arguments laid out for a card or the modal, and how many of their characters are not shown."""

    segments: tuple[_Segment, ...]
    hidden: int


def _entry(arg: Arg, room: int, name_max: int, hint: str) -> tuple[list[_Segment], int]:
    """One argument: its name, then its value in at most `room` characters; and what is not shown."""
    n_name = prefix_len(arg.name, name_max, "inline")
    name = code_span(arg.name[:n_name] + (ELLIPSIS if n_name < len(arg.name) else ""))
    label = (" _(target)_" if arg.target else "") + ("" if arg.is_text else " _(JSON)_")
    name_cut = len(arg.name) - n_name
    notes: list[_Segment] = []
    if name_cut:
        notes.append((False, f"_↳ name cut: {plural(name_cut, 'more character')} not shown{hint}_"))
    if arg.is_text and not arg.text:
        return [(False, f"• {name}{label}: _(empty)_"), *notes], name_cut
    n = prefix_len(arg.text, room)
    cut_chars = len(arg.text) - n
    one_line = (
        len(arg.text) <= INLINE_MAX and "\n" not in arg.text and shown_len(arg.text, "inline") <= INLINE_MAX
    )
    if not cut_chars and one_line:
        return [(False, f"• {name}{label}: {code_span(arg.text)}"), *notes], name_cut
    lines: list[_Segment] = [(False, f"• {name}{label} — {plural(len(arg.text), 'character')}:")]
    if n:
        lines.append((True, escape(visible_as(arg.text[:n]).replace(FENCE, FENCE_SAFE))))
    if cut_chars:
        lines.append((False, f"_↳ {plural(cut_chars, 'more character')} not shown{hint}_"))
    return [*lines, *notes], name_cut + cut_chars


def present(args: Sequence[Arg], budget: int, *, name_max: int, hint: str) -> Shown:
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
            not_shown = f"{plural(len(rest), 'more argument')} not shown ({plural(chars, 'character')})"
            segments.append((False, f"_…and {not_shown}{hint}_"))
            return Shown(tuple(segments), hidden + chars)
        entry, cut_chars = _entry(arg, room, name_max, hint)
        segments += entry
        hidden += cut_chars
        left -= over + room
    return Shown(tuple(segments), hidden)


def _split(body: str, room: int) -> tuple[int, bool]:
    """Where to end the piece of a ``` block body that fits `room`; True if it ends mid-line."""
    if units(body) <= room:
        return len(body), False
    n = min(len(body), room)
    while (excess := units(body[:n]) - room) > 0:
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


def pack(segments: Iterable[_Segment]) -> list[str]:
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
        size += units(text) + (1 if lines else 0)
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
            if size + 1 + units(text) > SECTION_MAX:
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


def modal_layout(args: Sequence[Arg]) -> tuple[list[str], Shown]:
    """The modal's argument sections: everything, or as much as 98 sections hold."""
    budget = MODAL_SECTIONS * SECTION_MAX
    while True:
        shown = present(args, budget, name_max=MODAL_NAME_MAX, hint="")
        packed = pack(shown.segments)
        if len(packed) <= MODAL_SECTIONS or budget <= 0:
            return packed, shown
        budget = int(budget * MODAL_SECTIONS / len(packed) * 0.97)


def fully_reviewable(call: PendingCall) -> bool:
    """Whether "View all arguments" can show every character of the call's input.

    When it cannot, nobody can review the call in Slack, and it must not be approved there.
    """
    return args_reviewable(arguments_of(call))


def args_reviewable(args: Sequence[Arg]) -> bool:
    """`fully_reviewable` of arguments already laid out by `arguments_of`."""
    if sum(a.need + a.name_need for a in args) > MODAL_SECTIONS * SECTION_MAX:
        return False  # more than the sections could hold even if every one were full
    return modal_layout(args)[1].hidden == 0
