"""A turn shown again (`Driver.show_turn`) against the fake Slack Web API and a real redis-server.

A parked turn's message stopped with a line that waits; when the turn goes on, that message is
taken out and the calls show anew, each as it stands. A driver that dies midway (before it saved,
after its new message opened, even after it took the old one out) leaves nothing that a driver after
it shows twice or wrongly: the thread ends with one line per call, each telling how its call ended.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis
from slack_sdk import WebClient

from harness.config import Config
from harness.policy import Tier
from harness.signals import ToolReturned
from harness.state import Decision, PendingCall, Verdict
from harness.tools import ToolResult
from messages import texts
from runtime.queue import make_queue
from store import RunRecord, RunStatus, Store, new_run_id
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import wait_until
from workers.driver import Driver
from workers.services import Services

CHANNEL = "C77"
ASKS = PendingCall("toolu_a", "write_file", {"path": "a.txt", "content": "a > b & c"}, Tier.ASK)
DENIED = PendingCall("toolu_b", "delete_file", {"path": "b.txt"}, Tier.DENY)


@pytest.fixture
def slack() -> Iterator[FakeSlackAPI]:
    with FakeSlackAPI(bot_token="xoxb-test") as fake:
        yield fake


@pytest.fixture
def svc(redis_url: str, slack: FakeSlackAPI, monkeypatch: pytest.MonkeyPatch) -> Services:
    monkeypatch.setenv("HARNESS_STREAM_PACE_MS", "50")
    conn = redis.Redis.from_url(redis_url)
    client = WebClient(token="xoxb-test", base_url=slack.base_url)
    return Services(Store(conn), make_queue(conn), client, Config(), model=None)  # type: ignore[arg-type]


def streamed(slack: FakeSlackAPI) -> list[dict[str, Any]]:
    """The streamed messages still in the thread, once none of them streams any more."""
    wait_until(lambda: not any(s["streaming"] for s in slack.streams()))
    return [s for s in slack.streams() if s["tasks"]]


def a_parked_run(svc: Services, slack: FakeSlackAPI) -> str:
    """A run parked on `ASKS` (the policy denied `DENIED`), as a park leaves it: its turn's message
    stopped with a line that waits, kept in the record for what comes after the decision."""
    root = svc.slack.chat_postMessage(channel=CHANNEL, text="<@UBOT> go")["ts"]
    record = RunRecord(new_run_id(), "T1", CHANNEL, root, "UALICE", "go", status=RunStatus.RUNNING)
    svc.store.runs.save_run(replace(record, working_ts=root))  # its Working message is no matter here
    with Driver(svc, record.run_id) as driver:
        assert driver is not None
        driver.live_view().requested([ASKS, DENIED])
        driver.seal_for_park([ASKS])
        driver.save(status=RunStatus.AWAITING_APPROVAL)
        driver.hand_parked_live()
    (parked,) = streamed(slack)
    assert parked["tasks"]["toolu_a"]["details"] == texts.TASK_WAITING
    assert parked["tasks"]["toolu_b"]["details"] == texts.TASK_DENIED  # denied at once, never pending
    return record.run_id


def test_a_turn_resumed_after_its_park_shows_its_calls_anew_and_takes_the_waiting_line_out(
    svc: Services, slack: FakeSlackAPI
) -> None:
    run_id = a_parked_run(svc, slack)
    parked_ts = svc.store.runs.load(run_id).live_ts
    approved = replace(ASKS, decision=Decision(Verdict.APPROVED, by="UALICE"))
    with Driver(svc, run_id) as driver:
        assert driver is not None
        driver.save(status=RunStatus.RUNNING)
        driver.show_turn([approved, DENIED])
        driver.live_view()(_returned(approved))
        driver.deliver()  # the stopped message goes
        settles = driver.seal_live()
    assert settles is not None and settles != parked_ts
    (shown,) = streamed(slack)
    assert shown["ts"] == settles and parked_ts not in {s["ts"] for s in slack.streams()}
    assert _ends(shown["tasks"]) == {
        "toolu_a": ("complete", texts.TASK_APPROVED, "Wrote 9 characters to a.txt"),
        "toolu_b": ("error", texts.TASK_DENIED, None),
    }
    assert "a > b & c" in shown["tasks"]["toolu_a"]["title"]  # plain text, as written


def test_a_driver_that_died_while_showing_the_turn_again_leaves_one_line_per_call(
    svc: Services, slack: FakeSlackAPI
) -> None:
    run_id = a_parked_run(svc, slack)
    approved = replace(ASKS, decision=Decision(Verdict.APPROVED, by="UALICE"))
    with Driver(svc, run_id) as dying:
        assert dying is not None
        dying.save(status=RunStatus.RUNNING)  # resumed, and the last write it made
        dying.show_turn([approved, DENIED])
        wait_until(lambda: len(svc.store.live.open(run_id)) == 1)  # its new message opened …
        dying.deliver()  # … and the stopped one went: then it died, nothing more saved
    assert len(streamed(slack)) == 1

    with Driver(svc, run_id) as next_driver:  # as a driver after a crash goes on from the checkpoint
        assert next_driver is not None
        next_driver.drop_orphans()
        next_driver.show_turn([approved, DENIED])
        next_driver.live_view()(_returned(approved))
        next_driver.deliver()  # the stopped message is owed again: gone already, nothing happens
        settles = next_driver.seal_live()
    (shown,) = streamed(slack)  # one message shows the turn: the dead driver's is taken out
    assert shown["ts"] == settles
    assert _ends(shown["tasks"]) == {
        "toolu_a": ("complete", texts.TASK_APPROVED, "Wrote 9 characters to a.txt"),
        "toolu_b": ("error", texts.TASK_DENIED, None),
    }
    assert next_driver.record.live_ts is None  # the next save forgets the stopped message
    assert svc.store.live.open(run_id) == [settles]  # the only live message left, for the summary


def _returned(call: PendingCall) -> ToolReturned:
    return ToolReturned(1, replace(call, result=ToolResult("Wrote 9 characters to a.txt")))


def _ends(tasks: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str, str | None]]:
    return {i: (t["status"], t.get("details", ""), t.get("output")) for i, t in tasks.items()}
