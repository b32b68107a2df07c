"""A thread never outlives its channel's rules (issue 30): signed HTTP into the real bot, a real
`python -m workers`, a Redis of its own, the loopback Slack and model.

Before the reload #strict maps to no profile: Alice has an answered thread and a call parked in
another, Bob a failed run (Retry) and a run waiting at its limit (Continue). A SIGHUP then gives
#strict a profile only Alice may ask under, which denies `delete_file`. From then on who may ask,
Retry or Continue there is checked against that profile, in old threads too; Alice's old thread
goes on under it and says so in one line; her parked call is ruled by it when it runs.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from messages import texts
from tests.e2e.test_profiles import reload
from tests.fakes.messages_api import FakeMessagesAPI, http_error, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import RedisServer, Stack, thread, wait_post, wait_until

pytestmark = pytest.mark.e2e

STRICT = "CSTRICT"
BEFORE = """
[limits]
max_runs_per_user = 1000
max_runs_per_channel = 1000
max_turns = 1
on_limit = "ask"
[tools]
builtin = ["get_time", "read_file", "list_files", "write_file", "delete_file"]
"""
AFTER = (
    BEFORE
    + f"""
[[profiles]]
name = "strict"
channels = ["{STRICT}"]
requesters = ["UALICE"]
[profiles.tools]
builtin = ["get_time", "delete_file"]
[profiles.policy]
default = "deny"
[profiles.policy.tools]
delete_file = "deny"
"""
)
_words = itertools.count(1)


@dataclass(frozen=True)
class Changed:
    """The stack after the reload, and what was left in #strict before it."""

    stack: Stack
    old_thread: str  # Alice's answered thread
    parked: tuple[str, dict[str, Any]]  # Alice's thread and the card of her parked delete_file
    failure: dict[str, Any]  # Bob's failed run's message with Retry
    limit: dict[str, Any]  # Bob's run at its limit: the card with Continue
    bob_parked: dict[str, Any]  # Bob's parked write_file: the card he alone decides (no approvers)


def word(prefix: str) -> str:
    return f"{prefix}{next(_words)}"


def buttons(message: dict[str, Any]) -> list[str]:
    return [e["action_id"] for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]]


def has_button(action_id: str) -> Any:
    return lambda m: action_id in buttons(m)


def asked(stack: Stack, marker: str) -> list[dict[str, Any]]:
    """Every model request whose conversation holds `marker` anywhere."""
    return [r for r in stack.model.requests if marker in json.dumps(r["messages"])]


def told(stack: Stack, user: str) -> list[str]:
    return [e["text"] for e in stack.slack.ephemerals if e["user"] == user and e["channel"] == STRICT]


@pytest.fixture(scope="module")
def changed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Changed]:
    server = RedisServer().start()
    try:
        with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
            stack = Stack(server.url, slack, model, tmp_path_factory.mktemp("thread-rules"), config=BEFORE)
            try:
                bot, worker = stack.start_bot(), stack.start_worker()
                yield _before_the_reload(stack, lambda: reload(stack, (bot, worker), AFTER, 1))
            finally:
                stack.stop()
    finally:
        server.cleanup()


def _before_the_reload(stack: Stack, then_reload: Any) -> Changed:
    model = stack.model
    model.script_for("oldthread", reply(text("oldthread: answered.")))
    _, old, _ = stack.mention("oldthread: hello", channel=STRICT, user="UALICE")
    wait_post(stack, STRICT, old, lambda m: "oldthread: answered." in m["text"])

    (stack.workspace / "keep.txt").write_text("keep me")
    model.script_for(
        "parkeddelete",
        reply(tool_use("delete_file", {"path": "keep.txt"})),
        reply(text("parkeddelete: done.")),
    )
    _, parked_ts, _ = stack.mention("parkeddelete: delete it", channel=STRICT, user="UALICE")
    card = wait_post(stack, STRICT, parked_ts, has_button("approve"))

    model.script_for(
        "bobfails", http_error(400, message="bad request from fake"), reply(text("bobfails: done."))
    )
    _, failed_ts, _ = stack.mention("bobfails: go", channel=STRICT, user="UBOB")
    failure = wait_post(stack, STRICT, failed_ts, has_button("retry"))

    model.script_for(
        "boblimit",
        reply(tool_use("read_file", {"path": "README.md"})),
        reply(tool_use("list_files", {"path": "."})),
        reply(text("boblimit: done.")),
    )
    _, limit_ts, _ = stack.mention("boblimit: read, then list", channel=STRICT, user="UBOB")
    limit = wait_post(stack, STRICT, limit_ts, has_button("continue"))

    model.script_for(
        "bobwrites",
        reply(tool_use("write_file", {"path": "bob.txt", "content": "bob"})),
        reply(text("bobwrites: done.")),
    )
    _, bob_ts, _ = stack.mention("bobwrites: write it", channel=STRICT, user="UBOB")
    bob_card = wait_post(stack, STRICT, bob_ts, has_button("approve"))
    stack.settled()

    then_reload()
    return Changed(stack, old, (parked_ts, card), failure, limit, bob_card)


def test_a_person_the_new_profile_leaves_out_is_refused_in_an_old_thread_too(changed: Changed) -> None:
    stack, marker = changed.stack, word("intruder")
    # Nothing is scripted: a request for this thread would be the attack getting through.
    status, _, _ = stack.mention(
        f"{marker}: write x.txt", channel=STRICT, thread_ts=changed.old_thread, user="UBOB"
    )
    assert status == 200
    refusal = wait_until(lambda: [t for t in told(stack, "UBOB") if "Nothing was started" in t])
    assert "`strict`" in refusal[0] and "<@UALICE>" in refusal[0]
    stack.settled()
    assert asked(stack, marker) == []
    assert not (stack.workspace / "x.txt").exists()
    posted = [m for m in thread(stack, STRICT, changed.old_thread) if m.get("user") != "UBOB"]
    assert not any(marker in m["text"] for m in posted)


def test_the_old_thread_goes_on_under_the_channels_profile_now_and_says_so_once(changed: Changed) -> None:
    stack, first, second = changed.stack, word("aliceagain"), word("alicethird")
    stack.model.script_for("oldthread", reply(text(f"{first}: done.")))
    stack.mention(f"{first}: more", channel=STRICT, thread_ts=changed.old_thread, user="UALICE")
    wait_post(stack, STRICT, changed.old_thread, lambda m: f"{first}: done." in m["text"])
    (request,) = asked(stack, first)
    assert sorted(t["name"] for t in request["tools"]) == ["delete_file", "get_time"]
    note = texts.THREAD_PROFILE_CHANGED.format(now="profile `strict`", was="the top-level settings")
    said = [m for m in thread(stack, STRICT, changed.old_thread) if "settings changed" in m["text"]]
    assert [m["text"] for m in said] == [note]
    assert "\n" not in note

    stack.model.script_for("oldthread", reply(text(f"{second}: done.")))
    stack.mention(f"{second}: more", channel=STRICT, thread_ts=changed.old_thread, user="UALICE")
    wait_post(stack, STRICT, changed.old_thread, lambda m: f"{second}: done." in m["text"])
    said = [m for m in thread(stack, STRICT, changed.old_thread) if "settings changed" in m["text"]]
    assert len(said) == 1  # the thread keeps the new profile now: nothing more to say


def test_a_call_parked_before_the_change_is_ruled_by_the_channels_profile_now(changed: Changed) -> None:
    stack, (ts, card) = changed.stack, changed.parked
    assert stack.click(card, "approve", user="UALICE") == 200
    wait_post(stack, STRICT, ts, lambda m: "parkeddelete: done." in m["text"])
    assert (stack.workspace / "keep.txt").read_text() == "keep me"
    last = asked(stack, "parkeddelete")[-1]
    (result,) = [b for b in last["messages"][-1]["content"] if b.get("type") == "tool_result"]
    assert "forbidden by policy (tier deny)" in json.dumps(result)


def test_a_requester_the_new_profile_leaves_out_cannot_retry_their_failed_run(changed: Changed) -> None:
    stack, failure = changed.stack, changed.failure
    before = len(asked(stack, "bobfails"))
    assert stack.click(failure, "retry", user="UBOB") == 200
    refusal = wait_until(
        lambda: [t for t in told(stack, "UBOB") if "Nothing was changed" in t and "strict" in t]
    )
    assert "<@UALICE>" in refusal[0]
    stack.settled()
    assert len(asked(stack, "bobfails")) == before
    now = next(m for m in stack.slack.messages(STRICT) if m["ts"] == failure["ts"])
    assert has_button("retry")(now)  # nothing changed: still the failure it was


def test_a_requester_the_new_profile_leaves_out_cannot_continue_at_a_limit(changed: Changed) -> None:
    stack, card = changed.stack, changed.limit
    before = len(asked(stack, "boblimit"))
    replies = len(told(stack, "UBOB"))
    assert stack.click(card, "continue", user="UBOB") == 200
    wait_until(lambda: len(told(stack, "UBOB")) > replies)
    refusal = told(stack, "UBOB")[replies]
    assert "strict" in refusal and "Nothing was changed" in refusal
    stack.settled()
    assert len(asked(stack, "boblimit")) == before
    now = next(m for m in stack.slack.messages(STRICT) if m["ts"] == card["ts"])
    assert has_button("continue")(now)


def test_a_requester_the_new_profile_leaves_out_cannot_approve_their_own_parked_call(
    changed: Changed,
) -> None:
    """With no approvers the requester decides their own calls; once the profile leaves them out,
    their approve would start model work the channel no longer lets them start."""
    stack, card = changed.stack, changed.bob_parked
    before = len(asked(stack, "bobwrites"))
    replies = len(told(stack, "UBOB"))
    assert stack.click(card, "approve", user="UBOB") == 200
    wait_until(lambda: len(told(stack, "UBOB")) > replies)
    refusal = told(stack, "UBOB")[replies]
    assert "strict" in refusal and "Nothing was changed" in refusal
    stack.settled()
    assert len(asked(stack, "bobwrites")) == before
    assert not (stack.workspace / "bob.txt").exists()
    now = next(m for m in stack.slack.messages(STRICT) if m["ts"] == card["ts"])
    assert has_button("approve")(now)  # still waiting: his decline would still count
