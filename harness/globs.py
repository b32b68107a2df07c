"""Globs over tool names and paths: `*` within a segment, `**` across segments, `?` one character;
with `paths`, both sides normalised as the file tools resolve paths first (`normalise_path`)."""

from __future__ import annotations

import functools
import re


def normalise_path(value: str) -> str:
    """`value` as the file tools resolve a path: `\\` is `/`, no empty or `.` segments, `..` applied.

    A `..` with nothing left to cancel stays, so `../x` is never mistaken for `x`.
    """
    value = value.replace("\\", "/")
    absolute = value.startswith("/")
    out: list[str] = []
    for part in value.split("/"):
        if part in ("", "."):
            continue
        if part == ".." and out and out[-1] != "..":
            out.pop()
        elif part == ".." and absolute:
            continue  # above the root is the root
        else:
            out.append(part)
    return ("/" if absolute else "") + "/".join(out)


def glob_match(pattern: str, value: str, *, paths: bool = False) -> bool:
    """Whether `value` matches `pattern`; with `paths`, both are normalised as paths first."""
    if paths:
        pattern, value = normalise_path(pattern), normalise_path(value)
    return _compiled(pattern).fullmatch(value) is not None


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            before_ok = i == 0 or pattern[i - 1] == "/"
            after = i + 2
            if before_ok and pattern.startswith("/", after):
                out.append("(?:.*/)?")  # `**/`: zero or more whole segments
                i = after + 1
                continue
            out.append(".*")
            i = after
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)
