"""A thread that shows progress as it happens (issue 21, item 5), end to end.

The real bot and a real `python -m workers` process, the fake Messages API streaming its replies as
a model writes them (tokens at a set rate), and the fake Slack Web API keeping Slack's streaming
rules (`chat.startStream` / `appendStream` / `stopStream`, `task_update` chunks). Checked: the words
reach Slack while the model still writes, paced to one stream write per 300 ms per thread; calls
show as tasks (pending, in progress, complete, error) and the message settles into the turn summary;
a parked turn's message waits with its tasks, and after the decision the thread's task lines tell
the truth: each call's line shows how it ended (approved then done or failed, declined, expired,
stopped, denied by the policy, Approve all), none still waits, and none is shown twice; a workspace
without tasks or streams gets today's messages; a stream broken by Slack errors, or by a worker
SIGKILLed midway, still leaves the answer whole, once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from messages import texts
from tests.fakes.messages_api import reply, text, tool_use
from tests.stack import RedisServer, Stack, running_stack, thread, wait_post, wait_until
from workers.live import PACE_SECONDS

_channels = itertools.count(7100)
HURRIED = "C7099"  # approvals there expire after 3 seconds
GENEROUS = "[limits]\nmax_runs_per_user = 1000\nmax_runs_per_channel = 1000\n"
CONFIG = (
    GENEROUS
    + '[policy.tools]\nlist_files = "deny"\n'
    + f'[[profiles]]\nname = "hurried"\nchannels = ["{HURRIED}"]\n'
    + "[profiles.approvals]\nexpire_after_minutes = 0.05\n"
)
SLACK_PACE = 0.3  # the rule: no more than one Slack write per 300 ms per thread


def new_channel() -> str:
    return f"C{next(_channels)}"


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    pace = {"HARNESS_STREAM_PACE_MS": str(PACE_SECONDS * 1000)}  # Slack's pace, not the tests' own
    yield from running_stack(redis_server, tmp_path_factory.mktemp("live"), CONFIG, db=9, extra_env=pace)


def footer(turns: int, requests: int) -> str:
    return f"That took {turns} turns of tool calls across {requests} model requests."


def stream_calls(stack: Stack, channel: str) -> list[Any]:
    return [c for c in stack.slack.calls if c.params.get("channel") == channel and "Stream" in c.method]


def writes_to(stack: Stack, channel: str, ts: str) -> list[Any]:
    """The writes Slack accepted to message `ts`: its stream's start, appends and stop, its settling."""
    return [
        c
        for c in stack.slack.calls
        if c.params.get("channel") == channel and c.ok and ts in (c.params.get("ts"), c.response.get("ts"))
    ]


def streams_in(stack: Stack, channel: str) -> list[dict[str, Any]]:
    return [s for s in stack.slack.streams() if s["channel"] == channel]


def lines_in(stack: Stack, channel: str) -> list[dict[str, Any]]:
    """Every task line the thread shows now, in the messages still in it (Slack keeps a stopped
    stream's tasks, through the update that settles it)."""
    return [task for s in streams_in(stack, channel) for task in s["tasks"].values()]


def line_of(stack: Stack, channel: str, tool: str) -> dict[str, Any]:
    """The one line the thread shows for the call of `tool` (shown twice: the test fails)."""
    (line,) = [t for t in lines_in(stack, channel) if t["title"].startswith(tool)]
    return line


def parked(stack: Stack, marker: str, *calls: dict[str, Any], channel: str | None = None) -> tuple[str, str]:
    """A run of `marker` asking for `calls`, parked on its cards (then a reply that wraps up)."""
    channel = channel or new_channel()
    stack.model.script_for(marker, reply(*calls), reply(text(f"{marker} wrapped up")))
    _, ts, _ = stack.mention(f"{marker}: go", channel=channel)
    wait_until(lambda: any(t.get("details") == texts.TASK_WAITING for t in lines_in(stack, channel)))
    stack.settled()  # parked: no worker holds it
    wait_until(lambda: not any(s["streaming"] for s in streams_in(stack, channel)))  # its stop is paced
    return channel, ts


def cards_of(stack: Stack, channel: str, ts: str, action: str = "approve") -> list[dict[str, Any]]:
    return [m for m in thread(stack, channel, ts) if f"'action_id': '{action}'" in str(m.get("blocks"))]


def wrapped_up(stack: Stack, channel: str, ts: str, marker: str) -> None:
    """The run answered and let go of everything; the thread is as it stays."""
    wait_post(stack, channel, ts, lambda m: f"{marker} wrapped up" in m["text"], timeout=30)
    stack.settled()


def assert_nothing_waits(stack: Stack, channel: str) -> None:
    """No line of the thread still waits, is pending or runs: each shows how its call ended."""
    lines = lines_in(stack, channel)
    assert lines and all(t["status"] in ("complete", "error") for t in lines), lines
    assert not any(texts.TASK_WAITING in t.get("details", "") for t in lines), lines


def test_the_answer_reaches_slack_while_the_model_writes_it_paced_and_settles_whole(stack: Stack) -> None:
    channel = new_channel()
    words = "**Live** <!here> " + " ".join(f"w{i}" for i in range(120))  # ~170 tokens at 50/s: ~3.4 s
    stack.model.script_for("liveans", reply(text(words), tokens_per_second=50))
    _, ts, _ = stack.mention("liveans: talk", channel=channel)
    answer = wait_post(stack, channel, ts, lambda m: footer(0, 1) in m["text"], timeout=30)

    calls = stream_calls(stack, channel)
    start = calls[0]
    assert start.method == "chat.startStream" and calls[-1].method == "chat.stopStream"
    first_token = stack.model.first_tokens[-1]
    assert start.at - first_token < 0.5  # the first words went out at once
    appends = [c for c in calls if c.method == "chat.appendStream"]
    assert len(appends) >= 5  # the answer grew in Slack while the model wrote it …
    assert len(appends) <= 3.4 / PACE_SECONDS + 2  # … batched, not a write per token
    spoken = (start.params.get("markdown_text") or "") + "".join(
        c.params.get("markdown_text") or "" for c in calls[1:]
    )
    assert "<!here>" not in spoken and "&lt;!here&gt;" in spoken  # inert while it streams
    assert spoken.count("w119") == 1 and spoken.count("w0 ") == 1
    writes = writes_to(stack, channel, start.response["ts"])
    assert [c.method for c in writes][-2:] == ["chat.stopStream", "chat.update"]
    gaps = [b.at - a.at for a, b in itertools.pairwise(writes)]
    assert min(gaps) >= SLACK_PACE, gaps  # one write per 300 ms per thread, settling too
    assert answer["ts"] == start.response["ts"]  # the streamed message became the answer
    assert answer["blocks"][0]["text"]["text"].startswith("*Live* &lt;!here&gt;")
    assert "w119" in str(answer["blocks"])
    assert len([m for m in thread(stack, channel, ts) if "w119" in m["text"]]) == 1
    assert not any(s["streaming"] for s in streams_in(stack, channel))


def test_calls_show_as_tasks_and_the_message_settles_into_the_turn_summary(stack: Stack) -> None:
    channel = new_channel()
    stack.model.script_for(
        "livetask",
        reply(
            text("Let me look around first."),
            tool_use("get_time", {}),
            tool_use("read_file", {"path": "no-such-file.txt"}),
        ),
        reply(text("all looked at")),
    )
    _, ts, _ = stack.mention("livetask: look", channel=channel)
    wait_post(stack, channel, ts, lambda m: footer(1, 2) in m["text"], timeout=30)
    summary = wait_post(stack, channel, ts, lambda m: "Turn 1" in m["text"])

    streamed = {s["ts"]: s for s in streams_in(stack, channel)}
    assert summary["ts"] in streamed  # the turn's live message settled into its summary
    tasks = list(streamed[summary["ts"]]["tasks"].values())
    assert [t["title"].split()[0] for t in tasks] == ["get_time", "read_file"]  # the model's order
    # Shown as they ended (pending and in progress came within one write's 300 ms: batched away).
    assert tasks[0]["status"] == "complete" and tasks[1]["status"] == "error"
    assert "no-such-file" in tasks[1]["title"]
    assert "Let me look around first." in str(summary["blocks"])  # the words it streamed stay
    assert "get_time" in str(summary["blocks"]) and "tokens used" in str(summary["blocks"])
    starts = [c for c in stream_calls(stack, channel) if c.method == "chat.startStream"]
    assert starts[0].params.get("task_display_mode") == "timeline" or starts[0].params.get("markdown_text")


def test_an_approved_call_that_runs_ends_done_and_no_line_still_waits(stack: Stack) -> None:
    content = "The task:\n\n> Write a note & <b>keep</b> it <!channel>"
    channel, ts = parked(stack, "livepark", tool_use("write_file", {"path": "live.txt", "content": content}))
    (waiting,) = [s for s in streams_in(stack, channel) if s["tasks"]]
    (task,) = waiting["tasks"].values()
    assert task["status"] == "pending" and task["details"] == texts.TASK_WAITING and not waiting["streaming"]
    assert "> Write a note & <b>keep</b> it <!channel>" in task["title"]  # plain text: as written
    assert not any(entity in task["title"] for entity in ("&gt;", "&lt;", "&amp;"))
    (card,) = cards_of(stack, channel, ts)
    assert stack.click(card, "approve") == 200
    wrapped_up(stack, channel, ts, "livepark")
    summary = wait_post(stack, channel, ts, lambda m: "Turn 1" in m["text"])

    assert_nothing_waits(stack, channel)
    line = line_of(stack, channel, "write_file")
    assert (line["status"], line["details"], line["output"]) == (
        "complete",
        texts.TASK_APPROVED,
        f"Wrote {len(content)} characters to live.txt",
    )
    assert waiting["ts"] not in {m["ts"] for m in thread(stack, channel, ts)}  # its line could not follow
    assert summary["ts"] in {s["ts"] for s in streams_in(stack, channel) if s["tasks"]}  # settled there
    assert (stack.workspace / "live.txt").read_text() == content


def test_an_approved_call_that_fails_ends_as_an_error(stack: Stack) -> None:
    channel, ts = parked(stack, "livefail", tool_use("delete_file", {"path": "no-such-file.txt"}))
    (card,) = cards_of(stack, channel, ts)
    assert stack.click(card, "approve") == 200
    wrapped_up(stack, channel, ts, "livefail")
    assert_nothing_waits(stack, channel)
    line = line_of(stack, channel, "delete_file")
    assert (line["status"], line["details"]) == ("error", texts.TASK_APPROVED)
    assert "no-such-file.txt" in line["output"]


def test_a_declined_call_ends_declined_never_run(stack: Stack) -> None:
    channel, ts = parked(stack, "livedecline", tool_use("write_file", {"path": "no.txt", "content": "x"}))
    (card,) = cards_of(stack, channel, ts)
    assert stack.click(card, "decline") == 200
    wrapped_up(stack, channel, ts, "livedecline")
    assert_nothing_waits(stack, channel)
    line = line_of(stack, channel, "write_file")
    assert (line["status"], line["details"], line["history"]) == ("error", texts.TASK_DECLINED, ["error"])
    assert not (stack.workspace / "no.txt").exists()


def test_a_call_nobody_decided_in_time_ends_expired(stack: Stack) -> None:
    call = tool_use("write_file", {"path": "late.txt", "content": "x"})
    channel, ts = parked(stack, "liveexpire", call, channel=HURRIED)
    wrapped_up(stack, channel, ts, "liveexpire")  # its approval expired after 3 seconds
    assert_nothing_waits(stack, channel)
    line = line_of(stack, channel, "write_file")
    assert (line["status"], line["details"]) == ("error", texts.TASK_EXPIRED)
    assert not (stack.workspace / "late.txt").exists()


def test_a_call_left_waiting_by_a_stop_ends_not_run(stack: Stack) -> None:
    channel, ts = parked(stack, "livestop", tool_use("write_file", {"path": "stopped.txt", "content": "x"}))
    working = wait_post(stack, channel, ts, lambda m: "Working on it" in m["text"])
    assert stack.click(working, "stop") == 200
    ended = wait_post(
        stack, channel, ts, lambda m: "Stopped by <@UALICE>" in m["text"] and "took" in m["text"]
    )
    stack.settled()
    assert_nothing_waits(stack, channel)
    line = line_of(stack, channel, "write_file")
    assert (line["status"], line["details"]) == ("error", texts.TASK_STOPPED)
    assert ended["ts"] in {s["ts"] for s in streams_in(stack, channel) if s["tasks"]}  # the Stop shows them
    assert not (stack.workspace / "stopped.txt").exists()


def test_a_call_the_policy_denies_shows_denied_at_once_and_after_the_park(stack: Stack) -> None:
    asks = tool_use("write_file", {"path": "beside.txt", "content": "x"})
    channel, ts = parked(stack, "livedeny", asks, tool_use("list_files", {"path": "."}))
    denied = line_of(stack, channel, "list_files")  # while the run waits, not drawn as pending
    assert (denied["status"], denied["details"], denied["history"]) == ("error", texts.TASK_DENIED, ["error"])
    (card,) = cards_of(stack, channel, ts)
    assert stack.click(card, "approve") == 200
    wrapped_up(stack, channel, ts, "livedeny")
    assert_nothing_waits(stack, channel)
    denied = line_of(stack, channel, "list_files")
    assert (denied["status"], denied["details"], denied["history"]) == ("error", texts.TASK_DENIED, ["error"])
    assert line_of(stack, channel, "write_file")["status"] == "complete"


def test_approve_all_ends_every_call_done(stack: Stack) -> None:
    one, two = ({"path": f"all{n}.txt", "content": str(n)} for n in (1, 2))
    channel, ts = parked(stack, "liveall", tool_use("write_file", one), tool_use("write_file", two))
    wait_until(lambda: cards_of(stack, channel, ts, "approve_all"))
    (batch,) = cards_of(stack, channel, ts, "approve_all")
    assert stack.click(batch, "approve_all") == 200
    wrapped_up(stack, channel, ts, "liveall")
    assert_nothing_waits(stack, channel)
    lines = lines_in(stack, channel)
    assert len(lines) == 2 and all(
        (t["status"], t["details"]) == ("complete", texts.TASK_APPROVED) for t in lines
    )
    assert (stack.workspace / "all2.txt").read_text() == "2"


def test_a_streamed_link_shows_its_address_above_the_waiting_card_and_after_it_settles(stack: Stack) -> None:
    channel = new_channel()
    words = "Before you approve, [open the reviewed diff](https://evil.example) and read it."
    stack.model.script_for(
        "livelink",
        reply(
            text(words), tool_use("write_file", {"path": "link.txt", "content": "x"}), tokens_per_second=40
        ),
        reply(text("wrote it")),
    )
    _, ts, _ = stack.mention("livelink: write", channel=channel)
    card = wait_post(
        stack, channel, ts, lambda m: "approve" in str(m.get("blocks")) and "link.txt" in m["text"]
    )
    stopped = wait_until(
        lambda: next(
            (s for s in streams_in(stack, channel) if not s["streaming"] and "diff" in s["text"]), None
        )
    )
    shown = "open the reviewed diff (https://evil.example)"  # as a posted answer shows it
    assert shown in stopped["text"] and "](" not in stopped["text"], stopped["text"]
    assert stack.click(card, "approve") == 200
    wait_post(stack, channel, ts, lambda m: footer(1, 2) in m["text"], timeout=30)
    summary = wait_post(stack, channel, ts, lambda m: "Turn 1" in m["text"])
    assert shown in str(summary["blocks"]) and "](" not in str(summary["blocks"])  # the words it said


def test_a_workspace_without_tasks_still_streams_words_and_posts_the_summaries(stack: Stack) -> None:
    channel = new_channel()
    stack.slack.tasks_supported = False
    try:
        stack.model.script_for(
            "notasks", reply(text("checking"), tool_use("get_time", {})), reply(text("done without tasks"))
        )
        _, ts, _ = stack.mention("notasks: go", channel=channel)
        answer = wait_post(stack, channel, ts, lambda m: footer(1, 2) in m["text"], timeout=30)
    finally:
        stack.slack.tasks_supported = True
    assert "done without tasks" in answer["text"]
    assert wait_post(stack, channel, ts, lambda m: "Turn 1" in m["text"])
    refused = [c for c in stream_calls(stack, channel) if not c.ok]
    assert refused and all(c.error == "invalid_chunks" for c in refused)
    assert not any(s["tasks"] for s in streams_in(stack, channel))


def test_a_workspace_that_refuses_streams_gets_posts_and_is_not_asked_again_in_the_run(stack: Stack) -> None:
    channel = new_channel()
    stack.slack.fail_next("chat.startStream", error="not_allowed_token_type")
    stack.model.script_for(
        "nolive", reply(text("first"), tool_use("get_time", {})), reply(text("posted instead"))
    )
    _, ts, _ = stack.mention("nolive: go", channel=channel)
    wait_post(stack, channel, ts, lambda m: "posted instead" in m["text"] and footer(1, 2) in m["text"])
    assert wait_post(stack, channel, ts, lambda m: "Turn 1" in m["text"])
    assert len(stream_calls(stack, channel)) == 1  # refused once, then never tried again
    assert not streams_in(stack, channel)


def test_a_stream_broken_by_slack_errors_midway_still_leaves_the_answer_whole_once(stack: Stack) -> None:
    channel = new_channel()
    words = " ".join(f"part{i}" for i in range(150))
    stack.model.script_for("brokenlive", reply(text(words), tokens_per_second=80))
    _, ts, _ = stack.mention("brokenlive: talk", channel=channel)
    wait_until(lambda: any(c.method == "chat.appendStream" for c in stream_calls(stack, channel)), 20)
    stack.slack.fail_next("chat.appendStream", status=500, times=3)
    answer = wait_post(stack, channel, ts, lambda m: footer(0, 1) in m["text"], timeout=30)
    failed = [c for c in stream_calls(stack, channel) if c.method == "chat.appendStream" and not c.ok]
    assert failed  # it did break midway
    later = [
        c for c in stream_calls(stack, channel) if c.at > failed[0].at and c.method == "chat.appendStream"
    ]
    assert not later  # a broken stream is not written to again
    assert f"{words.split()[-1]}" in str(answer["blocks"]) and "part0 " in str(answer["blocks"])
    assert len([m for m in thread(stack, channel, ts) if "part149" in m["text"]]) == 1  # whole, once


def test_a_stream_whose_settling_fails_is_replaced_by_a_post_never_left_beside_it(stack: Stack) -> None:
    channel = new_channel()
    stack.model.script_for("unsettled", reply(text("this answer " * 20), tokens_per_second=200))
    stack.slack.fail_next("chat.update", error="cant_update_message", times=3)
    _, ts, _ = stack.mention("unsettled: talk", channel=channel)
    answer = wait_post(stack, channel, ts, lambda m: footer(0, 1) in m["text"], timeout=30)
    assert "this answer" in answer["text"]
    assert len([m for m in thread(stack, channel, ts) if "this answer" in m["text"]]) == 1
    deleted = [
        c for c in stack.slack.calls if c.method == "chat.delete" and c.params.get("channel") == channel
    ]
    assert deleted and deleted[0].ok  # the partial stream went before the whole answer was posted
