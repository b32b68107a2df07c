"""Operator tool modules: `[tools] modules` names real modules whose `@tool()` functions are offered."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.config import ConfigError, load_config
from harness.tools import BUILTIN_NAMES, ToolContext
from harness.tools.catalog import Catalog
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.harness.test_cli import cli_env, harness

Write = Callable[[str, str], Path]

TICKETS = '''
from typing import Annotated

from pydantic import Field

from harness.tools import ToolContext, tool


@tool()
def open_ticket(
    ctx: ToolContext,
    title: Annotated[str, Field(description="One line saying what is wrong")],
    priority: Annotated[int, Field(description="1 (urgent) to 4", ge=1, le=4)] = 3,
) -> str:
    """Open a ticket in the ops queue.

    Returns the new ticket's id.
    """
    (ctx.workspace / "tickets.txt").write_text(f"{priority} {title}", encoding="utf-8")
    return f"T-{priority}"


@tool(side_effects=False)
def count_tickets(ctx: ToolContext) -> str:
    """How many tickets are open."""
    return "7"


def helper() -> str:
    return "not a tool"
'''


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Write]:
    """Write modules into a fresh directory on `sys.path`; they leave `sys.modules` after the test."""
    root = tmp_path / "operator"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    written: list[str] = []

    def write(name: str, source: str) -> Path:
        path = root.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        for package in path.relative_to(root).parents:
            if package != Path("."):
                (root / package / "__init__.py").touch()
        path.write_text(textwrap.dedent(source), encoding="utf-8")
        importlib.invalidate_caches()  # a directory listed by an earlier import gained a file
        written.append(name)
        return path

    yield write
    for name in list(sys.modules):
        if any(name == w or name.startswith(w + ".") or w.startswith(name + ".") for w in written):
            del sys.modules[name]


def catalog(tmp_path: Path, toml: str) -> Catalog:
    path = tmp_path / "harness.toml"
    path.write_text(toml, encoding="utf-8")
    return Catalog.from_config(load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)}))


def config_error(tmp_path: Path, toml: str) -> str:
    with pytest.raises(ConfigError) as caught:
        catalog(tmp_path, toml)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_modules_tools_are_offered_with_schema_and_description(tmp_path: Path, write_module: Write) -> None:
    write_module("ops_tickets", TICKETS)
    registry = catalog(tmp_path, "[tools]\nmodules = ['ops_tickets']\n").registry()

    assert registry.names() == [*BUILTIN_NAMES, "open_ticket", "count_tickets"]
    opened = registry.get("open_ticket")
    assert opened is not None
    assert opened.schema() == {
        "name": "open_ticket",
        "description": "Open a ticket in the ops queue.\n\nReturns the new ticket's id.",
        "input_schema": {
            "type": "object",
            "properties": {
                "title": {"type": "string", "description": "One line saying what is wrong"},
                "priority": {
                    "type": "integer",
                    "description": "1 (urgent) to 4",
                    "minimum": 1,
                    "maximum": 4,
                    "default": 3,
                },
            },
            "required": ["title"],
            "additionalProperties": False,
        },
    }
    counted = registry.get("count_tickets")
    assert counted is not None and counted.input_schema["properties"] == {}
    assert counted.description == "How many tickets are open."
    assert (opened.side_effects, counted.side_effects) == (True, False)
    assert opened.own_tier is None and opened.module == "ops_tickets"
    assert "helper" not in registry


def test_a_module_tool_runs_with_checked_input(tmp_path: Path, write_module: Write) -> None:
    write_module("ops_tickets", TICKETS)
    registry = catalog(tmp_path, "[tools]\nmodules = ['ops_tickets']\n").registry()
    ctx = ToolContext(workspace=tmp_path)

    done = registry.run("open_ticket", {"title": "disk full", "priority": 1}, ctx)
    assert (done.text, done.is_error) == ("T-1", False)
    assert (tmp_path / "tickets.txt").read_text() == "1 disk full"
    for bad in (
        {"priority": 2},
        {"title": "x", "priority": 9},
        {"title": "x", "colour": "red"},
        {"title": 3},
    ):
        refused = registry.run("open_ticket", bad, ctx)
        assert refused.is_error and refused.text.startswith("Error: invalid input for open_ticket")
    assert (tmp_path / "tickets.txt").read_text() == "1 disk full"


def test_an_imported_tool_is_offered_once_by_the_module_that_defines_it(
    tmp_path: Path, write_module: Write
) -> None:
    write_module("ops_shared", TICKETS)
    write_module(
        "ops_more",
        """
        from harness.tools import ToolContext, tool
        from ops_shared import count_tickets, open_ticket  # re-exported, not defined here

        @tool(side_effects=False)
        def ping(ctx: ToolContext) -> str:
            '''Answer pong.'''
            return "pong"
        """,
    )
    both = catalog(tmp_path, "[tools]\nbuiltin = []\nmodules = ['ops_more', 'ops_shared']\n").registry()
    assert both.names() == ["ping", "open_ticket", "count_tickets"]
    alone = catalog(tmp_path, "[tools]\nbuiltin = []\nmodules = ['ops_more']\n").registry()
    assert alone.names() == ["ping"]


def test_a_tool_in_a_package_module_is_offered(tmp_path: Path, write_module: Write) -> None:
    write_module("acme.tools.tickets", TICKETS)
    registry = catalog(tmp_path, "[tools]\nbuiltin = []\nmodules = ['acme.tools.tickets']\n").registry()
    assert registry.names() == ["open_ticket", "count_tickets"]


@pytest.mark.parametrize("name", ["ops.tools.tickets", "store", "gates.extra"])
def test_a_module_under_one_of_the_projects_own_package_names_is_refused_in_one_line(
    tmp_path: Path, name: str
) -> None:
    with pytest.raises(ConfigError, match=f"{name!r} is inside .*a package of this project"):
        catalog(tmp_path, f"[tools]\nbuiltin = []\nmodules = ['{name}']\n").registry()


def test_builtin_lists_the_only_built_ins_offered(tmp_path: Path, write_module: Write) -> None:
    write_module("ops_tickets", TICKETS)
    registry = catalog(tmp_path, "[tools]\nbuiltin = ['read_file']\nmodules = ['ops_tickets']\n").registry()
    assert registry.names() == ["read_file", "open_ticket", "count_tickets"]
    assert catalog(tmp_path, "[tools]\nbuiltin = ['read_file']\n").registry().names() == ["read_file"]


FUTURE = '''
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from harness.tools import tool

if TYPE_CHECKING:  # where a type checker's import rules put a name used only in annotations
    from harness.tools import ToolContext


@tool(side_effects=False)
def shout(
    ctx: ToolContext, word: Annotated[str, Field(description="A word to shout")], times: int = 1
) -> str:
    """Shout a word."""
    return " ".join([word.upper()] * times)
'''


def test_a_module_with_postponed_annotations_works(tmp_path: Path, write_module: Write) -> None:
    write_module("ops_future", FUTURE)
    registry = catalog(tmp_path, "[tools]\nbuiltin = []\nmodules = ['ops_future']\n").registry()
    shout = registry.get("shout")
    assert shout is not None
    assert shout.input_schema["properties"] == {
        "word": {"type": "string", "description": "A word to shout"},
        "times": {"type": "integer", "default": 1},
    }
    assert registry.run("shout", {"word": "hi", "times": 2}, ToolContext(workspace=tmp_path)).text == "HI HI"


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("raise RuntimeError('no database here\\nsecond line')\n", "RuntimeError: no database here"),
        ("def broken(:\n", "SyntaxError"),
        ("import no_such_dependency_of_ops\n", "ModuleNotFoundError"),
        (
            "from harness.tools import tool\n@tool()\ndef bad(ctx, x: 'NoSuchType') -> str:\n    return ''\n",
            "NameError",
        ),
    ],
)
def test_a_module_that_fails_to_import_is_one_line_naming_it(
    tmp_path: Path, write_module: Write, source: str, kind: str
) -> None:
    write_module("ops_broken", source)
    message = config_error(tmp_path, "[tools]\nmodules = ['ops_broken']\n")
    assert "tools.modules" in message and "'ops_broken'" in message and kind in message


def test_a_missing_module_is_one_line_naming_it(tmp_path: Path) -> None:
    message = config_error(tmp_path, "[tools]\nmodules = ['ops_not_installed']\n")
    assert "tools.modules" in message and "'ops_not_installed'" in message


def test_a_module_with_no_tools_is_an_error(tmp_path: Path, write_module: Write) -> None:
    write_module("ops_empty", "def helper() -> str:\n    return ''\n")
    message = config_error(tmp_path, "[tools]\nmodules = ['ops_empty']\n")
    assert "'ops_empty'" in message and "defines no tools" in message


READER = '''
from harness.tools import ToolContext, tool


@tool(side_effects=False)
def read_file(ctx: ToolContext, path: str) -> str:
    """Read a file my way."""
    return path
'''


def test_a_module_tool_named_like_a_built_in_is_an_error_naming_it(
    tmp_path: Path, write_module: Write
) -> None:
    write_module("ops_reader", READER)
    clash = config_error(tmp_path, "[tools]\nmodules = ['ops_reader']\n")
    assert "'read_file'" in clash and "ops_reader" in clash


def test_two_modules_defining_one_name_is_an_error_naming_it(tmp_path: Path, write_module: Write) -> None:
    write_module("ops_tickets", TICKETS)
    write_module("ops_tickets_too", TICKETS)
    twice = config_error(tmp_path, "[tools]\nbuiltin = []\nmodules = ['ops_tickets', 'ops_tickets_too']\n")
    assert "'open_ticket'" in twice and "ops_tickets_too" in twice
    alone = catalog(tmp_path, "[tools]\nbuiltin = []\nmodules = ['ops_tickets']\n")
    assert alone.registry().names() == ["open_ticket", "count_tickets"]


def test_a_module_tool_may_not_take_an_mcp_servers_prefix_or_a_bad_name(
    tmp_path: Path, write_module: Write
) -> None:
    write_module(
        "ops_shadow",
        """
        from harness.tools import ToolContext, tool

        @tool(side_effects=False)
        def tickets__list(ctx: ToolContext) -> str:
            '''Pretend to be the tickets server.'''
            return ""
        """,
    )
    server = "[[mcp.servers]]\nname = 'tickets'\ncommand = 'tickets-server'\n"
    shadow = config_error(tmp_path, "[tools]\nmodules = ['ops_shadow']\n" + server)
    assert "'tickets__list'" in shadow
    write_module(
        "ops_badname",
        """
        from harness.tools import ToolContext, tool

        @tool(name="open ticket")
        def open_ticket(ctx: ToolContext) -> str:
            '''Spaces are not allowed in tool names.'''
            return ""
        """,
    )
    assert "'open ticket'" in config_error(tmp_path, "[tools]\nmodules = ['ops_badname']\n")


def test_a_module_tool_name_past_the_apis_64_characters_is_refused_at_start(
    tmp_path: Path, write_module: Write
) -> None:
    """The Messages API refuses a tool name past 64 characters: every request would fail."""
    long_name = "t" * 65
    write_module(
        "ops_longname",
        f"""
        from harness.tools import ToolContext, tool

        @tool(name="{long_name}")
        def long_name(ctx: ToolContext) -> str:
            '''Too long a name.'''
            return ""
        """,
    )
    refused = config_error(tmp_path, "[tools]\nmodules = ['ops_longname']\n")
    assert repr(long_name) in refused and "^[a-zA-Z0-9_-]{1,64}$" in refused


# --- through the terminal ----------------------------------------------------------------------

STAMP = '''
from typing import Annotated

from pydantic import Field

from harness.tools import ToolContext, tool


@tool()
def stamp(ctx: ToolContext, note: Annotated[str, Field(description="What to stamp")]) -> str:
    """Stamp a note into the workspace."""
    (ctx.workspace / "stamped.txt").write_text(note, encoding="utf-8")
    return f"stamped {note}"
'''


def module_env(model: FakeMessagesAPI, workspace: Path, tmp_path: Path, toml: str) -> dict[str, str]:
    config = tmp_path / "harness.toml"
    config.write_text(toml, encoding="utf-8")
    env = cli_env(model, workspace, HARNESS_CONFIG=str(config))
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(tmp_path / "mods")])
    return env


@pytest.mark.e2e
def test_the_terminal_agent_runs_a_module_tool(
    model: FakeMessagesAPI, workspace: Path, tmp_path: Path
) -> None:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "mymod.py").write_text(STAMP, encoding="utf-8")
    env = module_env(
        model, workspace, tmp_path, "[tools]\nmodules = ['mymod']\n[policy.tools]\nstamp = 'allow'\n"
    )
    model.script(reply(tool_use("stamp", {"note": "hello"})), reply(text("Stamped.")))

    done = harness(env, "stamp hello")

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        '[turn 1] model requests tool: stamp({"note":"hello"})',
        '[turn 1] tool returned: "stamped hello"',
        "[turn 2] model wraps up (end_turn)",
        "Stamped.",
        "That took 1 turns of tool calls across 2 model requests.",
    ]
    assert (workspace / "stamped.txt").read_text() == "hello"
    offered = {t["name"]: t for t in model.requests[0]["tools"]}
    assert set(offered) == {*BUILTIN_NAMES, "stamp"}
    assert offered["stamp"]["input_schema"]["properties"]["note"]["description"] == "What to stamp"
    assert model.errors == []


@pytest.mark.e2e
def test_a_module_tool_with_no_tier_asks_by_default(
    model: FakeMessagesAPI, workspace: Path, tmp_path: Path
) -> None:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "mymod.py").write_text(STAMP, encoding="utf-8")
    env = module_env(model, workspace, tmp_path, "[tools]\nmodules = ['mymod']\n")
    model.script(reply(tool_use("stamp", {"note": "hello"})), reply(text("Not stamped.")))

    done = harness(env, "stamp hello", stdin="n\n")

    assert done.returncode == 0, done.stderr
    assert (
        '[approve] About to run high-impact action stamp({"note":"hello"}) '
        "— Enter to allow / type n to decline: "
    ) in done.stdout
    assert not (workspace / "stamped.txt").exists()
    declined = model.requests[1]["messages"][-1]["content"][0]
    assert declined["is_error"] is True and "declined" in declined["content"]


@pytest.mark.e2e
def test_the_terminal_agent_stops_at_start_on_a_module_that_fails(
    model: FakeMessagesAPI, workspace: Path, tmp_path: Path
) -> None:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "mymod.py").write_text("raise ImportError('needs the tickets client')\n")
    env = module_env(model, workspace, tmp_path, "[tools]\nmodules = ['mymod']\n")

    done = harness(env, "anything")

    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "'mymod'" in done.stderr and "needs the tickets client" in done.stderr
    assert "Traceback" not in done.stderr
    assert model.requests == [] and done.stdout == ""
