"""Harness overhead per turn, beside a bare SDK loop, LangGraph and Pydantic AI.

Every contender talks to the same loopback stand-in (`FakeMessagesAPI`), whose responder asks
for the cheap tool `lookup(n)` once per turn (a different `n` each turn, so our no-progress
valve stays shut) until the task's `turns=N` is reached, then answers in text. A contender's
overhead per turn is (median 20-turn run - median 0-turn run) / 20: every contender pays the
same loopback HTTP, SDK and stand-in cost per request, so the differences between the rows are
the contenders' own. Runs are interleaved round-robin so that drift hits every row alike.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from tests.bench.common import percentile, table
from tests.fakes.messages_api import FakeMessagesAPI, Reply, http_error, reply, text, tool_use

TURNS = 20
REPEATS = int(os.environ.get("BENCH_OVERHEAD_REPEATS", "20"))
WARMUP = 3
MODEL = "claude-test"
MAX_TOKENS = 1024
TOOL_DOC = "Look up entry number n."
GUARDED_DOC = "Look up entry number n; a human must approve each call."

Run = Callable[[int, bool], None]  # (turns, with one approval on the first call) -> None


def _task(turns: int, approve: bool) -> str:
    return f"Benchmark task: turns={turns}{' approve' if approve else ''}."


def _lookup(n: int) -> str:
    return f"value {n}"


# --- the stand-in's script --------------------------------------------------------------------


def _first_user_text(messages: list[dict[str, Any]]) -> str:
    for message in messages:
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            return " ".join(b.get("text", "") for b in content or [] if isinstance(b, dict))
    return ""


def responder(body: dict[str, Any]) -> Reply:
    """`lookup(k)` for turn k until `turns=N` turns are done, then a text answer.

    With `approve` in the task, the first call goes to `guarded_lookup` (the tool that needs a
    human). A request whose last message lacks the previous turn's result is refused with a 500,
    so a contender that skips its tool fails loudly instead of looking fast.
    """
    messages = body["messages"]
    task = _first_user_text(messages)
    target = int(task.split("turns=", 1)[1].split()[0].rstrip("."))
    done = sum(1 for m in messages if m.get("role") == "assistant")
    if done and f"value {done - 1}" not in json.dumps(messages[-1]):
        return http_error(500, message=f"turn {done}: the result of lookup({done - 1}) is missing")
    if done < target:
        name = "guarded_lookup" if done == 0 and " approve" in task else "lookup"
        return reply(tool_use(name, {"n": done}))
    return reply(text(f"Done after {done} lookups."))


# --- contenders -------------------------------------------------------------------------------


def bare_loop(base_url: str, workspace: Path) -> Run:
    """The floor: about 30 lines straight on the SDK, no valves, no state, no checkpoints."""
    import anthropic

    client = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    tools = [
        {"name": "lookup", "description": TOOL_DOC, "input_schema": schema},
        {"name": "guarded_lookup", "description": GUARDED_DOC, "input_schema": schema},  # same request size
    ]
    functions = {"lookup": _lookup, "guarded_lookup": _lookup}

    def run(turns: int, approve: bool) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": _task(turns, approve)}]
        while True:
            message = client.messages.create(
                model=MODEL, max_tokens=MAX_TOKENS, tools=tools, messages=messages
            )
            messages.append({"role": "assistant", "content": message.content})
            if message.stop_reason != "tool_use":
                return
            results = [
                {"type": "tool_result", "tool_use_id": b.id, "content": functions[b.name](**b.input)}
                for b in message.content
                if b.type == "tool_use"
            ]
            messages.append({"role": "user", "content": results})

    return run


def _our_agent(base_url: str, workspace: Path, before_tool: Any = None) -> Any:
    from harness.client import make_client
    from harness.config import Limits
    from harness.loop import Agent
    from harness.policy import Policy, Tier
    from harness.tools import ToolContext, ToolRegistry, tool

    def lookup(ctx: ToolContext, n: int) -> str:
        return _lookup(n)

    def guarded_lookup(ctx: ToolContext, n: int) -> str:
        return _lookup(n)

    lookup.__doc__, guarded_lookup.__doc__ = TOOL_DOC, GUARDED_DOC
    return Agent(
        client=make_client(base_url=base_url, api_key="x", max_retries=0),
        tools=ToolRegistry([tool()(lookup), tool()(guarded_lookup)], timeout_seconds=5.0),
        context=ToolContext(workspace=workspace),
        policy=Policy(default=Tier.ASK, tools={"lookup": Tier.ALLOW, "guarded_lookup": Tier.ASK}),
        limits=Limits(max_turns=TURNS + 5, token_budget=10**12, max_tokens=MAX_TOKENS),
        model=MODEL,
        before_tool=before_tool,
    )


def ours(base_url: str, workspace: Path) -> Run:
    """`harness.loop.drive` as the CLI runs it: no persistence between steps."""
    from harness.loop import Finished, drive
    from harness.state import new_run

    agent = _our_agent(base_url, workspace)

    def run(turns: int, approve: bool) -> None:
        _, outcome = drive(new_run(_task(turns, approve)), agent, lambda event: None)
        if not isinstance(outcome, Finished):
            raise RuntimeError(f"our run ended with {outcome!r}")

    return run


def ours_checkpointed(base_url: str, workspace: Path) -> Run:
    """`step` as the worker runs it: `RunState.dumps()` after every step and before an `ask` call
    runs (write-ahead); a park is written, read back, decided and resumed."""
    from harness.loop import AwaitingApproval, Finished, step
    from harness.state import Decision, RunState, Verdict, new_run, record_decisions

    agent = _our_agent(base_url, workspace, before_tool=lambda state, call: state.dumps())

    def run(turns: int, approve: bool) -> None:
        state = new_run(_task(turns, approve))
        state.dumps()
        while True:
            result = step(state, agent)
            state = result.state
            stored = state.dumps()
            if isinstance(result.outcome, AwaitingApproval):
                decisions = {c.id: Decision(Verdict.APPROVED, by="U123") for c in result.outcome.calls}
                state = record_decisions(RunState.loads(stored), decisions)
                state.dumps()
            elif result.outcome is not None:
                if not isinstance(result.outcome, Finished):
                    raise RuntimeError(f"our run ended with {result.outcome!r}")
                return

    return run


def langgraph_agent(base_url: str, workspace: Path) -> Run:
    """`create_react_agent` + `MemorySaver`; `guarded_lookup` calls `interrupt`, resumed by `Command`."""
    from langchain_anthropic import ChatAnthropic
    from langchain_core.tools import tool as lc_tool
    from langgraph.checkpoint.memory import MemorySaver
    from langgraph.types import Command, interrupt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent is deprecated in favour of langchain.agents
        from langgraph.prebuilt import create_react_agent

    @lc_tool
    def lookup(n: int) -> str:
        """Look up entry number n."""
        return _lookup(n)

    @lc_tool
    def guarded_lookup(n: int) -> str:
        """Look up entry number n; a human must approve each call."""
        if interrupt({"tool": "guarded_lookup", "n": n}) is not True:
            return "declined"
        return _lookup(n)

    model = ChatAnthropic(
        model_name=MODEL, base_url=base_url, api_key="x", max_retries=0, max_tokens=MAX_TOKENS, timeout=30
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = create_react_agent(model, [lookup, guarded_lookup], checkpointer=MemorySaver())

    def run(turns: int, approve: bool) -> None:
        # 20 turns take 41 supersteps; the default recursion_limit of 25 stops the graph at 12.
        config: Any = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 4 * TURNS + 10}
        out = graph.invoke({"messages": [("user", _task(turns, approve))]}, config)
        while out.get("__interrupt__"):
            out = graph.invoke(Command(resume=True), config)
        if "Done after" not in str(out["messages"][-1].content):
            raise RuntimeError(f"LangGraph ended with {out['messages'][-1]!r}")

    return run


def pydantic_ai_agent(base_url: str, workspace: Path) -> Run:
    """`pydantic_ai.Agent.run_sync`; `guarded_lookup` has `requires_approval=True` and comes back as
    `DeferredToolRequests`, answered with `DeferredToolResults` on a second `run_sync`."""
    from anthropic import AsyncAnthropic
    from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
    from pydantic_ai.models.anthropic import AnthropicModel, AnthropicModelSettings
    from pydantic_ai.providers.anthropic import AnthropicProvider

    client = AsyncAnthropic(base_url=base_url, api_key="x", max_retries=0)
    model = AnthropicModel(MODEL, provider=AnthropicProvider(anthropic_client=client))
    agent = Agent(
        model,
        output_type=[str, DeferredToolRequests],
        model_settings=AnthropicModelSettings(max_tokens=MAX_TOKENS),
    )

    @agent.tool_plain
    def lookup(n: int) -> str:
        """Look up entry number n."""
        return _lookup(n)

    @agent.tool_plain(requires_approval=True)
    def guarded_lookup(n: int) -> str:
        """Look up entry number n; a human must approve each call."""
        return _lookup(n)

    def run(turns: int, approve: bool) -> None:
        result = agent.run_sync(_task(turns, approve))
        while isinstance(result.output, DeferredToolRequests):
            approvals = {c.tool_call_id: True for c in result.output.approvals}
            result = agent.run_sync(
                message_history=result.all_messages(),
                deferred_tool_results=DeferredToolResults(approvals=approvals),
            )
        if "Done after" not in str(result.output):
            raise RuntimeError(f"Pydantic AI ended with {result.output!r}")

    return run


@dataclass
class Row:
    name: str
    make: Callable[[str, Path], Run]
    approve: bool = False
    run: Run | None = None
    error: str | None = None
    zero: list[float] = field(default_factory=list)
    full: list[float] = field(default_factory=list)


_FLOOR = "bare loop on the SDK (floor)"


def _rows() -> list[Row]:
    return [
        Row(_FLOOR, bare_loop),
        Row("ours: `drive`", ours),
        Row("ours: `step` + `RunState.dumps()` every step", ours_checkpointed),
        Row("ours: checkpointed + 1 approval (park, load, resume)", ours_checkpointed, approve=True),
        Row("LangGraph `create_react_agent` + `MemorySaver`", langgraph_agent),
        Row("LangGraph + 1 `interrupt` / `Command(resume=...)`", langgraph_agent, approve=True),
        Row("Pydantic AI `Agent.run_sync`", pydantic_ai_agent),
        Row("Pydantic AI + 1 `requires_approval` round trip", pydantic_ai_agent, approve=True),
    ]


def _timed(fake: FakeMessagesAPI, row: Row, turns: int) -> float:
    assert row.run is not None
    errors = len(fake.errors)
    gc.collect()
    started = time.perf_counter()
    row.run(turns, row.approve)
    elapsed = time.perf_counter() - started
    if len(fake.errors) > errors:
        raise RuntimeError(f"the stand-in refused a request: {fake.errors[-1][:200]}")
    return elapsed


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ").replace("|", "/")[:160]


def measure() -> list[Row]:
    rows = _rows()
    with FakeMessagesAPI() as fake, tempfile.TemporaryDirectory() as tmp:
        fake.responder = responder
        made: dict[Callable[..., Run], Run] = {}
        for row in rows:
            try:
                if row.make not in made:
                    made[row.make] = row.make(fake.base_url, Path(tmp))
                row.run = made[row.make]
                for _ in range(WARMUP):
                    _timed(fake, row, 0)
                    _timed(fake, row, TURNS)
            except Exception as exc:  # a contender that cannot run is reported, never fatal
                row.error = _reason(exc)
        for _ in range(REPEATS):
            for row in rows:
                if row.error is not None:
                    continue
                try:
                    row.zero.append(_timed(fake, row, 0))
                    row.full.append(_timed(fake, row, TURNS))
                except Exception as exc:
                    row.error = _reason(exc)
    return rows


def _per_turn_us(row: Row) -> float:
    return (statistics.median(row.full) - statistics.median(row.zero)) / TURNS * 1e6


def _round_ratios(row: Row, floor: Row) -> tuple[float, float]:
    """The 25th and 75th percentile of the per-round ratio of `row`'s overhead to the floor's."""
    ratios = [
        (f - z) / (ff - fz) for z, f, fz, ff in zip(row.zero, row.full, floor.zero, floor.full, strict=False)
    ]
    return percentile(ratios, 25), percentile(ratios, 75)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def run() -> str:
    rows = measure()
    floor = rows[0]
    floor_us = _per_turn_us(floor) if floor.error is None else float("nan")
    table_rows: list[list[object]] = []
    for row in rows:
        if row.error is not None:
            table_rows.append([row.name, f"not available: {row.error}", "", "", "", ""])
            continue
        per_turn = _per_turn_us(row)
        table_rows.append(
            [
                row.name,
                statistics.median(row.zero) * 1000,
                statistics.median(row.full) * 1000,
                statistics.median(row.full) / TURNS * 1e6,
                per_turn,
                f"{per_turn / floor_us:.2f}x" if floor_us == floor_us else "n/a",
            ]
        )
    headers = [
        "contender",
        "median 0-turn run (ms)",
        f"median {TURNS}-turn run (ms)",
        "wall time per turn (µs)",
        "overhead per turn (µs)",
        "ratio to bare loop",
    ]
    return "\n\n".join(
        [
            "## Harness overhead per turn",
            "`python -m tests.bench overhead`",
            table(headers, table_rows),
            _reading(rows, floor_us),
        ]
    )


def _reading(rows: list[Row], floor_us: float) -> str:
    by = {row.name: row for row in rows}
    versions = ", ".join(
        f"{p} {_version(p)}"
        for p in ("anthropic", "langgraph", "langgraph-prebuilt", "langchain-anthropic", "pydantic-ai-slim")
    )
    method = (
        f"Each contender ran {REPEATS} interleaved rounds of a 0-turn and a {TURNS}-turn run (after "
        f"{WARMUP} warm-up rounds) against one loopback stand-in; overhead per turn is (median "
        f"{TURNS}-turn - median 0-turn) / {TURNS}, which still holds the HTTP round trip, the SDK and "
        "the stand-in's own parsing and validation, the same for every row, so the bare loop's figure "
        "is the floor and the ratio compares the rest with it; wall time per turn is the median "
        f"{TURNS}-turn run / {TURNS}."
    )
    ours_row = by["ours: `drive`"]
    if ours_row.error is not None or by[_FLOOR].error is not None:
        verdict = "The comparison could not be made: ours or the bare loop did not run."
    else:
        ours_us = _per_turn_us(ours_row)
        within = ours_us <= 1.5 * floor_us
        frameworks = [r for r in rows if r.name.startswith(("LangGraph `", "Pydantic AI `"))]
        ran = [r for r in frameworks if r.error is None]
        below = all(ours_us < _per_turn_us(r) for r in ran)
        low, high = _round_ratios(ours_row, by[_FLOOR])
        verdict = (
            f"Ours (`drive`) costs {ours_us:,.0f} µs per turn, {ours_us - floor_us:,.0f} µs more than the "
            f"bare loop's {floor_us:,.0f} µs, i.e. {ours_us / floor_us:.2f}x (the round-by-round ratio's "
            f"middle half spans {low:.2f}x-{high:.2f}x): {'within' if within else 'NOT within'} the 1.5x goal"
        )
        if ran:
            names = " and ".join(f"{r.name.split(' `')[0]} ({_per_turn_us(r):,.0f} µs)" for r in ran)
            verdict += f", and {'below' if below else 'NOT below'} {names}"
        missing = [r.name for r in frameworks if r.error is not None]
        if missing:
            verdict += f"; not measured: {', '.join(missing)}"
        verdict += "."
    apis = (
        "LangGraph through `langgraph.prebuilt.create_react_agent` (deprecated since LangGraph 1.0 in favour "
        "of `langchain.agents.create_agent`, which needs the `langchain` package) with "
        "`langchain_anthropic.ChatAnthropic(base_url=...)`; Pydantic AI through `AnthropicModel` on "
        "`AnthropicProvider(anthropic_client=AsyncAnthropic(base_url=...))`"
    )
    return f"{verdict} {method} {apis}. Versions: {versions}."


if __name__ == "__main__":
    print(run())
