"""Daily budgets end to end: the real bot and TWO real `python -m workers` on one Redis, the loopback
Slack and Messages API. Several runs race in one channel against a small `per_channel_daily_tokens`
of its profile; the day's spend may pass the budget by at most one request's usage."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from store import utc_day
from store.keys import Keys
from tests.fakes.messages_api import FakeMessagesAPI, Reply, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.observe.test_metrics_access import get
from tests.stack import ROOT, RedisServer, Stack, thread, wait_until

pytestmark = pytest.mark.e2e

BUDGET = 3_000
COST = 400  # what each request costs: input 350 + output 50
TOKEN = "budgets-metrics-token-0123456789"
CONFIG = f"""
[limits]
max_runs_per_user = 1000
max_runs_per_channel = 1000
max_turns = 100
max_tokens = 200
[[profiles]]
name = "ops"
channels = ["CBUDGET"]
[profiles.budgets]
per_channel_daily_tokens = {BUDGET}
"""


class Spender:
    """Every request reads one more file (never the same call twice), costs COST tokens, and takes a
    model's moment; it notes how many requests were in flight together."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.costs: list[int] = []
        self.in_flight = self.most_in_flight = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            n = len(self.costs)
            self.costs.append(COST)
        try:
            time.sleep(0.1)  # the model's latency: what lets two workers' requests overlap
            usage = {"input_tokens": COST - 50, "output_tokens": 50}
            return reply(tool_use("read_file", {"path": f"missing-{n}.txt"}), usage=usage)
        finally:
            with self.lock:
                self.in_flight -= 1


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A Redis of its own, a bot and two workers."""
    server = RedisServer().start()
    spender = Spender()
    try:
        with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
            model.responder = spender
            workdir = tmp_path_factory.mktemp("budgets")
            stack = Stack(
                server.url, slack, model, workdir, config=CONFIG, extra_env={"METRICS_TOKEN": TOKEN}
            )
            stack.spender = spender  # type: ignore[attr-defined]
            try:
                stack.start_bot()
                stack.start_worker()
                stack.start_worker()
                yield stack
            finally:
                stack.stop()
    finally:
        server.cleanup()


def spent_today(stack: Stack) -> int:
    day = utc_day(datetime.now(UTC).timestamp())
    raw = redis.Redis.from_url(stack.redis_url).hget(Keys.budget_spent(day), "channel|T1|CBUDGET")
    return int(raw or 0)


def test_concurrent_runs_on_two_workers_overspend_the_channels_budget_by_at_most_one_request(
    stack: Stack,
) -> None:
    spender: Spender = stack.spender  # type: ignore[attr-defined]
    mentions = [stack.mention(f"task {i}", channel="CBUDGET", user=f"UUSER{i}")[1] for i in range(5)]
    stack.settled(timeout=90)

    spent = spent_today(stack)
    assert spent == sum(spender.costs)  # every request the Messages API served is counted, once
    assert BUDGET <= spent <= BUDGET + max(spender.costs), (spent, len(spender.costs))
    assert spender.most_in_flight >= 2  # the two workers' requests did race
    posts = [m for ts in mentions for m in thread(stack, "CBUDGET", ts)]
    stops = [m for m in posts if "Stopped at a daily budget" in m["text"]]
    assert len(stops) == len(mentions)  # every run stopped by the budget valve, mid-way
    said = stops[0]["text"]
    assert "this channel's daily budget under profile `ops` of 3,000 tokens" in said
    assert "(`per_channel_daily_tokens`) is spent" in said and "It resets at 00:00 UTC, in " in said

    # A mention once it is spent: one ephemeral reply to the requester, and nothing starts.
    served = len(stack.model.requests)
    _, ts, event_id = stack.mention("one more", channel="CBUDGET", user="UBOB")
    reply_to_bob = wait_until(lambda: [e for e in stack.slack.ephemerals if e["user"] == "UBOB"])
    assert len(reply_to_bob) == 1 and reply_to_bob[0]["thread_ts"] == ts
    assert (
        "This channel has used its daily budget under profile `ops` of 3,000 tokens"
        in reply_to_bob[0]["text"]
    )
    assert "nothing was started. It resets at 00:00 UTC, in " in reply_to_bob[0]["text"]
    stack.settled()
    assert len(stack.model.requests) == served and thread(stack, "CBUDGET", ts) == []

    # /metrics: the spend per profile.
    status, body, _ = get(stack.url + "/metrics", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and f'harness_budget_tokens_total{{profile="ops"}} {float(spent)}' in body
    assert 'harness_runs_ended_total{outcome="stopped",valve="budget"} 5.0' in body

    # `python -m workers status`: who is near a budget.
    shown = subprocess.run(
        [sys.executable, "-m", "workers", "status"],
        cwd=ROOT,
        env=stack.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    line = f"  channel CBUDGET in T1: {spent:,} of 3,000 tokens ({spent / BUDGET:.0%}), profile ops"
    assert line in shown.stdout, shown.stdout


def test_a_channel_without_a_budget_still_runs_and_its_spend_is_counted_at_the_top_level(
    stack: Stack,
) -> None:
    stack.model.script(
        reply(tool_use("get_time", {}), usage={"input_tokens": 100, "output_tokens": 20}),
        reply(text("It is noon."), usage={"input_tokens": 130, "output_tokens": 10}),
    )
    _, ts, _ = stack.mention("what time is it", channel="CFREE", user="UBOB")
    wait_until(lambda: any("That took" in m["text"] for m in thread(stack, "CFREE", ts)), 60)
    stack.settled()
    assert not any("budget" in m["text"] for m in thread(stack, "CFREE", ts))
    _, body, _ = get(stack.url + "/metrics", {"Authorization": f"Bearer {TOKEN}"})
    assert 'harness_budget_tokens_total{profile=""} 260.0' in body
