"""Stop a working run, and limits that ask, end to end: signed HTTP into the real bot, a real
`python -m workers`, real Redis, the loopback Slack and Messages API.

A run is held inside a step by a model request the fake keeps open until the test lets it go
(`Held`), never by sleeping. The fake Messages API refuses a continued thread in which any
`tool_use` lacks its `tool_result`, so each test that continues a stopped thread checks that too.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from store.keys import Keys
from tests.fakes.messages_api import Reply, reply, text, tool_use
from tests.fakes.signing import event_body
from tests.stack import RedisServer, Stack, running_stack, thread, wait_post, wait_until

pytestmark = pytest.mark.e2e
# Other stacks: test_slack_surface 1 and 2, test_fuzz_bot 3, test_mcp/test_socket_mode 5, gate 6,
# test_groups_escalation_home 13.
STOP_DB, LIMITS_DB = 11, 12
GENEROUS = "max_runs_per_user = 1000\nmax_runs_per_channel = 1000\n"
STOP_CONFIG = '[approvals]\napprovers = ["UANN"]\n[limits]\n' + GENEROUS
LIMITS_CONFIG = (
    '[approvals]\nexpire_after_minutes = 0.25\n[limits]\nmax_turns = 1\non_limit = "ask"\n' + GENEROUS
)
_channels = itertools.count(1100)


class Held:
    """Model replies by marker; a marker's next request may be held open until the test lets it go."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gates: dict[str, tuple[threading.Event, threading.Event, Reply]] = {}

    def hold(self, marker: str, answer: Reply) -> tuple[threading.Event, threading.Event]:
        """The next request of `marker` with no scripted reply left waits; returns (arrived, release)."""
        arrived, release = threading.Event(), threading.Event()
        with self._lock:
            self._gates[marker] = (arrived, release, answer)
        return arrived, release

    def __call__(self, body: dict[str, Any]) -> Reply:
        first = json.dumps(body["messages"][0])
        with self._lock:
            found = next((m for m in self._gates if m in first), None)
            gate = self._gates.pop(found) if found else None
        if gate is None:
            return reply(text("(nothing scripted)"))
        arrived, release, answer = gate
        arrived.set()
        release.wait(60)
        return answer


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Approvals decided by UANN; the requester may stop their run too."""
    yield from running_stack(
        redis_server, tmp_path_factory.mktemp("stop"), STOP_CONFIG, STOP_DB, responder=Held()
    )


@pytest.fixture(scope="module")
def limits(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One turn of tool calls, then ask; a question nobody answers expires after 15 s."""
    yield from running_stack(
        redis_server, tmp_path_factory.mktemp("limits"), LIMITS_CONFIG, LIMITS_DB, responder=Held()
    )


def held(stack: Stack) -> Held:
    responder = stack.model.responder
    assert isinstance(responder, Held)
    return responder


# --- reading the thread --------------------------------------------------------------------------------


def new_channel() -> str:
    return f"C{next(_channels)}"


def current(stack: Stack, channel: str, message: dict[str, Any]) -> dict[str, Any]:
    """The message as Slack shows it now (after any chat.update)."""
    return next(m for m in stack.slack.messages(channel) if m["ts"] == message["ts"])


def buttons(message: dict[str, Any]) -> list[dict[str, Any]]:
    """Every button of a message (the bot puts each in an actions block)."""
    actions = [b for b in message.get("blocks") or [] if b["type"] == "actions"]
    return [e for b in actions for e in b["elements"] if e.get("type") == "button"]


def has_button(action_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda m: any(b["action_id"] == action_id for b in buttons(m))


def is_working(message: dict[str, Any]) -> bool:
    return "Working on it" in message["text"] and has_button("stop")(message)


def footer(turns: int, requests: int) -> str:
    return f"That took {turns} turns of tool calls across {requests} model requests."


def asked(stack: Stack, marker: str) -> list[dict[str, Any]]:
    return [r for r in stack.model.requests if marker in json.dumps(r["messages"][0])]


def ephemerals_to(stack: Stack, user: str) -> list[str]:
    return [e["text"] for e in stack.slack.ephemerals if e["user"] == user]


# --- what Slack sends ----------------------------------------------------------------------------------


def press(stack: Stack, message: dict[str, Any], action_id: str, *, user: str = "UALICE") -> int:
    """Click the button `action_id` of `message` as `user`."""
    return stack.click(message, action_id, user=user)


def session_stopped(stack: Stack, channel: str, thread_ts: str, *, user: str = "UALICE") -> int:
    """Slack's own stop button of an agent session: the `agent_session_stopped` event."""
    event = {
        "type": "agent_session_stopped",
        "user": user,
        "channel": channel,
        "thread_ts": thread_ts,
        "event_ts": f"{time.time():.6f}",
        "streaming_message_ts": [],
    }
    status, _ = stack.post(event_body(event, event_id=f"Ev{time.time_ns()}"), "application/json")
    return status


def start_held(stack: Stack, marker: str, answer: Reply) -> tuple[str, str, dict[str, Any], threading.Event]:
    """A run that did one turn (read README.md) and now waits inside its second model request.

    Returns the channel, the mention's ts, the Working message and the event that lets the
    request answer `answer`.
    """
    channel = new_channel()
    stack.model.script_for(marker, reply(tool_use("read_file", {"path": "README.md"})))
    arrived, release = held(stack).hold(marker, answer)
    _, ts, _ = stack.mention(f"{marker}: read the readme, then more", channel=channel)
    working = wait_post(stack, channel, ts, is_working)
    assert arrived.wait(30)
    return channel, ts, working, release


# --- Stop a working run ----------------------------------------------------------------------------------


def test_stop_during_a_model_request_ends_the_run_before_its_calls_run(stack: Stack) -> None:
    write = tool_use("write_file", {"path": "stopped.txt", "content": "never"})
    channel, ts, working, release = start_held(stack, "stopmid", reply(write))
    summary = wait_post(stack, channel, ts, lambda m: "Turn 1" in m["text"])
    assert float(working["ts"]) < float(summary["ts"])  # the Stop button is the run's first post

    assert press(stack, working, "stop") == 200
    run_id = next(b["value"] for b in buttons(working) if b["action_id"] == "stop")
    assert redis.Redis.from_url(stack.redis_url).get(Keys.stop_request(run_id)) == b"UALICE"
    release.set()  # the request answers with a call; it is answered as not run instead

    stopped = wait_post(
        stack, channel, ts, lambda m: "Stopped by <@UALICE>" in m["text"] and "took" in m["text"]
    )
    assert footer(2, 2) in stopped["text"]  # turn 2 began when the model asked; none of its calls ran
    turn2 = wait_post(stack, channel, ts, lambda m: m["text"].startswith("Turn 2"))
    said = json.dumps(turn2["blocks"], ensure_ascii=False)
    assert "⏹️ not run: the run was stopped before it" in said and "stopped_by_user" not in said
    stack.settled()
    assert not (stack.workspace / "stopped.txt").exists()
    assert len(asked(stack, "stopmid")) == 2
    closed = current(stack, channel, working)
    assert buttons(closed) == [] and "Stopped by <@UALICE>" in closed["text"]
    assert (channel, ts, "octagonal_sign") in stack.slack.reactions

    stack.model.script_for("stopmid", reply(text("stopmid carried on")))
    stack.mention("go on", channel=channel, thread_ts=ts)
    wait_post(stack, channel, ts, lambda m: "stopmid carried on" in m["text"])
    last = asked(stack, "stopmid")[-1]["messages"]
    results = [b for m in last for b in m["content"] if b.get("type") == "tool_result"]
    assert results[-1]["is_error"] is True and "stopped_by_user" in results[-1]["content"]
    assert stack.model.errors == []  # every tool_use has its tool_result


def test_stop_pressed_twice_says_so_and_stops_once(stack: Stack) -> None:
    channel, ts, working, release = start_held(stack, "twice", reply(tool_use("get_time", {})))
    assert press(stack, working, "stop") == 200
    assert press(stack, working, "stop", user="UANN") == 200  # an approver, but the run is already stopping
    wait_until(
        lambda: any("already being stopped" in t and "<@UALICE>" in t for t in ephemerals_to(stack, "UANN"))
    )
    release.set()
    wait_post(stack, channel, ts, lambda m: "Stopped by <@UALICE>" in m["text"] and "took" in m["text"])
    stack.settled()
    stops = [m for m in thread(stack, channel, ts) if "took" in m["text"]]
    assert len(stops) == 1 and len(asked(stack, "twice")) == 2

    assert press(stack, working, "stop") == 200  # the stale button of a stopped run
    wait_until(lambda: any("already stopped by <@UALICE>" in t for t in ephemerals_to(stack, "UALICE")))


def test_a_run_that_answers_before_stop_takes_effect_finishes_and_says_so(stack: Stack) -> None:
    channel, ts, working, release = start_held(stack, "tooquick", reply(text("tooquick answered")))
    assert press(stack, working, "stop") == 200
    release.set()  # the request in flight was the last one: there is no next request to stop before
    answer = wait_post(stack, channel, ts, lambda m: "tooquick answered" in m["text"])
    assert footer(1, 2) in answer["text"]
    stack.settled()
    closed = current(stack, channel, working)
    assert buttons(closed) == [] and "before Stop" in closed["text"] and "<@UALICE>" in closed["text"]


def test_stop_by_someone_not_allowed_changes_nothing(stack: Stack) -> None:
    channel, ts, working, release = start_held(stack, "notmine", reply(text("notmine finished")))
    assert press(stack, working, "stop", user="UMALLORY") == 200
    wait_until(lambda: any("may stop this run" in t for t in ephemerals_to(stack, "UMALLORY")))
    reply_text = [t for t in ephemerals_to(stack, "UMALLORY") if "may stop" in t][-1]
    assert "<@UALICE>" in reply_text and "<@UANN>" in reply_text
    release.set()
    answer = wait_post(stack, channel, ts, lambda m: "notmine finished" in m["text"])
    assert footer(1, 2) in answer["text"]
    stack.settled()
    assert not any("Stopped by" in m["text"] for m in thread(stack, channel, ts))
    closed = current(stack, channel, working)
    assert buttons(closed) == [] and "Done" in closed["text"]


def test_stop_while_parked_ends_the_run_at_once_and_clears_its_cards(stack: Stack) -> None:
    channel = new_channel()
    stack.model.script_for(
        "parkstop",
        reply(
            tool_use("write_file", {"path": "parked1.txt", "content": "1"}),
            tool_use("write_file", {"path": "parked2.txt", "content": "2"}),
        ),
    )
    _, ts, _ = stack.mention("parkstop: write two files", channel=channel)
    wait_until(lambda: len([m for m in thread(stack, channel, ts) if has_button("approve")(m)]) == 2)
    cards = [m for m in thread(stack, channel, ts) if has_button("approve")(m)]
    batch = wait_post(stack, channel, ts, has_button("approve_all"))  # two calls: Approve all too
    working = wait_post(stack, channel, ts, is_working)
    stack.settled()  # parked: no worker holds it
    assert press(stack, cards[0], "approve", user="UANN") == 200  # one call decided, one still open
    wait_until(lambda: not has_button("approve")(current(stack, channel, cards[0])))
    stack.settled()

    assert press(stack, working, "stop", user="UANN") == 200  # an approver may stop it too
    wait_post(stack, channel, ts, lambda m: "Stopped by <@UANN>" in m["text"] and "took" in m["text"])
    stack.settled()
    assert not (stack.workspace / "parked1.txt").exists() and not (stack.workspace / "parked2.txt").exists()
    assert len(asked(stack, "parkstop")) == 1
    first, second = (current(stack, channel, c) for c in cards)
    assert buttons(first) == [] and "Approved" in str(first["blocks"])
    assert buttons(second) == [] and "stopped by <@UANN>" in str(second["blocks"])
    assert buttons(current(stack, channel, working)) == []
    stopped = current(stack, channel, batch)
    assert buttons(stopped) == [] and "stopped by <@UANN>" in str(stopped["blocks"])

    assert press(stack, cards[1], "approve", user="UANN") == 200  # the old card, clicked anyway
    wait_until(lambda: any("no longer open" in t for t in ephemerals_to(stack, "UANN")))
    stack.settled()
    assert not (stack.workspace / "parked2.txt").exists() and len(asked(stack, "parkstop")) == 1

    stack.model.script_for("parkstop", reply(text("parkstop carried on")))
    stack.mention("go on", channel=channel, thread_ts=ts)
    wait_post(stack, channel, ts, lambda m: "parkstop carried on" in m["text"])
    results = [
        b for b in asked(stack, "parkstop")[-1]["messages"][2]["content"] if b["type"] == "tool_result"
    ]
    assert len(results) == 2 and all(r["is_error"] for r in results)
    assert stack.model.errors == []


def test_slacks_agent_session_stopped_event_stops_the_threads_run(stack: Stack) -> None:
    channel, ts, working, release = start_held(stack, "sessionstop", reply(tool_use("get_time", {})))
    assert session_stopped(stack, channel, ts) == 200
    release.set()
    wait_post(stack, channel, ts, lambda m: "Stopped by <@UALICE>" in m["text"] and "took" in m["text"])
    stack.settled()
    assert len(asked(stack, "sessionstop")) == 2
    assert buttons(current(stack, channel, working)) == []

    quiet = new_channel()  # a thread with no run of ours: answered (never a 404 Slack would retry)
    assert session_stopped(stack, quiet, "1700000000.000001", user="UBOB") == 200
    wait_until(lambda: any("nothing to stop" in t for t in ephemerals_to(stack, "UBOB")))


# --- limits that ask ---------------------------------------------------------------------------------------


def start_at_limit(stack: Stack, marker: str, *then: Reply) -> tuple[str, str, dict[str, Any]]:
    """A run that used its one turn and asked for another: its limit card."""
    channel = new_channel()
    stack.model.script_for(
        marker,
        reply(tool_use("read_file", {"path": "README.md"})),
        reply(tool_use("list_files", {"path": "."})),
        *then,
    )
    _, ts, _ = stack.mention(f"{marker}: read, then list", channel=channel)
    card = wait_post(stack, channel, ts, has_button("continue"))
    return channel, ts, card


def test_continue_at_max_turns_grants_another_turn_and_the_run_goes_on(limits: Stack) -> None:
    stack = limits
    channel, ts, card = start_at_limit(stack, "goon", reply(text("goon done")))
    assert "Reached max turns" in card["text"]
    assert {b["action_id"] for b in buttons(card)} == {"continue", "stop"}
    assert "1 more turn of tool calls" in str(card["blocks"])
    stack.settled()
    assert len(asked(stack, "goon")) == 2

    assert press(stack, card, "continue", user="UMALLORY") == 200  # not a decider: nothing changes
    wait_until(lambda: any("may choose" in t for t in ephemerals_to(stack, "UMALLORY")))
    stack.settled()
    assert len(asked(stack, "goon")) == 2 and has_button("continue")(current(stack, channel, card))

    assert press(stack, card, "continue") == 200
    answer = wait_post(stack, channel, ts, lambda m: "goon done" in m["text"])
    assert footer(2, 3) in answer["text"]
    decided = current(stack, channel, card)
    assert buttons(decided) == [] and "Continued by <@UALICE>" in decided["text"] + str(decided["blocks"])
    turns = [m for m in thread(stack, channel, ts) if m["text"].startswith("Turn ")]
    assert [m["text"].split(":")[0] for m in turns] == ["Turn 1", "Turn 2"]
    assert stack.model.errors == []


def test_stop_at_a_limit_ends_the_run_as_a_valve_stop(limits: Stack) -> None:
    stack = limits
    channel, ts, card = start_at_limit(stack, "haltit")
    assert press(stack, card, "stop") == 200
    stop = wait_post(stack, channel, ts, lambda m: "Stopped at max turns" in m["text"])
    assert footer(1, 2) in stop["text"] and "Stop was chosen" in stop["text"]
    decided = current(stack, channel, card)
    assert buttons(decided) == [] and "Stopped by <@UALICE>" in str(decided["blocks"])
    assert press(stack, card, "continue") == 200  # too late: the run has ended
    wait_until(lambda: any("no longer waiting" in t for t in ephemerals_to(stack, "UALICE")))
    stack.settled()
    assert len(asked(stack, "haltit")) == 2

    stack.model.script_for("haltit", reply(text("haltit carried on")))
    stack.mention("go on", channel=channel, thread_ts=ts)
    wait_post(stack, channel, ts, lambda m: "haltit carried on" in m["text"])
    held_call = asked(stack, "haltit")[-1]["messages"][4]["content"][0]
    assert held_call["type"] == "tool_result" and "max_turns" in held_call["content"]
    assert stack.model.errors == []


def test_a_limit_nobody_answers_expires_and_the_run_stops(limits: Stack) -> None:
    stack = limits
    channel, ts, card = start_at_limit(stack, "nobody")
    stop = wait_post(stack, channel, ts, lambda m: "Stopped at max turns" in m["text"], timeout=60)
    assert "Nobody chose" in stop["text"]
    expired = current(stack, channel, card)
    assert buttons(expired) == [] and "Expired" in str(expired["blocks"])
    stack.settled()
    assert len(asked(stack, "nobody")) == 2
    assert (channel, ts, "octagonal_sign") in stack.slack.reactions
