"""The model's Markdown as Slack mrkdwn: it reads as meant, and every escaping promise still holds."""

from __future__ import annotations

import re

from hypothesis import example, given
from hypothesis import strategies as st

from messages.cards import CallCard, approval_card
from messages.endings import final_answer
from messages.markdown import to_mrkdwn
from messages.text import escape, visible
from tests.messages.test_messages import AT, PAYLOADS, REQ, assert_inert, assert_valid, call


def mrkdwn(text: str) -> str:
    return to_mrkdwn(text, lambda t: escape(visible(t, answer=True)))


def test_emphasis_code_and_headings_become_mrkdwn() -> None:
    assert mrkdwn("**bold**, *it*, _it_, ~~gone~~ and `x < y`") == "*bold*, _it_, _it_, ~gone~ and `x &lt; y`"
    assert mrkdwn("# Plan for **today**\n\nText.") == "*Plan for today*\n\nText."
    assert mrkdwn("a `` ` `` b") == "a `ˋ` b"  # a backtick inside code cannot close it


def test_lists_nest_and_number_from_where_they_start() -> None:
    assert mrkdwn("- one\n- two\n  - inner\n- three") == "• one\n• two\n    ◦ inner\n• three"
    assert mrkdwn("3. c\n4. d") == "3. c\n4. d"
    assert mrkdwn("1. a\n\n   more\n\n2. b") == "1. a\n\n    more\n\n2. b"


def test_quotes_rules_and_code_blocks() -> None:
    assert mrkdwn("> said *this*\n> and that") == ">said _this_\n>and that"
    assert mrkdwn("- > quoted in a list\n- >") == "• │ quoted in a list\n\n• "  # no ">" past a line start
    assert mrkdwn("a\n\n---\n\nb") == "a\n\n───────────\n\nb"
    fenced = mrkdwn("```python\nif a < b: print('```')\n```")
    assert fenced == "```\nif a &lt; b: print('ˋˋˋ')\n```"  # a fence inside cannot close the block


def test_a_table_becomes_aligned_columns_in_a_code_block() -> None:
    table = mrkdwn("| Name | Qty |\n|---|--:|\n| apples | 3 |\n| `kiwi` & co | 12 |")
    # Aligned as the reader sees it: "&" is one character on screen, whatever its escaping.
    assert table == "```\nName      | Qty\n----------+----\napples    | 3\nkiwi &amp; co | 12\n```"


def test_a_link_shows_where_it_goes_and_never_becomes_link_markup() -> None:
    assert (
        mrkdwn("[the docs](https://example.com/a?b=1&c=2)") == "the docs (https://example.com/a?b=1&amp;c=2)"
    )
    assert (
        mrkdwn("[https://bank.example](https://evil.example)")
        == "https://bank.example (https://evil.example)"
    )
    assert mrkdwn("[https://x.io](https://x.io)") == "https://x.io"
    assert mrkdwn("![a chart](https://x.io/c.png)") == "a chart (https://x.io/c.png)"
    assert "<" not in mrkdwn("<https://evil.example|click> <script>x</script> <!here>")


def test_every_ping_and_link_payload_stays_inert_in_an_answer_and_a_card() -> None:
    for payload in PAYLOADS:
        for text in (payload, f"**{payload}**", f"[{payload}]({payload})", f"- {payload}", f"> {payload}"):
            assert_inert(assert_valid(final_answer(text, 1, 2)))
            card = approval_card(
                CallCard(
                    run_id="r",
                    call=call(),
                    requester=REQ,
                    tier_source="t",
                    approvers=[],
                    intent=text,
                    expires_at=AT,
                )
            )
            assert_inert(assert_valid(card))


markdownish = st.lists(
    st.one_of(
        st.sampled_from([*PAYLOADS, "**", "*", "_", "~~", "`", "[", "](", ")", "> ", "- ", "1. ", "|", "# "]),
        st.sampled_from(["\n", "\n\n", "| a | b |\n|---|---|\n| c | d |\n", "```\n", "  "]),
        st.text(max_size=15),
    ),
    min_size=1,
    max_size=25,
).map("".join)


@given(markdownish)
@example("\r0\n| a | b |\n|---|---|\n| c | d |\n<!channel>")  # found by Hypothesis: a lone \r before a table
def test_any_markdown_answer_is_valid_and_inert(text: str) -> None:
    msg = assert_valid(final_answer(text, 1, 2))
    assert_inert(msg)
    sections = [b["text"]["text"] for b in msg.blocks if b["type"] == "section"]
    assert all(not re.search(r"&(?!amp;|lt;|gt;)", s) for s in sections)  # no entity cut in two


def test_an_answer_with_a_run_carries_feedback_buttons_under_its_footer() -> None:
    msg = assert_valid(final_answer("**Done.**", 2, 3, run_id="run1"))
    *_, footer, feedback = msg.blocks
    assert footer["type"] == "context" and feedback["type"] == "context_actions"
    (buttons,) = feedback["elements"]
    assert buttons["type"] == "feedback_buttons" and buttons["action_id"] == "feedback"
    values = (buttons["positive_button"]["value"], buttons["negative_button"]["value"])
    assert values == ("good:run1", "bad:run1")
    assert final_answer("Done.", 2, 3).blocks[-1]["type"] == "context"  # none without a run
