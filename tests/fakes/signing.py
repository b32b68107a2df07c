"""Build signed Slack HTTP requests (Events API callbacks, interactivity) for tests.

Slack signs every request it sends to an app with the app's signing secret:
``X-Slack-Signature: v0=<hex HMAC-SHA256(secret, "v0:<timestamp>:<raw body>")>`` plus
``X-Slack-Request-Timestamp: <unix seconds>``.  These helpers reproduce that so a test can
POST to a Bolt app exactly as Slack would.  ``Content-Type`` is left to the caller
(``application/json`` for :func:`event_body`, ``application/x-www-form-urlencoded`` for
:func:`action_body`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any
from urllib.parse import urlencode

__all__ = ["action_body", "event_body", "signed_headers"]


def signed_headers(secret: str, body: str | bytes, timestamp: int | None = None) -> dict[str, str]:
    """Return ``X-Slack-Request-Timestamp`` and ``X-Slack-Signature`` for ``body``.

    ``timestamp`` defaults to now (Bolt rejects requests older than five minutes, so pass
    an old one to test that).  ``body`` must be the exact bytes/str that will be sent.
    """
    ts = int(time.time()) if timestamp is None else int(timestamp)
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    digest = hmac.new(secret.encode("utf-8"), f"v0:{ts}:{text}".encode(), hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": str(ts), "X-Slack-Signature": f"v0={digest}"}


def event_body(
    event: dict[str, Any],
    *,
    event_id: str,
    team_id: str = "T1",
    api_app_id: str = "A1",
    bot_user_id: str = "UBOT",
) -> str:
    """An Events API ``event_callback`` envelope (JSON text) wrapping ``event``.

    ``event_id`` is what Slack reuses on retries, so tests of de-duplication pass the same
    id twice.  ``bot_user_id`` only fills ``authorizations[0].user_id``.
    """
    event_time = event.get("event_ts") or event.get("ts") or time.time()
    try:
        event_time_int = int(float(event_time))
    except (TypeError, ValueError):
        event_time_int = int(time.time())
    envelope: dict[str, Any] = {
        "token": "fake-verification-token",
        "team_id": team_id,
        "api_app_id": api_app_id,
        "event": event,
        "type": "event_callback",
        "event_id": event_id,
        "event_time": event_time_int,
        "authorizations": [
            {
                "enterprise_id": None,
                "team_id": team_id,
                "user_id": bot_user_id,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": False,
        "event_context": f"4-fake-{event_id}",
    }
    return json.dumps(envelope)


def action_body(payload: dict[str, Any]) -> str:
    """Form-encode an interactivity ``payload`` as Slack does: ``payload=<json>``."""
    return urlencode({"payload": json.dumps(payload)})
