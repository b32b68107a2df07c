"""The built-in tools: the clock and the file tools, jailed in the workspace.

Every file tool walks its path one name at a time from the workspace root (see "the workspace
jail" below): no symlink, hard link, hidden name or `..` takes it outside.
"""

from __future__ import annotations

import difflib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import UTC
from pathlib import PurePosixPath
from typing import Annotated, Any

from pydantic import Field

from harness import texts
from harness.policy import Tier
from harness.tools.base import Tool, ToolContext, ToolError, tool

READ_LIMIT_CHARS = 2000
LIST_LIMIT_ENTRIES = 200
WRITE_LIMIT_CHARS = 1_000_000


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


@tool(side_effects=False)
def get_time(ctx: ToolContext) -> str:
    """Get the current date and time (UTC, ISO 8601)."""
    return ctx.now().astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@tool(side_effects=False)
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


@tool(side_effects=False)
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


PREVIEW_READ_BYTES = 512 * 1024


def _write_preview(ctx: ToolContext, args: dict[str, Any]) -> str | None:
    """A unified diff of what `write_file` would change (or that it makes a new file)."""
    path, content = args.get("path"), args.get("content")
    if not isinstance(path, str) or not isinstance(content, str):
        return None
    try:
        with _walk(ctx, path) as place:
            info = _lstat(place)
            if info is None:
                return texts.PREVIEW_NEW_FILE.format(path=place.rel, chars=len(content))
            _plain_file(info, place.rel)
            flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(place.name, flags, dir_fd=place.dir_fd), "rb") as handle:
                _plain_file(os.fstat(handle.fileno()), place.rel)
                raw = handle.read(PREVIEW_READ_BYTES + 1)
    except ToolError:
        return None  # the call itself will say what is wrong with the path
    if b"\x00" in raw or len(raw) > PREVIEW_READ_BYTES:
        return texts.PREVIEW_TOO_BIG.format(path=place.rel)
    old = raw.decode("utf-8", errors="replace")
    diff = difflib.unified_diff(
        old.splitlines(), content.splitlines(), f"a/{place.rel}", f"b/{place.rel}", lineterm="", n=2
    )
    return "\n".join(diff) or texts.PREVIEW_NO_CHANGE


@tool(preview=_write_preview)
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


PREVIEW_REMOVED_LINES = 40  # of a file `delete_file` would remove, shown on its card


def _delete_preview(ctx: ToolContext, args: dict[str, Any]) -> str | None:
    """What `delete_file` would remove: the file's size, and its first lines as a diff removes them."""
    path = args.get("path")
    if not isinstance(path, str):
        return None
    try:
        with _walk(ctx, path) as place:
            _plain_file(_lstat(place), place.rel)
            flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(place.name, flags, dir_fd=place.dir_fd), "rb") as handle:
                size = _plain_file(os.fstat(handle.fileno()), place.rel).st_size
                raw = handle.read(PREVIEW_READ_BYTES + 1)
    except ToolError:
        return None  # the call itself will say what is wrong with the path
    if b"\x00" in raw or len(raw) > PREVIEW_READ_BYTES:
        return texts.PREVIEW_REMOVES_UNSHOWN.format(path=place.rel, size=size)
    lines = raw.decode("utf-8", errors="replace").splitlines()
    head = "\n".join(f"-{line}" for line in lines[:PREVIEW_REMOVED_LINES])
    more = len(lines) - PREVIEW_REMOVED_LINES
    said = texts.PREVIEW_REMOVES.format(path=place.rel, lines=len(lines), size=size)
    return "\n".join(p for p in (said, f"--- a/{place.rel}", "+++ /dev/null", head) if p) + (
        "\n" + texts.PREVIEW_REMOVES_MORE.format(more=more) if more > 0 else ""
    )


@tool(preview=_delete_preview)
def delete_file(ctx: ToolContext, path: PathArg) -> str:
    """Delete a file in the workspace."""
    with _walk(ctx, path) as place:
        _plain_file(_lstat(place), place.rel)
        # unlink never follows a symlink: a name swapped after the check loses only that name.
        os.unlink(place.name, dir_fd=place.dir_fd)
        os.fsync(place.dir_fd)
    return texts.FILE_DELETED.format(path=place.rel)


def _with_own_tier(found: Tool, tier: Tier) -> Tool:
    return replace(found, own_tier=tier, own_tier_why=texts.WHY_BUILTIN)


# Step 3 of the tier order: what reads is allowed, what writes asks.
# Each file tool's `path` names a place in the workspace; write_file's `content` is the file's text,
# never read as a path (so a slash in it does not keep a directory grant from covering the call).
BUILTIN_TOOLS: tuple[Tool, ...] = (
    _with_own_tier(get_time, Tier.ALLOW),
    replace(_with_own_tier(read_file, Tier.ALLOW), listed_paths=("path",)),
    replace(_with_own_tier(list_files, Tier.ALLOW), listed_paths=("path",)),
    replace(_with_own_tier(write_file, Tier.ASK), listed_paths=("path",), text_arguments=("content",)),
    replace(_with_own_tier(delete_file, Tier.ASK), listed_paths=("path",)),
)
BUILTIN_NAMES: tuple[str, ...] = tuple(t.name for t in BUILTIN_TOOLS)
