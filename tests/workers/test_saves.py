"""A run's saves: a step's metrics ride in the save's round trip, the conversation is packed a
message at a time.

A tool turn used to cost three round trips (its write-ahead mark, its metrics, its save); the
metrics now go with the save. These tests count the round trips on the wire (a redis-py
connection class that counts its packed sends) and check that nothing is lost or applied twice
when Redis has forgotten its scripts or a write beside the save fails. A save no longer encodes
and compresses the whole conversation again (`RecordEncoder`): every sequence of saves a run can
make reads back as the record it saved.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from slack_sdk import WebClient

from harness.config import Config
from harness.context import clear_old_results
from harness.loop import TurnDone
from harness.policy import Tier
from harness.state import PendingCall, RunState, StateError, Usage
from harness.tools import ToolResult
from observe import metrics
from runtime.queue import make_queue
from store import Beside, RecordEncoder, RunRecord, RunStatus, Store, new_run_id, pack, unpack
from store.keys import Keys
from tests.stack import RedisServer
from workers.driver import Driver
from workers.services import Services


class Counted(redis.Connection):
    """A redis-py connection that counts its round trips (one per packed send; a pipeline is one)."""

    sends = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        Counted.sends += 1
        super().send_packed_command(command, check_health)


@pytest.fixture
def counted(redis_server: RedisServer) -> Iterator[redis.Redis]:
    pool = redis.ConnectionPool.from_url(redis_server.url, connection_class=Counted)
    client = redis.Redis(connection_pool=pool)
    client.flushdb()
    yield client
    client.close()


def services(conn: redis.Redis) -> Services:
    return Services(Store(conn), make_queue(conn), WebClient(token="xoxb-unused"), Config(), model=None)  # type: ignore[arg-type]


def a_run(store: Store) -> RunRecord:
    record = RunRecord(new_run_id(), "T1", "C1", "1.000001", "UA", "hi", status=RunStatus.RUNNING)
    store.runs.save_run(record)
    return record


def a_step(run_id: str) -> tuple[RunState, Beside]:
    call = PendingCall("toolu_1", "get_time", {}, Tier.ALLOW, result=ToolResult("12:00"))
    state = RunState(
        messages=({"role": "user", "content": "hi"},), turns=1, requests=2, usage=Usage(100, 10, 0, 0)
    )
    return state, metrics.step_account(run_id, state, (TurnDone(1, (call,), 110),))


def counts(conn: redis.Redis) -> dict[str, int]:
    stored = conn.hgetall(Keys.metric_counters())
    return {k.decode(): int(float(v)) for k, v in stored.items()}


def test_a_steps_metrics_ride_in_its_save_one_round_trip(counted: redis.Redis) -> None:
    svc = services(counted)
    record = a_run(svc.store)
    with Driver(svc, record.run_id) as driver:
        assert driver is not None
        state, account = a_step(record.run_id)
        driver.beside_next_save(account)
        driver.save()  # Redis learns both scripts (a fresh server has neither)
        driver.beside_next_save(account)
        before = Counted.sends
        driver.save(state=state.to_json())
        assert Counted.sends - before == 1  # the save and the metrics, one pipeline
    saved = svc.store.runs.load(record.run_id)
    assert saved is not None and saved.state == state.to_json()
    got = counts(counted)
    assert got[metrics.counter_field(metrics.TURNS)] == 1
    assert got[metrics.counter_field(metrics.REQUESTS)] == 2
    assert got[metrics.counter_field(metrics.TOOL_CALLS, tier="allow", outcome="ran")] == 1


def test_scripts_redis_forgot_are_loaded_again_and_each_write_applies_once(counted: redis.Redis) -> None:
    svc = services(counted)
    record = a_run(svc.store)
    with Driver(svc, record.run_id) as driver:
        assert driver is not None
        state, account = a_step(record.run_id)
        counted.script_flush()  # as after a Redis restart: neither the save's script nor the metrics'
        driver.beside_next_save(account)
        driver.save(state=state.to_json())
        driver.beside_next_save(account)  # the same step again (a driver redoing it): counted once
        driver.save(state=state.to_json())
    saved = svc.store.runs.load(record.run_id)
    assert saved is not None and saved.state == state.to_json()
    assert counts(counted)[metrics.counter_field(metrics.TURNS)] == 1
    assert counts(counted)[metrics.counter_field(metrics.TOOL_CALLS, tier="allow", outcome="ran")] == 1


def test_a_write_beside_that_fails_is_logged_and_the_save_stands(
    counted: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    svc = services(counted)
    record = a_run(svc.store)
    counted.set("not-a-hash", "x")
    broken = Beside("a broken figure", "return redis.call('HINCRBY', KEYS[1], 'f', 1)", ("not-a-hash",), ())
    with Driver(svc, record.run_id) as driver:
        assert driver is not None
        driver.beside_next_save(broken)
        with caplog.at_level(logging.WARNING):
            driver.save(status=RunStatus.RUNNING, error="saved anyway")
    saved = svc.store.runs.load(record.run_id)
    assert saved is not None and saved.error == "saved anyway"
    assert any("a broken figure was not recorded" in r.getMessage() for r in caplog.records)


def test_metrics_no_save_carried_are_written_when_the_driver_lets_go(counted: redis.Redis) -> None:
    svc = services(counted)
    record = a_run(svc.store)
    with Driver(svc, record.run_id) as driver:
        assert driver is not None
        driver.beside_next_save(a_step(record.run_id)[1])
        assert counts(counted) == {}  # waiting for a save
    assert counts(counted)[metrics.counter_field(metrics.TURNS)] == 1


# --- the conversation packed a message at a time ----------------------------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=40)  # any character: newlines, quotes, NUL
_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant"]),
        "content": st.lists(st.dictionaries(_text, _text), max_size=3),
    }
)
# What a run's successive saves see: messages appended, the last one replaced (a pause_turn merge),
# the conversation rebuilt (results cleared, an older state), or no conversation at all.
_move = st.one_of(
    st.tuples(st.just("append"), st.lists(_message, min_size=1, max_size=3)),
    st.tuples(st.just("replace_last"), _message),
    st.tuples(st.just("rebuild"), st.lists(_message, max_size=4)),
    st.tuples(st.just("no_state"), st.none()),
    st.tuples(st.just("task"), _text),
)


@settings(max_examples=300, deadline=None)
@given(moves=st.lists(_move, min_size=1, max_size=12))
def test_every_save_reads_back_as_the_record_it_packed(moves: list[tuple[str, Any]]) -> None:
    encoder = RecordEncoder()
    record = RunRecord("a" * 32, "T1", "C1", "1.000001", "UA", "hi", status=RunStatus.RUNNING)
    messages: list[dict[str, Any]] = []
    for kind, value in moves:
        state: dict[str, Any] | None = {"version": 1, "messages": messages, "turns": len(messages)}
        if kind == "append":
            messages = [*messages, *value]
        elif kind == "replace_last" and messages:
            messages = [*messages[:-1], value]
        elif kind == "rebuild":
            messages = [dict(m) for m in value]  # new objects, equal or not
        elif kind == "task":
            record = replace(record, task=value)
        state = None if kind == "no_state" else {"version": 1, "messages": messages, "turns": len(messages)}
        record = replace(record, state=state)
        packed = encoder.encode(record)
        assert json.loads(unpack(packed)) == json.loads(record.to_json())
        assert RunRecord.from_json(unpack(packed)) == record


def test_a_run_saved_turn_after_turn_and_its_results_cleared_loads_as_saved(counted: redis.Redis) -> None:
    svc = services(counted)
    record = a_run(svc.store)
    messages: tuple[dict[str, Any], ...] = ({"role": "user", "content": "read the files"},)
    with Driver(svc, record.run_id) as driver:
        assert driver is not None
        for turn in range(1, 30):
            use = {
                "type": "tool_use",
                "id": f"toolu_{turn}",
                "name": "read_file",
                "input": {"path": f"{turn}.txt"},
            }
            result = {
                "type": "tool_result",
                "tool_use_id": f"toolu_{turn}",
                "content": f"line {turn}\n" * 200,
            }
            messages = (
                *messages,
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [result]},
            )
            if turn == 20:  # context editing: older results cleared, the messages holding them rebuilt
                cleared = clear_old_results(messages, limit=2000)
                assert cleared != messages
                messages = cleared
            state = RunState(messages=messages, turns=turn, requests=turn)
            driver.save(state=state.to_json())
            loaded = svc.store.runs.load(record.run_id)
            assert loaded is not None and loaded.run_state() == state
        stored = counted.get(Keys.run(record.run_id))
        assert stored is not None and stored.startswith(b"z2:")
        as_a_whole = pack(driver.record.to_json())
        assert len(stored) <= len(as_a_whole) * 1.1  # compressed as well as the whole record at once


def test_a_split_record_that_lost_its_end_is_refused() -> None:
    good = RecordEncoder().encode(
        RunRecord("a" * 32, "T1", "C1", "1.000001", "UA", "hi", state={"messages": [{"role": "user"}]})
    )
    assert unpack(good)  # reads
    with pytest.raises(StateError):
        unpack(b"z2:" + zlib.compress(b'[{"role":"user"}]'))  # no newline: where the rest goes is unknown
    with pytest.raises(StateError):
        unpack(good[:-5])  # cut short


def test_a_resume_save_forgets_the_expiry_and_takes_the_thread_in_its_own_round_trip(
    counted: redis.Redis,
) -> None:
    svc = services(counted)
    record = a_run(svc.store)
    parked = replace(record, status=RunStatus.AWAITING_APPROVAL, park_id=1, expires_at=time.time() + 600)
    svc.store.threads.take(record, 60)
    with Driver(svc, record.run_id) as driver:
        assert driver is not None
        assert svc.store.parks.park(parked, driver.token, driver.seconds, ["toolu_1"], ttl=3600)
        driver.amend(status=parked.status, park_id=parked.park_id, expires_at=parked.expires_at)
        driver.save()  # Redis learns the save's script
        counted.script_load(svc.store.threads.resumed(parked, 3600).script)  # and the resume's
        counted.expire(Keys.thread_lock(*record.thread), 5)  # as a long park leaves it
        assert counted.zscore(Keys.expiries(), f"{record.run_id}:1") is not None
        driver.beside_next_save(svc.store.threads.resumed(parked, 3600))
        before = Counted.sends
        driver.save(status=RunStatus.RUNNING, expires_at=None)
        assert Counted.sends - before == 1
    assert counted.zscore(Keys.expiries(), f"{record.run_id}:1") is None  # no expiry fires on it now
    assert counted.get(Keys.thread_lock(*record.thread)) == record.run_id.encode()
    assert counted.ttl(Keys.thread_lock(*record.thread)) > 60  # taken again for the run's job


def test_a_runs_files_are_found_in_its_thread_by_their_readable_names_and_by_older_names(
    conn: redis.Redis,
) -> None:
    """A file has no metadata: its name says which run and post it is (a recovering driver must not
    upload it twice). Named by its heading now, with the run's first digits; the whole id before."""
    from slack_sdk import WebClient

    from harness.config import Config
    from runtime.queue import make_queue
    from store import Store, new_run_id
    from tests.fakes.slack_api import FakeSlackAPI
    from workers.services import Services, upload_name

    run, other = new_run_id(), new_run_id()
    with FakeSlackAPI(bot_token="xoxb-test") as slack:
        client = WebClient(token="xoxb-test", base_url=slack.base_url)
        svc = Services(Store(conn), make_queue(conn), client, Config(), model=None)  # type: ignore[arg-type]
        thread = client.chat_postMessage(channel="C1", text="asked")["ts"]
        assert upload_name("q3-sales.md", run, "7") == f"q3-sales-{run[:8]}-7.md"
        assert svc.upload("C1", thread, upload_name("q3-sales.md", run, "7"), "The whole answer", "x")
        assert svc.upload("C1", thread, f"answer-{run}-9.md", "The whole answer", "y")  # as 0.1 named it
        assert svc.upload("C1", thread, upload_name("answer.md", other, "7"), "The whole answer", "z")
        found = svc.find_posted("C1", thread, run)
    assert found is not None and set(found) == {"7:file", "9:file"}  # not the other run's
