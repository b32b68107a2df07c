"""Tools the model may call: one typed, documented function each.

A tool is a plain function whose first parameter is the `ToolContext`; its other parameters
(with `Annotated[..., Field(description=...)]`) become a pydantic model, and that model is both
the JSON schema sent to the model and the validator of the model's input. Failures never raise
out of `ToolRegistry.run`: they come back as an `is_error` result for the model to read.
"""

from __future__ import annotations

import errno
import inspect
import os
import queue
import secrets
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
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


class _TimedOut(Exception):
    """A call that outlived the registry's timeout; its thread may still be running it."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool may touch: the workspace root, whether hidden paths in it are allowed, a clock."""

    workspace: Path
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    # `[tools] allow_hidden`: off, .env and .git are not one read or write away from the model.
    allow_hidden: bool = False


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
        except _TimedOut:
            # A side effect may still land after this answer; a retry by the model could apply it twice.
            text = texts.RESULT_TIMED_OUT_OUTCOME_UNKNOWN if found.side_effects else texts.RESULT_TIMED_OUT
            return ToolResult(text.format(name=name, seconds=self._timeout), True)
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
            raise _TimedOut(found.name)
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
#
# A path is never resolved and then opened by name: between the two, a directory on the way could
# be swapped for a symlink. Instead it is walked one name at a time, each step opened relative to
# the directory opened before it and never through a symlink, so the object checked is the object
# used. Whatever a name holds later, the open directory descriptors still point inside.

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class _Place:
    """A path in the workspace held as an open directory and one name in it."""

    dir_fd: int
    name: str  # "" when the place is the open directory itself
    rel: str  # how messages name it: relative to the workspace, never absolute


def _path_parts(raw: str, allow_hidden: bool = False) -> tuple[str, ...]:
    """The names on the relative path `raw`, or `ToolError` if it is absolute, goes up or is hidden."""
    if not raw or "\x00" in raw:
        raise ToolError(texts.FILE_BAD_PATH)
    rel = PurePosixPath(raw.replace("\\", "/"))
    if rel.is_absolute() or raw.startswith("~") or (len(raw) > 1 and raw[1] == ":"):
        raise ToolError(texts.FILE_ABSOLUTE.format(path=raw))
    if ".." in rel.parts:
        raise ToolError(texts.FILE_GOES_UP.format(path=raw))
    if not allow_hidden and any(part.startswith(".") for part in rel.parts):
        raise ToolError(texts.FILE_HIDDEN.format(path=rel.as_posix()))
    return rel.parts


@contextmanager
def _walk(ctx: ToolContext, raw: str, *, make_parents: bool = False, whole: bool = False) -> Iterator[_Place]:
    """Open the directories of `raw` one by one from the workspace root, never through a symlink.

    `whole`: every name is a directory and the place is the last one; otherwise the place is the
    last name inside its open parent. `make_parents` makes missing directories on the way, each
    inside the directory just opened. An `OSError` in the body becomes a `ToolError` naming `rel`.
    """
    parts = _path_parts(raw, ctx.allow_hidden)
    rel = "/".join(parts) or "."
    try:
        fd = os.open(ctx.workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ToolError(texts.FILE_NO_WORKSPACE.format(reason=exc.strerror)) from None
    try:
        for depth, part in enumerate(parts if whole else parts[:-1], start=1):
            child = _enter(fd, part, "/".join(parts[:depth]), make_parents)
            os.close(fd)
            fd = child
        try:
            yield _Place(fd, "" if whole or not parts else parts[-1], rel)
        except OSError as exc:
            raise _refusal(exc, rel) from None
    finally:
        os.close(fd)


def _enter(parent: int, name: str, rel: str, make: bool) -> int:
    """The directory `name` in `parent`, opened without following a symlink; made first if asked."""
    try:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not make:
                raise
            with suppress(FileExistsError):  # made meanwhile by someone else: open what is there
                os.mkdir(name, dir_fd=parent)
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except NotADirectoryError:
        # O_NOFOLLOW | O_DIRECTORY says "not a directory" for a symlink too; tell the two apart.
        with suppress(OSError):
            if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                raise ToolError(texts.FILE_SYMLINK.format(path=rel)) from None
        raise ToolError(texts.FILE_NOT_DIRECTORY.format(path=rel)) from None
    except OSError as exc:
        raise _refusal(exc, rel) from None


def _refusal(exc: OSError, rel: str) -> ToolError:
    """What the kernel refused, for the model: `exc.filename` may be absolute, so only `rel` is named."""
    known = {
        errno.ENOENT: texts.FILE_NOT_FOUND,
        errno.ELOOP: texts.FILE_SYMLINK,  # O_NOFOLLOW met a symlink swapped in after the check
        errno.ENOTDIR: texts.FILE_NOT_DIRECTORY,
        errno.EISDIR: texts.FILE_IS_DIRECTORY,
    }
    if exc.errno in known:
        return ToolError(known[exc.errno].format(path=rel))
    return ToolError(texts.FILE_OS_ERROR.format(path=rel, reason=exc.strerror or type(exc).__name__))


def _lstat(place: _Place) -> os.stat_result | None:
    """What `place` names, itself (not a symlink's target); None if nothing; a symlink is refused."""
    if not place.name:
        raise ToolError(texts.FILE_IS_DIRECTORY.format(path=place.rel))
    try:
        info = os.stat(place.name, dir_fd=place.dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise ToolError(texts.FILE_SYMLINK.format(path=place.rel))
    return info


def _plain_file(info: os.stat_result | None, rel: str) -> os.stat_result:
    """`info` if it is a regular file with one link; a second link may be a file from outside."""
    if info is None:
        raise ToolError(texts.FILE_NOT_FOUND.format(path=rel))
    if stat.S_ISDIR(info.st_mode):
        raise ToolError(texts.FILE_IS_DIRECTORY.format(path=rel))
    if not stat.S_ISREG(info.st_mode):
        raise ToolError(texts.FILE_NOT_REGULAR.format(path=rel))
    if info.st_nlink > 1:
        raise ToolError(texts.FILE_HARD_LINK.format(path=rel))
    return info


def _replace(place: _Place, data: bytes, mode: int | None) -> None:
    """Write `data` beside `place`, flush it, rename it over `place`, then flush the directory.

    `mode` None: a new file, 0o666 under the umask as open() would make it. No temporary file is
    left behind, whatever fails.
    """
    tmp = f".harness-{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    # An overwrite starts private and takes the old mode before any byte of the new text lands.
    fd = os.open(tmp, flags, 0o666 if mode is None else 0o600, dir_fd=place.dir_fd)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, place.name, src_dir_fd=place.dir_fd, dst_dir_fd=place.dir_fd)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp, dir_fd=place.dir_fd)
        raise
    os.fsync(place.dir_fd)  # the rename survives a crash only once its directory is on disk


# --- the built-in tools ---------------------------------------------------------------------

PathArg = Annotated[str, Field(description="Path relative to the workspace root", max_length=1024)]


@tool()
def get_time(ctx: ToolContext) -> str:
    """Get the current date and time (UTC, ISO 8601)."""
    return ctx.now().astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@tool()
def read_file(ctx: ToolContext, path: PathArg) -> str:
    """Read a text file in the workspace and return its first 2000 characters."""
    with _walk(ctx, path) as place:
        # Checked before opening: opening a device or a FIFO can itself do something.
        _plain_file(_lstat(place), place.rel)
        # O_NONBLOCK: a FIFO swapped in after the check must not hang the worker.
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(place.name, flags, dir_fd=place.dir_fd), "rb") as handle:
            _plain_file(os.fstat(handle.fileno()), place.rel)  # what was opened, whatever swapped in
            head = handle.read(READ_LIMIT_CHARS * 4)
    if b"\x00" in head:
        raise ToolError(texts.FILE_BINARY.format(path=place.rel))
    text = head.decode("utf-8", errors="ignore" if len(head) == READ_LIMIT_CHARS * 4 else "strict")
    return text[:READ_LIMIT_CHARS]


@tool()
def list_files(
    ctx: ToolContext,
    path: Annotated[str, Field(description="Directory relative to the workspace root")] = ".",
) -> str:
    """List the entries of a directory in the workspace (directories end with '/')."""
    with _walk(ctx, path, whole=True) as place, os.scandir(place.dir_fd) as found:
        entries = sorted(
            entry.name + ("/" if entry.is_dir(follow_symlinks=False) else "")
            for entry in found
            if ctx.allow_hidden or not entry.name.startswith(".")
        )
    shown = entries[:LIST_LIMIT_ENTRIES]
    more = len(entries) - len(shown)
    listing = shown + ([texts.FILE_MORE_ENTRIES.format(more=more)] if more else [])
    return "\n".join(listing) or texts.FILE_EMPTY_DIRECTORY


@tool(side_effects=True)
def write_file(
    ctx: ToolContext,
    path: PathArg,
    content: Annotated[
        str, Field(description="The whole new text of the file", max_length=WRITE_LIMIT_CHARS)
    ],
) -> str:
    """Create or overwrite a text file in the workspace with `content`."""
    data = content.encode("utf-8")
    with _walk(ctx, path, make_parents=True) as place:
        info = _lstat(place)
        mode = None
        if info is not None:
            # Permission bits only: writing a file clears its set-id bits anyway.
            mode = stat.S_IMODE(_plain_file(info, place.rel).st_mode) & 0o777
        _replace(place, data, mode)
    return texts.FILE_WROTE.format(chars=len(content), path=place.rel)


@tool(side_effects=True)
def delete_file(ctx: ToolContext, path: PathArg) -> str:
    """Delete a file in the workspace."""
    with _walk(ctx, path) as place:
        _plain_file(_lstat(place), place.rel)
        # unlink never follows a symlink: a name swapped after the check loses only that name.
        os.unlink(place.name, dir_fd=place.dir_fd)
        os.fsync(place.dir_fd)
    return texts.FILE_DELETED.format(path=place.rel)


BUILTIN_TOOLS: tuple[Tool, ...] = (get_time, read_file, list_files, write_file, delete_file)
