"""What every tool is, wherever it comes from: a built-in, an operator's module or an MCP server.

A `Tool` is a name, a description, a JSON schema and a way to call it, plus what the policy and
the approval cards need to know of it (side effects, its own tier, a title, annotations). The
registry, the policy and the cards never ask where a tool came from.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from harness import texts
from harness.policy import PathArgs, Tier, schema_path_arguments
from harness.tools.inputs import InputAsk, InputReply
from harness.tools.tasks import TaskHandle

RESULT_LIMIT_CHARS = 20_000


class ToolError(Exception):
    """A tool's expected failure; its message goes to the model as an `is_error` result."""


class BadInput(ToolError):
    """The model's input does not fit the tool's schema; nothing ran."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool may touch: the workspace root, whether hidden paths in it are allowed, a clock."""

    workspace: Path
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    # `[tools] allow_hidden`: off, .env and .git are not one read or write away from the model.
    allow_hidden: bool = False
    # A call its server asked a person about goes again with the answers (`harness.tools.inputs`).
    reply: InputReply | None = None
    # The run a call is for: who a server's question in the middle of the call is put to.
    who: str | None = None
    # The call's approval receipt (`harness.receipts`), made as it runs: a module tool may hand it to
    # the service it calls; an MCP call carries it in `_meta`. None: receipts are off (no key).
    receipt: str | None = field(default=None, repr=False)


Content = str | list[dict[str, Any]]


@dataclass(frozen=True)
class ToolResult:
    """What a tool call answers: the `tool_result` content and whether it is an error.

    `content` is text, or a list of `text` and `image` blocks (an MCP tool may return images).
    """

    content: Content
    is_error: bool = False
    # Not an answer yet: the server asks a person first (the call goes again with the answers).
    asks: InputAsk | None = None
    # Not an answer yet: the server works on it as a task, and its result answers the call later.
    task: TaskHandle | None = None

    @property
    def text(self) -> str:
        """The content as text for people: images shown as a placeholder."""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for block in self.content:
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            else:
                parts.append(texts.RESULT_IMAGE_PLACEHOLDER.format(kind=block.get("type", "block")))
        return "\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"content": self.content, "is_error": self.is_error}
        if self.asks is not None:
            data["asks"] = self.asks.to_json()
        if self.task is not None:
            data["task"] = self.task.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolResult:
        content = data["content"]
        if not isinstance(content, list):
            content = str(content)
        asks = InputAsk.from_json(data["asks"]) if isinstance(data.get("asks"), dict) else None
        task = TaskHandle.from_json(data["task"]) if isinstance(data.get("task"), dict) else None
        return cls(content=content, is_error=bool(data["is_error"]), asks=asks, task=task)


Caller = Callable[[ToolContext, dict[str, Any]], "ToolResult | str"]


@dataclass(frozen=True)
class Tool:
    """One tool: how the model sees it, how it is called, and what the policy knows of it."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    # Called with validated input; returns text or a `ToolResult`; raises `ToolError` for a failure.
    call: Caller
    # Whether running it may change the world; such a call is never re-run after a crash.
    side_effects: bool = True
    # Step 3 of the tier order: the tier the tool gives itself (None: it gives none), and why.
    own_tier: Tier | None = None
    own_tier_why: str = ""
    # Set when the tool itself says every call needs a person (an MCP tool's `_meta`
    # `anthropic/requiresUserInteraction: true`): why, for the policy (`Policy.decide`). "" when not.
    # A claim that can only make a call stricter, so it is believed from any server.
    always_ask_why: str = ""
    # Shown on approval cards next to the arguments (an MCP tool's title and annotations).
    title: str | None = None
    annotations: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # Checks and coerces the model's input; raises `BadInput`. None: the callee checks it.
    validate: Callable[[Any], dict[str, Any]] | None = None
    # Set when the tool bounds its own calls (an MCP call is cancelled on its server after this
    # long): the registry then calls it on the caller's thread, without a timeout of its own.
    timeout_seconds: float | None = None
    # The module that defined it with `@tool()` ("" for other kinds).
    module: str = ""
    # What a call would change, as plain text for its approval card (a diff, say); None: nothing to show.
    preview: Callable[[ToolContext, dict[str, Any]], str | None] | None = None
    # Arguments holding paths beyond those its schema marks (`format: "path"` or `"uri"`, `x-path`):
    # a built-in's own, or an MCP server's `path_arguments` for this tool.
    listed_paths: tuple[str, ...] = ()
    # Arguments the tool never reads as a path (the built-in write_file's `content`): not looked into.
    text_arguments: tuple[str, ...] = ()
    # Sent with `defer_loading: true` beside the Messages API's tool search tool: its definition costs
    # input tokens only once a search found it (an MCP server's, `harness.tools.tool_search`).
    deferred: bool = False

    @property
    def path_args(self) -> PathArgs:
        """Which arguments hold paths (schema-marked or listed), and which hold mere text."""
        marked = schema_path_arguments(self.input_schema)
        return PathArgs(tuple(dict.fromkeys((*marked, *self.listed_paths))), self.text_arguments)

    def schema(self) -> dict[str, Any]:
        """The entry for the Messages API `tools` list."""
        return {"name": self.name, "description": self.description, "input_schema": dict(self.input_schema)}

    def checked(self, raw_input: Any) -> dict[str, Any]:
        """`raw_input` validated for this tool, or `BadInput`."""
        if self.validate is not None:
            return self.validate(raw_input)
        if not isinstance(raw_input, dict):
            raise BadInput("input: must be a JSON object")
        return raw_input


def tool(
    *,
    side_effects: bool = True,
    name: str | None = None,
    preview: Callable[[ToolContext, dict[str, Any]], str | None] | None = None,
) -> Callable[[Callable[..., str]], Tool]:
    """Make a `Tool` of `fn(ctx, **params) -> str`; the docstring is the description.

    `@tool()` means the tool has side effects: after a crash it is never run again, its outcome
    reported unknown instead. A read-only tool says `@tool(side_effects=False)`.
    """

    def wrap(fn: Callable[..., str]) -> Tool:
        fields: dict[str, Any] = {}
        params_after_ctx = list(inspect.signature(fn).parameters.items())[1:]
        hints = _hints(fn, [param_name for param_name, _ in params_after_ctx])
        for param_name, param in params_after_ctx:
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param_name] = (hints.get(param_name, Any), default)
        params = create_model(
            f"{fn.__name__}_input",
            __config__=ConfigDict(extra="forbid", strict=True),
            **fields,
        )
        return Tool(
            name=name or fn.__name__,
            description=inspect.cleandoc(fn.__doc__ or fn.__name__),
            input_schema=_schema_of(params),
            call=lambda ctx, args: fn(ctx, **args),
            side_effects=side_effects,
            validate=lambda raw: _validated(params, raw),
            module=getattr(fn, "__module__", "") or "",
            preview=preview,
        )

    return wrap


def _hints(fn: Callable[..., Any], names: list[str]) -> dict[str, Any]:
    """The type hints of `fn`'s parameters `names`, resolved in the function's own module.

    So a module may use `from __future__ import annotations`; and as the context's and the return's
    hints are never resolved, it may import `ToolContext` under `TYPE_CHECKING` only.
    """
    wanted = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if k in names}
    module_globals = getattr(inspect.unwrap(fn), "__globals__", {})
    return typing.get_type_hints(SimpleNamespace(__annotations__=wanted), module_globals, include_extras=True)


def _schema_of(params: type[BaseModel]) -> dict[str, Any]:
    schema = params.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


def _validated(params: type[BaseModel], raw: Any) -> dict[str, Any]:
    try:
        return dict(params.model_validate(raw))
    except ValidationError as exc:
        raise BadInput(problems(exc)) from None


def problems(exc: ValidationError) -> str:
    """A pydantic error as one line for the model: the first five problems, where and what."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "input"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def cut(text: str, limit: int) -> str:
    """`text` shortened to about `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + texts.RESULT_CUT.format(total=len(text), kept=limit)


def cut_blocks(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Text blocks cut so that all of them together stay within `RESULT_LIMIT_CHARS`."""
    budget = RESULT_LIMIT_CHARS
    total = sum(len(b["text"]) for b in blocks if b["type"] == "text")
    if total <= budget:
        return blocks
    out = []
    for block in blocks:
        if block["type"] != "text":
            out.append(block)
            continue
        if budget <= 0:
            continue
        text = block["text"]
        budget -= len(text)
        if budget < 0:
            text = text[: len(text) + budget] + texts.RESULT_CUT.format(total=total, kept=RESULT_LIMIT_CHARS)
        out.append({"type": "text", "text": text})
    return out


def bounded(result: ToolResult) -> ToolResult:
    """`result` with its text cut to `RESULT_LIMIT_CHARS`, whoever made it (a run record stays bounded).

    A result already cut by its maker (text plus the note saying so) is left as it is.
    """
    if isinstance(result.content, str):
        if len(result.content) <= RESULT_LIMIT_CHARS + _CUT_NOTE_ROOM:
            return result
        return replace(result, content=cut(result.content, RESULT_LIMIT_CHARS))
    found = [b.get("text") for b in result.content if b.get("type") == "text"]
    strings = [t for t in found if isinstance(t, str)]
    if len(strings) == len(found) and sum(map(len, strings)) <= RESULT_LIMIT_CHARS + _CUT_NOTE_ROOM:
        return result
    blocks = [{**b, "text": str(b.get("text", ""))} if b.get("type") == "text" else b for b in result.content]
    return replace(result, content=cut_blocks(blocks))


_CUT_NOTE_ROOM = 500  # what a maker's own note of a cut may add past the limit
