"""Continue, Retry and Feedback under the approval rules (issue 19, items 8 and 9).

Continue at a limit is an approval like any other: four eyes and a quorum apply. Retry starts a
run again, so it counts against the requester's and the channel's bounds of runs. Feedback has a
stream of its own, bounded and rate-limited per person, and `python -m workers audit` reads every
kind of entry the code writes. The end-to-end tests drive signed HTTP into the real bot, a real
`python -m workers`, real Redis and the loopback Slack and Messages API; the audit test reads its
entries back through the real command.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from harness.policy import Tier
from harness.state import Decision, PendingCall, Verdict
from tests.stack import ROOT
from tests.test_store import parked
from workers.store import (
    FEEDBACK_PER_MINUTE,
    LIMIT_CALL,
    FeedbackOutcome,
    Grant,
    Keys,
    Store,
    new_run_id,
)

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


def test_the_audit_command_reads_one_entry_of_every_kind_the_code_writes(
    store: Store, redis_url: str
) -> None:
    calls = [call(f"toolu_{n}", path=f"f{n}.txt", content="hi") for n in range(8)]
    run = parked(store, [c.id for c in calls] + [LIMIT_CALL])
    fields = {c.id: run.audit_fields(c) for c in calls}

    def decide(n: int, decision: Decision, **kw: Any) -> None:
        c = calls[n]
        store.decide(run.run_id, run.park_id, c.id, decision, audit=fields[c.id], fingerprint="*", **kw)

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
    decide(4, Decision(Verdict.APPROVED, by="UANN", grant="given"), grant=grant)
    store.append_audit(  # a call a standing grant let run (workers.jobs._apply_grants)
        {
            "run_id": run.run_id,
            "call_id": "toolu_9",
            **run.audit_fields(call("toolu_9", path="h.txt")),
            **Decision(Verdict.APPROVED, by="UANN", grant="used").to_json(),
            "grant_until": grant.until,
        }
    )
    limit = {**run.audit_fields(None), "limit": "max_turns"}
    store.decide(run.run_id, run.park_id, LIMIT_CALL, Decision(Verdict.APPROVED, by="UANN"), audit=limit)
    decide(5, Decision(Verdict.APPROVED, by="UCAROL"), now=time.time() + 3600)  # a late click: expired
    # Written by versions before feedback had its own stream, and by something this version does not know.
    store.append_audit({"event": "feedback", "run_id": run.run_id, "feedback": "good", "by": "UBOB"})
    store.append_audit({"kind": "from-a-newer-version", "verdict": "escalated", "note": "\x1b[31mred"})
    store.redis.xadd(Keys.audit(), {"entry": "not json \x1b]0;owned\x07"})
    store.redis.xadd(Keys.audit(), {"other": "no entry field"})
    entry = {"event": "feedback", "run_id": run.run_id, "feedback": "bad", "by": "UBOB", "channel": "C1"}
    assert store.record_feedback(entry, team="T1", user="UBOB", run_id=run.run_id) is FeedbackOutcome.RECORDED

    done = run_audit(redis_url, "--limit", "1000")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(store.audit_entries(1000)) == 13
    out = done.stdout
    assert "approved by UANN write_file(" in out and '"path":"f0.txt"' in out
    assert "declined by UBEN" in out and 'reason="not today"' in out
    assert "edited_to=" in out and "g.txt" in out
    assert "counted  by UANN (1 of 2: UANN)" in out and "approvers=UANN,UBEN" in out
    assert "grant=given" in out and "grant=used" in out
    assert "by UANN limit max_turns" in out
    assert "expired  by (nobody: expired)" in out and "late_click_by=UCAROL" in out
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
        return store.record_feedback(entry, team="T1", user=user, run_id=run)

    assert give("good") is FeedbackOutcome.RECORDED
    assert give("good") is FeedbackOutcome.SAME  # a double click, or Slack sending it again
    assert give("bad") is FeedbackOutcome.RECORDED  # a change of mind counts
    assert give("good", user="UCAROL") is FeedbackOutcome.RECORDED  # someone else's is their own
    assert [(e["by"], e["feedback"]) for e in store.feedback_entries()] == [
        ("UBOB", "good"),
        ("UBOB", "bad"),
        ("UCAROL", "good"),
    ]
    assert store.audit_entries() == []  # never in the decisions' audit
    info = store.redis.xinfo_stream(Keys.feedback())
    assert info["length"] == 3
    assert store.redis.ttl(Keys.feedback_given(run_id, "UBOB")) > 0  # every mark expires


def test_one_person_is_recorded_at_most_their_share_of_a_minute(store: Store) -> None:
    outcomes = [
        store.record_feedback(
            {"event": "feedback", "run_id": run, "feedback": "good", "by": "UBOB"},
            team="T1",
            user="UBOB",
            run_id=run,
        )
        for run in (new_run_id() for _ in range(300))
    ]
    assert outcomes.count(FeedbackOutcome.RECORDED) == FEEDBACK_PER_MINUTE
    assert outcomes[FEEDBACK_PER_MINUTE:] == [FeedbackOutcome.LIMITED] * (300 - FEEDBACK_PER_MINUTE)
    assert len(store.feedback_entries(1000)) == FEEDBACK_PER_MINUTE
    assert 0 < store.redis.ttl(Keys.feedback_rate("T1", "UBOB")) <= 60  # the share comes back
    other = {"event": "feedback", "run_id": new_run_id(), "feedback": "bad", "by": "UCAROL"}
    assert (
        store.record_feedback(other, team="T1", user="UCAROL", run_id=other["run_id"])
        is FeedbackOutcome.RECORDED
    )
