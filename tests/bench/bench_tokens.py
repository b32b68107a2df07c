"""Tokens billed for a 10-turn run, with and without the prompt-caching breakpoints.

Counted from the requests themselves: each request the harness sent to the stand-in is split into
its blocks (tools, system, message content), sized at ~4 characters a token, and priced the way
the Messages API prices caching: a prefix ending at a breakpoint that an earlier request wrote is
a cache read (0.1x); the rest up to the last breakpoint is a cache write (1.25x); anything after
the last breakpoint is plain input (1x). Prefixes under 1,024 tokens are never cached.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

from harness.loop import Finished, drive
from harness.state import new_run
from tests.bench.common import table
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, Reply, reply, text, tool_use

TURNS = 10
MIN_CACHEABLE = 1024
READ, WRITE = 0.1, 1.25
ROOT = Path(__file__).resolve().parents[2]


def tokens(value: Any) -> int:
    return max(1, len(json.dumps(value, ensure_ascii=False)) // 4)


def blocks(body: dict[str, Any]) -> list[tuple[int, bool, str]]:
    """(cumulative tokens, has a breakpoint, prefix digest) after each block of the request."""
    items: list[Any] = list(body.get("tools", [])) + list(body.get("system", []))
    for message in body["messages"]:
        content = message["content"]
        items += [
            {"role": message["role"], **b} for b in (content if isinstance(content, list) else [content])
        ]
    out, total, digest = [], 0, hashlib.sha256()
    for item in items:
        marked = isinstance(item, dict) and "cache_control" in item
        clean = {k: v for k, v in item.items() if k != "cache_control"} if isinstance(item, dict) else item
        total += tokens(clean)
        digest.update(json.dumps(clean, sort_keys=True).encode())
        out.append((total, marked, digest.hexdigest()))
    return out


def price(requests: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """Per request: (input tokens, billed-equivalent tokens with caching)."""
    cached: set[str] = set()
    priced = []
    for body in requests:
        seq = blocks(body)
        total = seq[-1][0]
        marks = [(n, h) for n, marked, h in seq if marked and n >= MIN_CACHEABLE]
        read = max((n for n, h in marks if h in cached), default=0)
        last = marks[-1][0] if marks else 0
        cached.update(h for _, h in marks)
        priced.append((total, read * READ + (last - read) * WRITE + (total - last)))
    return priced


def record_run() -> list[dict[str, Any]]:
    sources = sorted((ROOT / "harness").glob("*.py"))

    def respond(body: dict[str, Any]) -> Reply:
        done = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if done < TURNS:
            return reply(tool_use("read_file", {"path": sources[done % len(sources)].name}))
        return reply(text("Here is what the harness does."))

    with tempfile.TemporaryDirectory() as tmp, FakeMessagesAPI() as model:
        for source in sources:
            (Path(tmp) / source.name).write_text(source.read_text())
        model.responder = respond
        agent = make_agent(model, Path(tmp), max_turns=TURNS, token_budget=10**9)
        _, outcome = drive(
            new_run("Read the harness sources one by one and explain them."), agent, lambda e: None
        )
        assert isinstance(outcome, Finished), outcome
        assert model.errors == [], model.errors
        return model.requests


def run() -> str:
    requests = record_run()
    priced = price(requests)
    rows, plain_sum, cached_sum = [], 0, 0.0
    for i, (total, billed) in enumerate(priced, 1):
        plain_sum += total
        cached_sum += billed
        rows.append([i, f"{total:,}", f"{total:,}", f"{billed:,.0f}", f"{plain_sum:,}", f"{cached_sum:,.0f}"])
    saving = 1 - cached_sum / plain_sum
    first = next((i for i, (total, _) in enumerate(priced, 1) if total >= MIN_CACHEABLE), None)
    return "\n".join(
        [
            f"## Tokens billed for a {TURNS}-turn run",
            "",
            "Command: `python -m tests.bench tokens`. The harness read one source file per turn "
            "(2,000 characters each) against the stand-in; every request it sent is priced from its "
            "own blocks (see the module docstring: ~4 characters a token, cache reads 0.1x, cache "
            "writes 1.25x, nothing cached under 1,024 tokens).",
            "",
            table(
                [
                    "request",
                    "input tokens",
                    "billed without breakpoints",
                    "billed with breakpoints",
                    "cumulative without",
                    "cumulative with",
                ],
                rows,
            ),
            "",
            f"Without breakpoints a run pays for its whole history on every request, so the cost grows "
            f"with the square of its length; with them each request pays full price only for what is new "
            f"(x1.25) and a tenth for the rest. Over {len(priced)} requests that is {saving:.0%} fewer "
            f"billed input tokens ({cached_sum:,.0f} instead of {plain_sum:,}). Below 1,024 tokens nothing "
            f"is cached; request {first}, the first above it, pays the 1.25x write premium, and every "
            "later one reads its prefix at a tenth of the price.",
        ]
    )


if __name__ == "__main__":
    print(run())
