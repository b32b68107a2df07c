"""An MCP tool's input is checked against the server's inputSchema before anyone is asked.

Seen: a person approved a call the server then rejected. `Tool.checked` now raises `BadInput`
with a short message; a hostile or broken schema refuses the call, never crashes, never fetches.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from harness.tools import ToolContext, ToolResult
from harness.tools.base import BadInput, Tool
from harness.tools.catalog import Catalog
from harness.tools.mcp_listing import Listing, McpTool, tools_of
from harness.tools.schemas import schema_problem

TICKET = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^T-[0-9]+$"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["id"],
    "additionalProperties": False,
}


class Recorder:
    """An `McpHost` that only records what reached it: the proof that nothing was sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def listing(self) -> Listing:
        return Listing()

    def call(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        side_effects: bool,
        reply: Any = None,
        who: Any = None,
        receipt: Any = None,
    ) -> ToolResult:
        self.sent.append(arguments)
        return ToolResult("done")


def mcp_tool(schema: Any, host: Recorder | None = None) -> Tool:
    info = McpTool(server="desk", name="file", description="File a ticket.", input_schema=schema)
    return tools_of(host or Recorder(), Listing(tools=(info,)))[0]


def problems(schema: Any, raw: Any) -> str:
    with pytest.raises(BadInput) as caught:
        mcp_tool(schema).checked(raw)
    return str(caught.value)


def test_input_that_fits_the_schema_passes_unchanged() -> None:
    raw = {"id": "T-7", "tags": ["printer"], "priority": 2}
    assert mcp_tool(TICKET).checked(raw) == raw


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({}, "input: 'id' is a required property"),
        ({"id": 7}, "id: the value is not of type 'string'"),
        ({"id": "T-1", "priority": 9}, "priority: the value is greater than the maximum of 5"),
        ({"id": "T-1", "tags": ["a", 2]}, "tags.1: the value is not of type 'string'"),
        ({"id": "T-1", "owner": "me"}, "Additional properties are not allowed ('owner' was unexpected)"),
        ({"id": "ticket one"}, "id: the value does not match '^T-[0-9]+$'"),
        ("T-1", "input: must be a JSON object"),
        (["T-1"], "input: must be a JSON object"),
    ],
)
def test_input_that_does_not_fit_is_bad_input_saying_where_and_what(raw: Any, expected: str) -> None:
    assert expected in problems(TICKET, raw)


def test_the_message_stays_short_whatever_the_input() -> None:
    huge = {"id": "x" * 100_000, "tags": ["y" * 50_000] * 20, "priority": "z" * 50_000}
    message = problems(TICKET, huge)
    assert len(message) < 700 and "xxxxxxxxxx" not in message


def test_a_call_that_does_not_fit_never_reaches_the_server(tmp_path: Path) -> None:
    host = Recorder()
    catalog = Catalog([mcp_tool(TICKET, host)])
    refused = catalog.registry().run("desk__file", {"id": 3}, ToolContext(workspace=tmp_path))
    ran = catalog.registry().run("desk__file", {"id": "T-3"}, ToolContext(workspace=tmp_path))
    assert refused.is_error and "invalid input for desk__file" in refused.content
    assert not ran.is_error and host.sent == [{"id": "T-3"}]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"n": {"type": "a-number-please"}}},
        {"type": "object", "required": "id"},
        {"type": "object", "properties": {"n": {"minimum": "five"}}},
        ["not", "an", "object"],
        "object",
    ],
)
def test_an_invalid_schema_refuses_the_call_and_raises_nothing_else(schema: Any) -> None:
    """Fail closed: a schema that cannot be used never lets an unchecked call through to a card.
    (The hub does not even offer such a tool: `schema_problem` says why in its log line.)"""
    host = Recorder()
    with pytest.raises(BadInput) as caught:
        mcp_tool(schema, host).checked({"n": 1})
    assert "could not be checked against the tool's inputSchema" in str(caught.value)
    assert schema_problem(schema) and host.sent == []


def test_a_deeply_nested_schema_is_refused_not_a_crash() -> None:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(5_000):
        schema = {"type": "object", "properties": {"a": schema}}
    assert schema_problem(schema)
    with pytest.raises(BadInput):
        mcp_tool(schema).checked({})


def test_a_schema_in_another_dialect_is_read_in_its_own() -> None:
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]}},
    }
    assert mcp_tool(draft7).checked({"pair": ["a", 1]}) == {"pair": ["a", 1]}
    assert "pair.1" in problems(draft7, {"pair": ["a", "b"]})


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server that records every request: a `$ref` must never be fetched."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            hits.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()
    server.server_close()


def test_a_remote_ref_is_never_fetched_and_the_call_is_refused(listener: tuple[str, list[str]]) -> None:
    """jsonschema's default registry would fetch it with urllib: a server could make the worker
    request any address it can reach (cloud metadata, the Redis port) with every call."""
    url, hits = listener
    schema = {"type": "object", "properties": {"id": {"$ref": f"{url}/secret"}}}
    with pytest.raises(BadInput) as caught:
        mcp_tool(schema).checked({"id": "T-1"})
    assert "could not be checked" in str(caught.value) and hits == []


def test_a_local_ref_resolves() -> None:
    schema = {
        "type": "object",
        "$defs": {"id": {"type": "string"}},
        "properties": {"id": {"$ref": "#/$defs/id"}},
    }
    assert mcp_tool(schema).checked({"id": "T-1"}) == {"id": "T-1"}
    assert "id: the value is not of type 'string'" in problems(schema, {"id": 1})
