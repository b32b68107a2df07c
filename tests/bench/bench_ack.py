"""Ack latency of `POST /slack/events`: 2,000 signed app_mentions over 50 connections from another process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from tests.bench.common import percentile, summary_ms, table
from tests.bench.load import cpu_seconds, write_requests
from tests.fakes.messages_api import FakeMessagesAPI, Reply, reply, text
from tests.fakes.signing import event_body, signed_headers
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import ROOT, SIGNING_SECRET, RedisServer, Stack, descendants

COMMAND = ".venv/bin/python -m tests.bench ack"
EVENTS = 2_000
CONCURRENCY = 50
WARMUP = 100
SERIAL = 200  # one connection, one request at a time: the service time without queueing
GOAL_P99_MS = 50.0
OPEN_RATES = (200, 400)
OPEN_EVENTS = 1_000


def build(slack: FakeSlackAPI, prefix: str, count: int) -> list[tuple[str, dict[str, str], str]]:
    """`count` signed mentions, each posted first in the fake Slack, in its own channel and thread."""
    out = []
    for i in range(count):
        channel = f"C{prefix.upper()}{i:05d}"
        text_ = f"<@UBOT> {prefix}{i}: say hi"
        ts = slack.add_message(channel, text_, user="UALICE")
        event = {"type": "app_mention", "user": "UALICE", "text": text_, "ts": ts, "channel": channel}
        body = event_body(event, event_id=f"Ev{prefix}{i:06d}{time.time_ns() % 10**6}")
        out.append((body, signed_headers(SIGNING_SECRET, body), "application/json"))
    return out


def load(
    stack: Stack, workdir: Path, name: str, requests: list[Any], concurrency: int, rate: float = 0.0
) -> dict[str, Any]:
    """Send `requests` from a second process (`python -m tests.bench.load`); its JSON result."""
    path = workdir / f"{name}.jsonl"
    write_requests(str(path), requests)
    args = [sys.executable, "-m", "tests.bench.load", "--url", stack.url, "--requests", str(path)]
    args += ["--concurrency", str(concurrency), "--rate", str(rate)]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    split: list[int] = []
    try:
        if concurrency > 1:
            time.sleep(1.0)
            split = connections_per_process(stack.port)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed ({proc.returncode}): {err[-2000:]}")
    return {**json.loads(out), "split": split}


def connections_per_process(port: int) -> list[int]:
    """Established connections to `port` held by each server process, most first (via `ss`)."""
    try:
        listing = subprocess.run(
            ["ss", "-tnpH", "state", "established", f"sport = :{port}"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout
    except OSError:
        return []
    return sorted(Counter(re.findall(r"pid=(\d+)", listing)).values(), reverse=True)


def answer(body: dict[str, Any]) -> Reply:
    return reply(text("hi"))


def measure() -> str:
    server = RedisServer().start()
    try:
        with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
            model.responder = answer
            with tempfile.TemporaryDirectory(prefix="bench-ack-") as tmp:
                stack = Stack(server.url, slack, model, Path(tmp))
                try:
                    return measure_stack(stack, Path(tmp), server)
                finally:
                    stack.stop()
    finally:
        server.cleanup()


def non_200(result: dict[str, Any]) -> int:
    return sum(result["statuses"].values()) - result["statuses"].get("200", 0)


def row(label: str, result: dict[str, Any]) -> list[object]:
    lat = result["latencies"]
    s = summary_ms(lat)
    rate = len(lat) / result["elapsed"]
    return [label, len(lat), s["p50"], percentile(lat, 90) * 1000, s["p99"], s["max"], rate, non_200(result)]


def measure_stack(stack: Stack, workdir: Path, server: RedisServer) -> str:
    bot = stack.start_bot()
    conn = redis.Redis.from_url(stack.redis_url)
    sent = 0

    def settle() -> None:  # the lazy :eyes: reactions of what was sent have all been made
        stack.slack.wait_for(lambda f: sum(1 for c in f.calls if c.method == "reactions.add") >= sent, 30)

    load(stack, workdir, "warmup", build(stack.slack, "ackwarm", WARMUP), 10)
    sent += WARMUP
    settle()

    requests = build(stack.slack, "ackload", EVENTS)
    web_pids = [bot.proc.pid, *descendants(bot.proc.pid)]
    assert server.proc is not None
    cpu_web, cpu_redis, cpu_here = cpu_seconds(web_pids), cpu_seconds([server.proc.pid]), time.process_time()
    result = load(stack, workdir, "load", requests, CONCURRENCY)
    sent += EVENTS
    settle()
    cpu_web, cpu_redis = cpu_seconds(web_pids) - cpu_web, cpu_seconds([server.proc.pid]) - cpu_redis
    cpu_here = time.process_time() - cpu_here

    extra, open_p99 = [], []
    for rate in OPEN_RATES:
        paced = load(
            stack, workdir, f"rate{rate}", build(stack.slack, f"ackrate{rate}", OPEN_EVENTS), 50, rate
        )
        sent += OPEN_EVENTS
        extra.append(row(f"open loop, {rate}/s offered", paced))
        open_p99.append((rate, summary_ms(paced["latencies"])["p99"]))
        settle()
    serial = load(stack, workdir, "serial", build(stack.slack, "ackserial", SERIAL), 1)
    sent += SERIAL
    settle()

    split = " / ".join(str(n) for n in result["split"])
    lat = result["latencies"]
    s, q = summary_ms(lat), summary_ms(serial["latencies"])
    queued = conn.llen("rq:queue:harness")
    tracebacks = bot.output().count("Traceback")
    eyes = sum(1 for c in stack.slack.calls if c.method == "reactions.add")
    rows = [
        row(f"{CONCURRENCY} connections, closed loop", result),
        *extra,
        row("1 connection, 1 at a time", serial),
    ]
    bad = sum(r[-1] for r in rows)  # type: ignore[misc]
    verdict = "meets" if s["p99"] < GOAL_P99_MS else "misses"
    cpu_ms = cpu_web / len(lat) * 1000
    return "\n".join(
        [
            "## Ack latency of `POST /slack/events`",
            "",
            f"`{COMMAND}` — one `python -m bot` (gunicorn: `WEB_CONCURRENCY` "
            "worker processes, default 2 × cores, × 4 threads). Signed "
            "`app_mention` callbacks, each with its own event_id, channel and thread, sent by "
            "`python -m tests.bench.load` (a second process) over keep-alive connections, after "
            f"{WARMUP} warm-up events. The headline is {EVENTS:,} events over {CONCURRENCY} connections, "
            "each sending its next request when it has the last answer (closed loop: the server is kept "
            f"saturated). Then {OPEN_EVENTS:,} events at a fixed offered rate (open loop, latency counted "
            f"from when each was due), and {SERIAL} over one connection. Latency is the client's. No "
            f"worker runs: the jobs stay queued ({queued:,} in `rq:queue:harness` at the end) in a "
            "private redis-server that is deleted afterwards.",
            "",
            table(["load", "events", "p50 ms", "p90 ms", "p99 ms", "max ms", "events/s", "non-200"], rows),
            "",
            f"During the {EVENTS:,}: web-process CPU {cpu_web:.1f} s = {cpu_ms:.1f} ms per event (master + "
            f"the gunicorn workers, including the :eyes: `reactions.add` each event triggers after its "
            f"answer); Redis {cpu_redis:.1f} s; the load generator {result['cpu']:.1f} s; this process "
            f"(the Slack stand-in answering those `reactions.add`) {cpu_here:.1f} s; over "
            f"{result['elapsed']:.1f} s of wall time on 2 cores. Keep-alive connections per gunicorn worker "
            f"during the load: {split or 'unknown'}. "
            f"`reactions.add` calls made in all: {eyes:,} of {sent:,}; tracebacks in the bot's log: "
            f"{tracebacks}; non-200 answers in all: {bad}.",
            "",
            f"Reading: under {CONCURRENCY} saturating connections p99 is {s['p99']:.0f} ms, which {verdict} "
            f"the 50 ms goal; all far inside Slack's 3 s. {reading(q, cpu_ms, result, bad, open_p99)}",
        ]
    )


def reading(
    q: dict[str, float], cpu_ms: float, result: dict[str, Any], bad: int, open_p99: list[tuple[int, float]]
) -> str:
    rate = len(result["latencies"]) / result["elapsed"]
    parts = [
        f"Alone, an ack takes {q['p50']:.1f} ms (p50), about its CPU cost of {cpu_ms:.1f} ms: signature "
        "check and Bolt's dispatch, three Redis round "
        "trips (WATCH, EXISTS, MULTI…EXEC holding the dedup mark, the run record and the RQ job) and "
        "RQ's job pickling; the :eyes: call runs after the answer, on a background thread.",
        f"With {CONCURRENCY} connections always busy the request mostly waits its turn: by Little's law "
        f"p50 ≈ {CONCURRENCY} / {rate:,.0f} per s = {CONCURRENCY / rate * 1000:.0f} ms. Each gunicorn worker "
        "is one process under one GIL (at most one core), and a keep-alive connection stays with the "
        "worker that accepted it, so the split above is uneven and the busier worker's connections "
        "make the slow half of the distribution (p90/p99 ≈ 2× p50). The 2 cores are shared with the load "
        "generator and the Slack stand-in.",
        "At an offered rate below capacity the queue stays short: p99 is "
        + ", ".join(f"{p99:.0f} ms at {r}/s" for r, p99 in open_p99)
        + f" (saturated capacity in this run ≈ {rate:,.0f}/s); the worst single acks (max column) are "
        "stalls of a ~100–200 ms, not queueing. Slack's 3 s is never at risk.",
    ]
    parts.append(f"{bad} answers were not 200." if bad else "Every answer was a 200.")
    return " ".join(parts)


def run() -> str:
    try:
        return measure()
    except Exception:  # a benchmark that breaks reports it, it does not stop the others
        return "## Ack latency of `POST /slack/events`\n\nFailed:\n\n```\n" + traceback.format_exc() + "```\n"
