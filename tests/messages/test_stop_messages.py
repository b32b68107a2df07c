"""The messages of Stop and of limits that ask: within Slack's limits, and nothing in them pings."""

from __future__ import annotations

from datetime import UTC, datetime

from harness.policy import Tier
from harness.state import PendingCall, Verdict
from messages.blocks import Message
from messages.cards import LimitCard, card_stopped, limit_card, limit_decided
from messages.endings import stopped_by
from messages.turns import working, working_closed
from tests.fakes.slack_api import validate_blocks

AT = datetime(2026, 12, 3, 13, 41, tzinfo=UTC)
RUN = "0123456789abcdef0123456789abcdef"


def everything(msg: Message) -> str:
    return msg.text + str(msg.blocks)


def test_the_working_message_carries_stop_in_its_own_actions_block_not_as_a_card() -> None:
    msg = working(run_id=RUN)
    assert validate_blocks(msg.blocks) == []
    [actions] = [b for b in msg.blocks if b["type"] == "actions"]
    assert actions["block_id"] == "working"  # apart from the cards' "approval" blocks
    [button] = actions["elements"]
    assert (button["action_id"], button["value"], button["style"]) == ("stop", RUN, "danger")
    assert "confirm" in button and "approve" not in everything(msg)


def test_the_working_message_once_closed_has_no_button_and_says_how_it_ended() -> None:
    for outcome, by, words in [
        ("finished", None, "Done."),
        ("finished", "UALICE", "before Stop (pressed by <@UALICE>)"),
        ("stopped", "UALICE", "Stopped by <@UALICE>."),
        ("stopped", None, "Stopped."),
        ("failed", None, "Paused"),
    ]:
        msg = working_closed(outcome=outcome, by=by)
        assert validate_blocks(msg.blocks) == [] and words in msg.text
        assert "button" not in str(msg.blocks) and "turn" not in msg.text.lower()


def test_the_limit_card_asks_continue_or_stop_and_names_deciders_without_pinging_a_group() -> None:
    msg = limit_card(
        LimitCard(
            run_id=RUN,
            question="Reached max turns: <!channel> all 8 turns used.",
            more="8 more turns of tool calls",
            requester="UALICE",
            deciders=["UANN", "S0OPS"],
            expires_at=AT,
        )
    )
    assert validate_blocks(msg.blocks) == []
    [actions] = [b for b in msg.blocks if b["type"] == "actions"]
    assert [(e["action_id"], e["value"]) for e in actions["elements"]] == [
        ("continue", f"{RUN}:limit"),
        ("stop", f"{RUN}:limit"),
    ]
    shown = everything(msg)
    assert "<@UANN>" in shown and "<!subteam" not in shown and "<!channel>" not in shown
    assert "8 more turns of tool calls" in shown


def test_the_answered_limit_card_has_no_buttons_and_says_what_was_chosen() -> None:
    for verdict, by, words in [
        (Verdict.APPROVED, "UALICE", "Continued by <@UALICE>"),
        (Verdict.DECLINED, "UALICE", "Stopped by <@UALICE>"),
        (Verdict.EXPIRED, None, "Expired"),
    ]:
        msg = limit_decided(question="Reached the token budget.", verdict=verdict, by=by, at=AT, more="x")
        assert validate_blocks(msg.blocks) == [] and words in everything(msg)
        assert all(b["type"] != "actions" for b in msg.blocks)


def test_a_stopped_runs_card_shows_the_call_and_that_it_did_not_run() -> None:
    call = PendingCall("toolu_1", "write_file", {"path": "<@U999>.txt", "content": "x" * 20_000}, Tier.ASK)
    msg = card_stopped(call=call, requester="UALICE", by="UANN", at=AT)
    assert validate_blocks(msg.blocks) == []
    shown = everything(msg)
    assert "Not run: the run was stopped by <@UANN>" in shown and "<@U999>" not in shown
    assert all(b["type"] != "actions" for b in msg.blocks)


def test_a_stop_by_a_person_names_them_and_ends_with_the_footer() -> None:
    msg = stopped_by(by="UALICE", turns=2, requests=3)
    assert validate_blocks(msg.blocks) == []
    assert msg.text.startswith(":octagonal_sign: Stopped by <@UALICE>")
    assert msg.text.endswith("That took 2 turns of tool calls across 3 model requests.")
