"""What the workers say of their MCP servers (`store.mcp_servers`), for `python -m workers status`."""

from __future__ import annotations

import json

import pytest
import redis

from store import Store
from store.keys import Keys
from store.mcp_servers import STATE_TTL, ServerState

NOW = 1_800_000_000.0


def test_each_worker_says_where_its_servers_stand_and_status_reads_only_fresh_words(
    store: Store, conn: redis.Redis
) -> None:
    store.mcp_servers.say(
        "host:1", {"desk": (True, "", NOW - 60), "gone": (False, "no command", NOW - 5)}, NOW
    )
    store.mcp_servers.say("host:2", {"gone": (False, "no command", NOW - 9)}, NOW - STATE_TTL - 1)  # died
    said = store.mcp_servers.said(["desk", "gone", "never"], NOW)
    assert said["desk"] == [ServerState("host:1", True, "", NOW - 60, NOW)]
    assert said["gone"] == [ServerState("host:1", False, "no command", NOW - 5, NOW)]
    assert said["never"] == []
    key = Keys.mcp_server("gone")
    assert key == "harness:mcp:gone" and 0 < conn.ttl(key) <= STATE_TTL
    store.mcp_servers.say("host:1", {"gone": (True, "", NOW + 1)}, NOW + 1)
    assert set(conn.hkeys(key)) == {b"host:1"}  # the dead worker's stale word was dropped on the way
    store.mcp_servers.take_back("host:1", ["desk", "gone"])
    assert store.mcp_servers.said(["desk", "gone"], NOW + 2) == {"desk": [], "gone": []}


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[]",
        json.dumps({"v": 2, "up": False, "reason": "x", "since": 1, "at": NOW}),
        json.dumps({"v": 1}),
    ],
)
def test_a_word_that_cannot_be_read_or_is_newer_is_passed_over(
    store: Store, conn: redis.Redis, raw: str
) -> None:
    conn.hset(Keys.mcp_server("desk"), "host:9", raw)
    assert store.mcp_servers.said(["desk"], NOW) == {"desk": []}
