"""Streamed words show every link's address as a posted answer does (issue 30, item 5a)."""

from __future__ import annotations

import pytest

from messages.markdown import to_mrkdwn
from messages.streamed import HOLD_MOST, LinkShower
from messages.text import escape


def streamed(*pieces: str) -> str:
    """What a stream shows once `pieces` came and it stopped."""
    links = LinkShower()
    return "".join(links.feed(p) for p in pieces) + links.feed("", final=True)


LINK = "Read [open the reviewed diff](https://evil.example) first."
SHOWN = "Read open the reviewed diff (https://evil.example) first."


def test_an_inline_link_shows_its_label_then_its_address_like_a_posted_answer() -> None:
    assert streamed(LINK) == SHOWN
    assert to_mrkdwn(LINK, escape) == SHOWN  # the posted form, the same words


@pytest.mark.parametrize("cut", range(1, len(LINK)))
def test_a_link_split_anywhere_between_pieces_shows_the_same(cut: int) -> None:
    assert streamed(LINK[:cut], LINK[cut:]) == SHOWN


def test_a_link_arriving_a_character_at_a_time_is_held_until_it_closes() -> None:
    links = LinkShower()
    out = [links.feed(ch) for ch in "[go](https://evil.example)"]
    assert out[:-1] == [""] * (len(out) - 1) and out[-1] == "go (https://evil.example)"


@pytest.mark.parametrize(
    ("markdown", "shown"),
    [
        ('[t](https://t.example "a title")', "t (https://t.example)"),
        ("[https://a.example](https://a.example)", "https://a.example"),
        ("[x][r]\n\n[r]: https://hidden.example", "\\[x]\\[r]\n\n\\[r]: https://hidden.example"),
        (
            "[shortcut]\n\n[shortcut]: https://hidden.example",
            "\\[shortcut]\n\n\\[shortcut]: https://hidden.example",
        ),
        ("[a [b](https://b.example)", "\\[a b (https://b.example)"),
        ("[p](https://p.example/(x))", "\\[p](https://p.example/(x))"),
        ("a [note] here", "a \\[note] here"),
    ],
)
def test_no_other_bracket_can_hide_an_address(markdown: str, shown: str) -> None:
    assert streamed(markdown) == shown


def test_a_link_still_open_when_the_stream_stops_is_shown_as_text() -> None:
    assert streamed("see [the diff](https://evil.exa") == "see \\[the diff](https://evil.exa"


def test_a_bracket_that_never_closes_is_let_go_past_the_hold() -> None:
    links = LinkShower()
    assert links.feed("[" + "x" * (HOLD_MOST - 1)) == ""
    assert links.feed("x") == "\\[" + "x" * HOLD_MOST
