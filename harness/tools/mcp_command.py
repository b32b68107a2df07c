"""Whether a stdio MCP server's command can be run: found as its sandbox will find it, said plainly.

A command that is not there would otherwise surface as a spawn error (`FileNotFoundError: [Errno
2] …`) or, once inside bubblewrap, as the exec error of the sandbox's first program. So the program
is looked for before anything is spawned, the way the spawn looks for it: a command with a `/` from
the server's `cwd` (or the process's working directory), any other on the `PATH` the server is
given (its own `env` PATH, else the process's). A script's `#!` interpreter is looked for too. What
is missing is said in one line that names it and says how to fix it (`CommandMissing`).

The worker's hub (through `harness.tools.sandbox`) and the playground's page ask the same question
(`command_problem`), so the page shows a server as down for the reason the worker logs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from harness import texts
from harness.config import ConfigError, McpServerConfig

_SHOWN_PATH = 300  # characters of a PATH shown in a reason


class CommandMissing(RuntimeError):
    """A stdio server's command (or its script's interpreter) is not there: it is not started.

    Its message is the whole log line's reason, with how to fix it: it is never cut. `unnamed`
    says the same without the command, its path or the PATH (for the playground's page).
    """

    def __init__(self, said: str, **named: str) -> None:
        self.said, self.named = said, named
        super().__init__(said.format(**_filled(named, full=True)))

    def unnamed(self) -> str:
        """The reason with what the config names left out (a script's interpreter stays: its own)."""
        return self.said.format(**_filled(self.named, full=False))


def _filled(named: Mapping[str, str], *, full: bool) -> dict[str, str]:
    """The template's fields: ` 'command'`, ` (path)`, or nothing when not `full`."""
    out = {}
    for key, value in named.items():
        if key == "interpreter":
            out[key] = value
        elif not full:
            out[key] = ""
        else:
            out[key] = f" '{value}'" if key == "command" else f" ({value})"
    return out


def _plain(text: str) -> str:
    """`text` with every character that could move, hide or start a line written as an escape."""
    return repr(text)[1:-1]


def find_program(command: str, path: str | None, base: str) -> str:
    """The program `command` names, found as the spawn would find it (`base`: where a relative
    command is read from); `CommandMissing`, saying what is missing and how to fix it, if not."""
    shown = _plain(command)
    if os.sep in command:
        program = os.path.abspath(os.path.join(base, command))
        where = _plain(program)
        if not os.path.exists(program):
            raise CommandMissing(texts.MCP_COMMAND_NO_FILE, command=shown, where=where)
        if not os.path.isfile(program) or not os.access(program, os.X_OK):
            raise CommandMissing(texts.MCP_COMMAND_NOT_EXECUTABLE, command=shown, where=where)
    else:
        found = shutil.which(command, path=path)
        if found is None:
            searched = _plain(path or os.defpath)
            searched = searched if len(searched) <= _SHOWN_PATH else searched[: _SHOWN_PATH - 1] + "…"
            raise CommandMissing(texts.MCP_COMMAND_NOT_ON_PATH, command=shown, path=searched)
        program = found
    missing = _missing_interpreter(program, path)
    if missing is not None:
        said = texts.MCP_COMMAND_NO_INTERPRETER
        raise CommandMissing(said, command=shown, where=_plain(program), interpreter=_plain(missing))
    return program


def shebang(program: str) -> list[str]:
    """The words of a script's `#!` line (its interpreter first); empty for a program that is no script."""
    try:
        with open(program, "rb") as file:
            head = file.read(512)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    return head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()


def _missing_interpreter(program: str, path: str | None) -> str | None:
    """The interpreter a script's `#!` line names, when it is not there (`#!/usr/bin/env NAME`:
    NAME on `path`); None for a program that is no script, or whose interpreter is there."""
    words = shebang(program)
    if not words:
        return None
    interpreter = words[0]
    if not os.path.exists(interpreter):
        return interpreter
    if os.path.basename(interpreter) != "env":
        return None
    named = next((w for w in words[1:] if not w.startswith("-") and "=" not in w), None)
    if named is None or os.sep in named or shutil.which(named, path=path) is not None:
        return None
    return named


def command_problem(
    server: McpServerConfig, environ: Mapping[str, str], workdir: str, *, named: bool = True
) -> str | None:
    """Why `server`'s command cannot be run here (as `find_program` says it; without the command,
    its path or the PATH unless `named`), or None: an HTTP server, or a command that is there.
    Nothing is started and no directory is made."""
    if server.command is None:
        return None
    try:
        own_path = server.resolved(environ).env.get("PATH")
    except ConfigError:
        own_path = None  # a `${VAR}` not set: the worker says so at start, in its own words
    path = own_path if own_path is not None else environ.get("PATH")
    base = os.path.abspath(os.path.join(workdir, server.cwd)) if server.cwd else workdir
    try:
        find_program(server.command, path, base)
    except CommandMissing as exc:
        return str(exc) if named else exc.unnamed()
    return None
