"""The egress proxy of `network = true`, driven the way the sandbox's init drives it: a real door, a
real loopback listener, each accepted socket passed over the door, HTTP proxy from the client.

No test sends traffic anywhere but loopback: destinations that must be refused are refused before
any connect (the `connects` spy proves the proxy thread never tried), and the success paths allow
exactly one loopback address through the test-only `allowed` seam.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import shutil
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from harness.tools.egress import EgressLimits, EgressProxy
from harness.tools.egress_hosts import IPAddress, check_patterns, host_allowed, is_public, resolve_host

LOOPBACK = ipaddress.IPv4Address("127.0.0.1")
WAIT = 5.0  # a bound on every wait: a broken proxy fails a test, it never hangs it


@pytest.fixture
def directory() -> Iterator[str]:
    """A private directory with a short path (a Unix socket's path has 108 bytes at most)."""
    path = tempfile.mkdtemp(prefix="egress-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every TCP connect the proxy's thread attempts (after the suite's loopback-only guard)."""
    attempts: list[Any] = []
    guarded = socket.socket.connect

    def spy(sock: socket.socket, address: Any) -> Any:
        if threading.current_thread().name == "harness-egress" and sock.family != socket.AF_UNIX:
            attempts.append(address)
        return guarded(sock, address)

    monkeypatch.setattr(socket.socket, "connect", spy)
    return attempts


@dataclass
class Resolutions:
    """A scripted resolver that remembers every name it was asked for."""

    answers: dict[str, list[IPAddress]]
    asked: list[str] = field(default_factory=list)

    def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.asked.append(host)
        if host in self.answers:
            return self.answers[host]
        raise OSError(f"no such test name {host}")


class Init:
    """What the sandbox's init does: one door connection, and one fd per accepted connection."""

    def __init__(self, door: str) -> None:
        self.door = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.door.connect(door)
        self.listener = socket.create_server(("127.0.0.1", 0))

    def client(self) -> socket.socket:
        """A client connection whose accepted end now belongs to the proxy."""
        client = socket.create_connection(self.listener.getsockname(), timeout=WAIT)
        accepted, _ = self.listener.accept()
        socket.send_fds(self.door, [b"c"], [accepted.fileno()])
        accepted.close()
        return client

    def close(self) -> None:
        self.door.close()
        self.listener.close()


@pytest.fixture
def start(directory: str) -> Iterator[Callable[..., tuple[EgressProxy, Init]]]:
    """Start a proxy (with the given seams), open a door for "web" and connect an init to it."""
    made: list[tuple[EgressProxy, Init]] = []

    def make(hosts: list[str] | None = None, **kwargs: Any) -> tuple[EgressProxy, Init]:
        proxy = EgressProxy(directory, **kwargs).start()
        init = Init(proxy.open_door("web", hosts))
        made.append((proxy, init))
        return proxy, init

    yield make
    for proxy, init in made:
        init.close()
        proxy.close()


def read_all(sock: socket.socket) -> bytes:
    """Everything until the other side closes."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def ask(init: Init, request: bytes) -> bytes:
    """Send one request through a fresh client connection and read the whole answer."""
    with init.client() as client:
        client.sendall(request)
        return read_all(client)


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def connect_request(target: str) -> bytes:
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()


# --- What is public ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("1.1.1.1", True),
        ("2606:4700:4700::1111", True),
        ("::ffff:8.8.8.8", True),  # mapped, of a public address
        ("2002:808:808::1", True),  # 6to4, of a public address
        ("64:ff9b::808:808", True),  # NAT64, of a public address
        ("127.0.0.1", False),
        ("127.255.0.9", False),
        ("::1", False),
        ("10.0.0.1", False),
        ("172.16.0.1", False),
        ("172.31.255.254", False),
        ("192.168.1.1", False),
        ("fc00::1", False),
        ("fd12:3456::1", False),
        ("169.254.169.254", False),
        ("fe80::1", False),
        ("fe80::1%2", False),
        ("100.64.0.1", False),
        ("100.127.255.254", False),
        ("224.0.0.1", False),  # multicast: Python 3.11 calls it global
        ("ff0e::1", False),
        ("240.0.0.1", False),
        ("255.255.255.255", False),
        ("0.0.0.0", False),
        ("0.1.2.3", False),
        ("::", False),
        ("192.0.2.1", False),  # documentation
        ("198.18.0.1", False),  # benchmarking
        ("2001:db8::1", False),
        ("fec0::1", False),  # site-local: Python 3.11 calls it global
        ("::ffff:127.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("::ffff:169.254.169.254", False),
        ("::7f00:1", False),  # IPv4-compatible loopback: Python 3.11 calls it global
        ("::808:808", False),  # IPv4-compatible, deprecated: refused outright
        ("2002:7f00:1::1", False),  # 6to4 of loopback
        ("2002:a00:1::1", False),  # 6to4 of 10.0.0.1
        ("64:ff9b::7f00:1", False),  # NAT64 of loopback
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 of the metadata address
        ("64:ff9b:1::808:808", False),  # local-use NAT64
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),  # Teredo
    ],
)
def test_is_public_table(address: str, public: bool) -> None:
    assert is_public(ipaddress.ip_address(address)) is public


@pytest.mark.parametrize(
    ("host", "patterns", "allowed"),
    [
        ("api.github.com", ["api.github.com"], True),
        ("API.GitHub.com.", ["api.github.com"], True),
        ("github.com", ["api.github.com"], False),
        ("a.example.com", ["*.example.com"], True),
        ("a.b.example.com", ["*.example.com"], True),
        ("example.com", ["*.example.com"], False),
        ("badexample.com", ["*.example.com"], False),
        ("127.0.0.1", ["*.0.0.1"], False),  # a wildcard never matches an address
        ("2130706433", ["*.example.com"], False),
        ("127.0.0.1", ["127.0.0.1"], True),  # an address matches only itself, spelled so
        ("2130706433", ["127.0.0.1"], False),
        ("::1", ["0:0::1"], True),
        ("anything.test", [], False),
    ],
)
def test_allow_list_matching(host: str, patterns: list[str], allowed: bool) -> None:
    assert host_allowed(host, check_patterns(patterns)) is allowed


@pytest.mark.parametrize("pattern", ["*", "a*b.com", "*.*.com", "x.*.com", "a b", "", "http://x"])
def test_a_bad_allow_list_pattern_is_refused(pattern: str) -> None:
    with pytest.raises(ValueError):
        check_patterns([pattern])


def test_the_resolver_reads_numeric_forms_as_the_addresses_they_are() -> None:
    assert resolve_host("2130706433", 80) == [LOOPBACK]
    assert resolve_host("0x7f.1", 80) == [LOOPBACK]


# --- Refusals ---------------------------------------------------------------------------------


def test_connect_to_a_listening_loopback_port_is_refused_before_any_connection(
    start: Callable[..., tuple[EgressProxy, Init]], connects: list[Any]
) -> None:
    _, init = start()
    with socket.create_server(("127.0.0.1", 0)) as target:
        port = target.getsockname()[1]
        answer = ask(init, connect_request(f"127.0.0.1:{port}"))
        assert status(answer) == 403
        assert b"harness egress: 127.0.0.1 is not a public address" in answer
        target.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing ever knocked
            target.accept()
    assert connects == []


@pytest.mark.parametrize(
    ("target", "address"),
    [
        ("10.0.0.1:80", "10.0.0.1"),
        ("192.168.1.1:443", "192.168.1.1"),
        ("172.16.0.1:443", "172.16.0.1"),
        ("169.254.169.254:80", "169.254.169.254"),
        ("100.64.0.1:443", "100.64.0.1"),
        ("[::1]:443", "::1"),
        ("[::ffff:127.0.0.1]:443", "::ffff:127.0.0.1"),
        ("[fe80::1]:443", "fe80::1"),
        ("[64:ff9b::7f00:1]:443", "64:ff9b::7f00:1"),
        ("0.0.0.0:443", "0.0.0.0"),
        ("224.0.0.1:443", "224.0.0.1"),
        ("2130706433:443", "127.0.0.1"),
        ("0x7f000001:443", "127.0.0.1"),
        ("0x7f.1:443", "127.0.0.1"),
        ("0177.0.0.1:443", "127.0.0.1"),
        ("127.0.0.1.:443", "127.0.0.1"),
    ],
)
def test_private_and_special_destinations_are_refused_without_connecting(
    start: Callable[..., tuple[EgressProxy, Init]], connects: list[Any], target: str, address: str
) -> None:
    _, init = start()  # the real resolver: it answers these forms without asking any DNS
    answer = ask(init, connect_request(target))
    assert status(answer) == 403
    assert f"{address}, which is not a public address".encode() in answer or (
        f"{address} is not a public address".encode() in answer
    )
    assert connects == []


def test_a_plain_request_to_a_private_address_is_refused(
    start: Callable[..., tuple[EgressProxy, Init]], connects: list[Any]
) -> None:
    _, init = start()
    answer = ask(init, b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status(answer) == 403
    assert connects == []


def test_a_name_resolving_to_a_private_address_is_refused(
    start: Callable[..., tuple[EgressProxy, Init]], connects: list[Any]
) -> None:
    resolve = Resolutions({"internal.test": [ipaddress.ip_address("10.1.2.3")]})
    _, init = start(resolve=resolve)
    answer = ask(init, connect_request("internal.test:443"))
    assert status(answer) == 403
    assert b"internal.test resolves to 10.1.2.3, which is not a public address" in answer
    assert resolve.asked == ["internal.test"]
    assert connects == []


def test_one_private_address_among_public_ones_refuses_the_whole_name(
    start: Callable[..., tuple[EgressProxy, Init]], connects: list[Any]
) -> None:
    public, private = ipaddress.ip_address("93.184.215.14"), ipaddress.ip_address("192.168.0.7")
    _, init = start(resolve=Resolutions({"mixed.test": [public, private]}))
    answer = ask(init, connect_request("mixed.test:443"))
    assert status(answer) == 403
    assert b"192.168.0.7" in answer
    assert connects == []


def test_a_host_outside_the_allow_list_is_refused_before_resolution(
    start: Callable[..., tuple[EgressProxy, Init]], connects: list[Any]
) -> None:
    resolve = Resolutions({"evil.test": [ipaddress.ip_address("8.8.8.8")]})
    _, init = start(hosts=["api.github.com", "*.example.com"], resolve=resolve)
    answer = ask(init, connect_request("evil.test:443"))
    assert status(answer) == 403
    assert b"host evil.test is not in this server's network allow-list" in answer
    assert resolve.asked == []
    assert connects == []


def test_an_allowed_name_must_still_resolve_to_public_addresses(
    start: Callable[..., tuple[EgressProxy, Init]], connects: list[Any]
) -> None:
    resolve = Resolutions({"api.github.com": [ipaddress.ip_address("10.0.0.7")]})
    _, init = start(hosts=["api.github.com"], resolve=resolve)
    answer = ask(init, connect_request("API.github.com:443"))
    assert status(answer) == 403
    assert b"api.github.com resolves to 10.0.0.7" in answer
    assert connects == []


def test_a_refusal_is_logged_once_with_server_and_destination_and_nothing_else(
    start: Callable[..., tuple[EgressProxy, Init]], caplog: pytest.LogCaptureFixture
) -> None:
    _, init = start()
    with caplog.at_level(logging.WARNING, logger="harness.mcp"):
        request = b"CONNECT 10.0.0.1:80 HTTP/1.1\r\nProxy-Authorization: Basic c2VjcmV0\r\n\r\n"
        assert status(ask(init, request)) == 403
    lines = [record.getMessage() for record in caplog.records if record.name == "harness.mcp"]
    assert lines == ["MCP server web: egress to 10.0.0.1 port 80 refused: 10.0.0.1 is not a public address"]
    assert all(record.levelno == logging.WARNING for record in caplog.records)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /x HTTP/1.1\r\nHost: a.test\r\n\r\n",  # origin form: not a proxy request
        b"GET https://a.test/ HTTP/1.1\r\n\r\n",  # https goes through CONNECT
        b"GET http://user@a.test/ HTTP/1.1\r\n\r\n",
        b"GET http://a.test/#frag HTTP/1.1\r\n\r\n",
        b"CONNECT a.test HTTP/1.1\r\n\r\n",  # no port
        b"CONNECT a.test:0 HTTP/1.1\r\n\r\n",
        b"CONNECT a.test:70000 HTTP/1.1\r\n\r\n",
        b"CONNECT a\x01b.test:443 HTTP/1.1\r\n\r\n",
        b"CONNECT [::1:443 HTTP/1.1\r\n\r\n",
        b"CONNECT a..test:443 HTTP/1.1\r\n\r\n",
        b"GET http://a.test/ HTTP/1.1\r\nX: 1\r\n folded\r\n\r\n",
        b"GET http://a.test/ HTTP/2.0\r\n\r\n",
    ],
)
def test_malformed_requests_get_400_without_resolving(
    start: Callable[..., tuple[EgressProxy, Init]], request_bytes: bytes
) -> None:
    resolve = Resolutions({"a.test": [LOOPBACK]})
    _, init = start(resolve=resolve)
    assert status(ask(init, request_bytes)) == 400
    assert resolve.asked == []


def test_a_head_over_the_size_limit_gets_400(start: Callable[..., tuple[EgressProxy, Init]]) -> None:
    _, init = start()
    answer = ask(init, b"GET http://a.test/ HTTP/1.1\r\nX-Pad: " + b"a" * 20_000)
    assert status(answer) == 400
    assert b"request head over 16384 bytes" in answer


def test_a_head_that_never_ends_times_out_with_408(start: Callable[..., tuple[EgressProxy, Init]]) -> None:
    _, init = start(limits=EgressLimits(head_seconds=0.2))
    with init.client() as client:
        client.sendall(b"CONNECT 8.8.8.8:443 HTTP/1.1\r\n")
        assert status(read_all(client)) == 408


def test_connections_over_the_cap_get_503(start: Callable[..., tuple[EgressProxy, Init]]) -> None:
    _, init = start(limits=EgressLimits(connections=1))
    with init.client() as first, init.client() as second:
        assert status(read_all(second)) == 503
        first.sendall(connect_request("10.0.0.1:80"))  # the first one is still served
        assert status(read_all(first)) == 403
    # Its place is free again once the proxy has seen it go, which the test cannot watch: ask
    # until a request is served (one sent into a socket being refused may come back as a reset).
    deadline = time.monotonic() + WAIT
    answer = b""
    while status(answer or b"- 503") == 503 and time.monotonic() < deadline:
        with contextlib.suppress(ConnectionResetError):
            answer = ask(init, connect_request("10.0.0.1:80"))
    assert status(answer) == 403


# --- The door ---------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [2, 6])  # 6: more than the proxy makes room for (truncated)
def test_a_message_with_several_fds_is_dropped_and_the_door_stays_open(
    start: Callable[..., tuple[EgressProxy, Init]], count: int
) -> None:
    _, init = start()
    clients, accepted = [], []
    for _ in range(count):
        clients.append(socket.create_connection(init.listener.getsockname(), timeout=WAIT))
        accepted.append(init.listener.accept()[0])
    socket.send_fds(init.door, [b"c"], [sock.fileno() for sock in accepted])
    for sock in accepted:
        sock.close()
    for client in clients:  # the proxy closed its copies unheard: both ends see the end
        with client:
            assert client.recv(1) == b""
    assert status(ask(init, connect_request("10.0.0.1:80"))) == 403


def test_a_message_with_an_fd_that_is_not_a_socket_is_dropped(
    start: Callable[..., tuple[EgressProxy, Init]],
) -> None:
    _, init = start()
    read_end, write_end = os.pipe()
    socket.send_fds(init.door, [b"c"], [write_end])
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b""  # no copy of the write end is left open anywhere
    finally:
        os.close(read_end)
    assert status(ask(init, connect_request("10.0.0.1:80"))) == 403


def test_a_door_is_a_private_socket_replaced_on_reopen_and_gone_on_close(directory: str) -> None:
    with EgressProxy(directory).start() as proxy:
        first = proxy.open_door("web")
        assert stat.S_ISSOCK(os.stat(first).st_mode)
        assert stat.S_IMODE(os.stat(first).st_mode) == 0o600
        init = Init(first)
        waiting = init.client()  # a connection of the server's first life
        second = proxy.open_door("web")
        assert second != first and not os.path.exists(first)
        assert waiting.recv(1) == b""  # the restart ended it
        waiting.close()
        init.close()
        init = Init(second)
        assert status(ask(init, connect_request("10.0.0.1:80"))) == 403
        proxy.close_door("web")
        assert not os.path.exists(second)
        init.close()


def test_a_directory_others_can_enter_is_refused(directory: str) -> None:
    os.chmod(directory, 0o755)
    with pytest.raises(ValueError, match="private directory"):
        EgressProxy(directory).start()


# --- The success paths (one loopback address stands in for the internet) -----------------------


class Upstream:
    """A loopback server that takes one connection and runs `script` on it in a thread."""

    def __init__(self, script: Callable[[socket.socket], None]) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(script,))
        self.thread.start()

    def _run(self, script: Callable[[socket.socket], None]) -> None:
        self.server.settimeout(WAIT)
        try:
            conn, _ = self.server.accept()
            with conn:
                conn.settimeout(WAIT)
                script(conn)
        except BaseException as error:  # reported by join()
            self.failure = error

    def join(self) -> None:
        self.thread.join(WAIT)
        self.server.close()
        assert not self.thread.is_alive()
        if self.failure is not None:
            raise self.failure


def test_connect_relays_both_ways_and_passes_a_half_close_on(
    start: Callable[..., tuple[EgressProxy, Init]], connects: list[Any]
) -> None:
    def answer_after_the_end(conn: socket.socket) -> None:
        conn.sendall(b"hello from upstream\n")
        heard = read_all(conn)  # ends only when the client's half-close came through
        conn.sendall(b"heard: " + heard)

    upstream = Upstream(answer_after_the_end)
    _, init = start(allowed=lambda address: address == LOOPBACK)
    with init.client() as client:
        client.sendall(connect_request(f"127.0.0.1:{upstream.port}") + b"early bytes;")
        first = client.recv(100)  # the tunnel is open before the client says more
        client.sendall(b"later bytes")
        client.shutdown(socket.SHUT_WR)
        answer = first + read_all(client)
    upstream.join()
    assert answer == (
        b"HTTP/1.1 200 Connection established\r\n\r\nhello from upstream\nheard: early bytes;later bytes"
    )
    assert connects == [("127.0.0.1", upstream.port)]


def test_a_plain_get_is_forwarded_in_origin_form(
    start: Callable[..., tuple[EgressProxy, Init]], connects: list[Any]
) -> None:
    heads: list[bytes] = []

    def serve(conn: socket.socket) -> None:
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += conn.recv(1)
        heads.append(head)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    upstream = Upstream(serve)
    _, init = start(allowed=lambda address: address == LOOPBACK)
    request = (
        f"GET http://127.0.0.1:{upstream.port}/x?y=1 HTTP/1.1\r\nHost: elsewhere.test\r\n"
        "Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic c2VjcmV0\r\nAccept: */*\r\n\r\n"
    ).encode()
    answer = ask(init, request)
    upstream.join()
    assert heads == [
        f"GET /x?y=1 HTTP/1.1\r\nHost: 127.0.0.1:{upstream.port}\r\nAccept: */*\r\n"
        "Connection: close\r\n\r\n".encode()
    ]
    assert answer == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    assert connects == [("127.0.0.1", upstream.port)]


def test_an_unreachable_destination_gets_502(start: Callable[..., tuple[EgressProxy, Init]]) -> None:
    with socket.socket() as closed:  # bound, never listening: a connect to it is refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        _, init = start(allowed=lambda address: address == LOOPBACK)
        answer = ask(init, connect_request(f"127.0.0.1:{port}"))
    assert status(answer) == 502
    assert f"cannot reach 127.0.0.1 port {port}".encode() in answer


def test_a_flood_of_refusals_logs_twenty_lines_a_minute_then_one_line_counting_the_rest() -> None:
    """A hostile server asking again and again cannot fill the worker's log."""
    from harness.tools.egress import _LOG_BUDGET, _Door

    with socket.socket(socket.AF_UNIX) as listener:
        door = _Door("evil", "/nowhere", None, listener)
        said = [door.may_say(1000.0) for _ in range(_LOG_BUDGET + 5)]
        assert said[:_LOG_BUDGET] == [""] * _LOG_BUDGET and said[_LOG_BUDGET:] == [None] * 5
        note = door.may_say(1061.0)
        assert note is not None and "5 more egress refusals were not logged" in note
        assert door.may_say(1062.0) == ""
