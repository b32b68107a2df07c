"""A streamed answer: how soon its first words reach Slack, and how often Slack is written to.

Issue 21's goals: with the stand-in model streaming a 2,000-token answer at 50 tokens/s, the first
words reach Slack within 500 ms of the model's first token (p50), and no more than one Slack write
per 300 ms per thread. Side by side on one stack: a live run (the words stream into
`chat.startStream` / `appendStream` as the model writes them) and the same answer in a workspace
that refuses streams, which gets what every run got before live streaming: the answer posted once
the model finished (the old replay began only then too).

The model stand-in and the Slack stand-in run in this process, so the model's first token and
each Slack call are stamped on one clock.
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

from tests.bench.bench_latency import UNLIMITED
from tests.bench.common import percentile, table
from tests.fakes.messages_api import FakeMessagesAPI, reply, text
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import BOT_TOKEN, RedisServer, Stack, wait_until
from workers.live import PACE_SECONDS

COMMAND = ".venv/bin/python -m tests.bench stream"
RATE = 50  # tokens per second
LONG_TOKENS = 2000
SHORT_TOKENS = 100  # the first-words samples: the first words do not depend on the length
SAMPLES = 7
GOAL_FIRST_MS = 500.0
PACE_MS = 300


def _answer(tokens: int, marker: str) -> str:
    """About `tokens` tokens of text (the stand-in streams 4 characters per token)."""
    words = (f"{marker}w{i:04d}" for i in itertools.count())
    out = ""
    while len(out) < tokens * 4:
        out += next(words) + " "
    return out.strip()


def _run(stack: Stack, marker: str, tokens: int, *, live: bool) -> dict[str, Any]:
    """One run answering `tokens` tokens; what Slack saw of its thread."""
    channel = f"C{marker.upper()}"
    body = _answer(tokens, marker)
    stack.model.script_for(marker, reply(text(body), tokens_per_second=RATE))
    if not live:
        stack.slack.fail_next("chat.startStream", error="not_allowed_token_type")
    seen = len(stack.model.first_tokens)
    _, ts, _ = stack.mention(f"{marker}: answer", channel=channel)
    wait_until(
        lambda: any(
            marker in m["text"] and "That took" in m["text"] for m in stack.slack.messages(channel, ts)
        ),
        tokens / RATE + 60,
        0.01,
    )
    first_token = stack.model.first_tokens[seen]
    calls = [c for c in stack.slack.calls if c.params.get("channel") == channel and c.ok]
    writes = [c for c in calls if c.method.startswith(("chat.", "reactions.", "assistant.", "agents."))]
    words = next(
        c.at
        for c in calls
        if (c.method == "chat.startStream" and c.params.get("markdown_text"))
        or (c.method == "chat.postMessage" and marker in str(c.params.get("text")))
    )
    answer_ts = next(
        (c.response.get("ts") for c in calls if c.method == "chat.startStream"),
        next((c.response.get("ts") for c in calls if marker in str(c.params.get("text"))), None),
    )
    to_answer = [c for c in writes if answer_ts in (c.params.get("ts"), c.response.get("ts"))]
    gaps = [b.at - a.at for a, b in itertools.pairwise(to_answer)]
    during = [c for c in writes if to_answer and to_answer[0].at <= c.at <= to_answer[-1].at]
    window = max((sum(1 for c in during if a.at <= c.at < a.at + PACE_MS / 1000) for a in during), default=0)
    return {
        "first_words": words - first_token,
        "writes": len(to_answer),
        "min_gap": min(gaps) if gaps else None,
        "thread_writes": len(writes),
        "max_in_window": window,
        "model_seconds": tokens / RATE,
    }


def run() -> str:
    server = RedisServer().start()
    try:
        with (
            FakeSlackAPI(bot_token=BOT_TOKEN) as slack,
            FakeMessagesAPI() as api,
            tempfile.TemporaryDirectory() as tmp,
        ):
            pace = {"HARNESS_STREAM_PACE_MS": str(PACE_SECONDS * 1000)}  # what production runs with
            stack = Stack(server.url, slack, api, Path(tmp), config=UNLIMITED, extra_env=pace)
            try:
                stack.start_bot()
                stack.start_worker()
                _run(stack, "warm", 20, live=True)
                short: dict[bool, list[float]] = {True: [], False: []}
                for i in range(SAMPLES):
                    for live in (True, False):
                        kind = "sl" if live else "sp"
                        short[live].append(_run(stack, f"{kind}{i}", SHORT_TOKENS, live=live)["first_words"])
                long = {
                    live: _run(stack, f"{'ll' if live else 'lp'}", LONG_TOKENS, live=live)
                    for live in (True, False)
                }
            finally:
                stack.stop()
    finally:
        server.cleanup()

    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value * 1000:.0f}"

    rows = []
    for live, label in ((True, "live (streamed as written)"), (False, "no streams (posted when done)")):
        figures = long[live]
        rows.append(
            [
                label,
                ms(percentile(short[live], 50)),
                ms(max(short[live])),
                ms(figures["first_words"]),
                str(figures["writes"]),
                ms(figures["min_gap"]),
                str(figures["max_in_window"]),
            ]
        )
    return "\n".join(
        [
            "## A streamed answer: first words and Slack writes",
            "",
            f"`{COMMAND}`: the stand-in model streams at {RATE} tokens/s; first words measured from "
            f"its first token to the first Slack call carrying words, p50 and max of {SAMPLES} "
            f"{SHORT_TOKENS}-token answers, then one {LONG_TOKENS}-token answer "
            f"({LONG_TOKENS / RATE:.0f} s of writing) each way; goal: first words p50 ≤ "
            f"{GOAL_FIRST_MS:g} ms, at most one write per {PACE_MS:g} ms per thread.",
            "",
            table(
                [
                    "run",
                    "first words p50 ms",
                    "max",
                    f"{LONG_TOKENS}-token: first words ms",
                    "writes to the answer",
                    "min gap ms",
                    f"most thread writes in {PACE_MS:g} ms while it streams",
                ],
                rows,
            ),
        ]
    )
