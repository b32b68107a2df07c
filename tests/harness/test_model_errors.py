"""The SDK's own retries on 429/529 honour `retry-after`, bounded so a worker never sleeps for hours."""

from __future__ import annotations

import threading
from pathlib import Path

from harness.client import make_client
from harness.loop import Failed, Finished, drive
from harness.state import new_run
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, http_error, reply, text


def test_429_and_529_are_retried_by_the_sdk_honouring_retry_after(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    model.script(
        http_error(429, headers={"retry-after": "0.05"}),
        http_error(529, headers={"retry-after": "0.05"}),
        reply(text("made it")),
    )
    _, outcome = drive(new_run("x"), make_agent(model, workspace, max_retries=2), lambda e: None)
    assert outcome == Finished("made it", "end_turn")
    assert len(model.requests) == 3


def test_retries_exhausted_is_a_failed_outcome_not_an_exception(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    model.script(*[http_error(529, headers={"retry-after": "0.01"})] * 3)
    state, outcome = drive(new_run("x"), make_agent(model, workspace, max_retries=2), lambda e: None)
    assert isinstance(outcome, Failed) and outcome.status_code == 529
    assert len(model.requests) == 3


def test_a_huge_retry_after_is_capped(model: FakeMessagesAPI, workspace: Path) -> None:
    model.script(http_error(429, headers={"retry-after": "86400"}), reply(text("soon")))
    client = make_client(base_url=model.base_url, api_key="sk-test", max_retries=1, retry_after_cap=0.1)
    agent = make_agent(model, workspace, client=client)
    outcomes: list[object] = []
    runner = threading.Thread(
        target=lambda: outcomes.append(drive(new_run("x"), agent, lambda e: None)[1]), daemon=True
    )
    runner.start()
    runner.join(10)  # uncapped, the SDK would sleep a day in there: fail instead of hanging
    assert outcomes == [Finished("soon", "end_turn")]
    assert len(model.requests) == 2


def test_a_connection_refused_is_a_failed_outcome(workspace: Path) -> None:
    with FakeMessagesAPI() as gone:
        url = gone.base_url
    agent = make_agent(gone, workspace, client=make_client(base_url=url, api_key="sk-test", max_retries=0))
    _, outcome = drive(new_run("x"), agent, lambda e: None)
    assert isinstance(outcome, Failed) and "Connection" in outcome.error
