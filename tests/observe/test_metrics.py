"""The metrics module on a real Redis: bounded labels, exactly-once run accounting, the collector's
Prometheus text, and writes that never raise when Redis is gone."""

from __future__ import annotations

import logging
import re
import time

import pytest
import redis
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis.backoff import NoBackoff
from redis.retry import Retry

from harness import texts as harness_texts
from harness.config import Approvals
from harness.loop import TurnDone
from harness.policy import Tier
from harness.state import Decision, PendingCall, RunState, Usage, Verdict
from harness.tools import ToolResult
from harness.valves import Valve
from observe import families, metrics
from observe import scrape as scraping
from runtime.queue import make_queue
from store import RunRecord, RunStatus, new_run_id
from store.keys import Keys
from tests.stack import free_port, wait_until


def scrape(conn: redis.Redis) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the collector's text, by (name, sorted labels)."""
    text = generate_latest(scraping.registry(conn, make_queue(conn))).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def call(tier: Tier, *, verdict: Verdict | None = None, result: ToolResult | None = None) -> PendingCall:
    decision = Decision(verdict, by="UANN") if verdict else None
    return PendingCall(f"toolu_{time.time_ns()}", "write_file", {"path": "a"}, tier, decision, result)


OK = ToolResult("done")
STOPPED_NOTE = harness_texts.RESULT_NOT_RUN_STOPPED.format(valve=Valve.STOPPED_BY_USER)
BROKEN = ToolResult("Error: no such file", is_error=True)


@pytest.mark.parametrize(
    ("pending", "outcome"),
    [
        (call(Tier.ALLOW, result=OK), "ran"),
        (call(Tier.ALLOW, result=BROKEN), "error"),
        (call(Tier.ASK, verdict=Verdict.APPROVED, result=OK), "ran"),
        (call(Tier.ASK, verdict=Verdict.DECLINED, result=ToolResult("Not executed", True)), "declined"),
        (call(Tier.ASK, verdict=Verdict.EXPIRED, result=ToolResult("expired", True)), "expired"),
        (call(Tier.DENY, result=ToolResult("forbidden", True)), "denied"),
        (
            call(Tier.ALLOW, result=ToolResult(harness_texts.RESULT_NOT_RUN_STOPPED.format(valve="x"), True)),
            "error",  # not a valve's note: a tool may say anything
        ),
        (
            call(
                Tier.ASK,
                verdict=Verdict.APPROVED,
                result=ToolResult(
                    harness_texts.RESULT_NOT_RUN_STOPPED.format(valve=Valve.STOPPED_BY_USER), True
                ),
            ),
            "not_run",
        ),
        (
            call(
                Tier.ALLOW,
                result=ToolResult(harness_texts.RESULT_OUTCOME_UNKNOWN.format(name="write_file"), True),
            ),
            "unknown",
        ),
    ],
)
def test_what_became_of_a_call_is_one_of_a_few_outcomes(pending: PendingCall, outcome: str) -> None:
    assert metrics.call_outcome(pending) == outcome


def test_a_label_value_outside_its_list_counts_as_other_so_label_sets_stay_bounded(conn: redis.Redis) -> None:
    metrics.mention(conn, "new")
    for _ in range(50):  # ids, free text: never a label value of their own
        metrics.mention(conn, new_run_id())
        metrics.incr(conn, metrics.RUNS, outcome="stopped", valve=f"U{time.time_ns()}")
    metrics.observe(conn, families.ACK_SECONDS, 0.02, kind="C0123 channel")

    fields = {f.decode() if isinstance(f, bytes) else f for f in conn.hkeys(Keys.metric_counters())}
    assert fields == {
        "c|harness_mentions|new",
        "c|harness_mentions|other",
        "c|harness_runs_ended|stopped|other",
        "b|harness_ack_seconds|other|0.025",
        "s|harness_ack_seconds|other",
    }
    samples = scrape(conn)
    assert samples[("harness_mentions_total", (("result", "other"),))] == 50
    assert samples[("harness_mentions_total", (("result", "new"),))] == 1
    assert samples[("harness_runs_ended_total", (("outcome", "stopped"), ("valve", "other")))] == 50


def test_every_family_declares_only_fixed_label_values() -> None:
    """A fixed list, or a pattern of the config's own bounded names (a profile's): never an id."""
    for family in families.FAMILIES:
        for name, allowed in family.labels.items():
            if isinstance(allowed, families.ToolNames):  # bounded by the config: `tool_label` maps first
                assert metrics.tool_label("U0123ABCD", "") == families.OTHER, (family.name, name)
                assert not allowed.shape.fullmatch("a|b") and not allowed.shape.fullmatch("a" * 65)
            elif isinstance(allowed, re.Pattern):
                assert not allowed.fullmatch("a|b") and not allowed.fullmatch("a" * 33), (family.name, name)
                assert not allowed.fullmatch("U0123ABCD") and not allowed.fullmatch("C0123ABCD")
            else:
                fixed = all(isinstance(v, str) and "|" not in v for v in allowed)
                assert allowed and fixed, (family.name, name)
            assert name not in ("run_id", "user", "channel", "team", "thread_ts")


def test_a_step_counts_the_state_totals_as_deltas_and_a_turns_calls_once(conn: redis.Redis) -> None:
    run_id = new_run_id()
    calls = (call(Tier.ALLOW, result=OK), call(Tier.ASK, verdict=Verdict.APPROVED, result=OK))
    state = RunState(messages=(), turns=1, requests=1, usage=Usage(100, 10, 5, 1))
    done = TurnDone(1, calls, state.usage.total)

    metrics.stepped(conn, run_id, state, (done,))
    metrics.stepped(conn, run_id, state, (done,))  # a driver re-doing the step after a crash
    later = RunState(messages=(), turns=1, requests=2, usage=Usage(250, 30, 5, 1))
    metrics.stepped(conn, run_id, later, ())

    samples = scrape(conn)
    assert samples[("harness_turns_total", ())] == 1
    assert samples[("harness_model_requests_total", ())] == 2
    tokens = {k: samples[("harness_tokens_total", (("kind", k),))] for k in metrics.TOKEN_KINDS}
    assert tokens == {"input": 250, "output": 30, "cache_creation": 5, "cache_read": 1}
    tools = {k[1]: v for k, v in samples.items() if k[0] == "harness_tool_calls_total"}
    assert tools == {(("outcome", "ran"), ("tier", "allow")): 1, (("outcome", "ran"), ("tier", "ask")): 1}
    assert 0 < conn.ttl(Keys.metric_run(run_id)) <= metrics.RUN_MARK_TTL


def test_the_collector_shows_cumulative_buckets_sums_and_the_gauges_read_at_scrape(conn: redis.Redis) -> None:
    for seconds in (0.2, 0.7, 90.0):
        metrics.observe(conn, metrics.RESUME_SECONDS, seconds)
    now = time.time()
    open_park, past_park = f"{new_run_id()}:1", f"{new_run_id()}:1"
    conn.zadd(Keys.expiries(), {open_park: now + 600, past_park: now - 1})
    conn.zadd(Keys.active(), {new_run_id(): now})
    conn.rpush(make_queue(conn).key, "job-a", "job-b")

    samples = scrape(conn)
    bucket = {
        dict(k[1])["le"]: v for k, v in samples.items() if k[0] == "harness_click_to_resume_seconds_bucket"
    }
    assert bucket["0.1"] == 0 and bucket["0.25"] == 1 and bucket["1.0"] == 2 and bucket["60.0"] == 2
    assert bucket["+Inf"] == 3 == samples[("harness_click_to_resume_seconds_count", ())]
    assert samples[("harness_click_to_resume_seconds_sum", ())] == pytest.approx(90.9)
    assert samples[("harness_approvals_pending", ())] == 1  # the other park's time has passed
    assert samples[("harness_runs_active", ())] == 1
    assert samples[("harness_queue_depth", ())] == 2
    assert samples[("harness_turns_total", ())] == 0  # an unlabelled counter is there from the start


def test_a_click_then_the_resume_observes_the_time_between_once(conn: redis.Redis) -> None:
    record = RunRecord(new_run_id(), "T1", "C1", "1.2", "UALICE", "task", status=RunStatus.AWAITING_APPROVAL)
    record.park_id, record.expires_at = 1, time.time() + 3600 - 42  # parked 42 s ago (60 min expiry)
    metrics.decided(conn, record, Verdict.APPROVED, Approvals(expire_after_minutes=60))
    decisions = {"toolu_1": Decision(Verdict.APPROVED, by="UANN")}
    metrics.resumed(conn, record.run_id, 1, decisions)
    metrics.resumed(conn, record.run_id, 1, decisions)  # a second driver: nothing left to observe

    samples = scrape(conn)
    assert samples[("harness_click_to_resume_seconds_count", ())] == 1
    assert samples[("harness_approval_decision_seconds_count", (("verdict", "approved"),))] == 1
    assert samples[("harness_approval_decision_seconds_sum", (("verdict", "approved"),))] == pytest.approx(
        42, abs=5
    )


def test_a_park_completed_by_its_expiry_forgets_the_click_and_observes_nothing(conn: redis.Redis) -> None:
    record = RunRecord(new_run_id(), "T1", "C1", "1.2", "UALICE", "task", status=RunStatus.AWAITING_APPROVAL)
    record.park_id, record.expires_at = 1, time.time() + 3600
    metrics.decided(conn, record, Verdict.APPROVED, Approvals(expire_after_minutes=60))
    decisions = {"toolu_1": Decision(Verdict.APPROVED, by="UANN"), "toolu_2": Decision(Verdict.EXPIRED)}
    metrics.resumed(conn, record.run_id, 1, decisions)
    assert scrape(conn)[("harness_click_to_resume_seconds_count", ())] == 0
    assert conn.exists(Keys.metric_clicked(record.run_id, 1)) == 0


def test_the_click_to_resume_time_lands_in_its_bucket(conn: redis.Redis) -> None:
    record = RunRecord(new_run_id(), "T1", "C1", "1.2", "UALICE", "task", status=RunStatus.AWAITING_APPROVAL)
    conn.set(Keys.metric_clicked(record.run_id, 3), repr(time.time() - 3.0))  # clicked 3 s ago
    metrics.resumed(conn, record.run_id, 3, {"toolu_1": Decision(Verdict.APPROVED, by="UANN")})
    samples = scrape(conn)
    buckets = {
        dict(labels)["le"]: v
        for (name, labels), v in samples.items()
        if name == "harness_click_to_resume_seconds_bucket"
    }
    assert buckets["2.5"] == 0 and buckets["5.0"] == 1 and buckets["+Inf"] == 1
    assert samples[("harness_click_to_resume_seconds_sum", ())] == pytest.approx(3.0, abs=1.0)


def test_no_write_raises_when_redis_is_gone_and_the_failure_is_logged_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics._Warned, "done", False)
    # No retries: redis-py's default retries would only make the same failure slower to see.
    gone = redis.Redis(
        port=free_port(), socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    record = RunRecord(new_run_id(), "T1", "C1", "1.2", "UALICE", "task", status=RunStatus.FINISHED)
    record.expires_at = time.time()
    state = RunState(messages=(), turns=1, requests=1)
    with caplog.at_level(logging.DEBUG, logger="observe.metrics"):
        metrics.mention(gone, "new")
        metrics.observe(gone, families.ACK_SECONDS, 0.1, kind="event")
        metrics.stepped(gone, record.run_id, state, (TurnDone(1, (call(Tier.ALLOW, result=OK),), 5),))
        metrics.run_ended(gone, record, "")
        metrics.decided(gone, record, Verdict.DECLINED, Approvals())
        metrics.resumed(gone, record.run_id, 1, {})
        gathered = metrics.Gathered(gone, every=3600)
        gathered.observe(families.ACK_SECONDS, 0.1, kind="event")
        gathered.flush()
    warnings = [r for r in caplog.records if r.name == "observe.metrics" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "said once per process" in warnings[0].getMessage()
    assert sum(r.levelno == logging.DEBUG for r in caplog.records if r.name == "observe.metrics") >= 6


def test_accept_event_counts_each_mention_by_its_outcome_as_mention_would(conn: redis.Redis) -> None:
    from runtime.queue import queued_job
    from store import Store

    store, queue = Store(conn), make_queue(conn)

    def deliver(event: str) -> None:
        run = RunRecord(
            run_id=new_run_id(), team="T1", channel="C1", thread_ts="1.1", requester="UA", task=""
        )
        job = queued_job(queue, "workers.jobs.start_run", run.run_id, job_id=new_run_id())
        store.admission.accept_event(
            "T1", event, run, job, max_per_user=1, max_per_channel=5, counted_in=metrics.mention_counter()
        )

    deliver("Ev1")
    deliver("Ev1")  # Slack's retry
    deliver("Ev2")  # UA has their one run going
    samples = scrape(conn)
    for result, count in (("new", 1), ("duplicate", 1), ("user_busy", 1)):
        assert samples[("harness_mentions_total", (("result", result),))] == count
    assert ("harness_mentions_total", (("result", "channel_busy"),)) not in samples


def test_gathered_observations_are_written_together_and_count_as_one_by_one_would(conn: redis.Redis) -> None:
    gathered = metrics.Gathered(conn, every=3600)  # this test writes them itself
    for seconds in (0.002, 0.004, 0.02, 0.3, 7.0, 0.004):
        gathered.observe(families.ACK_SECONDS, seconds, kind="event")
    gathered.observe(families.ACK_SECONDS, 0.004, kind="interaction")
    assert ("harness_ack_seconds_count", (("kind", "event"),)) not in scrape(conn)  # nothing yet
    gathered.flush()
    samples = scrape(conn)
    assert samples[("harness_ack_seconds_count", (("kind", "event"),))] == 6
    assert samples[("harness_ack_seconds_sum", (("kind", "event"),))] == pytest.approx(7.33)
    assert samples[("harness_ack_seconds_bucket", (("kind", "event"), ("le", "0.005")))] == 3
    assert samples[("harness_ack_seconds_count", (("kind", "interaction"),))] == 1
    gathered.flush()  # nothing gathered since: nothing written twice
    assert scrape(conn)[("harness_ack_seconds_count", (("kind", "event"),))] == 6
    metrics.observe(conn, families.ACK_SECONDS, 0.004, kind="event")
    assert scrape(conn)[("harness_ack_seconds_count", (("kind", "event"),))] == 7


def test_gathered_observations_are_written_by_their_timer(conn: redis.Redis) -> None:
    gathered = metrics.Gathered(conn, every=0.05)
    gathered.observe(families.ACK_SECONDS, 0.01, kind="interaction")
    gathered.observe(families.ACK_SECONDS, 0.01, kind="interaction")
    key = ("harness_ack_seconds_count", (("kind", "interaction"),))
    wait_until(lambda: scrape(conn).get(key) == 2)
    gathered.observe(families.ACK_SECONDS, 0.01, kind="interaction")  # the next second arms it again
    wait_until(lambda: scrape(conn).get(key) == 3)
