"""Harness overhead per tool turn and resume → next request, beside a bare SDK loop and the peers.

Every contender talks to the same loopback stand-in (`FakeMessagesAPI`), whose responder asks
for the cheap tool `lookup(n)` once per turn (a different `n` each turn, so our no-progress
valve stays shut) until the task's `turns=N` is reached, then answers in text. The responder
notes when each request arrives, after the stand-in has parsed and validated it.

Three measurements, each interleaved round-robin so that drift hits every contender alike:

- **Per tool turn**: (median N-turn run - median 0-turn run) / N per contender, and the median
  of the per-round ratios to the bare loop's. Every contender pays the same loopback HTTP, SDK
  and stand-in cost per request, so the differences between the rows are the contenders' own.
- **Growth**: in one 50-turn run, the time between the arrivals of two successive requests at
  the stand-in (the answer, the contender's turn, the next request), by turn number.
- **Resume → next request**: from "the decision is in" to the stand-in receiving the request
  that carries the decided call's result. The bare loop holds its messages in memory: the
  decision is a value, and it runs the tool, appends the result and sends. Ours starts from a
  parked run whose decision the click's script has recorded in Redis: it takes the lease, loads
  the record, reads the decisions, saves the run running, writes the call's write-ahead mark,
  runs the tool, checkpoints and sends.

Ours "as a worker steps it" is the per-step path of `workers.jobs` on the real `Driver` and `Store`
over a private redis-server: the tools of a `[tools] modules` module through the real registry,
the config's policy on every call, the Stop check before every request and call, the write-ahead
mark saved before every side-effecting call, a fenced checkpoint after every step and the step's
metrics; only the Slack side (turn summaries rendered, owed and posted) is left out. The full job
(`workers.jobs.drive`, Slack stand-in included) is a row of its own.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.tools import ToolContext, tool
from tests.bench.common import machine, percentile, table
from tests.fakes.messages_api import FakeMessagesAPI, Reply, http_error, reply, text, tool_use

TURNS = 20
GROWTH_TURNS = 50
GROWTH_WINDOWS = ((1, 5), (20, 25), (45, 50))  # turn numbers (1-based), inclusive
RESUME_AFTER = (0, 20)  # turns of history before the call that needs approval
REPEATS = int(os.environ.get("BENCH_OVERHEAD_REPEATS", "20"))
GROWTH_REPEATS = int(os.environ.get("BENCH_OVERHEAD_GROWTH_REPEATS", "7"))
RESUME_REPEATS = int(os.environ.get("BENCH_OVERHEAD_RESUME_REPEATS", "30"))
WARMUP = 3
MODEL = "claude-test"
MAX_TOKENS = 1024
TOOL_DOC = "Look up entry number n."
GUARDED_DOC = "Look up entry number n; a human must approve each call."

Run = Callable[[int, bool], None]  # (turns, with one approval on the first call) -> None
Clock = tuple[float, float]  # (wall seconds, CPU seconds of this process and the private redis-server)
Resume = Callable[[int], Clock]  # (turns before the approval) -> from decision to request
WALL, CPU = 0, 1

# When each request reached the stand-in, appended by its responder thread.
ARRIVALS: list[Clock] = []
# The private redis-server's process, once the worker's services run (its CPU counts as ours).
REDIS_PID: list[int] = []


class _Counted:
    """Round trips to the private Redis so far: one per packed send (a pipeline is one)."""

    trips = 0


def _counting_connection() -> type:
    import redis

    class CountingConnection(redis.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            _Counted.trips += 1
            super().send_packed_command(command, check_health)

    return CountingConnection


TRIPS_AT_ARRIVAL: list[int] = []
RESUME_TRIPS: list[int] = []
_started_trips = [0]


def _start() -> Clock:
    """`now()`, noting the round trips so far (a resume counts those made before its request)."""
    _started_trips[0] = _Counted.trips
    return now()


def now() -> Clock:
    """Wall time, and the CPU time of this process (every thread: the contender, its tool thread, the
    stand-ins) plus the private redis-server's. CPU time is what a busy machine does not change much."""
    cpu = time.process_time()
    for pid in REDIS_PID:
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                cpu += int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError):
            pass
    return time.perf_counter(), cpu


def _task(turns: int, approve: bool | int) -> str:
    """`approve`: True or 0 asks for approval on the first call; an int k > 0 on call k (0-based)."""
    if approve is False:
        return f"Benchmark task: turns={turns}."
    return f"Benchmark task: turns={turns} approve={int(approve)}."


def _lookup(n: int) -> str:
    return f"value {n}"


# --- the tools of the worker's config: a `[tools] modules` module (this one) ------------------------


@tool()
def lookup(ctx: ToolContext, n: int) -> str:
    """Look up entry number n."""
    return _lookup(n)


@tool()
def guarded_lookup(ctx: ToolContext, n: int) -> str:
    """Look up entry number n; a human must approve each call."""
    return _lookup(n)


CONFIG = """
[model]
name = "claude-test"
[limits]
max_turns = 60
token_budget = 1000000000
max_tokens = 1024
[tools]
builtin = []
modules = ["tests.bench.bench_overhead"]
[policy]
default = "ask"
[policy.tools]
lookup = "allow"
guarded_lookup = "ask"
[[policy.rules]]
tool = "write_file"
args = { path = "drafts/**" }
tier = "allow"
[approvals]
expire_after_minutes = 600
"""


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

    With `approve=K` in the task, call K goes to `guarded_lookup` (the tool that needs a human).
    A request whose last message lacks the previous turn's result is refused with a 500, so a
    contender that skips its tool fails loudly instead of looking fast.
    """
    TRIPS_AT_ARRIVAL.append(_Counted.trips)
    ARRIVALS.append(now())
    messages = body["messages"]
    task = _first_user_text(messages)
    target = int(task.split("turns=", 1)[1].split()[0].rstrip("."))
    guarded = int(task.split("approve=", 1)[1].rstrip(".").split()[0]) if "approve=" in task else -1
    done = sum(1 for m in messages if m.get("role") == "assistant")
    if done and f"value {done - 1}" not in json.dumps(messages[-1]):
        return http_error(500, message=f"turn {done}: the result of lookup({done - 1}) is missing")
    if done < target:
        return reply(tool_use("guarded_lookup" if done == guarded else "lookup", {"n": done}))
    return reply(text(f"Done after {done} lookups."))


# --- what the contenders share ------------------------------------------------------------------


class Env:
    """The stand-ins and, made on first use, the worker's Redis, Slack stand-in and services."""

    def __init__(self, base_url: str, workspace: Path, stack: ExitStack) -> None:
        self.base_url = base_url
        self.workspace = workspace
        self._stack = stack
        self._svc: Any = None
        self.lock = threading.Lock()

    def services(self) -> Any:
        """The worker's `Services`: real `Store` on a private redis-server, Slack stand-in, the config."""
        if self._svc is None:
            import redis

            from harness.client import make_client
            from harness.config import load_config
            from harness.tools.catalog import Catalog
            from runtime.clients import slack_client
            from runtime.queue import make_queue
            from store import Store
            from tests.fakes.slack_api import FakeSlackAPI
            from tests.stack import RedisServer
            from workers.services import Services, keep_handed

            server = RedisServer().start()
            self._stack.callback(server.cleanup)
            if server.proc is not None:
                REDIS_PID.append(server.proc.pid)
            slack = self._stack.enter_context(FakeSlackAPI(bot_token="xoxb-test"))
            path = self.workspace / "harness.toml"
            path.write_text(CONFIG, encoding="utf-8")
            config = load_config(path, env={"HARNESS_WORKSPACE": str(self.workspace)})
            conn = redis.Redis.from_url(server.url, connection_class=_counting_connection())
            self._svc = Services(
                store=Store(conn),
                queue=make_queue(conn),
                slack=slack_client({"SLACK_BOT_TOKEN": "xoxb-test", "SLACK_API_URL": slack.base_url}),
                config=config,
                model=make_client(base_url=self.base_url, api_key="x", max_retries=0),
                catalog=Catalog.from_config(config),
            )
            keep_handed(self._svc)  # as a worker hands them to its jobs
        return self._svc


_TS = iter(range(1, 10**9))


def _new_record(svc: Any, task: str, status: Any) -> str:
    """A run record in Redis, in a thread of its own (so that no history carries over)."""
    from store import RunRecord, new_run_id

    record = RunRecord(new_run_id(), "T1", "C1", f"1700000000.{next(_TS):06d}", "UREQ", task, status=status)
    svc.store.runs.save_run(record)
    return record.run_id


def _arrival_since(mark: int, started: Clock) -> Clock:
    """Wall and CPU seconds from `started` to the arrival of the first request after `mark` arrivals."""
    if len(ARRIVALS) <= mark:
        raise RuntimeError("no request reached the stand-in after the decision")
    RESUME_TRIPS.append(TRIPS_AT_ARRIVAL[mark] - _started_trips[0])
    return ARRIVALS[mark][WALL] - started[WALL], ARRIVALS[mark][CPU] - started[CPU]


# --- the bare loop ------------------------------------------------------------------------------


def _bare_parts(env: Env) -> tuple[Any, list[dict[str, Any]], dict[str, Callable[..., str]]]:
    import anthropic

    client = anthropic.Anthropic(base_url=env.base_url, api_key="x", max_retries=0)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    tools = [
        {"name": "lookup", "description": TOOL_DOC, "input_schema": schema},
        {"name": "guarded_lookup", "description": GUARDED_DOC, "input_schema": schema},  # same request size
    ]
    return client, tools, {"lookup": _lookup, "guarded_lookup": _lookup}


def bare_loop(env: Env) -> Run:
    """The floor: about 30 lines straight on the SDK, no valves, no state, no checkpoints."""
    client, tools, functions = _bare_parts(env)

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


def bare_resume(env: Env) -> Resume:
    """The bare loop waits for a human before a `guarded_lookup` call: its messages stay in memory,
    the decision is a value; then it runs the call, appends the result and sends."""
    client, tools, functions = _bare_parts(env)

    def send(messages: list[dict[str, Any]]) -> Any:
        message = client.messages.create(model=MODEL, max_tokens=MAX_TOKENS, tools=tools, messages=messages)
        messages.append({"role": "assistant", "content": message.content})
        return message

    def results(message: Any) -> list[dict[str, Any]]:
        return [
            {"type": "tool_result", "tool_use_id": b.id, "content": functions[b.name](**b.input)}
            for b in message.content
            if b.type == "tool_use"
        ]

    def resume(after: int) -> float:
        messages: list[dict[str, Any]] = [{"role": "user", "content": _task(after + 1, after)}]
        message = send(messages)
        while not any(b.type == "tool_use" and b.name == "guarded_lookup" for b in message.content):
            messages.append({"role": "user", "content": results(message)})
            message = send(messages)
        approved = True  # the decision is in
        gc.collect()
        started, mark = _start(), len(ARRIVALS)
        if approved:
            messages.append({"role": "user", "content": results(message)})
        message = send(messages)
        if message.stop_reason == "tool_use":
            raise RuntimeError("the bare loop's run did not end after the approved call")
        return _arrival_since(mark, started)

    return resume


# --- the bare loop, durable ----------------------------------------------------------------------
#
# What a hand-written loop must add to keep this product's promises across a crash, and nothing
# more: before a turn's tools run, its reply and a mark that they started (else a crash re-runs a
# side effect); after them, their results (else a crash loses a result that was paid for). One
# round trip each, appending only the new messages' JSON to a list: no lease, no fencing, no
# compression, no Stop check, no metrics. It is the floor of persistence itself, on the same Redis.


def _blocks(message: Any) -> list[dict[str, Any]]:
    return [b.model_dump(mode="json", exclude_none=True) for b in message.content]


def bare_durable(env: Env) -> Run:
    """The bare loop plus a write-ahead write and a checkpoint write per tool turn (see above)."""
    client, tools, functions = _bare_parts(env)
    conn = env.services().store.redis

    def run(turns: int, approve: bool) -> None:
        key = f"bench:bare:{uuid.uuid4().hex}"
        messages: list[dict[str, Any]] = [{"role": "user", "content": _task(turns, approve)}]
        conn.rpush(key, json.dumps(messages[0]))
        while True:
            message = client.messages.create(
                model=MODEL, max_tokens=MAX_TOKENS, tools=tools, messages=messages
            )
            reply = {"role": "assistant", "content": _blocks(message)}
            messages.append(reply)
            calls = [b for b in message.content if b.type == "tool_use"]
            with conn.pipeline(transaction=False) as pipe:  # the write-ahead: reply and mark at once
                pipe.rpush(key, json.dumps(reply))
                pipe.set(f"{key}:started", ",".join(b.id for b in calls))
                pipe.execute()
            if message.stop_reason != "tool_use":
                conn.delete(key, f"{key}:started")
                return
            results = [
                {"type": "tool_result", "tool_use_id": b.id, "content": functions[b.name](**b.input)}
                for b in calls
            ]
            messages.append({"role": "user", "content": results})
            conn.rpush(key, json.dumps(messages[-1]))  # the checkpoint: the results, durable

    return run


def bare_durable_resume(env: Env) -> Resume:
    """The durable bare loop's resume: its messages and the decision are in Redis; it reads both
    (one round trip), marks the call started, runs it, appends the result and sends."""
    client, tools, functions = _bare_parts(env)
    conn = env.services().store.redis

    def send(messages: list[dict[str, Any]]) -> Any:
        return client.messages.create(model=MODEL, max_tokens=MAX_TOKENS, tools=tools, messages=messages)

    def resume(after: int) -> Clock:
        key = f"bench:bare:{uuid.uuid4().hex}"
        messages: list[dict[str, Any]] = [{"role": "user", "content": _task(after + 1, after)}]
        conn.rpush(key, json.dumps(messages[0]))
        while True:  # up to the call that needs a human, persisted as the per-turn loop does
            message = send(messages)
            messages.append({"role": "assistant", "content": _blocks(message)})
            conn.rpush(key, json.dumps(messages[-1]))
            if any(b.type == "tool_use" and b.name == "guarded_lookup" for b in message.content):
                break
            results = [
                {"type": "tool_result", "tool_use_id": b.id, "content": functions[b.name](**b.input)}
                for b in message.content
                if b.type == "tool_use"
            ]
            messages.append({"role": "user", "content": results})
            conn.rpush(key, json.dumps(messages[-1]))
        conn.set(f"{key}:decision", "approved")  # the click
        del messages
        gc.collect()
        started, mark = _start(), len(ARRIVALS)
        with conn.pipeline(transaction=False) as pipe:
            pipe.lrange(key, 0, -1)
            pipe.get(f"{key}:decision")
            stored, decision = pipe.execute()
        loaded = [json.loads(m) for m in stored]
        if decision != b"approved":
            raise RuntimeError("the decision did not come back")
        calls = [b for b in loaded[-1]["content"] if b["type"] == "tool_use"]
        conn.set(f"{key}:started", ",".join(b["id"] for b in calls))
        results = [
            {"type": "tool_result", "tool_use_id": b["id"], "content": functions[b["name"]](**b["input"])}
            for b in calls
        ]
        loaded.append({"role": "user", "content": results})
        conn.rpush(key, json.dumps(loaded[-1]))
        message = send(loaded)
        if message.stop_reason == "tool_use":
            raise RuntimeError("the durable bare loop's run did not end after the approved call")
        conn.delete(key, f"{key}:started", f"{key}:decision")
        return _arrival_since(mark, started)

    return resume


# --- ours, in memory ----------------------------------------------------------------------------


def _our_agent(env: Env, before_tool: Any = None) -> Any:
    from harness.client import make_client
    from harness.config import Limits
    from harness.loop import Agent
    from harness.policy import Policy, Tier
    from harness.tools import ToolRegistry

    return Agent(
        client=make_client(base_url=env.base_url, api_key="x", max_retries=0),
        tools=ToolRegistry([lookup, guarded_lookup], timeout_seconds=5.0),
        context=ToolContext(workspace=env.workspace),
        policy=Policy(default=Tier.ASK, tools={"lookup": Tier.ALLOW, "guarded_lookup": Tier.ASK}),
        limits=Limits(max_turns=GROWTH_TURNS + 10, token_budget=10**12, max_tokens=MAX_TOKENS),
        model=MODEL,
        before_tool=before_tool,
    )


def ours(env: Env) -> Run:
    """`harness.loop.drive` as the CLI runs it: no persistence between steps."""
    from harness.loop import Finished, drive
    from harness.state import new_run

    agent = _our_agent(env)

    def run(turns: int, approve: bool) -> None:
        _, outcome = drive(new_run(_task(turns, approve)), agent, lambda event: None)
        if not isinstance(outcome, Finished):
            raise RuntimeError(f"our run ended with {outcome!r}")

    return run


def _memory_steps(state: Any, agent: Any) -> tuple[Any, Any, str]:
    """`step` until the run leaves the loop, `RunState.dumps()` after every step; (state, outcome, stored)."""
    from harness.loop import step

    while True:
        result = step(state, agent)
        state = result.state
        stored = state.dumps()
        if result.outcome is not None:
            return state, result.outcome, stored


def ours_checkpointed(env: Env) -> Run:
    """`step` with `RunState.dumps()` after every step and before a side-effecting call runs
    (write-ahead); a park is written, read back, decided and resumed."""
    from harness.loop import AwaitingApproval, Finished
    from harness.state import Decision, RunState, Verdict, new_run, record_decisions

    agent = _our_agent(env, before_tool=lambda state, call: state.dumps())

    def run(turns: int, approve: bool) -> None:
        state = new_run(_task(turns, approve))
        state.dumps()
        state, outcome, stored = _memory_steps(state, agent)
        if isinstance(outcome, AwaitingApproval):
            decisions = {c.id: Decision(Verdict.APPROVED, by="U123") for c in outcome.calls}
            state = record_decisions(RunState.loads(stored), decisions)
            state.dumps()
            state, outcome, stored = _memory_steps(state, agent)
        if not isinstance(outcome, Finished):
            raise RuntimeError(f"our run ended with {outcome!r}")

    return run


def ours_checkpointed_resume(env: Env) -> Resume:
    """From the parked state as JSON text: `RunState.loads`, `record_decisions`, then `step` with
    the write-ahead `dumps()` and a `dumps()` after the step, until the next request."""
    from harness.loop import AwaitingApproval, Finished
    from harness.state import Decision, RunState, Verdict, new_run, record_decisions

    agent = _our_agent(env, before_tool=lambda state, call: state.dumps())

    def resume(after: int) -> float:
        state, outcome, stored = _memory_steps(new_run(_task(after + 1, after)), agent)
        if not isinstance(outcome, AwaitingApproval):
            raise RuntimeError(f"our run did not park: {outcome!r}")
        decisions = {c.id: Decision(Verdict.APPROVED, by="U123") for c in outcome.calls}
        gc.collect()
        started, mark = _start(), len(ARRIVALS)
        state = record_decisions(RunState.loads(stored), decisions)
        state, outcome, stored = _memory_steps(state, agent)
        if not isinstance(outcome, Finished):
            raise RuntimeError(f"our run ended with {outcome!r}")
        return _arrival_since(mark, started)

    return resume


# --- ours, as a worker: the real Driver and Store on a private redis-server ----------------------


def _worker_steps(svc: Any, driver: Any, state: Any) -> tuple[Any, Any]:
    """What `workers.life._advance` does per step, the Slack side left out (no turn summary is
    rendered, owed or posted): the worker's own agent (its write-ahead and Stop check), the step,
    its metrics, and a fenced checkpoint unless the next step's write-ahead mark saves it first."""
    from harness.loop import saves_first, step
    from workers import stepping

    agent = stepping.agent_of(svc, driver)
    while True:
        result = step(state, agent)
        state = result.state
        stepping.count_step(driver, state, result.events)
        if result.outcome is not None:
            return state, result.outcome
        if not saves_first(state, agent):
            driver.save(state=state.to_json())


def _worker_finish(driver: Any, state: Any, outcome: Any) -> None:
    from harness.loop import Finished
    from store import RunStatus

    if not isinstance(outcome, Finished):
        raise RuntimeError(f"the worker's run ended with {outcome!r}")
    driver.save(status=RunStatus.FINISHED, state=state.to_json())
    driver.finish()


def _driving(svc: Any, run_id: str) -> Any:
    from workers.driver import Driver

    return Driver(svc, run_id)


def worker(env: Env) -> Run:
    """A run stepped the way a worker steps it, Slack left out (see the module docstring)."""
    from harness.state import new_run
    from store import RunStatus

    svc = env.services()

    def run(turns: int, approve: bool) -> None:
        task = _task(turns, approve)
        with _driving(svc, _new_record(svc, task, RunStatus.RUNNING)) as driver:
            assert driver is not None
            state = new_run(task)
            driver.save(state=state.to_json())
            _worker_finish(driver, *_worker_steps(svc, driver, state))

    return run


def _park_in_redis(svc: Any, after: int) -> tuple[str, tuple[Any, ...]]:
    """A worker's run parked on `guarded_lookup` after `after` turns, let go; (run id, calls)."""
    from harness.loop import AwaitingApproval
    from harness.state import new_run
    from store import RunStatus
    from workers.driver import park_ttl

    task = _task(after + 1, after)
    run_id = _new_record(svc, task, RunStatus.RUNNING)
    with _driving(svc, run_id) as driver:
        assert driver is not None
        state = new_run(task)
        driver.save(state=state.to_json())
        state, outcome = _worker_steps(svc, driver, state)
        if not isinstance(outcome, AwaitingApproval):
            raise RuntimeError(f"the worker's run did not park: {outcome!r}")
        minutes = svc.config.approvals.expire_after_minutes
        driver.park(state, outcome.calls, park_ttl(minutes), time.time() + minutes * 60)
        if driver.settle():
            raise RuntimeError("the park settled as ready before any decision")
    return run_id, outcome.calls


def _decide_all(svc: Any, run_id: str, calls: tuple[Any, ...]) -> None:
    """Record an approval of every parked call as a click does (the decide script)."""
    from harness.state import Decision, Verdict

    record = svc.store.runs.load(run_id)
    for call in calls:
        decision = Decision(Verdict.APPROVED, by="UAPP")
        svc.store.parks.decide(run_id, record.park_id, call.id, decision, fingerprint=call.fingerprint)


def worker_resume(env: Env) -> Resume:
    """What `workers.life._parked` and `_resume` do up to the next request, without Slack."""
    from harness.state import record_decisions
    from observe import metrics
    from runtime.queue import RUN_JOB_TIMEOUT
    from store import RunStatus

    svc = env.services()

    def resume(after: int) -> float:
        run_id, calls = _park_in_redis(svc, after)
        _decide_all(svc, run_id, calls)
        gc.collect()
        started, mark = _start(), len(ARRIVALS)
        with _driving(svc, run_id) as driver:
            assert driver is not None
            record = driver.record
            view = svc.store.parks.view(run_id, record.park_id)
            if view.stop_by is not None:
                raise RuntimeError("a Stop nobody pressed")
            driver.beside_next_save(metrics.resume_account(run_id, record.park_id, view.decisions))
            state = record_decisions(record.run_state(), {k: v for k, v in view.decisions.items() if v})
            driver.beside_next_save(svc.store.threads.resumed(driver.record, RUN_JOB_TIMEOUT))
            driver.save(status=RunStatus.RUNNING, state=state.to_json(), expires_at=None)
            _worker_finish(driver, *_worker_steps(svc, driver, state))
        return _arrival_since(mark, started)

    return resume


def full_job(env: Env) -> Run:
    """`workers.jobs.drive` as an RQ job runs it in-process, turn summaries posted to the Slack stand-in."""
    from store import RunStatus
    from workers import jobs

    svc = env.services()

    def run(turns: int, approve: bool) -> None:
        run_id = _new_record(svc, _task(turns, approve), RunStatus.QUEUED)
        jobs.drive(run_id)
        if approve:
            record = svc.store.runs.load(run_id)
            _decide_all(svc, run_id, record.run_state().awaiting)
            jobs.drive(run_id)
        if svc.store.runs.load(run_id).status is not RunStatus.FINISHED:
            raise RuntimeError("the job's run did not finish")

    return run


def full_job_resume(env: Env) -> Resume:
    """`workers.jobs.drive` on a parked run whose decision is in (as `apply_decisions` calls it)."""
    from store import RunStatus
    from workers import jobs

    svc = env.services()

    def resume(after: int) -> float:
        run_id = _new_record(svc, _task(after + 1, after), RunStatus.QUEUED)
        jobs.drive(run_id)
        record = svc.store.runs.load(run_id)
        if record.status is not RunStatus.AWAITING_APPROVAL:
            raise RuntimeError("the job's run did not park")
        _decide_all(svc, run_id, record.run_state().awaiting)
        gc.collect()
        started, mark = _start(), len(ARRIVALS)
        jobs.drive(run_id)
        if svc.store.runs.load(run_id).status is not RunStatus.FINISHED:
            raise RuntimeError("the job's run did not finish")
        return _arrival_since(mark, started)

    return resume


# --- the peers ----------------------------------------------------------------------------------


def _langgraph(env: Env) -> Any:
    """`create_react_agent` + `MemorySaver`; `guarded_lookup` calls `interrupt`, resumed by `Command`."""
    from langchain_anthropic import ChatAnthropic
    from langchain_core.tools import tool as lc_tool
    from langgraph.checkpoint.memory import MemorySaver
    from langgraph.types import interrupt

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
        model_name=MODEL, base_url=env.base_url, api_key="x", max_retries=0, max_tokens=MAX_TOKENS, timeout=30
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_react_agent(model, [lookup, guarded_lookup], checkpointer=MemorySaver())


def _langgraph_config() -> Any:
    # 50 turns take 101 supersteps; the default recursion_limit of 25 stops the graph at 12.
    return {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 4 * GROWTH_TURNS + 10}


def langgraph_agent(env: Env) -> Run:
    from langgraph.types import Command

    graph = _langgraph(env)

    def run(turns: int, approve: bool) -> None:
        config = _langgraph_config()
        out = graph.invoke({"messages": [("user", _task(turns, approve))]}, config)
        while out.get("__interrupt__"):
            out = graph.invoke(Command(resume=True), config)
        if "Done after" not in str(out["messages"][-1].content):
            raise RuntimeError(f"LangGraph ended with {out['messages'][-1]!r}")

    return run


def langgraph_resume(env: Env) -> Resume:
    """From the `interrupt` (state in `MemorySaver`) to the request after `Command(resume=True)`."""
    from langgraph.types import Command

    graph = _langgraph(env)

    def resume(after: int) -> float:
        config = _langgraph_config()
        out = graph.invoke({"messages": [("user", _task(after + 1, after))]}, config)
        if not out.get("__interrupt__"):
            raise RuntimeError("LangGraph did not interrupt")
        gc.collect()
        started, mark = _start(), len(ARRIVALS)
        out = graph.invoke(Command(resume=True), config)
        if "Done after" not in str(out["messages"][-1].content):
            raise RuntimeError(f"LangGraph ended with {out['messages'][-1]!r}")
        return _arrival_since(mark, started)

    return resume


def _pydantic_ai(env: Env) -> Any:
    """`pydantic_ai.Agent`; `guarded_lookup` has `requires_approval=True` and comes back as
    `DeferredToolRequests`, answered with `DeferredToolResults` on a second `run_sync`."""
    from anthropic import AsyncAnthropic
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.models.anthropic import AnthropicModel, AnthropicModelSettings
    from pydantic_ai.providers.anthropic import AnthropicProvider

    client = AsyncAnthropic(base_url=env.base_url, api_key="x", max_retries=0)
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

    return agent


def _pydantic_ai_approve(agent: Any, result: Any) -> Any:
    from pydantic_ai import DeferredToolResults

    approvals = {c.tool_call_id: True for c in result.output.approvals}
    return agent.run_sync(
        message_history=result.all_messages(), deferred_tool_results=DeferredToolResults(approvals=approvals)
    )


def pydantic_ai_agent(env: Env) -> Run:
    from pydantic_ai import DeferredToolRequests

    agent = _pydantic_ai(env)

    def run(turns: int, approve: bool) -> None:
        result = agent.run_sync(_task(turns, approve))
        while isinstance(result.output, DeferredToolRequests):
            result = _pydantic_ai_approve(agent, result)
        if "Done after" not in str(result.output):
            raise RuntimeError(f"Pydantic AI ended with {result.output!r}")

    return run


def pydantic_ai_resume(env: Env) -> Resume:
    """From `DeferredToolRequests` (the messages in memory) to the request of the second `run_sync`."""
    from pydantic_ai import DeferredToolRequests

    agent = _pydantic_ai(env)

    def resume(after: int) -> float:
        result = agent.run_sync(_task(after + 1, after))
        if not isinstance(result.output, DeferredToolRequests):
            raise RuntimeError("Pydantic AI did not defer the call")
        gc.collect()
        started, mark = _start(), len(ARRIVALS)
        result = _pydantic_ai_approve(agent, result)
        if "Done after" not in str(result.output):
            raise RuntimeError(f"Pydantic AI ended with {result.output!r}")
        return _arrival_since(mark, started)

    return resume


# --- measuring ----------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    make: Callable[[Env], Run]
    approve: bool = False
    growth: bool = False  # also timed turn by turn in a GROWTH_TURNS-turn run
    run: Run | None = None
    error: str | None = None
    zero: list[Clock] = field(default_factory=list)
    full: list[Clock] = field(default_factory=list)
    trips: list[float] = field(default_factory=list)  # Redis round trips per turn, per round
    turns: list[list[Clock]] = field(default_factory=list)  # per growth round: turn 1..N


@dataclass
class ResumeRow:
    name: str
    make: Callable[[Env], Resume]
    resume: Resume | None = None
    error: str | None = None
    seconds: dict[int, list[Clock]] = field(default_factory=dict)  # turns before -> samples
    trips: dict[int, int] = field(
        default_factory=dict
    )  # turns before -> Redis round trips, decision to request


_FLOOR = "bare loop on the SDK (floor)"
_DURABLE = "bare loop + the 2 Redis writes a turn's promises need (floor of persistence)"
_WORKER = "ours: as a worker steps it (Redis, no Slack)"
_DRIVE = "ours: `drive` (in memory, the CLI)"


def _rows() -> list[Row]:
    return [
        Row(_FLOOR, bare_loop, growth=True),
        Row(_DURABLE, bare_durable, growth=True),
        Row(_DRIVE, ours, growth=True),
        Row("ours: `step` + `RunState.dumps()` every step", ours_checkpointed),
        Row("ours: `dumps()` + 1 approval (park, load, resume)", ours_checkpointed, approve=True),
        Row(_WORKER, worker, growth=True),
        Row("ours: the whole job, `workers.jobs.drive` (+ Slack stand-in)", full_job, growth=True),
        Row("ours: the whole job + 1 approval (park, click, resume job)", full_job, approve=True),
        Row("LangGraph `create_react_agent` + `MemorySaver`", langgraph_agent),
        Row("LangGraph + 1 `interrupt` / `Command(resume=...)`", langgraph_agent, approve=True),
        Row("Pydantic AI `Agent.run_sync`", pydantic_ai_agent),
        Row("Pydantic AI + 1 `requires_approval` round trip", pydantic_ai_agent, approve=True),
    ]


_RESUME_FLOOR = "bare loop: decision in memory → tool, append, send"
_RESUME_DURABLE = "bare loop, durable: decision in Redis → load, mark, tool, append, send"
_RESUME_WORKER = (
    "ours as a worker: decision in Redis → lease, load, save, write-ahead, tool, checkpoint, send"
)


def _resume_rows() -> list[ResumeRow]:
    return [
        ResumeRow(_RESUME_FLOOR, bare_resume),
        ResumeRow(_RESUME_DURABLE, bare_durable_resume),
        ResumeRow(
            "ours in memory: `RunState.loads` → `record_decisions` → `step` (+ `dumps()`)",
            ours_checkpointed_resume,
        ),
        ResumeRow(_RESUME_WORKER, worker_resume),
        ResumeRow(
            "ours: the whole resume job, `workers.jobs.drive` (+ card update to the Slack stand-in)",
            full_job_resume,
        ),
        ResumeRow("LangGraph: `Command(resume=True)` on `MemorySaver`", langgraph_resume),
        ResumeRow("Pydantic AI: `DeferredToolResults` on a second `run_sync`", pydantic_ai_resume),
    ]


def _check(fake: FakeMessagesAPI, errors: int) -> None:
    if len(fake.errors) > errors:
        raise RuntimeError(f"the stand-in refused a request: {fake.errors[-1][:200]}")


def _timed(fake: FakeMessagesAPI, row: Row, turns: int) -> Clock:
    assert row.run is not None
    errors = len(fake.errors)
    gc.collect()
    started = now()
    row.run(turns, row.approve)
    ended = now()
    _check(fake, errors)
    return ended[WALL] - started[WALL], ended[CPU] - started[CPU]


def _turn_times(fake: FakeMessagesAPI, row: Row) -> list[Clock]:
    """Seconds of each of the GROWTH_TURNS turns: between the arrivals of two successive requests."""
    assert row.run is not None
    errors = len(fake.errors)
    gc.collect()
    ARRIVALS.clear()
    TRIPS_AT_ARRIVAL.clear()
    row.run(GROWTH_TURNS, False)
    _check(fake, errors)
    got = list(ARRIVALS)
    if len(got) != GROWTH_TURNS + 1:
        raise RuntimeError(f"{len(got)} requests for a {GROWTH_TURNS}-turn run")
    return [(b[WALL] - a[WALL], b[CPU] - a[CPU]) for a, b in zip(got, got[1:], strict=False)]


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ").replace("|", "/")[:160]


def _made(cache: dict[Any, Any], make: Callable[[Env], Any], env: Env) -> Any:
    if make not in cache:
        cache[make] = make(env)
    return cache[make]


def measure() -> tuple[list[Row], list[ResumeRow]]:
    rows, resumes = _rows(), _resume_rows()
    with ExitStack() as stack:
        fake = stack.enter_context(FakeMessagesAPI())
        fake.responder = responder
        env = Env(fake.base_url, Path(stack.enter_context(tempfile.TemporaryDirectory())), stack)
        _per_turn(fake, env, rows)
        _growth(fake, rows)
        _resume(fake, env, resumes)
    return rows, resumes


def _per_turn(fake: FakeMessagesAPI, env: Env, rows: list[Row]) -> None:
    made: dict[Any, Run] = {}
    for row in rows:
        try:
            row.run = _made(made, row.make, env)
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
                before = _Counted.trips
                row.zero.append(_timed(fake, row, 0))
                between = _Counted.trips
                row.full.append(_timed(fake, row, TURNS))
                row.trips.append(((_Counted.trips - between) - (between - before)) / TURNS)
            except Exception as exc:
                row.error = _reason(exc)


def _growth(fake: FakeMessagesAPI, rows: list[Row]) -> None:
    for _ in range(GROWTH_REPEATS):
        for row in rows:
            if not row.growth or row.error is not None:
                continue
            try:
                row.turns.append(_turn_times(fake, row))
            except Exception as exc:
                row.error = _reason(exc)


def _resume(fake: FakeMessagesAPI, env: Env, resumes: list[ResumeRow]) -> None:
    made: dict[Any, Resume] = {}
    for row in resumes:
        try:
            row.resume = _made(made, row.make, env)
            for after in RESUME_AFTER:
                row.resume(after)
        except Exception as exc:
            row.error = _reason(exc)
    for _ in range(RESUME_REPEATS):
        for after in RESUME_AFTER:
            for row in resumes:
                if row.error is not None or row.resume is None:
                    continue
                errors = len(fake.errors)
                try:
                    row.seconds.setdefault(after, []).append(row.resume(after))
                    row.trips[after] = RESUME_TRIPS[-1]
                    _check(fake, errors)
                except Exception as exc:
                    row.error = _reason(exc)


# --- reporting ----------------------------------------------------------------------------------


def _per_turn_us(row: Row, k: int = WALL) -> float:
    full = statistics.median(c[k] for c in row.full)
    zero = statistics.median(c[k] for c in row.zero)
    return (full - zero) / TURNS * 1e6


def _round_ratios(row: Row, floor: Row, k: int = WALL) -> list[float]:
    """Per round, the ratio of `row`'s overhead per turn to the floor's in the same round."""
    return [
        (f[k] - z[k]) / (ff[k] - fz[k])
        for z, f, fz, ff in zip(row.zero, row.full, floor.zero, floor.full, strict=False)
    ]


def _window(turns: list[Clock], window: tuple[int, int], k: int) -> float:
    first, last = window
    return statistics.fmean(t[k] for t in turns[first - 1 : last])


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _x(value: float) -> str:
    return f"{value:.2f}x" if value == value else "n/a"


def _spread(ratios: list[float]) -> str:
    """The median of per-round ratios, and their middle half."""
    return f"{_x(statistics.median(ratios))} ({_x(percentile(ratios, 25))}-{_x(percentile(ratios, 75))})"


def _per_turn_table(rows: list[Row]) -> str:
    floor = rows[0]
    out: list[list[object]] = []
    for row in rows:
        if row.error is not None or floor.error is not None:
            out.append([row.name, f"not available: {row.error or floor.error}", *[""] * 7])
            continue
        wall, cpu = _round_ratios(row, floor, WALL), _round_ratios(row, floor, CPU)
        out.append(
            [
                row.name,
                statistics.median(c[WALL] for c in row.zero) * 1000,
                statistics.median(c[WALL] for c in row.full) * 1000,
                _per_turn_us(row, WALL),
                _spread(wall),
                _per_turn_us(row, CPU),
                _spread(cpu),
                statistics.median(row.trips),
            ]
        )
    headers = [
        "contender",
        "median 0-turn run (ms)",
        f"median {TURNS}-turn run (ms)",
        "wall: overhead per turn (µs)",
        "wall: ÷ bare, median per round (middle half)",
        "CPU per turn (µs)",
        "CPU: ÷ bare, median per round (middle half)",
        "Redis round trips per turn",
    ]
    return table(headers, out)


def _growth_table(rows: list[Row], k: int) -> str:
    floor = rows[0]
    out: list[list[object]] = []
    for row in rows:
        if not row.growth:
            continue
        if row.error is not None or not row.turns or not floor.turns:
            out.append([row.name, f"not available: {row.error}", *[""] * (2 * len(GROWTH_WINDOWS))])
            continue
        cells: list[object] = [row.name]
        for window in GROWTH_WINDOWS:
            mine = [_window(t, window, k) for t in row.turns]
            base = [_window(t, window, k) for t in floor.turns]
            cells += [
                statistics.median(mine) * 1e6,
                _x(statistics.median(a / b for a, b in zip(mine, base, strict=False))),
            ]
        first, last = GROWTH_WINDOWS[0], GROWTH_WINDOWS[-1]
        grew = statistics.median(_window(t, last, k) - _window(t, first, k) for t in row.turns)
        cells.append(grew * 1e6)
        out.append(cells)
    kind = "wall µs" if k == WALL else "CPU µs"
    headers = ["contender"]
    for first, last in GROWTH_WINDOWS:
        headers += [f"turns {first}-{last}: {kind} per turn", "÷ bare"]
    (a, b), (c, d) = GROWTH_WINDOWS[0], GROWTH_WINDOWS[-1]
    headers.append(f"growth {a}-{b} → {c}-{d} ({kind})")
    return table(headers, out)


def _resume_table(resumes: list[ResumeRow]) -> str:
    floor = resumes[0]
    out: list[list[object]] = []
    for row in resumes:
        if row.error is not None or floor.error is not None:
            out.append(
                [row.name, f"not available: {row.error or floor.error}", *[""] * (5 * len(RESUME_AFTER) - 1)]
            )
            continue
        cells: list[object] = [row.name]
        for after in RESUME_AFTER:
            mine, base = row.seconds[after], floor.seconds[after]
            for k in (WALL, CPU):
                ratios = [a[k] / b[k] for a, b in zip(mine, base, strict=False)]
                cells += [statistics.median(c[k] for c in mine) * 1e6, _spread(ratios)]
            cells.append(row.trips.get(after, ""))
        out.append(cells)
    headers = ["path"]
    for after in RESUME_AFTER:
        headers += [
            f"after {after} turns: wall p50 µs",
            "÷ bare, median per round (middle half)",
            "CPU p50 µs",
            "÷ bare (middle half)",
            "Redis round trips",
        ]
    return table(headers, out)


def _persistence_table(rows: list[Row], resumes: list[ResumeRow]) -> str:
    """Ours as a worker against the durable bare loop: what is ours beyond persisting at all."""
    named = {r.name: r for r in rows}
    durable, worker = named[_DURABLE], named[_WORKER]
    resumed = {r.name: r for r in resumes}
    out: list[list[object]] = []
    for label, k in (("wall", WALL), ("CPU", CPU)):
        cells: list[object] = [label]
        if durable.error or worker.error:
            out.append([label, f"not available: {durable.error or worker.error}", *[""] * 5])
            continue
        cells.append(_spread(_round_ratios(worker, durable, k)))
        for window in (GROWTH_WINDOWS[0], GROWTH_WINDOWS[-1]):
            pairs = zip(worker.turns, durable.turns, strict=False)
            ratios = [_window(a, window, k) / _window(b, window, k) for a, b in pairs]
            cells.append(_x(statistics.median(ratios)))
        base, mine = resumed[_RESUME_DURABLE], resumed[_RESUME_WORKER]
        for after in RESUME_AFTER:
            if base.error or mine.error:
                cells.append("n/a")
                continue
            pairs = zip(mine.seconds[after], base.seconds[after], strict=False)
            cells.append(_spread([a[k] / b[k] for a, b in pairs]))
        out.append(cells)
    (a, b), (c, d) = GROWTH_WINDOWS[0], GROWTH_WINDOWS[-1]
    headers = [
        "",
        "per tool turn (middle half)",
        f"turns {a}-{b}",
        f"turns {c}-{d}",
        *(f"resume after {n} turns (middle half)" for n in RESUME_AFTER),
    ]
    return table(headers, out)


def run() -> str:
    rows, resumes = measure()
    versions = ", ".join(
        f"{p} {_version(p)}"
        for p in ("anthropic", "langgraph", "langgraph-prebuilt", "langchain-anthropic", "pydantic-ai-slim")
    )
    return "\n\n".join(
        [
            "## Harness overhead per tool turn, and resume → next request",
            "`python -m tests.bench overhead`",
            f"Machine: {machine()}. Versions: {versions}. Rounds: {REPEATS} per-turn rounds (after "
            f"{WARMUP} warm-up rounds), {GROWTH_REPEATS} growth rounds, {RESUME_REPEATS} resume rounds.",
            f"Per tool turn: (median {TURNS}-turn run - median 0-turn run) / {TURNS}; the ratio to the "
            "bare loop per round, then its median.",
            _per_turn_table(rows),
            f"Growth: the time between the arrivals of two successive requests at the stand-in, in one "
            f"{GROWTH_TURNS}-turn run, by turn (the mean over the turns of each window; the median "
            "over rounds).",
            _growth_table(rows, WALL),
            _growth_table(rows, CPU),
            "Resume → next request: from the decision being in to the stand-in receiving the next request.",
            _resume_table(resumes),
            "Ours as a worker ÷ the durable bare loop (the floor of persistence: the two writes a turn's "
            "promises need, one round trip each, on the same Redis), medians of the per-round ratios:",
            _persistence_table(rows, resumes),
        ]
    )


if __name__ == "__main__":
    print(run())
