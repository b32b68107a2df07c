"""What an MCP server can make the harness read, and send on to the model: bounded, in linear time.

A server is hostile until shown otherwise. What it answers is bounded three times over:

1. On the wire (stdio): a message is read as one line of at most `WIRE_LINE_MAX` bytes, in time
   linear in its size. The SDK's own reader joined each 64 KB chunk onto the line so far (a 60 MB
   answer did not finish within a 30 s call timeout; 16 MB took 1.6 s of CPU, now 0.06 s);
   `bound_stdio_reads` hands it whole lines instead. A longer line is
   skipped, not kept: the call it answers gets an error saying so.
2. In `convert_result`, before anything is built: at most `BLOCKS_MAX` content blocks are looked
   at, images are checked (type, base64, the bytes' own signature) and capped in number, each
   one's size and all of one result's together; text is cut to `RESULT_LIMIT_CHARS`.
3. Across the relay to a work horse: `RELAY_LINE_MAX`, which any result of (2) fits.

The caps are well inside the Messages API's limits, so that no request is refused because of what
a tool returned (a refused request would be refused again on every retry of the run):
5 MB per image (counted on its base64) and 32 MB per request.
"""

from __future__ import annotations

import binascii
import codecs
import contextvars
import json
import re
from collections.abc import Callable
from typing import Any

import anyio

from harness import texts
from harness.tools.base import ToolResult, cut_blocks

_MB = 1024 * 1024
# Past this, a message is not read. Far above any result the model can be sent (a cut answer still
# tells the model how long it was), and a bound on the memory one answer takes while it is parsed.
WIRE_LINE_MAX = 64 * _MB
# 4 MB of base64 (~3 MB of image) against the API's 5 MB per image: room for a different count.
IMAGE_MAX_BASE64 = 4 * _MB
# A model looks at a handful of pictures per answer; the API takes at most 100 images per request.
IMAGES_MAX = 4
# All of one result's images: 6 MB, so four results of one turn (parallel calls) stay under the
# API's 32 MB per request with the rest of the conversation. Older turns' images are replaced by
# a placeholder in later requests (harness.loop), so they never add up across turns.
IMAGES_TOTAL_BASE64 = 6 * _MB
# Content blocks looked at; a server that answers a million tiny blocks costs no more than this.
BLOCKS_MAX = 100
# A result crosses the relay as JSON: its images (IMAGES_TOTAL_BASE64) plus its text, at most
# RESULT_LIMIT_CHARS characters that JSON may escape to 6 bytes each, plus the notes. A listing
# (every server's tools and schemas) and a call's arguments (what the model wrote) are far smaller.
RELAY_LINE_MAX = 16 * _MB

_IMAGE_SIGNATURES = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),  # and "WEBP" at offset 8, checked below
}
_REPEAT_MIN = 64  # a value of structuredContent this long that repeats a block is sent once
_REPEATS_MAX = 8  # the longest repeats looked for: each costs one pass over the JSON


# --- results -----------------------------------------------------------------------------------


class _ImageBudget:
    """The images one result may still bring."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0

    def refusal(self, data: str, mime_type: str) -> str | None:
        """Why this image is left out, or None to keep it (and count it)."""
        if mime_type not in _IMAGE_SIGNATURES:
            return texts.MCP_IMAGE_TYPE.format(mime_type=mime_type[:60])
        if len(data) > IMAGE_MAX_BASE64:
            return texts.MCP_IMAGE_TOO_LARGE.format(size=len(data), limit=IMAGE_MAX_BASE64)
        if self.count >= IMAGES_MAX:
            return texts.MCP_IMAGE_TOO_MANY.format(limit=IMAGES_MAX)
        if self.total + len(data) > IMAGES_TOTAL_BASE64:
            return texts.MCP_IMAGES_TOO_LARGE.format(limit=IMAGES_TOTAL_BASE64)
        problem = _image_problem(data, mime_type)
        if problem is None:
            self.count += 1
            self.total += len(data)
        return problem


def _image_problem(data: str, mime_type: str) -> str | None:
    """Why the API would refuse `data` as a `mime_type` image (not base64, not that type), or None."""
    try:
        raw = binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):
        return texts.MCP_IMAGE_NOT_BASE64
    webp_ok = mime_type != "image/webp" or raw[8:12] == b"WEBP"
    if not raw.startswith(_IMAGE_SIGNATURES[mime_type]) or not webp_ok:
        return texts.MCP_IMAGE_NOT_ITS_TYPE.format(mime_type=mime_type)
    return None


def convert_result(result: Any) -> ToolResult:
    """An MCP `CallToolResult` as a `tool_result`: text as text, images as images, within the caps.

    `structuredContent` becomes JSON text when no text came with it, with what repeats a content
    block (an image's base64, say) named instead of sent twice; `isError` is `is_error`.
    """
    content = list(result.content or [])
    images = _ImageBudget()
    blocks = [_block(item, images) for item in content[:BLOCKS_MAX]]
    if len(content) > BLOCKS_MAX:
        blocks.append(_text(texts.MCP_BLOCKS_LEFT_OUT.format(count=len(content) - BLOCKS_MAX)))
    wrote_text = any(getattr(item, "type", "") in ("text", "resource") for item in content)
    if not wrote_text and result.structured_content is not None:
        blocks.insert(0, _text(_structured(result.structured_content, content[:BLOCKS_MAX])))
    blocks = cut_blocks(blocks)
    is_error = bool(result.is_error)
    if all(b["type"] == "text" for b in blocks):
        return ToolResult("\n".join(b["text"] for b in blocks) or texts.MCP_EMPTY_RESULT, is_error)
    return ToolResult(blocks, is_error)


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _block(item: Any, images: _ImageBudget) -> dict[str, Any]:
    kind = getattr(item, "type", "")
    if kind == "text":
        return _text(item.text)
    if kind == "image":
        refusal = images.refusal(item.data, item.mime_type)
        if refusal is not None:
            return _text(texts.MCP_IMAGE_DROPPED.format(why=refusal))
        source = {"type": "base64", "media_type": item.mime_type, "data": item.data}
        return {"type": "image", "source": source}
    if kind == "audio":
        return _text(texts.MCP_AUDIO_DROPPED)
    if kind == "resource":
        resource = item.resource
        body = getattr(resource, "text", None)
        text = body if body is not None else texts.MCP_BLOB_RESOURCE.format(uri=resource.uri)
        return _text(f"[resource {resource.uri}]\n{text}")
    if kind == "resource_link":
        return _text(f"[resource link: {item.name} {item.uri}]")
    return _text(texts.MCP_CONTENT_DROPPED.format(kind=str(kind or "unknown")[:40]))


def _structured(value: Any, content: list[Any]) -> str:
    """`structuredContent` as JSON text, each long value that repeats a content block named instead."""
    try:
        dumped = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # a structure nested past what JSON can write
        return texts.MCP_STRUCTURED_UNREADABLE
    repeats: dict[str, int] = {}
    for number, item in enumerate(content, 1):
        payload = getattr(item, "data", None) or getattr(item, "text", None)
        if isinstance(payload, str) and len(payload) >= _REPEAT_MIN:
            repeats.setdefault(payload, number)
    # Whole JSON strings only (quotes included), replaced by a JSON string: the text stays JSON.
    # One pass per repeat, over the few longest: linear in the answer, however many blocks it has.
    for payload in sorted(repeats, key=len, reverse=True)[:_REPEATS_MAX]:
        same = json.dumps(texts.MCP_SAME_AS_BLOCK.format(number=repeats[payload]))
        dumped = dumped.replace(json.dumps(payload, ensure_ascii=False), same)
    return dumped


# --- the stdio wire ----------------------------------------------------------------------------

# The id of a JSON-RPC message, where SDKs write it: first after "jsonrpc" (Python), or last (TypeScript).
_ID = rb'"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,200}")'
_ID_FIRST = re.compile(rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?' + _ID)
_ID_LAST = re.compile(_ID + rb"\s*\}\s*$")
_KEPT_ENDS = 512  # bytes kept of each end of a line past the limit, to find its id
# Where a line of a server's stdout that is not JSON-RPC goes (its `StderrLog.junk`: one escaped,
# rate-limited log line) instead of the SDK's parser, which logs an ERROR with a traceback for each.
# Set around the spawn (`mcp_transports.StdioTransport`): the SDK's reader task inherits it.
STDOUT_JUNK: contextvars.ContextVar[Callable[[bytes], None] | None] = contextvars.ContextVar(
    "mcp_stdout_junk", default=None
)


class WholeLines:
    """The server's stdout as text that always ends at a line's end: the SDK's stdio reader then
    splits each line once. Linear in what is read; a line past `WIRE_LINE_MAX` is skipped, and
    answered for the server with an error to the request it answered (or, with no id to be found,
    the stream ends: the session is closed and opened again). A line that is not a JSON object
    (a banner, a stray print) goes to `STDOUT_JUNK`; a blank one is dropped.

    Stands in for `anyio.streams.text.TextReceiveStream`, which the SDK builds with these arguments.
    """

    def __init__(self, transport_stream: Any, encoding: str = "utf-8", errors: str = "strict") -> None:
        self._stream = transport_stream
        self._decoder = codecs.getincrementaldecoder(encoding)(errors=errors)
        self._parts: list[bytes] = []
        self._size = 0
        self._head: bytes | None = None  # set while skipping a line past the limit
        self._tail = b""
        self._junk = STDOUT_JUNK.get()

    def __aiter__(self) -> WholeLines:
        return self

    async def __anext__(self) -> str:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def receive(self) -> str:
        while True:
            lines = self._feed(await self._stream.receive())
            if lines:
                return self._decoder.decode(lines)

    async def aclose(self) -> None:
        await self._stream.aclose()

    def _feed(self, chunk: bytes) -> bytes:
        """The whole lines `chunk` completes, each ending in a newline."""
        lines, start = [], 0
        while (end := chunk.find(b"\n", start)) >= 0:
            line = self._end_line(chunk[start : end + 1])
            start = end + 1
            if self._junk is not None and not line.lstrip().startswith((b"{", b"[")):
                if line.strip():
                    self._junk(line)
                continue
            lines.append(line)
        self._keep(chunk[start:])
        return b"".join(lines)

    def _keep(self, data: bytes) -> None:
        if not data:
            return
        if self._head is not None:
            self._tail = (self._tail + data)[-_KEPT_ENDS:]
            return
        self._parts.append(data)
        self._size += len(data)
        if self._size > WIRE_LINE_MAX:
            joined = b"".join(self._parts)
            self._head, self._tail = joined[:_KEPT_ENDS], joined[-_KEPT_ENDS:]
            self._parts, self._size = [], 0

    def _end_line(self, end: bytes) -> bytes:
        if self._head is None:
            line = b"".join([*self._parts, end])
            self._parts, self._size = [], 0
            if len(line) <= WIRE_LINE_MAX:
                return line
            head, tail = line[:_KEPT_ENDS], line[-_KEPT_ENDS:]
        else:
            head, tail = self._head, (self._tail + end)[-_KEPT_ENDS:]
            self._head, self._tail = None, b""
        return _too_large(head, tail)


def _too_large(head: bytes, tail: bytes) -> bytes:
    """The error answer that stands for a message past the limit; no id found: the stream ends."""
    found = _ID_FIRST.search(head) or _ID_LAST.search(tail.rstrip(b"\r\n"))
    if found is None:
        raise anyio.EndOfStream
    limit = f"{WIRE_LINE_MAX // _MB} MB" if WIRE_LINE_MAX % _MB == 0 else f"{WIRE_LINE_MAX:,} bytes"
    message = texts.MCP_ANSWER_TOO_LARGE.format(limit=limit)
    error = {"code": -32099, "message": message}  # JSON-RPC's range for a server error of its own
    body = json.dumps({"jsonrpc": "2.0", "error": error})[:-1]
    return body.encode() + b', "id": ' + found.group(1) + b"}\n"


def bound_stdio_reads() -> None:
    """Have the SDK's stdio client read through `WholeLines` (idempotent; the hub calls it)."""
    import mcp.client.stdio as sdk_stdio

    sdk_stdio.TextReceiveStream = WholeLines  # type: ignore[assignment,misc]
