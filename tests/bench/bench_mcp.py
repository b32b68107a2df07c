"""MCP tool calls: the harness beside a direct `Client.call_tool`, and the first call of a job.

Every contender calls `get_ticket(id="T-1")` on the real test server (`tests/fakes/mcp_server.py`
over stdio, without its call log, so no fsync per call). Two server processes run for part 1:
one held warm by an `McpHub` (as the worker and the terminal hold it), one by a plain `mcp.Client`
on an asyncio loop of this thread (the direct floor).

Part 1, per call, after a warm-up, in rounds of `batch` calls per contender whose order rotates
every round so that drift hits every row alike:

- direct: `await client.call_tool(...)` timed inside the loop;
- in-process (the terminal agent's path): `registry.run(...)` on the registry the agent holds,
  and `catalog.registry().run(...)` (a fresh listing per call), with the hub as the host;
- diagnostic: the MCP tool's own `call` on this thread, i.e. `registry.run` without its lane;
- in a work horse: the same in a child forked from this process after the hub and the relay
  started, as RQ forks its work horse, calling through a `RelayClient`.

Part 2, a job's first call: this process is the worker (hub and relay started once); a job is a
fresh `os.fork()` whose child builds the registry from the relayed catalog (one listing over the
relay), makes its first call and then a second; the reference warm call is part 1's work horse
`registry.run`. Timestamps are `time.monotonic_ns()`, one clock for parent and child. A fork whose
child does nothing gives the fork's own cost; the same job run on a new thread of this process
gives the job's cost without a fork; page faults (copy-on-write after a fork) are counted on both
sides; and a naive design (start the server and open a session per job: `Client(...)` entered,
then the first call) is timed for contrast.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.config import Config, load_config
from harness.tools import Tool, ToolContext, ToolResult
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from harness.tools.relay import RelayServer
from tests.bench.common import percentile, table
from tests.mcp_support import SERVER

COMMAND = ".venv/bin/python -m tests.bench mcp"
ROUNDS = int(os.environ.get("BENCH_MCP_ROUNDS", "40"))
BATCH = 25  # calls per contender per round
WARMUP = 100  # calls per contender before the rounds
JOBS = 60
NAIVE = 10
GOAL_OVERHEAD = 1.2  # harness per call <= 1.2x direct
GOAL_FIRST_CALL = 2.0  # a job's first call within 2x of a warm call

TOOL, QUALIFIED, ARGS = "get_ticket", "desk__get_ticket", {"id": "T-1"}
EXPECTED = "T-1: printer on fire"
DIRECT = "direct `Client.call_tool` (floor)"
IN_PROCESS = "in-process: `registry.run`"
NO_LANE = "in-process: the tool's own call, no registry (diagnostic)"
HORSE = "work horse via relay: `registry.run`"


def _config(folder: Path) -> Config:
    """One stdio server named `desk` running the test server; no env, so no call log."""
    path = folder / "harness.toml"
    path.write_text(
        f'[[mcp.servers]]\nname = "desk"\ncommand = {json.dumps(sys.executable)}\n'
        f'args = [{json.dumps(str(SERVER))}, "stdio"]\n'
    )
    return load_config(path, env={"HARNESS_WORKSPACE": str(folder)})


def _params() -> Any:
    """The same server as the config's, for a plain `mcp.Client`."""
    from mcp import StdioServerParameters

    return StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio"])


def _check(text: str, is_error: bool, who: str) -> None:
    if is_error or not text.startswith(EXPECTED):
        raise RuntimeError(f"{who}: unexpected answer {text[:200]!r} (is_error={is_error})")


# --- the direct floor: a warm Client on an asyncio loop of this thread -----------------------


class DirectSession:
    """An `mcp.Client` held open by a task on a private loop; `calls(n)` runs between holds."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._opened: asyncio.Future[Any] = self._loop.create_future()
        self._stop = asyncio.Event()
        self._task = self._loop.create_task(self._hold())
        self.client: Any = self._loop.run_until_complete(self._opened)

    async def _hold(self) -> None:
        from mcp import Client

        try:
            async with Client(_params()) as client:
                self._opened.set_result(client)
                await self._stop.wait()
        except Exception as exc:  # a server that cannot start must fail the benchmark, not hang it
            if not self._opened.done():
                self._opened.set_exception(exc)
            raise

    def calls(self, n: int) -> list[float]:
        return self._loop.run_until_complete(self._timed(n))

    async def _timed(self, n: int) -> list[float]:
        samples = []
        for _ in range(n):
            started = time.perf_counter()
            result = await self.client.call_tool(TOOL, ARGS)
            samples.append(time.perf_counter() - started)
            _check(result.content[0].text, bool(result.is_error), DIRECT)
        return samples

    def close(self) -> None:
        self._stop.set()
        self._loop.run_until_complete(self._task)
        self._loop.close()


# --- the harness, in this process and in a forked work horse ---------------------------------


def _timed_runs(catalog: Catalog, ctx: ToolContext, n: int, fresh: bool) -> list[float]:
    """`n` calls through the registry; `fresh`: `catalog.registry()` (a listing) before each."""
    registry = catalog.registry()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        result = (catalog.registry() if fresh else registry).run(QUALIFIED, ARGS, ctx)
        samples.append(time.perf_counter() - started)
        _check(result.text, result.is_error, "harness")
    return samples


def _timed_calls(found: Tool, ctx: ToolContext, n: int) -> list[float]:
    """`n` calls of the tool's own `call` on this thread: the registry without its lane hop."""
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        result = found.call(ctx, ARGS)
        samples.append(time.perf_counter() - started)
        assert isinstance(result, ToolResult)
        _check(result.text, result.is_error, "tool")
    return samples


class Horse:
    """A child forked like RQ's work horse, timing calls through the relay on command over a pipe."""

    def __init__(self, catalog: Catalog, ctx: ToolContext) -> None:
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                os.close(from_parent)
                os.close(to_parent)
                _serve(catalog, ctx, os.fdopen(to_child, "r"), os.fdopen(from_child, "w"))
                code = 0
            finally:
                os._exit(code)
        os.close(to_child)
        os.close(from_child)
        self._out = os.fdopen(from_parent, "w")
        self._in = os.fdopen(to_parent, "r")

    def calls(self, n: int, fresh: bool) -> list[float]:
        self._out.write(json.dumps({"n": n, "fresh": fresh}) + "\n")
        self._out.flush()
        answer = json.loads(self._in.readline())
        if "error" in answer:
            raise RuntimeError(f"work horse: {answer['error']}")
        return list(answer["samples"])

    def close(self) -> None:
        # Told, not left to EOF: a child forked since holds a copy of this pipe's write end.
        self._out.write(json.dumps({"quit": True}) + "\n")
        self._out.close()
        os.waitpid(self.pid, 0)
        self._in.close()


def _serve(catalog: Catalog, ctx: ToolContext, commands: Any, answers: Any) -> None:
    for line in commands:
        order = json.loads(line)
        if order.get("quit"):
            return
        try:
            answer: dict[str, Any] = {"samples": _timed_runs(catalog, ctx, order["n"], order["fresh"])}
        except Exception as exc:  # reported to the parent, which raises
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


@dataclass
class Row:
    name: str
    calls: Callable[[int], list[float]]
    samples: list[float] = field(default_factory=list)
    rounds: list[float] = field(default_factory=list)  # the median of each round

    def record(self, batch: list[float]) -> None:
        self.samples.extend(batch)
        self.rounds.append(percentile(batch, 50))


def measure_calls(
    hub: McpHub, relay: RelayServer, config: Config, ctx: ToolContext, **sizes: int
) -> list[Row]:
    """Part 1: per-call times of every path, warmed up, in rotating rounds.

    No `gc.collect()` between batches: a forced collection made the direct calls faster and the
    harness's slower in trials; each path meets the collector as it comes.
    """
    local = Catalog.from_config(config, host=hub)
    mcp_tool = local.registry().get(QUALIFIED)
    assert mcp_tool is not None
    relayed = Catalog.from_config(config, host=relay.client())
    horse = Horse(relayed, ctx)
    direct: DirectSession | None = None
    try:
        direct = DirectSession()
        rows = [
            Row(DIRECT, direct.calls),
            Row(IN_PROCESS, lambda n: _timed_runs(local, ctx, n, False)),
            Row("in-process: `catalog.registry().run`", lambda n: _timed_runs(local, ctx, n, True)),
            Row(NO_LANE, lambda n: _timed_calls(mcp_tool, ctx, n)),
            Row(HORSE, lambda n: horse.calls(n, False)),
            Row("work horse via relay: `catalog.registry().run`", lambda n: horse.calls(n, True)),
        ]
        for row in rows:
            row.calls(sizes["warmup"])
        for i in range(sizes["rounds"]):
            shift = i % len(rows)
            for row in rows[shift:] + rows[:shift]:
                row.record(row.calls(sizes["batch"]))
    finally:
        if direct is not None:
            direct.close()
        horse.close()
    return rows


# --- part 2: a job's first call ---------------------------------------------------------------


def _faults() -> int:
    """Minor page faults of this process so far (a copy-on-write copy after a fork is one)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _forked(child: Callable[[], dict[str, Any]]) -> tuple[int, dict[str, Any], int, int]:
    """Fork; the child runs `child` and sends its dict back.

    Returns (fork time, the dict, reaped time, this process's page faults from fork to reaped).
    """
    read_end, write_end = os.pipe()
    faults = _faults()
    forked = time.monotonic_ns()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            try:
                answer = child()
            except Exception as exc:
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            with os.fdopen(write_end, "w") as out:
                out.write(json.dumps(answer))
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as answers:
        answer = json.loads(answers.read() or '{"error": "the child sent nothing"}')
    os.waitpid(pid, 0)
    reaped = time.monotonic_ns()
    if "error" in answer:
        raise RuntimeError(f"job: {answer['error']}")
    return forked, answer, reaped, _faults() - faults


def _nothing() -> dict[str, Any]:
    return {"running": time.monotonic_ns()}


def _job_body(catalog: Catalog, ctx: ToolContext) -> dict[str, Any]:
    """What a job does with MCP first: build its registry (one listing), call, call again."""
    faults = _faults()
    running = time.monotonic_ns()
    registry = catalog.registry()  # lists over the relay; the worker never built it
    built = time.monotonic_ns()
    first = registry.run(QUALIFIED, ARGS, ctx)
    first_at = time.monotonic_ns()
    faults = _faults() - faults
    second = registry.run(QUALIFIED, ARGS, ctx)
    second_at = time.monotonic_ns()
    _check(first.text, first.is_error, "a job's first call")
    _check(second.text, second.is_error, "a job's second call")
    return {"running": running, "built": built, "first": first_at, "second": second_at, "faults": faults}


def _forked_job(catalog: Catalog, ctx: ToolContext) -> Callable[[], dict[str, Any]]:
    def job() -> dict[str, Any]:
        answer = _job_body(catalog, ctx)
        try:
            os.waitpid(-1, os.WNOHANG)
            answer["started"] = 1  # the job has a child of its own: it started a process
        except ChildProcessError:
            answer["started"] = 0
        return answer

    return job


def _threaded_job(relay: RelayServer, config: Config, ctx: ToolContext) -> dict[str, Any]:
    """The same job without a fork: a new thread, a new `RelayClient` (connection) and catalog."""
    answer: dict[str, Any] = {}

    def job() -> None:
        answer.update(_job_body(Catalog.from_config(config, host=relay.client()), ctx))

    thread = threading.Thread(target=job)
    thread.start()
    thread.join()
    if "first" not in answer:
        raise RuntimeError("the threaded job failed")
    return answer


def _naive() -> dict[str, float]:
    """Start the server and open a session, as a job would without the hub; then the first call."""
    from mcp import Client

    async def once() -> dict[str, float]:
        started = time.perf_counter()
        async with Client(_params()) as client:
            opened = time.perf_counter()
            result = await client.call_tool(TOOL, ARGS)
            answered = time.perf_counter()
            _check(result.content[0].text, bool(result.is_error), "naive")
        closed = time.perf_counter()
        return {"open": opened - started, "first": answered - started, "close": closed - answered}

    return asyncio.run(once())


@dataclass
class Jobs:
    fork_running: list[float] = field(default_factory=list)  # empty fork -> its child runs
    fork_reaped: list[float] = field(default_factory=list)  # empty fork -> child exited and reaped
    fork_worker_faults: list[int] = field(default_factory=list)
    job_running: list[float] = field(default_factory=list)
    job_built: list[float] = field(default_factory=list)  # fork -> registry built
    job_first: list[float] = field(default_factory=list)  # fork -> first result
    in_job_first: list[float] = field(default_factory=list)  # child running -> first result
    second: list[float] = field(default_factory=list)  # the job's second call
    job_faults: list[int] = field(default_factory=list)  # the child's, running -> first result
    job_worker_faults: list[int] = field(default_factory=list)  # the worker's, fork -> reaped
    started: int = 0  # processes the jobs started (servers, say)
    thread_first: list[float] = field(default_factory=list)  # no fork: thread running -> first result
    thread_faults: list[int] = field(default_factory=list)
    naive_open: list[float] = field(default_factory=list)
    naive_first: list[float] = field(default_factory=list)
    naive_close: list[float] = field(default_factory=list)


def measure_jobs(relay: RelayServer, config: Config, ctx: ToolContext, jobs: int, naive: int) -> Jobs:
    """Part 2: the jobs without a fork first; then empty forks, jobs and naive sessions, interleaved.

    The unforked jobs run before any job is forked: after a fork the worker's own memory is
    write-protected and its caches cold for a while, which is part of the fork's cost, not theirs.
    """
    out = Jobs()
    for _ in range(jobs):
        gc.collect()
        unforked = _threaded_job(relay, config, ctx)
        out.thread_first.append((unforked["first"] - unforked["running"]) / 1e9)
        out.thread_faults.append(unforked["faults"])
    # As `workers.__main__` builds it: a catalog on a RelayClient, its registry never built here.
    catalog = Catalog.from_config(config, host=relay.client())
    naive_every = max(1, jobs // max(1, naive))
    for i in range(jobs):
        gc.collect()
        forked, child, reaped, faults = _forked(_nothing)
        out.fork_running.append((child["running"] - forked) / 1e9)
        out.fork_reaped.append((reaped - forked) / 1e9)
        out.fork_worker_faults.append(faults)
        gc.collect()
        forked, child, _, faults = _forked(_forked_job(catalog, ctx))
        out.job_running.append((child["running"] - forked) / 1e9)
        out.job_built.append((child["built"] - forked) / 1e9)
        out.job_first.append((child["first"] - forked) / 1e9)
        out.in_job_first.append((child["first"] - child["running"]) / 1e9)
        out.second.append((child["second"] - child["first"]) / 1e9)
        out.job_faults.append(child["faults"])
        out.job_worker_faults.append(faults)
        out.started += child["started"]
        if i % naive_every == 0 and len(out.naive_first) < naive:
            gc.collect()
            timed = _naive()
            out.naive_open.append(timed["open"])
            out.naive_first.append(timed["first"])
            out.naive_close.append(timed["close"])
    return out


# --- the report ------------------------------------------------------------------------------


@dataclass
class Figures:
    rows: list[Row]
    jobs: Jobs
    sizes: dict[str, int]

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.name == name)


def measure(
    rounds: int = ROUNDS, batch: int = BATCH, warmup: int = WARMUP, jobs: int = JOBS, naive: int = NAIVE
) -> Figures:
    sizes = {"rounds": rounds, "batch": batch, "warmup": warmup, "jobs": jobs, "naive": naive}
    quiet_log = logging.getLogger("harness.mcp")
    level = quiet_log.level
    quiet_log.setLevel(logging.ERROR)  # the test server offers one badly named tool on purpose
    try:
        return _measure(sizes)
    finally:
        quiet_log.setLevel(level)


def _measure(sizes: dict[str, int]) -> Figures:
    with tempfile.TemporaryDirectory() as tmp:
        config = _config(Path(tmp))
        ctx = ToolContext(workspace=Path(tmp))
        with McpHub(config.resolved_servers({})) as hub:  # the server's stderr goes to the log, at INFO
            if hub.listing().away:
                raise RuntimeError(f"the test MCP server did not start: {dict(hub.listing().away)}")
            relay = RelayServer(hub).start()
            try:
                rows = measure_calls(hub, relay, config, ctx, **sizes)
                job_figures = measure_jobs(relay, config, ctx, sizes["jobs"], sizes["naive"])
            finally:
                relay.close()
    return Figures(rows, job_figures, sizes)


def _p(samples: list[float], p: float, scale: float) -> float:
    return percentile(samples, p) * scale


def run(**sizes: int) -> str:
    """The benchmark at `sizes` (the module's defaults when none), as Markdown."""
    return report(measure(**sizes))


def report(figures: Figures) -> str:
    """The two tables and their readings."""
    return "\n\n".join(
        [
            "## MCP tool calls: harness vs direct, and a job's first call",
            f"`{COMMAND}`",
            _calls_table(figures.rows),
            _calls_reading(figures),
            _jobs_table(figures),
            _jobs_reading(figures),
        ]
    )


def _calls_table(rows: list[Row]) -> str:
    floor = rows[0]
    body = []
    for row in rows:
        ratios = [r / f for r, f in zip(row.rounds, floor.rounds, strict=True)]
        body.append(
            [
                row.name,
                len(row.samples),
                _p(row.samples, 50, 1e6),
                _p(row.samples, 95, 1e6),
                (_p(row.samples, 50, 1e6) - _p(floor.samples, 50, 1e6)),
                f"{percentile(row.samples, 50) / percentile(floor.samples, 50):.2f}x",
                f"{percentile(row.samples, 95) / percentile(floor.samples, 95):.2f}x",
                f"{percentile(ratios, 25):.2f}x-{percentile(ratios, 75):.2f}x",
            ]
        )
    headers = [
        "path (same server tool, `get_ticket`)",
        "calls",
        "p50 µs",
        "p95 µs",
        "p50 - direct µs",
        "p50 ratio",
        "p95 ratio",
        "per-round p50 ratio, middle half",
    ]
    return table(headers, body)


def _calls_reading(figures: Figures) -> str:
    sizes = figures.sizes
    floor = percentile(figures.rows[0].samples, 50)
    verdicts = []
    for row in (figures.row(IN_PROCESS), figures.row(HORSE)):
        ratio = percentile(row.samples, 50) / floor
        met = "met" if ratio <= GOAL_OVERHEAD else "MISSED"
        verdicts.append(f"{row.name} {ratio:.2f}x ({met})")
    registry = percentile(figures.row(IN_PROCESS).samples, 50)
    own = percentile(figures.row(NO_LANE).samples, 50)
    return (
        f"Goal: a call through the harness within {GOAL_OVERHEAD}x of a direct call on a warm session "
        f"(p50): {'; '.join(verdicts)}. Of the in-process path's {(registry - floor) * 1e6:,.0f} µs over "
        f"direct, the registry itself (validation; an MCP tool bounds its own calls, so no lane "
        f"thread) is {(registry - own) * 1e6:,.0f} µs and the hop to the hub's loop thread and back "
        f"{(own - floor) * 1e6:,.0f} µs. {sizes['warmup']} warm-up calls per path, then {sizes['rounds']} "
        f"rounds of {sizes['batch']} calls per path in rotating order. "
        f"Versions: mcp {metadata.version('mcp')}, Python {sys.version.split()[0]}."
    )


def _warm(figures: Figures) -> float:
    """The reference warm call: p50 of `registry.run` in a work horse, from part 1."""
    return percentile(figures.row(HORSE).samples, 50)


def _jobs_table(figures: Figures) -> str:
    jobs, warm = figures.jobs, _warm(figures)

    def line(name: str, samples: list[float]) -> list[object]:
        ratio = f"{percentile(samples, 50) / warm:.1f}x" if samples else ""
        return [name, len(samples), _p(samples, 50, 1e3), _p(samples, 95, 1e3), ratio]

    body = [
        [f"warm call: {HORSE} (part 1), the reference", "", warm * 1e3, "", "1.0x"],
        line("fork doing nothing: fork → child running", jobs.fork_running),
        line("fork doing nothing: fork → child exited and reaped", jobs.fork_reaped),
        line("job: fork → child running", jobs.job_running),
        line("job: fork → registry built (listing over the relay)", jobs.job_built),
        line("job: fork → first result", jobs.job_first),
        line("job: child running → first result (the fork left out)", jobs.in_job_first),
        line("job: its second call", jobs.second),
        line("no fork: new thread, `RelayClient` and catalog → first result", jobs.thread_first),
        line("naive, per job: `Client(...)` entered (server start + handshake)", jobs.naive_open),
        line("naive, per job: entered + first result", jobs.naive_first),
        line("naive, per job: closing the session (server exit)", jobs.naive_close),
    ]
    return table(["what", "n", "p50 ms", "p95 ms", "p50 / warm call"], body)


def _jobs_reading(figures: Figures) -> str:
    jobs, warm = figures.jobs, _warm(figures)
    in_job = percentile(jobs.in_job_first, 50)
    total = percentile(jobs.job_first, 50)
    unforked = percentile(jobs.thread_first, 50)
    met = "met" if in_job <= GOAL_FIRST_CALL * warm else "MISSED"
    naive = percentile(jobs.naive_first, 50) if jobs.naive_first else float("nan")
    return (
        f"Goal: no server start inside a job, and its first call within {GOAL_FIRST_CALL}x of a warm call. "
        f"Processes started inside the {len(jobs.job_first)} jobs: {jobs.started}. Once the child runs, "
        f"building the registry and making the first call take {in_job * 1e3:.2f} ms, {in_job / warm:.1f}x "
        f"a warm call ({met}); counted from the fork {total * 1e3:.2f} ms, {total / warm:.1f}x (a child that "
        f"does nothing is running {_p(jobs.fork_running, 50, 1e3):.2f} ms after `os.fork()`). The same job "
        f"without a fork (new thread, connection, catalog and tool lane, in the worker process) takes "
        f"{unforked * 1e3:.2f} ms, {unforked / warm:.1f}x. Page faults (p50): the forked child "
        f"{percentile(jobs.job_faults, 50):,.0f} before its first result (the unforked job "
        f"{percentile(jobs.thread_faults, 50):,.0f}); the worker "
        f"{percentile(jobs.job_worker_faults, 50):,.0f} while a job runs, "
        f"{percentile(jobs.fork_worker_faults, 50):,.0f} while an empty fork does. A naive "
        f"job that started its own server would wait {naive * 1e3:,.0f} ms for its first result "
        f"({naive / total:,.0f}x the relayed job, fork included)."
    )


if __name__ == "__main__":
    print(run())
