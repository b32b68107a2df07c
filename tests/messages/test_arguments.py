"""messages.arguments, issue #8: nothing hidden from the approver.

The card shows every top-level argument on its own, the target first and whole, says exactly how
much of anything is cut, and offers "View all arguments" (a modal that shows every character)
whenever something is cut. Invisible and direction-changing characters are shown as `[U+XXXX]`.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import unicodedata
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slack_sdk import WebClient
from slack_sdk.models.views import View

from bot import edits
from harness.config import Config
from harness.policy import Tier
from harness.state import Decision, PendingCall, Verdict
from harness.tools import ToolResult
from messages.arguments import fully_reviewable, is_target
from messages.blocks import Message, blocks_size, notice
from messages.cards import CallCard, approval_card, decided_card
from messages.endings import failed, final_answer, stopped
from messages.limits import BLOCKS_JSON_MAX
from messages.modals import arguments_modal, edit_modal
from messages.text import escape, visible
from messages.turns import turn_summary
from store import CallTool
from tests.fakes.slack_api import MAX_BLOCKS_JSON_CHARS, MAX_BLOCKS_PER_VIEW, FakeSlackAPI, validate_blocks
from tests.messages.test_messages import strings
from tests.stack import ROOT

REQ, APP = "U0REQ", "U0APP"
AT = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
NOTES = "Meeting notes: all fine, nothing to see here. " * 74  # 3,404 harmless characters
TRUSTED = re.compile(rf"<@(?:{REQ}|{APP})>|<!date\^\d+\^\{{date_short_pretty\}} at \{{time\}}\|[0-9: -]+UTC>")

# The characters issue #8 names, and a few more of category Cf.
BIDI = [*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x061C, 0x200E, 0x200F]
ZERO_WIDTH = [0x200B, 0x200C, 0x200D, 0xFEFF, *range(0x2060, 0x2065)]
OTHER_CF = [0x00AD, 0x180E, 0x206A, 0xFFF9, 0xE0001, 0xE0041]
UNSEEN = [chr(cp) for cp in (*BIDI, *ZERO_WIDTH, *OTHER_CF)]


def pending(
    args: dict[str, Any],
    name: str = "write_file",
    *,
    call_id: str = "toolu_x",
    tier: Tier = Tier.ASK,
    decision: Decision | None = None,
    result: ToolResult | None = None,
) -> PendingCall:
    return PendingCall(call_id, name, args, tier, decision, result)


def card(call: PendingCall, run_id: str = "run") -> Message:
    return approval_card(
        CallCard(
            run_id=run_id,
            call=call,
            requester=REQ,
            tier_source='policy.tools.write_file = "ask"',
            approvers=[APP],
            expires_at=AT,
        )
    )


def decided(call: PendingCall, verdict: Verdict = Verdict.APPROVED) -> Message:
    return decided_card(call=call, requester=REQ, verdict=verdict, by=APP, at=AT, reason="why")


def sections(blocks: list[dict[str, Any]]) -> list[str]:
    return [b["text"]["text"] for b in blocks if b["type"] == "section"]


def buttons(msg: Message) -> list[dict[str, Any]]:
    return [e for b in msg.blocks if b["type"] == "actions" for e in b["elements"]]


def assert_slack_accepts(msg: Message, *, kept: str = "") -> None:
    """What Slack (and our loopback stand-in of it) would accept, measured as slack_sdk sends it.

    No invisible character but those in `kept` survives anywhere.
    """
    assert 0 < len(msg.text) <= 3000
    assert validate_blocks(msg.blocks) == []
    assert 0 < len(msg.blocks) <= 50
    assert blocks_size(msg.blocks) <= BLOCKS_JSON_MAX
    assert len(json.dumps(msg.blocks)) <= MAX_BLOCKS_JSON_CHARS  # the wire form: non-ASCII as \uXXXX
    assert_inert([msg.text, *strings(msg.blocks)], kept=kept)


def assert_modal_ok(view: dict[str, Any]) -> None:
    assert view["type"] == "modal" and view["callback_id"] == "view_args"
    assert "submit" not in view and view["close"]["type"] == "plain_text"
    assert 0 < len(view["title"]["text"]) <= 24 and 0 < len(view["close"]["text"]) <= 24
    assert validate_blocks(view["blocks"], max_blocks=MAX_BLOCKS_PER_VIEW) == []
    assert 0 < len(view["blocks"]) <= MAX_BLOCKS_PER_VIEW
    assert all(0 < len(s) <= 3000 for s in sections(view["blocks"]))
    View(**copy.deepcopy(view)).to_dict()  # slack_sdk's own validation of a view
    assert_inert(strings(view))


def assert_inert(texts: list[str], *, kept: str = "") -> None:
    for s in texts:
        rest = "".join(ch for ch in TRUSTED.sub("", s) if ch not in kept)
        assert "<" not in rest and ">" not in rest, s
        if rest.isascii():
            continue  # (every character checked below is outside ASCII)
        assert not any(ch in rest for ch in UNSEEN), ascii(s)
        assert not any(unicodedata.category(ch) in ("Cf", "Cs") for ch in rest), ascii(s)


# --- reading back what the card shows ---------------------------------------------------------------

ENTRY = re.compile(
    r"• `(?P<name>[^`]*)`(?P<target> _\(target\)_)?(?P<json> _\(JSON\)_)?"
    r"(?:: `(?P<inline>[^`]*)`|: (?P<empty>_\(empty\)_)| — (?P<size>[\d,]+) characters?:)$"
)
CUT = re.compile(r"_↳ (?P<n>[\d,]+) more characters? not shown")
CONTINUES = "_(continues below, with no line break here)_"


@dataclass
class Shown:
    """One argument as displayed: its (escaped) name and value, and what the card says is cut."""

    target: bool
    json: bool
    value: str = ""
    pieces: list[tuple[str, bool]] = field(default_factory=list)  # (code block body, continues)
    not_shown: int = 0


def read_arguments(texts: list[str]) -> tuple[list[str], dict[str, Shown]]:
    """The argument entries shown in these section texts, in order, with their values rebuilt."""
    order: list[str] = []
    shown: dict[str, Shown] = {}
    last: Shown | None = None
    for text in texts:
        pos = 0
        while pos < len(text):
            if text.startswith("```\n", pos):
                end = text.index("\n```", pos + 3)
                body = text[pos + 4 : end]
                pos = end + 4
                continues = text.startswith("\n" + CONTINUES, pos)
                if continues:
                    pos += 1 + len(CONTINUES)
                assert last is not None, "a code block outside any argument"
                last.pieces.append((body, continues))
                pos += text.startswith("\n", pos)
                continue
            end = text.find("\n", pos)
            end = len(text) if end == -1 else end
            line = text[pos:end]
            pos = end + 1
            match = ENTRY.match(line)
            if match:
                last = Shown(target=bool(match["target"]), json=bool(match["json"]))
                last.value = match["inline"] or ""
                order.append(match["name"])
                shown[match["name"]] = last
            elif (cut := CUT.search(line)) and last is not None:
                last.not_shown = int(cut["n"].replace(",", ""))
    for entry in shown.values():
        if entry.pieces:
            entry.value = join_pieces(entry.pieces)
    return order, shown


def join_pieces(pieces: list[tuple[str, bool]]) -> str:
    """Code blocks split over sections, joined back: a line break between them unless one continues."""
    out = ""
    for i, (body, continues) in enumerate(pieces):
        out += body
        if i < len(pieces) - 1 and not continues:
            out += "\n"
    return out


def inline_form(text: str) -> str:
    """How a short one-line value or a name is shown in `inline code`."""
    seen = visible(text).replace("\n", "[U+000A]").replace("\t", "[U+0009]")
    return escape(seen.replace("`", "ˋ"))


def block_form(text: str) -> str:
    """How a value is shown in a ``` block."""
    return escape(visible(text).replace("```", "ˋˋˋ"))


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else compact(value)


def shows_whole(entry: Shown, value: Any) -> bool:
    text = as_text(value)
    return entry.not_shown == 0 and entry.value in (inline_form(text), block_form(text))


def card_arguments(msg: Message) -> tuple[list[str], dict[str, Shown]]:
    return read_arguments(sections(msg.blocks))


def modal_arguments(view: dict[str, Any]) -> tuple[list[str], dict[str, Shown]]:
    return read_arguments(sections(view["blocks"]))


# --- 13: the target first and whole -----------------------------------------------------------------


def test_the_path_after_long_content_is_shown_first_and_whole() -> None:
    """Issue #8's reproduction: 3,400 characters of notes first, the path after them."""
    call = pending({"content": NOTES, "path": ".git/config"})
    msg = card(call)
    assert_slack_accepts(msg)
    order, shown = card_arguments(msg)
    assert order == ["path", "content"]
    assert shown["path"].target and shows_whole(shown["path"], ".git/config")
    assert shows_whole(shown["content"], NOTES)  # 3,400 characters fit on the card
    assert ".git/config" in msg.text and "write_file" in msg.text


def test_argument_order_does_not_depend_on_the_models_key_order() -> None:
    content = "x" * 9000
    forward = pending({"content": content, "path": ".git/config", "mode": "w"})
    backward = pending({"mode": "w", "path": ".git/config", "content": content})
    assert card(forward) == card(backward)
    assert decided(forward) == decided(backward)
    assert arguments_modal(call=forward) == arguments_modal(call=backward)
    order, shown = card_arguments(card(forward))
    assert order[0] == "path" and shows_whole(shown["path"], ".git/config")


def test_every_named_target_comes_before_the_other_arguments() -> None:
    args = {
        "body": "b" * 50,
        "to": "ceo@example.com",
        "subject": "hi",
        "fileUrl": "https://example.com/x",
        "dest_path": "/etc/passwd",
        "sql": "DROP TABLE users",
    }
    order, shown = card_arguments(card(pending(args, "send")))
    targets = {"to", "fileUrl", "dest_path", "sql"}
    assert set(order[: len(targets)]) == targets
    assert all(shown[n].target == (n in targets) for n in order)
    assert all(shows_whole(shown[n], args[n]) for n in order)


@pytest.mark.parametrize(
    ("name", "target"),
    [
        *((n, True) for n in ("path", "file_path", "filePath", "URL", "dest_url", "to", "toAddress")),
        *((n, True) for n in ("recipients", "channel", "repo", "branch", "command", "sql", "ticket_id")),
        *((n, False) for n in ("content", "body", "subject", "text", "photo", "total", "message", "")),
    ],
)
def test_which_names_are_targets(name: str, target: bool) -> None:
    assert is_target(name) is target


def test_the_turn_summary_shows_the_target_first_too() -> None:
    call = pending({"content": NOTES, "path": ".git/config\u202e"}, result=ToolResult("ok"))
    line = turn_summary(1, [call], 1, 2).blocks[0]["text"]["text"]
    assert '{"path": ".git/config[U+202E]", "content": "Meeting notes' in line


def test_a_long_name_is_cut_and_counted() -> None:
    name = "n" * 1500  # cut on the card, whole in the modal (which shows names up to 2,000)
    msg = card(pending({name: "v", "path": "a"}))
    assert_slack_accepts(msg)
    match = re.search(r"_↳ name cut: ([\d,]+) more characters not shown", all_text(msg))
    shown_name = re.search(r"• `(n+)…`", all_text(msg))
    assert match and shown_name
    assert len(shown_name[1]) + int(match[1].replace(",", "")) == 1500
    assert "view_args" in [b["action_id"] for b in buttons(msg)]
    _, in_modal = modal_arguments(arguments_modal(call=pending({name: "v", "path": "a"})))
    assert in_modal[name].value == "v"
    assert fully_reviewable(pending({name: "v"}))
    assert not fully_reviewable(pending({"n" * 2500: "v"}))


def test_a_long_value_is_cut_with_the_exact_number_of_characters_not_shown() -> None:
    content = "".join(f"line {i} <&> ```\n" for i in range(2000))  # 36,890 characters
    msg = card(pending({"path": "a.txt", "content": content}))
    assert_slack_accepts(msg)
    _, shown = card_arguments(msg)
    entry = shown["content"]
    assert entry.not_shown > 0
    shown_raw = render_back(entry.value)
    assert content.startswith(shown_raw)
    assert len(shown_raw) + entry.not_shown == len(content)
    assert f"{len(content):,} characters" in all_text(msg)


def test_a_target_too_long_for_the_card_says_how_much_is_not_shown() -> None:
    path = "dir/" * 5000  # 20,000 characters: cannot fit on a card
    msg = card(pending({"path": path, "content": "x"}))
    assert_slack_accepts(msg)
    order, shown = card_arguments(msg)
    assert order[0] == "path"
    entry = shown["path"]
    assert entry.not_shown > 0 and len(render_back(entry.value)) + entry.not_shown == len(path)
    assert "view_args" in [b["action_id"] for b in buttons(msg)]


def test_view_all_arguments_sits_beside_the_other_buttons_when_anything_is_cut() -> None:
    call = pending({"content": "y" * 20_000, "path": "a"})
    msg = card(call, run_id="run-1")
    (actions,) = [b for b in msg.blocks if b["type"] == "actions"]
    assert actions is msg.blocks[-1] and actions["block_id"] == "approval"
    assert [(e["action_id"], e["text"]["text"], e.get("style")) for e in actions["elements"]] == [
        ("approve", "Approve", "primary"),
        ("decline", "Decline", "danger"),
        ("edit", "Edit…", None),
        ("decline_with_reason", "Decline with reason…", None),
        ("view_args", "View all arguments", None),
    ]
    assert {e["value"] for e in actions["elements"]} == {f"run-1:toolu_x:{call.fingerprint}"}
    assert "View all arguments" in all_text(msg)


def test_no_view_all_button_when_everything_is_shown() -> None:
    msg = card(pending({"path": "notes.txt", "content": "hello"}))
    assert [b["action_id"] for b in buttons(msg)] == ["approve", "decline", "edit", "decline_with_reason"]
    _, shown = card_arguments(msg)
    assert shows_whole(shown["path"], "notes.txt") and shows_whole(shown["content"], "hello")


def test_many_arguments_are_all_accounted_for() -> None:
    args = {f"k{i:03d}": "v" * (i % 40) for i in range(400)}
    msg = card(pending(args, "bulk"))
    assert_slack_accepts(msg)
    order, shown = card_arguments(msg)
    more = re.search(r"_…and (\d+) more arguments not shown \(([\d,]+) characters\)", all_text(msg))
    assert more is not None and len(order) + int(more[1]) == len(args)
    listed = sum(len(n) + len(args[n]) for n in order)
    assert int(more[2].replace(",", "")) == sum(len(k) + len(v) for k, v in args.items()) - listed
    assert all(shows_whole(shown[n], args[n]) for n in order)  # short ones whole, not 400 slivers
    assert "view_args" in [b["action_id"] for b in buttons(msg)]


def test_non_string_values_are_compact_json_and_marked() -> None:
    args = {"path": "a", "count": 3, "flags": {"force": True, "paths": ["x", "y"]}, "text": "3"}
    _, shown = card_arguments(card(pending(args)))
    assert shown["count"].json and shown["count"].value == "3"
    assert shown["flags"].json and shown["flags"].value == '{"force":true,"paths":["x","y"]}'
    assert not shown["text"].json and shown["text"].value == "3"


def test_decided_card_shows_the_same_arguments_without_buttons() -> None:
    call = pending({"content": NOTES * 5, "path": ".git/config"})
    for verdict in Verdict:
        msg = decided(call, verdict)
        assert_slack_accepts(msg)
        assert buttons(msg) == []
        order, shown = card_arguments(msg)
        assert order[0] == "path" and shows_whole(shown["path"], ".git/config")
        entry = shown["content"]
        assert entry.not_shown > 0
        assert len(render_back(entry.value)) + entry.not_shown == len(NOTES * 5)


def test_the_modal_shows_every_argument_in_full() -> None:
    content = "".join(f"{i}: <!channel> & ``` `tick` \u202e\n" for i in range(3000))  # ~100k
    one_line = "z" * 7000  # no line breaks: split mid-line, and it must say so
    args = {"content": content, "path": "a/b.txt", "blob": one_line, "opts": {"n": [1, 2]}}
    call = pending(args)
    assert fully_reviewable(call)
    view = arguments_modal(call=call)
    assert_modal_ok(view)
    assert view["title"]["text"] == "All arguments" and view["close"]["text"] == "Close"
    order, shown = modal_arguments(view)
    assert order == ["path", "opts", "blob", "content"]
    for name, value in args.items():
        assert shows_whole(shown[name], value), name
    assert any(cont for _, cont in shown["blob"].pieces)
    assert "too large" not in all_view_text(view)


def test_arguments_too_large_for_the_modal_are_refused_plainly() -> None:
    huge = {"path": "big.bin", "content": "0123456789" * 40_000}  # 400k characters
    call = pending(huge)
    assert not fully_reviewable(call)
    view = arguments_modal(call=call)
    assert_modal_ok(view)
    _, shown = modal_arguments(view)
    assert shows_whole(shown["path"], "big.bin")
    assert len(render_back(shown["content"].value)) + shown["content"].not_shown == 400_000
    assert "too large to review in Slack" in all_view_text(view)
    msg = card(call)
    assert_slack_accepts(msg)
    assert "too large to review in Slack" in all_text(msg)
    assert "cannot be approved" in all_text(msg)
    assert [b["action_id"] for b in buttons(msg)][-1] == "view_args"


def submitted(view: dict[str, Any], values: dict[str, str | None]) -> dict[str, Any]:
    """`view` as Slack sends it back on submit, its inputs (action_id "value") holding `values`."""
    state = {b: {"value": {"type": "plain_text_input", "value": v}} for b, v in values.items()}
    return {**view, "state": {"values": state}}


def test_an_edit_still_too_large_to_review_is_refused_and_a_shortened_one_passes() -> None:
    """Issue 19: Edit approves nothing Approve refuses. Every argument fits an input here, yet the
    call is too large to review; the modal says so, and only a submission shortened enough passes."""
    args = {f"part{n:03d}": f"{n:03d}" + "p" * 2996 for n in range(100)}  # 300k characters in all
    call = pending(args)
    assert not fully_reviewable(call)
    view = edit_modal(run_id="a" * 32, call=call, schema=None)
    assert "too large to review" in json.dumps(view["blocks"])
    assert validate_blocks(view["blocks"], max_blocks=MAX_BLOCKS_PER_VIEW) == []
    View(**copy.deepcopy(view)).to_dict()
    inputs = {
        b["block_id"]: b["element"].get("initial_value") for b in view["blocks"] if b["type"] == "input"
    }

    _, errors = edits.read(submitted(view, inputs), call, CallTool(), Config())
    assert [e for e in errors.values() if "too large to review" in e], errors
    shorter = {name: value[:100] for name, value in inputs.items()}
    edited, errors = edits.read(submitted(view, shorter), call, CallTool(), Config())
    assert errors == {} and fully_reviewable(replace(call, input=edited))


def test_small_calls_are_fully_reviewable() -> None:
    assert fully_reviewable(pending({"path": "a", "content": "b"}))
    assert fully_reviewable(pending({}))
    assert fully_reviewable(pending({"content": "q" * 200_000}))


def test_the_text_fallback_names_the_tool_and_the_target() -> None:
    msg = card(pending({"content": "x" * 5000, "path": "src/\u202eevil.py"}))
    assert "write_file" in msg.text and "src/[U+202E]evil.py" in msg.text
    assert "\u202e" not in msg.text


def test_a_lone_surrogate_does_not_break_the_card() -> None:
    call = pending({"path": "a\ud800b", "content": "\udfff"})
    msg = card(call)
    assert_slack_accepts(msg)
    assert "a[U+D800]b" in all_text(msg)
    assert_modal_ok(arguments_modal(call=call))
    assert_slack_accepts(turn_summary(1, [call], 1, 2))


# --- 14: invisible and direction-changing characters ------------------------------------------------


@pytest.mark.parametrize("ch", UNSEEN, ids=lambda ch: f"U+{ord(ch):04X}")
def test_invisible_characters_are_shown_as_code_points_everywhere(ch: str) -> None:
    mark = f"[U+{ord(ch):04X}]"
    spoof = f"evil{ch}txt.sh"
    call = pending({"path": spoof, "content": f"a{ch}b"}, result=ToolResult(f"wrote{ch}it"))
    approval = card(call)
    summary = turn_summary(1, [call], 1, 2)
    view = arguments_modal(call=call)
    for msg in (approval, decided(call), summary):
        assert_slack_accepts(msg)
        assert f"evil{mark}txt.sh" in all_text(msg)
    assert f"wrote{mark}it" in all_text(summary)
    assert_modal_ok(view)
    assert f"evil{mark}txt.sh" in all_view_text(view)
    for msg in (stopped(spoof, 1, 2), failed(run_id="r", error=spoof), notice(spoof)):
        assert f"evil{mark}txt.sh" in all_text(msg)
        assert_slack_accepts(msg)


def test_visible_covers_every_format_character() -> None:
    every_cf = [chr(cp) for cp in range(0x110000) if unicodedata.category(chr(cp)) == "Cf"]
    shown = visible("".join(every_cf))
    assert shown == "".join(f"[U+{ord(ch):04X}]" for ch in every_cf)
    assert visible("line\n\ttab <ok> ✓") == "line\n\ttab <ok> ✓"
    assert visible("\r\x00\x1b\u2028") == "[U+000D][U+0000][U+001B][U+2028]"


def test_the_hidden_character_tables_are_built_once_before_a_fork_and_children_inherit_them() -> None:
    """The bot and the workers call `text.warm()` before forking: building the tables costs about
    100 ms of CPU, which the first click each gunicorn worker answered used to pay (35 ms late)."""
    code = (
        "import os, sys\n"
        "from messages import text\n"
        "text.warm()\n"
        "built = text._unseen_bmp.cache_info().misses\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    for mode in ('block', 'inline', 'answer'):\n"
        "        assert text.visible_as('a\\u202eb', mode) == 'a[U+202E]b'\n"
        "    os._exit(0 if text._unseen_bmp.cache_info().misses == built == 3 else 1)\n"
        "sys.exit(os.waitpid(pid, 0)[1] >> 8)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_final_answers_keep_emoji_joiners_but_not_bidi_controls() -> None:
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # one emoji made of three, joined by ZWJ
    heart = "\u2764\ufe0f"
    answer = f"Done {family} {heart} — see file \u202eexe.txt\u202c and\u200bthis."
    msg = final_answer(answer, 1, 2)
    assert_slack_accepts(msg, kept="\u200d\ufe0f")
    body = msg.blocks[0]["text"]["text"]
    assert family in body and heart in body
    assert "[U+202E]exe.txt[U+202C]" in body and "and[U+200B]this" in body
    assert "\u202e" not in msg.text and family in msg.text
    # ... while on a card a joiner is shown, as a spoofed path matters more than a pretty emoji.
    assert "[U+200D]" in all_text(card(pending({"path": family})))


def test_emoji_heavy_messages_fit_the_wire_limit() -> None:
    """slack_sdk sends blocks as ASCII JSON (an emoji is 12 characters there): they must still fit."""
    for msg in (
        final_answer("😀" * 20_000, 1, 2),
        stopped("é" * 20_000, 1, 2),
        card(pending({"path": "😀" * 3000, "content": "é" * 20_000})),
        turn_summary(1, [pending({"p": "😀" * 999}, result=ToolResult("é" * 999))] * 40, 1, 2),
    ):
        assert_slack_accepts(msg)


def test_the_loopback_slack_accepts_cards_and_modal() -> None:
    call = pending({"content": NOTES * 30 + "\u202e", "path": ".git/config", "n": {"deep": [[["x"]]]}})
    with FakeSlackAPI() as fake:
        client = WebClient(token=fake.bot_token, base_url=fake.base_url)
        for msg in (card(call), decided(call), turn_summary(1, [call], 1, 2)):
            assert client.chat_postMessage(channel="C1", text=msg.text, blocks=msg.blocks)["ok"]
        assert client.views_open(trigger_id="t", view=arguments_modal(call=call))["ok"]
        assert fake.views[0]["view"]["callback_id"] == "view_args"


# --- properties over adversarial arguments ----------------------------------------------------------

NASTY = [
    "<!channel>",
    "<@U123>",
    "<https://evil.example|click>",
    "```",
    "`",
    "&amp;",
    "\n",
    '"\\',
    "\u202e",
    "\u2066",
    "\u200b",
    "\u200d",
    "\ufeff",
    "\U000e0041",
    "[U+",
    "😀",
    ".git/config",
]
text_st = st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=12)), max_size=8).map("".join)
long_st = st.one_of(text_st, st.builds(lambda s, n: s * n, text_st, st.integers(1, 1500)))
json_st = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), long_st),
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(text_st, kids, max_size=4)),
    max_leaves=12,
)
names_st = st.one_of(
    text_st,
    st.sampled_from(["path", "url", "to", "command", "content", "body", "filePath", "dest"]),
    st.builds(lambda s, n: s * n, text_st, st.integers(1, 60)),
)
args_st = st.one_of(
    st.dictionaries(names_st, st.one_of(long_st, json_st), max_size=6),
    st.dictionaries(names_st, st.one_of(text_st, long_st), min_size=30, max_size=120),
)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(args=args_st)
def test_cards_and_modal_hide_nothing_silently(args: dict[str, Any]) -> None:
    call = pending(args, "tool<!here>\u202e")
    msg = card(call)
    assert_slack_accepts(msg)
    assert_modal_ok(arguments_modal(call=call))
    for verdict in Verdict:
        assert_slack_accepts(decided(call, verdict))
    assert_slack_accepts(turn_summary(1, [call], 1, 2))

    order, shown = card_arguments(msg)
    targets = [n for n in order if shown[n].target]
    assert order[: len(targets)] == targets  # every target before every other argument
    has_view_all = "view_args" in [b["action_id"] for b in buttons(msg)]
    assert has_view_all == (not all_whole(order, shown, args))
    if not fully_reviewable(call):
        assert "too large to review in Slack" in all_text(msg)

    reversed_call = pending(dict(reversed(list(args.items()))), "tool<!here>\u202e")
    assert card(reversed_call) == msg


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(args=args_st)
def test_the_modal_of_a_reviewable_call_shows_every_character(args: dict[str, Any]) -> None:
    call = pending(args)
    view = arguments_modal(call=call)
    assert_modal_ok(view)
    order, shown = modal_arguments(view)
    if fully_reviewable(call):
        assert all_whole(order, shown, args)
        assert "too large" not in all_view_text(view)
    else:
        assert "too large to review in Slack" in all_view_text(view)


# --- helpers that read displays back ----------------------------------------------------------------


def all_whole(order: list[str], shown: dict[str, Shown], args: dict[str, Any]) -> bool:
    """Whether every argument is listed, under its whole name, with its whole value."""
    if len(order) != len(args):
        return False
    for display in order:
        named = [value for name, value in args.items() if inline_form(name) == display]
        if not any(shows_whole(shown[display], value) for value in named):
            return False
    return True


def render_back(display: str) -> str:
    """A displayed code block's text back as the raw characters (test inputs avoid `ˋ` and `[U+`)."""
    text = display.replace("ˋˋˋ", "```")
    text = re.sub(r"\[U\+([0-9A-F]{4,6})\]", lambda m: chr(int(m[1], 16)), text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def all_text(msg: Message) -> str:
    return "\n".join([msg.text, *strings(msg.blocks)])


def all_view_text(view: dict[str, Any]) -> str:
    return "\n".join(strings(view))


def test_an_edit_checked_against_a_hostile_schema_fetches_nothing_and_is_refused() -> None:
    """A tool's schema is the server's: a remote `$ref` in it must not make the bot fetch a URL
    (jsonschema's default registry would, with urllib), and an edit it cannot check is refused."""
    import http.server
    import threading

    fetched: list[str] = []

    class Trap(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            fetched.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Trap)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/schema.json"
        schema = {"type": "object", "properties": {"path": {"$ref": url}}}
        call = pending({"path": "a.txt"})
        view = edit_modal(run_id="a" * 32, call=call, schema=schema)
        inputs = {b["block_id"]: "b.txt" for b in view["blocks"] if b["type"] == "input"}
        _, errors = edits.read(submitted(view, inputs), call, CallTool(schema=schema), Config())
    finally:
        server.shutdown()
    assert fetched == []
    assert errors, "an edit the bot could not check must not pass"
