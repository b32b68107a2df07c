"""Fault injection: killed workers and bots, a restarted Redis, duplicates, unreadable state.

Each promise is tested by doing the damage for real: SIGKILL of a worker's whole process group
mid-request, a bot killed mid-delivery, Redis stopped and started again on its AOF file.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from harness.policy import Tier
from harness.state import Decision, PendingCall, RunState, Verdict, new_run
from runtime.queue import enqueue_run_job, make_queue
from store import BATCH, RunRecord, RunStatus, Store, new_run_id, pack, unpack
from store.keys import Keys
from tests.fakes.messages_api import FakeMessagesAPI, Reply, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import RedisServer, Stack, wait_until
from workers.life import MAX_RECOVERIES

pytestmark = pytest.mark.e2e
FAST_LEASE = {"HARNESS_LEASE_SECONDS": "2"}
# With 2 s leases: a dead driver is noticed within about 3 s (lease + one watchdog tick); the
# rest is starting a worker process and running the recovered run.
RECOVERY_BOUND = 30.0
FIGURES: dict[str, int] = {}


WORKING = "Working on it"  # the run's first post, its Stop button: holds wait for the next one


FOOTER_1 = "That took 0 turns of tool calls across 1 model requests."  # a run with no tool calls


def count(name: str, n: int = 1) -> None:
    """Tally for the README's figures table (printed at the end of the session)."""
    FIGURES[name] = FIGURES.get(name, 0) + n


@pytest.fixture
def fakes() -> Iterator[tuple[FakeSlackAPI, FakeMessagesAPI]]:
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        yield slack, model


@pytest.fixture
def stack(fakes: tuple[FakeSlackAPI, FakeMessagesAPI], redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    config = '[approvals]\napprovers = ["UANN", "UBEN"]\n'
    stack = Stack(redis_url, *fakes, tmp_path, config=config, extra_env=dict(FAST_LEASE))
    try:
        yield stack
    finally:
        stack.stop()


def posts(stack: Stack, channel: str, ts: str) -> list[dict[str, Any]]:
    return [m for m in stack.slack.messages(channel, ts) if m["ts"] != ts]


def wait_text(stack: Stack, channel: str, ts: str, needle: str, timeout: float = 60) -> dict[str, Any]:
    return wait_until(
        lambda: next((m for m in posts(stack, channel, ts) if needle in m["text"]), None), timeout
    )


def is_card(message: dict[str, Any]) -> bool:
    """A call's approval card: its buttons include `approve` (a park's Approve all message does not)."""
    return any(
        element.get("action_id") == "approve"
        for block in message.get("blocks") or []
        if block.get("type") == "actions"
        for element in block.get("elements") or []
    )


def cards(stack: Stack, channel: str, ts: str) -> list[dict[str, Any]]:
    return [m for m in posts(stack, channel, ts) if is_card(m)]


def card_of(stack: Stack, channel: str, ts: str) -> dict[str, Any]:
    return wait_until(lambda: next((m for m in posts(stack, channel, ts) if is_card(m)), None))


def value_of(card: dict[str, Any]) -> str:
    """The `run:call` value of a card's buttons."""
    actions = next(b for b in card["blocks"] if b["type"] == "actions")
    return str(actions["elements"][0]["value"])


def runs(stack: Stack) -> list[RunRecord]:
    """Every run record in the stack's Redis."""
    conn = redis.Redis.from_url(stack.redis_url)
    return [RunRecord.from_json(unpack(conn.get(key))) for key in conn.keys("harness:run:*")]


def park_on_write(
    stack: Stack, task: str, path: str, *, then: str, channel: str
) -> tuple[str, dict[str, Any]]:
    """Start the stack and a run that parks on writing `path` (answering `then` after); its card."""
    stack.model.script(reply(tool_use("write_file", {"path": path, "content": path[0]})), reply(text(then)))
    stack.start_bot()
    stack.start_worker()
    _, ts, _ = stack.mention(task, channel=channel, user="UANN")
    card = card_of(stack, channel, ts)
    stack.settled()  # parked and let go: nothing of the driver's may land after what a test changes
    return ts, card


class Gate:
    """A model reply that waits until the test opens the gate; `arrived` counts who is waiting."""

    def __init__(self, answer: Reply) -> None:
        self.answer = answer
        self.open = threading.Event()
        self.arrived = threading.Semaphore(0)

    def __call__(self, body: dict[str, Any]) -> Reply:
        self.arrived.release()
        self.open.wait(60)
        return self.answer


# --- workers dying -----------------------------------------------------------------------------------


def test_a_worker_killed_during_a_model_request_loses_no_run(stack: Stack) -> None:
    gate = Gate(reply(text("late answer that nobody reads")))
    stack.model.responder = gate
    stack.start_bot()
    doomed = stack.start_worker()
    _, ts, _ = stack.mention("killme: say something", channel="C1", user="UANN")
    assert gate.arrived.acquire(timeout=30)

    doomed.kill_group()  # the worker and its work horse, mid-request
    count("workers SIGKILLed mid-run")
    stack.model.responder = None
    stack.model.script(reply(text("recovered answer")))
    gate.open.set()
    started = time.monotonic()
    stack.start_worker()
    answer = wait_text(stack, "C1", ts, "recovered answer", timeout=120)
    assert time.monotonic() - started < 120
    assert "That took 0 turns of tool calls across 1 model requests." in answer["text"]
    assert [m["text"] for m in posts(stack, "C1", ts)].count(answer["text"]) == 1


def test_a_worker_killed_while_posting_to_slack_loses_no_run(stack: Stack) -> None:
    stack.model.script(
        reply(tool_use("read_file", {"path": "README.md"})),
        reply(text("lost with the worker")),
        reply(text("after the crash")),
    )
    held = stack.slack.hold_next("chat.update")  # the turn summary, settling the turn's live message
    stack.start_bot()
    doomed = stack.start_worker()
    _, ts, _ = stack.mention("postkill: read it", channel="C2", user="UANN")
    assert held.arrived.wait(30)
    # The summary goes out while the model reads the turn's results: the worker dies with both
    # under way, its answer unsaved.
    assert stack.model.wait_for_requests(2, 30)
    doomed.kill_group()
    count("workers SIGKILLed mid-run")
    held.release.set()  # the summary reaches Slack after all, from a dead worker
    stack.start_worker()
    wait_text(stack, "C2", ts, "after the crash", timeout=120)
    # The finished turn was checkpointed: the tool did not run again, and its summary, posted by
    # the dead worker, is found by its key rather than posted twice. The request under way when
    # the worker died is asked again (a model request changes nothing; its answer was never saved).
    assert len(stack.model.requests) == 3
    summaries = [m for m in posts(stack, "C2", ts) if "read_file" in m["text"]]
    assert len(summaries) == 1
    assert not any("lost with the worker" in m["text"] for m in posts(stack, "C2", ts))
    # The answer the dead worker was streaming is taken out of the thread, not left half-written.
    lost = [s for s in stack.slack.streams() if "lost with the worker" in s["text"]]
    deleted = {c.params.get("ts") for c in stack.slack.calls if c.method == "chat.delete" and c.ok}
    assert all(s["ts"] in deleted for s in lost)


def test_a_side_effecting_call_whose_worker_died_is_never_run_again(stack: Stack) -> None:
    """The state a driver leaves when it dies after marking a call started, before its result."""
    conn = redis.Redis.from_url(stack.redis_url)
    store = Store(conn)
    task = new_run("crashed: write the file")
    call = PendingCall(
        "toolu_crash",
        "write_file",
        {"path": "once.txt", "content": "x"},
        Tier.ASK,
        decision=Decision(Verdict.APPROVED, by="UANN"),
        started=True,
    )
    assistant = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}],
    }
    state = RunState(messages=(*task.messages, assistant), turns=1, requests=1, pending=(call,))
    record = RunRecord(
        new_run_id(),
        "T1",
        "C3",
        "1700000000.000001",
        "UANN",
        "write the file",
        status=RunStatus.RUNNING,
        state=state.to_json(),
    )
    store.runs.save_run(record)
    store.threads.take(record, 60)
    conn.zadd(Keys.active(), {record.run_id: time.time() - 60})  # its driver went silent a minute ago
    stack.model.script(reply(text("I will check the file first.")))

    stack.start_worker()
    wait_text(stack, "C3", record.thread_ts, "I will check the file first.", timeout=60)
    assert not (stack.workspace / "once.txt").exists()
    result = stack.model.requests[-1]["messages"][-1]["content"][0]
    assert result["tool_use_id"] == "toolu_crash" and result["is_error"] is True
    assert "NOT run again" in result["content"]
    count("side-effecting calls not re-run after a crash")


def started_jobs(conn: redis.Redis) -> list[str]:
    """The functions of the jobs RQ has marked started (its started registry)."""
    queue = make_queue(conn)
    names = []
    for job_id in queue.started_job_registry.get_job_ids():
        job = queue.fetch_job(job_id)
        if job is not None:
            names.append(job.func_name)
    return names


def kill_when_started(stack: Stack, worker: Any, func_name: str) -> None:
    """SIGKILL the worker tree at the first sign of a job: it entering RQ's started registry."""
    conn = redis.Redis.from_url(stack.redis_url)
    wait_until(lambda: func_name in started_jobs(conn), timeout=30, interval=0.001)
    worker.kill_group()
    count("workers SIGKILLed mid-run")


def test_a_worker_killed_as_the_resume_starts_loses_no_decision(stack: Stack) -> None:
    stack.model.script(reply(tool_use("write_file", {"path": "rk.txt", "content": "r"})))
    gate = Gate(reply(text("held")))
    stack.model.responder = gate  # past the script: the resumed run cannot finish before the kill
    stack.start_bot()
    doomed = stack.start_worker()
    _, ts, _ = stack.mention("resumekill: write", channel="C20", user="UANN")
    card = card_of(stack, "C20", ts)
    stack.settled()  # parked and let go: the click's job will be what resumes it
    run_id, call_id, _ = value_of(card).split(":")
    assert stack.click(card, "approve", user="UANN") == 200
    kill_when_started(stack, doomed, "workers.jobs.apply_decisions")

    # Whatever step it died at, the decision was not consumed before the run was durably running.
    store = Store(redis.Redis.from_url(stack.redis_url))
    record = store.runs.load(run_id)
    assert record is not None
    approved = store.parks.decisions(run_id, 1).get(call_id)
    assert record.status is RunStatus.RUNNING or (approved and approved.verdict is Verdict.APPROVED)
    stack.model.responder = None
    stack.model.script(reply(text("resumed after the crash")))
    gate.open.set()
    started = time.monotonic()
    stack.start_worker()
    wait_text(stack, "C20", ts, "resumed after the crash", timeout=60)
    assert time.monotonic() - started < RECOVERY_BOUND
    last = stack.model.requests[-1]["messages"][-1]["content"]
    assert [b["tool_use_id"] for b in last if b["type"] == "tool_result"] == [call_id]  # the model heard
    stack.settled()
    assert [m["text"] for m in posts(stack, "C20", ts)].count("resumed after the crash") <= 1


def test_a_worker_killed_while_parking_posts_every_card_once_and_stays_clickable(stack: Stack) -> None:
    stack.model.script(
        reply(
            tool_use("write_file", {"path": "p1.txt", "content": "1"}),
            tool_use("delete_file", {"path": "README.md"}),
        ),
        reply(text("parked and recovered")),
    )
    held = stack.slack.hold_next("chat.postMessage", unless=WORKING)  # the first approval card
    stack.start_bot()
    doomed = stack.start_worker()
    _, ts, _ = stack.mention("parkkill: write and delete", channel="C21", user="UANN")
    assert held.arrived.wait(30)
    doomed.kill_group()  # after the park was saved, while its first card is on the wire
    count("workers SIGKILLed mid-run")
    held.release.set()  # the card reaches Slack after all: the next driver must not post it again
    wait_until(lambda: len(cards(stack, "C21", ts)) == 1)
    started = time.monotonic()
    stack.start_worker()
    wait_until(lambda: len(cards(stack, "C21", ts)) == 2, timeout=RECOVERY_BOUND)
    assert time.monotonic() - started < RECOVERY_BOUND
    [record] = runs(stack)
    # Its two cards and its Approve all message (`BATCH`) are known, and nothing is owed any more.
    wait_until(
        lambda: (
            set(runs(stack)[0].cards) == {*(c.id for c in record.run_state().awaiting), BATCH}
            and not runs(stack)[0].outbox
        )
    )
    stack.settled()
    assert len(cards(stack, "C21", ts)) == 2  # every card exactly once
    assert len([m for m in posts(stack, "C21", ts) if "approve_all" in str(m["blocks"])]) == 1  # batch: once
    conn = redis.Redis.from_url(stack.redis_url)
    assert conn.zscore(Keys.expiries(), f"{record.run_id}:1") is not None  # its expiry is scheduled
    for card in cards(stack, "C21", ts):
        assert stack.click(card, "approve", user="UANN") == 200
    wait_text(stack, "C21", ts, "parked and recovered")
    assert (stack.workspace / "p1.txt").read_text() == "1" and not (stack.workspace / "README.md").exists()


def test_a_start_job_lost_before_its_driver_took_the_lease_is_recovered(stack: Stack) -> None:
    stack.model.script(reply(text("started after all")))
    stack.start_bot()
    conn = redis.Redis.from_url(stack.redis_url)
    _, ts, _ = stack.mention("lostjob: hi", channel="C22", user="UANN")
    queue = make_queue(conn)
    [job] = queue.get_jobs()
    assert job.retries_left == 3  # the bot's jobs carry the same retry policy as the workers'
    job.delete()  # the job is gone, as with a worker that died after dequeuing it, before the lease
    started = time.monotonic()
    stack.start_worker()
    wait_text(stack, "C22", ts, "started after all", timeout=RECOVERY_BOUND)
    assert time.monotonic() - started < RECOVERY_BOUND
    count("jobs lost before their lease, recovered")


def test_a_worker_killed_as_a_run_starts_loses_no_run(stack: Stack) -> None:
    gate = Gate(reply(text("unused")))
    stack.model.responder = gate
    stack.start_bot()
    doomed = stack.start_worker()
    _, ts, _ = stack.mention("startkill: hi", channel="C23", user="UANN")
    kill_when_started(stack, doomed, "workers.jobs.start_run")
    stack.model.responder = None
    stack.model.script(reply(text("started on another worker")))
    gate.open.set()
    stack.start_worker()
    wait_text(stack, "C23", ts, "started on another worker", timeout=RECOVERY_BOUND)
    stack.settled()
    assert [m["text"] for m in posts(stack, "C23", ts)].count(posts(stack, "C23", ts)[-1]["text"]) == 1


def test_the_answer_reaches_the_thread_exactly_once_across_a_crash(stack: Stack) -> None:
    """The answer streams, then settles; a worker killed with the stream's stop on the wire leaves a
    stopped but unsettled message, which the next worker settles instead of answering again."""
    stack.model.script(reply(text("the answer, exactly once")))
    held = stack.slack.hold_next("chat.stopStream")
    stack.start_bot()
    doomed = stack.start_worker()
    _, ts, _ = stack.mention("answerkill: hi", channel="C24", user="UANN")
    assert held.arrived.wait(30)
    doomed.kill_group()  # the run is saved finished; its answer streamed, its stop on the wire
    count("workers SIGKILLed mid-run")
    held.release.set()
    stack.start_worker()
    wait_until(lambda: runs(stack)[0].outbox == [] and runs(stack)[0].status is RunStatus.FINISHED)
    stack.settled()
    answers = [m for m in posts(stack, "C24", ts) if "the answer, exactly once" in m["text"]]
    assert len(answers) == 1 and FOOTER_1 in answers[0]["text"]  # settled as the finished answer
    assert [s["streaming"] for s in stack.slack.streams()] == [False]  # one stream, closed
    assert len(stack.model.requests) == 1
    assert ("C24", ts, "white_check_mark") in stack.slack.reactions  # what it still owed was paid
    for call in stack.slack.calls:  # a link in model text is never fetched by Slack
        if call.method == "chat.postMessage":
            assert call.params.get("unfurl_links") is False and call.params.get("unfurl_media") is False


def test_an_answer_lost_with_its_worker_is_posted_by_the_next(stack: Stack) -> None:
    stack.model.script(reply(text("posted by the next worker")))
    held = stack.slack.hold_next("chat.update")  # the answer, settling its live message
    stack.start_bot()
    doomed = stack.start_worker()
    _, ts, _ = stack.mention("answerlost: hi", channel="C25", user="UANN")
    assert held.arrived.wait(30)
    stack.slack.fail_next("chat.update", error="fatal_error")  # the held settling never lands
    doomed.kill_group()
    count("workers SIGKILLed mid-run")
    held.release.set()
    stack.start_worker()
    wait_text(stack, "C25", ts, "posted by the next worker", timeout=RECOVERY_BOUND)
    stack.settled()
    assert len([m for m in posts(stack, "C25", ts) if "posted by the next worker" in m["text"]]) == 1


def test_a_stream_left_open_by_a_dead_worker_is_taken_out_and_the_answer_comes_once(stack: Stack) -> None:
    stack.model.script(
        reply(text("halfway " * 100), tokens_per_second=100),  # written as the model writes it
        reply(text("streamed " * 100)),  # asked again: the first reply died unsaved with its worker
    )
    held = stack.slack.hold_next("chat.appendStream")
    stack.start_bot()
    doomed = stack.start_worker()
    _, ts, _ = stack.mention("streamkill: hi", channel="C28", user="UANN")
    assert held.arrived.wait(30)
    doomed.kill_group()  # the stream is open: nobody will append to it or stop it
    count("workers SIGKILLed mid-run")
    held.release.set()
    stack.start_worker()
    wait_until(lambda: runs(stack)[0].outbox == [] and runs(stack)[0].status is RunStatus.FINISHED)
    stack.settled()
    (answer,) = stack.slack.streams()  # the dead worker's stream is gone: stopped, then deleted
    started = [c for c in stack.slack.calls if c.method == "chat.startStream" and c.ok]
    orphan = started[0].response["ts"]
    assert started[0].params["markdown_text"].startswith("half") and orphan != answer["ts"]
    deleted = [c for c in stack.slack.calls if c.method == "chat.delete" and c.params.get("ts") == orphan]
    assert deleted and deleted[-1].ok
    assert answer["streaming"] is False and FOOTER_1 in answer["text"]  # closed, and it is the answer
    assert len([m for m in posts(stack, "C28", ts) if "streamed streamed" in m["text"]]) == 1
    assert not [m for m in posts(stack, "C28", ts) if "halfway" in m["text"]]


def test_a_stream_that_opened_as_its_worker_died_unrecorded_is_found_in_the_thread_and_taken_out(
    stack: Stack,
) -> None:
    """The window a failover once hit: `chat.startStream` reached Slack, and its ts never reached
    Redis. Here its worker dies with the start on the wire; the stream opens after, which no record
    names. The next driver finds it in the thread (ours, untagged, since the ask) and takes it out."""
    stack.model.script(
        reply(text("halfway " * 100), tokens_per_second=100),  # its stream starts, then the worker dies
        reply(text("streamed " * 100)),  # asked again: the first reply died unsaved with its worker
    )
    held = stack.slack.hold_next("chat.startStream")
    stack.start_bot()
    doomed = stack.start_worker()
    _, ts, _ = stack.mention("startkill: hi", channel="C29", user="UANN")
    assert held.arrived.wait(30)
    doomed.kill_group()  # the start is on the wire: its answer, the stream's ts, dies with the worker
    count("workers SIGKILLed mid-run")
    held.release.set()
    started = wait_until(lambda: [c for c in stack.slack.calls if c.method == "chat.startStream" and c.ok])
    orphan = started[0].response["ts"]
    assert [s["ts"] for s in stack.slack.streams() if s["streaming"]] == [orphan]  # open, in no record
    assert not redis.Redis.from_url(stack.redis_url).smembers(f"harness:live:{runs(stack)[0].run_id}")
    stack.start_worker()
    wait_until(lambda: runs(stack)[0].outbox == [] and runs(stack)[0].status is RunStatus.FINISHED)
    stack.settled()
    (answer,) = stack.slack.streams()  # the orphan is gone: stopped, then deleted
    deleted = [c for c in stack.slack.calls if c.method == "chat.delete" and c.params.get("ts") == orphan]
    assert deleted and deleted[-1].ok and answer["ts"] != orphan
    assert answer["streaming"] is False and FOOTER_1 in answer["text"]
    assert not [m for m in posts(stack, "C29", ts) if "halfway" in m["text"]]
    assert len([m for m in posts(stack, "C29", ts) if "streamed streamed" in m["text"]]) == 1
    for call in stack.slack.calls:  # every other message of ours in the thread carries its tag
        if call.method in ("chat.postMessage", "chat.stopStream") and call.params.get("ts") != orphan:
            assert call.params["metadata"]["event_type"] == "harness_message", call


def test_the_file_of_a_long_answer_reaches_the_thread_exactly_once_across_a_crash(stack: Stack) -> None:
    long_answer = "A long answer. " * 2000  # 30,000 characters: more than a message holds
    stack.model.script(reply(text(long_answer)))
    held = stack.slack.hold_next("files.completeUploadExternal")  # its bytes are up; the share is on the wire
    stack.start_bot()
    doomed = stack.start_worker()
    _, ts, _ = stack.mention("filekill: hi", channel="C27", user="UANN")
    assert held.arrived.wait(30)
    doomed.kill_group()
    count("workers SIGKILLed mid-run")
    held.release.set()
    wait_until(lambda: any(m.get("files") for m in posts(stack, "C27", ts)))
    stack.start_worker()
    wait_until(lambda: runs(stack)[0].outbox == [] and runs(stack)[0].status is RunStatus.FINISHED)
    stack.settled()
    shared = [f for f in stack.slack.files() if f.get("shared")]
    assert len(shared) == 1 and shared[0]["text"] == long_answer.strip()
    assert len([m for m in posts(stack, "C27", ts) if m.get("files")]) == 1
    assert len([m for m in posts(stack, "C27", ts) if "whole of it is in the file" in str(m["blocks"])]) == 1


def test_a_run_that_keeps_killing_its_workers_is_stopped_with_a_message(stack: Stack) -> None:
    """The state after the driver of a run died MAX_RECOVERIES times: the next one stops it."""
    conn = redis.Redis.from_url(stack.redis_url)
    task = new_run("crashloop: hi")
    record = RunRecord(
        new_run_id(), "T1", "C26", "1700000000.000026", "UANN", "crashloop: hi",
        status=RunStatus.RUNNING, state=task.to_json(), recoveries=MAX_RECOVERIES,
    )  # fmt: skip
    Store(conn).runs.save_run(record)
    conn.zadd(Keys.active(), {record.run_id: time.time() - 60})
    stack.start_worker()
    notice = wait_text(stack, "C26", record.thread_ts, "worker died", timeout=RECOVERY_BOUND)
    assert "Nothing more was run" in notice["text"]
    stack.settled()
    assert stack.model.requests == []
    [stopped] = runs(stack)
    assert stopped.status is RunStatus.STOPPED
    count("runs stopped after killing their worker too often")


def test_one_requester_cannot_flood_the_queue(stack: Stack) -> None:
    gate = Gate(reply(text("done")))
    stack.model.responder = gate
    stack.start_bot()
    stack.start_worker()
    mentions = [stack.mention(f"flood {i}", channel=f"C3{i}", user="UFLOOD") for i in range(7)]
    assert all(status == 200 for status, _, _ in mentions)
    assert len(runs(stack)) == 5  # the default bound per requester
    _, refused_ts, _ = mentions[5]
    notice = wait_text(stack, "C35", refused_ts, "You already have 5 requests going")
    assert "not started" in notice["text"]
    assert posts(stack, "C36", mentions[6][1]) == []  # told in a thread once a minute, not once a mention
    told = wait_until(lambda: [e for e in stack.slack.ephemerals if e["channel"] == "C36"])
    assert [(e["user"], e["thread_ts"]) for e in told] == [("UFLOOD", mentions[6][1])]
    assert "You already have 5 requests going" in told[0]["text"]  # but told: never refused silently
    gate.open.set()
    stack.settled()
    count("mentions refused over the per-requester bound", 2)


# --- the bot dying, Redis restarting -------------------------------------------------------------------


def test_a_bot_killed_mid_delivery_and_slacks_retry_make_exactly_one_run(stack: Stack) -> None:
    stack.model.script(reply(text("one and only")), reply(text("SECOND RUN")))
    bot = stack.start_bot()  # no worker yet: the only transaction in Redis is the bot's
    conn = redis.Redis.from_url(stack.redis_url)
    ts = stack.slack.add_message("C4", "<@UBOT> botkill: hi", user="UANN")
    results: list[object] = []

    def deliver() -> None:
        try:
            results.append(
                stack.mention("botkill: hi", channel="C4", user="UANN", ts=ts, event_id="EvKill")[0]
            )
        except OSError as exc:  # the bot died with the request open: Slack sees no answer
            results.append(exc)

    # Writes wait: the bot is killed with its transaction sent, before Redis applies it.
    conn.execute_command("CLIENT", "PAUSE", 20000, "WRITE")
    try:
        sender = threading.Thread(target=deliver)
        sender.start()
        # The bot's accept script (one step: the dedup mark, the run and its job), paused (b) whole.
        blocked = re.compile(rb"flags=b .* cmd=evalsha ")
        wait_until(
            lambda: any(blocked.search(c) for c in conn.execute_command("CLIENT", "LIST").splitlines())
        )
        bot.kill_group()
    finally:
        conn.execute_command("CLIENT", "UNPAUSE")
    sender.join(15)
    count("bots SIGKILLed mid-delivery")
    assert results and not isinstance(results[0], int)  # Slack got no answer: it will retry
    # Redis runs a script whole or not at all: whether the dead bot's EVALSHA was read before the
    # kill decides which, never a dedup mark without its run (that would swallow the retry).
    assert len(conn.keys("harness:run:*")) == len(conn.keys("harness:event:*")) <= 1
    stack.start_bot()
    stack.start_worker()
    status, _, _ = stack.mention(
        "botkill: hi", channel="C4", user="UANN", ts=ts, event_id="EvKill"
    )  # Slack retries
    assert status == 200
    wait_text(stack, "C4", ts, "one and only")
    stack.settled()
    assert len(stack.model.requests) == 1
    assert not any("SECOND RUN" in m["text"] for m in posts(stack, "C4", ts))


def test_a_redis_restart_keeps_parked_runs_clickable(
    fakes: tuple[FakeSlackAPI, FakeMessagesAPI], tmp_path: Path
) -> None:
    server = RedisServer(appendonly=True).start()
    stack = Stack(
        server.url, *fakes, tmp_path, config='[approvals]\napprovers = ["UANN"]\n', extra_env=dict(FAST_LEASE)
    )
    try:
        stack.model.script(
            reply(tool_use("write_file", {"path": "kept.txt", "content": "k"})), reply(text("kept done"))
        )
        stack.start_bot()
        stack.start_worker()
        _, ts, _ = stack.mention("aof: write kept.txt", channel="C5", user="UANN")
        card = card_of(stack, "C5", ts)
        server.stop()  # SIGTERM: Redis fsyncs its AOF on the way down (a crash could lose ~1 s)
        wait_until(lambda: stack.healthz() == 503)
        server.start()
        count("Redis restarts survived")
        wait_until(lambda: stack.healthz() == 200, timeout=30)
        assert stack.click(card, "approve", user="UANN") == 200
        wait_text(stack, "C5", ts, "kept done", timeout=60)
        assert (stack.workspace / "kept.txt").read_text() == "k"
    finally:
        stack.stop()
        server.cleanup()


# --- duplicates --------------------------------------------------------------------------------------


def test_the_same_event_five_times_at_once_is_one_run(stack: Stack) -> None:
    stack.model.script(reply(text("just once")), reply(text("TWICE")))
    stack.start_bot()
    stack.start_worker()
    ts = stack.slack.add_message("C6", "<@UBOT> dup5: hi", user="UANN")
    statuses: list[int] = []
    threads = [
        threading.Thread(
            target=lambda: statuses.append(
                stack.mention("dup5: hi", channel="C6", user="UANN", ts=ts, event_id="EvDup5")[0]
            )
        )
        for _ in range(5)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200] * 5
    count("duplicate deliveries absorbed", 4)
    wait_text(stack, "C6", ts, "just once")
    stack.settled()
    assert len(stack.model.requests) == 1


def test_ten_concurrent_clicks_by_two_approvers_are_one_decision_and_one_execution(stack: Stack) -> None:
    ts, card = park_on_write(stack, "tenclicks: write", "ten.txt", then="ten done", channel="C7")
    barrier = threading.Barrier(10)

    def click(i: int) -> None:
        barrier.wait()
        stack.click(card, "approve" if i % 2 else "decline", user="UANN" if i < 5 else "UBEN")

    threads = [threading.Thread(target=click, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    count("duplicate clicks absorbed", 9)
    wait_text(stack, "C7", ts, "ten done")
    entries = Store(redis.Redis.from_url(stack.redis_url)).audit.entries()
    assert len([e for e in entries if e["call_id"] == value_of(card).split(":")[1]]) == 1
    assert len(stack.model.requests) == 2


def test_the_same_resume_job_enqueued_twice_runs_once(stack: Stack) -> None:
    stack.model.script(
        reply(tool_use("write_file", {"path": "r.txt", "content": "r"})),
        reply(text("resumed once")),
        reply(text("TWICE")),
    )
    stack.start_bot()
    stack.start_worker()
    _, ts, _ = stack.mention("resume2: write", channel="C8", user="UANN")
    card = card_of(stack, "C8", ts)
    store = Store(redis.Redis.from_url(stack.redis_url))
    run_id, call_id, _ = value_of(card).split(":")
    store.parks.decide(run_id, 1, call_id, Decision(Verdict.APPROVED, by="UANN"))
    queue = make_queue(store.redis)
    enqueue_run_job(store, queue, "workers.jobs.apply_decisions", run_id)
    enqueue_run_job(store, queue, "workers.jobs.apply_decisions", run_id)
    count("duplicate resume jobs absorbed")
    wait_text(stack, "C8", ts, "resumed once")
    stack.settled()
    assert len(stack.model.requests) == 2
    assert (stack.workspace / "r.txt").read_text() == "r"


# --- failing closed, failing Slack --------------------------------------------------------------------


def test_an_unreadable_parked_state_never_executes_anything(stack: Stack) -> None:
    ts, card = park_on_write(stack, "oldformat: write", "never.txt", then="SHOULD NOT", channel="C9")
    conn = redis.Redis.from_url(stack.redis_url)
    run_id = value_of(card).split(":")[0]
    raw = json.loads(unpack(conn.get(Keys.run(run_id))))
    raw["state"]["version"] = 0  # written by an older harness
    conn.set(Keys.run(run_id), pack(json.dumps(raw)))
    assert stack.click(card, "approve", user="UANN") == 200
    wait_until(lambda: any("cannot be read safely" in e["text"] for e in stack.slack.ephemerals))
    stack.settled()
    assert len(stack.model.requests) == 1
    assert not (stack.workspace / "never.txt").exists()
    count("unreadable states refused")


def test_a_post_that_still_fails_does_not_kill_the_run(stack: Stack) -> None:
    stack.model.script(reply(tool_use("get_time", {})), reply(text("finished anyway")))
    stack.slack.fail_next("chat.postMessage", error="channel_not_found")
    stack.start_bot()
    worker = stack.start_worker()
    _, ts, _ = stack.mention("postfail: time", channel="C10", user="UANN")
    wait_text(stack, "C10", ts, "finished anyway")
    # Survived, not recovered: the same driver went on (a crash would have needed the watchdog).
    [record] = runs(stack)
    assert record.status is RunStatus.FINISHED and record.recoveries == 0
    assert "has no driver" not in worker.output()
    failed = [c for c in stack.slack.calls if c.method == "chat.postMessage" and not c.ok]
    assert [c.error for c in failed] == ["channel_not_found"]
    count("Slack failures survived")


def test_runs_in_different_threads_go_in_parallel_on_two_workers(stack: Stack) -> None:
    gate = Gate(reply(text("parallel done")))
    stack.model.responder = gate
    stack.start_bot()
    stack.start_worker()
    stack.start_worker()
    _, a, _ = stack.mention("para: one", channel="C11", user="UANN")
    _, b, _ = stack.mention("para: two", channel="C12", user="UANN")
    assert gate.arrived.acquire(timeout=30) and gate.arrived.acquire(timeout=30)  # both in flight at once
    gate.open.set()
    wait_text(stack, "C11", a, "parallel done")
    wait_text(stack, "C12", b, "parallel done")


def test_two_mentions_in_one_thread_at_once_never_interleave(stack: Stack) -> None:
    gate = Gate(reply(text("first finished")))
    stack.model.responder = gate
    stack.start_bot()
    stack.start_worker()
    stack.start_worker()
    _, root, _ = stack.mention("samethread: first", channel="C13", user="UANN")
    assert gate.arrived.acquire(timeout=30)
    stack.mention("second, same thread", channel="C13", user="UANN", thread_ts=root)
    wait_text(stack, "C13", root, "still on the previous request")
    assert len(stack.model.requests) == 1  # the second run did not start beside the first
    stack.model.responder = None
    stack.model.script(reply(text("second finished")))
    gate.open.set()
    wait_text(stack, "C13", root, "second finished")
    second = stack.model.requests[-1]["messages"]
    assert "first finished" in str(second) and "second, same thread" in str(second[-1])


def test_tokens_and_keys_never_reach_logs_or_slack(stack: Stack) -> None:
    stack.model.script(
        reply(tool_use("write_file", {"path": "s.txt", "content": "s"})), reply(text("secret-free"))
    )
    bot = stack.start_bot()
    worker = stack.start_worker()
    _, ts, _ = stack.mention("scrub: write", channel="C14", user="UANN")
    stack.click(card_of(stack, "C14", ts), "approve", user="UANN")
    wait_text(stack, "C14", ts, "secret-free")
    stack.stop()
    secrets = ("xoxb-test", "test-signing-secret", "sk-test")
    for process in (bot, worker):
        log = process.output()
        assert log.strip(), f"{process.name} logged nothing: the test would prove nothing"
        for secret in secrets:
            assert secret not in log, f"{secret} appears in the {process.name} log"
    posted = json.dumps([stack.slack.messages("C14", ts), stack.slack.ephemerals])
    assert not any(secret in posted for secret in secrets)


def test_every_decision_is_in_the_audit_log_and_the_cli_prints_it(stack: Stack) -> None:
    import subprocess
    import sys

    from tests.stack import ROOT

    stack.model.script(reply(tool_use("delete_file", {"path": "README.md"})), reply(text("audited")))
    audit_dir = stack.workdir / "audit"
    stack.extra_env["HARNESS_AUDIT_DIR"] = str(audit_dir)
    stack.start_bot()
    stack.start_worker()
    _, ts, _ = stack.mention("audit: delete", channel="C15", user="UANN")
    stack.click(card_of(stack, "C15", ts), "decline", user="UBEN")
    wait_text(stack, "C15", ts, "audited")
    # The worker's watchdog appends the decision to the day's file (HARNESS_AUDIT_DIR), and the
    # chain it extends checks out, from Redis alone and against the file.
    wait_until(lambda: any(b'\\"UBEN\\"' in p.read_bytes() for p in audit_dir.glob("audit-*.jsonl")))
    alone = {k: v for k, v in stack.env().items() if k != "HARNESS_AUDIT_DIR"}
    for env in (alone, stack.env()):
        verified = subprocess.run(
            [sys.executable, "-m", "workers", "audit", "verify"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert verified.returncode == 0 and verified.stdout.endswith(" entries, chain intact\n"), verified
    done = subprocess.run(
        [sys.executable, "-m", "workers", "audit"],
        env=stack.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if "delete_file" in line)
    assert "declined" in line and "by UBEN" in line and '{"path":"README.md"}' in line
    assert "channel=C15" in line and "asked_by=UANN" in line
    # The stream keeps a hash and a bounded preview of each input, never the input whole.
    [entry] = [
        e for e in Store(redis.Redis.from_url(stack.redis_url)).audit.entries() if e["tool"] == "delete_file"
    ]
    assert "input" not in entry and entry["input_preview"] == '{"path":"README.md"}'
    assert entry["input_sha256"] == hashlib.sha256(b'{"path":"README.md"}').hexdigest()


def test_a_click_replayed_into_another_channel_or_naming_no_run_changes_nothing(stack: Stack) -> None:
    ts, card = park_on_write(stack, "elsewhere: write", "x.txt", then="moved", channel="C16")
    assert stack.click({**card, "channel": "C99"}, "approve", user="UANN") == 200
    wait_until(lambda: any("does not belong to this channel" in e["text"] for e in stack.slack.ephemerals))
    forged = json.loads(json.dumps(card))
    for block in forged["blocks"]:
        for element in block.get("elements", []):
            if "value" in element:
                element["value"] = "0" * 32 + ":toolu_nothing"
    assert stack.click(forged, "approve", user="UANN") == 200
    wait_until(lambda: any("no longer open" in e["text"] for e in stack.slack.ephemerals))
    assert stack.click(card, "approve", user="UANN", team="TOTHER") == 200
    wait_until(lambda: any("does not belong to this workspace" in e["text"] for e in stack.slack.ephemerals))
    stack.settled()
    assert len(stack.model.requests) == 1
    assert not (stack.workspace / "x.txt").exists()
    run_id, call_id, _ = value_of(card).split(":")
    assert Store(redis.Redis.from_url(stack.redis_url)).parks.decisions(run_id, 1) == {call_id: None}
    count("forged clicks refused", 3)


def test_a_huge_body_is_refused_before_it_is_read(stack: Stack) -> None:
    """Only the headers and the first bytes go out: the 413 must come without the rest of the body.

    (Sending all 2 MB raced the refusal: the bot closes the connection once it has answered, and a
    client still writing the body got a broken pipe instead of the answer.)
    """
    stack.start_bot()
    head = (
        "POST /slack/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: 2000001\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as sock:
        sock.sendall(head.encode() + b"x" * 1000)
        answer = b""
        while b"\r\n" not in answer and (chunk := sock.recv(4096)):
            answer += chunk
    assert answer.split(b"\r\n", 1)[0].split()[1] == b"413", answer[:200]
    assert stack.healthz() == 200


def test_decisions_that_do_not_match_the_parked_calls_run_nothing_and_say_so(stack: Stack) -> None:
    ts, card = park_on_write(stack, "mismatch: write", "m.txt", then="SHOULD NOT", channel="C17")
    run_id, call_id, _ = value_of(card).split(":")
    conn = redis.Redis.from_url(stack.redis_url)
    conn.hset(
        Keys.approvals(run_id, 1), "toolu_smuggled", json.dumps(Decision(Verdict.APPROVED, "UANN").to_json())
    )
    assert stack.click(card, "approve", user="UANN") == 200
    wait_text(stack, "C17", ts, "stopped this run without running anything")
    assert not (stack.workspace / "m.txt").exists()
    assert len(stack.model.requests) == 1
    count("ambiguous decision records refused")
