"""Channel profiles end to end (issue 20): signed HTTP into the real bot, a real `python -m workers`,
real Redis, the loopback Slack and model.

Two channels, two profiles: each offers its own tools (read from the `tools` of the requests the
model received), has its own approvers and its own requesters; a channel no profile matches gets
the top level. A run keeps its profile through a park and a resume; a thread keeps it for the
next mention while its channel maps to it; a person a profile leaves out gets an ephemeral reply
and nothing starts.
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from messages import texts
from store.keys import Keys
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import (
    Process,
    RedisServer,
    Stack,
    descendants,
    has_actions,
    running_stack,
    thread,
    wait_post,
    wait_until,
)

pytestmark = pytest.mark.e2e

DB = 8  # other stacks: see tests/e2e/test_groups_escalation_home.py; 7 is test_profiles_mcp
OPS, GENERAL = "COPS", "CGENERAL"
CONFIG = f"""
[limits]
max_runs_per_user = 1000
max_runs_per_channel = 1000
[tools]
builtin = ["get_time", "list_files"]
[policy.tools]
get_time = "allow"
[approvals]
approvers = ["UALICE"]

[[profiles]]
name = "ops"
channels = ["{OPS}"]
requesters = ["UALICE", "UBOB", "SSRE"]
[profiles.tools]
builtin = ["get_time", "read_file", "write_file"]
[profiles.approvals]
approvers = ["UBOB"]
[profiles.policy.tools]
read_file = "ask"

[[profiles]]
name = "general"
channels = ["{GENERAL}", "im"]
[profiles.tools]
builtin = ["get_time"]
"""
_words = itertools.count(1)


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from running_stack(redis_server, tmp_path_factory.mktemp("profiles"), CONFIG, DB)


@pytest.fixture(autouse=True)
def sre(stack: Stack) -> Iterator[None]:
    stack.slack.set_usergroup("SSRE", ["UDAN"])
    yield


def word() -> str:
    return f"profiles{next(_words)}"


def offered(stack: Stack, marker: str) -> list[str]:
    """The tool names of the first model request whose task holds `marker`."""
    request = wait_until(
        lambda: next((r for r in stack.model.requests if marker in str(r["messages"][0])), None)
    )
    return sorted(t["name"] for t in request.get("tools") or [])


def requests_for(stack: Stack, marker: str) -> list[dict[str, Any]]:
    return [r for r in stack.model.requests if marker in str(r["messages"][0])]


def ask(stack: Stack, channel: str, marker: str, *replies: Any, user: str = "UALICE") -> str:
    stack.model.script_for(marker, *(replies or (reply(text(f"{marker}: done.")),)))
    status, ts, _ = stack.mention(f"{marker}: go", channel=channel, user=user)
    assert status == 200
    return ts


def test_each_channel_is_offered_its_profiles_tools(stack: Stack) -> None:
    ops, general, other = word(), word(), word()
    ask(stack, OPS, ops)
    ask(stack, GENERAL, general)
    ask(stack, "CELSEWHERE", other)
    assert offered(stack, ops) == ["get_time", "read_file", "write_file"]
    assert offered(stack, general) == ["get_time"]
    assert offered(stack, other) == ["get_time", "list_files"]  # no profile: the top level's


def test_a_direct_message_gets_the_im_profile(stack: Stack) -> None:
    marker = word()
    ask(stack, "DALICE", marker)
    assert offered(stack, marker) == ["get_time"]


def test_a_call_the_profile_does_not_offer_never_runs(stack: Stack) -> None:
    """A model naming a tool of another profile gets is_error: `list_files` is the top level's.

    (The stand-in is told not to refuse a history naming a tool `tools` lacks: what this test
    provokes on purpose.)"""
    stack.model.check_tool_names = False
    marker = word()
    ts = ask(
        stack,
        GENERAL,
        marker,
        reply(tool_use("list_files", {"path": "."})),
        reply(text(f"{marker}: done.")),
    )
    try:
        wait_post(stack, GENERAL, ts, lambda m: f"{marker}: done." in m["text"])
    finally:
        stack.model.check_tool_names = True
    second = requests_for(stack, marker)[1]
    result = second["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result.get("is_error") is True
    assert "README.md" not in str(result["content"])


def test_the_profiles_approvers_decide_and_its_tools_run_after_the_resume(stack: Stack) -> None:
    """In #ops UBOB decides, not the top level's UALICE; `write_file` (offered only there) runs
    after the park, so the resumed run still has its profile."""
    marker = word()
    ts = ask(
        stack,
        OPS,
        marker,
        reply(tool_use("write_file", {"path": f"{marker}.txt", "content": "hi"})),
        reply(text(f"{marker}: written.")),
    )
    card = wait_post(stack, OPS, ts, has_actions)
    assert stack.click(card, "approve", user="UALICE") == 200  # the top level's approver: not here
    refusal = wait_until(
        lambda: next(
            (e for e in stack.slack.ephemerals if e.get("user") == "UALICE" and e.get("channel") == OPS), None
        )
    )
    assert "UBOB" in str(refusal)
    assert not (stack.workspace / f"{marker}.txt").exists()
    assert stack.click(card, "approve", user="UBOB") == 200
    wait_post(stack, OPS, ts, lambda m: f"{marker}: written." in m["text"])
    assert (stack.workspace / f"{marker}.txt").read_text() == "hi"


def test_a_person_the_profile_leaves_out_is_told_and_nothing_starts(stack: Stack) -> None:
    marker = word()
    before = len(stack.slack.ephemerals)
    ask(stack, OPS, marker, user="UCAROL")
    told = wait_until(lambda: [e for e in stack.slack.ephemerals[before:] if e.get("user") == "UCAROL"])
    assert "ops" in told[0]["text"] and "Nothing was started" in told[0]["text"]
    stack.settled()
    assert requests_for(stack, marker) == []
    client = redis.Redis.from_url(stack.redis_url)
    assert client.zcard(Keys.active()) == 0


def test_a_member_of_a_requester_group_may_start_a_run(stack: Stack) -> None:
    marker = word()
    ts = ask(stack, OPS, marker, user="UDAN")
    wait_post(stack, OPS, ts, lambda m: f"{marker}: done." in m["text"])


def test_a_thread_keeps_its_profile_for_the_next_mention(stack: Stack) -> None:
    """The second mention in an #ops thread continues under `ops` (its tools), and its requesters
    still apply: a person it leaves out cannot continue the thread either."""
    first, second, third = word(), word(), word()
    ts = ask(stack, OPS, first)
    wait_post(stack, OPS, ts, lambda m: f"{first}: done." in m["text"])
    # The stand-in picks replies by the conversation's first user message: the thread's first task.
    stack.model.script_for(first, reply(text(f"{second}: done.")))
    stack.mention(f"{second}: more", channel=OPS, thread_ts=ts)
    wait_post(stack, OPS, ts, lambda m: f"{second}: done." in m["text"])
    continued = next(r for r in stack.model.requests if second in str(r["messages"]))
    assert sorted(t["name"] for t in continued["tools"]) == ["get_time", "read_file", "write_file"]
    before = len(stack.slack.ephemerals)
    stack.model.script_for(first, reply(text(f"{third}: done.")))
    stack.mention(f"{third}: more", channel=OPS, thread_ts=ts, user="UCAROL")
    wait_until(lambda: [e for e in stack.slack.ephemerals[before:] if e.get("user") == "UCAROL"])
    stack.settled()
    assert not any(third in str(r["messages"]) for r in stack.model.requests)
    assert not any(f"{third}: done." in m["text"] for m in thread(stack, OPS, ts))


# --- a config change applies to new runs, and to old threads once their channel maps elsewhere -----

MOVED = CONFIG.replace(f'channels = ["{OPS}"]', 'channels = ["CNEWOPS"]').replace(
    f'channels = ["{GENERAL}", "im"]', f'channels = ["{GENERAL}", "{OPS}", "im"]'
)
GONE = MOVED.replace('name = "ops"', 'name = "ops-renamed"')


def test_a_thread_goes_on_under_its_channels_profile_after_a_reload_and_says_so_once(
    redis_url: str, tmp_path: Path
) -> None:
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        moving = Stack(redis_url, slack, model, tmp_path, config=CONFIG)
        try:
            bot, worker = moving.start_bot(), moving.start_worker()
            first, kept, fresh, rematched = word(), word(), word(), word()
            ts = ask(moving, OPS, first)
            wait_post(moving, OPS, ts, lambda m: f"{first}: done." in m["text"])
            assert offered(moving, first) == ["get_time", "read_file", "write_file"]

            reload(moving, (bot, worker), MOVED, 1)
            # #ops maps to `general` now: the old thread goes on under it and says so; a new one too.
            moving.model.script_for(first, reply(text(f"{kept}: done.")))
            moving.mention(f"{kept}: more", channel=OPS, thread_ts=ts)
            wait_post(moving, OPS, ts, lambda m: f"{kept}: done." in m["text"])
            assert tools_of(moving, kept) == ["get_time"]
            note = texts.THREAD_PROFILE_CHANGED.format(now="profile `general`", was="profile `ops`")
            assert [m["text"] for m in thread(moving, OPS, ts) if "settings changed" in m["text"]] == [note]
            fresh_ts = ask(moving, OPS, fresh)
            wait_post(moving, OPS, fresh_ts, lambda m: f"{fresh}: done." in m["text"])
            assert offered(moving, fresh) == ["get_time"]

            reload(moving, (bot, worker), GONE, 2)
            # Renaming `ops` changes nothing here: the thread had gone on under `general` already.
            moving.model.script_for(first, reply(text(f"{rematched}: done.")))
            moving.mention(f"{rematched}: more", channel=OPS, thread_ts=ts)
            wait_post(moving, OPS, ts, lambda m: f"{rematched}: done." in m["text"])
            assert tools_of(moving, rematched) == ["get_time"]
            assert len([m for m in thread(moving, OPS, ts) if "settings changed" in m["text"]]) == 1
        finally:
            moving.stop()


def reload(stack: Stack, processes: tuple[Process, ...], config: str, times: int) -> None:
    """Rewrite the config, SIGHUP the bot and the worker, and wait until both serve the new one
    (the bot once gunicorn's web workers of the old config have left)."""
    (stack.workdir / "harness.toml").write_text(config, encoding="utf-8")
    bot = processes[0]
    old_web = set(descendants(bot.proc.pid))
    for process in processes:
        process.proc.send_signal(signal.SIGHUP)
    wait_until(
        lambda: all(process.output().count("config reloaded from") == times for process in processes), 30
    )
    wait_until(lambda: not set(descendants(bot.proc.pid)) & old_web, 30)


def tools_of(stack: Stack, marker: str) -> list[str]:
    """The tools of the request that carried `marker` anywhere in its conversation (a continuation)."""
    request = next(r for r in stack.model.requests if marker in str(r["messages"]))
    return sorted(t["name"] for t in request["tools"])
