"""Ack of a mention: ours against the Bolt app a Bolt user would write, side by side.

The servers run at once on one private redis-server (a database each) and one Slack stand-in;
the loads go to them in turns, in blocks, so a noisy neighbour on the machine hits them alike.
Each block's CPU is read from /proc for every process of the server's tree, after the block has
settled (every job in the queue; for ours every :eyes: made).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tests.bench.common import machine, percentile, table
from tests.bench.load import cpu_seconds, write_requests
from tests.fakes.messages_api import FakeMessagesAPI
from tests.fakes.signing import event_body, signed_headers
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import ROOT, SIGNING_SECRET, Process, RedisServer, Stack, descendants, wait_until

COMMAND = ".venv/bin/python -m tests.bench ack"
TITLE = "## Ack of a mention: ours against a plain Bolt app"
# Thousands of mentions from one user: the per-user and per-channel caps would answer most "busy".
UNCAPPED = "[limits]\nmax_runs_per_user = 100000\nmax_runs_per_channel = 100000\n"
GOAL_RATE = 85  # mentions/s: ten times Slack's event rate limit for one workspace
GOAL_P99_MS = 10.0
ROUNDS = 4  # blocks per contender and load, alternating
RATE_BLOCK = 425  # events per block at GOAL_RATE: 5 s
SATURATED_BLOCK = 500
SATURATED_CONCURRENCY = 50
SERIAL_BLOCK = 50
WARMUP = 100
EYES_THREAD = "slack-after"  # the OS name of ours' after-the-answer threads (bot.listening.Background)
WARMUP_IN_PROCESS = 300  # tests.bench.ack_inprocess.WARMUP


@dataclass
class Contender:
    name: str
    stack: Stack
    process: Process
    queue: redis.Redis
    slack_calls: Callable[[], int]  # Slack calls it makes after the answer, counted by the stand-in
    sent: int = 0

    def pids(self) -> list[int]:
        return [self.process.proc.pid, *descendants(self.process.proc.pid)]

    def settle(self) -> None:
        """Wait until what was sent has fully happened: every job queued, every :eyes: made."""
        queued = lambda: self.queue.llen("rq:queue:harness")  # noqa: E731
        try:
            wait_until(lambda: queued() >= self.sent, timeout=60)
        except AssertionError as exc:
            raise AssertionError(
                f"{self.name}: {queued()} jobs for {self.sent} sent\n{self.process.output()[-3000:]}"
            ) from exc
        wait_until(lambda: self.slack_calls() >= (self.sent if self.name == "ours" else 0), timeout=60)


@dataclass
class Block:
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    cpu: float = 0.0  # the server's process tree
    eyes_cpu: float = 0.0  # of which ours' :eyes: threads
    redis_cpu: float = 0.0
    elapsed: float = 0.0

    def add(self, other: Block) -> None:
        self.latencies += other.latencies
        self.statuses.update(other.statuses)
        self.cpu += other.cpu
        self.eyes_cpu += other.eyes_cpu
        self.redis_cpu += other.redis_cpu
        self.elapsed += other.elapsed


def build(slack: FakeSlackAPI, prefix: str, count: int) -> list[tuple[str, dict[str, str], str]]:
    """`count` signed mentions, each posted first in the fake Slack, in its own channel and thread."""
    out = []
    stamp = time.time_ns() % 10**6
    for i in range(count):
        channel = f"C{prefix.upper()}{i:05d}"
        text_ = f"<@UBOT> {prefix}{i}: say hi"
        ts = slack.add_message(channel, text_, user="UALICE")
        event = {"type": "app_mention", "user": "UALICE", "text": text_, "ts": ts, "channel": channel}
        body = event_body(event, event_id=f"Ev{prefix}{i:06d}{stamp}")
        out.append((body, signed_headers(SIGNING_SECRET, body), "application/json"))
    return out


def send(url: str, workdir: Path, requests: list[Any], concurrency: int, rate: float = 0.0) -> dict[str, Any]:
    """Send `requests` from a second process (`python -m tests.bench.load`); its JSON result."""
    path = workdir / "requests.jsonl"
    write_requests(str(path), requests)
    args = [sys.executable, "-m", "tests.bench.load", "--url", url, "--requests", str(path)]
    args += ["--concurrency", str(concurrency), "--rate", str(rate)]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout))


def thread_cpu(pids: list[int], name: str) -> float:
    """CPU seconds so far of the threads called `name` (their OS name) in processes `pids`."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as handle:
                    stat = handle.read()
            except OSError:
                continue
            comm, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rsplit(")", 1)[1].split()
            if comm == name:
                total += int(fields[11]) + int(fields[12])
    return total / tick


def block(
    who: Contender, redis_pid: int, workdir: Path, count: int, concurrency: int, rate: float = 0.0
) -> Block:
    """One block of `count` mentions to `who`; its latencies and the CPU it cost, settled."""
    requests = build(who.stack.slack, f"{who.name.replace('-', '')}{who.sent}", count)  # ids: no dashes
    pids = who.pids()
    cpu, eyes, rcpu = cpu_seconds(pids), thread_cpu(pids, EYES_THREAD), cpu_seconds([redis_pid])
    result = send(who.stack.url, workdir, requests, concurrency, rate)
    who.sent += count
    who.settle()
    pids = who.pids()
    return Block(
        latencies=result["latencies"],
        statuses=Counter(result["statuses"]),
        cpu=cpu_seconds(pids) - cpu,
        eyes_cpu=thread_cpu(pids, EYES_THREAD) - eyes,
        redis_cpu=cpu_seconds([redis_pid]) - rcpu,
        elapsed=result["elapsed"],
    )


LOADS = (
    (f"open loop, {GOAL_RATE}/s offered", RATE_BLOCK, 50, float(GOAL_RATE)),
    (f"{SATURATED_CONCURRENCY} connections, closed loop", SATURATED_BLOCK, SATURATED_CONCURRENCY, 0.0),
    ("1 connection, 1 at a time", SERIAL_BLOCK, 1, 0.0),
)


def measure() -> str:
    figures = measure_http()
    found = in_process()
    return "\n".join(
        [
            figures,
            "",
            f"Without the HTTP server (`python -m tests.bench.ack_inprocess APP`): each app's WSGI callable "
            f"driven in one process, {IN_PROCESS_COUNT:,} mentions after {WARMUP_IN_PROCESS} warm-up ones, "
            "the Slack stand-in in another process; CPU of the whole process (every thread) once every "
            "job is queued and every :eyes: made. `ours-without-eyes` is ours with the :eyes: call "
            f"replaced by nothing. {IN_PROCESS_ROUNDS} rounds, the apps in turns.",
            "",
            in_process_table(found),
        ]
    )


def measure_http() -> str:
    server = RedisServer().start()
    assert server.proc is not None
    try:
        with (
            FakeSlackAPI(bot_token="xoxb-test") as slack,
            FakeMessagesAPI() as model,
            tempfile.TemporaryDirectory(prefix="bench-ack-") as tmp,
        ):
            workdir, base = Path(tmp), server.url.rsplit("/", 1)[0]
            stacks = [
                Stack(f"{base}/{db}", slack, model, workdir / name, config=UNCAPPED)
                for db, name in enumerate(APPS)
            ]
            try:
                apps = [
                    Contender(name, stack, start(stack, module), redis.Redis.from_url(stack.redis_url), made)
                    for (name, module, made), stack in zip(
                        (
                            ("ours", "bot", lambda: len(slack.reactions)),
                            ("ours-without-eyes", "tests.bench.bot_without_eyes", lambda: 0),
                            ("peer", "tests.bench.plain_bolt_app", lambda: 0),
                        ),
                        stacks,
                        strict=True,
                    )
                ]
                return measure_all(apps, server.proc.pid, workdir)
            finally:
                for stack in stacks:
                    stack.stop()
    finally:
        server.cleanup()


APPS = ("ours", "ours-without-eyes", "peer")


def start(stack: Stack, module: str) -> Process:
    app = stack.spawn(module, "-m", module)
    wait_until(lambda: stack.healthz() or app.proc.poll() is not None, 30)  # the peer answers 404: up
    assert app.proc.poll() is None, app.output()
    return app


def measure_all(apps: list[Contender], redis_pid: int, workdir: Path) -> str:
    for who in apps:
        block(who, redis_pid, workdir, WARMUP, 10)
    results: dict[tuple[str, str], Block] = {}
    for label, count, concurrency, rate in LOADS:
        for r in range(ROUNDS):
            for who in apps[r % len(apps) :] + apps[: r % len(apps)]:  # each app first in turn
                done = block(who, redis_pid, workdir, count, concurrency, rate)
                results.setdefault((label, who.name), Block()).add(done)
    return report(results, check(apps))


IN_PROCESS_APPS = ("ours", "ours-without-eyes", "peer")
IN_PROCESS_ROUNDS = 3
IN_PROCESS_COUNT = 2000


def in_process() -> dict[str, list[dict[str, float]]]:
    """`python -m tests.bench.ack_inprocess` for each app, in turns (a fresh process each time)."""
    found: dict[str, list[dict[str, float]]] = {app: [] for app in IN_PROCESS_APPS}
    for r in range(IN_PROCESS_ROUNDS):
        for app in IN_PROCESS_APPS if r % 2 == 0 else IN_PROCESS_APPS[::-1]:
            args = [sys.executable, "-m", "tests.bench.ack_inprocess", app, str(IN_PROCESS_COUNT)]
            done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"ack_inprocess {app} failed: {done.stderr[-2000:]}")
            found[app].append(json.loads(done.stdout.splitlines()[-1]))
    return found


def in_process_table(found: dict[str, list[dict[str, float]]]) -> str:
    rows = []
    for app, runs in found.items():
        cpu = sorted(r["cpu_ms"] for r in runs)
        thread = statistics.median(r["request_thread_ms"] for r in runs)
        rows.append([app, len(runs), statistics.median(cpu), cpu[0], cpu[-1], thread])
    headers = ["app", "runs", "CPU ms/ack (median)", "min", "max", "of which the answering thread"]
    return table(headers, rows)


def check(apps: list[Contender]) -> dict[str, Any]:
    """Every acked mention enqueued exactly one job, and ours made one :eyes: for each."""
    found = {}
    for who in apps:
        jobs = who.queue.llen("rq:queue:harness")
        assert jobs == who.sent, f"{who.name}: {jobs} jobs queued for {who.sent} mentions acked"
        found[who.name] = jobs
    ours = apps[0]
    eyes = ours.slack_calls()
    assert eyes == ours.sent, f"ours: {eyes} :eyes: reactions for {ours.sent} mentions"
    tracebacks = {who.name: who.process.output().count("Traceback") for who in apps}
    return {"jobs": found, "eyes": eyes, "tracebacks": tracebacks}


def report(results: dict[tuple[str, str], Block], checks: dict[str, Any]) -> str:
    rows = []
    for label, *_ in LOADS:
        for name in APPS:
            b = results[(label, name)]
            lat, n = b.latencies, len(b.latencies)
            bad = sum(b.statuses.values()) - b.statuses.get("200", 0)
            rows.append(
                [
                    label,
                    name,
                    n,
                    b.cpu / n * 1000,
                    b.eyes_cpu / n * 1000 if name == "ours" else "-",
                    b.redis_cpu / n * 1000,
                    percentile(lat, 50) * 1000,
                    percentile(lat, 90) * 1000,
                    percentile(lat, 99) * 1000,
                    max(lat) * 1000,
                    n / b.elapsed,
                    bad,
                ]
            )
    headers = [
        "load",
        "app",
        "mentions",
        "CPU ms/ack",
        "of which :eyes: threads",
        "Redis CPU ms/ack",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "acks/s",
        "non-200",
    ]
    at_goal = {name: results[(LOADS[0][0], name)] for name in APPS}
    cpu = {name: b.cpu / len(b.latencies) * 1000 for name, b in at_goal.items()}
    p99 = {name: percentile(b.latencies, 99) * 1000 for name, b in at_goal.items()}
    jobs = ", ".join(f"{name} {n:,}" for name, n in checks["jobs"].items())
    tracebacks = ", ".join(f"{name} {n}" for name, n in checks["tracebacks"].items())
    return "\n".join(
        [
            TITLE,
            "",
            f"`{COMMAND}` on {machine()}. Three servers run at once: ours (`python -m bot`); ours "
            "without its :eyes: reaction (`python -m tests.bench.bot_without_eyes`, the same bot with "
            "that one Slack call replaced by nothing); and the peer "
            "(`python -m tests.bench.plain_bolt_app`), a Bolt app with Bolt's defaults whose "
            "`app_mention` listener enqueues an RQ job (JSONSerializer): no dedup, no caps, no "
            "transaction, no :eyes:, no metrics. All three are "
            "served by the same gunicorn settings (`bot.web.serve`: `WEB_CONCURRENCY`, default 2 × "
            "cores, processes × 4 threads, gthread) on one redis-server (a database each) and one Slack "
            f"stand-in, and take turns: each load runs in {ROUNDS} blocks per app, each app first in "
            f"turn, after {WARMUP} warm-up mentions each. Mentions are signed `app_mention` callbacks, "
            "each with its own event id, channel and thread, sent by `python -m tests.bench.load` "
            "(another process) over keep-alive connections; latency is the client's, counted from when "
            "a mention was due in the open loop. CPU is user + system time from /proc of every process "
            "of the app's tree (gunicorn master and workers, all threads), read before each block and "
            "again once it has settled (every job queued; for ours every :eyes: `reactions.add` made: "
            f"it happens after the answer, on threads named `{EYES_THREAD}`, whose own CPU has its "
            "column). Redis CPU is the redis-server's during the app's blocks.",
            "",
            table(headers, rows),
            "",
            f"Jobs queued at the end: {jobs} (one per mention sent, checked); :eyes: made by ours: "
            f"{checks['eyes']:,} (one per mention, checked); tracebacks: {tracebacks}.",
            "",
            f"At {GOAL_RATE}/s: CPU per ack ours {cpu['ours']:.2f} ms, ours without :eyes: "
            f"{cpu['ours-without-eyes']:.2f} ms, peer {cpu['peer']:.2f} ms (ours / peer "
            f"{cpu['ours'] / cpu['peer']:.2f}×; without :eyes: "
            f"{cpu['ours-without-eyes'] / cpu['peer']:.2f}×); "
            f"p99 ours {p99['ours']:.1f} ms, peer {p99['peer']:.1f} ms (goal: under {GOAL_P99_MS:.0f} ms).",
        ]
    )


def run() -> str:
    try:
        return measure()
    except Exception:  # a benchmark that breaks reports it, it does not stop the others
        return f"{TITLE}\n\nFailed:\n\n```\n" + traceback.format_exc() + "```\n"


if __name__ == "__main__":
    print(run())
