"""SIGHUP reads HARNESS_CONFIG again, in the real bot and the real worker, without a restart.

A bot (gunicorn, HTTP mode) and a prefork worker start with config A; the file is rewritten to
config B and both get SIGHUP: a new mention gets B's tools and B's approvers, a run parked before
is still parked and resumes under B's definition of its profile. Then a config with an unknown
key: one line in each log names it, both keep serving under B. Socket Mode reloads the same way.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from store import RunStatus, Store
from tests.e2e.test_socket_mode import SocketBot
from tests.fakes import payloads
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import Process, Stack, descendants, has_actions, thread, wait_post, wait_until
from workers.process import horses

pytestmark = pytest.mark.e2e

GENEROUS = "[limits]\nmax_runs_per_user = 1000\nmax_runs_per_channel = 1000\n"
DESK = """
[[profiles]]
name = "desk"
channels = ["CRL1"]
[profiles.tools]
builtin = {builtin}
[profiles.approvals]
approvers = [{approver}]
escalate_after_minutes = 600
escalate_to = [{escalate}]
"""
CONFIG_A = GENEROUS + DESK.format(builtin='["get_time", "write_file"]', approver='"UANN"', escalate='"UESCA"')
CONFIG_B = GENEROUS + DESK.format(
    builtin='["get_time", "read_file", "write_file"]', approver='"UBEN"', escalate='"UESCB"'
)
BAD = CONFIG_B + "[budgets]\nper_team_daily_tokens = 5\n"  # no such key


@pytest.fixture
def stack(redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        stack = Stack(redis_url, slack, model, tmp_path, config=CONFIG_A)
        try:
            yield stack
        finally:
            stack.stop()


def write_config(stack: Stack, config: str) -> None:
    (stack.workdir / "harness.toml").write_text(config, encoding="utf-8")


def hang_up(*processes: Process) -> None:
    for process in processes:
        process.proc.send_signal(signal.SIGHUP)


def lines(process: Process, needle: str) -> list[str]:
    return [line for line in process.output().splitlines() if needle in line]


def gunicorn_workers(bot: Process) -> set[int]:
    return set(descendants(bot.proc.pid))


def replaced(stack: Stack, reason: str) -> float:
    """`harness_work_horses_replaced_total{reason=...}` as the bot's /metrics serves it."""
    with urllib.request.urlopen(f"{stack.url}/metrics", timeout=10) as answer:
        body = answer.read().decode()
    line = f'harness_work_horses_replaced_total{{reason="{reason}"}} '
    found = [row for row in body.splitlines() if row.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def offered(stack: Stack, marker: str) -> list[set[str]]:
    """The tools of each model request about `marker`, in order."""
    asked = [r for r in stack.model.requests if marker in str(r["messages"][0])]
    return [{tool["name"] for tool in r.get("tools") or []} for r in asked]


def card(stack: Stack, channel: str, ts: str) -> dict[str, Any]:
    return wait_post(stack, channel, ts, has_actions)


def answered(stack: Stack, channel: str, ts: str, needle: str) -> dict[str, Any]:
    return wait_post(stack, channel, ts, lambda m: needle in m["text"], timeout=30)


def refused_to(stack: Stack, user: str, channel: str) -> int:
    return len([e for e in stack.slack.ephemerals if e["user"] == user and e["channel"] == channel])


def park_a_write(stack: Stack, marker: str) -> tuple[str, dict[str, Any]]:
    """A run in CRL1 whose model asks to write a file: its mention's ts and its approval card."""
    stack.model.script_for(
        marker,
        reply(tool_use("write_file", {"path": f"{marker}.txt", "content": "hi"})),
        reply(text(f"{marker} done")),
    )
    status, ts, _ = stack.mention(f"{marker}: write a file", channel="CRL1", user="UCAROL")
    assert status == 200
    return ts, card(stack, "CRL1", ts)


def approve_as(stack: Stack, message: dict[str, Any], user: str) -> None:
    assert stack.click(message, "approve", user=user) == 200


def test_sighup_reloads_bot_and_worker_and_a_bad_config_changes_nothing(stack: Stack) -> None:
    bot = stack.start_bot()
    worker = stack.start_worker()
    parked_ts, parked_card = park_a_write(stack, "rlparked")
    assert offered(stack, "rlparked") == [{"get_time", "write_file"}]  # A: the desk offers no read_file

    write_config(stack, CONFIG_B)
    old_web = gunicorn_workers(bot)
    hang_up(bot, worker)
    wait_until(lambda: lines(bot, "config reloaded from") and lines(worker, "config reloaded from"), 30)
    assert lines(worker, "config reloaded from")[0].endswith(
        f"config reloaded from {stack.workdir}/harness.toml: 1 profiles"
    )
    wait_until(lambda: not gunicorn_workers(bot) & old_web, 30)  # gunicorn's old workers have left
    wait_until(lambda: replaced(stack, horses.RELOAD) == 1, 30)  # the next horse forked under B

    # A new mention in CRL1 gets B's tools and B's approvers.
    new_ts, new_card = park_a_write(stack, "rlfresh")
    assert offered(stack, "rlfresh") == [{"get_time", "read_file", "write_file"}]
    approve_as(stack, new_card, "UANN")  # A's approver is no longer one
    wait_until(lambda: refused_to(stack, "UANN", "CRL1") == 1)
    approve_as(stack, new_card, "UBEN")
    answered(stack, "CRL1", new_ts, "rlfresh done")

    # The run parked under A is still parked; the watchdog's reminder names B's escalate_to.
    record = Store(redis.Redis.from_url(stack.redis_url)).runs.load(_run_of(stack, parked_ts))
    assert record is not None and record.status is RunStatus.AWAITING_APPROVAL and record.profile == "desk"
    due_now(stack, record.run_id)
    reminder = wait_post(stack, "CRL1", parked_ts, lambda m: "UESC" in m["text"])
    assert "UESCB" in reminder["text"] and "UESCA" not in reminder["text"]
    # It resumes under B's definition of its profile: B's approver, B's tools.
    approve_as(stack, parked_card, "UBEN")
    answered(stack, "CRL1", parked_ts, "rlparked done")
    assert offered(stack, "rlparked")[-1] == {"get_time", "read_file", "write_file"}
    assert (stack.workspace / "rlparked.txt").read_text() == "hi"

    # A bad config: one line in each log names the key; both keep serving under B.
    write_config(stack, BAD)
    hang_up(bot, worker)
    key = "budgets.per_team_daily_tokens"
    wait_until(lambda: lines(bot, key) and lines(worker, key), 30)
    assert len(lines(bot, key)) == 1 and len(lines(worker, key)) == 1
    assert "config reload refused, the running config is kept" in lines(worker, key)[0]
    assert bot.proc.poll() is None and worker.proc.poll() is None
    later_ts, later_card = park_a_write(stack, "rllater")
    assert offered(stack, "rllater") == [{"get_time", "read_file", "write_file"}]
    approve_as(stack, later_card, "UBEN")
    answered(stack, "CRL1", later_ts, "rllater done")
    assert replaced(stack, horses.RELOAD) == 1  # a refused reload replaced no horse
    assert replaced(stack, horses.CRASHED) == 0
    assert len(lines(bot, "config reloaded from")) == 1 and len(lines(worker, "config reloaded from")) == 1


def due_now(stack: Stack, run_id: str) -> None:
    """Make the escalation reminder of `run_id`'s park due now (it was set 600 minutes ahead)."""
    conn = redis.Redis.from_url(stack.redis_url)
    members = [m for m in conn.zrange("harness:escalations", 0, -1) if m.decode().startswith(f"{run_id}:")]
    assert len(members) == 1, members
    conn.zadd("harness:escalations", {members[0]: time.time()}, xx=True)


def _run_of(stack: Stack, mention_ts: str) -> str:
    """The run id started by the mention at `mention_ts` (its thread's first reply names it)."""
    conn = redis.Redis.from_url(stack.redis_url)
    store = Store(conn)
    for key in conn.scan_iter("harness:run:*"):
        run_id = key.decode().rsplit(":", 1)[1]
        record = store.runs.load(run_id)
        if record is not None and record.thread_ts == mention_ts:
            return run_id
    raise AssertionError(f"no run for the mention at {mention_ts}: {thread(stack, 'CRL1', mention_ts)}")


GATE = """
[[profiles]]
name = "gate"
channels = ["CSRL"]
requesters = [{who}]
"""


def test_sighup_reloads_a_socket_mode_bot(redis_url: str, tmp_path: Path) -> None:
    bot = SocketBot(redis_url, tmp_path)
    (tmp_path / "harness.toml").write_text(GATE.format(who='"UANN"'), encoding="utf-8")
    bot.start()
    try:
        assert bot.bot is not None
        mention(bot, "before", "EvRl1")
        wait_until(lambda: refused_to(bot.stack, "UBOB", "CSRL") == 1)  # A: only UANN may ask here

        (tmp_path / "harness.toml").write_text(GATE.format(who='"UANN", "UBOB"'), encoding="utf-8")
        os.kill(bot.bot.proc.pid, signal.SIGHUP)
        wait_until(lambda: lines(bot.bot, "config reloaded from"), 30)  # type: ignore[arg-type]
        ts = mention(bot, "after", "EvRl2")
        assert bot.slack.wait_for(lambda s: ("CSRL", ts, "eyes") in [r[:3] for r in s.reactions])

        (tmp_path / "harness.toml").write_text("[profiles]\n", encoding="utf-8")  # not an array of tables
        os.kill(bot.bot.proc.pid, signal.SIGHUP)
        wait_until(lambda: lines(bot.bot, "config reload refused"), 30)  # type: ignore[arg-type]
        assert len(lines(bot.bot, "config reload refused")) == 1
        assert "profiles" in lines(bot.bot, "config reload refused")[0]
        ts = mention(bot, "still", "EvRl3")
        assert bot.slack.wait_for(lambda s: ("CSRL", ts, "eyes") in [r[:3] for r in s.reactions])
        assert refused_to(bot.stack, "UBOB", "CSRL") == 1
        assert not bot.bot_exited()
    finally:
        bot.stop()


def mention(bot: SocketBot, word: str, event_id: str) -> str:
    """UBOB mentions the bot in CSRL over the socket; the mention's ts once it is acked."""
    ts = bot.slack.add_message("CSRL", f"<@UBOT> {word}", user="UBOB")
    event = payloads.app_mention(word, user="UBOB", channel="CSRL", ts=ts)
    envelope_id = bot.server.send("events_api", payloads.event_callback(event, event_id=event_id))
    assert envelope_id in bot.server.wait_acked([envelope_id])
    return ts


ECHO_TOOL = '''
from harness.tools import ToolContext, tool


@tool(side_effects=False)
def rl_echo(ctx: ToolContext) -> str:
    """Says hello."""
    return "hello"
'''
SERVER = """
[[mcp.servers]]
name = "tickets"
command = "python"
args = ["-c", "pass"]
env = {{ TICKETS_TOKEN = "${{{var}}}" }}
"""
WITH_MODULE = GENEROUS + DESK.format(builtin='["get_time"]', approver='"UBEN"', escalate='"UESCB"').replace(
    "[profiles.approvals]", 'modules = ["rl_echo_tool"]\n[profiles.approvals]'
)


@pytest.mark.parametrize("kind", ["fork", "simple"])
def test_fork_and_simple_workers_take_the_new_config_from_their_next_job(
    stack: Stack, tmp_path: Path, kind: str
) -> None:
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "rl_echo_tool.py").write_text(ECHO_TOOL, encoding="utf-8")
    stack.extra_env.update(
        HARNESS_WORKER_CLASS=kind, PYTHONPATH=f"{stack.env()['PYTHONPATH']}{os.pathsep}{modules}", RL_SET="x"
    )
    stack.model.responder = lambda body: reply(text("said"))
    stack.start_bot()
    worker = stack.start_worker()
    ask(stack, "rlk1")
    assert offered(stack, "rlk1") == [{"get_time", "write_file"}]

    # The new config names a tool module (imported now) and a new MCP server (kept for a restart).
    write_config(stack, WITH_MODULE + SERVER.format(var="RL_SET"))
    hang_up(worker)
    wait_until(lambda: lines(worker, "config reloaded from"), 30)
    assert lines(worker, "mcp.servers changed (added tickets): the running servers are kept until")
    ask(stack, "rlk2")
    assert offered(stack, "rlk2") == [{"get_time", "rl_echo"}]

    # Refused: a server's ${VAR} the environment lacks; a module that cannot be imported.
    write_config(stack, WITH_MODULE + SERVER.format(var="RL_UNSET"))
    hang_up(worker)
    wait_until(lambda: lines(worker, "${RL_UNSET}"), 30)
    assert "config reload refused" in lines(worker, "${RL_UNSET}")[0]
    write_config(stack, WITH_MODULE.replace("rl_echo_tool", "rl_no_such_module"))
    hang_up(worker)
    wait_until(lambda: lines(worker, "rl_no_such_module"), 30)
    assert len(lines(worker, "config reload refused")) == 2
    ask(stack, "rlk3")
    assert offered(stack, "rlk3") == [{"get_time", "rl_echo"}]
    assert worker.proc.poll() is None


def ask(stack: Stack, marker: str) -> None:
    """A mention in CRL1 answered at once."""
    status, ts, _ = stack.mention(f"{marker}: say something", channel="CRL1", user="UCAROL")
    assert status == 200
    answered(stack, "CRL1", ts, "said")


def test_a_busy_horse_finishes_its_job_under_the_old_config_then_is_replaced(stack: Stack) -> None:
    arrived, go = threading.Event(), threading.Event()

    def responder(body: dict[str, Any]) -> Any:
        if "rlbusy" in str(body["messages"][0]) and not arrived.is_set():
            arrived.set()
            go.wait(60)  # the horse is in the middle of this run's model request
        return reply(text("said"))

    stack.model.responder = responder
    stack.start_bot()
    worker = stack.start_worker()
    try:
        status, busy_ts, _ = stack.mention("rlbusy: take your time", channel="CRL1", user="UCAROL")
        assert status == 200 and arrived.wait(30)
        write_config(stack, CONFIG_B)
        hang_up(worker)
        wait_until(lambda: lines(worker, "leaves after this job (reload)"), 30)
        assert replaced(stack, horses.RELOAD) == 0  # not before its job is done
        go.set()
        answered(stack, "CRL1", busy_ts, "said")
        wait_until(lambda: replaced(stack, horses.RELOAD) == 1, 30)
    finally:
        go.set()
    assert offered(stack, "rlbusy") == [{"get_time", "write_file"}]  # its job began under A
    ask(stack, "rlnext")
    assert offered(stack, "rlnext") == [{"get_time", "read_file", "write_file"}]
    assert replaced(stack, horses.CRASHED) == 0
