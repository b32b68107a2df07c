"""End to end: direct messages to the bot, the assistant pane, and what Slack shows of a run.

The real bot and worker against the loopback Slack, which plays an app that is not an agent
(`agents.sessions.setStatus` refused) unless a test sets it up as one (`agent_app`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from messages import texts
from store import RunRecord, Store
from tests.fakes import payloads
from tests.fakes.messages_api import reply, text, tool_use
from tests.fakes.signing import event_body
from tests.stack import RedisServer, Stack, has_actions, running_stack, thread, wait_post, wait_until
from workers.thread_status import ASSISTANT, REFUSED, SESSION

pytestmark = pytest.mark.e2e
DB = 4
GENEROUS = "[limits]\nmax_runs_per_user = 1000\nmax_runs_per_channel = 1000\n"
_ids = itertools.count(100)


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Approvers empty: the person who asked decides their run's calls."""
    yield from running_stack(redis_server, tmp_path_factory.mktemp("dm"), GENEROUS, DB)


@pytest.fixture
def agent_app(stack: Stack) -> Iterator[Stack]:
    """The stack with its Slack app set up as an agent: agent sessions take its statuses."""
    stack.settled()  # no run of an earlier test is still calling Slack
    stack.slack.agent = True
    try:
        yield stack
    finally:
        stack.slack.agent = False


def new_dm() -> str:
    return f"D{next(_ids)}"


def new_channel() -> str:
    return f"C{next(_ids)}"


def send(stack: Stack, event: dict[str, Any], event_id: str | None = None) -> int:
    """Deliver `event` as Slack does; the bot's HTTP status."""
    status, _ = stack.post(event_body(event, event_id=event_id or f"Ev{time.time_ns()}"), "application/json")
    return status


def dm(
    stack: Stack,
    words: str,
    *,
    channel: str,
    user: str = "UALICE",
    thread_ts: str | None = None,
    **extra: Any,
) -> tuple[int, str]:
    """A person's direct message to the bot (in `thread_ts`'s thread, if given); (status, its ts)."""
    ts = stack.slack.add_message(channel, words, user=user, thread_ts=thread_ts)
    event = payloads.direct_message(words, user=user, channel=channel, ts=ts, thread_ts=thread_ts, **extra)
    return send(stack, event), ts


def runs_in(stack: Stack, channel: str) -> list[RunRecord]:
    """Every run Redis holds for `channel` (the bot writes it before it answers Slack)."""
    client = redis.Redis.from_url(stack.redis_url)
    store = Store(client)
    records = (store.runs.load(key.decode().rsplit(":", 1)[1]) for key in client.scan_iter("harness:run:*"))
    return [r for r in records if r is not None and r.channel == channel]


def footer(turns: int, requests: int) -> str:
    return f"That took {turns} turns of tool calls across {requests} model requests."


def asked(stack: Stack, marker: str) -> list[dict[str, Any]]:
    return [r for r in stack.model.requests if marker in str(r["messages"])]


def session_calls(stack: Stack, channel: str) -> list[Any]:
    return [c for c in stack.slack.calls if c.method == SESSION and c.params.get("channel_id") == channel]


def sessions(stack: Stack, channel: str) -> list[str]:
    """The statuses the thread's agent session was given, in order."""
    return [s["status"] for s in stack.slack.sessions if s["channel_id"] == channel]


def status_lines(stack: Stack, channel: str) -> list[str]:
    """The assistant status lines set in `channel`, in order ("" clears it)."""
    return [s["status"] for s in stack.slack.statuses if s["channel_id"] == channel]


def card_now(stack: Stack, channel: str, card: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in stack.slack.messages(channel) if m["ts"] == card["ts"])


# --- direct messages -------------------------------------------------------------------------------


def test_a_direct_message_starts_a_run_that_answers_in_a_thread_on_it_and_the_thread_continues(
    stack: Stack,
) -> None:
    channel = new_dm()
    stack.model.script_for(
        "dmhello",
        reply(tool_use("get_time", {})),
        reply(text("dmhello: it is noon")),
        reply(text("dmhello: still noon")),
    )
    status, ts = dm(stack, "dmhello: what time is it?", channel=channel)
    assert status == 200
    [record] = runs_in(stack, channel)
    assert (record.surface, record.task, record.thread_ts) == ("im", "dmhello: what time is it?", ts)

    answer = wait_post(stack, channel, ts, lambda m: footer(1, 2) in m["text"])
    assert "it is noon" in answer["text"]
    assert all(m["thread_ts"] == ts for m in thread(stack, channel, ts))
    wait_until(lambda: (channel, ts, "white_check_mark") in stack.slack.reactions)

    status, _ = dm(stack, "and now?", channel=channel, thread_ts=ts)
    assert status == 200
    wait_post(stack, channel, ts, lambda m: "still noon" in m["text"])
    later = asked(stack, "dmhello")[-1]["messages"]
    assert "it is noon" in str(later) and "and now?" in str(later)  # the same conversation
    assert stack.model.errors == []


def test_an_approval_card_in_a_dm_is_decided_by_the_person_who_asked(stack: Stack) -> None:
    channel = new_dm()
    stack.model.script_for(
        "dmwrite",
        reply(tool_use("write_file", {"path": "dm.txt", "content": "from a DM"})),
        reply(text("dmwrite done")),
    )
    _, ts = dm(stack, "dmwrite: write dm.txt", channel=channel)
    card = wait_post(stack, channel, ts, has_actions)
    assert card["thread_ts"] == ts and "<@UALICE>" in str(card["blocks"])
    assert not (stack.workspace / "dm.txt").exists()

    assert stack.click(card, "approve", user="UALICE") == 200
    wait_post(stack, channel, ts, lambda m: "dmwrite done" in m["text"])
    assert (stack.workspace / "dm.txt").read_text() == "from a DM"
    decided = card_now(stack, channel, card)
    assert not has_actions(decided) and "Approved" in str(decided["blocks"])


def _changed(channel: str) -> dict[str, Any]:
    """An edit of a direct message (`message_changed`), as Slack sends it."""
    edited = payloads.direct_message("dmedit: write edit.txt", channel=channel)
    return {
        "type": "message",
        "subtype": "message_changed",
        "message": {**edited, "edited": {"user": "UALICE", "ts": payloads.ts_now()}},
        "previous_message": edited,
        "channel": channel,
        "hidden": True,
        "ts": payloads.ts_now(),
        "event_ts": payloads.ts_now(),
        "channel_type": "im",
    }


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(
            lambda ch: payloads.direct_message("hi", channel=ch, user="U2OTHER", bot_id="B2OTHER"), id="a bot"
        ),
        pytest.param(
            lambda ch: payloads.direct_message("hi", channel=ch, subtype="bot_message", bot_id="B2OTHER"),
            id="bot_message",
        ),
        pytest.param(
            lambda ch: payloads.direct_message("hi", channel=ch, user="UBOT", bot_id="BBOT"), id="itself"
        ),
        pytest.param(_changed, id="an edit"),
        pytest.param(
            lambda ch: payloads.direct_message("hi", channel=ch, subtype="message_deleted"), id="a deletion"
        ),
    ],
)
def test_a_direct_message_from_a_bot_or_an_edit_starts_nothing(stack: Stack, make: Any) -> None:
    channel = new_dm()
    assert send(stack, make(channel)) == 200
    assert runs_in(stack, channel) == []  # a run would be in Redis before the bot answered


@pytest.mark.parametrize("channel_type", ["channel", "group", "mpim"])
def test_channel_messages_that_are_not_mentions_still_start_nothing(stack: Stack, channel_type: str) -> None:
    channel = new_channel()
    event = payloads.channel_message(
        "write me a file", user="UALICE", channel=channel, channel_type=channel_type
    )
    assert send(stack, event) == 200
    in_thread = payloads.channel_message(
        "and then?", channel=channel, channel_type=channel_type, thread_ts=event["ts"]
    )
    assert send(stack, in_thread) == 200
    assert runs_in(stack, channel) == []


def test_a_dm_that_mentions_the_bot_comes_as_two_events_and_starts_one_run(stack: Stack) -> None:
    channel = new_dm()
    stack.model.script_for("dmtwice", reply(text("dmtwice answered")))
    words = "<@UBOT> dmtwice: hello"
    ts = stack.slack.add_message(channel, words, user="UALICE")
    mention = payloads.app_mention("dmtwice: hello", channel=channel, ts=ts)  # no channel_type on these
    assert send(stack, mention) == 200
    assert send(stack, payloads.direct_message(words, channel=channel, ts=ts)) == 200
    assert len(runs_in(stack, channel)) == 1

    wait_post(stack, channel, ts, lambda m: "dmtwice answered" in m["text"])
    stack.settled()
    assert len(asked(stack, "dmtwice")) == 1


# --- the assistant pane ----------------------------------------------------------------------------


def test_a_new_assistant_thread_gets_the_suggested_prompts(stack: Stack) -> None:
    channel = new_dm()
    root = stack.slack.add_message(channel, "New chat", user="UBOT")
    event = payloads.assistant_thread_started(channel=channel, thread_ts=root)
    assert send(stack, event) == 200
    wait_until(lambda: any(s["channel_id"] == channel for s in stack.slack.suggestions))
    [suggested] = [s for s in stack.slack.suggestions if s["channel_id"] == channel]
    assert suggested["thread_ts"] == root and suggested["title"] == texts.SUGGESTED_PROMPTS_TITLE
    assert [(p["title"], p["message"]) for p in suggested["prompts"]] == list(texts.SUGGESTED_PROMPTS)


def test_in_an_assistant_thread_the_status_line_says_working_then_waiting_then_clears(stack: Stack) -> None:
    stack.settled()
    channel = new_dm()
    root = stack.slack.add_message(channel, "New chat", user="UBOT")
    stack.model.script_for(
        "paneline",
        reply(tool_use("get_time", {})),
        reply(tool_use("write_file", {"path": "pane.txt", "content": "x"})),
        reply(text("paneline done")),
    )
    _, ts = dm(stack, "paneline: note the time in pane.txt", channel=channel, thread_ts=root)
    card = wait_post(stack, channel, root, has_actions)
    wait_until(lambda: status_lines(stack, channel)[-1:] == [texts.STATUS_WAITING_ON_YOU])

    assert stack.click(card, "approve") == 200
    wait_post(stack, channel, root, lambda m: "paneline done" in m["text"])
    stack.settled()
    working, waiting = texts.STATUS_WORKING, texts.STATUS_WAITING_ON_YOU
    # Set when the run starts, again after each post (a post clears it), after the card, again when
    # the approved call runs, and cleared at the end.
    assert status_lines(stack, channel) == [working, working, waiting, working, working, ""]
    [refused] = session_calls(stack, channel)  # asked once, refused, never again for this run
    assert refused.error == "not_an_agent"
    [record] = runs_in(stack, channel)
    assert (record.status_shown[SESSION], record.status_shown[ASSISTANT]) == (REFUSED, "")
    # The reactions sit on the message that asked, not on the thread's root.
    mine = [(t, name) for c, t, name in stack.slack.reactions if c == channel]
    assert mine == [(ts, "white_check_mark")]


def test_refused_status_methods_leave_the_eyes_and_the_run_finishes(stack: Stack) -> None:
    stack.settled()
    channel = new_dm()
    stack.model.script_for("refusedline", reply(tool_use("get_time", {})), reply(text("refusedline done")))
    stack.slack.fail_next(ASSISTANT, error="missing_scope")
    _, ts = dm(stack, "refusedline: what time is it?", channel=channel)
    wait_post(stack, channel, ts, lambda m: footer(1, 2) in m["text"])
    stack.settled()
    # The eyes went up (the run, done in milliseconds, may already have taken them down again).
    eyes = wait_until(
        lambda: [
            (c.params.get("timestamp"), c.ok)
            for c in stack.slack.calls
            if c.method == "reactions.add"
            and c.params.get("name") == "eyes"
            and c.params.get("channel") == channel
        ]
    )
    assert eyes == [(ts, True)]
    tried = [c.method for c in stack.slack.calls if c.params.get("channel_id") == channel]
    assert tried == [SESSION, ASSISTANT]  # each refused once, neither asked again for the second request
    assert status_lines(stack, channel) == []
    assert (channel, ts, "white_check_mark") in stack.slack.reactions


# --- agent sessions --------------------------------------------------------------------------------


def test_an_agent_session_is_processing_then_suspended_at_a_park_then_closed(agent_app: Stack) -> None:
    stack = agent_app
    channel = new_channel()
    stack.model.script_for(
        "sessionlife",
        reply(tool_use("write_file", {"path": "life.txt", "content": "x"})),
        reply(text("sessionlife done")),
    )
    held = stack.slack.hold_next(SESSION)
    _, ts, _ = stack.mention("sessionlife: write life.txt", channel=channel)
    assert held.arrived.wait(20)
    # The status goes out beside the first model request, not in front of it: Slack's slowness
    # never delays the model.
    wait_until(lambda: len(asked(stack, "sessionlife")) == 1)
    held.release.set()

    card = wait_post(stack, channel, ts, has_actions)
    wait_until(lambda: sessions(stack, channel) == ["processing", "suspended"])
    assert stack.click(card, "approve") == 200
    wait_post(stack, channel, ts, lambda m: "sessionlife done" in m["text"])
    stack.settled()
    assert sessions(stack, channel) == ["processing", "suspended", "processing", "closed"]
    first = next(s for s in stack.slack.sessions if s["channel_id"] == channel)
    assert first["thread_ts"] == ts and first["initiator_user_id"] == "UALICE"
    assert first["title"] == "sessionlife: write life.txt"  # the task, without the mention
    assert status_lines(stack, channel) == []  # the session is in charge: no assistant line


def test_slacks_stop_button_of_a_session_stops_the_run_and_closes_the_session(agent_app: Stack) -> None:
    stack = agent_app
    channel = new_channel()
    stack.model.script_for(
        "sessionstopped", reply(tool_use("write_file", {"path": "no.txt", "content": "x"}))
    )
    _, ts, _ = stack.mention("sessionstopped: write no.txt", channel=channel)
    wait_post(stack, channel, ts, has_actions)
    stopped = {"type": "agent_session_stopped", "user": "UALICE", "channel": channel, "thread_ts": ts}
    assert send(stack, {**stopped, "event_ts": payloads.ts_now(), "streaming_message_ts": []}) == 200
    wait_post(stack, channel, ts, lambda m: "Stopped by <@UALICE>" in m["text"])
    stack.settled()
    assert sessions(stack, channel) == ["processing", "suspended", "closed"]  # Slack leaves that to us
    assert not (stack.workspace / "no.txt").exists()


def test_a_rate_limited_session_status_is_tried_again_at_the_next_change(agent_app: Stack) -> None:
    stack = agent_app
    channel = new_channel()
    stack.model.script_for("sessionbusy", reply(tool_use("get_time", {})), reply(text("sessionbusy done")))
    stack.slack.fail_next(SESSION, status=429, headers={"Retry-After": "1"}, times=2)
    _, ts, _ = stack.mention("sessionbusy: what time is it?", channel=channel)
    wait_post(stack, channel, ts, lambda m: footer(1, 2) in m["text"])
    stack.settled()
    tried = [(c.status, c.params["status"]) for c in session_calls(stack, channel)]
    # The first request's status: a 429, waited out once, a 429 again: skipped, not given up.
    assert tried == [(429, "processing"), (429, "processing"), (200, "processing"), (200, "closed")]
    assert (channel, ts, "white_check_mark") in stack.slack.reactions


@pytest.fixture(scope="module")
def approvers_stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Four approvers, one of them a user group: the status line names who the run waits for."""
    config = '[approvals]\napprovers = ["UANN", "S0OPS", "UBEN", "UCAT"]\n' + GENEROUS
    yield from running_stack(redis_server, tmp_path_factory.mktemp("dmapprovers"), config, 14)


def test_a_parked_run_in_an_assistant_thread_says_whose_approval_it_waits_for(approvers_stack: Stack) -> None:
    stack = approvers_stack
    channel = new_dm()
    root = stack.slack.add_message(channel, "New chat", user="UBOT")
    stack.model.script_for("whowaits", reply(tool_use("write_file", {"path": "who.txt", "content": "x"})))
    dm(stack, "whowaits: write it", channel=channel, thread_ts=root)
    wait_post(stack, channel, root, has_actions)
    # Three named (a group has no name a status line could show), the rest counted.
    expected = "is waiting for approval from uann, an approver, uben and 1 more"
    wait_until(lambda: status_lines(stack, channel)[-1:] == [expected])
