"""A modal's inputs in the playground's stand-in for Slack: the views Slack's `views.open` refuses
are refused, and what the page sends comes back to the bot as Slack's `view_submission` state."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from harness.tools.inputs import InputAsk, InputQuestion
from messages.inputs import input_modal, read_answers
from playground.bot_client import Bot
from playground.rooms_server import BOOKING_SCHEMA
from playground.server import Server
from playground.view_inputs import state_values
from tests.messages.test_inputs import SCHEMA
from tests.playground_support import ALICE, Page, stand_in

TOKEN = "xoxb-playground-test"


@pytest.fixture
def served() -> Iterator[tuple[Server, WebClient]]:
    with stand_in(TOKEN) as server:
        yield server, WebClient(token=TOKEN, base_url=server.playground.base_url + "api/")


def modal_of(schema: dict[str, Any]) -> tuple[InputQuestion, dict[str, Any]]:
    """The bot's own modal for a form question of `schema` (`messages.inputs.input_modal`)."""
    question = InputQuestion.from_json({"key": "q", "mode": "form", "message": "Who?", "schema": schema})
    ask = InputAsk("rooms", (question,), "state")
    return question, input_modal(run_id="a" * 32, call_id="toolu_1", ask=ask, question=question, tool="t")


def opened(served: Any, view: dict[str, Any]) -> dict[str, Any]:
    server, client = served
    trigger = server.playground.workspace.new_trigger(ALICE)
    shown: dict[str, Any] = client.views_open(trigger_id=trigger, view=view)["view"]
    return shown


def test_the_bots_form_opens_and_what_the_page_sends_reads_back_as_the_typed_answers(served: Any) -> None:
    question, view = modal_of(BOOKING_SCHEMA)
    shown = opened(served, view)
    sent = {
        "title": {"value": "Planning"},
        "people": {"value": "6"},
        "floor": {"value": "3"},
        "lunch": {"value": "true"},
        "day": {"value": "2026-12-11"},
        "equipment": {"value": ["whiteboard", "screen"]},
    }
    values, errors = read_answers({"state": {"values": state_values(shown, sent)}}, question)
    assert errors == {}
    assert values == {
        "title": "Planning",
        "people": 6,
        "floor": "3",
        "lunch": True,
        "day": "2026-12-11",
        "equipment": ["whiteboard", "screen"],
    }


def test_each_element_comes_back_in_slacks_shape(served: Any) -> None:
    shown = opened(served, modal_of(SCHEMA)[1])
    sent = {
        "title": {"value": "Retro"},
        "people": {"value": "4"},
        "contact": {"value": ""},
        "floor": {"value": None},
        "size": {"value": "l"},
        "lunch": {"value": "false"},
        "tags": {"value": ["c", "a", "nope"]},
        "day": {"value": None},
    }
    state = state_values(shown, sent)
    option = next(b["element"]["options"][1] for b in shown["blocks"] if b.get("block_id") == "size")
    assert state["title"] == {"value": {"type": "plain_text_input", "value": "Retro"}}
    assert state["people"] == {"value": {"type": "number_input", "value": "4"}}
    assert state["contact"] == {"value": {"type": "email_text_input", "value": None}}
    assert state["site"] == {"value": {"type": "url_text_input", "value": None}}  # not sent, no default
    assert state["floor"] == {"value": {"type": "static_select", "selected_option": None}}
    assert state["size"] == {"value": {"type": "static_select", "selected_option": option}}
    assert state["lunch"]["value"]["type"] == "radio_buttons"
    assert state["lunch"]["value"]["selected_option"]["value"] == "false"
    tags = state["tags"]["value"]
    assert tags["type"] == "multi_static_select"
    assert [o["value"] for o in tags["selected_options"]] == ["c", "a"]  # as chosen; "nope" is no option
    assert state["day"] == {"value": {"type": "datepicker", "selected_date": None}}


def test_what_the_page_did_not_send_comes_back_as_the_views_initial_values(served: Any) -> None:
    question, view = modal_of(SCHEMA)
    state = state_values(opened(served, view), {})
    assert state["day"]["value"] == {"type": "datepicker", "selected_date": "2026-12-24"}
    assert state["floor"]["value"]["selected_option"]["value"] == "2"
    assert [o["value"] for o in state["tags"]["value"]["selected_options"]] == ["b"]
    assert state["lunch"]["value"]["selected_option"]["value"] == "true"
    assert state["people"]["value"] == {"type": "number_input", "value": "2"}
    _, errors = read_answers({"state": {"values": state}}, question)
    assert errors == {"title": "This is required."}


def _input(element: dict[str, Any], **block: Any) -> dict[str, Any]:
    return {
        "type": "input",
        "block_id": "b",
        "label": {"type": "plain_text", "text": "L"},
        "element": element,
        **block,
    }


OPTION = {"text": {"type": "plain_text", "text": "One"}, "value": "1"}
REFUSED = [
    _input({"type": "plain_text_input", "action_id": "v"}, label=None),
    _input({"type": "colour_picker", "action_id": "v"}),
    _input({"type": "number_input", "action_id": "v"}),  # is_decimal_allowed is required
    _input({"type": "static_select", "action_id": "v", "options": []}),
    _input({"type": "radio_buttons", "action_id": "v", "options": [OPTION] * 11}),
    _input({"type": "static_select", "action_id": "v", "options": [{"value": "1"}]}),
    _input(
        {
            "type": "static_select",
            "action_id": "v",
            "options": [OPTION],
            "initial_option": {**OPTION, "value": "2"},
        }
    ),
    _input({"type": "datepicker", "action_id": "v", "initial_date": "11/12/2026"}),
]


@pytest.mark.parametrize("block", REFUSED)
def test_a_view_slack_refuses_is_refused_with_invalid_arguments(served: Any, block: dict[str, Any]) -> None:
    server, _ = served
    view = {"type": "modal", "title": {"type": "plain_text", "text": "T"}, "blocks": [block]}
    with pytest.raises(SlackApiError) as refused:
        opened(served, view)
    assert refused.value.response["error"] == "invalid_arguments"
    assert server.playground.workspace.views == []


@contextmanager
def bot_answering(answer: dict[str, Any]) -> Iterator[str]:
    """A loopback stand-in for the bot that answers every interaction with `answer` (its events URL)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/slack/events"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.parametrize(
    ("errors", "shown"),
    [({"people": "At most 12."}, True), ({"nope": "x"}, False), ({}, False)],
)
def test_a_bots_errors_stay_under_their_input_blocks_and_errors_naming_none_are_refused(
    served: Any, errors: dict[str, str], shown: bool
) -> None:
    """Slack shows a bot's `response_action: errors` only under the view's input blocks."""
    server, _ = served
    view = opened(served, modal_of(BOOKING_SCHEMA)[1])
    page = Page(server.playground.base_url)
    with bot_answering({"response_action": "errors", "errors": errors}) as url:
        server.playground.bot = Bot(url, "secret")
        status, answer = page.request(
            "POST", "play/submit", {"user": ALICE, "view_id": view["id"], "values": {}}
        )
    if shown:
        assert (status, answer) == (200, {"ok": False, "errors": errors})
        (entry,) = server.playground.workspace.views
        assert entry["errors"] == errors  # the modal stays open, the error under its field
    else:
        assert status == 502 and "name no input block" in answer["error"]
        assert [v["errors"] for v in server.playground.workspace.views] == [{}]  # open, as it was
