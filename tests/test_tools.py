"""The built-in tools and the workspace jail."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from harness.tools import BUILTIN_TOOLS, RESULT_LIMIT_CHARS, ToolContext, ToolRegistry, tool


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


def test_a_symlink_inside_the_workspace_is_followed(tools: ToolRegistry, ctx: ToolContext) -> None:
    (ctx.workspace / "alias.md").symlink_to(ctx.workspace / "README.md")
    assert tools.run("read_file", {"path": "alias.md"}, ctx).content.startswith("# My project")


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
