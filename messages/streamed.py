"""The model's words as they stream into Slack (`workers.live`), every link's address in sight.

A stream's text is Markdown that Slack renders, so `[open the reviewed diff](https://evil.example)`
would show only its label as a link, where a posted answer (`messages.markdown`) shows
`open the reviewed diff (https://evil.example)`. `LinkShower` rewrites the pieces as they come the
way a posted answer reads: an inline link becomes its label and its address in parentheses, and
every other `[` is written `\\[`, so no reference link or link definition can hide an address
either. A `[` that may still open an inline link is held back until the link closes or cannot be
one any more (or `HOLD_MOST` characters wait behind it); what is held when the stream ends is
written as text, its `[` escaped.
"""

from __future__ import annotations

import re

HOLD_MOST = 2000  # characters held behind a `[` before it is let go as text

_TITLE = r"""(?:"[^"\n]*"|'[^'\n]*')"""
# An inline link as CommonMark writes its plain forms: [label](address) or [label](address "title").
# Anything fancier (nested brackets, parentheses in the address) is not matched: it shows as text.
_LINK = re.compile(rf"\[([^\[\]\n]*)\]\(([^()\s]*)(?:\s+{_TITLE})?\s*\)")
# What may still become such a link once more text comes.
_LINK_START = re.compile(r"""\[[^\[\]\n]*(?:\](?:\([^()\s]*(?:\s+(?:"[^"\n]*"?|'[^'\n]*'?)?\s*)?)?)?\Z""")


def shown_link(label: str, address: str) -> str:
    """A link as posted text shows it: its label, then its address in parentheses (unless the label
    is the address, or there is none)."""
    if not address or label == address:
        return label
    return f"{label} ({address})" if label else f"({address})"


class LinkShower:
    """Streamed Markdown rewritten piece by piece so that every link shows its address."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, piece: str, *, final: bool = False) -> str:
        """What of the text so far may be streamed now; `final`: the stream ends, nothing is held."""
        text, self._held = self._held + piece, ""
        out: list[str] = []
        at = 0
        while (start := text.find("[", at)) >= 0:
            out.append(text[at:start])
            link = _LINK.match(text, start)
            if link is not None:
                out.append(shown_link(link[1], link[2]))
                at = link.end()
                continue
            tail = text[start:]
            if not final and len(tail) <= HOLD_MOST and _LINK_START.match(tail):
                self._held = tail
                return "".join(out)
            out.append("\\[")
            at = start + 1
        out.append(text[at:])
        return "".join(out)
