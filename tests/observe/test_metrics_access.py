"""Who may read `/metrics` and `/healthz?deep=1`: a bearer token, a listener of their own, or loopback.

The WSGI callable is asked with the peer address in its environ (any address, without a network);
the real `python -m bot` is asked over real HTTP, from loopback and, when this machine has one, from
its own non-loopback interface address (a peer that is not loopback, without leaving the machine).
"""

from __future__ import annotations

import fcntl
import io
import socket
import struct
import subprocess
import sys
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from slack_sdk import WebClient

from bot.access import MIN_TOKEN_LENGTH, OperatorAccess
from bot.app import create_app
from bot.listening import BotDeps
from bot.web import wsgi_app
from harness.config import load_config
from runtime.clients import SettingsError
from runtime.queue import make_queue
from store import Store
from tests import conftest
from tests.fakes.messages_api import FakeMessagesAPI
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import ROOT, SIGNING_SECRET, Stack, free_port, wait_until

TOKEN = "metrics-token-3b9f0c2d7e614a58"
PAGES = ("/metrics", "/healthz?deep=1")
SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


# --- the WSGI callable, any peer address -------------------------------------------------------------


@pytest.fixture
def slack() -> Iterator[FakeSlackAPI]:
    with FakeSlackAPI(bot_token="xoxb-test") as fake:
        yield fake


def application(conn: redis.Redis, slack: FakeSlackAPI, access: OperatorAccess | None = None) -> Any:
    deps = BotDeps(store=Store(conn), queue=make_queue(conn), config=load_config(env={}))
    client = WebClient(token="xoxb-test", base_url=slack.base_url)
    app = create_app(deps, client=client, signing_secret=SIGNING_SECRET)
    return wsgi_app(app, conn, signing_secret=SIGNING_SECRET, operators=access)


def ask(
    app: Any, page: str, peer: str, *, server_port: int = 3000, **headers: str
) -> tuple[int, dict[str, str]]:
    """GET `page` from `peer` (REMOTE_ADDR) through the WSGI callable: the status and the headers."""
    path, _, query = page.partition("?")
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "REMOTE_ADDR": peer,
        "SERVER_NAME": "0.0.0.0",
        "SERVER_PORT": str(server_port),
        "wsgi.input": io.BytesIO(b""),
        **{"HTTP_" + name.upper(): value for name, value in headers.items()},
    }
    answer: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
        answer["status"], answer["headers"] = int(status.split()[0]), dict(response_headers)

    b"".join(app(environ, start_response))
    return answer["status"], answer["headers"]


def test_without_a_token_only_a_loopback_peer_reads_metrics_and_deep_health(
    conn: redis.Redis, slack: FakeSlackAPI
) -> None:
    app = application(conn, slack)  # the default: no METRICS_TOKEN, no METRICS_PORT
    for page in PAGES:
        for peer in ("127.0.0.1", "127.0.0.53", "::1", "::ffff:127.0.0.1"):
            assert ask(app, page, peer)[0] in (200, 503), (page, peer)  # 503: deep health with no worker
        for peer in ("192.0.2.7", "10.0.0.1", "::ffff:10.0.0.1", "2001:db8::1", "", "unix-socket"):
            assert ask(app, page, peer)[0] == 403, (page, peer)
        # a forwarding header never grants: it is whoever sent the request who wrote it ...
        for header in ("x_forwarded_for", "x_real_ip", "forwarded"):
            assert ask(app, page, "192.0.2.7", **{header: "127.0.0.1"})[0] == 403
        # ... and a loopback peer that relays another machine's request (a proxy on this host) is refused
        assert ask(app, page, "127.0.0.1", x_forwarded_for="192.0.2.7")[0] == 403
        assert ask(app, page, "127.0.0.1", forwarded="for=192.0.2.7")[0] == 403
    assert ask(app, "/healthz", "192.0.2.7")[0] == 200  # the load balancer's check stays open
    assert ask(app, "/healthz?deep=0", "192.0.2.7")[0] == 200


def test_with_a_token_every_peer_needs_it_in_the_authorization_header(
    conn: redis.Redis, slack: FakeSlackAPI
) -> None:
    app = application(conn, slack, OperatorAccess(token=TOKEN))
    for page in PAGES:
        for peer in ("127.0.0.1", "192.0.2.7"):
            status, headers = ask(app, page, peer)
            assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), (page, peer)
            for wrong in (
                f"Bearer {TOKEN[:-1]}",
                f"Bearer {TOKEN}x",
                f"Basic {TOKEN}",
                TOKEN,
                "Bearer ",
                "Bearer",
            ):
                assert ask(app, page, peer, authorization=wrong)[0] == 401, wrong
            assert ask(app, page, peer, authorization=f"Bearer {TOKEN}é")[0] == 401  # no crash on non-ASCII
            for right in (f"Bearer {TOKEN}", f"bearer {TOKEN}", f"  Bearer  {TOKEN} "):
                assert ask(app, page, peer, authorization=right)[0] in (200, 503), right
    assert ask(app, "/healthz", "192.0.2.7")[0] == 200


def test_with_a_metrics_port_the_pages_are_served_there_only(conn: redis.Redis, slack: FakeSlackAPI) -> None:
    app = application(conn, slack, OperatorAccess(port=9464))
    for page in PAGES:
        assert (
            ask(app, page, "127.0.0.1", server_port=3000)[0] == 404
        )  # not on the bot's port, loopback or not
        assert ask(app, page, "192.0.2.7", server_port=9464)[0] in (200, 503)
    assert ask(app, "/slack/events", "127.0.0.1", server_port=9464)[0] == 404  # nothing of Slack's there
    assert ask(app, "/healthz", "192.0.2.7", server_port=3000)[0] == 200

    both = application(conn, slack, OperatorAccess(token=TOKEN, port=9464))
    assert ask(both, "/metrics", "192.0.2.7", server_port=9464)[0] == 401
    assert ask(both, "/metrics", "192.0.2.7", server_port=9464, authorization=f"Bearer {TOKEN}")[0] == 200
    assert ask(both, "/metrics", "127.0.0.1", server_port=3000, authorization=f"Bearer {TOKEN}")[0] == 404


def test_a_token_too_short_to_be_a_secret_or_a_port_that_is_the_bots_is_refused_at_start() -> None:
    assert OperatorAccess.from_env({}, bot_port=3000) == OperatorAccess()
    assert OperatorAccess.from_env({"METRICS_TOKEN": TOKEN, "METRICS_PORT": "9464"}, bot_port=3000) == (
        OperatorAccess(token=TOKEN, port=9464)
    )
    for env in (
        {"METRICS_TOKEN": "x" * (MIN_TOKEN_LENGTH - 1)},
        {"METRICS_TOKEN": TOKEN + " with spaces"},
        {"METRICS_TOKEN": TOKEN + "\n"},
        {"METRICS_PORT": "3000"},
        {"METRICS_PORT": "70000"},
        {"METRICS_PORT": "nine"},
    ):
        with pytest.raises(SettingsError):
            OperatorAccess.from_env(env, bot_port=3000)


# --- the real `python -m bot`, over HTTP ----------------------------------------------------------


def own_address() -> str | None:
    """An IPv4 address of one of this machine's interfaces other than loopback, or None."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # down, or no IPv4 address
        address = socket.inet_ntoa(packed[20:24])
        if not address.startswith("127."):
            return address
    return None


def outside_address() -> str:
    """This machine's own non-loopback address (a connection to it comes from it); a loud skip without one."""
    address = own_address()
    if address is None:
        warnings.warn("no non-loopback interface: the bot is not asked from off loopback", stacklevel=2)
        pytest.skip("SKIPPED LOUDLY: this machine has no non-loopback IPv4 address to ask the bot from")
    return address


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode(), dict(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


@pytest.fixture
def fakes() -> Iterator[tuple[FakeSlackAPI, FakeMessagesAPI]]:
    with FakeSlackAPI(bot_token="xoxb-test") as fake_slack, FakeMessagesAPI() as model:
        yield fake_slack, model


@pytest.fixture
def off_loopback(monkeypatch: pytest.MonkeyPatch) -> str:
    """This machine's own non-loopback address, which this test may connect to (it never leaves the host)."""
    address = outside_address()
    monkeypatch.setattr(socket.socket, "connect", conftest._real_connect)
    return address


@pytest.mark.e2e
def test_the_bot_refuses_metrics_to_a_peer_off_loopback_and_serves_loopback(
    redis_url: str, fakes: tuple[FakeSlackAPI, FakeMessagesAPI], tmp_path: Path, off_loopback: str
) -> None:
    stack = Stack(redis_url, *fakes, tmp_path, extra_env={"HOST": "0.0.0.0"})
    stack.start_bot()
    try:
        outside = f"http://{off_loopback}:{stack.port}"
        for page in PAGES:
            status, body, _ = get(outside + page)
            assert status == 403 and "METRICS_TOKEN" in body, (page, status, body)
            assert get(outside + page, {"X-Forwarded-For": "127.0.0.1"})[0] == 403
        assert get(outside + "/healthz")[0] == 200
        status, body, _ = get(stack.url + "/metrics")
        assert status == 200 and "harness_queue_depth" in body
    finally:
        stack.stop()


@pytest.mark.e2e
def test_the_bot_with_a_metrics_token_serves_only_a_request_that_carries_it(
    redis_url: str, fakes: tuple[FakeSlackAPI, FakeMessagesAPI], tmp_path: Path
) -> None:
    stack = Stack(redis_url, *fakes, tmp_path, extra_env={"METRICS_TOKEN": TOKEN})
    stack.start_bot()
    try:
        for page in PAGES:
            status, body, headers = get(stack.url + page)  # from loopback, without the token
            assert status == 401 and headers.get("WWW-Authenticate", "").startswith("Bearer"), (page, body)
            assert "harness_" not in body and '"workers"' not in body
            assert get(stack.url + page, {"Authorization": "Bearer wrong-token-0123456789"})[0] == 401
        status, body, _ = get(stack.url + "/metrics", {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and "harness_queue_depth" in body
        status, body, _ = get(stack.url + "/healthz?deep=1", {"Authorization": f"Bearer {TOKEN}"})
        assert status == 503 and '"workers_alive": 0' in body  # served: no worker is running here
        assert TOKEN not in stack.processes[0].output()  # the access log shows no Authorization header
    finally:
        stack.stop()


@pytest.mark.e2e
def test_the_bot_with_a_metrics_port_serves_the_pages_there_and_not_on_its_port(
    redis_url: str, fakes: tuple[FakeSlackAPI, FakeMessagesAPI], tmp_path: Path, off_loopback: str
) -> None:
    metrics_port = free_port()
    stack = Stack(
        redis_url, *fakes, tmp_path, extra_env={"METRICS_PORT": str(metrics_port), "HOST": "0.0.0.0"}
    )
    stack.start_bot()
    try:
        assert get(stack.url + "/metrics")[0] == 404
        assert get(stack.url + "/healthz?deep=1")[0] == 404
        status, body, _ = get(f"http://{off_loopback}:{metrics_port}/metrics")
        assert status == 200 and "harness_queue_depth" in body
        assert get(f"http://127.0.0.1:{metrics_port}/slack/events")[0] == 404
    finally:
        stack.stop()


@pytest.mark.e2e
@pytest.mark.parametrize(("name", "value"), [("METRICS_TOKEN", "short"), ("METRICS_PORT", "same")])
def test_an_unusable_metrics_setting_stops_the_bot_with_one_line(
    redis_url: str, fakes: tuple[FakeSlackAPI, FakeMessagesAPI], tmp_path: Path, name: str, value: str
) -> None:
    stack = Stack(redis_url, *fakes, tmp_path)
    env = stack.env(**{name: str(stack.port) if value == "same" else value})
    done = subprocess.run(
        [sys.executable, "-m", "bot"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0], done.stderr
    wait_until(lambda: stack.healthz() == 0, timeout=30)  # nothing listens
