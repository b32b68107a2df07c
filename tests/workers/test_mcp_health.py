"""A worker says where its MCP servers stand (`workers.mcp_health`), for `python -m workers status`."""

from __future__ import annotations

import redis

from harness.tools.mcp import ServerHealth
from store import Store
from store.keys import Keys
from workers.mcp_health import ServerReports

NOW = 1_800_000_000.0


def test_a_worker_says_it_again_when_it_changes_or_half_a_minute_passed(
    store: Store, conn: redis.Redis
) -> None:
    health = [ServerHealth("gone", False, "no command", NOW - 5, 1)]
    reports = ServerReports(lambda: health, worker="host:7")
    writes = []
    real = store.mcp_servers.say
    store.mcp_servers.say = lambda *a: writes.append(a) or real(*a)  # type: ignore[method-assign]
    reports.say(store, NOW)
    reports.say(store, NOW + 10)  # nothing changed: nothing written
    health[0] = ServerHealth("gone", True, "", NOW + 11, 0)
    reports.say(store, NOW + 12)  # up again: written at once
    reports.say(store, NOW + 43)  # the same, half a minute on: said again (it would expire otherwise)
    assert [w[2] for w in writes] == [NOW, NOW + 12, NOW + 43]
    assert store.mcp_servers.said(["gone"], NOW + 43)["gone"][0].up
    reports.take_back(store)
    assert conn.hkeys(Keys.mcp_server("gone")) == []
