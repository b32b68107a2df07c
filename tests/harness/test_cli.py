"""`python -m harness "TASK"` as a user runs it: a real process against the loopback Messages API."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use

pytestmark = pytest.mark.e2e  # `python -m harness` as a process, in every test

ROOT = Path(__file__).resolve().parents[2]


def cli_env(model: Any, workspace: Path, **extra: str) -> dict[str, str]:
    """The terminal's environment, pointed at `model` (anything with a `base_url`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "HARNESS_"))}
    env.update(
        ANTHROPIC_BASE_URL=model.base_url,
        ANTHROPIC_API_KEY="sk-test",
        HARNESS_WORKSPACE=str(workspace),
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


def harness(env: dict[str, str], task: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", task],
        input=stdin,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_seed_transcript_verbatim(model: FakeMessagesAPI, workspace: Path) -> None:
    model.script(
        reply(tool_use("read_file", {"path": "README.md"})),
        reply(tool_use("get_time", {})),
        reply(text("The first line is '# My project'.")),
    )
    done = harness(cli_env(model, workspace), "read the first line of README.md, then tell me the time")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == '[turn 1] model requests tool: read_file({"path":"README.md"})'
    assert lines[1] == '[turn 1] tool returned: "# My project\\n\\nSecond line.\\n"'
    assert lines[2] == "[turn 2] model requests tool: get_time({})"
    assert re.fullmatch(r'\[turn 2\] tool returned: "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"', lines[3])
    assert lines[4:] == [
        "[turn 3] model wraps up (end_turn)",
        "The first line is '# My project'.",
        "That took 2 turns of tool calls across 3 model requests.",
    ]
    assert model.errors == []


def test_long_tool_results_are_cut_in_the_transcript(model: FakeMessagesAPI, workspace: Path) -> None:
    (workspace / "big.txt").write_text("y" * 1500)
    model.script(reply(tool_use("read_file", {"path": "big.txt"})), reply(text("ok")))
    done = harness(cli_env(model, workspace), "read big.txt")
    shown = done.stdout.splitlines()[1]
    assert shown == '[turn 1] tool returned: "' + "y" * 200 + '…"'


def test_enter_approves_and_n_declines(model: FakeMessagesAPI, workspace: Path) -> None:
    model.script(
        reply(tool_use("write_file", {"path": "a.txt", "content": "A"})),
        reply(tool_use("write_file", {"path": "b.txt", "content": "B"})),
        reply(text("wrote one")),
    )
    done = harness(cli_env(model, workspace), "write two files", stdin="\nn\n")

    assert done.returncode == 0, done.stderr
    assert (
        '[approve] About to run high-impact action write_file({"path":"a.txt","content":"A"}) '
        "— Enter to allow / type n to decline: "
    ) in done.stdout
    assert (workspace / "a.txt").read_text() == "A"
    assert not (workspace / "b.txt").exists()
    declined = model.requests[2]["messages"][-1]["content"][0]
    assert declined["is_error"] is True and "declined" in declined["content"]


def test_closed_stdin_declines_rather_than_approves(model: FakeMessagesAPI, workspace: Path) -> None:
    model.script(reply(tool_use("delete_file", {"path": "README.md"})), reply(text("ok")))
    done = harness(cli_env(model, workspace), "delete the readme", stdin="")
    assert done.returncode == 0
    assert (workspace / "README.md").exists()


@pytest.mark.parametrize(
    ("answer", "runs"),
    [("", True), ("y", True), ("YES", True), (" yes ", True), ("nope", False), ("sure", False), ("x", False)],
)
def test_the_prompt_fails_closed_only_enter_y_and_yes_approve(
    model: FakeMessagesAPI, workspace: Path, answer: str, runs: bool
) -> None:
    """The issue's finding: at the prompt, "nope" approved the delete; anything but yes must decline."""
    model.script(reply(tool_use("delete_file", {"path": "README.md"})), reply(text("ok")))
    done = harness(cli_env(model, workspace), "delete the readme", stdin=answer + "\n")
    assert done.returncode == 0, done.stderr
    assert (workspace / "README.md").exists() is not runs


def test_a_valve_stop_is_printed_with_the_footer(
    model: FakeMessagesAPI, workspace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "h.toml"
    config.write_text("[limits]\nmax_turns = 1\n")
    model.script(reply(tool_use("list_files", {})), reply(tool_use("get_time", {})))
    done = harness(cli_env(model, workspace, HARNESS_CONFIG=str(config)), "loop")

    assert done.returncode == 3
    assert "[turn 2] Stopped at max turns" in done.stdout and "valve" not in done.stdout
    assert done.stdout.splitlines()[-1] == "That took 1 turns of tool calls across 2 model requests."


def test_no_api_key_is_one_clear_line_and_exit_2(model: FakeMessagesAPI, workspace: Path) -> None:
    env = cli_env(model, workspace)
    del env["ANTHROPIC_API_KEY"]
    done = harness(env, "anything")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "ANTHROPIC_API_KEY" in done.stderr
    assert model.requests == []


def test_a_bad_config_stops_at_start_naming_the_key(
    model: FakeMessagesAPI, workspace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "h.toml"
    config.write_text("[policy.tools]\nwrite_file = 'sometimes'\n")
    done = harness(cli_env(model, workspace, HARNESS_CONFIG=str(config)), "anything")
    assert done.returncode == 2
    assert "policy.tools.write_file" in done.stderr
    assert model.requests == []


def test_no_task_prints_usage(model: FakeMessagesAPI, workspace: Path) -> None:
    done = harness(cli_env(model, workspace), "  ")
    assert done.returncode == 2 and "usage" in done.stderr


def test_a_model_api_failure_exits_1_with_the_error(model: FakeMessagesAPI, workspace: Path) -> None:
    from tests.fakes.messages_api import http_error

    model.script(*[http_error(400, message="bad things")] * 3)
    done = harness(cli_env(model, workspace), "anything")
    assert done.returncode == 1
    assert "bad things" in done.stderr


def test_ctrl_c_at_the_approval_prompt_stops_cleanly(model: FakeMessagesAPI, workspace: Path) -> None:
    model.script(reply(tool_use("write_file", {"path": "x.txt", "content": "x"})))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "write x"],
        env=cli_env(model, workspace),
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen = bytearray()
    prompted = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        while chunk := proc.stdout.read1(1024):
            seen.extend(chunk)
            if b"type n to decline: " in seen:
                prompted.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert prompted.wait(30), seen.decode()
        # A SIGINT landing between the prompt's flush and the blocking read() is lost inside
        # CPython (the read never sees EINTR); a person would press Ctrl-C again, and so do we.
        for _ in range(10):
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(3)
                break
            except subprocess.TimeoutExpired:
                continue
        assert proc.wait(1) == 130
    finally:
        proc.kill()
    reader.join(5)
    assert "stopped cleanly" in seen.decode()
    assert not (workspace / "x.txt").exists()
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read().decode()
