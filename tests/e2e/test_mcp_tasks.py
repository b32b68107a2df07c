"""Long work as MCP tasks, end to end: the real bot, real `python -m workers` processes, real Redis,
and a real MCP server (`tests/fakes/mcp_tasks_server.py`, the `mcp` package's server API) whose
task tools answer `tools/call` with a task (the 2026-07-28 `io.modelcontextprotocol/tasks`
extension) and move on one step at each `tasks/get`.

The run parks on the task (no worker waits); the worker whose hub reaches it polls it at the
server's pace; its result answers the call on whichever worker resumes the run, once. Stop and the
server's `timeout_seconds` send `tasks/cancel`; a worker that dies takes a stdio server's task
with it, and another worker answers the call as of unknown outcome; an HTTP server's task is
polled by any worker. The server logs every request it gets: "polled", "cancelled", "called once"
are read from its side.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.e2e.test_faults import posts, wait_text
from tests.e2e.test_mcp_inputs import buttons, running
from tests.e2e.test_operations import scrape
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.mcp_support import HttpDesk, require_bwrap
from tests.stack import ROOT, Stack, wait_until

pytestmark = pytest.mark.e2e

SERVER = Path(__file__).resolve().parents[1] / "fakes" / "mcp_tasks_server.py"
NOTE = "as a task"


@pytest.fixture
def jobs_log(tmp_path: Path) -> Path:
    (tmp_path / "server").mkdir()
    return tmp_path / "server" / "jobs.jsonl"


# A short lease: a worker killed mid-poll (its claim), or gone with its stdio server's task (its
# hub's word that it is alive), is noticed within seconds rather than half a minute.
FAST = {"HARNESS_LEASE_SECONDS": "3"}


def stdio_config(log: Path, timeout: float = 60) -> str:
    return (
        f'[[mcp.servers]]\nname = "jobs"\ncommand = {json.dumps(sys.executable)}\n'
        f'args = [{json.dumps(str(SERVER))}, "stdio"]\n'
        f"env = {{ MCP_CALL_LOG = {json.dumps(str(log))} }}\n"
        f"writable = [{json.dumps(str(log.parent))}]\ntimeout_seconds = {timeout}\n"
        '[policy]\ndefault = "allow"\n'
    )


@pytest.fixture
def stack(redis_url: str, tmp_path: Path, jobs_log: Path) -> Iterator[Stack]:
    require_bwrap()
    yield from running(redis_url, tmp_path, stdio_config(jobs_log))


def requests(log: Path, method: str | None = None) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return [r for r in found if method is None or r["method"] == method]


def start(stack: Stack, args: dict[str, Any], answer: str, channel: str, tool: str = "long_job") -> str:
    stack.model.script(reply(tool_use(f"jobs__{tool}", args, id="toolu_job")), reply(text(answer)))
    _, ts, _ = stack.mention("run the job", channel=channel, user="UANN")
    return ts


def job_result(stack: Stack) -> dict[str, Any]:
    """The `tool_result` of the job call in the model's last request."""
    return next(
        b
        for m in stack.model.requests[-1]["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result" and b["tool_use_id"] == "toolu_job"
    )


def chunks(stack: Stack) -> str:
    """Every streamed chunk and message Slack was sent, as one text (the turn's task lines)."""
    return json.dumps([c.params for c in stack.slack.calls])


def run_status(stack: Stack) -> set[str]:
    conn = redis.Redis.from_url(stack.redis_url)
    return {str(json.loads(_record(conn.get(k)))["status"]) for k in conn.keys("harness:run:*")}


def _record(raw: bytes | None) -> str:
    from store.records import unpack

    assert raw is not None
    return unpack(raw)


def test_a_task_parks_the_run_and_its_result_answers_the_call_once(stack: Stack, jobs_log: Path) -> None:
    ts = start(stack, {"steps": 4, "poll_ms": 500, "note": ", compiling"}, "Built.", "C61")
    note = wait_text(stack, "C61", ts, NOTE)
    assert "step" in note["text"] or "queued" in note["text"]
    # Parked while the server works: no worker holds the run, and the poller keeps asking. It waits
    # on no person: /metrics counts it as a task, not as an approval pending.
    assert run_status(stack) == {"awaiting_approval"}
    samples = scrape(stack)
    assert samples[("harness_tasks_waiting", ())] == 1 and samples[("harness_approvals_pending", ())] == 0
    assert not any(name == "harness_runs_waiting" and value for (name, _), value in samples.items())
    wait_until(lambda: len(requests(jobs_log, "tasks/get")) >= 2, 30)
    wait_text(stack, "C61", ts, "Built.")
    assert job_result(stack)["content"] == "long job done in 4 steps"
    assert "is_error" not in job_result(stack)
    assert len(requests(jobs_log, "tools/call")) == 1  # called once: the result came from the task
    assert len(requests(jobs_log, "tasks/get")) == 4 and requests(jobs_log, "tasks/cancel") == []
    assert all(r["declared"] for r in requests(jobs_log))  # every request declared the extension
    # The note followed the server's status, then said how the task ended; the turn's line waited.
    wait_until(lambda: any("finished its task" in str(m["blocks"]) for m in posts(stack, "C61", ts)), 30)
    updates = [c.params for c in stack.slack.calls if c.method == "chat.update"]
    assert any("compiling" in json.dumps(u) for u in updates)
    assert "Waiting on jobs" in chunks(stack)
    stack.settled()
    assert len(stack.model.requests) == 2
    assert not redis.Redis.from_url(stack.redis_url).keys("harness:task:*")  # its entry went with it


@pytest.mark.parametrize(
    ("tool", "words"),
    [
        ("failing_job", "the backend broke"),
        ("dropped_job", "the operator stopped it"),
        ("forgetful_job", "no longer knows"),
    ],
)
def test_a_task_that_fails_is_dropped_or_forgotten_answers_the_model_an_error(
    stack: Stack, jobs_log: Path, tool: str, words: str
) -> None:
    ts = start(stack, {}, "It failed.", "C62", tool=tool)
    wait_text(stack, "C62", ts, "It failed.")
    result = job_result(stack)
    assert result.get("is_error") is True and words in json.dumps(result)
    wait_until(lambda: any("ended in error" in str(m["blocks"]) for m in posts(stack, "C62", ts)), 30)


def test_a_stop_while_a_task_works_cancels_it_and_ends_the_run(stack: Stack, jobs_log: Path) -> None:
    ts = start(stack, {"steps": 10_000, "poll_ms": 500}, "never said", "C63")
    wait_text(stack, "C63", ts, NOTE)
    wait_until(lambda: requests(jobs_log, "tasks/get"), 30)  # it is being polled
    working = wait_until(lambda: next((m for m in posts(stack, "C63", ts) if "stop" in buttons(m)), None), 30)
    assert stack.click(working, "stop", user="UANN") == 200
    wait_until(lambda: requests(jobs_log, "tasks/cancel"), 30)
    (cancel,) = requests(jobs_log, "tasks/cancel")
    assert cancel["task"] == requests(jobs_log, "tasks/get")[0]["task"]
    wait_until(lambda: any("stopped by" in str(m["blocks"]) for m in posts(stack, "C63", ts)), 30)
    stack.settled()
    assert len(stack.model.requests) == 1  # the model is not asked again
    assert run_status(stack) == {"stopped"}


def test_a_task_past_its_timeout_is_cancelled_and_answered_as_a_timeout(
    redis_url: str, tmp_path: Path, jobs_log: Path
) -> None:
    require_bwrap()
    for stack in running(redis_url, tmp_path, stdio_config(jobs_log, timeout=3), FAST):
        _outlives_its_time(stack, jobs_log)


def _outlives_its_time(stack: Stack, jobs_log: Path) -> None:
    ts = start(stack, {"steps": 10_000, "poll_ms": 500}, "Too slow.", "C64")
    wait_text(stack, "C64", ts, "Too slow.", timeout=60)
    result = job_result(stack)
    assert result.get("is_error") is True and "did not finish within 3 seconds" in json.dumps(result)
    wait_until(lambda: requests(jobs_log, "tasks/cancel"), 30)
    wait_until(lambda: any("outlived its time" in str(m["blocks"]) for m in posts(stack, "C64", ts)), 30)


def test_a_stdio_servers_task_dies_with_its_worker_and_another_answers_it_as_unknown(
    redis_url: str, tmp_path: Path, jobs_log: Path
) -> None:
    require_bwrap()
    for stack in running(redis_url, tmp_path, stdio_config(jobs_log), FAST):
        _dies_with_its_worker(stack, jobs_log)


def _dies_with_its_worker(stack: Stack, jobs_log: Path) -> None:
    ts = start(stack, {"steps": 10_000, "poll_ms": 500}, "The worker died.", "C65")
    wait_until(lambda: requests(jobs_log, "tasks/get"), 30)
    (worker,) = [p for p in stack.processes if p.name == "worker"]
    worker.stop(signal.SIGKILL)  # its hub, its server's process and the task go with it
    stack.start_worker()
    wait_text(stack, "C65", ts, "The worker died.", timeout=90)
    result = job_result(stack)
    assert result.get("is_error") is True and "Outcome unknown" in json.dumps(result)
    assert len(requests(jobs_log, "tools/call")) == 1  # never sent again


def test_an_http_servers_task_is_polled_by_another_worker_after_the_first_dies(
    redis_url: str, tmp_path: Path, jobs_log: Path
) -> None:
    desk = HttpDesk(jobs_log, script=SERVER).start()
    config = f'[[mcp.servers]]\nname = "jobs"\nurl = "{desk.url}"\ntimeout_seconds = 120\n'
    config += '[policy]\ndefault = "allow"\n'
    try:
        for stack in running(redis_url, tmp_path, config, FAST):
            ts = start(stack, {"steps": 12, "poll_ms": 500}, "Done elsewhere.", "C66")
            wait_until(lambda: requests(jobs_log, "tasks/get"), 30)
            (worker,) = [p for p in stack.processes if p.name == "worker"]
            worker.stop(signal.SIGKILL)
            stack.start_worker()
            wait_text(stack, "C66", ts, "Done elsewhere.", timeout=90)
            assert job_result(stack)["content"] == "long job done in 12 steps"
            assert len(requests(jobs_log, "tools/call")) == 1
            gets = requests(jobs_log, "tasks/get")
            assert {g["name"] for g in gets} == {gets[0]["task"]}  # Mcp-Name: the task id, every poll
    finally:
        desk.stop()


def test_the_terminal_waits_for_a_task_showing_its_status_and_answers_with_its_result(
    tmp_path: Path, jobs_log: Path
) -> None:
    require_bwrap()
    config = tmp_path / "harness.toml"
    config.write_text(stdio_config(jobs_log))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "HARNESS_", "SLACK_"))}
    with FakeMessagesAPI() as model:
        model.script(
            reply(tool_use("jobs__long_job", {"steps": 3, "poll_ms": 500, "note": " \x1b[31mred"})),
            reply(text("Built in the terminal.")),
        )
        env.update(
            PYTHONPATH=str(ROOT),
            HARNESS_CONFIG=str(config),
            HARNESS_WORKSPACE=str(tmp_path),
            ANTHROPIC_BASE_URL=model.base_url,
            ANTHROPIC_API_KEY="sk-test",
        )
        done = subprocess.run(
            [sys.executable, "-m", "harness", "build it"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            cwd=tmp_path,
        )
        sent = model.requests[-1]["messages"]
    assert done.returncode == 0, done.stderr
    assert "[task] jobs works on jobs__long_job as a task" in done.stdout
    assert '[task] jobs: "step 1 of 3 \\u001b[31mred"' in done.stdout  # a server's escapes stay inert
    assert "\x1b" not in done.stdout
    assert "Built in the terminal." in done.stdout
    assert "long job done in 3 steps" in json.dumps(sent)
    assert len(requests(jobs_log, "tools/call")) == 1 and len(requests(jobs_log, "tasks/get")) == 3
