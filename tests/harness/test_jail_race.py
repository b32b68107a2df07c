"""The workspace jail under a race: a directory on the path swapped for a symlink, over and over."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import pytest

from harness.tools import BUILTIN_TOOLS, ToolContext, ToolRegistry

ROUNDS = 1500  # rounds of tool calls by the main thread while the swapping goes on
MAX_SWAPS = 2_000_000  # bounds the swapping thread even if the main thread stalls

_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange(a: Path, b: Path) -> None:
    """Swap two names in one step (renameat2 RENAME_EXCHANGE), so the path never goes missing."""
    if _libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the workspace holding what must never be read, written or deleted."""
    root = tmp_path / "outside"
    root.mkdir()
    (root / "file.txt").write_text("secret")
    (root / "victim.txt").write_text("secret")
    (root / "only-outside.txt").write_text("secret")
    return root


def test_swapping_a_directory_for_a_symlink_never_lets_a_tool_out(workspace: Path, outside: Path) -> None:
    if not hasattr(_libc, "renameat2"):
        pytest.skip("this libc has no renameat2")
    sub = workspace / "sub"
    sub.mkdir()
    (sub / "file.txt").write_text("inside")
    evil = workspace / "evil"
    evil.symlink_to(outside)  # swapped with sub: sub is a real directory one moment, a symlink the next
    tools = ToolRegistry(BUILTIN_TOOLS, timeout_seconds=5)
    ctx = ToolContext(workspace=workspace)
    finished = threading.Event()
    swaps = 0

    def swap() -> None:
        nonlocal swaps
        while not finished.is_set() and swaps < MAX_SWAPS:
            exchange(sub, evil)
            swaps += 1

    racer = threading.Thread(target=swap, name="swapper")
    racer.start()
    answers: list[str] = []
    try:
        for _ in range(ROUNDS):
            for name, args in (
                ("read_file", {"path": "sub/file.txt"}),
                ("list_files", {"path": "sub"}),
                ("write_file", {"path": "sub/file.txt", "content": "written"}),
                ("write_file", {"path": "sub/deep/new.txt", "content": "written"}),
                ("write_file", {"path": "sub/victim.txt", "content": "inside"}),
                ("delete_file", {"path": "sub/victim.txt"}),
            ):
                answers.append(tools.run(name, args, ctx).content)
    finally:
        finished.set()
        racer.join()

    assert not [a for a in answers if "secret" in a or "only-outside" in a]
    assert sorted(p.name for p in outside.iterdir()) == ["file.txt", "only-outside.txt", "victim.txt"]
    assert {p.read_text() for p in outside.iterdir()} == {"secret"}
    # Not vacuous: the tools met the symlink and the real directory, many times each.
    assert swaps > ROUNDS
    assert sum("symbolic link" in a for a in answers) > 10
    assert sum(a.startswith("Wrote") for a in answers) > 10
