"""Markdown as the model writes it, turned into Slack mrkdwn that reads as meant and stays inert.

The model writes CommonMark with GitHub's tables and strikethrough. Slack's mrkdwn shows `**`,
`[label](url)` and tables raw. `to_mrkdwn` parses the Markdown with markdown-it-py (raw HTML off:
it stays text) and writes mrkdwn: `*bold*`, `_italic_`, `~struck~`, `code` and ``` blocks,
headings as bold lines, lists with bullets or numbers, quotes with `>`, tables as aligned columns
in a code block.

Every piece of the model's text goes through `clean` (the caller's escaping: `&`, `<`, `>` become
entities, hidden characters become visible), so nothing the model wrote can become a mention, a
broadcast or a link markup. A Markdown link is written as its label followed by its address in
parentheses, as plain text: the reader always sees where a link goes (Slack links a bare address
itself), and a label can never pass for another address. The only mrkdwn syntax in the result is
the formatting written here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from markdown_it.token import Token

FENCE = "```"
FENCE_SAFE = "ˋˋˋ"  # modifier-letter grave accents: look like a fence, do not close one
TICK_SAFE = "ˋ"  # the same for the single backtick that would close `inline code`
BULLETS = ("•", "◦", "▪")
RULE = "───────────"
QUOTE_IN_LIST = "│ "
INDENT = "    "

_PARSER = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable(
    ["table", "strikethrough"]
)
# Inline markers, and the mrkdwn that opens and closes each.
_MARKS = {"strong": "*", "em": "_", "s": "~"}


@dataclass
class _Out:
    """The blocks written so far, and how many lists deep they sit."""

    clean: Callable[[str], str]
    depth: int = 0
    blocks: list[str] = field(default_factory=list)


def to_mrkdwn(markdown: str, clean: Callable[[str], str]) -> str:
    """`markdown` as Slack mrkdwn; `clean` makes a piece of untrusted text inert (it must escape)."""
    out = _Out(clean)
    _blocks(_PARSER.parse(markdown), out)
    return "\n\n".join(b for b in out.blocks if b.strip()).strip("\n")


def _blocks(tokens: Sequence[Token], out: _Out) -> None:
    i = 0
    while i < len(tokens):
        token = tokens[i]
        kind = token.type
        if kind == "inline":
            out.blocks.append(_inline(token.children or [], out.clean))
        elif kind == "heading_open":
            text = _inline(tokens[i + 1].children or [], out.clean, plain=True).strip()
            out.blocks.append(f"*{text}*" if text else "")
            i += 2  # the inline and the close
        elif kind in ("fence", "code_block"):
            body = token.content.rstrip("\n").replace(FENCE, FENCE_SAFE)
            out.blocks.append(f"{FENCE}\n{out.clean(body) or ' '}\n{FENCE}")
        elif kind == "hr":
            out.blocks.append(RULE)
        elif kind in ("bullet_list_open", "ordered_list_open"):
            end = _closing(tokens, i)
            out.blocks.append(_list(tokens[i : end + 1], out))
            i = end
        elif kind == "blockquote_open":
            end = _closing(tokens, i)
            inner = _Out(out.clean, out.depth)
            _blocks(tokens[i + 1 : end], inner)
            quoted = "\n\n".join(b for b in inner.blocks if b.strip())
            if quoted:  # mrkdwn quotes only a line that starts with ">": in a list, a bar stands in
                mark = ">" if out.depth == 0 else QUOTE_IN_LIST
                out.blocks.append("\n".join(mark + line for line in quoted.split("\n")))
            i = end
        elif kind == "table_open":
            end = _closing(tokens, i)
            out.blocks.append(_table(tokens[i + 1 : end], out.clean))
            i = end
        elif kind == "html_block":  # not produced with HTML off; shown as text if it ever is
            out.blocks.append(out.clean(token.content.rstrip("\n")))
        i += 1


def _closing(tokens: Sequence[Token], start: int) -> int:
    """The index of the token that closes the one opened at `start`."""
    depth = 0
    for j in range(start, len(tokens)):
        depth += tokens[j].nesting
        if depth == 0:
            return j
    return len(tokens) - 1


def _list(tokens: Sequence[Token], out: _Out) -> str:
    """A whole list (its open token first, its close last): a marker per item, its blocks indented."""
    opening = tokens[0]
    ordered = opening.type == "ordered_list_open"
    start = opening.attrGet("start")
    number = int(start) if isinstance(start, int | str) and str(start).isdigit() else 1
    tight = next((t.hidden for t in tokens if t.type == "paragraph_open"), True)
    sep = "\n" if tight else "\n\n"
    items: list[str] = []
    j = 1
    while j < len(tokens) - 1:
        if tokens[j].type != "list_item_open":
            j += 1
            continue
        end = _closing(tokens, j)
        inner = _Out(out.clean, out.depth + 1)
        _blocks(tokens[j + 1 : end], inner)
        body = sep.join(b for b in inner.blocks if b.strip())
        marker = f"{number + len(items)}." if ordered else BULLETS[out.depth % len(BULLETS)]
        first, *rest = body.split("\n") if body else [""]
        items.append("\n".join([f"{marker} {first}", *(INDENT + line if line else "" for line in rest)]))
        j = end + 1
    return sep.join(items)


def _inline(children: Sequence[Token], clean: Callable[[str], str], *, plain: bool = False) -> str:
    """Inline tokens as mrkdwn; `plain`: no emphasis or code markers (a heading, a table cell)."""
    line = _Line(clean, plain)
    for token in children:
        _inline_token(token, line)
    if line.link is not None:  # an unclosed link: keep what was collected
        line.parts = [*line.link, *line.parts]
    return "".join(line.parts)


@dataclass
class _Line:
    """Inline mrkdwn being written: its parts so far, and inside a link, the parts before it."""

    clean: Callable[[str], str]
    plain: bool
    parts: list[str] = field(default_factory=list)
    link: list[str] | None = None  # the parts before the link whose label `parts` collects
    href: str = ""


def _inline_token(token: Token, line: _Line) -> None:
    kind = token.type
    write = _INLINE.get(kind)
    if write is not None:
        write(token, line)
        return
    name, _, end = kind.rpartition("_")
    if end in ("open", "close") and name in _MARKS:  # emphasis: its mark opens and closes it
        line.parts.append("" if line.plain else _MARKS[name])


def _text(token: Token, line: _Line) -> None:
    line.parts.append(line.clean(token.content))


def _break(token: Token, line: _Line) -> None:
    line.parts.append("\n")


def _code(token: Token, line: _Line) -> None:
    body = token.content.replace("`", TICK_SAFE)
    line.parts.append(f"`{line.clean(body)}`" if body.strip() and not line.plain else line.clean(body))


def _link_open(token: Token, line: _Line) -> None:
    line.href = str(token.attrGet("href") or "")
    line.link, line.parts = line.parts, []


def _link_close(token: Token, line: _Line) -> None:
    if line.link is None:
        return
    label = "".join(line.parts)
    line.parts, line.link = line.link, None
    address = line.clean(line.href)
    line.parts.append(label if not line.href or label == address else f"{label} ({address})")


def _image(token: Token, line: _Line) -> None:
    alt = line.clean(token.content or "")
    src = line.clean(str(token.attrGet("src") or ""))
    line.parts.append(f"{alt} ({src})" if alt else src)


_INLINE: dict[str, Callable[[Token, _Line], None]] = {
    "text": _text,
    "softbreak": _break,
    "hardbreak": _break,
    "code_inline": _code,
    "link_open": _link_open,
    "link_close": _link_close,
    "image": _image,
    "html_inline": _text,
}


def _table(tokens: Sequence[Token], clean: Callable[[str], str]) -> str:
    """A table as aligned columns in a code block (mrkdwn has no tables)."""
    rows: list[list[str]] = []
    for token in tokens:
        if token.type == "tr_open":
            rows.append([])
        elif token.type == "inline" and rows:
            raw = _inline(token.children or [], lambda t: t, plain=True)
            rows[-1].append(" ".join(raw.split()).replace(FENCE, FENCE_SAFE))
    if not rows:
        return ""
    columns = max(len(r) for r in rows)
    rows = [r + [""] * (columns - len(r)) for r in rows]
    widths = [max(len(r[c]) for r in rows) for c in range(columns)]
    lines = [" | ".join(cell.ljust(widths[c]) for c, cell in enumerate(r)).rstrip() for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return f"{FENCE}\n{clean(chr(10).join(lines))}\n{FENCE}"


def shorten_tables(markdown: str, rows: int) -> tuple[str, int]:
    """`markdown` with every table cut to its header and first `rows` rows, a line after each cut
    one saying how many rows are not shown; and how many rows were left out in all."""
    # The parser's line numbers count lines as it splits them: a lone \r ends a line there too.
    markdown = markdown.replace("\r\n", "\n").replace("\r", "\n")
    lines = markdown.split("\n")
    cuts: list[tuple[int, int, int]] = []  # (first line left out, end of the table, rows left out)
    for token in _PARSER.parse(markdown):
        if token.type == "table_open" and token.map is not None and token.level == 0:
            start, end = token.map[0], min(token.map[1], len(lines))
            body = [i for i in range(start + 2, end) if lines[i].strip()]  # past the header and |---|
            if len(body) > rows:
                cuts.append((body[rows], end, len(body) - rows))
    left_out = 0
    for first, end, hidden in reversed(cuts):
        lines[first:end] = ["", f"_… and {hidden} more rows: the whole table is in the file below._"]
        left_out += hidden
    return "\n".join(lines), left_out
