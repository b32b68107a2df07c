"""Continue, Retry and Feedback under the approval rules (issue 19, items 8 and 9).

Continue at a limit is an approval like any other: four eyes and a quorum apply. Retry starts a
run again, so it counts against the requester's and the channel's bounds of runs. Feedback has a
stream of its own, bounded and rate-limited per person, and `python -m workers audit` reads every
kind of entry the code writes. The end-to-end tests drive signed HTTP into the real bot, a real
`python -m workers`, real Redis and the loopback Slack and Messages API; the audit test reads its
entries back through the real command.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis

from harness.policy import Tier
from harness.state import ClickCheck, Decision, GrantUse, PendingCall, Verdict
from messages import texts
from messages.text import plural
from store import (
    FEEDBACK_PER_MINUTE,
    LIMIT_CALL,
    Accepted,
    FeedbackOutcome,
    Grant,
    RunStatus,
    Store,
    new_run_id,
)
from store.keys import Keys
from tests.fakes.messages_api import http_error, reply, text, tool_use
from tests.stack import ROOT, RedisServer, Stack, running_stack, wait_post, wait_until
from tests.store.test_store import parked, record

# --- the audit reads every kind of entry -----------------------------------------------------------


def run_audit(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m workers audit ARGS` against `redis_url`, as an operator runs it."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "REDIS_URL": redis_url}
    return subprocess.run(
        [sys.executable, "-m", "workers", "audit", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def call(call_id: str, **arguments: Any) -> PendingCall:
    return PendingCall(call_id, "write_file", arguments, Tier.ASK, why="built-in tier of write_file")


@pytest.mark.e2e
def test_the_audit_command_reads_one_entry_of_every_kind_the_code_writes(
    store: Store, redis_url: str
) -> None:
    calls = [call(f"toolu_{n}", path=f"f{n}.txt", content="hi") for n in range(8)]
    run = parked(store, [c.id for c in calls] + [LIMIT_CALL])
    fields = {c.id: run.audit_fields(c) for c in calls}

    def decide(n: int, decision: Decision, **kw: Any) -> None:
        c = calls[n]
        store.parks.decide(run.run_id, run.park_id, c.id, decision, audit=fields[c.id], fingerprint="*", **kw)

    decide(0, Decision(Verdict.APPROVED, by="UANN"))
    decide(1, Decision(Verdict.DECLINED, by="UBEN", reason="not today"))
    decide(2, Decision(Verdict.APPROVED, by="UANN", edited_input={"path": "g.txt", "content": "ok"}))
    decide(3, Decision(Verdict.APPROVED, by="UANN"), required=2)  # a vote towards a quorum …
    decide(3, Decision(Verdict.APPROVED, by="UBEN"), required=2)  # … and the approval it completes
    grant = Grant(
        Keys.grant(run.team, run.channel, run.thread_ts, "write_file"),
        "write_file",
        "UANN",
        "UA",
        time.time() + 60,
    )
    decide(4, Decision(Verdict.APPROVED, by="UANN", grant=GrantUse.GIVEN), grant=grant)
    store.audit.append(  # a call a standing grant let run (workers.granting.apply_grants)
        {
            "run_id": run.run_id,
            "call_id": "toolu_9",
            **run.audit_fields(call("toolu_9", path="h.txt")),
            **Decision(Verdict.APPROVED, by="UANN", grant=GrantUse.USED).to_json(),
            "grant_until": grant.until,
        }
    )
    limit = {**run.audit_fields(None), "limit": "max_turns"}
    store.parks.decide(
        run.run_id, run.park_id, LIMIT_CALL, Decision(Verdict.APPROVED, by="UANN"), audit=limit
    )
    decide(5, Decision(Verdict.APPROVED, by="UCAROL"), now=time.time() + 3600)  # a late click: expired
    check = ClickCheck("gates.codeowners:may_approve", "yes", "@ann owns every path")
    decide(6, Decision(Verdict.APPROVED, by="UANN", check=check))  # approvers_from said yes
    store.audit.append(  # … and an approval it refused (bot.approver_checks)
        {
            "run_id": run.run_id,
            "call_id": calls[7].id,
            **fields[calls[7].id],
            "verdict": "approval_refused",
            "by": "UBEN",
            "approvers_from": ClickCheck("gates.codeowners:may_approve", "no", "owned by @ann").to_json(),
        }
    )
    # Written by versions before feedback had its own stream, and by something this version does not know.
    store.audit.append({"event": "feedback", "run_id": run.run_id, "feedback": "good", "by": "UBOB"})
    store.audit.append({"kind": "from-a-newer-version", "verdict": "escalated", "note": "\x1b[31mred"})
    store.redis.xadd(Keys.audit(), {"entry": "not json \x1b]0;owned\x07"})
    store.redis.xadd(Keys.audit(), {"other": "no entry field"})
    entry = {"event": "feedback", "run_id": run.run_id, "feedback": "bad", "by": "UBOB", "channel": "C1"}
    assert (
        store.audit.record_feedback(entry, team="T1", user="UBOB", run_id=run.run_id)
        is FeedbackOutcome.RECORDED
    )

    done = run_audit(redis_url, "--limit", "1000")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(store.audit.entries(1000)) == 15
    out = done.stdout
    assert "approved by UANN write_file(" in out and '"path":"f0.txt"' in out
    assert "declined by UBEN" in out and 'reason="not today"' in out
    assert "edited_to=" in out and "g.txt" in out
    assert "counted  by UANN (1 of 2: UANN)" in out and "approvers=UANN,UBEN" in out
    assert "grant=given" in out and "grant=used" in out
    assert "by UANN limit max_turns" in out
    assert "expired  by (nobody: expired)" in out and "late_click_by=UCAROL" in out
    assert 'approvers_from=gates.codeowners:may_approve=yes check_reason="@ann owns every path"' in out
    assert "refused  by UBEN write_file(" in out and 'may_approve=no check_reason="owned by @ann"' in out
    assert "feedback good by UBOB" in out  # an older version's feedback, still read
    assert "unknown" in out and "from-a-newer-version" in out
    assert "\x1b" not in out and "\x07" not in out  # nothing stored acts on the operator's terminal
    assert "\\u001b" in out
    assert "feedback bad" not in out  # feedback is not in the approvals audit …

    feedback = run_audit(redis_url, "--feedback")
    assert feedback.returncode == 0, feedback.stderr
    assert feedback.stdout.count("\n") == 1 and "feedback bad  by UBOB" in feedback.stdout  # … but apart


# --- feedback: its own stream, one standing click per answer, a share per minute --------------------


def test_feedback_goes_to_its_own_bounded_stream_once_per_answer_and_person(store: Store) -> None:
    run_id = new_run_id()

    def give(verdict: str, user: str = "UBOB", run: str = run_id) -> FeedbackOutcome:
        entry = {"event": "feedback", "run_id": run, "feedback": verdict, "by": user}
        return store.audit.record_feedback(entry, team="T1", user=user, run_id=run)

    assert give("good") is FeedbackOutcome.RECORDED
    assert give("good") is FeedbackOutcome.SAME  # a double click, or Slack sending it again
    assert give("bad") is FeedbackOutcome.RECORDED  # a change of mind counts
    assert give("good", user="UCAROL") is FeedbackOutcome.RECORDED  # someone else's is their own
    assert [(e["by"], e["feedback"]) for e in store.audit.feedback_entries()] == [
        ("UBOB", "good"),
        ("UBOB", "bad"),
        ("UCAROL", "good"),
    ]
    assert store.audit.entries() == []  # never in the decisions' audit
    info = store.redis.xinfo_stream(Keys.feedback())
    assert info["length"] == 3
    assert store.redis.ttl(Keys.feedback_given(run_id, "UBOB")) > 0  # every mark expires


def test_one_person_is_recorded_at_most_their_share_of_a_minute(store: Store) -> None:
    outcomes = [
        store.audit.record_feedback(
            {"event": "feedback", "run_id": run, "feedback": "good", "by": "UBOB"},
            team="T1",
            user="UBOB",
            run_id=run,
        )
        for run in (new_run_id() for _ in range(300))
    ]
    assert outcomes.count(FeedbackOutcome.RECORDED) == FEEDBACK_PER_MINUTE
    past = outcomes[FEEDBACK_PER_MINUTE:]  # told once, then nothing more
    assert past == [FeedbackOutcome.LIMITED] + [FeedbackOutcome.IGNORED] * (299 - FEEDBACK_PER_MINUTE)
    assert len(store.audit.feedback_entries(1000)) == FEEDBACK_PER_MINUTE
    assert 0 < store.redis.ttl(Keys.feedback_rate("T1", "UBOB")) <= 60  # the share comes back
    other = {"event": "feedback", "run_id": new_run_id(), "feedback": "bad", "by": "UCAROL"}
    assert (
        store.audit.record_feedback(other, team="T1", user="UCAROL", run_id=other["run_id"])
        is FeedbackOutcome.RECORDED
    )


# --- retry: a run again, counted like a mention ---------------------------------------------------


def test_a_retry_is_counted_against_the_channels_bound_too_and_claimed_once(store: Store) -> None:
    failed = record(requester="UCAROL", channel="C7")
    others = [record(requester=f"UP{n}", channel="C7") for n in range(2)]
    for other in others:  # two runs going in the channel, started by others
        store.redis.zadd(Keys.channel_runs("T1", "C7"), {other.run_id: time.time()})

    def claim(**bounds: int) -> Accepted:
        return store.admission.claim_retry(
            failed, "1.000200", "UANN", **{"max_per_user": 5, "max_per_channel": 2, **bounds}
        )

    assert claim() is Accepted.CHANNEL_BUSY
    assert (
        store.admission.retry_claimed_by(failed.run_id, "1.000200") is None
    )  # nothing written: still retryable
    assert store.redis.zscore(Keys.active(), failed.run_id) is None
    assert claim(max_per_channel=3) is Accepted.NEW
    assert store.admission.retry_claimed_by(failed.run_id, "1.000200") == "UANN"
    assert store.redis.zscore(Keys.user_runs("T1", "UCAROL"), failed.run_id) is not None
    assert store.redis.zscore(Keys.channel_runs("T1", "C7"), failed.run_id) is not None
    assert store.redis.zscore(Keys.active(), failed.run_id) is not None
    assert claim(max_per_channel=3) is Accepted.DUPLICATE  # a second click, or the same one again


def test_a_failure_retried_before_it_was_saved_is_not_ended_but_kept_for_its_driver(store: Store) -> None:
    """The card of a failure reaches Slack before the run's end records its ts: a Retry claimed in
    between keeps the run with its driver (lease, thread, counts), which retries it at once."""
    failed = replace(record(requester="UCAROL", channel="C8"), status=RunStatus.FAILED, failure_ts="1.000300")
    assert store.runs.acquire_lease(failed.run_id, "tok", 30)
    assert store.threads.take(failed, 60)
    assert (
        store.admission.claim_retry(failed, "1.000300", "UANN", max_per_user=5, max_per_channel=5)
        is Accepted.NEW
    )
    ended = store.runs.finish(failed, "tok", history=None, failure_ts="1.000300")
    assert ended is not None and ended.retry_claimed and ended.next_run is None
    assert store.runs.load(failed.run_id) == failed  # written, with the card's ts
    assert store.redis.get(Keys.lease(failed.run_id)) == b"tok"
    assert store.threads.holder(failed) == failed.run_id
    assert store.redis.zscore(Keys.active(), failed.run_id) is not None
    assert store.redis.zscore(Keys.user_runs("T1", "UCAROL"), failed.run_id) is not None
    store.admission.unclaim_retry(failed.run_id, "1.000300")  # no claim (or another card's): the run ends
    ended = store.runs.finish(failed, "tok", history=None, failure_ts="1.000300")
    assert ended is not None and not ended.retry_claimed
    assert store.redis.get(Keys.lease(failed.run_id)) is None
    assert store.threads.holder(failed) is None
    assert store.redis.zscore(Keys.active(), failed.run_id) is None


# --- end to end: Continue under four eyes and a quorum, Retry counted, feedback rate-limited ------

e2e = pytest.mark.e2e
# Other stacks: test_slack_surface 1 and 2, test_fuzz_bot 3, DM 4, test_mcp/test_socket_mode 5,
# gate 6, test_approvals 9-11, test_stop_and_limits 11 and 12, test_groups_escalation_home 13.
DB = 14
RULES = """
[approvals]
approvers = ["UALICE", "UANN", "UBEN"]
required = 2
self_approval = false
[limits]
max_turns = 1
on_limit = "ask"
max_runs_per_user = 1
max_runs_per_channel = 1000
"""
_channels = itertools.count(1400)


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Approvers UALICE, UANN, UBEN; two approvals, never the requester's; one turn, then ask;
    one run at a time per requester."""
    yield from running_stack(redis_server, tmp_path_factory.mktemp("rules"), RULES, DB)


def new_channel() -> str:
    return f"C{next(_channels)}"


def buttons(message: dict[str, Any]) -> list[dict[str, Any]]:
    actions = [b for b in message.get("blocks") or [] if b["type"] == "actions"]
    return [e for b in actions for e in b["elements"] if e.get("type") == "button"]


def has_button(action_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda m: any(b["action_id"] == action_id for b in buttons(m))


def current(stack: Stack, channel: str, message: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in stack.slack.messages(channel) if m["ts"] == message["ts"])


def shown(message: dict[str, Any]) -> str:
    return message["text"] + json.dumps(message["blocks"], ensure_ascii=False)


def replies_to(stack: Stack, user: str, channel: str) -> list[str]:
    return [e["text"] for e in stack.slack.ephemerals if e["user"] == user and e["channel"] == channel]


def wait_reply(stack: Stack, user: str, channel: str, needle: str) -> None:
    wait_until(lambda: any(needle in t for t in replies_to(stack, user, channel)))


def asked(stack: Stack, marker: str) -> list[dict[str, Any]]:
    return [r for r in stack.model.requests if marker in json.dumps(r["messages"][0])]


def at_limit(stack: Stack, marker: str, user: str, *then: Any) -> tuple[str, str, dict[str, Any]]:
    """`user`'s run that used its one turn and asks whether to go on: its limit card."""
    channel = new_channel()
    stack.model.script_for(
        marker,
        reply(tool_use("read_file", {"path": "README.md"})),
        reply(tool_use("list_files", {"path": "."})),
        *then,
    )
    # `max_runs_per_user` is 1 here and a run counts until its end, which comes just after its
    # answer is posted: an earlier test's run may still count for a moment after its last check.
    stack.settled()
    _, ts, _ = stack.mention(f"{marker}: read, then list", channel=channel, user=user)
    return channel, ts, wait_post(stack, channel, ts, has_button("continue"))


@e2e
def test_continue_at_a_limit_takes_two_approvers_and_never_the_requester_alone(stack: Stack) -> None:
    marker = "goonquorum"
    channel, ts, card = at_limit(stack, marker, "UALICE", reply(text(f"{marker} done")))
    assert "0 of 2" in shown(card) and "may stop it, not continue it" in shown(card)  # the rules, on the card
    stack.settled()

    assert stack.click(card, "continue", user="UALICE") == 200  # the requester: four eyes
    wait_reply(stack, "UALICE", channel, "someone else must choose Continue")
    assert stack.click(card, "continue", user="UANN") == 200
    wait_reply(stack, "UANN", channel, "1 of 2")
    wait_until(lambda: "1 of 2" in shown(current(stack, channel, card)))  # the card counts so far
    assert "<@UANN>" in shown(current(stack, channel, card))
    assert stack.click(card, "continue", user="UANN") == 200  # the same person twice counts once
    wait_until(lambda: len([t for t in replies_to(stack, "UANN", channel) if "1 of 2" in t]) == 2)
    stack.settled()
    assert len(asked(stack, marker)) == 2 and has_button("continue")(current(stack, channel, card))

    assert stack.click(card, "continue", user="UBEN") == 200
    answer = wait_post(stack, channel, ts, lambda m: f"{marker} done" in m["text"])
    assert "That took 2 turns" in answer["text"]
    decided = current(stack, channel, card)
    assert buttons(decided) == [] and "<@UANN>" in shown(decided) and "<@UBEN>" in shown(decided)
    [entry] = [
        e
        for e in Store(redis.Redis.from_url(stack.redis_url)).audit.entries(1000)
        if e.get("limit") and e.get("verdict") == "approved" and e.get("channel") == channel
    ]
    assert entry["approvers"] == ["UANN", "UBEN"]
    assert stack.model.errors == []


@e2e
def test_one_stop_at_a_limit_stops_even_after_a_continue_and_the_requester_may_stop(stack: Stack) -> None:
    marker = "haltquorum"
    channel, ts, card = at_limit(stack, marker, "UALICE")
    assert stack.click(card, "continue", user="UANN") == 200
    wait_reply(stack, "UANN", channel, "1 of 2")
    assert stack.click(card, "stop", user="UALICE") == 200  # a requester's decline counts
    wait_post(stack, channel, ts, lambda m: "at max turns" in m["text"] and "Stop was chosen" in m["text"])
    assert "Stopped by <@UALICE>" in shown(current(stack, channel, card))
    stack.settled()
    assert len(asked(stack, marker)) == 2


def card_of(stack: Stack, channel: str, ts: str) -> dict[str, Any]:
    """The approval card of the thread, once it is there."""
    return wait_post(stack, channel, ts, has_button("approve"))


@e2e
def test_retry_counts_against_the_requesters_runs_and_a_refused_one_stays_retryable(stack: Stack) -> None:
    first = new_channel()
    stack.model.script_for(
        "retrya",
        http_error(400, message="bad request from fake"),
        reply(tool_use("write_file", {"path": "retried.txt", "content": "again"})),
        reply(text("retrya done")),
    )
    _, ts, _ = stack.mention("retrya: write it", channel=first, user="UCAROL")
    failure = wait_post(stack, first, ts, has_button("retry"))
    stack.settled()  # the failed run no longer counts: UCAROL may start another
    second = new_channel()
    stack.model.script_for(
        "retryb", reply(tool_use("write_file", {"path": "b.txt", "content": "b"})), reply(text("retryb done"))
    )
    _, ts_b, _ = stack.mention("retryb: write it", channel=second, user="UCAROL")
    card_b = card_of(stack, second, ts_b)  # parked: UCAROL's one run

    assert stack.click(failure, "retry", user="UANN") == 200
    wait_reply(stack, "UANN", first, "already has 1 request")
    stack.settled()
    assert len(asked(stack, "retrya")) == 1  # not retried …
    assert has_button("retry")(current(stack, first, failure))  # … and still retryable
    client = redis.Redis.from_url(stack.redis_url)
    assert client.keys("harness:retry:*") == []

    assert stack.click(card_b, "decline", user="UANN") == 200  # UCAROL's other run ends
    wait_post(stack, second, ts_b, lambda m: "retryb done" in m["text"])
    stack.settled()
    assert stack.click(failure, "retry", user="UANN") == 200
    card_a = card_of(stack, first, ts)  # retried, and parked on its write: it counts now
    assert not has_button("retry")(current(stack, first, failure))
    third = new_channel()
    _, ts_c, _ = stack.mention("retryc: one more", channel=third, user="UCAROL")
    wait_post(stack, third, ts_c, lambda m: "You already have 1 request going" in m["text"])
    assert asked(stack, "retryc") == []

    assert stack.click(card_a, "decline", user="UANN") == 200
    wait_post(stack, first, ts, lambda m: "retrya done" in m["text"])
    assert stack.model.errors == []


@e2e
def test_300_feedback_clicks_of_one_person_record_10_and_tell_them_once_and_others_still_count(
    stack: Stack,
) -> None:
    channel = new_channel()
    stack.model.script_for("fbspam", reply(text("fbspam answered")))
    _, ts, _ = stack.mention("fbspam: answer", channel=channel, user="UALICE")
    answer = wait_post(stack, channel, ts, lambda m: "fbspam answered" in m["text"])
    (thumbs,) = answer["blocks"][-1]["elements"]
    values = [thumbs["positive_button"]["value"], thumbs["negative_button"]["value"]]

    def click(value: str, user: str) -> None:
        status, _ = stack.click_value(
            answer, "feedback", value, user=user, block_id="feedback", kind="feedback_buttons"
        )
        assert status == 200

    click(values[0], "UBOB")
    click(values[0], "UBOB")  # a double click: nothing new, and it counts as a click
    for n in range(298):  # then a change of mind every click: each would be news, but not this many
        click(values[(n + 1) % 2], "UBOB")
    click(values[0], "UCAROL")  # someone else's feedback still counts
    wait_until(lambda: any("Thanks" in t for t in replies_to(stack, "UCAROL", channel)))
    wait_until(lambda: len(replies_to(stack, "UBOB", channel)) >= FEEDBACK_PER_MINUTE + 1)
    stack.settled()
    told = replies_to(stack, "UBOB", channel)
    assert sum("Thanks" in t for t in told) == FEEDBACK_PER_MINUTE - 1
    assert sum("already recorded" in t for t in told) == 1
    assert sum(f"{FEEDBACK_PER_MINUTE} times in the last minute" in t for t in told) == 1  # told once
    assert len(told) == FEEDBACK_PER_MINUTE + 1  # the other 289 clicks changed nothing, quietly

    store = Store(redis.Redis.from_url(stack.redis_url))
    mine = [e for e in store.audit.feedback_entries(1000) if e.get("channel") == channel]
    assert [e["by"] for e in mine] == ["UBOB"] * (FEEDBACK_PER_MINUTE - 1) + ["UCAROL"]
    assert [e["feedback"] for e in mine[:3]] == ["good", "bad", "good"]
    assert not [e for e in store.audit.entries(10_000) if e.get("event") == "feedback"]
    with urllib.request.urlopen(f"{stack.url}/metrics", timeout=10) as scrape:
        scraped = scrape.read().decode()
    counted = re.findall(r'^harness_feedback_total\{feedback="(?:good|bad)"\} (\d+)', scraped, re.MULTILINE)
    assert sum(int(n) for n in counted) == FEEDBACK_PER_MINUTE  # only what was recorded
    once = texts.FEEDBACK_LIMITED.format(times=plural(1, "time"))  # a limit of 1 reads right too
    assert once.startswith("You have given feedback 1 time in the last minute")
