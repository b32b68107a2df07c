"""The windows of counting rules in a real Redis: a call is counted as it is let run, atomically
with every other worker, so ten runs racing for three places run exactly three deploys; keys live
under `harness:` with a TTL; what is read back is not trusted."""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis

from gates.meters import RunMeter, window_of
from harness.calls import calls_in
from harness.config.policy_file import policy_of
from harness.counting import Count, Where
from harness.loop import Agent, AwaitingApproval, step
from harness.policy import Policy, Rule, Tier, limit_asks
from harness.state import RunState, new_run
from harness.tools import BUILTIN_TOOLS, Tool, ToolRegistry
from store import Store
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI

DEPLOYS = {"tool": "deploy_*", "tier": "ask", "max_calls": 3, "per": "1h", "scope": "channel"}
REFUNDS = {
    "tool": "refund",
    "tier": "ask",
    "max_sum": {"amount": 500},
    "per": "1d",
    "scope": "requester",
}


def policy(*rules: dict[str, Any]) -> Policy:
    return policy_of({"rules": list(rules), "tools": {"deploy_*": "allow", "refund": "allow"}}, "t.toml")


def where(channel: str = "C1", requester: str = "UA") -> Where:
    return Where(uuid.uuid4().hex, "T1", channel, "1.000100", requester)


def recording(name: str, ran: list[str], lock: threading.Lock) -> Tool:
    def call(_ctx: Any, args: dict[str, Any]) -> str:
        with lock:
            ran.append(str(args.get("service") or args.get("amount")))
        return "done"

    props = {"service": {"type": "string"}, "amount": {"type": "number"}}
    return Tool(name=name, description=name, input_schema={"type": "object", "properties": props}, call=call)


def one_call_run(agent: Agent, name: str, args: dict[str, Any]) -> RunState:
    """A run whose model just asked for one call (ruled as a worker rules it)."""
    content = [{"type": "tool_use", "id": "toolu_1", "name": name, "input": args}]
    state = new_run("go")
    messages = (*state.messages, {"role": "assistant", "content": content})
    return replace(state, messages=messages, turns=1, pending=calls_in(content, agent))


def test_ten_runs_racing_for_three_places_run_exactly_three(
    store: Store, model: FakeMessagesAPI, workspace: Path
) -> None:
    ran: list[str] = []
    lock = threading.Lock()
    tools = ToolRegistry([*BUILTIN_TOOLS, recording("deploy_web", ran, lock)], timeout_seconds=5.0)
    base = replace(make_agent(model, workspace), tools=tools, policy=policy(DEPLOYS))
    agents = [replace(base, meter=RunMeter(store, where())) for _ in range(10)]
    states = [one_call_run(agent, "deploy_web", {"service": f"s{i}"}) for i, agent in enumerate(agents)]
    assert all(s.pending[0].tier is Tier.ALLOW for s in states)  # each below the limit when ruled

    barrier = threading.Barrier(10)
    outcomes: list[Any] = [None] * 10

    def go(i: int) -> None:
        barrier.wait()
        outcomes[i] = step(states[i], agents[i])

    threads = [threading.Thread(target=go, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    parked = [r for r in outcomes if isinstance(r.outcome, AwaitingApproval)]
    assert len(ran) == 3 and len(parked) == 7
    for result in parked:
        (call,) = result.outcome.calls
        assert limit_asks(call.why) and "max_calls = 3 per 1h by channel, 3 ran" in call.why
    rule = base.policy.rules[0]
    assert RunMeter(store, where()).seen(rule, "toolu_x").total == 3
    # Another channel has a window of its own.
    assert RunMeter(store, where(channel="C2")).seen(rule, "toolu_x").total == 0


def test_a_window_lives_under_harness_with_a_ttl(store: Store, conn: redis.Redis) -> None:
    rule = policy(DEPLOYS).rules[0]
    meter = RunMeter(store, where())
    assert meter.take("toolu_1", [Count(rule, 1.0)]) is None
    (key,) = conn.keys("*")
    assert key.decode().startswith("harness:meter:") and key.decode().endswith(":channel:T1:C1")
    assert 3600 < conn.ttl(key) <= 3660


def test_a_call_is_counted_once_and_a_stop_gives_its_place_back(store: Store) -> None:
    rule = policy(DEPLOYS).rules[0]
    meter = RunMeter(store, where())
    for _ in range(3):
        assert meter.take("toolu_1", [Count(rule, 1.0)]) is None  # a reply lost: sent again
    assert meter.seen(rule, "toolu_2").total == 1
    assert meter.seen(rule, "toolu_1").total == 0  # a call's own entry is left out
    meter.give_back("toolu_1", [rule])
    assert meter.seen(rule, "toolu_2").total == 0


def test_past_the_limit_nothing_is_counted_unless_a_person_said_yes(store: Store) -> None:
    deploys, refunds = policy(DEPLOYS, REFUNDS).rules
    meter = RunMeter(store, where())
    for i in range(3):
        assert meter.take(f"c{i}", [Count(deploys, 1.0)]) is None
    over = meter.take("c3", [Count(deploys, 1.0)])
    assert over is not None and over[0] is deploys and over[1].total == 3
    assert meter.seen(deploys, "c9").total == 3
    assert meter.take("c3", [Count(deploys, 1.0, forced=True)]) is None
    assert meter.seen(deploys, "c9").total == 4

    assert meter.take("r1", [Count(refunds, 450.0)]) is None
    over = meter.take("r2", [Count(refunds, 80.0)])
    assert over is not None and over[0] is refunds and over[1].total == 450
    assert meter.take("r3", [Count(refunds, 50.0)]) is None
    assert meter.seen(refunds, "r9").total == 500


def test_a_hostile_entry_counts_as_past_the_limit(store: Store, conn: redis.Redis) -> None:
    refunds: Rule = policy(REFUNDS).rules[0]
    w = where()
    meter = RunMeter(store, w)
    key = window_of(refunds, w).key
    conn.zadd(key, {"oops|x:y": 1e12})  # not a number: never read as a small amount
    seen = meter.seen(refunds, "r1")
    assert not seen.known
    over = meter.take("r1", [Count(refunds, 1.0)])
    assert over is not None and not over[1].known


def test_an_id_the_store_does_not_write_is_past_the_limit(store: Store) -> None:
    rule = policy({**DEPLOYS, "scope": "thread"}).rules[0]
    meter = RunMeter(store, Where(uuid.uuid4().hex, "T1", "C1", "not-a-ts", "UA"))
    assert not meter.seen(rule, "toolu_1").known
    assert meter.take("toolu_1", [Count(rule, 1.0)]) is not None
    assert meter.take("toolu_1", [Count(rule, 1.0, forced=True)]) is None
