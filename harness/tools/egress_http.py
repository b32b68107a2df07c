"""The HTTP proxy protocol the egress proxy speaks: a request head read into where it goes and what
is sent there first, the proxy's own answers (400, 403, 408, 502, 503), and bytes relayed both ways.

Only the wire format lives here; what may go where is `harness.tools.egress_hosts`, and the doors,
their bounds and their threads are `harness.tools.egress`.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from harness.tools.egress_hosts import HOST_NAME, is_v6, normal_host

CHUNK = 64 * 1024

_REASONS = {
    200: "Connection established",
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    502: "Bad Gateway",
    503: "Service Unavailable",
}

_TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb") ([\x21-\x7e]+) HTTP/1\.([01])")
_HEADER = re.compile(rb"(" + _TOKEN + rb"):[^\r\n\x00]*")
_AUTHORITY = re.compile(r"(?:\[([0-9a-f:.]+)\]|([a-z0-9._-]+))(?::([0-9]{1,5}))?")
_ABSOLUTE = re.compile(r"http://([^/?#]*)([^#]*)", re.IGNORECASE)
_HOP_BY_HOP = {b"host", b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization"}
_HOP_BY_HOP |= {b"te", b"trailer", b"upgrade"}


class ProxyAnswer(Exception):
    """The proxy's answer instead of a connection: a status and why, for the client."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status
        self.why = why


@dataclass(frozen=True)
class Request:
    """Where a client asked to go, and what to send there first (nothing for a tunnel)."""

    host: str  # normal form (`normal_host`), brackets off
    port: int
    tunnel: bool
    upstream_head: bytes


def parse_head(head: bytes) -> Request:
    """The request in a head that ends in CRLF CRLF; `ProxyAnswer(400)` when it is not one we serve."""
    line, *fields = head[:-4].split(b"\r\n")
    match = _REQUEST_LINE.fullmatch(line)
    if match is None:
        raise ProxyAnswer(400, "malformed request line")
    method, target, minor = match.group(1), match.group(2).decode("ascii"), match.group(3)
    for header in fields:
        if _HEADER.fullmatch(header) is None:
            raise ProxyAnswer(400, "malformed header line")
    if method == b"CONNECT":
        host, port = _authority(target, default_port=None)
        return Request(host, port, tunnel=True, upstream_head=b"")
    absolute = _ABSOLUTE.fullmatch(target)
    if absolute is None:
        raise ProxyAnswer(400, "a proxy request needs CONNECT host:port or an http:// URL")
    host, port = _authority(absolute.group(1), default_port=80)
    path = absolute.group(2)
    path = path if path.startswith("/") else "/" + path
    shown = f"[{host}]" if ":" in host else host
    authority = shown if port == 80 else f"{shown}:{port}"
    first = method + b" " + path.encode("ascii") + b" HTTP/1." + minor
    return Request(host, port, tunnel=False, upstream_head=_origin_head(first, authority, fields))


def _authority(text: str, default_port: int | None) -> tuple[str, int]:
    match = _AUTHORITY.fullmatch(text.lower())
    if match is None:
        raise ProxyAnswer(400, "malformed host")
    v6, name, digits = match.groups()
    if v6 is not None:
        if not is_v6(v6):
            raise ProxyAnswer(400, "malformed IPv6 address")
        host = normal_host(v6)
    else:
        host = normal_host(name)
        if len(host) > 253 or not HOST_NAME.fullmatch(host):
            raise ProxyAnswer(400, "malformed host")
    port = int(digits) if digits is not None else default_port
    if port is None or not 0 < port < 65536:
        raise ProxyAnswer(400, "a port from 1 to 65535 is needed")
    return host, port


def _origin_head(first: bytes, authority: str, fields: list[bytes]) -> bytes:
    """The head for the origin: `Host` from the URL, hop-by-hop fields dropped, one request."""
    named: set[bytes] = set()
    for header in fields:
        name, _, value = header.partition(b":")
        if name.lower() in (b"connection", b"proxy-connection"):
            named |= {token.strip().lower() for token in value.split(b",")}
    drop = _HOP_BY_HOP | named
    kept = [header for header in fields if header.partition(b":")[0].lower() not in drop]
    lines = [first, b"Host: " + authority.encode("ascii"), *kept, b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def answer_bytes(status: int, why: str) -> bytes:
    body = f"harness egress: {why}\n".encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


async def relay(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    """Bytes both ways until both sides are done; a half-close is passed on, a failure ends both."""
    loop = asyncio.get_running_loop()
    pipes = {
        loop.create_task(_pipe(client_reader, up_writer)),
        loop.create_task(_pipe(up_reader, client_writer)),
    }
    try:
        while pipes:
            done, pipes = await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            if not all(task.result() for task in done):
                return
    finally:
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Copy until end of file and pass the end on; False when either side failed."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        return False
    return True


async def discard(reader: asyncio.StreamReader) -> None:
    while await reader.read(CHUNK):
        pass
