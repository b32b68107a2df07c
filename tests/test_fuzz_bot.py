"""Hypothesis throws well-signed malformed payloads at /slack/events: never a 5xx, never a tool run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes.messages_api import FakeMessagesAPI
from tests.fakes.signing import signed_headers
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import SIGNING_SECRET, RedisServer, Stack
from tests.test_faults import count

pytestmark = pytest.mark.e2e

scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=30)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
ids = st.sampled_from(["C1", "T1", "U1", "1.2", "", "../x", "Ev1", "a" * 300]) | st.text(max_size=12)
events = st.fixed_dictionaries(
    {"type": st.sampled_from(["app_mention", "message", "reaction_added", "app_home_opened", "nonsense"])},
    optional={
        "user": ids,
        "text": st.text(max_size=50),
        "ts": ids,
        "channel": ids,
        "thread_ts": ids,
        "bot_id": ids,
        "subtype": ids,
    },
)
envelopes = st.fixed_dictionaries(
    {"type": st.sampled_from(["event_callback", "url_verification", "app_rate_limited", "weird"])},
    optional={
        "event": events | values,
        "event_id": ids,
        "team_id": ids,
        "challenge": st.text(max_size=20),
        "api_app_id": ids,
    },
)
actions = st.fixed_dictionaries(
    {"type": st.sampled_from(["block_actions", "view_submission", "shortcut", "message_action", "x"])},
    optional={
        "user": st.fixed_dictionaries({}, optional={"id": ids}) | values,
        "channel": st.fixed_dictionaries({}, optional={"id": ids}) | values,
        "actions": st.lists(
            st.fixed_dictionaries(
                {
                    "action_id": st.sampled_from(
                        ["approve", "decline", "decline_with_reason", "retry", "other"]
                    )
                },
                optional={"value": st.text(max_size=80) | st.just("0" * 32 + ":toolu_1")},
            ),
            max_size=2,
        )
        | values,
        "view": values,
        "trigger_id": ids,
        "team": values,
    },
)
bodies = (
    envelopes.map(lambda e: (json.dumps(e), "application/json"))
    | actions.map(lambda a: (urlencode({"payload": json.dumps(a)}), "application/x-www-form-urlencoded"))
    | st.text(max_size=200).map(lambda t: (t, "application/json"))
    | st.text(max_size=200).map(lambda t: (t, "application/x-www-form-urlencoded"))
    | st.text(max_size=200).map(lambda t: (urlencode({"payload": t}), "application/x-www-form-urlencoded"))
)


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    url = redis_server.url.rsplit("/", 1)[0] + "/3"
    redis.Redis.from_url(url).flushdb()
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        stack = Stack(url, slack, model, Path(tmp_path_factory.mktemp("fuzz")))
        try:
            stack.start_bot()
            stack.start_worker()
            yield stack
        finally:
            stack.stop()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=bodies)
def test_well_signed_malformed_payloads_never_get_a_5xx(stack: Stack, body: tuple[str, str]) -> None:
    text, content_type = body
    status, _ = stack.post(text, content_type, headers=signed_headers(SIGNING_SECRET, text))
    count("malformed payloads tried")
    assert status < 500, (status, text[:300])


def test_after_the_fuzz_no_tool_ran_and_the_bot_still_serves(stack: Stack) -> None:
    assert stack.healthz() == 200
    # Mentions the fuzz made valid may reach the model: every such request was well-formed, and
    # none was ever answered, so no tool could run.
    assert all(e.startswith("script exhausted") for e in stack.model.errors), stack.model.errors
    assert list(stack.workspace.iterdir()) == [stack.workspace / "README.md"]
