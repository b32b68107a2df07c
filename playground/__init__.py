"""The playground: a local stand-in for Slack and an offline demo model, to try the bot with neither."""

from __future__ import annotations

import ipaddress

# The playground has no sign-in: whoever reaches the page can post as any demo user and click
# Approve, so it listens on this machine's loopback only, whatever HOST says.
NOT_LOOPBACK = (
    "HOST={host}: the playground listens on loopback only (127.0.0.1, ::1 or localhost), since anyone "
    "who reaches it can post as any demo user and click Approve; unset HOST (tunnel or forward port "
    "{port} to reach it from elsewhere)"
)


def bind_problem(host: str, port: int | str = 3000) -> str | None:
    """Why the playground must not listen on `host` (one line), or None: unset, localhost or a loopback IP."""
    if host in ("", "localhost"):
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:  # a name other than localhost: it may resolve anywhere
        pass
    return NOT_LOOPBACK.format(host=host, port=port)


def url_host(host: str) -> str:
    """`host` as it goes in a URL (an IPv6 address in brackets); 127.0.0.1 when unset."""
    host = host or "127.0.0.1"
    return f"[{host}]" if ":" in host else host
