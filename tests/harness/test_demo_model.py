"""The offline demo model: its scripted scenarios as data, then as `python -m harness` runs them."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import anthropic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from harness import texts
from harness.state import canonical_json
from harness.tools import BUILTIN_TOOLS, ToolRegistry
from playground.demo_model import FOOTER, DemoModelError, error_body, respond
from playground.demo_stream import MAX_PAUSED_PIECES, encode, pieces, stream_events
from tests.fakes.messages_api import validate_request
from tests.harness.test_cli import cli_env
from tests.harness.test_cli import harness as run_cli
from tests.playground_support import stand_in

ROOT = Path(__file__).resolve().parents[2]
# The built-ins, and the tools of the playground's own MCP server as a run is offered them.
ROOMS_TOOLS = [
    {
        "name": name,
        "description": "A tool of the playground's rooms server (it asks the requester first).",
        "input_schema": {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]},
    }
    for name, arg in (
        ("rooms__book_room", "room"),
        ("rooms__sign_in", "service"),
        ("rooms__deploy", "service"),
        ("rooms__read_ticket", "ticket"),
        ("rooms__send_summary", "to"),
    )
]
TOOLS = [*ToolRegistry(BUILTIN_TOOLS).schemas(), *ROOMS_TOOLS]
NAMES = tuple(t["name"] for t in TOOLS)
ID = re.compile(r"^[a-zA-Z0-9_-]+$")
TIME = "2030-01-02T03:04:05Z"
STREAM_EVENT: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)

Result = tuple[Any, bool]  # a tool_result's content and is_error


def request(messages: list[dict[str, Any]], tools: tuple[str, ...] = NAMES, **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-demo",
        "max_tokens": 1024,
        "system": "You are an agent.",
        "tools": [t for t in TOOLS if t["name"] in tools],
        "messages": messages,
        **extra,
    }


def tool_uses(reply: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in reply["content"] if b["type"] == "tool_use"]


def answer(reply: dict[str, Any]) -> str:
    assert reply["stop_reason"] == "end_turn" and not tool_uses(reply)
    return "\n".join(b["text"] for b in reply["content"])


class Conversation:
    """A run against `respond`, fed back tool results as the harness would."""

    def __init__(self, task: str, tools: tuple[str, ...] = NAMES, *, strict: bool = True) -> None:
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        self.tools = tools
        self.strict = strict  # every request valid for the real API (off to feed back odd results)

    def ask(self) -> dict[str, Any]:
        body = request(self.messages, self.tools)
        assert not self.strict or validate_request(body) == []
        reply = respond(body)
        assert_well_formed(reply, body, self.messages)
        self.messages.append({"role": "assistant", "content": reply["content"]})
        return reply

    def answer(self, *results: Result) -> dict[str, Any]:
        """Answer the last reply's calls with `results` in order, then ask again."""
        uses = tool_uses({"content": self.messages[-1]["content"]})
        assert len(uses) == len(results)
        blocks = [
            {"type": "tool_result", "tool_use_id": use["id"], "content": content, "is_error": is_error}
            for use, (content, is_error) in zip(uses, results, strict=True)
        ]
        self.messages.append({"role": "user", "content": blocks})
        return self.ask()


def assert_well_formed(reply: dict[str, Any], body: dict[str, Any], before: list[dict[str, Any]]) -> None:
    """Every shape promise of a reply: fields, blocks, stop reason, ids, usage."""
    json.dumps(reply)
    assert reply["type"] == "message" and reply["role"] == "assistant"
    assert reply["model"] == body["model"] and reply["id"].startswith("msg_demo_")
    assert reply["stop_sequence"] is None
    content = reply["content"]
    assert content and all(b["type"] in ("text", "tool_use") for b in content)
    assert all(b["text"].strip() for b in content if b["type"] == "text")
    uses = tool_uses(reply)
    if uses:
        assert reply["stop_reason"] == "tool_use"
        assert content[0]["type"] == "text"  # the intent, quoted on approval cards
        offered = {t["name"] for t in body.get("tools", [])}
        assert {u["name"] for u in uses} <= offered
        earlier = {b["id"] for m in before for b in m["content"] if isinstance(b, dict) and "id" in b}
        ids = [u["id"] for u in uses]
        assert all(ID.match(i) for i in ids) and len(set(ids)) == len(ids) and not earlier & set(ids)
    else:
        assert reply["stop_reason"] == "end_turn"
        assert content[-1]["text"].rstrip().endswith(FOOTER)
    usage = reply["usage"]
    assert usage["input_tokens"] >= 1 and usage["output_tokens"] >= 1
    assert usage["cache_creation_input_tokens"] == usage["cache_read_input_tokens"] == 0
    assert streamed(reply).model_dump() == Message.model_validate(reply).model_dump()


def streamed(reply: dict[str, Any]) -> Message:
    """`reply` streamed as server-sent events, then folded back the way the anthropic SDK does."""
    snapshot = None
    json_bufs: dict[int, bytes] = {}  # the tool inputs' partial JSON so far, by block index
    for data in map(decode, stream_events(reply)):
        if data["type"] != "ping":
            event = STREAM_EVENT.validate_python(data)
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    return Message.model_validate(snapshot.model_dump())


def decode(event: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """An event through its wire form and back: `event: NAME`, `data: JSON`, a blank line."""
    name_line, data_line, *rest = encode(event).decode().split("\n")
    assert rest == ["", ""] and name_line == f"event: {event[0]}"
    data: dict[str, Any] = json.loads(data_line.removeprefix("data: "))
    assert data["type"] == event[0]
    return data


# --- the default scenario --------------------------------------------------------------------


def test_default_checks_time_and_folder_writes_a_note_reads_it_back_and_answers() -> None:
    run = Conversation("Summarise the project for me")
    first = run.ask()
    assert [(u["name"], u["input"]) for u in tool_uses(first)] == [
        ("get_time", {}),
        ("list_files", {"path": "."}),
    ]

    write = run.answer((TIME, False), ("README.md\nsrc/\n", False))
    (call,) = tool_uses(write)
    assert call["name"] == "write_file" and call["input"]["path"] == "notes.md"
    note = call["input"]["content"]
    assert "> Summarise the project for me" in note and TIME in note and "held 1 file " in note

    read = run.answer(("Wrote 120 characters to notes.md", False))
    assert [(u["name"], u["input"]) for u in tool_uses(read)] == [("read_file", {"path": "notes.md"})]

    final = answer(run.answer((note, False)))
    assert "notes.md" in final and "> # Notes" in final


def test_a_declined_note_is_not_read_back_and_the_answer_quotes_why() -> None:
    run = Conversation("Write me a note")
    run.ask()
    run.answer((TIME, False), ("README.md", False))
    final = answer(run.answer(("Not executed: the user declined this call.", True)))
    assert "did not write `notes.md`" in final
    assert "> Not executed: the user declined this call." in final


def test_the_note_quotes_at_most_about_200_characters_of_a_long_task() -> None:
    run = Conversation("word " * 300)
    run.ask()
    note = tool_uses(run.answer((TIME, False), ("", False)))[0]["input"]["content"]
    assert "…" in note and len(note) < 400


def test_a_missing_tool_is_named_in_an_answer_instead_of_called() -> None:
    run = Conversation("Tell me something", tools=("get_time", "list_files", "read_file"))
    final = answer(run.ask())
    assert "`write_file`" in final


def test_tool_choice_none_means_no_tool_is_called() -> None:
    body = request([{"role": "user", "content": "hello"}], tool_choice={"type": "none"})
    assert "does not offer" in answer(respond(body))


# --- delete, secret, forever -----------------------------------------------------------------


def test_delete_lists_then_deletes_the_first_plain_file_skipping_folders() -> None:
    run = Conversation("Please REMOVE a file")
    assert [u["name"] for u in tool_uses(run.ask())] == ["list_files"]
    delete = run.answer(("a/\nb/\nc.txt\nd.txt\n… and 3 more", False))
    assert [(u["name"], u["input"]) for u in tool_uses(delete)] == [("delete_file", {"path": "c.txt"})]
    assert "c.txt" in delete["content"][0]["text"]
    assert "I deleted `c.txt`" in answer(run.answer(("Deleted c.txt", False)))


def test_a_declined_delete_says_so() -> None:
    run = Conversation("delete something")
    run.ask()
    run.answer(("c.txt", False))
    final = answer(run.answer(("Not executed: the user declined this call.", True)))
    assert "did not delete `c.txt`" in final and "declined" in final


@pytest.mark.parametrize("listing", ["a/\nb/", "(empty directory)"])
def test_delete_with_no_plain_file_answers_that_there_is_nothing_to_delete(listing: str) -> None:
    run = Conversation("delete a file")
    run.ask()
    assert "nothing to delete" in answer(run.answer((listing, False)))


def test_secret_writes_under_secrets_and_reports_the_policys_refusal() -> None:
    run = Conversation("Save my secret token")
    (call,) = tool_uses(run.ask())
    assert call["name"] == "write_file" and call["input"]["path"] == "secrets/token.txt"
    why = "Not executed: the tool 'write_file' is forbidden by policy (tier deny)."
    final = answer(run.answer((why, True)))
    assert "policy refused" in final and f"> {why}" in final


def test_forever_repeats_the_same_turn_with_fresh_ids() -> None:
    run = Conversation("Loop forever")
    turns = [run.ask()] + [run.answer(("README.md", False)) for _ in range(4)]
    assert all(t["content"][0] == {"type": "text", "text": "Checking the folder again…"} for t in turns)
    assert all(
        [(u["name"], u["input"]) for u in tool_uses(t)] == [("list_files", {"path": "."})] for t in turns
    )
    ids = [tool_uses(t)[0]["id"] for t in turns]
    assert len(set(ids)) == len(ids)


# --- the rooms server: a tool whose server asks the requester first ----------------------------


def test_a_booking_calls_the_rooms_server_with_the_room_named_then_says_what_it_booked() -> None:
    run = Conversation("Book room 4B for the retro on Friday")
    first = run.ask()
    assert [(u["name"], u["input"]) for u in tool_uses(first)] == [("rooms__book_room", {"room": "4B"})]
    assert "ask you the details" in first["content"][0]["text"]
    said = "Booked room 4B on the second floor for 6 people, with lunch, needing screen."
    final = answer(run.answer((said, False)))
    assert "The rooms server answered:" in final and f"> {said}" in final


def test_a_deploy_calls_the_deploy_tool_for_the_service_named_then_says_what_it_said() -> None:
    run = Conversation("Deploy the api to production")
    first = run.ask()
    assert [(u["name"], u["input"]) for u in tool_uses(first)] == [("rooms__deploy", {"service": "api"})]
    said = "Deployed api (a demo: nothing was deployed)."
    final = answer(run.answer((said, False)))
    assert "The deploy answered:" in final and f"> {said}" in final


def test_a_booking_with_no_room_named_books_a_default_one_and_a_decline_is_said_as_such() -> None:
    run = Conversation("Please book a meeting room for us")
    (call,) = tool_uses(run.ask())
    assert call["input"] == {"room": "Orion"}
    final = answer(run.answer(("Room Orion was not booked: the person chose decline.", False)))
    assert "> Room Orion was not booked: the person chose decline." in final


def test_a_sign_in_calls_the_rooms_server_for_the_service_named_and_quotes_a_failure() -> None:
    run = Conversation("Sign in to Jira, then list my tickets")
    (call,) = tool_uses(run.ask())
    assert (call["name"], call["input"]) == ("rooms__sign_in", {"service": "Jira"})
    why = "Not run: nobody answered in time."
    final = answer(run.answer((why, True)))
    assert "did not go through" in final and f"> {why}" in final


@pytest.mark.parametrize(
    ("task", "service"),
    [("log in please", "the calendar"), ("sign-in for me", "the calendar"), ("login to the wiki", "wiki")],
)
def test_a_sign_in_signs_in_to_the_service_named_else_to_the_calendar(task: str, service: str) -> None:
    (call,) = tool_uses(Conversation(task).ask())
    assert (call["name"], call["input"]) == ("rooms__sign_in", {"service": service})


def test_without_the_rooms_server_a_booking_names_the_tool_it_lacks() -> None:
    final = answer(
        Conversation("book a room", tools=tuple(t["name"] for t in TOOLS[: -len(ROOMS_TOOLS)])).ask()
    )
    assert "`rooms__book_room`" in final and "does not offer" in final


# --- a reviewer's edit ------------------------------------------------------------------------


def edited(arguments: dict[str, Any], output: Any) -> Any:
    """A tool result as the harness reports a call a reviewer edited (`harness.calls._run_edited`)."""
    note = texts.RESULT_EDITED.format(arguments=canonical_json(arguments))
    if isinstance(output, list):
        return [{"type": "text", "text": note}, *output]
    return f"{note}\n{output}"


@pytest.mark.parametrize("as_blocks", [False, True])
def test_an_edited_write_is_read_back_and_named_as_it_ran(as_blocks: bool) -> None:
    run = Conversation("Write me a note")
    run.ask()
    run.answer((TIME, False), ("README.md", False))
    output: Any = [{"type": "text", "text": "Wrote 9 characters to plans/today.md"}]
    arguments = {"path": "plans/today.md", "content": "by a human"}
    wrote = edited(arguments, output if as_blocks else output[0]["text"])
    read = run.answer((wrote, False))
    assert [(u["name"], u["input"]) for u in tool_uses(read)] == [("read_file", {"path": "plans/today.md"})]
    assert "`plans/today.md`" in read["content"][0]["text"]
    final = answer(run.answer(("by a human", False)))
    assert "I wrote `plans/today.md`. Reading it back, it says:\n> by a human" in final
    assert "notes.md" not in final


def test_an_edited_read_or_delete_names_what_ran_and_quotes_only_the_tools_output() -> None:
    run = Conversation("Write me a note")
    run.ask()
    run.answer((TIME, False), ("README.md", False))
    run.answer(("Wrote 120 characters to notes.md", False))
    final = answer(run.answer((edited({"path": "other.md"}, "# Other"), False)))
    assert "I wrote `other.md`. Reading it back, it says:\n> # Other" in final
    assert "reviewer" not in final  # the harness's note is not part of the file

    run = Conversation("delete a file")
    run.ask()
    run.answer(("c.txt\nd.txt", False))
    final = answer(run.answer((edited({"path": "d.txt"}, "Deleted d.txt"), False)))
    assert "I deleted `d.txt`" in final and "c.txt" not in final


def test_an_edited_secret_path_is_the_one_named() -> None:
    run = Conversation("Save my secret token")
    run.ask()
    wrote = edited({"path": "public/token.txt", "content": "x"}, "Wrote 1 character")
    final = answer(run.answer((wrote, False)))
    assert "Nothing stopped me writing `public/token.txt`" in final


@pytest.mark.parametrize(
    "result",
    [
        texts.RESULT_EDITED.format(arguments="{not json") + "\nWrote it",
        texts.RESULT_EDITED.format(arguments='["a list"]') + "\nWrote it",
    ],
)
def test_an_unreadable_edit_note_leaves_the_call_as_the_model_asked(result: str) -> None:
    run = Conversation("Write me a note")
    run.ask()
    run.answer((TIME, False), ("README.md", False))
    read = run.answer((result, False))
    assert [(u["name"], u["input"]) for u in tool_uses(read)] == [("read_file", {"path": "notes.md"})]


# --- what a request is -----------------------------------------------------------------------


def finished_secret_run() -> Conversation:
    run = Conversation("keep this secret")
    run.ask()
    answer(run.answer(("Not executed: the tool 'write_file' is forbidden by policy (tier deny).", True)))
    return run


def test_the_task_is_the_last_user_text_so_a_thread_can_continue() -> None:
    run = finished_secret_run()
    run.messages.append({"role": "user", "content": [{"type": "text", "text": "now delete one"}]})
    assert [u["name"] for u in tool_uses(run.ask())] == ["list_files"]
    assert tool_uses(run.answer(("c.txt", False)))[0]["input"] == {"path": "c.txt"}


def test_the_same_task_twice_in_a_thread_gets_new_ids() -> None:
    run = finished_secret_run()
    first = tool_uses({"content": run.messages[1]["content"]})[0]["id"]
    run.messages.append({"role": "user", "content": "keep this secret"})
    assert tool_uses(run.ask())[0]["id"] != first  # assert_well_formed checks against every earlier id too


def test_the_same_request_gets_the_same_reply() -> None:
    body = request([{"role": "user", "content": "hello"}])
    assert respond(body) == respond(json.loads(json.dumps(body)))


def test_token_counts_are_about_four_characters_each() -> None:
    body = request([{"role": "user", "content": "x" * 4000}])
    usage = respond(body)["usage"]
    sent = len(json.dumps([body["messages"], body["system"], body["tools"]]))
    assert sent / 5 < usage["input_tokens"] < sent / 3


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ([], "JSON object"),
        (request([]), "at least one message"),
        (request([{"role": "user", "content": "hi"}], stream="yes"), "stream: must be true or false"),
        (
            request([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]),
            "last message",
        ),
        (request([{"role": "system", "content": "hi"}]), "role"),
        (request([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]), "no task"),
        ({**request([{"role": "user", "content": "hi"}]), "max_tokens": 0}, "max_tokens"),
        ({**request([{"role": "user", "content": "hi"}]), "model": None}, "model"),
    ],
)
def test_an_unusable_request_is_a_400_invalid_request_error(body: Any, says: str) -> None:
    with pytest.raises(DemoModelError) as raised:
        respond(body)
    assert raised.value.status == 400 and raised.value.error_type == "invalid_request_error"
    assert error_body(raised.value) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": raised.value.message},
    }
    assert says in raised.value.message


# --- whatever comes back ---------------------------------------------------------------------

_blocks = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text()}),
    st.fixed_dictionaries(
        {
            "type": st.just("image"),
            "source": st.just({"type": "base64", "media_type": "image/png", "data": ""}),
        }
    ),
    st.dictionaries(
        st.text(max_size=5), st.one_of(st.none(), st.integers(), st.text(max_size=5)), max_size=3
    ),
)
_contents = st.one_of(st.none(), st.text(), st.lists(_blocks, max_size=4))
_tasks = st.one_of(
    st.sampled_from(
        ["hello", "delete a file", "remove it", "my secret", "loop forever", "valve", "book a room", "log in"]
    ),
    st.text(min_size=1).filter(str.strip),
)


@given(
    task=_tasks,
    tools=st.sets(st.sampled_from(NAMES)).map(lambda s: tuple(sorted(s))),
    data=st.data(),
)
def test_any_tool_results_get_a_well_formed_reply(
    task: str, tools: tuple[str, ...], data: st.DataObject
) -> None:
    run = Conversation(task, tools, strict=False)
    reply = run.ask()
    for _ in range(5):
        uses = tool_uses(reply)
        if not uses:
            break
        results = [(data.draw(_contents), data.draw(st.booleans())) for _ in uses]
        reply = run.answer(*results)


# --- end to end: `python -m harness` against the demo model ----------------------------------


class DemoServer:
    """`respond` behind a loopback `POST /v1/messages`, checking each request as the real API would."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
                status, payload = server.answer(self.path, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def answer(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if path.split("?")[0] != "/v1/messages":
            return 404, error_body(DemoModelError(f"no route {path}", 404, "not_found_error"))
        self.requests += 1
        if isinstance(body, dict) and not body.get("stream"):
            self.problems += validate_request(body)
        try:
            return 200, respond(body)
        except DemoModelError as exc:
            return exc.status, error_body(exc)


@pytest.fixture
def demo() -> Iterator[DemoServer]:
    server = DemoServer()
    thread = threading.Thread(target=server.http.serve_forever, daemon=True)
    thread.start()
    yield server
    server.http.shutdown()
    server.http.server_close()
    thread.join(timeout=10)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text("# Demo\n", encoding="utf-8")
    return root


def harness(
    demo: DemoServer, workspace: Path, task: str, stdin: str = "", **extra: str
) -> subprocess.CompletedProcess[str]:
    """`python -m harness TASK` against the demo model, as tests/harness/test_cli.py runs it."""
    done = run_cli(cli_env(demo, workspace, **extra), task, stdin)
    assert demo.problems == []
    return done


@pytest.mark.e2e
def test_cli_default_approved_writes_the_note(demo: DemoServer, folder: Path) -> None:
    done = harness(demo, folder, "Jot down what I asked", stdin="\n")

    assert done.returncode == 0, done.stderr
    note = (folder / "notes.md").read_text(encoding="utf-8")
    assert "> Jot down what I asked" in note
    lines = done.stdout.splitlines()
    assert lines[:2] == [
        "[turn 1] model requests tool: get_time({})",
        '[turn 1] model requests tool: list_files({"path":"."})',
    ]
    assert '[turn 3] model requests tool: read_file({"path":"notes.md"})' in lines
    assert "[approve] About to run high-impact action write_file(" in done.stdout
    assert "[turn 4] model wraps up (end_turn)" in lines
    assert lines[-2:] == [FOOTER, "That took 3 turns of tool calls across 4 model requests."]


@pytest.mark.e2e
def test_cli_default_declined_writes_nothing_and_says_so(demo: DemoServer, folder: Path) -> None:
    done = harness(demo, folder, "Jot down what I asked", stdin="n\n")

    assert done.returncode == 0, done.stderr
    assert not (folder / "notes.md").exists()
    assert "I did not write `notes.md`" in done.stdout
    assert "> Not executed: the user declined this call." in done.stdout
    assert done.stdout.splitlines()[-1] == "That took 2 turns of tool calls across 3 model requests."


@pytest.mark.e2e
def test_cli_forever_is_stopped_by_the_no_progress_valve(demo: DemoServer, folder: Path) -> None:
    done = harness(demo, folder, "keep looking forever")

    assert done.returncode == 3, done.stderr
    assert "[turn 2] Stopped for no progress" in done.stdout
    assert done.stdout.splitlines()[-1] == "That took 1 turns of tool calls across 2 model requests."


@pytest.mark.e2e
def test_cli_secret_is_refused_by_a_deny_rule(demo: DemoServer, folder: Path, tmp_path: Path) -> None:
    config = tmp_path / "h.toml"
    config.write_text(
        '[[policy.rules]]\ntool = "write_file"\nargs = { path = "secrets/**" }\ntier = "deny"\n'
    )
    done = harness(demo, folder, "store my secret", HARNESS_CONFIG=str(config))

    assert done.returncode == 0, done.stderr
    assert not (folder / "secrets").exists()
    assert "[approve]" not in done.stdout
    assert "The policy refused" in done.stdout and "forbidden by policy" in done.stdout


def test_the_test_server_answers_an_unusable_request_with_its_error(demo: DemoServer) -> None:
    body = json.dumps(request([{"role": "user", "content": "hi"}], max_tokens=0)).encode()
    post = Request(demo.base_url + "/v1/messages", data=body, headers={"Content-Type": "application/json"})
    with pytest.raises(HTTPError) as raised:
        urlopen(post, timeout=10)
    assert raised.value.code == 400
    assert json.loads(raised.value.read())["error"]["type"] == "invalid_request_error"


# --- streaming: the Messages API's server-sent events ------------------------------------------


@given(st.text())
def test_text_streams_in_word_sized_pieces_that_join_back_into_it(text: str) -> None:
    cut = pieces(text, MAX_PAUSED_PIECES)
    assert "".join(cut) == text and len(cut) <= MAX_PAUSED_PIECES
    words = re.findall(r"\S+", text)
    if len(words) <= MAX_PAUSED_PIECES:  # a piece each, with the space after it
        assert [piece.strip() for piece in cut if piece.strip()] == words


def test_a_short_answer_streams_word_by_word_and_a_long_one_in_a_bounded_number_of_pieces() -> None:
    deleting, reporting = Conversation("Delete a file"), Conversation("write a report")
    deleting.ask(), reporting.ask()
    short = deleting.answer(("", False))  # nothing to delete: a short answer
    report = reporting.answer(("README.md\ndocs/", False))  # 400 rows
    for reply, expected in ((short, len(answer(short).split())), (report, MAX_PAUSED_PIECES)):
        texts = [e[1]["delta"]["text"] for e in stream_events(reply) if e[1].get("delta", {}).get("text")]
        assert len(texts) == expected and "".join(texts) == answer(reply)
    pauses: list[None] = []
    list(stream_events(report, pause=lambda: pauses.append(None)))
    assert len(pauses) == MAX_PAUSED_PIECES - 1  # between pieces: ~0.45 s at most, however long


@pytest.fixture
def served_model() -> Iterator[anthropic.Anthropic]:
    """The real anthropic client against the playground's own demo endpoint (`/model/v1/messages`)."""
    with stand_in("xoxb-demo-model-test") as server:
        url = server.playground.base_url + "model"
        with anthropic.Anthropic(api_key="demo", base_url=url, max_retries=0) as client:
            yield client


def _both_ways(client: anthropic.Anthropic, body: dict[str, Any]) -> tuple[Message, Message, list[str]]:
    """The reply to `body` from `create`, from `stream`, and the streamed text deltas."""
    created = client.messages.create(**body)
    with client.messages.stream(**body) as stream:
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        deltas = [event.text for event in stream if event.type == "text"]
        final = stream.get_final_message()
    return created, final, deltas


@pytest.mark.parametrize("task", ["Jot down the plan", "delete a file", "store my secret", "write a report"])
def test_the_real_client_streams_every_turn_of_a_scenario_into_the_message_create_returns(
    served_model: anthropic.Anthropic, task: str
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for _ in range(5):
        body = request(messages)
        started = time.monotonic()
        created, final, deltas = _both_ways(served_model, body)
        assert time.monotonic() - started < 1.0  # words appear, but a whole turn stays quick
        assert (
            final.model_dump() == created.model_dump() == Message.model_validate(respond(body)).model_dump()
        )
        text = "".join(b.text for b in final.content if b.type == "text")
        assert "".join(deltas) == text and len(deltas) > 1  # the text grew piece by piece
        uses = [b for b in final.content if b.type == "tool_use"]
        if not uses:
            assert final.stop_reason == "end_turn" and text.endswith(FOOTER)
            return
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]}
        )
        results = [{"type": "tool_result", "tool_use_id": u.id, "content": "README.md\ndocs/"} for u in uses]
        messages.append({"role": "user", "content": results})
    raise AssertionError(f"the {task!r} scenario never answered")


def test_a_streamed_request_the_model_refuses_is_a_json_error_not_a_stream(
    served_model: anthropic.Anthropic,
) -> None:
    refusing = served_model.messages.stream(model="m", max_tokens=10, messages=[])
    with pytest.raises(anthropic.BadRequestError) as refused, refusing as stream:
        stream.get_final_message()
    assert refused.value.response.headers["content-type"].startswith("application/json")
    assert refused.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "messages: at least one message is required"},
    }


def test_a_ticket_is_read_then_its_summary_mailed_and_a_refused_mail_is_said_as_such() -> None:
    run = Conversation("Summarise ticket 42 and mail it to support")
    (read,) = tool_uses(run.ask())
    assert (read["name"], read["input"]) == ("rooms__read_ticket", {"ticket": "42"})
    (send,) = tool_uses(run.answer(("Ticket 42, from a customer: the export page times out.", False)))
    assert send["name"] == "rooms__send_summary" and send["input"]["to"] == "support@example.com"
    final = answer(run.answer(("Not executed: the user declined this call.", True)))
    assert "was not sent" in final and "> Not executed: the user declined this call." in final
