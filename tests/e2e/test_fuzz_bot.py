"""Every corruption of every kind of Slack request, well signed, at a real `python -m bot`.

The requests are realistic payloads (tests/fakes/payloads.py) corrupted field by field: each key
removed, each value replaced by every other JSON type, each string by odd unicode. Whatever
arrives, the answer is a 2xx or a 4xx (never a 5xx: Slack would retry it), and a run starts only
for a well-formed `app_mention` or direct message (a person's `message` with `channel_type` im and no
subtype) with string text.
"""

from __future__ import annotations

import copy
import http.client
import itertools
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import Store
from tests.e2e.test_faults import count
from tests.fakes import payloads
from tests.fakes.messages_api import FakeMessagesAPI
from tests.fakes.signing import signed_headers
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import SIGNING_SECRET, RedisServer, Stack

pytestmark = pytest.mark.e2e

DELIVERIES = payloads.deliveries()
MAX_TASK_CHARS = 20_000  # what a run keeps of the mention's text


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    url = redis_server.url.rsplit("/", 1)[0] + "/3"
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        stack = Stack(url, slack, model, Path(tmp_path_factory.mktemp("fuzz")))
        try:
            stack.start_bot()  # no worker: a run is its record in Redis, written before the answer
            yield stack
        finally:
            stack.stop()


@pytest.fixture
def connection(stack: Stack) -> redis.Redis:
    """The bot's Redis, emptied before the test."""
    conn = redis.Redis.from_url(stack.redis_url)
    conn.flushdb()
    return conn


@dataclass(frozen=True)
class Case:
    how: str
    delivery: payloads.Delivery
    payload: Any
    retry_headers: dict[str, str] | None = None  # None: the delivery's own

    def post(self, stack: Stack) -> int:
        body, content_type = payloads.http_body(self.delivery.kind, self.payload)
        retry = self.delivery.retry_headers() if self.retry_headers is None else self.retry_headers
        status, _ = stack.post(body, content_type, headers={**signed_headers(SIGNING_SECRET, body), **retry})
        return status


class Fresh:
    """Gives every case its own event id, user, channel and text (where the corruption left them).

    So no case is swallowed as a duplicate of another or held back by the per-user and per-channel
    bounds, and each run can be traced back to the one case whose text it carries.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.n = itertools.count()

    def __call__(self, base: payloads.Json, payload: Any) -> Any:
        n = f"{self.prefix}{next(self.n)}"
        if not isinstance(payload, dict):
            return payload
        if payload.get("event_id") == base.get("event_id"):
            payload["event_id"] = f"EvFuzz{n}"
        event, original = payload.get("event"), base.get("event")
        if isinstance(event, dict) and isinstance(original, dict):
            for key, fresh in (
                ("user", f"UFUZZ{n}"),
                ("channel", f"CFUZZ{n}"),
                ("text", f"<@UBOT> case {n}"),
            ):
                if event.get(key) == original.get(key):
                    event[key] = fresh
        return payload


FRESH = Fresh("B")  # one numbering for every example, so none is taken for a retry of another


def well_formed_mention(payload: Any) -> bool:
    """An `app_mention`, or a person's direct message, whose fields a run is made of are all strings:
    the only things that may start a run."""
    if not isinstance(payload, dict) or payload.get("type") != "event_callback":
        return False
    event = payload.get("event")
    if not isinstance(event, dict):
        return False
    person = not event.get("subtype") and not event.get("bot_id")
    direct = event.get("type") == "message" and event.get("channel_type") == "im" and person
    return (
        (event.get("type") == "app_mention" or direct)
        and isinstance(payload.get("event_id"), str)
        and all(isinstance(event.get(key), str) for key in ("text", "user", "channel", "ts"))
    )


def run_keys(connection: redis.Redis) -> set[bytes]:
    return set(connection.scan_iter("harness:run:*", count=1000))


def run_tasks(connection: redis.Redis, keys: set[bytes] | None = None) -> list[str]:
    """The task of every run record (of those under `keys`, if given)."""
    store = Store(connection)
    tasks = []
    for key in run_keys(connection) if keys is None else keys:
        record = store.runs.load(key.decode().rsplit(":", 1)[1])
        assert record is not None
        tasks.append(record.task)
    return tasks


class Poster:
    """Posts cases over one keep-alive connection per thread (twice the rate of a connection each)."""

    def __init__(self, stack: Stack) -> None:
        self.port = stack.port
        self.local = threading.local()

    def __call__(self, case: Case) -> int:
        body, content_type = payloads.http_body(case.delivery.kind, case.payload)
        headers = {
            "Content-Type": content_type,
            **signed_headers(SIGNING_SECRET, body),
            **case.delivery.retry_headers(),
        }
        for attempt in range(2):
            conn = getattr(self.local, "conn", None) or http.client.HTTPConnection(
                "127.0.0.1", self.port, timeout=30
            )
            self.local.conn = conn
            try:
                conn.request("POST", "/slack/events", body=body.encode(), headers=headers)
                response = conn.getresponse()
                response.read()
                return response.status
            except (http.client.RemoteDisconnected, ConnectionError):  # the server closed an idle one
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def every_single_corruption(fresh: Fresh) -> list[Case]:
    """Each delivery as Slack sends it, then every corruption of each field.

    Deliveries of one family (the same envelope, payload type and event type: an app_mention and
    its retry, say) share most fields; a corruption already made at a path of the family's first
    delivery is not made again.
    """
    cases, done = [], set()
    for delivery in DELIVERIES:
        cases.append(
            Case("as Slack sends it", delivery, fresh(delivery.payload, copy.deepcopy(delivery.payload)))
        )
        family = (delivery.kind, delivery.payload.get("type"), _event_type(delivery.payload))
        for path, what in payloads.corruptions(delivery.payload):
            if (family, path, what) not in done:
                done.add((family, path, what))
                mutant = payloads.corrupt(delivery.payload, path, what)
                cases.append(Case(mutant.how, delivery, fresh(delivery.payload, mutant.payload)))
    return cases


def _event_type(payload: payloads.Json) -> Any:
    event = payload.get("event")
    return event.get("type") if isinstance(event, dict) else None


def test_every_corruption_of_every_slack_request_is_answered_2xx_or_4xx_and_starts_no_run(
    stack: Stack, connection: redis.Redis
) -> None:
    cases = every_single_corruption(Fresh("A"))
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(Poster(stack), cases))
    count("malformed payloads tried", len(cases) - len(DELIVERIES))

    wrong = [
        f"{s} {c.delivery.name}: {c.how}" for c, s in zip(cases, statuses, strict=True) if not 200 <= s < 500
    ]
    assert not wrong, f"{len(wrong)} answers outside 2xx/4xx, e.g.\n" + "\n".join(wrong[:20])
    originals = {
        c.delivery.name: s for c, s in zip(cases, statuses, strict=True) if c.how == "as Slack sends it"
    }
    assert [name for name, s in originals.items() if s == 400] == []  # the gate refuses nothing Slack sends
    allowed = {c.payload["event"]["text"][:MAX_TASK_CHARS] for c in cases if well_formed_mention(c.payload)}
    tasks = run_tasks(connection)
    assert [t[:80] for t in tasks if t not in allowed] == []
    assert len(tasks) > len(DELIVERIES)  # the well-formed ones did start runs: the check above had teeth

    # ...and the bot still serves a valid mention.
    mention = payloads.app_mention("still there?", user="UAFTER", channel="CAFTER")
    after = Case("valid", DELIVERIES[0], payloads.event_callback(mention, event_id="EvAfterFuzz"))
    assert after.post(stack) == 200
    assert "<@UBOT> still there?" in run_tasks(connection)


RETRY_HEADERS = ["X-Slack-Retry-Num", "X-Slack-Retry-Reason"]
HEADER_VALUES = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=60
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_several_corruptions_at_once_are_answered_2xx_or_4xx_and_start_no_run(
    stack: Stack, connection: redis.Redis, data: st.DataObject
) -> None:
    delivery = data.draw(st.sampled_from(DELIVERIES), label="delivery")
    payload: Any = delivery.payload
    hows = []
    for _ in range(data.draw(st.integers(2, 4), label="corruptions")):
        if not isinstance(payload, dict):
            break
        path, what = data.draw(st.sampled_from(payloads.corruptions(payload)))
        mutant = payloads.corrupt(payload, path, what)
        payload, hows = mutant.payload, [*hows, mutant.how]
    retry = data.draw(
        st.none() | st.dictionaries(st.sampled_from(RETRY_HEADERS), HEADER_VALUES), label="retry"
    )
    case = Case("; ".join(hows), delivery, FRESH(delivery.payload, payload), retry)
    before = run_keys(connection)
    status = case.post(stack)
    count("malformed payloads tried")
    assert 200 <= status < 500, (status, delivery.name, case.how)
    new = set(run_tasks(connection, run_keys(connection) - before))
    assert not new or (
        well_formed_mention(case.payload) and new == {case.payload["event"]["text"][:MAX_TASK_CHARS]}
    ), case.how
