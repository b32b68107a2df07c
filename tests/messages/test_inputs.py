"""What the thread shows of a server's question (`messages.inputs`): every block valid as Slack
checks it, everything the server wrote shown inert, and the modal's answers read and checked
against the question's schema, whatever a submission holds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from harness.policy import Tier
from harness.state import PendingCall
from harness.tools.inputs import InputAsk, InputQuestion, typed_answer
from messages import tasks
from messages.inputs import input_modal, input_note, input_prompt, input_settled, read_answers
from tests.fakes.slack_api import validate_blocks

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {
            "type": "string",
            "title": "Title",
            "minLength": 3,
            "maxLength": 80,
            "description": "What for",
        },
        "people": {"type": "integer", "minimum": 1, "maximum": 40, "default": 2},
        "budget": {"type": "number", "maximum": 99.5},
        "contact": {"type": "string", "format": "email"},
        "site": {"type": "string", "format": "uri"},
        "day": {"type": "string", "format": "date", "default": "2026-12-24"},
        "floor": {"type": "string", "enum": ["1", "2"], "enumNames": ["Ground", "First"], "default": "2"},
        "size": {
            "type": "string",
            "oneOf": [{"const": "s", "title": "Small"}, {"const": "l", "title": "Large"}],
        },
        "lunch": {"type": "boolean", "default": True},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "default": ["b"]},
        "notes": {"type": "string"},
    },
    "required": ["title", "people"],
}
WHEN = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
HOSTILE = "<!channel> *ping* <https://evil.example|click> &amp; `x`"


def question(**changes: Any) -> InputQuestion:
    data: dict[str, Any] = {"key": "q", "mode": "form", "message": "Who is it for?", "schema": SCHEMA}
    data.update(changes)
    return InputQuestion.from_json(data)


def ask(q: InputQuestion, server: str = "rooms") -> InputAsk:
    return InputAsk(server, (q,), "opaque-state")


def test_the_modal_has_one_valid_input_per_field_named_by_it_with_its_defaults() -> None:
    q = question()
    view = input_modal(run_id="a" * 32, call_id="toolu_1", ask=ask(q), question=q, tool="rooms__book")
    assert view["callback_id"] == "mcp_input" and view["private_metadata"].startswith("a" * 32 + ":toolu_1:")
    assert validate_blocks(view["blocks"]) == []
    inputs = {b["block_id"]: b for b in view["blocks"] if b["type"] == "input"}
    assert list(inputs) == list(SCHEMA["properties"])
    kinds = {name: b["element"]["type"] for name, b in inputs.items()}
    assert kinds == {
        "title": "plain_text_input",
        "people": "number_input",
        "budget": "number_input",
        "contact": "email_text_input",
        "site": "url_text_input",
        "day": "datepicker",
        "floor": "static_select",
        "size": "static_select",
        "lunch": "radio_buttons",
        "tags": "multi_static_select",
        "notes": "plain_text_input",
    }
    assert not inputs["title"]["optional"] and inputs["notes"]["optional"]
    assert inputs["people"]["element"]["initial_value"] == "2"
    assert inputs["floor"]["element"]["initial_option"]["value"] == "2"
    assert inputs["day"]["element"]["initial_date"] == "2026-12-24"
    assert inputs["title"]["element"]["max_length"] == 80 and inputs["title"]["element"]["min_length"] == 3


def answer(element: str, **fields: Any) -> dict[str, Any]:
    return {"value": {"type": element, **fields}}


def test_answers_are_typed_and_checked_against_the_schema() -> None:
    state = {
        "title": answer("plain_text_input", value="Planning"),
        "people": answer("number_input", value="5"),
        "budget": answer("number_input", value="12.5"),
        "contact": answer("email_text_input", value="ann@example.com"),
        "floor": answer("static_select", selected_option={"value": "1"}),
        "lunch": answer("radio_buttons", selected_option={"value": "false"}),
        "tags": answer("multi_static_select", selected_options=[{"value": "a"}, {"value": "c"}]),
        "day": answer("datepicker", selected_date="2026-12-31"),
        "intruder": answer("plain_text_input", value="not asked for"),
    }
    values, errors = read_answers({"state": {"values": state}}, question())
    assert errors == {}
    assert values == {
        "title": "Planning",
        "people": 5,
        "budget": 12.5,
        "contact": "ann@example.com",
        "floor": "1",
        "lunch": False,
        "tags": ["a", "c"],
        "day": "2026-12-31",
    }


def test_wrong_answers_are_said_per_field_and_nothing_is_taken() -> None:
    state = {
        "title": answer("plain_text_input", value="Q"),
        "people": answer("number_input", value="400"),
        "budget": answer("number_input", value="lots"),
        "contact": answer("email_text_input", value="nope"),
        "site": answer("url_text_input", value="javascript alert(1)"),
        "floor": answer("static_select", selected_option={"value": "9"}),  # forged: not offered
        "tags": answer("multi_static_select", selected_options=[{"value": "z"}]),
    }
    values, errors = read_answers({"state": {"values": state}}, question())
    assert set(errors) == {"title", "people", "budget", "contact", "site", "floor", "tags"}
    assert errors["people"] == "At most 40."
    assert "title" not in values


def test_a_missing_required_field_is_an_error_and_a_missing_optional_one_is_left_out() -> None:
    values, errors = read_answers({"state": {"values": {}}}, question())
    assert errors == {"title": "This is required.", "people": "This is required."}
    assert values == {}


@given(
    st.recursive(st.none() | st.text() | st.integers(), lambda c: st.lists(c) | st.dictionaries(st.text(), c))
)
def test_any_submission_reads_without_error(junk: Any) -> None:
    values, errors = read_answers({"state": {"values": junk}}, question())
    assert set(values) | set(errors) <= set(SCHEMA["properties"])


def test_what_the_server_wrote_is_shown_inert_everywhere() -> None:
    q = question(message=HOSTILE, schema={"type": "object", "properties": {HOSTILE: {"type": "string"}}})
    a = ask(q, server="rooms")
    prompt = input_prompt(
        run_id="a" * 32, call_id="toolu_1", tool="rooms__x", ask=a, question=q, expires_at=WHEN
    )
    note = input_note(
        run_id="a" * 32, call_id="toolu_1", tool="rooms__x", ask=a, question=q, requester="UANN"
    )
    for message in (prompt, note):
        assert validate_blocks(message.blocks) == []
        shown = str(message.blocks)
        assert "<!channel>" not in shown and "<https://evil" not in shown
    assert "&lt;!channel&gt;" in str(prompt.blocks)


def test_a_url_prompt_shows_the_domain_and_links_only_for_the_requester() -> None:
    q = InputQuestion("login", "url", "Sign in", url="https://auth.example.com/x?token=abc")
    a = ask(q)
    prompt = input_prompt(
        run_id="a" * 32, call_id="toolu_1", tool="crm__sync", ask=a, question=q, expires_at=WHEN
    )
    assert validate_blocks(prompt.blocks) == []
    link = next(e for b in prompt.blocks if b["type"] == "actions" for e in b["elements"] if "url" in e)
    assert link["url"] == "https://auth.example.com/x?token=abc" and "auth.example.com" in str(prompt.blocks)
    note = input_note(
        run_id="a" * 32, call_id="toolu_1", tool="crm__sync", ask=a, question=q, requester="UANN"
    )
    assert "token=abc" not in str(note.blocks) and "auth.example.com" not in str(note.blocks)


def test_a_secret_field_gets_no_input_anywhere() -> None:
    q = question(schema={"type": "object", "properties": {"key": {"type": "string", "format": "password"}}})
    prompt = input_prompt(
        run_id="a" * 32, call_id="toolu_1", tool="x__y", ask=ask(q), question=q, expires_at=WHEN
    )
    actions = [e["action_id"] for b in prompt.blocks if b["type"] == "actions" for e in b["elements"]]
    assert actions == ["decline_input"]
    note = input_note(
        run_id="a" * 32, call_id="toolu_1", tool="x__y", ask=ask(q), question=q, requester="UANN"
    )
    assert not [b for b in note.blocks if b["type"] == "actions"]


def test_each_outcome_settles_the_note_without_buttons() -> None:
    a = ask(question())
    for outcome in ("accept", "decline", "cancel", "stopped"):
        msg = input_settled(ask=a, tool="rooms__book", outcome=outcome, by="UANN", at=WHEN)
        assert validate_blocks(msg.blocks) == [] and not [b for b in msg.blocks if b["type"] == "actions"]


def test_a_call_waiting_for_input_says_so_on_its_task_line() -> None:
    call = PendingCall("toolu_1", "rooms__book", {"room": "4B"}, Tier.ALLOW, asking=ask(question()))
    line = tasks.task_line(call, waiting=True)
    assert line.status == tasks.PENDING and line.details == (
        "Waiting for the requester to answer what rooms asks.",
    )


def test_typed_answers_keep_to_the_bounds() -> None:
    assert typed_answer("7", {"type": "integer", "minimum": 1}) == 7
    assert typed_answer("2026-02-28", {"type": "string", "format": "date"}) == "2026-02-28"
    for bad, spec in (
        ("0", {"type": "integer", "minimum": 1}),
        ("1.5", {"type": "integer"}),
        ("2026-02-30", {"type": "string", "format": "date"}),
        ("x" * 5, {"type": "string", "maxLength": 4}),
    ):
        try:
            typed_answer(bad, spec)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} passed {spec}")


def test_a_look_alike_domain_shows_in_its_ascii_form() -> None:
    q = InputQuestion("login", "url", "Sign in", url="https://аpple.com/login")  # a Cyrillic "а"
    assert q.domain == "xn--pple-43d.com"
    assert (
        InputQuestion("l", "url", "", url="https://user:pw@auth.example.com/x").domain == "auth.example.com"
    )


def test_an_address_a_link_cannot_hold_is_not_asked() -> None:
    from harness.tools.inputs import BadInputRequest, question_of

    params = {"mode": "url", "message": "Go", "url": "https://auth.example.com/" + "a" * 3000}
    try:
        question_of("k", "elicitation/create", params)
    except BadInputRequest as exc:
        assert "longer than 3000" in str(exc)
    else:
        raise AssertionError("a 3,000-character address was asked")
