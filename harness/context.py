"""Keeping each model request within `[limits] max_input_tokens` by clearing old tool results.

A Slack thread is continued by later mentions with its whole history, so without this its
requests grow until they no longer fit the context window. Before each request the loop estimates
the request's input size; over the limit, the content of the OLDEST `tool_result` blocks is
replaced by a short note (`texts.RESULT_CLEARED`) until the estimate fits. Nothing else changes:
every `tool_use` keeps its `tool_result` (same id, same `is_error`), thinking blocks stay as the
API returned them (it checks their signatures), and the results of the latest user message, the
turn being answered now, stay whole.

The clearing is done on the stored conversation, not only on the request, so the history saved
for the thread stays bounded as well; it is deterministic (oldest first, always the same choice
for the same history). Once it has to clear, it clears down to `CLEAR_TO` of the limit rather
than just under it: every clearing changes the conversation's prefix and so costs a full prompt
cache write, and clearing in bulk makes that happen once every several turns, not on every one.

The estimate is pure, cheap and pessimistic: JSON characters (non-ASCII escaped, so non-Latin
text counts more) divided by 3, with an image counted as a flat `IMAGE_TOKENS`. If everything
that may be cleared is cleared and the request still does not fit, it is sent as it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from harness import texts
from harness.state import RunState
from harness.tools.tool_search import deferred_names, found_names

CHARS_PER_TOKEN = 3  # real text runs about 3.5-4.5 characters a token: erring on the large side
IMAGE_TOKENS = 1_600  # about what a full-size image costs
MESSAGE_TOKENS = 4  # a message's role and framing
CLEAR_TO = 0.75  # once over the limit, clear down to this share of it


def within_input_limit(
    state: RunState, request: Mapping[str, Any], limit: int, memo: TokenMemo | None = None
) -> RunState:
    """`state` with its oldest tool results cleared if `request`, built from it, estimates over `limit`."""
    messages = clear_old_results(state.messages, limit, prompt_tokens(request), memo)
    return state if messages is state.messages else replace(state, messages=messages)


def clear_old_results(
    messages: tuple[dict[str, Any], ...], limit: int, fixed: int = 0, memo: TokenMemo | None = None
) -> tuple[dict[str, Any], ...]:
    """`messages` (the very same object when they fit) with old results cleared to fit `limit`.

    `fixed` is the estimate of the rest of the request (system prompt and tools); `memo` keeps
    the estimates of messages seen before, so a request costs only its new messages' estimate.
    """
    total = fixed + (memo.messages_tokens(messages) if memo is not None else messages_tokens(messages))
    if total <= limit:
        return messages
    target, before = int(limit * CLEAR_TO), total
    out = list(messages)
    latest = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=len(messages))
    for index in range(latest):
        if total <= target:
            break
        message = out[index]
        if message["role"] != "user" or not isinstance(message["content"], list):
            continue
        content, saved = _cleared(message["content"], total - target)
        if saved:
            out[index] = {**message, "content": content}
            total -= saved
    return tuple(out) if total < before else messages


def _cleared(content: list[dict[str, Any]], excess: int) -> tuple[list[dict[str, Any]], int]:
    """`content` with tool results cleared in order until `excess` tokens are saved; the tokens saved."""
    content, saved = list(content), 0
    for j, block in enumerate(content):
        if saved >= excess:
            break
        if block.get("type") != "tool_result":
            continue
        cleared = {**block, "content": texts.RESULT_CLEARED}
        gain = block_tokens(block) - block_tokens(cleared)
        if gain > 0:  # a result shorter than the note (or already cleared) stays as it is
            content[j] = cleared
            saved += gain
    return content, saved


# --- the estimate ----------------------------------------------------------------------------


class TokenMemo:
    """The estimates of messages already seen, by identity: a run's history is estimated once.

    A stored message is never changed in place (a step makes new messages, and clearing makes new
    dicts), so the same object has the same estimate. Each entry holds its message, so an id is
    never reused while it is remembered; past `size` entries the memo starts afresh.
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._known: dict[int, tuple[Mapping[str, Any], int]] = {}
        self._image_free: dict[int, tuple[Mapping[str, Any], bool]] = {}

    def messages_tokens(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """`messages_tokens(messages)`, estimating only the messages not seen before."""
        return sum(self.message_tokens(m) for m in messages)

    def image_free(self, message: Mapping[str, Any]) -> bool:
        """Whether `message` holds no tool-result image (remembered by identity, as the estimates)."""
        known = self._image_free.get(id(message))
        if known is not None and known[0] is message:
            return known[1]
        free = _image_free(message)
        if len(self._image_free) >= self._size:
            self._image_free = {}
        self._image_free[id(message)] = (message, free)
        return free

    def message_tokens(self, message: Mapping[str, Any]) -> int:
        known = self._known.get(id(message))
        if known is not None and known[0] is message:
            return known[1]
        tokens = message_tokens(message)
        if len(self._known) >= self._size:
            self._known = {}
        self._known[id(message)] = (message, tokens)
        return tokens


def estimate_tokens(request: Mapping[str, Any]) -> int:
    """A pessimistic estimate of the input tokens of a `messages.create` request."""
    return prompt_tokens(request) + messages_tokens(request.get("messages") or ())


def prompt_tokens(request: Mapping[str, Any]) -> int:
    """The estimate of a request's system prompt and tool definitions: a deferred tool counts only
    once a search found it (the API then loads it into every request)."""
    system = request.get("system") or ()
    tokens = _tokens(json.dumps(system)) if isinstance(system, str) else sum(map(block_tokens, system))
    tools = request.get("tools") or ()
    deferred = deferred_names(tools)
    loaded = found_names(request.get("messages") or ()) if deferred else set()
    return tokens + sum(
        block_tokens(t) for t in tools if t.get("name") not in deferred or t.get("name") in loaded
    )


def messages_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """The estimate of a conversation: a sum over blocks, so clearing one saves exactly its share."""
    return sum(message_tokens(m) for m in messages)


def message_tokens(message: Mapping[str, Any]) -> int:
    """The estimate of one message."""
    content = message["content"]
    if isinstance(content, str):
        return MESSAGE_TOKENS + _tokens(json.dumps(content))
    return MESSAGE_TOKENS + sum(block_tokens(b) for b in content)


def block_tokens(block: Mapping[str, Any]) -> int:
    """The estimate of one content block (a cache breakpoint on it counts nothing)."""
    kind = block.get("type")
    if kind == "image":
        return IMAGE_TOKENS
    rest = {k: v for k, v in block.items() if k != "cache_control"}
    if kind == "tool_result" and isinstance(block.get("content"), list):
        inner = rest.pop("content")
        return _tokens(json.dumps(rest)) + sum(block_tokens(b) for b in inner)
    return _tokens(json.dumps(rest))


def _tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


# --- images: only the turn being answered shows them ------------------------------------------

# A request may carry at most 32 MB. One turn's images, all its results together, stay within
# this many base64 characters (about 12 MB of image data), and images of earlier turns are
# replaced by a short note: the model has seen them, and a run that read one big image must not
# carry it in every later request (nor in its stored record) until the API refuses them all.
TURN_IMAGE_CHARS = 16_000_000
TURN_IMAGES = 20


def without_old_images(
    messages: tuple[dict[str, Any], ...], memo: TokenMemo | None = None
) -> tuple[dict[str, Any], ...]:
    """`messages` with every tool-result image before the last message replaced by a note.

    Messages with nothing to replace are kept as the very same objects (the saves and the token
    memo know a message by identity); the result is `messages` itself when nothing changed.
    `memo` remembers the messages already found free of images, so a request costs a look-up per
    message rather than a pass over every block of the conversation.
    """
    out: list[dict[str, Any]] | None = None
    for index in range(len(messages) - 1):
        message = messages[index]
        if message["role"] != "user" or not isinstance(message["content"], list):
            continue
        if memo.image_free(message) if memo is not None else _image_free(message):
            continue
        out = out if out is not None else list(messages)
        out[index] = {**message, "content": [_results_without_images(b) for b in message["content"]]}
    return messages if out is None else tuple(out)


def _image_free(message: Mapping[str, Any]) -> bool:
    return not any(isinstance(block, dict) and _holds_image(block) for block in message["content"])


def _holds_image(block: Mapping[str, Any]) -> bool:
    inner = block.get("content") if block.get("type") == "tool_result" else None
    return isinstance(inner, list) and any(isinstance(b, dict) and b.get("type") == "image" for b in inner)


def _results_without_images(block: dict[str, Any]) -> dict[str, Any]:
    if not _holds_image(block):
        return block
    inner = block["content"]
    note = {"type": "text", "text": texts.IMAGE_FROM_EARLIER_TURN}
    return {**block, "content": [note if b.get("type") == "image" else b for b in inner]}


def fit_images(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One turn's `tool_result` blocks with images past the turn's budget replaced by a note."""
    chars = count = 0
    out = []
    for block in results:
        inner = block.get("content")
        if isinstance(inner, list) and any(b.get("type") == "image" for b in inner):
            kept = []
            for item in inner:
                if item.get("type") == "image":
                    size = len(str(item.get("source", {}).get("data", "")))
                    if count >= TURN_IMAGES or chars + size > TURN_IMAGE_CHARS:
                        item = {"type": "text", "text": texts.IMAGE_OVER_TURN_BUDGET}
                    else:
                        chars, count = chars + size, count + 1
                kept.append(item)
            block = {**block, "content": kept}
        out.append(block)
    return out
