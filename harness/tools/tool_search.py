"""What tool definitions cost a request, and the Messages API's tool search that defers them.

Every tool definition offered goes with every model request. An MCP server's tools can instead
be *deferred*: each is sent with `defer_loading: true` beside the server-side tool search tool
(`SEARCH_TOOL`, the BM25 variant: the model searches in plain words), and the API loads a
deferred tool's definition only once a search found it, so it costs input tokens from then on
only. A server is deferred when its `defer_loading` says so, or, with `defer_loading` not set,
when its definitions are estimated over `[limits] defer_tools_over_tokens` (`deferred_servers`).

The search happens inside the model's reply: a `server_tool_use` block and its
`tool_search_tool_result` (with `tool_reference`s), then, usually, a `tool_use` of the tool found.
Those two blocks stay in the conversation as they came and are sent back with it; they get no
`tool_result` from us (only a `tool_use` does). A request refers back only to tools it defines:
`searchable` takes out of the request (never out of the stored run) a reference to a tool no
longer deferred there, and the search blocks altogether when no tool is deferred any more.

The estimate is the one `harness.context` makes of any block: JSON characters / 3, which errs on
the large side of a real tokenizer (about 3.5 to 4.5 characters a token for English text).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SEARCH_TOOL: Mapping[str, str] = {"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"}
CHARS_PER_TOKEN = 3  # as `harness.context`: pessimistic
SEPARATOR = "__"  # `<server>__<tool>`, as `mcp_listing.SEPARATOR` (not imported: the registry imports this)
_SEARCH_BLOCKS = frozenset({"server_tool_use", "tool_search_tool_result"})


def definition_tokens(schema: Mapping[str, Any]) -> int:
    """The estimated input tokens of one entry of a request's `tools` (JSON characters / 3)."""
    return -(-len(json.dumps(schema)) // CHARS_PER_TOKEN)


@dataclass(frozen=True)
class ServerCost:
    """What one MCP server's tools cost each request: their estimated tokens, and whether (and why)
    they are deferred, in which case they cost nothing until a search finds one."""

    server: str
    tools: int
    tokens: int  # the definitions' estimate, were they all sent
    deferred_why: str = ""  # "" when they go with every request

    @property
    def per_request(self) -> int:
        return 0 if self.deferred_why else self.tokens


def server_costs(
    schemas: Iterable[Mapping[str, Any]],
    servers: Sequence[str],
    deferral: Mapping[str, bool | None],
    threshold: int,
) -> tuple[ServerCost, ...]:
    """Each of `servers` with the tokens of its tools among `schemas` (`<server>__<tool>`), and why
    it is deferred: its `defer_loading = true`, or, not set, its estimate over `threshold` (> 0)."""
    sizes = {s: [0, 0] for s in servers}
    for schema in schemas:
        name = str(schema.get("name", ""))
        server = name.split(SEPARATOR, 1)[0]
        if server in sizes and SEPARATOR in name:
            sizes[server][0] += 1
            sizes[server][1] += definition_tokens(schema)
    costs = []
    for server, (count, tokens) in sizes.items():
        setting = deferral.get(server)
        why = ""
        if setting is True:
            why = f"mcp.servers[{server}].defer_loading = true"
        elif setting is None and threshold and tokens > threshold:
            why = f"over limits.defer_tools_over_tokens ({threshold})"
        costs.append(ServerCost(server, count, tokens, why if count else ""))
    return tuple(costs)


def servers_of(names: Iterable[str]) -> list[str]:
    """The MCP servers of these `<server>__<tool>` names, sorted."""
    return sorted({name.split(SEPARATOR, 1)[0] for name in names if SEPARATOR in name})


def request_tools(schemas: Sequence[Mapping[str, Any]], deferred: Iterable[str]) -> list[dict[str, Any]]:
    """The request's `tools`: `schemas` with `defer_loading: true` on each tool named in `deferred`,
    and the tool search tool after them when there is any (it is never deferred itself, so the API's
    rule that at least one tool be loaded holds even when every other tool is deferred)."""
    names = set(deferred)
    out = [{**s, "defer_loading": True} if s.get("name") in names else dict(s) for s in schemas]
    if any(s.get("name") in names for s in schemas):
        out.append(dict(SEARCH_TOOL))
    return out


def deferred_names(tools: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The names of the tools a request's `tools` defers."""
    return frozenset(str(t.get("name")) for t in tools if t.get("defer_loading") is True)


def found_names(messages: Iterable[Mapping[str, Any]]) -> set[str]:
    """The tools some search in `messages` found (the API loads them into every later request)."""
    found: set[str] = set()
    for message in messages:
        content = message["content"]
        if message["role"] != "assistant" or isinstance(content, str):
            continue
        for block in content:
            if block.get("type") == "tool_search_tool_result":
                inner = block.get("content")
                refs = inner.get("tool_references") if isinstance(inner, dict) else None
                found.update(str(r.get("tool_name")) for r in refs or () if isinstance(r, dict))
    return found


def searchable(messages: Sequence[dict[str, Any]], deferred: frozenset[str]) -> Sequence[dict[str, Any]]:
    """`messages` as a request with these `deferred` tools may carry them (the very same sequence
    when nothing needs to change): a `tool_reference` only to a tool deferred now, and no search
    blocks at all when nothing is deferred (no tool search tool is then sent)."""
    out: list[dict[str, Any]] | None = None
    for index, message in enumerate(messages):
        content = message["content"]
        if message["role"] != "assistant" or isinstance(content, str):
            continue
        if not any(b.get("type") in _SEARCH_BLOCKS and _stale(b, deferred) for b in content):
            continue
        kept = [_kept(b, deferred) for b in content if not (b.get("type") in _SEARCH_BLOCKS and not deferred)]
        out = out if out is not None else list(messages)
        # The API refuses an empty message: one that held only a search keeps a word of it.
        out[index] = {**message, "content": kept or [{"type": "text", "text": "(searched for tools)"}]}
    return messages if out is None else out


def _stale(block: Mapping[str, Any], deferred: frozenset[str]) -> bool:
    """Whether a search block cannot go as it is with these `deferred` tools."""
    if not deferred:
        return True
    refs = _references(block)
    return any(r.get("tool_name") not in deferred for r in refs)


def _kept(block: dict[str, Any], deferred: frozenset[str]) -> dict[str, Any]:
    refs = _references(block)
    if not refs or all(r.get("tool_name") in deferred for r in refs):
        return block
    inner = {**block["content"], "tool_references": [r for r in refs if r.get("tool_name") in deferred]}
    return {**block, "content": inner}


def _references(block: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    inner = block.get("content") if block.get("type") == "tool_search_tool_result" else None
    refs = inner.get("tool_references") if isinstance(inner, dict) else None
    return [r for r in refs if isinstance(r, dict)] if isinstance(refs, list) else []
