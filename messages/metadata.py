"""The Slack message metadata every message this product writes in a thread carries.

A message is tagged with the run that wrote it and a key that names it within the run (the post's
number, `live` for a streamed message, `busy` for the bot's own notice), so that a driver after one
that died can find in the thread what was already written (`conversations.replies` with
`include_all_metadata`) instead of writing it twice. Every message, because the one kind of
message that cannot carry metadata until it stops, a stream, is then found as the message of ours
that carries none (`untagged_streams`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

EVENT_TYPE = "harness_message"  # the metadata's event_type: a message this product wrote
LIVE_KEY = "live"  # the key of a streamed message, stopped by its writer
BUSY_KEY = "busy"  # the key of the bot's notice that the queue is full (no run: it was not made)


def tagged(run_id: str, key: str) -> dict[str, Any]:
    """The `metadata` argument of a message of run `run_id` named `key` in it."""
    return {"event_type": EVENT_TYPE, "event_payload": {"run": run_id, "key": key}}


def tag_of(message: Mapping[str, Any]) -> tuple[str, str] | None:
    """(run, key) of a message as `conversations.replies` returns it; None: not tagged by us."""
    meta = message.get("metadata")
    if not isinstance(meta, Mapping) or meta.get("event_type") != EVENT_TYPE:
        return None
    payload = meta.get("event_payload")
    if not isinstance(payload, Mapping):
        return None
    return str(payload.get("run") or ""), str(payload.get("key") or "")


def untagged_streams(messages: Iterable[Mapping[str, Any]], *, ours: Iterable[str], after: str) -> list[str]:
    """The ts of the messages after `after` (a ts) written by one of `ours` (the bot's user and
    bot ids) that carry no tag of ours and no file: streams nobody stopped, the only message of
    ours without one."""
    mine = {who for who in ours if who}
    found = []
    for message in messages:
        ts = str(message.get("ts") or "")
        if not ts or _ts(ts) <= _ts(after) or message.get("files"):
            continue
        if not ({message.get("user"), message.get("bot_id")} & mine):
            continue
        if tag_of(message) is None:
            found.append(ts)
    return found


def _ts(ts: str) -> tuple[int, int]:
    """A Slack ts as a number that orders correctly (seconds, then microseconds)."""
    seconds, _, micros = ts.partition(".")
    try:
        return int(seconds), int(micros.ljust(6, "0")[:6])
    except ValueError:
        return (0, 0)
