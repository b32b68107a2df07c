"""The demo model's reply as the Messages API streams one: server-sent events a client accumulates.

A request with ``"stream": true`` gets the same message `demo_model.respond` gives, told the way the
API tells it: ``message_start`` (the message with no content yet), then per content block
``content_block_start`` / ``content_block_delta``… / ``content_block_stop``, then ``message_delta``
(stop reason, output tokens) and ``message_stop``. The shapes are those the anthropic SDK's
accumulator (``anthropic/lib/streaming/_messages.py``) folds back into a message, so
``client.messages.stream(...).get_final_message()`` equals what ``messages.create(...)`` returns.

Text and thinking arrive in word-sized pieces, with a short pause after each so a person watching
the playground sees the words appear; a long answer is cut into fewer, larger pieces, so the pauses
of one reply never add up to more than about half a second.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

Json = dict[str, Any]
Event = tuple[str, Json]  # (event name, data)

PIECE_PAUSE_SECONDS = 0.015  # between two pieces of text: words appear, as from a model
MAX_PAUSED_PIECES = 30  # per reply: at most ~0.45 s of pauses, however long the answer
CONTENT_TYPE = "text/event-stream; charset=utf-8"


def stream_events(message: Mapping[str, Any], pause: Callable[[], None] = lambda: None) -> Iterator[Event]:
    """The events that stream `message` (a reply of `demo_model.respond`); `pause()` runs between
    two pieces of text, after the consumer has taken the first (a generator resumes only then)."""
    content = list(message["content"])
    usage = message["usage"]
    yield "message_start", {"type": "message_start", "message": _started(message)}
    yield "ping", {"type": "ping"}
    worded = sum(1 for block in content if block.get("type") in ("text", "thinking"))
    per_block = max(1, MAX_PAUSED_PIECES // max(1, worded))
    for index, block in enumerate(content):
        yield (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": _empty(block)},
        )
        for number, delta in enumerate(_deltas(block, per_block)):
            if number and delta["type"] in ("text_delta", "thinking_delta"):
                pause()
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message.get("stop_sequence")},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
    )
    yield "message_stop", {"type": "message_stop"}


def encode(event: Event) -> bytes:
    """One event as the wire carries it: ``event: NAME``, ``data: JSON`` and a blank line."""
    name, data = event
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def pieces(text: str, at_most: int) -> list[str]:
    """`text` cut into word-sized pieces (each word with the space after it), or into at most
    `at_most` runs of whole words when it has more; the pieces join back into `text`."""
    words = [piece for piece in re.findall(r"\S*\s*", text) if piece]
    if len(words) <= at_most:
        return words
    size = math.ceil(len(words) / at_most)
    return ["".join(words[start : start + size]) for start in range(0, len(words), size)]


def _started(message: Mapping[str, Any]) -> Json:
    """The message as ``message_start`` carries it: no content, no stop reason, no output yet."""
    started = copy.deepcopy(dict(message))
    started.update(content=[], stop_reason=None, stop_sequence=None)
    started["usage"] = {**started["usage"], "output_tokens": 1}  # the API's count so far, never 0
    return started


def _empty(block: Mapping[str, Any]) -> Json:
    """A block as ``content_block_start`` opens it: what its deltas fill in left empty."""
    kind = block.get("type")
    if kind == "text":
        return {**copy.deepcopy(dict(block)), "text": ""}
    if kind == "tool_use":
        return {**copy.deepcopy(dict(block)), "input": {}}
    if kind == "thinking":
        return {**copy.deepcopy(dict(block)), "thinking": "", "signature": ""}
    return copy.deepcopy(dict(block))  # e.g. redacted_thinking: whole at its start, no deltas


def _deltas(block: Mapping[str, Any], at_most: int) -> Iterator[Json]:
    kind = block.get("type")
    if kind == "text":
        for piece in pieces(block["text"], at_most):
            yield {"type": "text_delta", "text": piece}
    elif kind == "tool_use":
        # Split anywhere, the partial JSON still folds back into the same input; words read well.
        for piece in pieces(json.dumps(block["input"], ensure_ascii=False), MAX_PAUSED_PIECES):
            yield {"type": "input_json_delta", "partial_json": piece}
    elif kind == "thinking":
        for piece in pieces(block["thinking"], at_most):
            yield {"type": "thinking_delta", "thinking": piece}
        yield {"type": "signature_delta", "signature": block.get("signature", "")}
