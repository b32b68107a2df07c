"""The driver's lease on a real redis-server: a heartbeat that cannot reach Redis marks the lease lost."""

from __future__ import annotations

import pytest
import redis
from slack_sdk import WebClient

from harness.config import Config
from runtime.queue import make_queue
from store import RunRecord, RunStatus, Store, new_run_id
from tests.stack import RedisServer, wait_until
from workers.driver import Driver, LostLease
from workers.services import Services


def test_a_heartbeat_that_cannot_reach_redis_marks_the_lease_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_LEASE_SECONDS", "1")
    server = RedisServer().start()
    try:
        conn = redis.Redis.from_url(server.url, socket_connect_timeout=0.2, socket_timeout=0.2)
        store = Store(conn)
        svc = Services(store, make_queue(conn), WebClient(token="xoxb-unused"), Config(), model=None)  # type: ignore[arg-type]
        record = RunRecord(new_run_id(), "T1", "C1", "1.000001", "UA", "hi", status=RunStatus.RUNNING)
        store.runs.save_run(record)
        with Driver(svc, record.run_id) as driver:
            assert driver is not None and not driver.lost
            server.stop()  # every renewal now fails with a connection error
            wait_until(lambda: driver.lost, timeout=10)  # noticed, not a silently dead thread
            with pytest.raises(LostLease):
                driver.save(status=RunStatus.FINISHED)  # no write after the lease may have gone
            server.start()
    finally:
        server.cleanup()
