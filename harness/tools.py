"""Tools the model may call: one typed, documented function each.

A tool is a plain function whose first parameter is the `ToolContext`; its other parameters
(with `Annotated[..., Field(description=...)]`) become a pydantic model, and that model is both
the JSON schema sent to the model and the validator of the model's input. Failures never raise
out of `ToolRegistry.run`: they come back as an `is_error` result for the model to read.
"""

from __future__ import annotations

import inspect
import os
import queue
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from harness import texts

READ_LIMIT_CHARS = 2000
LIST_LIMIT_ENTRIES = 200
WRITE_LIMIT_CHARS = 1_000_000
RESULT_LIMIT_CHARS = 20_000


class ToolError(Exception):
    """A tool's expected failure; its message goes to the model as an `is_error` result."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool may touch: the workspace root and a clock."""

    workspace: Path
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))


@dataclass(frozen=True)
class ToolResult:
    """What a tool call answers: the `tool_result` content and whether it is an error."""

    content: str
    is_error: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"content": self.content, "is_error": self.is_error}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolResult:
        return cls(content=str(data["content"]), is_error=bool(data["is_error"]))


@dataclass(frozen=True)
class Tool:
    """A tool definition: its name, description, input model and implementation."""

    name: str
    description: str
    params: type[BaseModel]
    fn: Callable[..., str]
    # Whether running it changes the world; such a call is never re-run after a crash (issue 4).
    side_effects: bool = False

    def schema(self) -> dict[str, Any]:
        """The entry for the Messages API `tools` list."""
        schema = self.params.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return {"name": self.name, "description": self.description, "input_schema": schema}


def tool(*, side_effects: bool = False) -> Callable[[Callable[..., str]], Tool]:
    """Make a `Tool` of `fn(ctx, **params) -> str`; the docstring is the description."""

    def wrap(fn: Callable[..., str]) -> Tool:
        fields: dict[str, Any] = {}
        for name, param in list(inspect.signature(fn).parameters.items())[1:]:
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[name] = (param.annotation, default)
        params = create_model(
            f"{fn.__name__}_input",
            __config__=ConfigDict(extra="forbid", strict=True),
            **fields,
        )
        doc = inspect.cleandoc(fn.__doc__ or fn.__name__)
        return Tool(fn.__name__, doc, params, fn, side_effects)

    return wrap


class ToolRegistry:
    """The tools of a run, by name; runs a call and always returns a `ToolResult`."""

    def __init__(self, tools: Iterable[Tool], timeout_seconds: float = 30.0) -> None:
        self._tools = {t.name: t for t in tools}
        self._timeout = timeout_seconds
        # Built once: rebuilding JSON schemas on every request was most of the loop's own cost.
        self._schemas = [t.schema() for t in self._tools.values()]
        self._lanes = threading.local()

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        return self._schemas

    def run(self, name: str, raw_input: Any, ctx: ToolContext) -> ToolResult:
        """Validate `raw_input` against the tool's schema, run it, and cut what it returns."""
        found = self._tools.get(name)
        if found is None:
            names = ", ".join(self._tools) or "none"
            return ToolResult(texts.RESULT_UNKNOWN_TOOL.format(name=name, names=names), True)
        try:
            args = found.params.model_validate(raw_input)
        except ValidationError as exc:
            return ToolResult(texts.RESULT_BAD_INPUT.format(name=name, problems=_problems(exc)), True)
        try:
            output = self._call_with_timeout(found, ctx, args)
        except ToolError as exc:
            return ToolResult(f"Error: {exc}", True)
        except Exception as exc:  # a tool's bug must reach the model, not crash the run
            error = f"{type(exc).__name__}: {exc}"
            return ToolResult(texts.RESULT_TOOL_RAISED.format(name=name, error=error), True)
        return ToolResult(cut(str(output), RESULT_LIMIT_CHARS))

    def _call_with_timeout(self, found: Tool, ctx: ToolContext, args: BaseModel) -> str:
        lane: _Lane | None = getattr(self._lanes, "lane", None)
        if lane is None or not lane.usable():
            lane = self._lanes.lane = _Lane()
        call = _Call(found.fn, (ctx,), dict(args))
        lane.inbox.put(call)
        if not call.done.wait(self._timeout):
            # A thread cannot be killed: the hung call keeps its lane, the next call gets a new one.
            self._lanes.lane = None
            raise ToolError(f"{found.name} did not finish within {self._timeout:g} seconds")
        if call.error is not None:
            raise call.error
        return call.value


@dataclass
class _Call:
    fn: Callable[..., str]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    value: str = ""
    error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:  # handed back to the caller's thread
            self.error = exc
        finally:
            self.done.set()


class _Lane:
    """A daemon thread that runs tool calls one at a time, so a call can be given a timeout.

    Cheaper than a thread per call; daemon, so a hung tool never blocks the process's exit.
    """

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self.pid = os.getpid()
        threading.Thread(target=self._work, name="tool-lane", daemon=True).start()

    def usable(self) -> bool:
        return self.pid == os.getpid()  # a forked child has the object but not the thread

    def _work(self) -> None:
        while True:
            self.inbox.get().run()


def cut(text: str, limit: int) -> str:
    """`text` shortened to about `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + texts.RESULT_CUT.format(total=len(text), kept=limit)


def _problems(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "input"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


# --- the workspace jail ---------------------------------------------------------------------


def resolve_in_workspace(workspace: Path, raw: str) -> Path:
    """The real path of `raw` inside `workspace`, or `ToolError` if it would leave it."""
    if not raw or "\x00" in raw:
        raise ToolError("a path must be a non-empty relative path inside the workspace")
    rel = PurePosixPath(raw.replace("\\", "/"))
    if rel.is_absolute() or raw.startswith("~") or (len(raw) > 1 and raw[1] == ":"):
        raise ToolError(f"{raw!r} is an absolute path; use a path relative to the workspace")
    if ".." in rel.parts:
        raise ToolError(f"{raw!r} goes up with '..'; paths must stay inside the workspace")
    root = workspace.resolve()
    real = (root / rel).resolve()  # follows every symlink on the way
    if real != root and not real.is_relative_to(root):
        raise ToolError(f"{raw!r} leads outside the workspace (through a symlink)")
    return real


def _regular_file(path: Path, raw: str) -> os.stat_result:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ToolError(f"no such file: {raw}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise ToolError(f"{raw} is {kind}")
    return info


# --- the built-in tools ---------------------------------------------------------------------

PathArg = Annotated[str, Field(description="Path relative to the workspace root", max_length=1024)]


@tool()
def get_time(ctx: ToolContext) -> str:
    """Get the current date and time (UTC, ISO 8601)."""
    return ctx.now().astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@tool()
def read_file(ctx: ToolContext, path: PathArg) -> str:
    """Read a text file in the workspace and return its first 2000 characters."""
    real = resolve_in_workspace(ctx.workspace, path)
    _regular_file(real, path)
    # O_NONBLOCK: a FIFO swapped in after the check must not hang the worker.
    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ToolError(f"{path} is not a regular file")
        head = handle.read(READ_LIMIT_CHARS * 4)
    if b"\x00" in head:
        raise ToolError(f"{path} is a binary file; only text files can be read")
    text = head.decode("utf-8", errors="ignore" if len(head) == READ_LIMIT_CHARS * 4 else "strict")
    return text[:READ_LIMIT_CHARS]


@tool()
def list_files(
    ctx: ToolContext,
    path: Annotated[str, Field(description="Directory relative to the workspace root")] = ".",
) -> str:
    """List the entries of a directory in the workspace (directories end with '/')."""
    real = ctx.workspace.resolve() if path == "." else resolve_in_workspace(ctx.workspace, path)
    if not real.is_dir():
        raise ToolError(f"{path} is not a directory")
    entries = sorted(e.name + ("/" if e.is_dir() else "") for e in real.iterdir())
    shown = entries[:LIST_LIMIT_ENTRIES]
    more = len(entries) - len(shown)
    return "\n".join(shown + ([f"… and {more} more"] if more else [])) or "(empty directory)"


@tool(side_effects=True)
def write_file(
    ctx: ToolContext,
    path: PathArg,
    content: Annotated[
        str, Field(description="The whole new text of the file", max_length=WRITE_LIMIT_CHARS)
    ],
) -> str:
    """Create or overwrite a text file in the workspace with `content`."""
    real = resolve_in_workspace(ctx.workspace, path)
    if real.exists() and not real.is_file():
        raise ToolError(f"{path} exists and is not a regular file")
    real.parent.mkdir(parents=True, exist_ok=True)
    resolve_in_workspace(ctx.workspace, path)  # the parents made must not have raced a symlink in
    fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=".harness-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(content)
    os.replace(tmp, real)
    return f"Wrote {len(content)} characters to {path}"


@tool(side_effects=True)
def delete_file(ctx: ToolContext, path: PathArg) -> str:
    """Delete a file in the workspace."""
    real = resolve_in_workspace(ctx.workspace, path)
    _regular_file(real, path)
    real.unlink()
    return f"Deleted {path}"


BUILTIN_TOOLS: tuple[Tool, ...] = (get_time, read_file, list_files, write_file, delete_file)
