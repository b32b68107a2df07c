"""The offline demo model: a scripted, stateless stand-in for the Messages API's `POST /v1/messages`.

`respond(request) -> message` answers a request body as `messages.create` sends it, with no network
and no key, so the playground runs the real harness end to end. A request with `"stream": true`
gets the same message, which `playground.demo_stream` tells as the API's server-sent events.

It is not Claude: everything is decided from `request["messages"]` and the names in
`request["tools"]`, the same request always gets the same reply, and every final answer says so in
its last line.

The task is the text of the last user message that has text; the run so far is the turns after it.
Its keywords (case-insensitive, at the start of a word of the task, checked in this order) pick a
scenario:

- "secret": `write_file` secrets/token.txt; then says what became of it (a `secrets/**` deny rule
  refuses it).
- "delete" or "remove": `list_files` ., then `delete_file` on the first plain file listed, then
  says whether it was deleted.
- "forever", "loop" or "valve": `list_files` . on every turn, never wrapping up, until the
  harness's no-progress valve stops the run.
- "report": `list_files` ., then a Markdown report with a 400-row table, longer than a Slack
  message holds (the product posts it cut, and whole as a file).
- "sign in", "sign-in", "log in" or "login": `rooms__sign_in` (the service named after "to"),
  whose server asks the requester to visit an address; then says what the tool said.
- "deploy": `rooms__deploy` (the service named after "deploy"), a pretend deploy that a rule with
  memory lets run twice an hour per channel; then says what the tool said.
- "book" or "room": `rooms__book_room` (the room named after "room"), whose server asks the
  requester a form; then says what the tool said.
- "ticket": `rooms__read_ticket` (the ticket named after "ticket"), then `rooms__send_summary`,
  which a flow makes wait for a person (the ticket is a stranger's words); then says what was sent.
- anything else: `get_time` and `list_files` . in one turn, then `write_file` notes.md (quoting the
  task and the time), then `read_file` notes.md unless the write failed or was declined, then an
  answer.

Every turn that calls tools starts with a text block saying what it is about to do (the intent an
approval card quotes). A scenario whose tools are not all offered answers at once, naming the
missing ones. Tool results are never trusted to have any shape.

A reviewer may edit a call's arguments before approving it: the call then runs with theirs, and its
tool result starts with the harness's note saying so (`texts.RESULT_EDITED`). The script follows
what ran, not what it asked: it reads back the file it was edited to write, and names the path that
was deleted or written.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness import texts

FOOTER = "_(offline demo model: scripted, not Claude)_"
NOTES_PATH = "notes.md"
SECRET_PATH = "secrets/token.txt"
SECRET_CONTENT = "demo-token-0000 (not a real secret)\n"
TASK_QUOTE_CHARS = 200
RESULT_QUOTE_CHARS = 300
NOTE_LINES_SHOWN = 8
CHARS_PER_TOKEN = 4
# The tools of the playground's own MCP server (`playground.rooms_server`), as a run is offered them.
ROOMS_BOOK = "rooms__book_room"
ROOMS_SIGN_IN = "rooms__sign_in"
ROOMS_DEPLOY = "rooms__deploy"
ROOMS_TICKET = "rooms__read_ticket"
ROOMS_SEND = "rooms__send_summary"

# The line `list_files` ends a long listing with ("… and 12 more"): a note, not a file name.
_MORE_ENTRIES = re.compile(re.escape(texts.FILE_MORE_ENTRIES).replace(re.escape("{more}"), r"[\d,]+"))
# The first line of a result whose call a reviewer edited: the note, then the arguments that ran.
_EDITED_PREFIX = texts.RESULT_EDITED.split("{arguments}")[0]


class DemoModelError(Exception):
    """A request the demo model cannot answer, as the Messages API would refuse it."""

    def __init__(self, message: str, status: int = 400, error_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type


def error_body(exc: DemoModelError) -> dict[str, Any]:
    """The Messages API's error body for `exc`."""
    return {"type": "error", "error": {"type": exc.error_type, "message": exc.message}}


# --- what the run has done so far ------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One tool call of an earlier turn and what came back for it.

    `input` is what the model asked; `edited`, a reviewer's arguments the call ran with instead
    (None when it ran as asked); `result`, the tool's own output, less the harness's note of an edit.
    """

    name: str
    input: Mapping[str, Any]
    result: str
    is_error: bool
    edited: Mapping[str, Any] | None = None

    @property
    def ran_with(self) -> Mapping[str, Any]:
        """The arguments the call actually ran with: the reviewer's edit, else the model's."""
        return self.edited if self.edited is not None else self.input


Turn = tuple[Call, ...]


@dataclass(frozen=True)
class Reply:
    """What the script says next: an intent or answer, and the calls (name, input) to make."""

    text: str
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()


@dataclass(frozen=True)
class Scenario:
    """A script: picked by `keywords`, needing the tools `needs`, `next_reply(task, turns)` says what next."""

    name: str
    keywords: tuple[str, ...]
    needs: tuple[str, ...]
    next_reply: Callable[[str, tuple[Turn, ...]], Reply] = field(repr=False)


# --- the front door --------------------------------------------------------------------------


def respond(request: Mapping[str, Any]) -> dict[str, Any]:
    """The demo model's reply to a Messages API request body; `DemoModelError` if it is unusable."""
    messages, offered = _checked(request)
    start, task = _task(messages)
    reply = _next_reply(task, messages[start + 1 :], offered)
    # The new reply's position makes its ids unique in the conversation, even if a task repeats.
    content = _content(reply, seed=f"{len(messages)}:{task}")
    return {
        "id": "msg_demo_" + _digest(_dumps(messages))[:24],
        "type": "message",
        "role": "assistant",
        "model": request["model"],
        "content": content,
        "stop_reason": "tool_use" if reply.calls else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": _tokens([messages, request.get("system"), request.get("tools")]),
            "output_tokens": _tokens(content),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def pick_scenario(task: str) -> Scenario:
    """The first scenario one of whose keywords starts a word of the task; the default one if none."""
    lowered = task.lower()
    return next(
        s
        for s in SCENARIOS
        if not s.keywords or any(re.search(rf"\b{re.escape(k)}", lowered) for k in s.keywords)
    )


def _next_reply(task: str, after_task: list[dict[str, Any]], offered: set[str]) -> Reply:
    """What the task's scenario does next, or an answer naming the tools it needs and lacks."""
    scenario = pick_scenario(task)
    missing = [name for name in scenario.needs if name not in offered]
    if missing:
        return _missing_tools(scenario, missing)
    return scenario.next_reply(task, _turns(after_task))


def _checked(request: Mapping[str, Any]) -> tuple[list[dict[str, Any]], set[str]]:
    """The request's messages and offered tool names, or `DemoModelError` saying what is wrong."""
    if not isinstance(request, Mapping):
        raise DemoModelError("the request body must be a JSON object")
    if not isinstance(request.get("stream", False), bool):
        raise DemoModelError("stream: must be true or false")
    if not isinstance(request.get("model"), str) or not request["model"]:
        raise DemoModelError("model: a model name is required")
    max_tokens = request.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise DemoModelError("max_tokens: a positive integer is required")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DemoModelError("messages: at least one message is required")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise DemoModelError(f"messages.{index}: each message needs a role of user or assistant")
    if messages[-1]["role"] != "user":
        raise DemoModelError("messages: the last message must be from the user (no prefilled replies)")
    return messages, _offered(request)


def _offered(request: Mapping[str, Any]) -> set[str]:
    tools = request.get("tools") or []
    if not isinstance(tools, list):
        raise DemoModelError("tools: must be a list of tools")
    choice = request.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "none":
        return set()  # the caller forbids tool use: as if none were offered
    return {t["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)}


def _task(messages: list[dict[str, Any]]) -> tuple[int, str]:
    """The index and text of the last user message that has text (not only tool results)."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message["role"] == "user" and (text := _own_text(message.get("content")).strip()):
            return index, text
    raise DemoModelError("messages: no user message has any text, so there is no task")


def _own_text(content: Any) -> str:
    """The text a message says itself: its string, or its text blocks (not text inside tool results)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(b["text"] for b in content if _is(b, "text") and isinstance(b.get("text"), str))


def _turns(after_task: list[dict[str, Any]]) -> tuple[Turn, ...]:
    """The turns of tool calls since the task, each call with its result (an error if none came)."""
    turns = []
    for index, message in enumerate(after_task):
        uses = [b for b in _blocks(message) if _is(b, "tool_use")] if message["role"] == "assistant" else []
        if not uses:
            continue
        following = after_task[index + 1] if index + 1 < len(after_task) else {}
        results = {b.get("tool_use_id"): b for b in _blocks(following) if _is(b, "tool_result")}
        turns.append(tuple(_call(use, results.get(use.get("id"))) for use in uses))
    return tuple(turns)


def _call(use: dict[str, Any], result: dict[str, Any] | None) -> Call:
    name, arguments = use.get("name"), use.get("input")
    name = name if isinstance(name, str) else ""
    arguments = arguments if isinstance(arguments, dict) else {}
    if result is None:
        return Call(name, arguments, "(no result came back for this call)", True)
    edited, text = _split_edit(result_text(result.get("content")))
    return Call(name, arguments, text, result.get("is_error") is True, edited)


def _split_edit(text: str) -> tuple[dict[str, Any] | None, str]:
    """A result's text as (the reviewer's edited arguments, the rest) when it starts with the
    harness's note of an edit; (None, the text) otherwise, or when the note's JSON is unreadable."""
    first, _, rest = text.partition("\n")
    if not first.startswith(_EDITED_PREFIX):
        return None, text
    try:
        edited = json.loads(first.removeprefix(_EDITED_PREFIX))
    except ValueError:
        return None, text
    return (edited, rest) if isinstance(edited, dict) else (None, text)


def result_text(content: Any) -> str:
    """A tool result's content as text: a string, or its text blocks, with other blocks named."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return str(content)
    parts = []
    for block in content:
        if _is(block, "text"):
            parts.append(str(block.get("text", "")))
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            parts.append(f"[{kind}]")
    return "\n".join(parts)


def _blocks(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def _is(block: Any, kind: str) -> bool:
    return isinstance(block, dict) and block.get("type") == kind


# --- the scenarios ---------------------------------------------------------------------------


def _default(task: str, turns: tuple[Turn, ...]) -> Reply:
    if not turns:
        return Reply(
            "Let me check the time and see what is in the workspace.",
            (("get_time", {}), ("list_files", {"path": "."})),
        )
    last = {call.name: call for call in turns[-1]}
    if "write_file" in last:
        wrote = last["write_file"]
        path = _path(wrote, NOTES_PATH)
        if wrote.is_error:
            return Reply(f"I did not write `{path}`. The harness said:\n{_quote(wrote.result)}")
        return Reply(f"Wrote `{path}`; let me read it back to check.", (("read_file", {"path": path}),))
    if "read_file" in last:
        return _read_back(last["read_file"])
    if "get_time" in last or "list_files" in last:
        return Reply(
            f"I'll write a short note to `{NOTES_PATH}` quoting your task and the time.",
            (("write_file", {"path": NOTES_PATH, "content": _note(task, last)}),),
        )
    return Reply("I have nothing more to do for this task.")


def _path(call: Call, asked: str) -> str:
    """The path `call` ran with (a reviewer may have edited it), else `asked`."""
    path = call.ran_with.get("path")
    return path if isinstance(path, str) and path else asked


def _note(task: str, last: Mapping[str, Call]) -> str:
    clock = last.get("get_time")
    time = (
        clock.result.strip() if clock and not clock.is_error and clock.result.strip() else "an unknown time"
    )
    listing = last.get("list_files")
    files = len(_plain_files(listing.result)) if listing and not listing.is_error else 0
    held = "1 file" if files == 1 else f"{files} files"
    lines = [
        "# Notes",
        "",
        "The task:",
        "",
        _quote(task, TASK_QUOTE_CHARS),
        "",
        f"Written at {time} by the offline demo model; the workspace held {held} besides folders.",
    ]
    return "\n".join(lines) + "\n"


def _read_back(read: Call) -> Reply:
    path = _path(read, NOTES_PATH)
    if read.is_error:
        return Reply(f"I wrote `{path}`, but reading it back failed:\n{_quote(read.result)}")
    lines = [line for line in read.result.splitlines() if line.strip()]
    shown = lines[:NOTE_LINES_SHOWN] + (["…"] if len(lines) > NOTE_LINES_SHOWN else [])
    return Reply(f"I wrote `{path}`. Reading it back, it says:\n" + _quote("\n".join(shown)))


def _delete(task: str, turns: tuple[Turn, ...]) -> Reply:
    if not turns:
        return Reply("Let me see what is in the workspace first.", (("list_files", {"path": "."}),))
    last = {call.name: call for call in turns[-1]}
    if "delete_file" in last:
        gone = last["delete_file"]
        path = _path(gone, "the file")
        if gone.is_error:
            return Reply(f"I did not delete `{path}`. The harness said:\n{_quote(gone.result)}")
        return Reply(f"I deleted `{path}`. The tool said:\n{_quote(gone.result)}")
    listing = last.get("list_files")
    if listing is None or listing.is_error:
        why = listing.result if listing else "no listing came back"
        return Reply(f"I could not list the workspace, so I deleted nothing:\n{_quote(why)}")
    files = _plain_files(listing.result)
    if not files:
        return Reply("There is nothing to delete: the workspace has no plain files, only folders or nothing.")
    return Reply(
        f"I'll delete `{files[0]}`, the first file in the workspace.", (("delete_file", {"path": files[0]}),)
    )


def _plain_files(listing: str) -> list[str]:
    """The file names of a `list_files` result: its lines, less folders (ending in "/") and notes."""
    notes = (texts.FILE_EMPTY_DIRECTORY, "")
    lines = listing.splitlines()
    return [n for n in lines if n not in notes and not n.endswith("/") and not _MORE_ENTRIES.fullmatch(n)]


def _secret(task: str, turns: tuple[Turn, ...]) -> Reply:
    if not turns:
        return Reply(
            f"I'll store the token in `{SECRET_PATH}`.",
            (("write_file", {"path": SECRET_PATH, "content": SECRET_CONTENT}),),
        )
    wrote = next((c for c in turns[-1] if c.name == "write_file"), None)
    path = _path(wrote, SECRET_PATH) if wrote else SECRET_PATH
    if wrote is None or not wrote.is_error:
        said = _quote(wrote.result) if wrote else "> (no result came back)"
        return Reply(f"Nothing stopped me writing `{path}`:\n{said}\nA `secrets/**` deny rule would.")
    who = "The policy refused" if "policy" in wrote.result.lower() else "The harness refused"
    return Reply(f"{who} to let me write `{path}`, so nothing was written. Why:\n{_quote(wrote.result)}")


def _forever(task: str, turns: tuple[Turn, ...]) -> Reply:
    # Deliberately the same turn every time: the harness's no-progress valve is what ends the run.
    return Reply("Checking the folder again…", (("list_files", {"path": "."}),))


def _report(task: str, turns: tuple[Turn, ...]) -> Reply:
    """A report longer than a Slack message holds: the product posts it cut, and whole as a file."""
    if not turns:
        return Reply(
            "I'll list the folder, then write up a long report on it.", (("list_files", {"path": "."}),)
        )
    listing = turns[0][0].result.strip() or "(nothing)"
    rows = "\n".join(f"| {n} | check {n} of the workspace | fine |" for n in range(1, 401))
    return Reply(
        f"# A long report\n\nThe folder holds:\n\n```\n{listing}\n```\n\n## Every check\n\n"
        f"| # | What | Outcome |\n|---|---|---|\n{rows}\n\nAll 400 checks passed.\n\n{FOOTER}"
    )


def _asked(tool: str, intent: str, arguments: dict[str, Any], said: str) -> Callable[..., Reply]:
    """A scenario of one call to the playground's `rooms` server, whose tool asks the requester
    first (the harness parks the run until they answer); then it says what the tool said."""

    def next_reply(task: str, turns: tuple[Turn, ...]) -> Reply:
        if not turns:
            return Reply(intent.format(**arguments), ((tool, arguments),))
        done = next((c for c in turns[-1] if c.name == tool), None)
        if done is None or done.is_error:
            why = done.result if done else "no result came back"
            return Reply(f"That did not go through. The harness said:\n{_quote(why)}")
        return Reply(f"{said}\n{_quote(done.result)}")

    return next_reply


def _book(task: str, turns: tuple[Turn, ...]) -> Reply:
    named = re.search(r"\broom\s+([A-Za-z0-9-]{1,20})\b", task, re.IGNORECASE)
    room = named[1] if named and named[1].lower() not in ("for", "on", "at", "in") else "Orion"
    intent = "I'll book room {room}; the rooms server will ask you the details."
    return _asked(ROOMS_BOOK, intent, {"room": room}, "The rooms server answered:")(task, turns)


def _sign_in(task: str, turns: tuple[Turn, ...]) -> Reply:
    named = re.search(
        r"\b(?:sign|log)[ -]?in (?:to|into|at) (?:the )?([A-Za-z0-9.-]{1,40})", task, re.IGNORECASE
    )
    service = named[1].rstrip(".") if named else "the calendar"
    intent = "I'll sign in to {service}; the rooms server will send you to its sign-in page."
    return _asked(ROOMS_SIGN_IN, intent, {"service": service}, "The rooms server answered:")(task, turns)


def _deploy(task: str, turns: tuple[Turn, ...]) -> Reply:
    named = re.search(r"\bdeploy (?:the )?([A-Za-z0-9.-]{1,40})", task, re.IGNORECASE)
    service = named[1].rstrip(".") if named else "web"
    return _asked(ROOMS_DEPLOY, "I'll deploy {service}.", {"service": service}, "The deploy answered:")(
        task, turns
    )


def _ticket(task: str, turns: tuple[Turn, ...]) -> Reply:
    """Read a ticket, then mail a summary of it: the mail waits for a person (a flow)."""
    named = re.search(r"\bticket\s+#?([A-Za-z0-9-]{1,20})\b", task, re.IGNORECASE)
    ticket = named[1] if named else "42"
    if not turns:
        return Reply(f"I'll read ticket {ticket}.", ((ROOMS_TICKET, {"ticket": ticket}),))
    last = turns[-1]
    read = next((c for c in last if c.name == ROOMS_TICKET), None)
    if read is not None:
        if read.is_error:
            return Reply(f"I could not read the ticket. The harness said:\n{_quote(read.result)}")
        summary = f"Ticket {ticket}: the export page times out."
        return Reply(
            "I'll mail the summary to the support team.",
            ((ROOMS_SEND, {"to": "support@example.com", "text": summary}),),
        )
    sent = next((c for c in last if c.name == ROOMS_SEND), None)
    if sent is None or sent.is_error:
        why = sent.result if sent else "no result came back"
        return Reply(f"The summary was not sent. The harness said:\n{_quote(why)}")
    return Reply(f"The summary went out:\n{_quote(sent.result)}")


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("deploy", ("deploy",), (ROOMS_DEPLOY,), _deploy),
    Scenario("sign-in", ("sign in", "sign-in", "log in", "login"), (ROOMS_SIGN_IN,), _sign_in),
    Scenario("booking", ("book", "room"), (ROOMS_BOOK,), _book),
    Scenario("ticket", ("ticket",), (ROOMS_TICKET, ROOMS_SEND), _ticket),
    Scenario("secret", ("secret",), ("write_file",), _secret),
    Scenario("delete", ("delete", "remove"), ("list_files", "delete_file"), _delete),
    Scenario("forever", ("forever", "loop", "valve"), ("list_files",), _forever),
    Scenario("report", ("report",), ("list_files",), _report),
    Scenario("default", (), ("get_time", "list_files", "write_file", "read_file"), _default),
)


def _missing_tools(scenario: Scenario, missing: Sequence[str]) -> Reply:
    names = ", ".join(f"`{name}`" for name in missing)
    return Reply(f"I cannot run the {scenario.name} demo: it needs {names}, which this run does not offer.")


# --- the reply -------------------------------------------------------------------------------


def _content(reply: Reply, seed: str) -> list[dict[str, Any]]:
    """The reply's content blocks: the text, then one `tool_use` per call, or the answer with a footer."""
    if not reply.calls:
        return [{"type": "text", "text": f"{reply.text}\n\n{FOOTER}"}]
    uses = [
        {"type": "tool_use", "id": tool_use_id(seed, index), "name": name, "input": arguments}
        for index, (name, arguments) in enumerate(reply.calls)
    ]
    return [{"type": "text", "text": reply.text}, *uses]


def tool_use_id(seed: str, index: int) -> str:
    """A `toolu_demo_…` id from the reply's position in the conversation, the task and the call's index."""
    return "toolu_demo_" + _digest(f"{seed}:{index}")[:24]


def _quote(text: str, limit: int = RESULT_QUOTE_CHARS) -> str:
    """`text` cut to `limit` characters as a quote block (each line starting "> ")."""
    text = text.strip() or "(nothing)"
    cut = text if len(text) <= limit else text[:limit].rstrip() + "…"
    return "\n".join(f"> {line}".rstrip() for line in cut.splitlines())


def _tokens(value: Any) -> int:
    return max(1, math.ceil(len(_dumps(value)) / CHARS_PER_TOKEN))


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()
