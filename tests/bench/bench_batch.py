"""Approve all on a 10-call park against one Approve on a 1-call park: click → resumed model request.

Issue 21's goal: Approve all resumes the run as fast as one Approve does (p50 ≤ 25 ms). Runs of
both kinds are parked first, then clicked one at a time, alternating, on one stack (default worker).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from tests.bench.bench_latency import UNLIMITED, Model, StampedSlack, idle, post_mention
from tests.bench.common import percentile, table
from tests.fakes.messages_api import FakeMessagesAPI, Reply, reply, text, tool_use
from tests.stack import RedisServer, Stack, wait_until

COMMAND = ".venv/bin/python -m tests.bench batch"
SAMPLES = 30
CALLS = 10
GOAL_P50_MS = 25.0
ACTIONS = ("approve_all", "approve", "last")


class BatchModel(Model):
    """Markers `latb…` ask for ten writes in one reply, `latc…` for one; then the answer."""

    def __call__(self, body: dict[str, Any]) -> Reply:
        super().__call__(body)  # notes the arrival
        first = body["messages"][0]["content"]
        task = first if isinstance(first, str) else " ".join(b.get("text", "") for b in first)
        marker = next((w.rstrip(":") for w in task.split() if w.startswith("lat")), "?")
        if len(body["messages"]) == 1:
            n = 1 if marker.startswith("latc") else CALLS
            return reply(
                *(tool_use("write_file", {"path": f"{marker}-{i}.txt", "content": "y"}) for i in range(n))
            )
        return reply(text(f"{marker} done"))


def _button(message: dict[str, Any], action_id: str) -> bool:
    blocks = message.get("blocks") or []
    return any(
        e.get("action_id") == action_id for b in blocks if b["type"] == "actions" for e in b["elements"]
    )


def _with_button(stack: Stack, channel: str, ts: str, action: str, count: int) -> list[dict[str, Any]] | None:
    """The thread's messages with button `action`, once there are `count` of them."""
    found = [m for m in stack.slack.messages(channel, ts) if _button(m, action)]
    return found if len(found) >= count else None


def samples(stack: Stack, model: BatchModel) -> dict[str, list[float]]:
    conn = redis.Redis.from_url(stack.redis_url)
    parked = []
    for i in range(SAMPLES + 2):
        for kind, action in (("latb", "approve_all"), ("latc", "approve"), ("latd", "last")):
            marker, channel = f"{kind}{i}", f"C{kind.upper()}{i}"
            ts, _, _ = post_mention(stack, channel, f"{marker}: write files")
            parked.append((marker, channel, ts, action))
    clicks = []
    for marker, channel, ts, action in parked:
        want, count = ("approve", CALLS) if action == "last" else (action, 1)
        found = wait_until(lambda c=channel, t=ts, w=want, n=count: _with_button(stack, c, t, w, n), 60)
        clicks.append((marker, channel, ts, action, found))
    wait_until(lambda: idle(conn), 60, 0.005)
    out: dict[str, list[float]] = {k: [] for a in ACTIONS for k in (a, f"{a} ack")}
    for n, (marker, channel, ts, action, found) in enumerate(clicks):
        if action == "last":  # the first nine decided one by one, untimed
            for card in found[:-1]:
                assert stack.click(card, "approve") == 200
            wait_until(lambda: idle(conn), 20, 0.005)
        time.sleep(0.05)  # a pause between samples (the worker is idle already), not a synchronisation
        sent = time.perf_counter()
        assert stack.click(found[-1], "approve" if action == "last" else action) == 200
        acked = time.perf_counter()
        asked = model.arrival(marker, 2)
        wait_until(
            lambda c=channel, t=ts, m=marker: any(
                f"{m} done" in x["text"] for x in stack.slack.messages(c, t)
            ),
            20,
            0.005,
        )
        wait_until(lambda: idle(conn), 20, 0.005)
        if n >= 2 * len(ACTIONS):  # two of each to warm up
            out[action].append(asked - sent)
            out[f"{action} ack"].append(acked - sent)
    return out


def run() -> str:
    server = RedisServer().start()
    try:
        with StampedSlack() as slack, FakeMessagesAPI() as api, tempfile.TemporaryDirectory() as tmp:
            model = BatchModel()
            api.responder = model
            stack = Stack(server.url, slack, api, Path(tmp), config=UNLIMITED)
            try:
                stack.start_bot()
                stack.start_worker()
                found = samples(stack, model)
            finally:
                stack.stop()
    finally:
        server.cleanup()
    labels = (
        (f"Approve all, {CALLS}-call park", "approve_all"),
        ("Approve, 1-call park", "approve"),
        (f"Approve of the last open call, {CALLS}-call park", "last"),
    )
    rows = [
        [label, *(f"{percentile(found[k], p) * 1000:.1f}" for k in (key, f"{key} ack") for p in (50, 99))]
        for label, key in labels
    ]
    return "\n".join(
        [
            "## Approve all: click → resumed model request",
            "",
            f"`{COMMAND}`: {SAMPLES} clicks of each, alternating, default worker; "
            f"goal p50 ≤ {GOAL_P50_MS:g} ms. The resumed request comes after the approved calls ran.",
            "",
            table(["click", "→ request p50 ms", "p99", "ack p50 ms", "p99"], rows),
        ]
    )
