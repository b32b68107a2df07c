"""Loopback stand-in for the Anthropic Messages API (``POST /v1/messages``).

The fake is a plain-HTTP :class:`http.server.ThreadingHTTPServer` on 127.0.0.1 with an
OS-chosen port, served from a daemon thread, so clients in this process *and* in
subprocesses (via ``ANTHROPIC_BASE_URL``) can talk to it. Every request is validated
against the rules the real API enforces (see :func:`validate_request`); invalid ones get
a 400 ``invalid_request_error`` and are recorded in :attr:`FakeMessagesAPI.errors`.
Valid ones are answered from scripted :class:`Reply` queues or a ``responder`` callback.
Requests with ``"stream": true`` are answered as server-sent events.

Extended thinking: :func:`thinking` and :func:`redacted_thinking` make blocks the fake signs
(an HMAC of the text, so any process can check them). With ``thinking`` enabled in a request the
fake enforces the real API's rules: ``budget_tokens`` >= 1024 and < ``max_tokens``, no
``temperature`` (other than 1), ``top_k`` or forced tool use, and the assistant turn being
continued with tool results must start with its thinking block(s), passed back exactly as returned.

Tool search: a request may declare the server-side tool search tool
(``tool_search_tool_regex_20251119`` / ``tool_search_tool_bm25_20251119``, or their undated
aliases, each under its fixed name) and mark tools ``defer_loading: true``. The fake refuses what the
real API refuses: a deferred tool with no tool search tool in ``tools``, every tool deferred, a
deferred tool search tool, a ``server_tool_use`` of a search tool the request does not declare or
without its ``tool_search_tool_result`` in the same message, and a ``tool_reference`` naming no
deferred tool of the request. :func:`tool_search` scripts the two blocks of a search (the model then
calls the tool found in the same reply, as the real one does); a script whose reply references, or
calls, a deferred tool the model could not have found is a test bug, answered 500. With
``count_tools`` set, ``input_tokens`` also counts the tool definitions as the API bills them (the
loaded ones, and the deferred ones a search found), at the same 4 characters a token.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "FakeMessagesAPI",
    "Reply",
    "http_error",
    "redacted_thinking",
    "reply",
    "text",
    "thinking",
    "tool_search",
    "tool_use",
    "validate_request",
]

_TOOL_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_TOOL_ID_RE = re.compile(r"[a-zA-Z0-9_-]+")
_USER_BLOCKS = frozenset({"text", "image", "document", "search_result", "tool_result"})
_ASSISTANT_BLOCKS = frozenset(
    {
        "text",
        "tool_use",
        "thinking",
        "redacted_thinking",
        "server_tool_use",
        "web_search_tool_result",
        "tool_search_tool_result",
    }
)
# The tool search tool's types (dated and undated) -> the one name each must be declared under.
SEARCH_TOOL_TYPES = {
    "tool_search_tool_regex_20251119": "tool_search_tool_regex",
    "tool_search_tool_regex": "tool_search_tool_regex",
    "tool_search_tool_bm25_20251119": "tool_search_tool_bm25",
    "tool_search_tool_bm25": "tool_search_tool_bm25",
}
_SEARCH_ERROR_CODES = frozenset({"too_many_requests", "invalid_pattern", "pattern_too_long", "unavailable"})
_RESULT_BLOCKS = frozenset({"text", "image", "document", "search_result"})
_THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})
_MAX_CACHE_CONTROL = 4
MAX_REQUEST_BYTES = 32 * 1024 * 1024  # the Messages API refuses a larger request (413)
_MIN_THINKING_BUDGET = 1024
# Signs the fake's thinking blocks; fixed, so a client in another process gets checkable ones too.
_SIGNING_KEY = b"fake-messages-api thinking"
_REDACTED_PREFIX = "fakeredacted:"
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def _fresh_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


# --------------------------------------------------------------------------- replies


@dataclass(frozen=True)
class Reply:
    """One scripted answer: a message (``status == 200``) or an HTTP error."""

    content: tuple[dict[str, Any], ...] = ()
    stop_reason: str | None = None
    usage: Mapping[str, int] | None = None
    status: int = 200
    error_type: str | None = None
    message: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    # Serve the blocks' ids as scripted even when they repeat: a buggy or compromised endpoint.
    verbatim_ids: bool = False
    # Streamed (``"stream": true``) as a model writes: text in tokens of ~4 characters, this many
    # per second (0: the whole reply at once).
    tokens_per_second: float = 0.0

    @property
    def is_error(self) -> bool:
        return self.status >= 400


def text(value: str) -> dict[str, Any]:
    """A text content block."""
    return {"type": "text", "text": value}


def tool_use(name: str, input: Mapping[str, Any], id: str | None = None) -> dict[str, Any]:  # noqa: A002
    """A tool_use content block; ``id`` defaults to a fresh unique ``toolu_...`` id."""
    return {"type": "tool_use", "id": id or _fresh_id("toolu"), "name": name, "input": dict(input)}


def tool_search(
    query: str,
    *found: str,
    name: str = "tool_search_tool_bm25",
    id: str | None = None,  # noqa: A002
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two blocks of a server-side tool search that found the tools named ``found``: a
    ``server_tool_use`` and its ``tool_search_tool_result`` with one ``tool_reference`` each."""
    sid = id or _fresh_id("srvtoolu")
    use = {"type": "server_tool_use", "id": sid, "name": name, "input": {"query": query}}
    references = [{"type": "tool_reference", "tool_name": n} for n in found]
    result = {
        "type": "tool_search_tool_result",
        "tool_use_id": sid,
        "content": {"type": "tool_search_tool_search_result", "tool_references": references},
    }
    return use, result


def _sign(value: str) -> str:
    digest = hmac.new(_SIGNING_KEY, value.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def thinking(value: str) -> dict[str, Any]:
    """A thinking block with a valid signature over ``value`` (any change to either breaks it)."""
    return {"type": "thinking", "thinking": value, "signature": _sign(value)}


def redacted_thinking(secret: str = "redacted reasoning") -> dict[str, Any]:
    """A redacted_thinking block: opaque ``data`` that the fake can verify, as the real API does."""
    payload = base64.b64encode(secret.encode()).decode()
    return {"type": "redacted_thinking", "data": f"{_REDACTED_PREFIX}{payload}.{_sign(payload)}"}


def _genuine(block: Mapping[str, Any]) -> bool:
    """Whether a thinking or redacted_thinking block is one the fake signed, unmodified."""
    if block.get("type") == "thinking":
        value, signature = block.get("thinking"), block.get("signature")
        return (
            isinstance(value, str)
            and isinstance(signature, str)
            and hmac.compare_digest(_sign(value), signature)
        )
    data = block.get("data")
    if not isinstance(data, str) or not data.startswith(_REDACTED_PREFIX) or "." not in data:
        return False
    payload, _, signature = data[len(_REDACTED_PREFIX) :].rpartition(".")
    return hmac.compare_digest(_sign(payload), signature)


def reply(
    *blocks: Mapping[str, Any],
    stop_reason: str | None = None,
    usage: Mapping[str, int] | None = None,
    verbatim_ids: bool = False,
    tokens_per_second: float = 0.0,
) -> Reply:
    """A successful message reply; ``stop_reason`` defaults from the blocks; streamed at
    ``tokens_per_second`` when asked for as a stream."""
    if stop_reason is None:
        has_tool = any(b.get("type") == "tool_use" for b in blocks)
        stop_reason = "tool_use" if has_tool else "end_turn"
    content = tuple(copy.deepcopy(dict(b)) for b in blocks)
    return Reply(
        content=content,
        stop_reason=stop_reason,
        usage=dict(usage) if usage else None,
        verbatim_ids=verbatim_ids,
        tokens_per_second=tokens_per_second,
    )


def http_error(
    status: int,
    error_type: str | None = None,
    message: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Reply:
    """An HTTP error reply, e.g. ``http_error(429, headers={"retry-after": "0.05"})``."""
    if error_type is None:
        error_type = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return Reply(
        status=status,
        error_type=error_type,
        message=message if message is not None else f"fake {error_type} ({status})",
        headers=tuple((headers or {}).items()),
    )


# --------------------------------------------------------------------------- validation


class _Validator:
    """Collects the problems of one request body; see :func:`validate_request`."""

    def __init__(self, check_tool_names: bool, served: Mapping[str, tuple[dict[str, Any], ...]]) -> None:
        self.check_tool_names = check_tool_names
        self.served = served  # tool_use id -> the thinking blocks the fake returned in the same reply
        self.problems: list[str] = []
        self.cache_controls = 0
        self.tool_names: set[str] = set()
        self.tool_use_ids: set[str] = set()
        self.continued = ""  # the message a paused reply may continue (the last one)
        self.search_tools: set[str] = set()  # the names of the tool search tools declared
        self.deferred: set[str] = set()  # the tools declared with defer_loading: true

    def add(self, problem: str) -> None:
        self.problems.append(problem)

    def run(self, body: dict[str, Any]) -> list[str]:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            self.add("model: Field required (a non-empty string)")
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            self.add(f"max_tokens: must be an integer >= 1, got {max_tokens!r}")
        thinking_on = self.thinking_config(body)
        self.tools(body.get("tools"))
        self.system(body.get("system"))
        self.messages(body.get("messages"))
        if thinking_on and isinstance(body.get("messages"), list):
            self.thinking_turn(body["messages"])
        if self.cache_controls > _MAX_CACHE_CONTROL:
            self.add(
                f"A maximum of {_MAX_CACHE_CONTROL} blocks with cache_control may be provided. "
                f"Found {self.cache_controls}."
            )
        return self.problems

    def thinking_config(self, body: Mapping[str, Any]) -> bool:
        """Check ``thinking`` and the parameters it excludes; True when thinking is enabled."""
        config = body.get("thinking")
        if config is None:
            return False
        if not isinstance(config, dict) or config.get("type") not in ("enabled", "disabled"):
            self.add('thinking: must be {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}')
            return False
        if config["type"] == "disabled":
            return False
        budget, max_tokens = config.get("budget_tokens"), body.get("max_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int):
            self.add("thinking.enabled.budget_tokens: Field required (an integer)")
        elif budget < _MIN_THINKING_BUDGET:
            self.add(
                "thinking.enabled.budget_tokens: Input should be greater than or equal to "
                f"{_MIN_THINKING_BUDGET}"
            )
        elif isinstance(max_tokens, int) and budget >= max_tokens:
            self.add("`max_tokens` must be greater than `thinking.budget_tokens`")
        if body.get("temperature") not in (None, 1):
            self.add("`temperature` may only be set to 1 when thinking is enabled")
        if body.get("top_k") is not None:
            self.add("`top_k` must be unset when thinking is enabled")
        top_p = body.get("top_p")
        if top_p is not None and not (isinstance(top_p, (int, float)) and 0.95 <= top_p <= 1):
            self.add("`top_p` must be greater than or equal to 0.95 or unset when thinking is enabled")
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") in ("any", "tool"):
            self.add("Thinking may not be enabled when tool_choice forces tool use.")
        return True

    def thinking_turn(self, messages: list[Any]) -> None:
        """With thinking on, the assistant turn being continued with tool results starts with its
        thinking, every thinking block of that turn is genuine, and none the fake returned is
        dropped or reordered. Thinking of earlier, finished turns may be left out."""
        start = -1  # the last user message that is not (only) tool results starts the current turn
        for i, msg in enumerate(messages):
            if isinstance(msg, dict) and msg.get("role") == "user" and not _has_results(msg):
                start = i
        turn = messages[start + 1 :]
        if not turn or not any(isinstance(m, dict) and m.get("role") == "user" for m in turn):
            return  # no tool use being continued
        if not isinstance(turn[0], dict) or turn[0].get("role") != "assistant":
            return  # malformed; the structural checks already said so
        content = turn[0].get("content")
        first = content[0] if isinstance(content, list) and content else None
        lead = first.get("type") if isinstance(first, dict) else "text"
        if lead not in _THINKING_BLOCKS:
            self.add(
                f"messages.{start + 1}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
                f"found `{lead}`. When `thinking` is enabled, a final `assistant` message must start with a "
                "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We "
                "recommend you include thinking blocks from previous turns. To avoid this requirement, "
                "disable `thinking`."
            )
        for offset, msg in enumerate(turn):
            if (
                isinstance(msg, dict)
                and msg.get("role") == "assistant"
                and isinstance(msg.get("content"), list)
            ):
                self.thinking_blocks(start + 1 + offset, msg["content"])

    def thinking_blocks(self, index: int, content: list[Any]) -> None:
        blocks = [b for b in content if isinstance(b, dict)]
        for j, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") in _THINKING_BLOCKS and not _genuine(block):
                field = "signature" if block["type"] == "thinking" else "data"
                self.add(f"messages.{index}.content.{j}: Invalid `{field}` in `{block['type']}` block")
        sent = [_thinking_fields(b) for b in blocks if b.get("type") in _THINKING_BLOCKS]
        for block in blocks:
            tid = block.get("id") if block.get("type") == "tool_use" else None
            returned = self.served.get(tid) if isinstance(tid, str) else None
            if returned and not _contains_run(sent, list(returned)):
                self.add(
                    f"messages.{index}: the thinking blocks returned with `tool_use` {block['id']} were "
                    "dropped, modified or reordered; thinking blocks must be passed back unmodified and "
                    "in their original order"
                )
                return

    def cache_control(self, where: str, obj: Mapping[str, Any]) -> None:
        cc = obj.get("cache_control")
        if cc is None:
            return
        self.cache_controls += 1
        ok = (
            isinstance(cc, dict)
            and cc.get("type") == "ephemeral"
            and set(cc) <= {"type", "ttl"}
            and cc.get("ttl", "5m") in ("5m", "1h")
        )
        if not ok:
            self.add(f'{where}.cache_control: must be {{"type": "ephemeral"}} (ttl "5m"/"1h")')

    def tools(self, tools: Any) -> None:
        if tools is None:
            return
        if not isinstance(tools, list):
            self.add("tools: must be a list")
            return
        for k, tool in enumerate(tools):
            where = f"tools.{k}"
            if not isinstance(tool, dict):
                self.add(f"{where}: must be an object")
                continue
            self.cache_control(where, tool)
            name = tool.get("name")
            if not isinstance(name, str) or not _TOOL_NAME_RE.fullmatch(name):
                self.add(f"{where}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'")
            elif name in self.tool_names:
                self.add(f"tools: Tool names must be unique (duplicate {name!r})")
            else:
                self.tool_names.add(name)
            if tool.get("type", "custom") == "custom":
                schema = tool.get("input_schema")
                if not isinstance(schema, dict) or schema.get("type") != "object":
                    self.add(f'{where}.input_schema: must be an object with "type": "object"')
            self.deferral(where, tool)
        self.search_declared(tools)

    def deferral(self, where: str, tool: Mapping[str, Any]) -> None:
        """A tool search tool under its own name, never deferred; `defer_loading` a boolean."""
        kind, name = tool.get("type", "custom"), tool.get("name")
        defer = tool.get("defer_loading", False)
        if not isinstance(defer, bool):
            self.add(f"{where}.defer_loading: Input should be a valid boolean")
            return
        if kind in SEARCH_TOOL_TYPES:
            if name != SEARCH_TOOL_TYPES[kind]:
                self.add(
                    f"{where}.name: Input should be '{SEARCH_TOOL_TYPES[kind]}' for a tool of type {kind}"
                )
            elif defer:
                self.add(f"{where}: the tool search tool cannot have defer_loading set")
            else:
                self.search_tools.add(name)
        elif defer and isinstance(name, str):
            self.deferred.add(name)

    def search_declared(self, tools: list[Any]) -> None:
        """Deferred tools need a tool search tool; at least one tool must be loaded."""
        if self.deferred and not self.search_tools:
            self.add(
                "tools: tools with defer_loading require a tool search tool "
                "(tool_search_tool_regex_20251119 or tool_search_tool_bm25_20251119) in `tools`"
            )
        if tools and all(isinstance(t, dict) and t.get("defer_loading") is True for t in tools):
            self.add("All tools have defer_loading set. At least one tool must be non-deferred.")

    def system(self, system: Any) -> None:
        if system is None or isinstance(system, str):
            return
        if not isinstance(system, list):
            self.add("system: must be a string or a list of text blocks")
            return
        for k, block in enumerate(system):
            where = f"system.{k}"
            if not isinstance(block, dict) or block.get("type") != "text":
                self.add(f"{where}: system blocks must be text blocks")
                continue
            self.cache_control(where, block)
            self.text_block(where, block)

    def text_block(self, where: str, block: Mapping[str, Any], allow_blank: bool = False) -> None:
        value = block.get("text")
        if not isinstance(value, str) or not value:
            self.add(f"{where}.text: text content blocks must be non-empty")
        elif not allow_blank and not value.strip():
            self.add(f"{where}.text: text content blocks must contain non-whitespace text")

    def messages(self, messages: Any) -> None:
        if not isinstance(messages, list) or not messages:
            self.add("messages: at least one message is required (a non-empty list)")
            return
        # A reply paused (`pause_turn`) mid-search is sent back to be continued: its last message may
        # hold a search whose result is still to come.
        self.continued = f"messages.{len(messages) - 1}"
        pending: list[str] = []  # tool_use ids of the previous assistant message
        prev_role: Any = None
        for i, msg in enumerate(messages):
            where = f"messages.{i}"
            if not isinstance(msg, dict):
                self.add(f"{where}: must be an object")
                prev_role, pending = None, []
                continue
            role = msg.get("role")
            if role not in ("user", "assistant"):
                self.add(f'{where}.role: must be "user" or "assistant", got {role!r}')
            elif i == 0 and role != "user":
                self.add('messages: first message must use the "user" role')
            elif role == prev_role:
                self.add(
                    'messages: roles must alternate between "user" and "assistant", '
                    f'but found multiple "{role}" roles in a row (at {where})'
                )
            prev_role = role
            blocks = self.content(where, role, msg.get("content"))
            if role == "user":
                self.pair_results(i, blocks, pending)
            elif pending:
                self.missing_results(i - 1, pending)
            pending = [
                b["id"] for b in blocks if b.get("type") == "tool_use" and isinstance(b.get("id"), str)
            ]
        if pending:
            self.missing_results(len(messages) - 1, pending)
        self.final_assistant(messages[-1])

    def missing_results(self, index: int, ids: Iterable[str]) -> None:
        self.add(
            f"messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately "
            f"after: {', '.join(ids)}. Each `tool_use` block must have a corresponding "
            "`tool_result` block in the next message."
        )

    def pair_results(self, i: int, blocks: list[dict[str, Any]], pending: list[str]) -> None:
        """Check the tool_result blocks of user message ``i`` against ``pending`` ids."""
        where = f"messages.{i}.content"
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        lead = 0
        while lead < len(blocks) and blocks[lead].get("type") == "tool_result":
            lead += 1
        if lead != len(results):
            self.add(f"{where}: `tool_result` blocks must come before any other content")
        unknown = [r for r in results if r not in pending]
        if unknown:
            self.add(
                f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: "
                f"{', '.join(map(str, unknown))}. Each `tool_result` block must have a "
                "corresponding `tool_use` block in the previous message."
            )
        dups = sorted({str(r) for r in results if results.count(r) > 1})
        if dups:
            self.add(f"{where}: duplicate `tool_use_id` in `tool_result` blocks: {', '.join(dups)}")
        missing = [p for p in pending if p not in results]
        if missing:
            self.missing_results(i - 1, missing)
        if not (unknown or dups or missing) and results != pending:
            self.add(f"{where}: `tool_result` blocks must be in the same order as the `tool_use` blocks")

    def final_assistant(self, last: Any) -> None:
        if not isinstance(last, dict) or last.get("role") != "assistant":
            return
        content = last.get("content")
        if isinstance(content, list) and content and isinstance(content[-1], dict):
            content = content[-1].get("text") if content[-1].get("type") == "text" else None
        if isinstance(content, str) and content != content.rstrip():
            self.add("messages: final assistant content cannot end with trailing whitespace")

    def content(self, where: str, role: Any, content: Any) -> list[dict[str, Any]]:
        """Validate message content; return its well-formed blocks (empty for a string)."""
        if isinstance(content, str):
            if not content.strip():
                self.add(f"{where}.content: text content must be non-empty and non-whitespace")
            return []
        if not isinstance(content, list) or not content:
            self.add(f"{where}.content: must be a non-empty string or a non-empty list of blocks")
            return []
        allowed = {"user": _USER_BLOCKS, "assistant": _ASSISTANT_BLOCKS}.get(role)
        blocks: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            bw = f"{where}.content.{j}"
            kind = block.get("type") if isinstance(block, dict) else None
            if not isinstance(block, dict) or not isinstance(kind, str):
                self.add(f"{bw}: content blocks must be objects with a string `type`")
                continue
            self.cache_control(bw, block)
            if kind not in _USER_BLOCKS | _ASSISTANT_BLOCKS:
                self.add(f"{bw}.type: unknown content block type {kind!r}")
                continue
            if allowed is not None and kind not in allowed:
                self.add(f"{bw}.type: `{kind}` blocks are not allowed in {role} messages")
                continue
            blocks.append(block)
            if kind == "text":
                self.text_block(bw, block)
            elif kind == "tool_use":
                self.tool_use(bw, block)
            elif kind == "tool_result":
                self.tool_result(bw, block)
            elif kind in _THINKING_BLOCKS:
                self.thinking_block(bw, block)
        if role == "assistant":
            self.searches(where, blocks)
        return blocks

    def searches(self, where: str, blocks: list[dict[str, Any]]) -> None:
        """A tool search's `server_tool_use` names a declared search tool and gets its
        `tool_search_tool_result` in the same message; every `tool_reference` names a deferred tool."""
        opened: dict[str, bool] = {}  # server_tool_use id -> answered
        for j, block in enumerate(blocks):
            bw = f"{where}.content.{j}"
            if block["type"] == "server_tool_use" and str(block.get("name", "")).startswith(
                "tool_search_tool"
            ):
                sid = block.get("id")
                if not isinstance(sid, str) or not _TOOL_ID_RE.fullmatch(sid):
                    self.add(f"{bw}.id: must be a string matching '^[a-zA-Z0-9_-]+$'")
                    continue
                if block["name"] not in self.search_tools:
                    self.add(f"{bw}: `server_tool_use` of {block['name']!r}, which is not in `tools`")
                if not isinstance(block.get("input"), dict):
                    self.add(f"{bw}.input: must be an object")
                opened[sid] = False
            elif block["type"] == "tool_search_tool_result":
                sid = block.get("tool_use_id")
                if sid not in opened or opened[sid]:
                    self.add(
                        f"{bw}: `tool_search_tool_result` for {sid!r} must follow its `server_tool_use` "
                        "in the same message, once"
                    )
                    continue
                opened[sid] = True
                self.references(bw, block.get("content"))
        for sid, answered in opened.items():
            if not answered and where != self.continued:
                self.add(f"{where}: `server_tool_use` {sid} has no `tool_search_tool_result` after it")

    def references(self, where: str, content: Any) -> None:
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "tool_search_tool_result_error":
            if content.get("error_code") not in _SEARCH_ERROR_CODES:  # type: ignore[union-attr]
                self.add(f"{where}.content.error_code: not a tool search error code")
            return
        refs = content.get("tool_references") if isinstance(content, dict) else None
        if kind != "tool_search_tool_search_result" or not isinstance(refs, list):
            self.add(f"{where}.content: must be a tool_search_tool_search_result with tool_references")
            return
        for ref in refs:
            name = ref.get("tool_name") if isinstance(ref, dict) else None
            if not isinstance(ref, dict) or ref.get("type") != "tool_reference" or not isinstance(name, str):
                self.add(f"{where}.content.tool_references: each must be a tool_reference with a tool_name")
            elif name not in self.tool_names:
                self.add(f"Tool reference '{name}' has no corresponding tool definition")

    def thinking_block(self, where: str, block: Mapping[str, Any]) -> None:
        fields = ("thinking", "signature") if block["type"] == "thinking" else ("data",)
        for name in fields:
            if not isinstance(block.get(name), str):
                self.add(f"{where}.{name}: Field required (a string)")
        if "cache_control" in block:
            self.add(f"{where}.{block['type']}.cache_control: Extra inputs are not permitted")

    def tool_use(self, where: str, block: Mapping[str, Any]) -> None:
        tid, name = block.get("id"), block.get("name")
        if not isinstance(tid, str) or not _TOOL_ID_RE.fullmatch(tid):
            self.add(f"{where}.id: must be a string matching '^[a-zA-Z0-9_-]+$'")
        elif tid in self.tool_use_ids:
            self.add(f"{where}.id: `tool_use` ids must be unique, {tid!r} appears more than once")
        else:
            self.tool_use_ids.add(tid)
        if not isinstance(name, str):
            self.add(f"{where}.name: must be a string")
        elif self.check_tool_names and name not in self.tool_names:
            self.add(f"{where}.name: tool {name!r} is not defined in `tools`")
        if not isinstance(block.get("input"), dict):
            self.add(f"{where}.input: must be an object")

    def tool_result(self, where: str, block: Mapping[str, Any]) -> None:
        if not isinstance(block.get("tool_use_id"), str):
            self.add(f"{where}.tool_use_id: must be a string")
        if "is_error" in block and not isinstance(block["is_error"], bool):
            self.add(f"{where}.is_error: must be a boolean")
        content = block.get("content")
        if content is None or isinstance(content, str):
            return
        if not isinstance(content, list):
            self.add(f"{where}.content: must be a string or a list of content blocks")
            return
        for k, inner in enumerate(content):
            iw = f"{where}.content.{k}"
            if not isinstance(inner, dict) or inner.get("type") not in _RESULT_BLOCKS:
                self.add(f"{iw}: tool_result content must be text (or image/document) blocks")
                continue
            self.cache_control(iw, inner)
            if inner["type"] == "text":
                self.text_block(iw, inner, allow_blank=True)


def found_by_search(messages: Any) -> set[str]:
    """The tools a tool search found anywhere in ``messages`` (the API loads them in every request)."""
    found: set[str] = set()
    for msg in messages if isinstance(messages, list) else ():
        content = msg.get("content") if isinstance(msg, dict) else None
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") == "tool_search_tool_result":
                inner = block.get("content")
                refs = inner.get("tool_references") if isinstance(inner, dict) else None
                found.update(r.get("tool_name") for r in refs or () if isinstance(r, dict))
    return found


def tools_tokens(body: Mapping[str, Any]) -> int:
    """The tool definitions a request is billed for, at 4 characters a token: every loaded tool, and
    every deferred one a search found (in the history or not at all)."""
    found = found_by_search(body.get("messages"))
    billed = [
        t
        for t in body.get("tools") or ()
        if isinstance(t, dict) and (t.get("defer_loading") is not True or t.get("name") in found)
    ]
    return len(json.dumps(billed)) // 4 if billed else 0


def _script_problem(content: Iterable[Mapping[str, Any]], body: Mapping[str, Any]) -> str:
    """Why a scripted reply is one the real API could not give to ``body`` ("" when it could): a
    search that finds a tool the request does not defer, or a call of a deferred tool no search found."""
    tools = [t for t in body.get("tools") or () if isinstance(t, dict)]
    deferred = {t.get("name") for t in tools if t.get("defer_loading") is True}
    found = found_by_search(body.get("messages"))
    for block in content:
        if block.get("type") == "tool_search_tool_result":
            for ref in block["content"].get("tool_references", ()):
                if ref["tool_name"] not in deferred:
                    return (
                        f"script bug: a search found {ref['tool_name']!r}, which the request does not defer"
                    )
                found.add(ref["tool_name"])
        elif block.get("type") == "tool_use" and block.get("name") in deferred and block["name"] not in found:
            return f"script bug: the model calls deferred tool {block['name']!r} before any search found it"
    return ""


def _has_results(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def _thinking_fields(block: Mapping[str, Any]) -> dict[str, Any]:
    return {k: block[k] for k in ("type", "thinking", "signature", "data") if k in block}


def _contains_run(blocks: list[dict[str, Any]], run: list[dict[str, Any]]) -> bool:
    """Whether ``run`` appears in ``blocks`` contiguously and in order."""
    return any(blocks[k : k + len(run)] == run for k in range(len(blocks) - len(run) + 1))


def validate_request(
    body: dict[str, Any],
    check_tool_names: bool = True,
    served: Mapping[str, tuple[dict[str, Any], ...]] | None = None,
) -> list[str]:
    """Return the problems the real Messages API would reject ``body`` for (empty if valid).

    ``served`` maps a tool_use id to the thinking blocks returned in the same reply; with thinking
    enabled, those must come back unmodified and in order (the fake passes its own record).
    """
    if not isinstance(body, dict):
        return ["request body must be a JSON object"]
    return _Validator(check_tool_names, served or {}).run(body)


# --------------------------------------------------------------------------- server


def _first_user_text(body: Mapping[str, Any]) -> str:
    for msg in body.get("messages") or []:
        if isinstance(msg, dict) and msg.get("role") == "user":
            content = msg.get("content")
            if isinstance(content, str):
                return content
            parts = [b.get("text") for b in content or [] if isinstance(b, dict)]
            return "\n".join(p for p in parts if isinstance(p, str))
    return ""


TOKEN_CHARS = 4  # characters per token of a paced stream


def _sse(message: dict[str, Any]) -> bytes:
    """Render a complete message as the Messages API's streaming event sequence."""
    return b"".join(piece for _, piece in _sse_pieces(message, paced=False))


def _sse_pieces(message: dict[str, Any], *, paced: bool) -> list[tuple[bool, bytes]]:
    """The stream's events, each with whether it carries a token of text; `paced`: text deltas
    one token each (as a model writes them), else one delta per block."""
    start = {**message, "content": [], "stop_reason": None}
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"message": start})]
    for i, block in enumerate(message["content"]):
        kind = block.get("type")
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            skeleton = {**block, "text": ""}
            body = block["text"]
            step = TOKEN_CHARS if paced else max(len(body), 1)
            pieces = [body[i : i + step] for i in range(0, len(body), step)] or [""]
            deltas = [{"type": "text_delta", "text": piece} for piece in pieces]
        elif kind in ("tool_use", "server_tool_use"):
            skeleton = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        elif kind == "thinking":
            skeleton = {**block, "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        else:
            skeleton = block
        events.append(("content_block_start", {"index": i, "content_block": skeleton}))
        for delta in deltas:
            events.append(("content_block_delta", {"index": i, "delta": delta}))
        events.append(("content_block_stop", {"index": i}))
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events.append(("message_delta", {"delta": stop, "usage": message["usage"]}))
    events.append(("message_stop", {}))
    return [
        (
            n == "content_block_delta" and d["delta"]["type"] == "text_delta",
            f"event: {n}\ndata: {json.dumps({'type': n, **d})}\n\n".encode(),
        )
        for n, d in events
    ]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fake: FakeMessagesAPI) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fake = fake


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Keep test output quiet."""

    def do_POST(self) -> None:  # noqa: N802
        self._handle()

    def do_GET(self) -> None:  # noqa: N802
        self._handle()

    def _handle(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        problems: list[str] = []
        path = urlsplit(self.path).path
        if self.command != "POST" or path != "/v1/messages":
            problems.append(f"{self.command} {path}: only POST /v1/messages is supported")
        if not (self.headers.get("x-api-key") or self.headers.get("authorization")):
            problems.append("authentication: x-api-key or authorization header is required")
        if not self.headers.get("anthropic-version"):
            problems.append("anthropic-version: header is required")
        fake = self.server.fake
        record = body if isinstance(body, dict) else {"_raw": raw.decode("utf-8", "replace")}
        if len(raw) > MAX_REQUEST_BYTES:  # the API refuses it whole, before reading what it says
            status, headers, payload = fake._too_large(record, len(raw))
        else:
            problems += validate_request(body, fake.check_tool_names, fake.served_thinking)
            status, headers, payload = fake._respond(record, problems)
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        if isinstance(payload, _Paced):  # no length: the stream ends when the connection closes
            self.send_header("connection", "close")
            self.end_headers()
            payload.write(self.wfile, fake)
            return
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@dataclass(frozen=True)
class _Paced:
    """A stream written as a model writes it: a token of text every ``1 / rate`` seconds."""

    pieces: list[tuple[bool, bytes]]
    rate: float

    def write(self, out: Any, fake: FakeMessagesAPI) -> None:
        first = True
        for is_text, piece in self.pieces:
            if is_text and not first:
                time.sleep(1 / self.rate)  # the model writing (what is simulated), not a wait on a test
            out.write(piece)
            out.flush()
            if is_text and first:
                first = False
                with fake._cond:
                    fake.first_tokens.append(time.monotonic())
                    fake._cond.notify_all()


class FakeMessagesAPI:
    """Scriptable, validating fake of ``POST /v1/messages``; see the module docstring."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._queue: deque[Reply] = deque()
        self._marker_queues: dict[str, deque[Reply]] = {}
        self._requests: list[dict[str, Any]] = []
        # When each paced stream wrote its first token of text (``time.monotonic()``), in order.
        self.first_tokens: list[float] = []
        self._valid: list[dict[str, Any]] = []
        self._errors: list[str] = []
        self._served_ids: set[str] = set()
        self._served_thinking: dict[str, tuple[dict[str, Any], ...]] = {}
        self.responder: Callable[[dict[str, Any]], Reply] | None = None
        self.check_tool_names = True
        # Count the tool definitions in `input_tokens` too (off: today's tests count messages only).
        self.count_tools = False

    # lifecycle -----------------------------------------------------------------------
    def start(self) -> FakeMessagesAPI:
        if self._server is None:
            self._server = _Server(self)
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="fake-messages-api",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeMessagesAPI:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeMessagesAPI is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # scripting -----------------------------------------------------------------------
    def script(self, *replies: Reply) -> None:
        """Append replies to the default FIFO queue."""
        with self._cond:
            self._queue.extend(replies)

    def script_for(self, marker: str, *replies: Reply) -> None:
        """Queue replies for requests whose first user message's text contains ``marker``."""
        with self._cond:
            self._marker_queues.setdefault(marker, deque()).extend(replies)

    def reset(self) -> None:
        """Clear queues, responder, recorded requests and errors."""
        with self._cond:
            self._queue.clear()
            self._marker_queues.clear()
            self._requests.clear()
            self._valid.clear()
            self._errors.clear()
            self.responder = None
            self.count_tools = False

    # inspection ----------------------------------------------------------------------
    @property
    def requests(self) -> list[dict[str, Any]]:
        """Snapshot of every request body received, in arrival order."""
        with self._cond:
            return list(self._requests)

    @property
    def valid_requests(self) -> list[dict[str, Any]]:
        with self._cond:
            return list(self._valid)

    @property
    def errors(self) -> list[str]:
        with self._cond:
            return list(self._errors)

    @property
    def served_thinking(self) -> dict[str, tuple[dict[str, Any], ...]]:
        """tool_use id -> the thinking blocks returned in the same reply (replies with thinking only)."""
        with self._cond:
            return dict(self._served_thinking)

    def wait_for_requests(self, n: int, timeout: float = 10.0) -> bool:
        """Block until at least ``n`` requests were received; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._requests) >= n, timeout)

    # serving -------------------------------------------------------------------------
    def _take_scripted(self, body: Mapping[str, Any]) -> Reply | None:
        first = _first_user_text(body)
        for marker, queue in self._marker_queues.items():
            if queue and marker in first:
                return queue.popleft()
        return self._queue.popleft() if self._queue else None

    def _too_large(self, body: dict[str, Any], size: int) -> tuple[int, list[tuple[str, str]], bytes]:
        message = f"request_too_large: {size:,} bytes; a request may be at most {MAX_REQUEST_BYTES:,} bytes"
        with self._cond:
            self._requests.append(body)
            self._errors.append(message)
            self._cond.notify_all()
        return self._render_error(http_error(413, message=message))

    def _respond(self, body: dict[str, Any], problems: list[str]) -> tuple[int, list[tuple[str, str]], bytes]:
        with self._cond:
            self._requests.append(body)
            self._cond.notify_all()
            if problems:
                self._errors.extend(problems)
                return self._render_error(http_error(400, message="; ".join(problems)))
            self._valid.append(body)
            chosen = self._take_scripted(body)
            responder = self.responder
        if chosen is None and responder is not None:
            try:
                chosen = responder(body)
            except Exception as exc:  # a broken responder is a test bug: surface it
                chosen = http_error(500, message=f"responder raised {exc!r}")
                with self._cond:
                    self._errors.append(chosen.message)
        if chosen is None:
            chosen = http_error(500, message="script exhausted: no scripted reply or responder")
            with self._cond:
                self._errors.append(chosen.message)
        if chosen.is_error:
            return self._render_error(chosen)
        if problem := _script_problem(chosen.content, body):
            with self._cond:
                self._errors.append(problem)
            return self._render_error(http_error(500, message=problem))
        message = self._render_message(chosen, body)
        if body.get("stream") is True and chosen.tokens_per_second > 0:
            paced = _Paced(_sse_pieces(message, paced=True), chosen.tokens_per_second)
            return 200, self._base_headers("text/event-stream"), paced  # type: ignore[return-value]
        if body.get("stream") is True:
            return 200, self._base_headers("text/event-stream"), _sse(message)
        return 200, self._base_headers("application/json"), json.dumps(message).encode()

    @staticmethod
    def _base_headers(content_type: str) -> list[tuple[str, str]]:
        return [("content-type", content_type), ("request-id", _fresh_id("req"))]

    def _render_error(self, err: Reply) -> tuple[int, list[tuple[str, str]], bytes]:
        payload = {"type": "error", "error": {"type": err.error_type, "message": err.message}}
        headers = self._base_headers("application/json") + list(err.headers)
        return err.status, headers, json.dumps(payload).encode()

    def _render_message(self, chosen: Reply, body: Mapping[str, Any]) -> dict[str, Any]:
        content = copy.deepcopy(list(chosen.content))
        with self._cond:  # tool_use ids are unique across the fake's lifetime
            fresh: dict[str, str] = {}  # a server_tool_use id served before -> its new one
            for block in content:
                if block.get("type") in ("tool_use", "server_tool_use") and not chosen.verbatim_ids:
                    if block.get("id") in self._served_ids:
                        new = _fresh_id("toolu" if block["type"] == "tool_use" else "srvtoolu")
                        fresh[block["id"]] = block["id"] = new
                    self._served_ids.add(block["id"])
                elif block.get("type") == "tool_search_tool_result" and block.get("tool_use_id") in fresh:
                    block["tool_use_id"] = fresh[block["tool_use_id"]]
            returned = tuple(_thinking_fields(b) for b in content if b.get("type") in _THINKING_BLOCKS)
            if returned:
                for block in content:
                    if block.get("type") == "tool_use":
                        self._served_thinking[block["id"]] = returned
        usage = {
            "input_tokens": len(json.dumps(body["messages"])) // 4
            + (tools_tokens(body) if self.count_tools else 0),
            "output_tokens": 10,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            **(chosen.usage or {}),
        }
        return {
            "id": _fresh_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": chosen.stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }
