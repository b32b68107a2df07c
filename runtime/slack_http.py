"""A Slack Web API client that keeps its connections open between calls.

slack_sdk's `WebClient` sends every request with `urllib.request.urlopen`: a new urllib opener, a
new TCP connection and, against slack.com, a new TLS handshake, closed once the answer is read
(urllib asks for `Connection: close`). A run makes a dozen Slack calls and the bot one per mention
(the :eyes: reaction); each paid a connect, a handshake (one or two round trips to Slack, about
2 ms of CPU) and the opener's construction.

`KeepAliveWebClient` is a `WebClient` whose requests go over one `http.client` connection per
thread, process and server, kept open between calls (HTTP/1.1 keep-alive, which Slack's servers
offer). Everything else is slack_sdk's own: how a request is built (form, JSON, multipart), the
retry handlers, 429 handling, `SlackResponse` and its errors. Errors surface as urllib's do, so
the retry handlers see what they expect: a failure to send as `URLError`, a reset or a closed
connection while reading as `ConnectionResetError` / `RemoteDisconnected`, a non-2xx answer as
`HTTPError` carrying the body.

A connection left idle may have been closed by the server meanwhile; before it is used again it
is polled, and one that became readable (end of stream, or bytes nobody asked for) is replaced
rather than written to. A connection belongs to the process that opened it: a forked child (a
work horse) opens its own instead of writing into its parent's stream.
"""

from __future__ import annotations

import functools
import http.client
import io
import logging
import os
import select
import socket
import ssl
import threading
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import SplitResult, urlsplit
from urllib.request import Request

from slack_sdk import WebClient

log = logging.getLogger(__name__)

_Key = tuple[int, str, str, int, int]  # pid, scheme, host, port, id of the TLS context
_local = threading.local()


class KeepAliveWebClient(WebClient):
    """A `WebClient` that reuses one connection per thread and server (see the module docstring).

    A proxy, or a URL other than http(s), goes through slack_sdk's own urllib path unchanged.
    """

    def _perform_urllib_http_request_internal(self, url: str, req: Request) -> dict[str, Any]:
        parts = urlsplit(url)
        if self.proxy is not None or parts.scheme not in ("http", "https") or not parts.hostname:
            return super()._perform_urllib_http_request_internal(url, req)
        conn = self._connection(parts)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request(req.get_method(), target, body=req.data, headers=dict(req.header_items()))
        except OSError as exc:  # as urllib: nothing was answered, the retry handlers may send again
            conn.close()
            raise URLError(exc) from exc
        try:
            resp = conn.getresponse()
            body = resp.read()
        except BaseException:
            conn.close()
            raise
        if not 200 <= resp.status < 300:
            raise HTTPError(req.full_url, resp.status, resp.reason, resp.headers, io.BytesIO(body))
        if resp.headers.get_content_type() == "application/gzip":  # admin.analytics.getFile
            return {"status": resp.status, "headers": resp.headers, "body": body}
        charset = resp.headers.get_content_charset() or "utf-8"
        decoded = body.decode(charset)
        if self._logger.level <= logging.DEBUG:
            self._logger.debug(f"Received the following response - status: {resp.status}, body: {decoded}")
        return {"status": resp.status, "headers": resp.headers, "body": decoded}

    def _connection(self, parts: SplitResult) -> http.client.HTTPConnection:
        """This thread's open connection to the server of `parts`, or a new one."""
        context = self.ssl if self.ssl is not None else _default_context()
        https = parts.scheme == "https"
        port = parts.port or (443 if https else 80)
        host = parts.hostname or ""
        key: _Key = (os.getpid(), parts.scheme, host, port, id(context) if https else 0)
        pool: dict[_Key, http.client.HTTPConnection] = _local.__dict__.setdefault("connections", {})
        conn = pool.get(key)
        if conn is not None and conn.sock is not None and _closed_while_idle(conn.sock):
            conn.close()
        if conn is None:
            if https:
                conn = http.client.HTTPSConnection(host, port, timeout=self.timeout, context=context)
            else:
                conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
            pool[key] = conn
        conn.timeout = self.timeout  # clients of one thread share it: each call brings its own
        if conn.sock is not None:
            conn.sock.settimeout(self.timeout)
        return conn


def _closed_while_idle(sock: socket.socket) -> bool:
    """Whether an idle connection became readable: the server closed it (or broke the protocol)."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


@functools.cache
def _default_context() -> ssl.SSLContext:
    """One default TLS context per process for clients given none (each would load the CA bundle)."""
    return ssl.create_default_context()
