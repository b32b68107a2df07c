"""One model request: the arguments built from the state, the request sent, its reply read.

The loop decides when to ask the model; this is how: prompt-cache breakpoints and thinking on
the way out, the daily budgets, the tracer and the live view around the call, and a reply made
storable (no lone surrogates, no shared call ids) on the way back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import partial
from typing import Any

from harness import texts
from harness.agent import Agent
from harness.client import streamed_reply
from harness.context import prompt_tokens
from harness.signals import TextWritten
from harness.state import RunState, Usage
from harness.tools.tool_search import searchable, servers_of
from harness.valves import Stop

_EPHEMERAL = {"type": "ephemeral"}


def build_request(state: RunState, agent: Agent) -> dict[str, Any]:
    """The `messages.create` arguments, with prompt-cache breakpoints on the stable prefix.

    With thinking on, the stored thinking blocks go back as they came (the API checks their
    signatures); no temperature or top_k is ever set, as thinking forbids them. Tools of a deferred
    MCP server go with `defer_loading: true` beside the tool search tool (`harness.tools.tool_search`).
    """
    request: dict[str, Any] = {
        "model": agent.model,
        "max_tokens": agent.limits.max_tokens,
        "system": [{"type": "text", "text": system_prompt(agent), "cache_control": _EPHEMERAL}],
        "tools": agent.tools.schemas(),
        # A search's blocks go back as they came, but refer only to tools this request defers.
        "messages": cache_marked(searchable(state.messages, agent.tools.deferred())),
    }
    if agent.thinking_budget > 0:
        request["thinking"] = {"type": "enabled", "budget_tokens": agent.thinking_budget}
    return request


def system_prompt(agent: Agent) -> str:
    """The system prompt, naming the MCP servers whose tools are deferred (none: as configured)."""
    deferred = agent.tools.deferred()
    if not deferred:
        return agent.system
    servers = ", ".join(servers_of(deferred))
    return f"{agent.system}\n\n{texts.SYSTEM_DEFERRED_TOOLS.format(servers=servers)}"


def cache_marked(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of `messages` with breakpoints on the last message and the one two before it.

    The newest breakpoint writes the whole conversation to the cache; the older one sits where
    the previous request's newest was, so a turn that adds many blocks still reads the cache.
    The stored conversation is never marked: breakpoints would pile up past the API's four.
    """
    marked = list(messages)
    if marked and marked[-1]["role"] == "assistant":
        marked[-1] = _without_trailing_space(marked[-1])
    for index in (len(marked) - 1, len(marked) - 3):
        if index >= 0:
            marked[index] = _mark_last_block(marked[index])
    return marked


def _mark_last_block(message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if not content or content[-1].get("type") in ("thinking", "redacted_thinking"):
        return message
    return {**message, "content": [*content[:-1], {**content[-1], "cache_control": _EPHEMERAL}]}


def _without_trailing_space(message: dict[str, Any]) -> dict[str, Any]:
    """The API refuses a final assistant message ending in white space (after `pause_turn`)."""
    content = list(message["content"])
    while (
        content and content[-1].get("type") == "text" and content[-1]["text"] != content[-1]["text"].rstrip()
    ):
        stripped = content[-1]["text"].rstrip()
        content[-1:] = [{**content[-1], "text": stripped}] if stripped else []
    return {**message, "content": content}


def over_budget(state: RunState, agent: Agent, request: dict[str, Any]) -> Stop | None:
    """The daily budgets' answer for `request`: reserved with an upper bound of what it may cost."""
    if agent.budget is None:
        return None
    estimate = (
        prompt_tokens(request) + agent.token_memo.messages_tokens(state.messages) + agent.limits.max_tokens
    )
    return agent.budget.admit(estimate, granted=state.usage.total < state.past_budget_until)


def create_message(agent: Agent, request: dict[str, Any]) -> Any:
    """Make the model request; the budget is told what it cost (nothing, when it failed)."""
    if agent.budget is None:
        return _request(agent, request)
    cost = Usage()
    try:
        message = _request(agent, request)
        cost = usage_of(message.usage)
        return message
    finally:
        agent.budget.spent(cost)


def _request(agent: Agent, request: dict[str, Any]) -> Any:
    """The reply to `request`, through the tracer when there is one."""
    if agent.tracer is None:
        return _send(agent, request)
    return agent.tracer.chat(request, partial(_send, agent, request))


def _send(agent: Agent, request: dict[str, Any]) -> Any:
    """The reply to `request`: streamed to the live view, when there is one."""
    live = agent.live
    if live is None:
        return agent.client.messages.create(**request)
    return streamed_reply(agent.client, request, lambda piece: live(TextWritten(piece)))


def append_assistant(
    messages: tuple[dict[str, Any], ...], content: list[dict[str, Any]]
) -> tuple[dict[str, Any], ...]:
    """Append a reply; after a `pause_turn` the reply continues the same assistant message."""
    content = content or [{"type": "text", "text": "(empty reply)"}]  # the API refuses empty content
    if messages and messages[-1]["role"] == "assistant":
        merged = {"role": "assistant", "content": [*messages[-1]["content"], *content]}
        return (*messages[:-1], merged)
    return (*messages, {"role": "assistant", "content": content})


def reply_content(message: Any) -> list[dict[str, Any]]:
    """The reply's content blocks as JSON, made storable: no lone surrogate, no id two calls share.

    Sanitised on arrival: a lone surrogate would make the reply unstorable, and a crash before the
    checkpoint would lose its usage (and let the token budget be overspent on every re-drive).
    """
    content = [scrub(block.model_dump(mode="json", exclude_none=True)) for block in message.content]
    return _unique_ids(content)


DUPLICATE_ID_MARK = "__dup"


def _unique_ids(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A reply whose `tool_use` blocks share an id: every one of them is refused, none merged.

    The blocks get distinct ids (`<id>__dupN`) so that each gets its own `tool_result` and the
    conversation stays valid for the API; `harness.calls.calls_in` answers all of them `is_error`.
    """
    ids = [b["id"] for b in content if b.get("type") == "tool_use"]
    shared = {i for i in ids if ids.count(i) > 1}
    if not shared:
        return content
    seen: dict[str, int] = {}
    out = []
    for block in content:
        if block.get("type") == "tool_use" and block["id"] in shared:
            seen[block["id"]] = seen.get(block["id"], 0) + 1
            block = {**block, "id": f"{block['id']}{DUPLICATE_ID_MARK}{seen[block['id']]}"}
        out.append(block)
    return out


_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub(value: Any) -> Any:
    """`value` with every lone surrogate replaced by U+FFFD: it can then always be stored as UTF-8."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    return value


def usage_of(usage: Any) -> Usage:
    return Usage(
        input=usage.input_tokens or 0,
        output=usage.output_tokens or 0,
        cache_creation=usage.cache_creation_input_tokens or 0,
        cache_read=usage.cache_read_input_tokens or 0,
    )
