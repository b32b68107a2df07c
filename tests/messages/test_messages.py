"""messages: every message fits Slack's limits and no untrusted text can ping or link."""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slack_sdk.models.blocks import Block

from harness.policy import Tier
from harness.state import Decision, PendingCall, Verdict, fingerprint
from harness.tools import ToolResult
from messages.blocks import Message, notice
from messages.cards import CallCard, approval_card, decided_card
from messages.endings import failed, final_answer, retried_card, stopped
from messages.modals import decline_reason_modal
from messages.text import code, cut, escape, mention
from messages.turns import turn_summary
from tests.fakes.slack_api import MAX_BLOCKS_JSON_CHARS, validate_blocks

REQ, APP = "U0REQ", "U0APP"
AT = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
FOOTER = "That took 3 turns of tool calls across 7 model requests."
HUGE = "x<!channel>&" * 10_000  # 120k characters

# Our own markup: the only `<…>` allowed to survive in a rendered message.
TRUSTED = re.compile(rf"<@(?:{REQ}|{APP})>|<!date\^\d+\^\{{date_short_pretty\}} at \{{time\}}\|[0-9: -]+UTC>")

# The one `>` we write ourselves: a quote at the start of a line (Markdown quotes, the model's words).
QUOTE = re.compile(r"^>+", re.MULTILINE)

PAYLOADS = [
    "<!channel>",
    "<!here>",
    "<!everyone>",
    "<@U123>",
    "<!subteam^S1|x>",
    "<#C1>",
    "<https://evil.example|click>",
    "```",
    "&",
    "&lt;",
    "\n",
    '"',
    "\\",
]
untrusted = st.lists(st.one_of(st.sampled_from(PAYLOADS), st.text(max_size=20)), min_size=1, max_size=12).map(
    "".join
)


def call(
    name: str = "write_file",
    args: dict[str, Any] | None = None,
    *,
    tier: Tier = Tier.ASK,
    decision: Decision | None = None,
    result: ToolResult | None = None,
    call_id: str = "toolu_x",
) -> PendingCall:
    args = {"path": "notes.txt", "content": "hello"} if args is None else args
    return PendingCall(call_id, name, args, tier, decision, result)


def strings(obj: Any) -> list[str]:
    """Every string anywhere in a nested dict/list."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for key, value in obj.items() for s in (key, *strings(value))]
    if isinstance(obj, list):
        return [s for item in obj for s in strings(item)]
    return []


def assert_valid(msg: Message) -> Message:
    """The message is one Slack would accept."""
    assert isinstance(msg.text, str) and 0 < len(msg.text) <= 3000
    assert validate_blocks(msg.blocks) == []
    assert 0 < len(msg.blocks) <= 50
    assert len(json.dumps(msg.blocks, ensure_ascii=False)) <= 12_000
    assert len(json.dumps(msg.blocks)) <= MAX_BLOCKS_JSON_CHARS  # as slack_sdk sends it: \uXXXX
    for block in msg.blocks:
        assert Block.parse(copy.deepcopy(block)) is not None
        if block["type"] == "section":
            assert 0 < len(block["text"]["text"]) <= 3000
        if block["type"] == "context":
            assert len(block["elements"]) <= 10
            assert all(0 < len(e["text"]) <= 2000 for e in block["elements"])
    return msg


def assert_inert(msg: Message | dict[str, Any]) -> None:
    """Apart from our own mentions and dates, no `<` or `>` survives anywhere."""
    everything = [msg.text, *strings(msg.blocks)] if isinstance(msg, Message) else strings(msg)
    for s in everything:
        rest = QUOTE.sub("", TRUSTED.sub("", s))
        assert "<" not in rest and ">" not in rest, s
        for token in ("<!", "<@", "<#", "<http"):
            assert s.count(token) == sum(m.group().startswith(token) for m in TRUSTED.finditer(s)), s


def actions(msg: Message) -> list[dict[str, Any]]:
    return [b for b in msg.blocks if b["type"] == "actions"]


def all_text(msg: Message) -> str:
    return "\n".join([msg.text, *strings(msg.blocks)])


def every_message(s: str) -> list[Message]:
    """Each builder, fed `s` wherever untrusted text goes."""
    done = Decision(Verdict.APPROVED, by=APP)
    calls = [
        call(s, {"q": s}, tier=Tier.ALLOW, result=ToolResult(s)),
        call(s, {s: [s]}, tier=Tier.ALLOW, result=ToolResult(s, is_error=True)),
        call("write_file", {"c": s}, decision=done, result=ToolResult(s)),
        call(s, {"c": s}, decision=Decision(Verdict.DECLINED, by=APP, reason=s)),
        call(s, {"c": s}, decision=Decision(Verdict.EXPIRED)),
        call(s, {"c": s}, tier=Tier.DENY, result=ToolResult(s, is_error=True)),
    ]
    card = {"call": call(s, {"content": s}), "requester": REQ}
    return [
        turn_summary(2, calls, 1234, 40_000),
        approval_card(CallCard(run_id="run", tier_source=s, approvers=[APP, REQ], expires_at=AT, **card)),
        *(
            decided_card(verdict=v, by=APP, at=AT, reason=s, **card)
            for v in (Verdict.APPROVED, Verdict.DECLINED, Verdict.EXPIRED)
        ),
        final_answer(s, 3, 7),
        stopped(s, 3, 7),
        failed(run_id="run", error=s),
        retried_card(error=s, by=APP, at=AT),
        notice(s),
    ]


# --- primitives -----------------------------------------------------------------------------------


def test_escape_makes_every_mention_and_link_inert() -> None:
    assert escape("<!channel> & <@U1> <https://e.x|y>") == (
        "&lt;!channel&gt; &amp; &lt;@U1&gt; &lt;https://e.x|y&gt;"
    )
    assert escape("&lt;") == "&amp;lt;"


@pytest.mark.parametrize("limit", [1, 2, 5, 17, 300])
def test_cut_fits_once_escaped(limit: int) -> None:
    text = "a<b>&c" * 100
    out = cut(text, limit)
    assert len(escape(out)) <= limit
    assert out.endswith("…")
    assert cut("short", 10) == "short"
    assert cut("<<<<", 16) == "<<<<"
    assert cut("😀" * 10, 7) == "😀😀😀…"  # emoji count as two UTF-16 units


def test_code_is_fence_safe_and_bounded() -> None:
    out = code("a ``` <!here> " * 1000, 500)
    assert len(out) <= 500
    assert out.startswith("```\n") and out.endswith("\n```")
    assert out.count("```") == 2
    assert "&lt;!here&gt;" in out


def test_mention_only_for_ids_of_the_right_shape() -> None:
    assert mention("U0REQ") == "<@U0REQ>"
    assert mention("W12AB") == "<@W12AB>"
    for bad in ("<!channel>", "u123", "U1|x", "C123", "U1> <!here"):
        assert "<" not in mention(bad)


# --- limits with huge inputs ----------------------------------------------------------------------


def test_turn_summary_with_fifty_huge_calls_fits() -> None:
    calls = [
        call("read_file", {"path": HUGE[:10_000]}, tier=Tier.ALLOW, call_id=f"t{i}", result=ToolResult(HUGE))
        for i in range(50)
    ]
    msg = assert_valid(turn_summary(9, calls, 123_456, 400_000))
    assert re.search(r"…and \d+ more calls", all_text(msg))
    assert msg.blocks[-1]["elements"][0]["text"] == "123,456 / 400,000 tokens used"
    assert_inert(msg)


def test_turn_summary_with_json_heavy_results_fits() -> None:
    nasty = '"\\\n' * 50_000
    calls = [
        call("x", {nasty[:3000]: nasty[:10_000]}, call_id=f"t{i}", result=ToolResult(nasty))
        for i in range(50)
    ]
    assert_valid(turn_summary(1, calls, 1, 2))


def test_turn_summary_lines() -> None:
    calls = [
        call("read_file", {"path": "README.md"}, tier=Tier.ALLOW, result=ToolResult("# My project\nmore")),
        call("read_file", {"path": "nope"}, tier=Tier.ALLOW, result=ToolResult("Error: no such file", True)),
        call(decision=Decision(Verdict.DECLINED, by=APP, reason="not now"), result=ToolResult("n", True)),
        call(decision=Decision(Verdict.EXPIRED), result=ToolResult("n", True)),
        call("send_email", tier=Tier.DENY, result=ToolResult("n", True)),
    ]
    msg = assert_valid(turn_summary(1, calls, 1234, 40_000))
    body = msg.blocks[0]["text"]["text"]
    lines = body.split("\n")
    assert lines[0] == "*Turn 1*"
    assert '{"path": "README.md"}' in lines[1] and '"# My project more"' in lines[1]
    assert "✗" in lines[2] and "no such file" in lines[2]
    assert "declined" in lines[3] and f"<@{APP}>" in lines[3] and "not now" in lines[3]
    assert "expired" in lines[4] and "declined" not in lines[4]
    assert "denied" in lines[5]
    assert msg.blocks[-1] == {
        "type": "context",
        "elements": [{"type": "mrkdwn", "text": "1,234 / 40,000 tokens used"}],
    }
    assert "1,234 / 40,000 tokens used" in msg.text
    assert "more call" not in body


def test_turn_summary_without_calls() -> None:
    assert_valid(turn_summary(1, [], 0, 10))


def test_approval_and_decided_cards_with_huge_arguments_fit() -> None:
    big = call(HUGE[:300], {"content": HUGE[:10_000], "nested": {"k": ['"\\'] * 3000}})
    card = {"call": big, "requester": REQ}
    assert_valid(
        approval_card(
            CallCard(
                run_id="r" * 100,
                tier_source=HUGE,
                approvers=[f"U{i:05d}" for i in range(500)],
                expires_at=AT,
                **card,
            )
        )
    )
    for verdict in Verdict:
        assert_valid(decided_card(verdict=verdict, by=APP, at=AT, reason=HUGE, **card))


@pytest.mark.parametrize(
    "answer", [HUGE, "```\n" + "a<b & c\n" * 20_000, '"\\' * 100_000, "😀" * 100_000, ""]
)
def test_final_answer_with_huge_answers_fits(answer: str) -> None:
    msg = assert_valid(final_answer(answer, 3, 7))
    assert msg.text.endswith(FOOTER)
    assert msg.blocks[-1]["elements"][0]["text"] == FOOTER
    assert_inert(msg)


def test_endings_with_huge_inputs_fit() -> None:
    for msg in (
        stopped(HUGE, 3, 7),
        failed(run_id="run", error=HUGE),
        retried_card(error=HUGE, by=APP, at=AT),
        notice(HUGE),
    ):
        assert_valid(msg)
        assert_inert(msg)


# --- untrusted text never pings -------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(untrusted)
def test_untrusted_text_can_never_ping_or_link(s: str) -> None:
    for msg in every_message(s):
        assert_valid(msg)
        assert_inert(msg)
    assert_inert(decline_reason_modal(run_id="run", call=call(s)))


@settings(max_examples=30, deadline=None)
@given(untrusted)
def test_untrusted_requester_ids_are_not_mentions(s: str) -> None:
    msg = approval_card(
        CallCard(
            run_id="run", call=call(), requester="<@U1>" + s, tier_source="t", approvers=[s], expires_at=AT
        )
    )
    assert_valid(msg)
    assert_inert(msg)


# --- approvals ------------------------------------------------------------------------------------


def make_card(approvers: list[str]) -> Message:
    return approval_card(
        CallCard(
            run_id="run",
            call=call(),
            requester=REQ,
            tier_source="policy.tools.write_file",
            approvers=approvers,
            expires_at=AT,
        )
    )


def test_approval_card_buttons() -> None:
    msg = assert_valid(make_card([APP]))
    (block,) = actions(msg)
    assert block["block_id"] == "approval"
    buttons = {e["action_id"]: e for e in block["elements"]}
    assert set(buttons) == {"approve", "decline", "edit", "decline_with_reason"}
    fp = fingerprint("write_file", {"path": "notes.txt", "content": "hello"})
    assert {e["value"] for e in buttons.values()} == {f"run:toolu_x:{fp}"}
    assert buttons["approve"]["style"] == "primary" and buttons["approve"]["text"]["text"] == "Approve"
    assert buttons["decline"]["style"] == "danger" and buttons["decline"]["text"]["text"] == "Decline"
    assert buttons["decline_with_reason"]["text"]["text"] == "Decline with reason…"


def test_approval_card_says_what_who_why_and_when() -> None:
    msg = make_card([APP, "U0TWO"])
    text = all_text(msg)
    assert "`write_file`" in text
    assert "• `path` _(target)_: `notes.txt`" in text and "• `content`: `hello`" in text
    assert "write_file on notes.txt" in make_card([]).text
    assert f"<@{REQ}>" in text
    assert "*Why it needs approval:* the setting for `write_file` in the policy" in text
    assert "policy.tools" not in text  # the config's own words stay in --list-tools and the audit
    assert f"only <@{APP}>, <@U0TWO>" in text
    unix = int(AT.timestamp())
    assert f"<!date^{unix}^{{date_short_pretty}} at {{time}}|2025-03-04 05:06 UTC>" in text
    assert f"only <@{REQ}>" in all_text(make_card([]))


def test_button_value_too_long_is_refused() -> None:
    with pytest.raises(ValueError):
        approval_card(
            CallCard(
                run_id="r" * 2000, call=call(), requester=REQ, tier_source="t", approvers=[], expires_at=AT
            )
        )


def test_decided_cards() -> None:
    card = {"call": call(), "requester": REQ, "at": AT}
    approved = assert_valid(decided_card(verdict=Verdict.APPROVED, by=APP, **card))
    declined = assert_valid(decided_card(verdict=Verdict.DECLINED, by=APP, reason="<!here> no", **card))
    expired = assert_valid(decided_card(verdict=Verdict.EXPIRED, by=None, **card))
    for msg in (approved, declined, expired):
        assert actions(msg) == []
        assert "`write_file`" in all_text(msg)
        assert_inert(msg)
    assert f"✅ Approved by <@{APP}> at <!date^" in all_text(approved)
    assert f"❌ Declined by <@{APP}> at <!date^" in all_text(declined)
    assert "reason: &lt;!here&gt; no" in all_text(declined)
    assert "⌛ Expired at <!date^" in all_text(expired)
    assert "nobody decided in time; the call was not run" in all_text(expired)
    assert "declined" not in all_text(expired).lower()


def test_decline_reason_modal() -> None:
    view = decline_reason_modal(run_id="run", call=call())
    assert view["type"] == "modal"
    assert view["callback_id"] == "decline_reason"
    assert view["private_metadata"] == f"run:toolu_x:{call().fingerprint}"
    assert view["title"]["text"] == "Decline"
    assert view["submit"]["text"] == "Decline"
    assert view["close"]["text"] == "Cancel"
    assert validate_blocks(view["blocks"]) == []
    context, field = view["blocks"]
    assert context["type"] == "context" and "write_file" in context["elements"][0]["text"]
    assert field["type"] == "input" and field["block_id"] == "reason"
    assert field["label"]["text"] == "Why? (the model will read this)"
    assert field["element"] == {
        "type": "plain_text_input",
        "action_id": "reason",
        "multiline": True,
        "max_length": 500,
    }


# --- endings --------------------------------------------------------------------------------------


def test_final_answer_footer_is_exact() -> None:
    msg = assert_valid(final_answer("The time is <!here> 12:00.", 3, 7))
    assert msg.blocks[-1] == {"type": "context", "elements": [{"type": "mrkdwn", "text": FOOTER}]}
    assert msg.text.endswith(FOOTER)
    assert msg.blocks[0]["text"]["text"] == "The time is &lt;!here&gt; 12:00."


def test_long_answer_is_split_with_balanced_fences() -> None:
    answer = "intro\n```\n" + "line <x>\n" * 2000 + "```\noutro " + "word " * 3000
    msg = assert_valid(final_answer(answer, 1, 2))
    sections = [b["text"]["text"] for b in msg.blocks if b["type"] == "section"]
    assert len(sections) > 2
    assert all(s.count("```") % 2 == 0 for s in sections)
    assert all("&lt;" in s or "word" in s for s in sections[1:])
    assert sections[-1].endswith("…\n```")


def test_stopped_failed_retried_notice() -> None:
    stop = assert_valid(stopped("Stopped at max turns: <!channel>", 3, 7))
    assert stop.blocks[0]["text"]["text"] == ":octagonal_sign: Stopped at max turns: &lt;!channel&gt;"
    assert stop.blocks[-1]["elements"][0]["text"] == FOOTER and stop.text.endswith(FOOTER)

    fail = assert_valid(failed(run_id="run", error="overloaded <@U9>"))
    (block,) = actions(fail)
    assert block["block_id"] == "failure"
    (button,) = block["elements"]
    assert (button["action_id"], button["text"]["text"], button["value"]) == ("retry", "Retry", "run")
    assert "The run failed: overloaded &lt;@U9&gt;" in all_text(fail)

    retried = assert_valid(retried_card(error="overloaded", by=APP, at=AT))
    assert actions(retried) == []
    assert f"Retried by <@{APP}>" in all_text(retried)

    note = assert_valid(notice("Only <@U1> & co"))
    assert note.text == "Only &lt;@U1&gt; &amp; co"
    assert note.blocks == [{"type": "section", "text": {"type": "mrkdwn", "text": note.text}}]


def test_a_long_table_shows_its_first_rows_and_comes_whole_in_a_file_named_by_its_heading() -> None:
    """Seen: a `report` answer put 226 table rows in the thread, then a file named by a hash."""
    rows = "".join(f"| region {n} | {n * 7} |\n" for n in range(226))
    answer = f"# Q3 sales, by region\n\n| region | sales |\n|---|---|\n{rows}\nThe north grew most."
    msg = final_answer(answer, 1, 2)
    shown = str(msg.blocks)
    assert "region 9 " in shown and "region 10 " not in shown  # ten rows, in the thread
    assert "216 more rows: the whole table is in the file below" in shown
    assert "The north grew most." in shown  # what follows the table is still said
    assert msg.attachment is not None and msg.attachment.filename == "q3-sales-by-region.md"
    assert "| region 225 | 1575 |" in msg.attachment.content  # the whole, as written


def test_a_short_table_is_shown_whole_and_needs_no_file() -> None:
    rows = "".join(f"| {n} | x |\n" for n in range(10))
    msg = final_answer(f"| n | v |\n|---|---|\n{rows}", 0, 1)
    assert "9 | x" in str(msg.blocks) and "more rows" not in str(msg.blocks) and msg.attachment is None
