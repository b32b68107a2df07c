"""MCP Tasks through the hub, against real server processes (`harness.tools.mcp_tasks`).

A call a server answers with a task comes back as a result that waits on it (`ToolResult.task`);
`McpHub.poll_task` asks where it stands and, once it ended, what answers the call;
`McpHub.cancel_task` asks the server to stop it. The 2026-07-28 extension is served by
`tests/fakes/mcp_tasks_server.py` (over stdio in bubblewrap, and over streamable HTTP), whose tasks
move one step per `tasks/get` (nothing here waits on a clock) and which logs every request it got;
the 2025-11-25 tasks by server-everything's `simulate-research-query`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from harness import texts
from harness.config import load_config
from harness.tools.base import ToolResult
from harness.tools.mcp import McpHub
from harness.tools.relay import RelayServer
from harness.tools.tasks import (
    CANCELLED,
    COMPLETED,
    FAILED,
    INPUT_REQUIRED,
    MESSAGE_MAX,
    UNREACHABLE,
    WORKING,
    TaskHandle,
    TaskHost,
)
from tests.harness.test_mcp_real_servers import EVERYTHING, NO_EVERYTHING, HttpEverything
from tests.mcp_support import HttpDesk, calls, require_bwrap
from tests.stack import wait_until

SERVER = Path(__file__).resolve().parents[1] / "fakes" / "mcp_tasks_server.py"
TIMEOUT = 20


@dataclass
class Jobs:
    """The hub with the tasks server (`jobs`), how it runs, and the server's request log."""

    hub: McpHub
    transport: str
    log: Path
    desk: HttpDesk | None = None

    def call(self, tool: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        return self.hub.call("jobs", tool, arguments or {}, True)

    def started(self, tool: str, arguments: dict[str, Any] | None = None) -> TaskHandle:
        """A call of `tool` that the server answered with a task: its handle."""
        answer = self.call(tool, arguments)
        assert answer.task is not None, answer.content
        return answer.task

    def requests(self, method: str) -> list[dict[str, Any]]:
        return [c for c in calls(self.log) if c["method"] == method]


def hub_of(tmp_path: Path, table: str) -> McpHub:
    path = tmp_path / "harness.toml"
    path.write_text(table + f'timeout_seconds = {TIMEOUT}\n[policy]\ndefault = "allow"\n')
    config = load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})
    return McpHub(config.resolved_servers({})).start()


def stdio_table(log: Path) -> str:
    """The tasks server over stdio, in bubblewrap (skips without it), logging to `log`."""
    require_bwrap()
    env = f"env = {{ MCP_CALL_LOG = {json.dumps(str(log))} }}\n"
    return (
        f'[[mcp.servers]]\nname = "jobs"\ncommand = {json.dumps(sys.executable)}\n'
        f'args = [{json.dumps(str(SERVER))}, "stdio"]\n{env}writable = [{json.dumps(str(log.parent))}]\n'
    )


@pytest.fixture
def log(tmp_path: Path) -> Path:
    (tmp_path / "server").mkdir()
    return tmp_path / "server" / "requests.jsonl"


@pytest.fixture(params=["stdio", "http"])
def jobs(request: pytest.FixtureRequest, tmp_path: Path, log: Path) -> Iterator[Jobs]:
    desk = None
    if request.param == "stdio":
        table = stdio_table(log)
    else:
        desk = HttpDesk(log, script=SERVER).start()
        table = f'[[mcp.servers]]\nname = "jobs"\nurl = "{desk.url}"\n'
    hub = hub_of(tmp_path, table)
    try:
        assert not hub.listing().away, hub.listing().away
        yield Jobs(hub, request.param, log, desk)
    finally:
        hub.close()
        if desk is not None:
            desk.stop()


def test_a_call_answered_with_a_task_returns_its_handle(jobs: Jobs) -> None:
    before = time.time()
    answer = jobs.call("long_job", {"steps": 3, "poll_ms": 1500})
    after = time.time()
    handle = answer.task
    assert handle is not None and not answer.is_error
    assert answer.content == texts.MCP_TASK_WAITING.format(server="jobs", name="jobs__long_job")
    assert handle.server == "jobs" and handle.tool == "long_job" and handle.task_id.startswith("long_job-")
    assert handle.status == WORKING and handle.message == "queued" and handle.poll_seconds == 1.5
    assert before <= handle.since <= after and handle.deadline == handle.since + TIMEOUT
    assert handle.side_effects and handle.protocol == "2026-07-28"
    # A stdio server's task lives in this hub's child process: only this hub may ask about it.
    assert handle.holder == (jobs.hub.holder if jobs.transport == "stdio" else "")
    (sent,) = jobs.requests("tools/call")
    assert sent["tool"] == "long_job" and sent["declared"] is True  # the extension, on the request


def test_a_plain_answer_is_no_task_though_the_extension_is_declared(jobs: Jobs) -> None:
    answer = jobs.call("quick", {"text": "now"})
    assert answer.task is None and not answer.is_error and answer.content == "quick: now"
    assert [c["declared"] for c in jobs.requests("tools/call")] == [True]


def test_polling_walks_working_to_completed_and_returns_the_result(jobs: Jobs) -> None:
    handle = jobs.started("long_job", {"steps": 3, "poll_ms": 1500})
    first = jobs.hub.poll_task(handle)
    assert (first.status, first.message, first.poll_seconds) == (WORKING, "step 1 of 3", 1.5)
    assert not first.ended and first.result is None
    second = jobs.hub.poll_task(handle.seen(first.status, first.message, first.poll_seconds))
    assert (second.status, second.message) == (WORKING, "step 2 of 3")
    done = jobs.hub.poll_task(handle)
    assert done.status == COMPLETED and done.result is not None
    assert not done.result.is_error and done.result.text == "long job done in 3 steps"
    assert len(jobs.requests("tasks/get")) == 3


def test_a_task_the_server_suggests_no_interval_for_polls_without_one(jobs: Jobs) -> None:
    handle = jobs.started("long_job", {"steps": 2})
    assert handle.poll_seconds is None
    assert jobs.hub.poll_task(handle).poll_seconds is None


def test_a_failed_task_answers_is_error_with_the_servers_error(jobs: Jobs) -> None:
    found = jobs.hub.poll_task(jobs.started("failing_job"))
    assert found.status == FAILED and found.result is not None and found.result.is_error
    assert found.result.content == texts.MCP_TASK_FAILED.format(
        name="jobs__failing_job", server="jobs", error="the backend broke"
    )


def test_a_task_the_server_cancelled_answers_is_error_with_its_message(jobs: Jobs) -> None:
    found = jobs.hub.poll_task(jobs.started("dropped_job"))
    assert found.status == CANCELLED and found.result is not None and found.result.is_error
    assert "the operator stopped it" in found.result.text and "jobs__dropped_job" in found.result.text


def test_a_task_the_server_forgot_is_gone(jobs: Jobs) -> None:
    handle = jobs.started("forgetful_job")
    found = jobs.hub.poll_task(handle)
    assert found.result is not None and found.result.is_error
    assert found.result.content == texts.MCP_TASK_GONE.format(server="jobs", name="jobs__forgetful_job")
    assert jobs.requests("tasks/get")[-1]["task"] == handle.task_id
    assert jobs.hub.cancel_task(handle) is False  # nothing to cancel: not acked


def test_a_task_that_asks_for_input_is_cancelled_and_says_so(jobs: Jobs) -> None:
    handle = jobs.started("asking_job")
    found = jobs.hub.poll_task(handle)
    assert found.status == INPUT_REQUIRED and found.result is not None and found.result.is_error
    assert found.result.content == texts.MCP_TASK_ASKS_INPUT.format(server="jobs", name="jobs__asking_job")
    assert [c["task"] for c in jobs.requests("tasks/cancel")] == [handle.task_id]  # it reached the server


def test_cancel_task_reaches_the_server_and_the_task_ends_cancelled(jobs: Jobs) -> None:
    handle = jobs.started("long_job", {"steps": 50})
    assert jobs.hub.poll_task(handle).status == WORKING
    assert jobs.hub.cancel_task(handle) is True
    (cancel,) = jobs.requests("tasks/cancel")
    assert cancel["task"] == handle.task_id and cancel["declared"] is True
    after = jobs.hub.poll_task(handle)
    assert after.status == CANCELLED and after.result is not None and after.result.is_error


def test_over_http_every_tasks_request_names_its_task_in_mcp_name(tmp_path: Path, log: Path) -> None:
    desk = HttpDesk(log, script=SERVER).start()
    hub = hub_of(tmp_path, f'[[mcp.servers]]\nname = "jobs"\nurl = "{desk.url}"\n')
    try:
        handle = hub.call("jobs", "long_job", {"steps": 2}, True).task
        assert handle is not None
        assert hub.poll_task(handle).status == WORKING
        assert hub.cancel_task(handle)
    finally:
        hub.close()
        desk.stop()
    sent = [c for c in calls(log) if c["method"].startswith("tasks/")]
    assert [(c["method"], c["name"]) for c in sent] == [
        ("tasks/get", handle.task_id),
        ("tasks/cancel", handle.task_id),
    ]


def test_a_server_that_is_down_is_unreachable_and_the_poll_says_why(tmp_path: Path, log: Path) -> None:
    desk = HttpDesk(log, script=SERVER).start()
    hub = hub_of(tmp_path, f'[[mcp.servers]]\nname = "jobs"\nurl = "{desk.url}"\n')
    try:
        handle = hub.call("jobs", "long_job", {"steps": 5}, True).task
        assert handle is not None
        desk.kill()
        found = hub.poll_task(handle)
        assert found.status == UNREACHABLE and found.result is None and found.message
        assert hub.cancel_task(handle) is False
    finally:
        hub.close()
        desk.stop()


def test_a_handle_of_a_server_not_configured_or_of_another_hub_is_unreachable(jobs: Jobs) -> None:
    handle = jobs.started("long_job", {"steps": 5})
    elsewhere = jobs.hub.poll_task(replace(handle, server="nowhere"))
    assert (elsewhere.status, elsewhere.message, elsewhere.result) == (UNREACHABLE, "not configured", None)
    other = jobs.hub.poll_task(replace(handle, holder="another-workers-hub"))
    assert other.status == UNREACHABLE and "another worker" in other.message
    assert jobs.requests("tasks/get") == []  # neither was sent


def test_a_task_made_on_the_other_protocol_is_gone(jobs: Jobs) -> None:
    handle = replace(jobs.started("long_job", {"steps": 5}), protocol="2025-11-25")
    found = jobs.hub.poll_task(handle)
    assert found.result is not None and found.result.is_error and "no longer knows" in found.result.text
    assert jobs.requests("tasks/get") == []


def test_a_servers_status_message_is_cut_and_never_logged(
    jobs: Jobs, caplog: pytest.LogCaptureFixture
) -> None:
    note = "\n2026-01-01 00:00:00,000 INFO workers.watchdog: FORGED" + "x" * 2000
    with caplog.at_level(logging.DEBUG, logger="harness"):
        handle = jobs.started("long_job", {"steps": 3, "note": note})
        found = jobs.hub.poll_task(handle)
    assert found.status == WORKING and found.message.startswith("step 1 of 3\n2026-01-01")
    assert len(found.message) == MESSAGE_MAX
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("harness")]
    assert any("long_job" in line for line in ours)  # the harness did log the task, without its text
    assert not [line for line in ours if "FORGED" in line]


def test_the_hub_is_a_task_host(jobs: Jobs) -> None:
    host: TaskHost = jobs.hub
    assert len(host.holder) == 32 and int(host.holder, 16) >= 0  # a uuid4, made per hub


def test_a_forked_caller_gets_the_task_through_the_relay_unchanged(tmp_path: Path, log: Path) -> None:
    hub = hub_of(tmp_path, stdio_table(log))
    relay = RelayServer(hub).start()
    out = tmp_path / "child.json"
    try:
        client = relay.client()
        pid = os.fork()
        if pid == 0:  # the child: what an RQ work horse is
            code = 1
            try:
                answer = client.call("jobs", "long_job", {"steps": 2, "poll_ms": 700}, True)
                out.write_text(json.dumps(answer.to_json()))
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        answer = ToolResult.from_json(json.loads(out.read_text()))
        handle = answer.task
        assert handle is not None and not answer.is_error and answer.to_json() == json.loads(out.read_text())
        assert handle.holder == hub.holder and handle.poll_seconds == 0.7 and handle.tool == "long_job"
        assert hub.poll_task(handle).status == WORKING  # the parent's hub can follow the child's task
        done = hub.poll_task(handle)
        assert done.result is not None and done.result.text == "long job done in 2 steps"
    finally:
        relay.close()
        hub.close()


# --- 2025-11-25: server-everything's task-only tool ------------------------------------------


@pytest.fixture(params=["stdio", "http"])
def everything(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[McpHub]:
    if not (os.access(EVERYTHING, os.X_OK) and shutil.which("node")):
        pytest.skip(NO_EVERYTHING)
    if request.param == "stdio":
        table = f'[[mcp.servers]]\nname = "ev"\ncommand = {json.dumps(str(EVERYTHING))}\nargs = ["stdio"]\n'
        hub = hub_of(tmp_path, table)
    else:
        server = HttpEverything(tmp_path / "everything.out").start()
        request.addfinalizer(server.kill)
        hub = hub_of(tmp_path, f'[[mcp.servers]]\nname = "ev"\nurl = "{server.url}"\n')
    try:
        assert not hub.listing().away, hub.listing().away
        yield hub
    finally:
        hub.close()


def test_everythings_task_only_tool_is_listed_and_polled_to_its_report(everything: McpHub) -> None:
    listed = {t.name: t for t in everything.listing().tools}
    assert listed["simulate-research-query"].task_only and not listed["echo"].task_only
    answer = everything.call("ev", "simulate-research-query", {"topic": "owls"}, True)
    handle = answer.task
    assert handle is not None and not answer.is_error, answer.content
    assert handle.protocol == "2025-11-25" and handle.poll_seconds == 1.0 and handle.status == WORKING
    seen: list[str] = []

    def ended() -> Any:
        found = everything.poll_task(handle)
        assert found.status in (WORKING, COMPLETED), found
        seen.append(found.message)
        return found.result

    result = wait_until(ended, timeout=60, interval=0.5)
    assert not result.is_error and "# Research Report: owls" in result.text
    assert "Gathering sources..." in seen or "Analyzing content..." in seen  # its progress, as it went


def test_everythings_task_cancelled_ends_cancelled(everything: McpHub) -> None:
    handle = everything.call("ev", "simulate-research-query", {"topic": "bats"}, True).task
    assert handle is not None
    assert everything.cancel_task(handle) is True
    found = everything.poll_task(handle)
    assert found.status == CANCELLED and found.result is not None and found.result.is_error
