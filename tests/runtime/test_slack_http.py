"""The keep-alive Slack client (`runtime.slack_http`) against the loopback Slack stand-in, which
speaks HTTP/1.1 as Slack's servers do and counts the connections it accepts."""

from __future__ import annotations

import os
import ssl
import threading
from collections.abc import Iterator
from urllib.error import URLError

import pytest
import trustme
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler, ServerErrorRetryHandler
from slack_sdk.http_retry.builtin_interval_calculators import FixedValueRetryIntervalCalculator

from runtime.clients import slack_client
from runtime.slack_http import KeepAliveWebClient
from tests.fakes.slack_api import FakeSlackAPI

TOKEN = "xoxb-test"
NO_WAIT = FixedValueRetryIntervalCalculator(0.0)


@pytest.fixture
def fake() -> Iterator[FakeSlackAPI]:
    with FakeSlackAPI(bot_token=TOKEN) as server:  # a server of its own: its own connection count
        yield server


def client(fake: FakeSlackAPI, **kwargs: object) -> KeepAliveWebClient:
    return KeepAliveWebClient(token=TOKEN, base_url=fake.base_url, **kwargs)  # type: ignore[arg-type]


def post(web: KeepAliveWebClient, text: str) -> str:
    return str(web.chat_postMessage(channel="C1", text=text)["ts"])


def texts(fake: FakeSlackAPI) -> list[str]:
    return [m["text"] for m in fake.messages("C1")]


def test_the_calls_of_one_thread_share_one_connection(fake: FakeSlackAPI) -> None:
    web = client(fake)
    ts = post(web, "first")
    for name in ("eyes", "tada", "rocket"):
        assert web.reactions_add(channel="C1", timestamp=ts, name=name)["ok"] is True
    web.chat_update(channel="C1", ts=ts, text="edited")
    assert texts(fake) == ["edited"]
    assert [c.method for c in fake.calls] == ["chat.postMessage", *["reactions.add"] * 3, "chat.update"]
    assert fake.connections == 1


def test_the_workers_and_bots_clients_keep_their_connections(fake: FakeSlackAPI) -> None:
    web = slack_client({"SLACK_BOT_TOKEN": TOKEN, "SLACK_API_URL": fake.base_url})
    assert isinstance(web, KeepAliveWebClient)
    for n in range(5):
        post(web, f"m{n}")
    assert fake.connections == 1


def test_each_thread_has_a_connection_of_its_own(fake: FakeSlackAPI) -> None:
    web = client(fake)
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            barrier.wait(timeout=10)
            for k in range(5):
                post(web, f"t{n}-{k}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert sorted(texts(fake)) == sorted(f"t{n}-{k}" for n in range(3) for k in range(5))
    assert fake.connections == 3


def test_a_connection_the_server_closed_while_idle_is_replaced_and_nothing_is_sent_twice(
    fake: FakeSlackAPI,
) -> None:
    web = client(fake, retry_handlers=[])  # no retries: a write into the dead connection would fail
    post(web, "before")
    assert fake.drop_connections() == 1
    post(web, "after")
    assert texts(fake) == ["before", "after"]  # each once
    assert fake.connections == 2


def test_an_error_status_reaches_the_retry_handlers_and_the_connection_stays(fake: FakeSlackAPI) -> None:
    handlers = [
        RateLimitErrorRetryHandler(max_retry_count=1, interval_calculator=NO_WAIT),
        ServerErrorRetryHandler(max_retry_count=1, interval_calculator=NO_WAIT),
    ]
    web = client(fake, retry_handlers=handlers)
    fake.fail_next("chat.postMessage", status=429, headers={"Retry-After": "0"})
    post(web, "after a 429")
    fake.fail_next("chat.postMessage", status=503)
    post(web, "after a 503")
    assert texts(fake) == ["after a 429", "after a 503"]
    assert fake.connections == 1

    bare = client(fake)
    fake.fail_next("chat.postMessage", status=429, headers={"Retry-After": "7"})
    with pytest.raises(SlackApiError) as refused:
        post(bare, "never")
    assert refused.value.response.status_code == 429
    assert refused.value.response.headers["Retry-After"] == "7"
    assert refused.value.response["error"] == "ratelimited"
    fake.fail_next("chat.postMessage", error="channel_not_found")
    with pytest.raises(SlackApiError) as not_found:
        post(bare, "never")
    assert not_found.value.response["error"] == "channel_not_found"
    assert texts(fake) == ["after a 429", "after a 503"]


def test_a_server_gone_is_a_urlerror_as_with_urllib(fake: FakeSlackAPI) -> None:
    """slack_sdk's ConnectionErrorRetryHandler retries URLError: a refused connect must be one."""
    web = client(fake, retry_handlers=[])
    post(web, "one")
    fake.drop_connections()
    fake.stop()
    with pytest.raises(URLError):
        post(web, "two")


def test_a_forked_child_opens_its_own_connection(fake: FakeSlackAPI) -> None:
    web = client(fake)
    post(web, "parent before")
    pid = os.fork()
    if pid == 0:  # the child: a work horse forked from a worker that already talked to Slack
        code = 1
        try:
            post(web, "child")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    post(web, "parent after")  # the parent's connection was not written into by the child
    assert texts(fake) == ["parent before", "child", "parent after"]
    assert fake.connections == 2


def test_over_tls_a_connection_does_its_handshake_once_and_stays_in_use() -> None:
    """As against slack.com: HTTPS with TLS 1.3, whose session tickets arrive after the handshake
    and must not make an idle connection look closed."""
    ca = trustme.CA()
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(served)
    trusted = ssl.create_default_context()
    ca.configure_trust(trusted)
    with FakeSlackAPI(bot_token=TOKEN, tls=served) as fake:
        assert fake.base_url.startswith("https://")
        web = client(fake, ssl=trusted)
        for text in ("one", "two", "three"):
            post(web, text)
        assert texts(fake) == ["one", "two", "three"]
        assert fake.connections == 1
        assert fake.drop_connections() == 1  # the server closes the idle connection
        post(web, "four")  # a new connection, a new handshake, no error
        assert texts(fake)[-1] == "four" and fake.connections == 2


def test_a_server_whose_certificate_is_not_trusted_is_refused() -> None:
    ca = trustme.CA()
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(served)
    with FakeSlackAPI(bot_token=TOKEN, tls=served) as fake:
        with pytest.raises(URLError):
            post(client(fake, ssl=ssl.create_default_context()), "never")
        assert texts(fake) == []
