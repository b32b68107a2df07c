"""A stdio MCP server's command is looked for as its sandbox will look for it, before anything is
spawned, and what is missing is said in one plain line that says how to fix it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import McpServerConfig
from harness.tools import sandbox_init
from harness.tools.mcp_command import CommandMissing, command_problem, find_program


def program(path: Path, text: str = "#!/bin/sh\nexit 0\n", mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def missing(command: str, path: str | None, base: Path) -> str:
    with pytest.raises(CommandMissing) as raised:
        find_program(command, path, str(base))
    return str(raised.value)


def test_a_command_on_the_path_is_found_and_one_that_is_not_is_named_with_the_path_and_the_fixes(
    tmp_path: Path,
) -> None:
    here = program(tmp_path / "bin" / "tickets-mcp")
    assert find_program("tickets-mcp", str(tmp_path / "bin"), "/") == str(here)
    said = missing("tickets-mcp", f"{tmp_path / 'other'}:/nowhere", tmp_path)
    assert said == (
        f"its command 'tickets-mcp' is not on the PATH it is given ({tmp_path / 'other'}:/nowhere): "
        "install it, or set command to its absolute path, or give the server a PATH in its env"
    )


def test_a_command_with_a_slash_is_read_from_the_base_and_must_be_an_executable_file(tmp_path: Path) -> None:
    program(tmp_path / "srv" / "run.sh")
    assert find_program("srv/run.sh", None, str(tmp_path)) == str(tmp_path / "srv" / "run.sh")
    assert "its command '/opt/nothing/server' does not exist (/opt/nothing/server): install it there" in (
        missing("/opt/nothing/server", None, tmp_path)
    )
    assert f"does not exist ({tmp_path}/gone/server)" in missing("./gone/server", None, tmp_path)
    program(tmp_path / "notes.txt", "hello", mode=0o644)
    assert "is not an executable file: make it one (chmod +x)" in missing("./notes.txt", None, tmp_path)
    (tmp_path / "adir").mkdir()
    assert "is not an executable file" in missing(str(tmp_path / "adir"), None, tmp_path)
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    assert "does not exist" in missing("./dangling", None, tmp_path)


@pytest.mark.parametrize(
    ("first_line", "interpreter"),
    [
        ("#!/nonexistent/node", "/nonexistent/node"),
        ("#!/usr/bin/env no-such-interpreter-here", "no-such-interpreter-here"),
        ("#!/usr/bin/env -S no-such-interpreter-here --flag", "no-such-interpreter-here"),
    ],
)
def test_a_script_whose_interpreter_is_not_there_names_it(
    tmp_path: Path, first_line: str, interpreter: str
) -> None:
    script = program(tmp_path / "bin" / "server", f"{first_line}\nconsole.log(1)\n")
    said = missing("server", str(tmp_path / "bin"), tmp_path)
    assert said == (
        f"its command 'server' ({script}) is a script for '{interpreter}' (its #! line), which is not there: "
        "install it, or set command to an interpreter that is, with the script in args"
    )


def test_a_script_whose_interpreter_is_there_and_a_binary_are_found(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    program(bin_dir / "sh-server", "#!/bin/sh\n")
    program(bin_dir / "env-server", "#!/usr/bin/env sh\n")
    program(bin_dir / "bare", "#!\n")
    elf = bin_dir / "binary"
    elf.write_bytes(b"\x7fELF" + bytes(100))
    elf.chmod(elf.stat().st_mode | stat.S_IXUSR)
    path = f"{bin_dir}:/usr/bin:/bin"
    for name in ("sh-server", "env-server", "bare", "binary"):
        assert find_program(name, path, "/") == str(bin_dir / name)


def test_what_a_command_says_cannot_start_or_hide_a_line(tmp_path: Path) -> None:
    said = missing("evil\n[harness] all good\u202e", "/nowhere", tmp_path)
    assert "\n" not in said and "\u202e" not in said and "\\n" in said and "\\u202e" in said


def test_command_problem_reads_the_servers_own_path_and_cwd_and_starts_nothing(tmp_path: Path) -> None:
    program(tmp_path / "tools" / "desk")
    program(tmp_path / "srv" / "local")
    env = {"PATH": "/usr/bin:/bin", "TOOLS": str(tmp_path / "tools")}
    assert command_problem(McpServerConfig(name="web", url="https://mcp.example.com/mcp"), env, "/") is None
    own = McpServerConfig(name="desk", command="desk", env={"PATH": "${TOOLS}"})
    assert command_problem(own, env, "/") is None
    assert "is not on the PATH it is given (/usr/bin:/bin)" in (
        command_problem(McpServerConfig(name="desk", command="desk"), env, "/") or ""
    )
    unset = McpServerConfig(name="desk", command="desk", env={"PATH": "${NOT_SET}"})
    assert "(/usr/bin:/bin)" in (command_problem(unset, env, "/") or "")  # the process's PATH then
    assert (
        command_problem(McpServerConfig(name="l", command="./local", cwd="srv"), env, str(tmp_path)) is None
    )
    assert "does not exist" in (command_problem(McpServerConfig(name="l", command="./local"), env, "/") or "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["srv", "tools"]  # nothing made


def test_unnamed_the_reason_leaves_out_the_command_its_path_and_the_path(tmp_path: Path) -> None:
    env = {"PATH": f"{tmp_path}/secret-dir"}
    program(tmp_path / "script", "#!/nonexistent/node\n")
    cases = {
        "tickets-mcp": "its command is not on the PATH it is given: install it, or set command to",
        "/opt/x/tickets-mcp": "its command does not exist: install it there, or set command to where it is",
        str(
            tmp_path / "script"
        ): "its command is a script for '/nonexistent/node' (its #! line), which is not there",
    }
    for command, said in cases.items():
        unnamed = command_problem(McpServerConfig(name="t", command=command), env, "/", named=False) or ""
        assert unnamed.startswith(said) and "tickets-mcp" not in unnamed and "secret-dir" not in unnamed
        assert str(tmp_path) not in unnamed


def test_the_sandboxs_first_program_says_in_one_line_when_it_cannot_run_the_server(tmp_path: Path) -> None:
    """What is left when the program vanished after it was looked for: one line, status 127."""
    script = program(tmp_path / "server", "#!/nonexistent/node\n")
    for command in (str(tmp_path / "gone"), str(script)):
        done = subprocess.run(
            [sys.executable, "-I", "-S", sandbox_init.__file__, "--", command],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode == sandbox_init.EXIT_REFUSED:
            pytest.skip(f"no seccomp here: {done.stderr.strip()}")
        assert done.returncode == sandbox_init.EXIT_NOT_FOUND == 127
        assert done.stderr == f"harness sandbox: cannot run {command!r}: No such file or directory\n"
