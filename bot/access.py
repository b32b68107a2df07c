"""Who may read the operators' pages of the bot: `GET /metrics` and `GET /healthz?deep=1`.

They show host names, PIDs, queue depths and approval counts, and the bot's port is usually the
public Slack request URL. Three ways in, decided per request before anything is read:

- ``METRICS_TOKEN`` set: ``Authorization: Bearer <token>`` is required from every address (401
  without it), compared in constant time. Loopback is no longer enough: a proxy on the same host
  makes every request come from 127.0.0.1.
- ``METRICS_PORT`` set: the pages are served on that listener (``METRICS_HOST``, default ``HOST``)
  and not on ``PORT`` (404 there). Without a token, anyone who reaches that listener reads them:
  keep it on a private interface or behind a firewall.
- Neither: only a peer on loopback (127.0.0.0/8, ::1) reads them, and only when the request
  carries no forwarding header (a proxy on this host relays other machines' requests); any other
  peer gets 403. The peer is the TCP connection's (`REMOTE_ADDR`): ``X-Forwarded-For`` and its
  kin never grant anything, since whoever sends the request writes them.

Plain `GET /healthz` stays open to all: a load balancer needs it, and it tells nothing but "up".
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runtime.clients import SettingsError

MIN_TOKEN_LENGTH = 16  # a token short enough to guess is no gate; `secrets.token_urlsafe(32)` gives 43
TOKEN_CHARACTERS = re.compile(r"[A-Za-z0-9\-._~+/]+=*")  # RFC 6750's b64token: it fits in the header as is
FORWARDING_HEADERS = ("HTTP_FORWARDED", "HTTP_X_FORWARDED_FOR", "HTTP_X_REAL_IP", "HTTP_VIA")

NEED_TOKEN = "this page needs Authorization: Bearer <METRICS_TOKEN>\n"
ONLY_LOOPBACK = (
    "this page answers only on loopback: set METRICS_TOKEN (and send it as a bearer token) "
    "or METRICS_PORT to read it from elsewhere\n"
)
ELSEWHERE = "not found (this page is served on METRICS_PORT)\n"


@dataclass(frozen=True)
class Refusal:
    """Why a request for an operators' page is not served: the HTTP status, body and headers."""

    status: str
    body: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class OperatorAccess:
    """The rule for the operators' pages: a bearer token, a listener of their own, or loopback only."""

    token: str | None = None
    port: int | None = None  # the metrics listener's port; None: the pages are on the bot's port

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, bot_port: int) -> OperatorAccess:
        """``METRICS_TOKEN`` and ``METRICS_PORT``; SettingsError (one line) when either is unusable."""
        token = env.get("METRICS_TOKEN") or None
        if token is not None and (len(token) < MIN_TOKEN_LENGTH or not TOKEN_CHARACTERS.fullmatch(token)):
            raise SettingsError(
                f"METRICS_TOKEN must be at least {MIN_TOKEN_LENGTH} characters of A-Z, a-z, 0-9, -._~+/ "
                '(e.g. python -c "import secrets; print(secrets.token_urlsafe(32))")'
            )
        raw = (env.get("METRICS_PORT") or "").strip()
        if not raw:
            return cls(token=token)
        if not raw.isdigit() or not 0 < int(raw) < 65536 or int(raw) == bot_port:
            raise SettingsError(f"METRICS_PORT must be a TCP port other than PORT ({bot_port}), not {raw!r}")
        return cls(token=token, port=int(raw))

    def refusal(self, environ: Mapping[str, Any]) -> Refusal | None:
        """None when this request may read an operators' page, else how to refuse it."""
        if self.port is not None and str(environ.get("SERVER_PORT")) != str(self.port):
            return Refusal("404 Not Found", ELSEWHERE)  # not served on this listener at all
        if self.token is not None:
            if _bearer_matches(environ.get("HTTP_AUTHORIZATION"), self.token):
                return None
            return Refusal("401 Unauthorized", NEED_TOKEN, (("WWW-Authenticate", 'Bearer realm="metrics"'),))
        if self.port is not None or is_local_peer(environ):
            return None
        return Refusal("403 Forbidden", ONLY_LOOPBACK)

    def on_metrics_listener(self, environ: Mapping[str, Any]) -> bool:
        """Whether the request came in on the metrics listener (which serves nothing of Slack's)."""
        return self.port is not None and str(environ.get("SERVER_PORT")) == str(self.port)


def _bearer_matches(header: Any, token: str) -> bool:
    """`Authorization: Bearer <token>`, the scheme's case aside (RFC 6750), in constant time."""
    if not isinstance(header, str):
        return False
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "replace"), token.encode())


def is_local_peer(environ: Mapping[str, Any]) -> bool:
    """The TCP peer is on loopback and nothing says it relays another machine's request."""
    if any(environ.get(name) for name in FORWARDING_HEADERS):
        return False
    try:
        peer = ipaddress.ip_address(str(environ.get("REMOTE_ADDR") or "").split("%", 1)[0])
    except ValueError:
        return False  # a unix socket or nothing: not known to be this machine
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped  # 127.0.0.1 as a dual-stack listener ([::]) sees it
    return peer.is_loopback
