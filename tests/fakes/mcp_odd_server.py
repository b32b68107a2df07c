"""A hostile MCP server for the tests, on the `mcp` package's low-level server API.

    python tests/fakes/mcp_odd_server.py stdio
    python tests/fakes/mcp_odd_server.py http PORT

The high-level API keeps tools in a dict and cannot list two of one name; this one lists
whatever it likes: two tools named `twin`, a name too long for the Messages API once it is
prefixed with the server's name, a name with a dot, and tools whose results are huge (`big_text`
answers `chars` characters), full of images (`images`), an image repeated in
`structuredContent` as `read_media_file` of `@modelcontextprotocol/server-filesystem` does
(`media`), audio (`audio`), or images the API would refuse (`bad_image`).
`readOnlyHint: true` is claimed by every tool, including the destructive `wipe`.
Every call is appended as one JSON line to `MCP_CALL_LOG` (when set).
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server

LONG_NAME = "l" * 60  # "odd__" + 60 characters is 65: one past the API's 64
PIXEL = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
).decode()
_CLAIMS = types.ToolAnnotations(read_only_hint=True)
_OBJECT = {"type": "object", "properties": {}}


def _tool(name: str, description: str, **properties: str) -> types.Tool:
    schema = {"type": "object", "properties": {k: {"type": v} for k, v in properties.items()}}
    return types.Tool(name=name, description=description, input_schema=schema, annotations=_CLAIMS)


TOOLS = [
    _tool("echo", "Say `text` back.", text="string"),
    _tool("twin", "The first of two tools named twin."),
    _tool("twin", "The second of two tools named twin."),
    _tool(LONG_NAME, "A name the API refuses once prefixed."),
    _tool("has.dot", "A name MCP allows and the API refuses."),
    _tool("wipe", "Deletes everything (and claims to be read-only)."),
    _tool("big_text", "Answers `chars` characters of text.", chars="integer"),
    _tool("images", "Answers `count` images of `kb` KB of base64 each.", count="integer", kb="integer"),
    _tool("media", "An image, and the same image again in structuredContent (as server-filesystem does)."),
    _tool("audio", "A caption and an audio block."),
    _tool("bad_image", "An image that is not base64, and one whose bytes are not of its type."),
]


def _log(tool: str, arguments: dict[str, Any]) -> None:
    path = os.environ.get("MCP_CALL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"tool": tool, "arguments": arguments, "pid": os.getpid()}) + "\n")


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


async def list_tools(_ctx: Any, _params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(_ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    _log(params.name, args)
    if params.name == "echo":
        return types.CallToolResult(content=[_text(str(args.get("text", "")))])
    if params.name == "wipe":
        return types.CallToolResult(content=[_text("wiped everything")])
    if params.name == "big_text":
        return types.CallToolResult(content=[_text("y" * int(args["chars"]))])
    if params.name == "images":
        # A real PNG's bytes padded to `kb` KB of base64: the harness may look at the header.
        data = base64.b64encode(base64.b64decode(PIXEL).ljust(int(args["kb"]) * 768, b"\0")).decode()
        images = [types.ImageContent(type="image", data=data, mime_type="image/png")] * int(args["count"])
        return types.CallToolResult(content=[_text("here they are"), *images])
    if params.name == "media":
        item = {"type": "image", "data": PIXEL, "mimeType": "image/png"}
        image = types.ImageContent(type="image", data=PIXEL, mime_type="image/png")
        return types.CallToolResult(content=[image], structured_content={"content": [item]})
    if params.name == "audio":
        sound = types.AudioContent(type="audio", data=PIXEL, mime_type="audio/wav")
        return types.CallToolResult(content=[_text("a beep"), sound])
    if params.name == "bad_image":
        gif = base64.b64encode(b"GIF89a" + b"\0" * 30).decode()
        return types.CallToolResult(
            content=[
                types.ImageContent(type="image", data="not base64 at all!", mime_type="image/png"),
                types.ImageContent(type="image", data=gif, mime_type="image/png"),
            ]
        )
    return types.CallToolResult(content=[_text(f"no tool {params.name}")], is_error=True)


server = Server("odd", on_list_tools=list_tools, on_call_tool=call_tool)


async def _stdio() -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "stdio":
        import anyio

        anyio.run(_stdio)
        return
    import uvicorn

    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")


if __name__ == "__main__":
    main()
