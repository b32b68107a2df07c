"""The live view (`workers.live`) against the fake Slack Web API, through a real `WebClient`.

Each test feeds the view what the harness would (`TextWritten`, `CallRunning`, `ToolReturned`) and
waits on what Slack received: the statuses a task goes through, words batched into paced writes,
a refused workspace, a stream that breaks.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from slack_sdk import WebClient

from harness.policy import Tier
from harness.signals import CallRunning, TextWritten, ToolReturned
from harness.state import Decision, PendingCall, Verdict
from harness.tools import ToolResult
from messages import texts
from messages.metadata import LIVE_KEY, tagged
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import wait_until
from workers.live import LiveStreams, LiveView

CHANNEL = "C42"


@pytest.fixture
def slack() -> Iterator[FakeSlackAPI]:
    with FakeSlackAPI(bot_token="xoxb-test") as fake:
        yield fake


def root(slack: FakeSlackAPI) -> str:
    client = WebClient(token="xoxb-test", base_url=slack.base_url)
    return str(client.chat_postMessage(channel=CHANNEL, text="the ask")["ts"])


@dataclass
class Ledger:
    """What the view writes down of its streams, in order: ("opening",) then ("opened", ts)."""

    tag: dict[str, Any] = field(default_factory=lambda: tagged("run-1", LIVE_KEY))
    said: list[tuple[str, ...]] = field(default_factory=list)
    refuse: bool = False  # the store is away: an opening cannot be promised

    def opening(self) -> None:
        if self.refuse:
            raise ConnectionError("Redis is away")
        self.said.append(("opening",))

    def opened(self, ts: str) -> None:
        self.said.append(("opened", ts))


def view(slack: FakeSlackAPI, thread_ts: str, ledger: Ledger | None = None) -> LiveView:
    client = WebClient(token="xoxb-test", base_url=slack.base_url)
    where = (CHANNEL, thread_ts, "T1", "UALICE")
    return LiveView(client, LiveStreams(), where, ledger=ledger if ledger is not None else Ledger())


def call(call_id: str, name: str = "get_time", result: ToolResult | None = None) -> PendingCall:
    return PendingCall(id=call_id, name=name, input={"path": "a.txt"}, tier=Tier.ALLOW, why="", result=result)


def asked(call_id: str, verdict: Verdict | None = None, **changes: Any) -> PendingCall:
    """A `write_file` call that asks, decided `verdict` (None: not yet)."""
    decision = None if verdict is None else Decision(verdict, by="UANN")
    args = {"path": "notes.md", "content": "The task:\n\n> Write a note & <b>keep</b> it"}
    return replace(PendingCall(call_id, "write_file", args, Tier.ASK, decision), **changes)


def stream_writes(slack: FakeSlackAPI) -> list[Any]:
    return [c for c in slack.calls if "Stream" in c.method]


def tasks_of(slack: FakeSlackAPI) -> dict[str, Any]:
    (stream,) = slack.streams()
    return stream["tasks"]


def test_a_task_goes_through_pending_in_progress_and_complete_or_error(slack: FakeSlackAPI) -> None:
    live = view(slack, root(slack))
    ok, bad = call("toolu_1"), call("toolu_2", "read_file")
    live.requested([ok, bad])
    wait_until(lambda: slack.streams() and len(tasks_of(slack)) == 2)
    live(CallRunning(1, ok))
    wait_until(lambda: tasks_of(slack)["toolu_1"]["status"] == "in_progress")
    live(ToolReturned(1, call("toolu_1", result=ToolResult("12:00", False))))
    live(CallRunning(1, bad))
    wait_until(lambda: tasks_of(slack)["toolu_2"]["status"] == "in_progress")
    live(ToolReturned(1, call("toolu_2", "read_file", ToolResult("<!here> no such file", True))))
    ts = live.seal()
    wait_until(lambda: not slack.streams()[0]["streaming"])
    tasks = tasks_of(slack)
    assert tasks["toolu_1"]["history"] == ["pending", "in_progress", "complete"]
    assert tasks["toolu_2"]["history"] == ["pending", "in_progress", "error"]
    # Plain text: shown as the tool wrote it, no entity (`<!here>` is only text there, it pings nobody).
    assert tasks["toolu_2"]["output"] == "<!here> no such file"
    assert tasks["toolu_2"]["title"].startswith("read_file")
    assert ts == slack.streams()[0]["ts"]
    start = stream_writes(slack)[0]
    assert start.method == "chat.startStream" and start.params["task_display_mode"] == "timeline"
    assert (start.params["recipient_team_id"], start.params["recipient_user_id"]) == ("T1", "UALICE")


def test_words_are_batched_into_writes_at_most_one_per_pace(slack: FakeSlackAPI) -> None:
    ledger = Ledger()
    live = view(slack, root(slack), ledger)
    live(TextWritten("first "))
    wait_until(lambda: stream_writes(slack))  # the first words go out at once
    pieces = [f"w{i} " for i in range(200)]
    for piece in pieces:
        live(TextWritten(piece))
    wait_until(lambda: "w199" in slack.streams()[0]["text"])
    live.seal()
    wait_until(lambda: not slack.streams()[0]["streaming"])
    writes = stream_writes(slack)
    assert ledger.said == [("opening",), ("opened", slack.streams()[0]["ts"])]  # promised, then told once
    assert slack.streams()[0]["text"] == "first " + "".join(pieces)  # every word once, in order
    assert len(writes) <= 4  # start, the batch written while the first was paced, the stop
    gaps = [b.at - a.at for a, b in itertools.pairwise(writes)]
    assert all(gap >= 0.3 for gap in gaps), gaps  # Slack's 300 ms (the pace keeps 5 ms more)


def test_a_stream_is_promised_before_it_starts_and_tagged_when_it_stops(slack: FakeSlackAPI) -> None:
    ledger = Ledger()
    live = view(slack, root(slack), ledger)
    live(TextWritten("words"))
    wait_until(lambda: slack.streams() and ledger.said[-1:] == [("opened", slack.streams()[0]["ts"])])
    start = stream_writes(slack)[0]
    assert ledger.said[0] == ("opening",) and start.method == "chat.startStream"
    live.seal()
    wait_until(lambda: not slack.streams()[0]["streaming"])
    stop = stream_writes(slack)[-1]
    assert stop.method == "chat.stopStream" and stop.params["metadata"] == tagged("run-1", LIVE_KEY)
    assert stop.ok


def test_a_stream_that_cannot_be_promised_never_starts_and_the_caller_posts(slack: FakeSlackAPI) -> None:
    live = view(slack, root(slack), Ledger(refuse=True))
    live(TextWritten("hello"))
    live.requested([call("toolu_1")])
    assert live.seal() is None  # nothing opened: the reply is posted whole instead
    assert stream_writes(slack) == []
    assert "stream" not in live.refused  # the store was away, not Slack: the next reply tries again


def test_a_workspace_that_refuses_streams_is_not_asked_again(slack: FakeSlackAPI) -> None:
    slack.fail_next("chat.startStream", error="not_allowed_token_type")
    live = view(slack, root(slack))
    live(TextWritten("hello"))
    assert live.seal() is None  # nothing opened: the caller posts instead
    assert "stream" in live.refused
    live(TextWritten("again"))
    live.requested([call("toolu_9")])
    assert live.seal() is None
    assert len(stream_writes(slack)) == 1


def test_a_workspace_without_task_updates_gets_the_words_alone(slack: FakeSlackAPI) -> None:
    slack.tasks_supported = False
    live = view(slack, root(slack))
    live(TextWritten("checking"))
    live.requested([call("toolu_3")])
    ts = live.seal()
    wait_until(lambda: slack.streams() and not slack.streams()[0]["streaming"])
    assert ts is not None and slack.streams()[0]["text"] == "checking"
    assert "tasks" in live.refused and not slack.streams()[0]["tasks"]


def test_a_broken_stream_takes_no_more_writes_and_says_so(slack: FakeSlackAPI) -> None:
    live = view(slack, root(slack))
    live(TextWritten("one "))
    wait_until(lambda: stream_writes(slack))
    slack.fail_next("chat.appendStream", status=500, times=5)
    live(TextWritten("two "))
    wait_until(lambda: any(not c.ok for c in stream_writes(slack)))
    live(TextWritten("three "))
    ts = live.seal()
    assert ts is not None
    assert live.message is None
    failed_at = next(c.at for c in stream_writes(slack) if not c.ok)
    assert not [c for c in stream_writes(slack) if c.at > failed_at]  # nothing after the break


def test_a_refused_stream_is_not_taken_for_refused_tasks_and_asked_again(slack: FakeSlackAPI) -> None:
    slack.fail_next("chat.startStream", error="not_allowed_token_type")
    live = view(slack, root(slack))
    live.requested([call("toolu_5")])  # the first write carries a task …
    live(TextWritten("words"))
    assert live.seal() is None
    assert live.refused == {"stream"}  # … yet the stream was refused, not the tasks: no second try
    assert len(stream_writes(slack)) == 1


def test_a_message_opened_and_sealed_in_one_batch_still_stops_a_pace_later(slack: FakeSlackAPI) -> None:
    client_root = root(slack)
    live = view(slack, client_root)
    live.streams.pacer.note(CHANNEL, client_root)  # a post just went out: the first write waits its turn
    live(TextWritten("all of it at once"))
    live.seal()  # sealed before the first write: start and stop come from one batch
    wait_until(lambda: slack.streams() and not slack.streams()[0]["streaming"])
    start, stop = stream_writes(slack)
    assert (start.method, stop.method) == ("chat.startStream", "chat.stopStream")
    assert stop.at - start.at >= 0.3


def test_a_title_shows_the_arguments_as_written_with_no_entity(slack: FakeSlackAPI) -> None:
    live = view(slack, root(slack))
    live.requested([asked("toolu_1")])
    live.seal()
    wait_until(lambda: slack.streams() and not slack.streams()[0]["streaming"])
    title = tasks_of(slack)["toolu_1"]["title"]
    assert "The task:\\n\\n> Write a note & <b>keep</b> it" in title  # as Slack shows plain text
    assert not any(entity in title for entity in ("&gt;", "&lt;", "&amp;"))


def test_a_call_that_never_runs_goes_straight_to_why_never_through_in_progress(slack: FakeSlackAPI) -> None:
    live = view(slack, root(slack))
    waits, denied = asked("toolu_1"), replace(call("toolu_2", "delete_file"), tier=Tier.DENY)
    live.requested([waits, denied])  # the model asked for both: one asks, the policy denies the other
    live.waiting([waits])
    wait_until(lambda: slack.streams() and tasks_of(slack).get("toolu_1", {}).get("details"))
    assert live.seal() is not None
    wait_until(lambda: not slack.streams()[0]["streaming"])
    tasks = tasks_of(slack)
    assert (tasks["toolu_1"]["status"], tasks["toolu_1"]["details"]) == ("pending", texts.TASK_WAITING)
    assert tasks["toolu_2"]["history"] == ["error"] and tasks["toolu_2"]["details"] == texts.TASK_DENIED

    for verdict, why in ((Verdict.DECLINED, texts.TASK_DECLINED), (Verdict.EXPIRED, texts.TASK_EXPIRED)):
        slack.reset()
        live = view(slack, root(slack))
        undone = asked("toolu_3", verdict)
        live.requested([undone])
        live(CallRunning(1, undone))  # the loop passes every call; this one is never run
        live(ToolReturned(1, replace(undone, result=ToolResult("Not executed", True))))
        live.seal()
        wait_until(lambda: slack.streams() and not slack.streams()[0]["streaming"])
        (task,) = tasks_of(slack).values()
        assert (task["history"], task["details"], task.get("output")) == (["error"], why, None)


def test_an_approved_call_says_so_once_and_its_output_once(slack: FakeSlackAPI) -> None:
    live = view(slack, root(slack))
    approved = asked("toolu_1", Verdict.APPROVED)
    live.requested([approved])
    wait_until(lambda: slack.streams() and tasks_of(slack))
    live(CallRunning(1, approved))
    wait_until(lambda: tasks_of(slack)["toolu_1"]["status"] == "in_progress")
    done = replace(approved, result=ToolResult("wrote notes.md"))
    live(ToolReturned(1, done))
    wait_until(lambda: tasks_of(slack)["toolu_1"]["status"] == "complete")
    live.requested([done])  # the turn's end shows every call as it ended: nothing new here
    live.seal()
    wait_until(lambda: not slack.streams()[0]["streaming"])
    (task,) = tasks_of(slack).values()
    assert task["history"] == ["pending", "in_progress", "complete"]
    assert (task["details"], task["output"]) == (texts.TASK_APPROVED, "wrote notes.md")


def test_a_stream_opened_with_words_whose_tasks_are_refused_goes_on_with_words(slack: FakeSlackAPI) -> None:
    slack.tasks_supported = False
    live = view(slack, root(slack))
    live(TextWritten("checking"))
    wait_until(lambda: slack.streams())  # opened with its words alone …
    live.requested([call("toolu_3")])  # … then a task, which this workspace refuses
    live(TextWritten(" and on"))
    live.seal()
    wait_until(lambda: not slack.streams()[0]["streaming"])
    assert slack.streams()[0]["text"] == "checking and on" and not slack.streams()[0]["tasks"]
    assert "tasks" in live.refused and not live.message
