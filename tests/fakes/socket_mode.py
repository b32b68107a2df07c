"""Slack's side of Socket Mode on loopback: `apps.connections.open` and a WebSocket server.

`SocketModeSlack` is the fake Web API plus `apps.connections.open`, which answers the app token
with a `ws://127.0.0.1:…` link to a `SocketModeServer`. The server speaks RFC 6455 (standard
library only; no `websockets` package here): it completes the handshake, says `hello` as Slack
does, sends envelopes (`{"envelope_id", "type", "payload", "accepts_response_payload", …}`)
unmasked, answers pings, and records every ack the app sends back (masked frames, as clients
must send them) with the time it arrived.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import struct
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tests.fakes.slack_api import FakeSlackAPI

APP_TOKEN = "xapp-1-A1-test"
_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
TEXT, CLOSE, PING, PONG = 0x1, 0x8, 0x9, 0xA


@dataclass(frozen=True)
class Ack:
    """An ack the app sent: when it arrived (time.monotonic()) and the payload it carried, if any."""

    at: float
    payload: Any
    raw: dict[str, Any]


class SocketModeServer:
    """A Socket Mode WebSocket endpoint on loopback that sends envelopes and records acks."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._cond = threading.Condition()
        self._sessions: list[socket.socket] = []
        self._send_lock = threading.Lock()
        self.handshakes: list[str] = []
        self.sent: dict[str, float] = {}  # envelope id -> when it was sent (time.monotonic())
        self.acks: dict[str, list[Ack]] = {}
        self.stray: list[str] = []  # text frames that were not acks
        threading.Thread(target=self._accept, name="socket-mode-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self._listener.getsockname()[1]}/link/?ticket=fake-ticket&app_id=A1"

    def __enter__(self) -> SocketModeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._listener.close()
        with self._cond:
            sessions = list(self._sessions)
        for conn in sessions:
            with contextlib.suppress(OSError):
                conn.close()

    # --- the test's side ------------------------------------------------------------------------

    def wait_connected(self, timeout: float = 30) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._sessions, timeout):
                raise AssertionError(f"the app opened no Socket Mode session within {timeout} s")

    def send(self, kind: str, payload: Any, **fields: Any) -> str:
        """Send one envelope over the newest session; return its envelope id."""
        envelope = {
            "envelope_id": fields.pop("envelope_id", str(uuid.uuid4())),
            "payload": payload,
            "type": kind,
            "accepts_response_payload": kind != "events_api",
            **fields,
        }
        return self.send_raw(envelope)

    def send_raw(self, envelope: Any) -> str:
        """Send any JSON value as a text frame (an envelope of whatever shape)."""
        envelope_id = envelope.get("envelope_id") if isinstance(envelope, dict) else None
        key = envelope_id if isinstance(envelope_id, str) else str(uuid.uuid4())
        data = json.dumps(envelope).encode()
        with self._cond:
            conn = self._sessions[-1]
            self.sent[key] = time.monotonic()
        self._send_frame(conn, TEXT, data)
        return key

    def wait_acked(self, envelope_ids: list[str], timeout: float = 10) -> dict[str, Ack]:
        """The first ack of each envelope, waiting up to `timeout` for the missing ones."""
        with self._cond:
            self._cond.wait_for(lambda: all(i in self.acks for i in envelope_ids), timeout)
            return {i: self.acks[i][0] for i in envelope_ids if i in self.acks}

    def acked(self, envelope_id: str) -> list[Ack]:
        with self._cond:
            return list(self.acks.get(envelope_id, []))

    # --- the WebSocket server --------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(
                target=self._serve, args=(conn,), name="socket-mode-session", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._session(conn)
        except (OSError, ConnectionError):
            pass  # the app went away
        finally:
            with self._cond:
                if conn in self._sessions:
                    self._sessions.remove(conn)
            conn.close()

    def _session(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        head = self._handshake(conn, reader)
        if head is None:
            return
        hello = {"type": "hello", "num_connections": 1, "connection_info": {"app_id": "A1"}}
        self._send_frame(conn, TEXT, json.dumps(hello).encode())
        with self._cond:
            self.handshakes.append(head)
            self._sessions.append(conn)
            self._cond.notify_all()
        while True:
            opcode, data = _read_frame(reader)
            if opcode == TEXT:
                self._record(data.decode())
            elif opcode == PING:
                self._send_frame(conn, PONG, data)
            elif opcode == CLOSE:
                self._send_frame(conn, CLOSE, data[:2])
                return

    def _handshake(self, conn: socket.socket, reader: Any) -> str | None:
        lines = []
        while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
            lines.append(line.decode("latin-1").rstrip("\r\n"))
        key = next(
            (ln.split(":", 1)[1].strip() for ln in lines if ln.lower().startswith("sec-websocket-key:")), None
        )
        if not lines or key is None:
            return None
        accept = base64.b64encode(hashlib.sha1((key + _GUID).encode()).digest()).decode()
        conn.sendall(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + f"Sec-WebSocket-Accept: {accept}\r\n\r\n".encode()
        )
        return "\r\n".join(lines)

    def _record(self, text: str) -> None:
        now = time.monotonic()
        try:
            message = json.loads(text)
        except ValueError:
            message = None
        with self._cond:
            if isinstance(message, dict) and isinstance(message.get("envelope_id"), str):
                ack = Ack(now, message.get("payload"), message)
                self.acks.setdefault(message["envelope_id"], []).append(ack)
            else:
                self.stray.append(text)
            self._cond.notify_all()

    def _send_frame(self, conn: socket.socket, opcode: int, data: bytes) -> None:
        """A server frame: final, unmasked (RFC 6455 §5.1), with the shortest length encoding."""
        size = len(data)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, size)
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 127, size)
        with self._send_lock:
            conn.sendall(head + data)


def _read_frame(reader: Any) -> tuple[int, bytes]:
    """One client frame (clients mask every frame, RFC 6455 §5.3); fragments are not expected."""
    first, second = _exactly(reader, 2)
    size = second & 0x7F
    if size == 126:
        (size,) = struct.unpack("!H", _exactly(reader, 2))
    elif size == 127:
        (size,) = struct.unpack("!Q", _exactly(reader, 8))
    mask = _exactly(reader, 4) if second & 0x80 else b"\0\0\0\0"
    data = _exactly(reader, size)
    return first & 0x0F, bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def _exactly(reader: Any, n: int) -> bytes:
    data = reader.read(n)
    if len(data) < n:
        raise ConnectionError("the app closed the connection")
    return bytes(data)


class SocketModeSlack(FakeSlackAPI):
    """The fake Web API, plus `apps.connections.open` answering the app token with `server`'s link."""

    def __init__(self, server: SocketModeServer, app_token: str = APP_TOKEN) -> None:
        super().__init__(bot_token="xoxb-test")
        self.server = server
        self.app_token = app_token
        self.links_opened = 0

    def _dispatch(
        self, path: str, raw: bytes, headers: Mapping[str, str]
    ) -> tuple[int, dict[str, str], dict[str, Any]]:
        if urlsplit(path).path.rstrip("/") != "/api/apps.connections.open":
            return super()._dispatch(path, raw, headers)
        if (headers.get("Authorization") or "") != f"Bearer {self.app_token}":
            return 200, {}, {"ok": False, "error": "invalid_auth"}
        self.links_opened += 1
        return 200, {}, {"ok": True, "url": self.server.url}
