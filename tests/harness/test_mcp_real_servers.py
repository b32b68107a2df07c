"""The MCP project's own servers through the harness: `@modelcontextprotocol/server-everything`
(npm; over stdio and streamable HTTP) and `mcp-server-time` (PyPI; over stdio).

`.ci/run` installs them (server-everything into `.ci/node_modules`, mcp-server-time with the test
extra). Without them these tests skip, saying what is missing and how to get it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.config import Config, load_config
from harness.loop import Finished, drive
from harness.policy import Tier
from harness.state import new_run
from harness.tools import ToolContext
from harness.tools.catalog import Catalog
from harness.tools.inputs import MidCallQuestion
from harness.tools.mcp import McpHub
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.stack import ROOT, free_port, listens_on, wait_until

INSTALLED = ROOT / ".ci/node_modules/.bin/mcp-server-everything"
EVERYTHING = Path(os.environ.get("MCP_SERVER_EVERYTHING", INSTALLED))
NO_EVERYTHING = (
    f"@modelcontextprotocol/server-everything is not installed at {EVERYTHING}: "
    "`bash .ci/run` installs it (npm install --prefix .ci), or set MCP_SERVER_EVERYTHING"
)
NO_TIME = "mcp-server-time is not installed in this venv: `pip install -e '.[test]'` installs it"

needs_everything = pytest.mark.skipif(
    not (os.access(EVERYTHING, os.X_OK) and shutil.which("node")), reason=NO_EVERYTHING
)
needs_time = pytest.mark.skipif(importlib.util.find_spec("mcp_server_time") is None, reason=NO_TIME)


def config_of(tmp_path: Path, toml: str) -> Config:
    path = tmp_path / "harness.toml"
    path.write_text(toml + 'timeout_seconds = 30\n[policy]\ndefault = "ask"\n')
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})


def run(catalog: Catalog, name: str, args: dict[str, Any], tmp_path: Path) -> Any:
    return catalog.registry().run(name, args, ToolContext(workspace=tmp_path))


@dataclass
class HttpEverything:
    """server-everything's streamable HTTP transport (`streamableHttp`, port from `PORT`)."""

    out: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    started: bool = False  # once: its port is fixed from then on (a restart keeps it)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> HttpEverything:
        """Start it; a port another test's server took meanwhile is given up for another (first start)."""
        for _ in range(5):
            with self.out.open("ab") as out:
                self.proc = subprocess.Popen(
                    [str(EVERYTHING), "streamableHttp"],
                    env={**os.environ, "PORT": str(self.port)},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            if wait_until(self._listening, timeout=30) == "ours":
                self.started = True
                return self
            self.kill()
            if not self.started:
                self.port = free_port()
        raise AssertionError(f"server-everything could not have port {self.port} to itself")

    def _listening(self) -> str | None:
        """ "ours" once it holds the port; "taken" once another process does; else None."""
        assert self.proc is not None
        held = listens_on(self.proc.pid, self.port)
        if held:
            return "ours"
        if self.proc.poll() is not None:
            if held is False:
                return "taken"
            code, said = self.proc.returncode, self.out.read_text()
            raise AssertionError(f"server-everything exited with {code}: {said}")
        return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def http_everything(tmp_path: Path) -> Iterator[HttpEverything]:
    server = HttpEverything(tmp_path / "everything.out").start()
    yield server
    server.kill()


@pytest.fixture(params=["stdio", "http"])
def everything(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Catalog]:
    if not (os.access(EVERYTHING, os.X_OK) and shutil.which("node")):
        pytest.skip(NO_EVERYTHING)
    if request.param == "stdio":
        toml = f'[[mcp.servers]]\nname = "ev"\ncommand = {json.dumps(str(EVERYTHING))}\nargs = ["stdio"]\n'
    else:
        toml = f'[[mcp.servers]]\nname = "ev"\nurl = "{request.getfixturevalue("http_everything").url}"\n'
    config = config_of(tmp_path, toml + "trust_annotations = true\n")  # its readOnlyHint may allow
    with McpHub(config.resolved_servers({})) as hub:
        assert not hub.listing().away, hub.listing().away
        yield Catalog.from_config(config, host=hub)


def test_everything_lists_its_tools_with_their_schemas_and_annotations(everything: Catalog) -> None:
    registry = everything.registry()
    names = set(registry.names())
    assert {"ev__echo", "ev__get-sum", "ev__get-tiny-image", "ev__get-structured-content"} <= names
    echo = registry.get("ev__echo")
    assert echo is not None and echo.input_schema["properties"]["message"]["type"] == "string"
    assert echo.input_schema["required"] == ["message"]
    assert echo.own_tier is Tier.ALLOW and echo.annotations["readOnlyHint"] is True
    toggle = registry.get("ev__toggle-simulated-logging")
    assert toggle is not None and toggle.own_tier is None and toggle.side_effects
    # Task-only (execution.taskSupport: required): offered, and called as a task (test_mcp_tasks.py).
    assert "ev__simulate-research-query" in names


def test_everything_runs_calls_and_an_image_comes_back_as_an_image_block(
    everything: Catalog, tmp_path: Path
) -> None:
    assert run(everything, "ev__echo", {"message": "hi"}, tmp_path).content == "Echo: hi"
    total = run(everything, "ev__get-sum", {"a": 2, "b": 3}, tmp_path)
    assert not total.is_error and "5" in total.content
    image = run(everything, "ev__get-tiny-image", {}, tmp_path)
    kinds = [b["type"] for b in image.content]
    assert "image" in kinds and not image.is_error
    picture = next(b for b in image.content if b["type"] == "image")
    assert picture["source"]["media_type"] == "image/png" and len(picture["source"]["data"]) > 100


def test_everything_input_that_breaks_its_schema_is_refused_before_it_is_sent(
    everything: Catalog, tmp_path: Path
) -> None:
    missing = run(everything, "ev__echo", {}, tmp_path)
    assert missing.is_error and "invalid input for ev__echo" in missing.content
    assert "'message' is a required property" in missing.content
    wrong = run(everything, "ev__get-sum", {"a": "two", "b": 3}, tmp_path)
    assert wrong.is_error and "a: the value is not of type 'number'" in wrong.content


@needs_everything
def test_everything_over_http_restarted_while_idle_answers_the_next_call(
    tmp_path: Path, http_everything: HttpEverything
) -> None:
    """Seen: the restarted server answers the old session id with 400, the SDK raised -32603,
    and 100 calls over 45 s all failed."""
    config = config_of(tmp_path, f'[[mcp.servers]]\nname = "ev"\nurl = "{http_everything.url}"\n')
    with McpHub(config.resolved_servers({})) as hub:
        catalog = Catalog.from_config(config, host=hub)
        assert run(catalog, "ev__echo", {"message": "before"}, tmp_path).content == "Echo: before"
        http_everything.kill()
        http_everything.start()
        after = run(catalog, "ev__echo", {"message": "after"}, tmp_path)
        assert after.content == "Echo: after", after.content
        again = run(catalog, "ev__echo", {"message": "again"}, tmp_path)
        assert again.content == "Echo: again"


@needs_everything
def test_everything_over_http_gets_its_session_delete_on_close(
    tmp_path: Path, http_everything: HttpEverything
) -> None:
    config = config_of(tmp_path, f'[[mcp.servers]]\nname = "ev"\nurl = "{http_everything.url}"\n')
    with McpHub(config.resolved_servers({})) as hub:
        assert not hub.listing().away
    wait_until(lambda: "Received session termination request" in http_everything.out.read_text(), timeout=30)


@needs_everything
def test_a_run_through_the_loop_gets_everythings_image_to_the_model(
    tmp_path: Path, model: FakeMessagesAPI, workspace: Path
) -> None:
    toml = f'[[mcp.servers]]\nname = "ev"\ncommand = {json.dumps(str(EVERYTHING))}\nargs = ["stdio"]\n'
    config = config_of(tmp_path, toml + "trust_annotations = true\n")
    model.script(
        reply(tool_use("ev__get-tiny-image", {}, id="toolu_img"), tool_use("ev__echo", {}, id="toolu_bad")),
        reply(text("A tiny image.")),
    )
    with McpHub(config.resolved_servers({})) as hub:
        registry = Catalog.from_config(config, host=hub).registry()
        agent = make_agent(model, workspace, tools=registry)
        state, outcome = drive(new_run("show me"), agent, lambda _: None)
    assert outcome == Finished("A tiny image.", "end_turn")
    assert model.errors == []  # the stand-in checks every request as the API would
    results = {b["tool_use_id"]: b for b in state.messages[2]["content"] if b["type"] == "tool_result"}
    assert [b["type"] for b in results["toolu_img"]["content"]].count("image") == 1
    refused = results["toolu_bad"]
    assert refused["is_error"] is True and "required property" in str(refused["content"])


@needs_time
def test_mcp_server_time_from_pypi_lists_and_answers(tmp_path: Path) -> None:
    command = json.dumps(sys.executable)
    toml = f'[[mcp.servers]]\nname = "time"\ncommand = {command}\nargs = ["-m", "mcp_server_time"]\n'
    config = config_of(tmp_path, toml)
    with McpHub(config.resolved_servers({})) as hub:
        assert not hub.listing().away, hub.listing().away
        catalog = Catalog.from_config(config, host=hub)
        registry = catalog.registry()
        assert {"time__get_current_time", "time__convert_time"} <= set(registry.names())
        now = run(catalog, "time__get_current_time", {"timezone": "UTC"}, tmp_path)
        assert not now.is_error and json.loads(now.content)["timezone"] == "UTC"
        moved = run(
            catalog,
            "time__convert_time",
            {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
            tmp_path,
        )
        assert not moved.is_error and "21:00" in moved.content
        missing = run(catalog, "time__get_current_time", {}, tmp_path)
        assert missing.is_error and "'timezone' is a required property" in missing.content


# --- the reference servers behind the walls (issue 30) ---------------------------------------------

NODE_BIN = ROOT / ".ci/node_modules/.bin"


def _needs_node_server(name: str) -> pytest.MarkDecorator:
    path = NODE_BIN / f"mcp-server-{name}"
    return pytest.mark.skipif(
        not (os.access(path, os.X_OK) and shutil.which("node")),
        reason=f"@modelcontextprotocol/server-{name} is not installed at {path}: `bash .ci/run` installs it",
    )


def _table(name: str, command: str | Path, args: list[str], **keys: Any) -> str:
    table = (
        f'[[mcp.servers]]\nname = "{name}"\ncommand = {json.dumps(str(command))}\nargs = {json.dumps(args)}\n'
    )
    for key, value in keys.items():
        table += (
            f"{key} = "
            + (
                "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items()) + " }"
                if isinstance(value, dict)
                else json.dumps(value)
            )
            + "\n"
        )
    return table


@_needs_node_server("filesystem")
def test_the_reference_filesystem_server_works_on_its_writable_folder_and_writes_nowhere_else(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "team-docs"
    folder.mkdir()
    (folder / "readme.md").write_text("# team docs\n")
    readonly = tmp_path / "reference"
    readonly.mkdir()
    (readonly / "policy.md").write_text("read me, never change me\n")
    toml = _table(
        "fs", NODE_BIN / "mcp-server-filesystem", [str(folder), str(readonly)], writable=[str(folder)]
    )
    config = config_of(tmp_path, toml)
    with McpHub(config.resolved_servers({})) as hub:
        assert not hub.listing().away, hub.listing().away
        catalog = Catalog.from_config(config, host=hub)
        wrote = run(catalog, "fs__write_file", {"path": str(folder / "new.md"), "content": "hello"}, tmp_path)
        assert not wrote.is_error, wrote.content
        assert (folder / "new.md").read_text() == "hello"
        read = run(catalog, "fs__read_text_file", {"path": str(readonly / "policy.md")}, tmp_path)
        assert not read.is_error and "never change me" in read.content
        # A folder it was given but may not write: its arguments stay readable, not writable.
        refused = run(
            catalog, "fs__write_file", {"path": str(readonly / "policy.md"), "content": "x"}, tmp_path
        )
        assert refused.is_error
    assert (readonly / "policy.md").read_text() == "read me, never change me\n"


@_needs_node_server("memory")
def test_the_reference_memory_server_keeps_its_graph_in_its_own_directory(tmp_path: Path) -> None:
    store = tmp_path / "memory"
    store.mkdir()
    toml = _table(
        "memory",
        NODE_BIN / "mcp-server-memory",
        [],
        env={"MEMORY_FILE_PATH": str(store / "memory.jsonl")},
        writable=[str(store)],
    )
    config = config_of(tmp_path, toml)
    with McpHub(config.resolved_servers({})) as hub:
        assert not hub.listing().away, hub.listing().away
        catalog = Catalog.from_config(config, host=hub)
        entity = {"name": "harness", "entityType": "project", "observations": ["runs behind walls"]}
        made = run(catalog, "memory__create_entities", {"entities": [entity]}, tmp_path)
        assert not made.is_error, made.content
        graph = run(catalog, "memory__read_graph", {}, tmp_path)
        assert not graph.is_error and "runs behind walls" in graph.content
    assert "runs behind walls" in (store / "memory.jsonl").read_text()


NO_GIT = "mcp-server-git is not installed in this venv: `pip install -e '.[test]'` installs it"


@pytest.mark.skipif(
    importlib.util.find_spec("mcp_server_git") is None or shutil.which("git") is None, reason=NO_GIT
)
def test_mcp_server_git_works_on_the_repository_it_is_given(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.txt").write_text("one\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    (repo / "a.txt").write_text("two\n")
    toml = _table(
        "git",
        sys.executable,
        ["-m", "mcp_server_git", "--repository", str(repo)],
        writable=[str(repo)],
    )
    config = config_of(tmp_path, toml)
    with McpHub(config.resolved_servers({})) as hub:
        assert not hub.listing().away, hub.listing().away
        catalog = Catalog.from_config(config, host=hub)
        status = run(catalog, "git__git_status", {"repo_path": str(repo)}, tmp_path)
        assert not status.is_error and "a.txt" in status.content, status.content
        log = run(catalog, "git__git_log", {"repo_path": str(repo)}, tmp_path)
        assert not log.is_error and "first" in log.content, log.content
        added = run(catalog, "git__git_add", {"repo_path": str(repo), "files": ["a.txt"]}, tmp_path)
        assert not added.is_error, added.content
    staged = subprocess.run([*git, "diff", "--cached", "--name-only"], capture_output=True, text=True)
    assert staged.stdout.strip() == "a.txt"


# --- a question asked mid-call (server-everything speaks the 2025 protocol: `elicitation/create`) ---


def test_a_question_asked_mid_call_reaches_the_asker_for_the_calls_run_and_its_answer_the_server(
    tmp_path: Path,
) -> None:
    if not (os.access(EVERYTHING, os.X_OK) and shutil.which("node")):
        pytest.skip(NO_EVERYTHING)
    asked: list[MidCallQuestion] = []

    async def person(question: MidCallQuestion) -> dict[str, Any]:
        asked.append(question)
        return {"action": "accept", "content": {"name": "Ann Example", "check": True, "integer": 7}}

    toml = f'[[mcp.servers]]\nname = "ev"\ncommand = {json.dumps(str(EVERYTHING))}\nargs = ["stdio"]\n'
    config = config_of(tmp_path, toml)
    with McpHub(config.resolved_servers({}), ask_person=person) as hub:
        registry = Catalog.from_config(config, host=hub).registry()
        assert "ev__trigger-elicitation-request" in registry.names()  # offered: elicitation is declared
        ctx = ToolContext(workspace=tmp_path, who="a" * 32)
        said = registry.run("ev__trigger-elicitation-request", {}, ctx)
        (question,) = asked
        assert question.who == "a" * 32 and question.tool == "ev__trigger-elicitation-request"
        assert question.question.mode == "form" and "name" in question.question.fields
        assert 0 < question.seconds <= 30
        assert (
            not said.is_error
            and "- Name: Ann Example" in said.text
            and "- Agreed to terms: true" in said.text
        )
        # No run to ask (the terminal's own hub would pass one): the server hears cancel at once.
        said = registry.run("ev__trigger-elicitation-request", {}, ToolContext(workspace=tmp_path))
        assert len(asked) == 1 and not said.is_error and "cancel" in said.text.lower()


def test_a_mid_call_question_nobody_can_answer_is_cancelled_without_waiting(tmp_path: Path) -> None:
    if not (os.access(EVERYTHING, os.X_OK) and shutil.which("node")):
        pytest.skip(NO_EVERYTHING)
    toml = f'[[mcp.servers]]\nname = "ev"\ncommand = {json.dumps(str(EVERYTHING))}\nargs = ["stdio"]\n'
    config = config_of(tmp_path, toml)
    with McpHub(config.resolved_servers({})) as hub:  # no asker: nobody to put it to
        registry = Catalog.from_config(config, host=hub).registry()
        said = registry.run(
            "ev__trigger-elicitation-request", {}, ToolContext(workspace=tmp_path, who="a" * 32)
        )
        assert not said.is_error and "cancel" in said.text.lower()
