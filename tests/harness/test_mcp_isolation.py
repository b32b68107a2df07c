"""A stdio MCP server is confined: it reads none of the process's secrets, reaches no relay, forges no log.

A real hostile server (`tests/fakes/hostile_mcp_server.py`) run by a real hub tries, as an attacker
would: the environment, `/proc/<pid>/environ`, `cmdline` and `mem` of every process it can see,
another server's `${VAR}`, the worker's relay socket, and forged or flooding stderr. The secrets it
looks for are set in this process (the hub's) and in another server's environment.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.config import Config, load_config
from harness.tools import ToolContext
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from harness.tools.relay import RelayServer, private_directory
from harness.tools.sandbox import LINE_BYTES, StderrLog
from observe.logs import JsonFormatter, TextFormatter
from tests.mcp_support import FORGED, calls, hostile_table, mask, out, require_bwrap, stdio_table

SECRETS = {
    "SLACK_BOT_TOKEN": "xoxb-isolation-5b0e1d7c",
    "SLACK_SIGNING_SECRET": "signing-isolation-8c2f44e1",
    "ANTHROPIC_API_KEY": "sk-ant-isolation-0a9d3e6b",
    "REDIS_URL": "redis://:redis-pw-isolation-77e1c2@127.0.0.1:1/0",
}
REDIS_PASSWORD = "redis-pw-isolation-77e1c2"
TWO_TOKEN = "two-token-isolation-3f6a90bd"
ONE_TOKEN = "one-token-isolation-c41e2b58"


@pytest.fixture
def bwrap() -> None:
    require_bwrap()


def needles() -> list[str]:
    """Every secret of the process and of the other server, in the order the findings number them."""
    return [*(v for k, v in SECRETS.items() if k != "REDIS_URL"), REDIS_PASSWORD, TWO_TOKEN]


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process holds the secrets a worker holds, plus variables no server should inherit."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    for name, value in {"LANG": "C.UTF-8", "TZ": "UTC", "LOGNAME": "worker", "SHELL": "/bin/sh"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("USER", "worker")


def config_of(tmp_path: Path, toml: str) -> Config:
    path = tmp_path / "harness.toml"
    path.write_text(toml + '[policy]\ndefault = "allow"\n')
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})


def call(catalog: Catalog, name: str, args: dict[str, Any], tmp_path: Path) -> Any:
    result = catalog.registry().run(name, args, ToolContext(workspace=tmp_path))
    assert not result.is_error, result.content
    return result.content


@pytest.fixture
def two_servers(tmp_path: Path, bwrap: None, secret_env: None) -> Iterator[tuple[Catalog, McpHub, Path]]:
    """Hostile servers `one` and `two`, each with a secret `${VAR}` of its own, on one hub."""
    report = out(tmp_path, "report.jsonl")
    toml = hostile_table("one", report, env={"ONE": "${ONE_TOKEN}"}) + hostile_table(
        "two", out(tmp_path, "two.jsonl"), env={"TWO": "${TWO_TOKEN}"}
    )
    config = config_of(tmp_path, toml)
    with McpHub(config.resolved_servers({"ONE_TOKEN": ONE_TOKEN, "TWO_TOKEN": TWO_TOKEN})) as hub:
        assert not hub.listing().away, hub.listing().away
        yield Catalog.from_config(config, host=hub), hub, report


def test_a_stdio_servers_environment_holds_only_path_home_lang_tz_and_its_own_env(
    two_servers: tuple[Catalog, McpHub, Path], tmp_path: Path
) -> None:
    catalog, _, _ = two_servers
    seen = json.loads(call(catalog, "one__snoop", {"masked": []}, tmp_path))
    expected = {k: os.environ[k] for k in ("PATH", "LANG", "TZ") if k in os.environ}
    # HOME is its own directory (its cwd by default), kept across its restarts, never the worker's.
    home = seen["environment"].pop("HOME")
    assert home == str(Path(os.environ["HARNESS_STATE_DIR"]) / "mcp" / "one")
    assert seen["environment"] == {**expected, "ONE": ONE_TOKEN}


def test_a_stdio_server_reads_no_secret_of_the_process_or_of_another_server_anywhere(
    two_servers: tuple[Catalog, McpHub, Path], tmp_path: Path
) -> None:
    catalog, _, _ = two_servers
    seen = json.loads(call(catalog, "one__snoop", {"masked": [mask(n) for n in needles()]}, tmp_path))
    assert seen["found"] == []
    # It sees no process but its own sandbox's: not the hub's, not the other server's.
    assert seen["ppid"] == 1 and max(seen["visible"]) < 100, seen["visible"]
    assert os.getpid() not in seen["visible"] or seen["pid"] != os.getpid()
    # And it cannot make the kernel run something for it outside (core_pattern, uevent_helper).
    assert seen["proc_sys_writable"] is False and seen["sys_writable"] is False


def test_a_stdio_server_keeps_its_command_arguments_cwd_and_files(
    tmp_path: Path, bwrap: None, secret_env: None
) -> None:
    home = tmp_path / "server-home"
    home.mkdir()
    (home / "notes.txt").write_text("the notes the server is for\n")
    report = out(tmp_path, "report.jsonl")
    config = config_of(tmp_path, hostile_table("one", report, cwd=home, data="notes.txt"))
    with McpHub(config.resolved_servers({})) as hub:
        catalog = Catalog.from_config(config, host=hub)
        assert call(catalog, "one__read_data", {}, tmp_path) == "the notes the server is for\n"
        assert json.loads(call(catalog, "one__snoop", {"masked": []}, tmp_path))["cwd"] == str(home)


def test_a_server_cannot_reach_the_relay_and_a_connection_without_the_token_gets_nothing(
    tmp_path: Path, bwrap: None, secret_env: None
) -> None:
    desk_log = out(tmp_path, "desk.jsonl")
    directory = private_directory()
    toml = hostile_table("one", out(tmp_path, "report.jsonl"), relay_glob=f"{directory}/*.sock")
    config = config_of(tmp_path, toml + stdio_table("desk", desk_log))
    with McpHub(config.resolved_servers({}), hidden=(directory,)) as hub:
        relay = RelayServer(hub, directory).start()
        try:
            catalog = Catalog.from_config(config, host=hub)
            tried = json.loads(
                call(catalog, "one__relay", {"server": "desk", "tool": "delete_ticket"}, tmp_path)
            )
            assert tried["sockets"] == []  # the relay's directory is empty in the server's sandbox

            # From outside the sandbox too (another process of the same user): no token, nothing.
            for first in ({"op": "listing"}, {"op": "hello", "token": "0" * 64}, {"op": "hello"}):
                assert (
                    _raw(
                        relay.path,
                        [
                            first,
                            {
                                "op": "call",
                                "server": "desk",
                                "tool": "delete_ticket",
                                "arguments": {"id": "T-1"},
                                "side_effects": True,
                            },
                        ],
                    )
                    == []
                )
            assert calls(desk_log) == []
            assert relay.client().listing() == hub.listing()  # the horses' client holds the token
        finally:
            relay.close()


def _raw(path: str, lines: list[dict[str, Any]]) -> list[bytes]:
    """What a client without the worker's token gets back: every answer line."""
    got: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        reader = sock.makefile("rb")
        try:
            for line in lines:
                sock.sendall(json.dumps(line).encode() + b"\n")
                answer = reader.readline()
                if not answer:
                    break
                got.append(answer)
        except OSError:
            pass
    return got


def test_a_servers_stderr_is_logged_as_data_capped_and_escaped(
    tmp_path: Path, bwrap: None, secret_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    config = config_of(tmp_path, hostile_table("one", out(tmp_path, "report.jsonl")))
    with caplog.at_level(logging.INFO, logger="harness.mcp"):
        with McpHub(config.resolved_servers({})) as hub:
            catalog = Catalog.from_config(config, host=hub)
            call(catalog, "one__shout", {"lines": FORGED, "flood_bytes": 1_000_000}, tmp_path)
        records = [r for r in caplog.records if r.name == "harness.mcp.stderr"]
    messages = [r.getMessage() for r in records]
    assert messages, "the server's stderr reached the log"
    assert all(m.startswith("MCP server one stderr") for m in messages)
    for bad in ("\r", "\n", "\x1b", "\u202e"):
        assert not any(bad in m for m in messages), repr(bad)
    said = "\n".join(messages)
    assert "stderr: " + FORGED[0] in said and "stderr: 2026-01-01 00:00:00,000 INFO" in said
    assert "innocent\\rforged carriage return" in said and "\\x1b[2K" in said and "\\u202e" in said
    assert max(len(m) for m in messages) < 2_500  # a 5,000-character line is cut
    assert sum(len(m) for m in messages) < 200_000  # of a 1 MB flood
    counts = (re.match(r"MCP server one stderr dropped: ([\d,]+) bytes", m) for m in messages)
    dropped = [int(c.group(1).replace(",", "")) for c in counts if c]
    assert dropped and sum(dropped) > 700_000  # and the log says how much
    # As the worker writes it: one line each, the server's text a value, never a line of its own.
    for formatter in (JsonFormatter(), TextFormatter()):
        lines = [formatter.format(r) for r in records]
        assert all("\n" not in line for line in lines)
    parsed = [json.loads(JsonFormatter().format(r)) for r in records]
    assert all(
        p["logger"] == "harness.mcp.stderr" and p["message"].startswith("MCP server one stderr")
        for p in parsed
    )


@pytest.mark.parametrize("kind", ["missing", "refused"])
def test_without_a_working_bubblewrap_no_server_starts_and_one_line_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if kind == "refused":  # what bwrap says where the kernel or a container refuses namespaces
        fake = bin_dir / "bwrap"
        # Long, as bwrap's own words can be: the line must still end with how to fix it.
        said = (
            "bwrap: No permissions to create new namespace, likely because the kernel does not allow "
            + "x" * 150
        )
        fake.write_text(f"#!/bin/sh\necho '{said}' >&2\nexit 1\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    report = out(tmp_path, "report.jsonl")
    config = config_of(tmp_path, hostile_table("one", report))
    with caplog.at_level(logging.WARNING, logger="harness.mcp"), McpHub(config.resolved_servers({})) as hub:
        listing = hub.listing()
        answer = (
            Catalog.from_config(config, host=hub)
            .registry()
            .run("one__snoop", {"masked": []}, ToolContext(workspace=tmp_path))
        )
    assert listing.tools == () and "bubblewrap" in listing.away["one"]
    assert answer.is_error and "bubblewrap" in answer.content
    why = next(r.getMessage() for r in caplog.records if "one (stdio:" in r.getMessage())
    assert "cannot start: " in why and "bubblewrap" in why
    if kind == "refused":
        assert "No permissions to create new namespace" in why
        # The reason is never cut: how to fix it is all there, then only when it is tried again.
        assert "a seccomp profile that permits them); trying again in 0.5 s and less often after" in why, why
    else:
        assert "install" in why
    assert not report.exists()  # the server never ran


UNDUMPABLE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("undumpable", sys.argv[2])
undumpable = sys.modules["undumpable"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(undumpable)  # by path: the rest of the package needs the project's venv
if sys.argv[1] == "protect":
    undumpable.protect_process()
print("ready", flush=True)
sys.stdin.read()
"""
NOBODY = {"user": 65534, "group": 65534, "cwd": "/"}


def _python_for_nobody() -> str:
    """A Python that user nobody may run (the venv's may sit under a private home)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        try:
            runs = subprocess.run([candidate, "-c", "pass"], capture_output=True, **NOBODY)  # type: ignore[call-overload]
        except OSError:
            continue
        if runs.returncode == 0:
            return candidate
    pytest.skip("no Python that user nobody may run, so no process of another user to read from")


@pytest.mark.parametrize("protect", [True, False])
def test_a_protected_process_hides_its_environment_from_its_own_user(protect: bool) -> None:
    """`protect_process()` (the worker and the terminal agent call it first): a process of the same
    (non-root) user, outside any sandbox, cannot read its `/proc` entries."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test runs both processes as another user (nobody)")
    python = _python_for_nobody()
    root = Path(__file__).resolve().parents[2]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(root), "SLACK_BOT_TOKEN": SECRETS["SLACK_BOT_TOKEN"]}
    module = str(root / "harness" / "tools" / "undumpable.py")
    target = subprocess.Popen(
        [python, "-c", UNDUMPABLE, "protect" if protect else "plain", module],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        **NOBODY,  # type: ignore[call-overload]
    )
    try:
        assert target.stdout is not None and target.stdout.readline() == b"ready\n"
        reader = subprocess.run(
            ["cat", f"/proc/{target.pid}/environ"],
            capture_output=True,
            env={"PATH": os.environ["PATH"]},
            **NOBODY,
        )  # type: ignore[call-overload]
    finally:
        target.kill()
        target.wait(10)
    if protect:
        assert reader.returncode != 0 and b"Permission denied" in reader.stderr
        assert SECRETS["SLACK_BOT_TOKEN"].encode() not in reader.stdout
    else:  # the control: without it, the same user reads it
        assert SECRETS["SLACK_BOT_TOKEN"].encode() in reader.stdout


def test_the_stderr_budget_renews_every_window_and_a_line_that_never_ends_is_cut(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = StderrLog("one", budget=5_000, window=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="harness.mcp.stderr"):
        log.data_received(b"z" * 3_000)  # no newline yet: more than a line's worth is logged cut
        log.data_received(b"z" * 3_000 + b"\nfirst\n")  # the rest of that line is dropped
        log.data_received(b"y" * 1_999 + b"\n" + b"w" * 1_500 + b"\n")  # past the budget: dropped
        assert len(log._pending) == 0
        now[0] = 61.0  # a new window: the count of what was dropped, then lines again
        log.data_received(b"second\r\n")
        log.data_received(b"no newline at the end")
        log.finish()
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == "MCP server one stderr: " + "z" * LINE_BYTES + " [1,000 more bytes cut]"
    assert said[1:] == [
        "MCP server one stderr: first",
        "MCP server one stderr: " + "y" * 1_999,
        "MCP server one stderr dropped: 4,502 bytes (more than 5,000 bytes in 60 s)",
        "MCP server one stderr: second",
        "MCP server one stderr: no newline at the end",
    ]
