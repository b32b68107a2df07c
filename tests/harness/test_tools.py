"""The built-in tools and the workspace jail."""

from __future__ import annotations

import os
import resource
import stat
import threading
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from harness.tools import BUILTIN_TOOLS, RESULT_LIMIT_CHARS, ToolContext, ToolRegistry, ToolResult, tool


@pytest.fixture
def tools() -> ToolRegistry:
    return ToolRegistry(BUILTIN_TOOLS, timeout_seconds=5)


@pytest.fixture
def ctx(workspace: Path) -> ToolContext:
    return ToolContext(workspace=workspace, now=lambda: datetime(2026, 12, 3, 4, 5, 6, tzinfo=UTC))


def test_get_time_is_iso_utc(tools: ToolRegistry, ctx: ToolContext) -> None:
    assert tools.run("get_time", {}, ctx).content == "2026-12-03T04:05:06Z"


def test_read_file_returns_the_first_2000_characters(tools: ToolRegistry, ctx: ToolContext) -> None:
    (ctx.workspace / "long.txt").write_text("é" * 5000, encoding="utf-8")
    result = tools.run("read_file", {"path": "long.txt"}, ctx)
    assert not result.is_error and result.content == "é" * 2000


def test_list_files_marks_directories(tools: ToolRegistry, ctx: ToolContext) -> None:
    (ctx.workspace / "docs").mkdir()
    assert tools.run("list_files", {}, ctx).content == "README.md\ndocs/"
    assert tools.run("list_files", {"path": "docs"}, ctx).content == "(empty directory)"


def test_write_then_delete_a_file(tools: ToolRegistry, ctx: ToolContext) -> None:
    assert not tools.run("write_file", {"path": "sub/new.txt", "content": "hi"}, ctx).is_error
    assert (ctx.workspace / "sub/new.txt").read_text() == "hi"
    assert not tools.run("delete_file", {"path": "sub/new.txt"}, ctx).is_error
    assert not (ctx.workspace / "sub/new.txt").exists()


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("../outside.txt", "goes up with '..'"),
        ("sub/../../outside.txt", "goes up with '..'"),
        ("/etc/passwd", "absolute path"),
        ("~/.ssh/id_rsa", "absolute path"),
        ("C:\\Windows\\win.ini", "absolute path"),
        ("", "non-empty relative path"),
        ("a\x00b", "non-empty relative path"),
    ],
)
@pytest.mark.parametrize("name", ["read_file", "write_file", "delete_file", "list_files"])
def test_paths_that_leave_the_workspace_are_refused(
    tools: ToolRegistry, ctx: ToolContext, tmp_path: Path, name: str, path: str, words: str
) -> None:
    (tmp_path / "outside.txt").write_text("secret")
    args = {"path": path, "content": "x"} if name == "write_file" else {"path": path}
    result = tools.run(name, args, ctx)
    assert result.is_error and words in result.content
    assert (tmp_path / "outside.txt").read_text() == "secret"


@pytest.mark.parametrize("name", ["read_file", "write_file", "delete_file"])
def test_a_symlink_pointing_outside_is_refused(
    tools: ToolRegistry, ctx: ToolContext, tmp_path: Path, name: str
) -> None:
    (tmp_path / "outside.txt").write_text("secret")
    (ctx.workspace / "link.txt").symlink_to(tmp_path / "outside.txt")
    (ctx.workspace / "linkdir").symlink_to(tmp_path)
    for path in ("link.txt", "linkdir/outside.txt"):
        args = {"path": path, "content": "x"} if name == "write_file" else {"path": path}
        result = tools.run(name, args, ctx)
        assert result.is_error and "outside the workspace" in result.content
    assert (tmp_path / "outside.txt").read_text() == "secret"


@pytest.mark.parametrize("name", ["read_file", "write_file", "delete_file", "list_files"])
def test_a_symlink_is_refused_even_when_it_stays_inside(
    tools: ToolRegistry, ctx: ToolContext, name: str
) -> None:
    readme = ctx.workspace / "README.md"
    (ctx.workspace / "alias.md").symlink_to(readme)
    (ctx.workspace / "docs").mkdir()
    (ctx.workspace / "docs/a.txt").write_text("a")
    (ctx.workspace / "alias").symlink_to(ctx.workspace / "docs")
    for path in ("alias" if name == "list_files" else "alias.md", "alias/a.txt"):
        args = {"path": path, "content": "x"} if name == "write_file" else {"path": path}
        result = tools.run(name, args, ctx)
        assert result.is_error and "is a symbolic link" in result.content
    # delete_file once removed the link's target; now link and target both stay as they were.
    assert (ctx.workspace / "alias.md").is_symlink() and readme.read_text().startswith("# My project")
    assert (ctx.workspace / "docs/a.txt").read_text() == "a"


def test_special_and_binary_files_are_refused(tools: ToolRegistry, ctx: ToolContext) -> None:
    os.mkfifo(ctx.workspace / "pipe")
    (ctx.workspace / "blob.bin").write_bytes(b"\x89PNG\x00\x01\x02")
    (ctx.workspace / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    assert "not a regular file" in tools.run("read_file", {"path": "pipe"}, ctx).content
    assert "binary file" in tools.run("read_file", {"path": "blob.bin"}, ctx).content
    assert tools.run("read_file", {"path": "latin1.txt"}, ctx).is_error
    assert "is a directory" in tools.run("read_file", {"path": "."}, ctx).content
    assert "no such file" in tools.run("read_file", {"path": "nope.txt"}, ctx).content


def test_a_huge_result_is_cut_before_it_reaches_the_model(ctx: ToolContext) -> None:
    @tool()
    def flood(ctx: ToolContext) -> str:
        """Returns megabytes."""
        return "x" * 3_000_000

    result = ToolRegistry([flood]).run("flood", {}, ctx)
    assert len(result.content) < RESULT_LIMIT_CHARS + 200
    assert "3,000,000 characters" in result.content


def test_a_tool_schema_comes_from_its_signature() -> None:
    @tool(side_effects=True)
    def greet(ctx: ToolContext, name: str, times: int = 1) -> str:
        """Say hello."""
        return f"hello {name}" * times

    assert greet.side_effects is True
    assert greet.schema() == {
        "name": "greet",
        "description": "Say hello.",
        "input_schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "times": {"type": "integer", "default": 1}},
            "required": ["name"],
            "additionalProperties": False,
        },
    }


# --- timeouts -------------------------------------------------------------------------------


def test_a_timed_out_call_with_side_effects_says_its_outcome_is_unknown(ctx: ToolContext) -> None:
    release = threading.Event()

    @tool(side_effects=True)
    def deploy(ctx: ToolContext) -> str:
        """Ships the release; hangs until the test lets it go."""
        release.wait(30)
        return "deployed"

    try:
        result = ToolRegistry([deploy], timeout_seconds=0.2).run("deploy", {}, ctx)
    finally:
        release.set()
    assert result.is_error
    assert result.content.startswith("Outcome unknown — it may still complete: deploy ")
    assert "within 0.2 seconds" in result.content and "NOT run again" in result.content
    assert "check its effect before trying again" in result.content


def test_a_timed_out_read_only_call_only_says_it_did_not_finish(ctx: ToolContext) -> None:
    release = threading.Event()

    @tool(side_effects=False)
    def peek(ctx: ToolContext) -> str:
        """Looks; hangs until the test lets it go."""
        release.wait(30)
        return "seen"

    try:
        result = ToolRegistry([peek], timeout_seconds=0.2).run("peek", {}, ctx)
    finally:
        release.set()
    assert result == ToolResult("Error: peek did not finish within 0.2 seconds", True)


# --- hidden files, hard links, absolute paths -------------------------------------------------


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("read_file", ".env"),
        ("read_file", "./.env"),
        ("read_file", ".git/config"),
        ("write_file", ".git/config"),
        ("write_file", ".git/hooks/pre-commit"),
        ("write_file", "docs/.secret/new.txt"),
        ("delete_file", ".env"),
        ("list_files", ".git"),
    ],
)
def test_hidden_paths_are_refused_by_default(
    tools: ToolRegistry, ctx: ToolContext, name: str, path: str
) -> None:
    (ctx.workspace / ".env").write_text("SLACK_BOT_TOKEN=xoxb-secret")
    (ctx.workspace / ".git").mkdir()
    (ctx.workspace / ".git/config").write_text("[core]")
    args = {"path": path, "content": "x"} if name == "write_file" else {"path": path}
    result = tools.run(name, args, ctx)
    assert result.is_error and "hidden" in result.content and "xoxb" not in result.content
    assert (ctx.workspace / ".env").read_text() == "SLACK_BOT_TOKEN=xoxb-secret"
    assert (ctx.workspace / ".git/config").read_text() == "[core]"
    assert sorted(p.name for p in (ctx.workspace / ".git").iterdir()) == ["config"]
    assert not (ctx.workspace / "docs").exists()


def test_list_files_shows_hidden_entries_only_when_allowed(tools: ToolRegistry, ctx: ToolContext) -> None:
    (ctx.workspace / ".env").write_text("TOKEN=1")
    (ctx.workspace / ".git").mkdir()
    assert tools.run("list_files", {}, ctx).content == "README.md"
    allowed = replace(ctx, allow_hidden=True)
    assert tools.run("list_files", {}, allowed).content == ".env\n.git/\nREADME.md"


def test_hidden_paths_work_when_allowed(tools: ToolRegistry, ctx: ToolContext) -> None:
    allowed = replace(ctx, allow_hidden=True)
    (ctx.workspace / ".env").write_text("TOKEN=1")
    assert tools.run("read_file", {"path": ".env"}, allowed).content == "TOKEN=1"
    assert not tools.run("write_file", {"path": ".git/config", "content": "[core]"}, allowed).is_error
    assert (ctx.workspace / ".git/config").read_text() == "[core]"
    assert not tools.run("delete_file", {"path": ".env"}, allowed).is_error
    assert not (ctx.workspace / ".env").exists()


@pytest.mark.parametrize("name", ["read_file", "write_file", "delete_file"])
def test_a_hard_linked_file_is_refused(
    tools: ToolRegistry, ctx: ToolContext, tmp_path: Path, name: str
) -> None:
    outside = tmp_path / "id_rsa"
    outside.write_text("secret")
    os.link(outside, ctx.workspace / "key.txt")
    args = {"path": "key.txt", "content": "x"} if name == "write_file" else {"path": "key.txt"}
    result = tools.run(name, args, ctx)
    assert result.is_error and "key.txt has other hard links" in result.content
    assert "secret" not in result.content
    assert outside.read_text() == "secret" and (ctx.workspace / "key.txt").read_text() == "secret"


def test_no_error_names_the_workspace_by_its_absolute_path(
    tools: ToolRegistry, ctx: ToolContext, tmp_path: Path
) -> None:
    (ctx.workspace / "docs").mkdir()
    (ctx.workspace / "alias.md").symlink_to(ctx.workspace / "README.md")
    os.mkfifo(ctx.workspace / "pipe")
    os.link(ctx.workspace / "README.md", ctx.workspace / "twin.md")
    calls = [
        ("read_file", "README.md/x"),
        ("write_file", "README.md/x"),
        ("delete_file", "README.md/x"),
        ("list_files", "README.md"),
        ("list_files", "README.md/x"),
        ("list_files", "missing"),
        ("read_file", "missing/x"),
        ("write_file", "docs"),
        ("delete_file", "docs"),
        ("read_file", "alias.md"),
        ("delete_file", "pipe"),
        ("write_file", "pipe"),
        ("read_file", "twin.md"),
        ("read_file", "sub/../../x"),
    ]
    for name, path in calls:
        args = {"path": path, "content": "x"} if name == "write_file" else {"path": path}
        result = tools.run(name, args, ctx)
        assert result.is_error, (name, path)
        assert str(tmp_path) not in result.content, result.content
    message = tools.run("read_file", {"path": "README.md/x"}, ctx).content
    assert message == "Error: README.md is not a directory"


# --- how write_file writes ------------------------------------------------------------------


def test_an_overwrite_keeps_the_mode_and_a_new_file_follows_the_umask(
    tools: ToolRegistry, ctx: ToolContext
) -> None:
    script = ctx.workspace / "run.sh"
    script.write_text("echo old")
    script.chmod(0o751)
    old_umask = os.umask(0o027)
    try:
        assert not tools.run("write_file", {"path": "run.sh", "content": "echo new"}, ctx).is_error
        assert not tools.run("write_file", {"path": "new.txt", "content": "hi"}, ctx).is_error
    finally:
        os.umask(old_umask)
    assert script.read_text() == "echo new" and stat.S_IMODE(script.stat().st_mode) == 0o751
    assert stat.S_IMODE((ctx.workspace / "new.txt").stat().st_mode) == 0o640


def test_a_failed_write_keeps_the_old_text_and_leaves_no_temporary_file(
    tools: ToolRegistry, ctx: ToolContext, tmp_path: Path
) -> None:
    target = ctx.workspace / "notes.txt"
    target.write_text("old")
    # A file-size limit makes the kernel refuse the write part-way, as a full disk would.
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        result = tools.run("write_file", {"path": "notes.txt", "content": "x" * 10_000}, ctx)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert result.is_error and result.content.startswith("Error: notes.txt: ")
    assert str(tmp_path) not in result.content
    assert target.read_text() == "old"
    assert sorted(os.listdir(ctx.workspace)) == ["README.md", "notes.txt"]


def test_a_write_is_flushed_to_disk_file_first_then_its_directory(
    tools: ToolRegistry, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushed: list[tuple[bool, int]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        info = os.fstat(fd)
        flushed.append((stat.S_ISDIR(info.st_mode), info.st_ino))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    assert not tools.run("write_file", {"path": "sub/new.txt", "content": "hi"}, ctx).is_error
    written, parent = (ctx.workspace / "sub/new.txt").stat(), (ctx.workspace / "sub").stat()
    assert flushed == [(False, written.st_ino), (True, parent.st_ino)]


def test_no_call_leaves_a_file_descriptor_open(tools: ToolRegistry, ctx: ToolContext) -> None:
    (ctx.workspace / "docs").mkdir()
    (ctx.workspace / "alias").symlink_to(ctx.workspace / "docs")
    calls = [
        ("read_file", {"path": "README.md"}),
        ("read_file", {"path": "docs/missing.txt"}),
        ("read_file", {"path": "alias/x.txt"}),
        ("list_files", {"path": "docs"}),
        ("list_files", {"path": "README.md"}),
        ("write_file", {"path": "docs/deep/a.txt", "content": "a"}),
        ("write_file", {"path": "README.md/a.txt", "content": "a"}),
        ("delete_file", {"path": "docs/deep/a.txt"}),
        ("delete_file", {"path": "docs"}),
    ]
    tools.run("get_time", {}, ctx)  # the lane's thread exists before counting
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        for name, args in calls:
            tools.run(name, args, ctx)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_tools_own_result_is_bounded_whatever_it_returns(ctx: ToolContext) -> None:
    """A module tool may build its `ToolResult` itself: 60 MB of it must not reach the run record."""

    @tool(side_effects=False)
    def flood(ctx: ToolContext) -> str:
        """Returns far too much."""
        return ToolResult("y" * 60_000_000)  # type: ignore[return-value]

    @tool(side_effects=False)
    def flood_blocks(ctx: ToolContext) -> str:
        """Returns far too much, in blocks."""
        return ToolResult([{"type": "text", "text": "z" * 30_000_000}] * 2)  # type: ignore[return-value]

    registry = ToolRegistry([flood, flood_blocks])
    one = registry.run("flood", {}, ctx)
    assert isinstance(one.content, str) and len(one.content) < RESULT_LIMIT_CHARS + 200
    assert "60,000,000" in one.content  # it says how much there was
    two = registry.run("flood_blocks", {}, ctx)
    assert sum(len(b["text"]) for b in two.content if b["type"] == "text") < RESULT_LIMIT_CHARS + 200
