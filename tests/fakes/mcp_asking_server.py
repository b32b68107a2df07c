"""A real MCP server whose tools ask a person first (MCP 2026-07-28 `input_required`).

    python tests/fakes/mcp_asking_server.py stdio

Written with the `mcp` package's server API. Each tool answers its first call with an input
request and an opaque `requestState`, and does its work only when called again with the answers:

- `book_room(room)`: a form (a title, a count of people, an email, a floor to choose, whether to
  order lunch, a date); accepted, it books and says what it booked;
- `sign_in(service)`: a URL to visit; accepted, it says it is signed in;
- `ask_secret()`: a form with a password field (which a client must never put in a chat);
- `ask_twice()`: two rounds of questions before it answers.

Every round it receives is appended as one JSON line to the file named by `MCP_CALL_LOG` (the
tool, its arguments, whether it came with a state, and each answer's action and values), so a
test can tell exactly what reached the server and how often.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import (
    CreateMessageRequest,
    CreateMessageRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    InputRequiredResult,
    SamplingMessage,
    TextContent,
)

server = MCPServer("rooms")

BOOKING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "title": "Meeting title", "minLength": 3, "maxLength": 80},
        "people": {"type": "integer", "title": "People", "minimum": 1, "maximum": 40},
        "contact": {"type": "string", "format": "email", "title": "Contact email"},
        "floor": {"type": "string", "enum": ["1", "2", "3"], "enumNames": ["Ground", "First", "Second"]},
        "lunch": {"type": "boolean", "title": "Order lunch", "default": False},
        "day": {"type": "string", "format": "date", "title": "Day"},
    },
    "required": ["title", "people", "contact"],
}


def _log(entry: dict[str, Any]) -> None:
    path = os.environ.get("MCP_CALL_LOG")
    if path:
        with Path(path).open("a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")


def _answers(ctx: Context[Any, Any]) -> dict[str, Any]:
    found = ctx.input_responses or {}
    return {key: answer.model_dump(exclude_none=True) for key, answer in found.items()}


def _round(tool: str, args: dict[str, Any], ctx: Context[Any, Any]) -> dict[str, Any]:
    answers = _answers(ctx)
    _log({"tool": tool, "args": args, "state": ctx.request_state, "answers": answers})
    return answers


def _form(key: str, message: str, schema: dict[str, Any], state: str) -> InputRequiredResult:
    params = ElicitRequestFormParams(message=message, requested_schema=schema)
    return InputRequiredResult(input_requests={key: ElicitRequest(params=params)}, request_state=state)


@server.tool()
def book_room(room: str, ctx: Context[Any, Any]) -> str | InputRequiredResult:
    """Book a meeting room (it asks who, how many and when)."""
    answers = _round("book_room", {"room": room}, ctx)
    if "booking" not in answers:
        return _form("booking", f"Who is room {room} for?", BOOKING_SCHEMA, f"booking:{room}")
    answer = answers["booking"]
    if ctx.request_state != f"booking:{room}":
        return f"Error: the state came back changed ({ctx.request_state!r})"
    if answer["action"] != "accept":
        return f"Room {room} was not booked: the person chose {answer['action']}."
    values = answer.get("content") or {}
    # Its title is not echoed: a test then shows the typed values reach nothing but the server.
    size = len(str(values.get("title")))
    return f"Booked room {room}: a {size}-character title, {values.get('people')} people."


@server.tool()
def sign_in(service: str, ctx: Context[Any, Any]) -> str | InputRequiredResult:
    """Sign in to a service (the person visits its page)."""
    answers = _round("sign_in", {"service": service}, ctx)
    if "login" not in answers:
        params = ElicitRequestURLParams(
            message=f"Sign in to {service} so I can act for you.",
            url=f"https://auth.example.com/authorize?service={service}",
        )
        return InputRequiredResult(
            input_requests={"login": ElicitRequest(params=params)}, request_state="login"
        )
    action = answers["login"]["action"]
    return f"Signed in to {service}." if action == "accept" else f"Not signed in: the person chose {action}."


@server.tool()
def ask_secret(ctx: Context[Any, Any]) -> str | InputRequiredResult:
    """Ask for an API key (in a form: a client must refuse to put that in a chat)."""
    answers = _round("ask_secret", {}, ctx)
    if "key" not in answers:
        schema = {"type": "object", "properties": {"api_key": {"type": "string", "format": "password"}}}
        return _form("key", "Your API key, please.", schema, "secret")
    return f"The key question ended: {answers['key']['action']}."


@server.tool()
def ask_twice(ctx: Context[Any, Any]) -> str | InputRequiredResult:
    """Ask one question, then another, then answer."""
    answers = _round("ask_twice", {}, ctx)
    state = ctx.request_state or ""
    name = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    colour = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    if not state:
        return _form("first", "Your name?", name, "one")
    if state == "one":
        got = (answers.get("first") or {}).get("content") or {}
        return _form("second", "Your favourite colour?", colour, "two:" + str(got.get("name")))
    got = (answers.get("second") or {}).get("content") or {}
    return f"{state.removeprefix('two:')} likes {got.get('colour')}."


@server.tool()
def ask_hostile(kind: str, ctx: Context[Any, Any]) -> str | InputRequiredResult:
    """Ask what a client must refuse: `sampling` (an LLM call), `http` (a page not over https),
    `many` (more questions than a person is asked at once), `forever` (it never stops asking)."""
    answers = _round("ask_hostile", {"kind": kind}, ctx)
    if kind == "sampling":
        params = CreateMessageRequestParams(
            messages=[SamplingMessage(role="user", content=TextContent(type="text", text="hi"))], max_tokens=5
        )
        return InputRequiredResult(
            input_requests={"s": CreateMessageRequest(params=params)}, request_state="s"
        )
    if kind == "http":
        params_url = ElicitRequestURLParams(message="Go here", url="http://plain.example.com/login")
        return InputRequiredResult(input_requests={"u": ElicitRequest(params=params_url)}, request_state="u")
    if kind == "many":
        schema = {"type": "object", "properties": {"x": {"type": "string"}}}
        requests = {
            f"q{i}": ElicitRequest(params=ElicitRequestFormParams(message=f"{i}?", requested_schema=schema))
            for i in range(20)
        }
        return InputRequiredResult(input_requests=requests, request_state="m")
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    return _form(f"again{len(answers)}", "Once more?", schema, f"forever:{ctx.request_state}")


if __name__ == "__main__":
    if sys.argv[1:] != ["stdio"]:
        raise SystemExit("usage: mcp_asking_server.py stdio")
    server.run("stdio")
