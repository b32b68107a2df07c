"""What a horse's slots share is built before they start: never lazily, on whichever slot comes first.

A work horse drives up to 16 runs at once, one per slot thread. Anything they share that is built on
first use would be built twice when two slots start together (no lock guards a `cached_property` on
Python 3.12+): two `LiveStreams` would each pace a thread's stream writes on its own, two tracer
providers would export a run's spans apart. Here 16 threads start at once, as 16 slots would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis
from slack_sdk import WebClient

from harness.config import Config
from observe import metrics, tracing
from runtime.queue import make_queue
from workers.services import Services

SLOTS = 16


def at_once(touch: Callable[[], Any]) -> list[Any]:
    """What each of `SLOTS` threads got from `touch`, all released at the same moment."""
    start = threading.Barrier(SLOTS)
    got: list[Any] = [None] * SLOTS

    def slot(i: int) -> None:
        start.wait()
        got[i] = touch()

    threads = [threading.Thread(target=slot, args=(i,)) for i in range(SLOTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return got


def test_sixteen_slots_starting_at_once_find_one_live_streams_and_one_courtesy_client(
    conn: redis.Redis,
) -> None:
    svc = Services(
        metrics.counting_store(conn), make_queue(conn), WebClient(token="xoxb-x"), Config(), model=None
    )  # type: ignore[arg-type]
    streams = at_once(lambda: svc.live_streams)
    clients = at_once(lambda: svc.courtesy_slack)
    assert len({id(s) for s in streams}) == 1 and streams[0] is svc.live_streams
    assert len({id(c) for c in clients}) == 1 and clients[0].token == "xoxb-x"


def test_sixteen_slots_starting_at_once_find_one_tracer_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    # An endpoint nothing listens on: the exporter sends nothing before a span ends.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(tracing, "_current", None)
    try:
        found = at_once(tracing.current)
        assert all(t is not None for t in found)
        assert len({id(t.provider) for t in found}) == 1
    finally:
        current = tracing._current
        if current is not None and current[1] is not None:
            current[1].provider.shutdown()
        monkeypatch.setattr(tracing, "_current", None)


def test_the_store_counts_shortfalls_from_the_start_with_nothing_patched_in(conn: redis.Redis) -> None:
    store = metrics.counting_store(conn)
    assert store.replicas.shortfall is not None
    store.replicas.shortfall("park")
    assert any(b"park" in k for k in conn.hkeys("harness:metrics:counters"))


def services_seen() -> str:
    """A job: which services it was handed (as RQ calls it, by its dotted name)."""
    from workers import jobs

    return str(id(jobs.services()))


def test_a_worker_hands_each_job_the_services_in_force_and_a_reload_reaches_the_next_job(
    conn: redis.Redis,
) -> None:
    """No module global: the worker hands the job the services the process built (`InForce`); a
    reload replaces them in the holder, and the next job gets the new ones."""
    from rq.serializers import JSONSerializer

    from workers.process.horses import HarnessSimpleWorker
    from workers.services import InForce, handed_services

    def services() -> Services:
        return Services(
            metrics.counting_store(conn), make_queue(conn), WebClient(token="x"), Config(), model=None
        )  # type: ignore[arg-type]

    first, second = services(), services()
    in_force = InForce(first)
    queue = first.queue
    worker = HarnessSimpleWorker([queue], connection=conn, serializer=JSONSerializer)
    worker.in_force = in_force
    seen = []
    for now in (first, second):
        in_force.services = now  # what a SIGHUP's reload does
        job = queue.enqueue(services_seen)
        assert worker.work(burst=True)
        job.refresh()
        seen.append(job.return_value())
    assert seen == [str(id(first)), str(id(second))]
    assert handed_services() is None  # handed for the job only, not left on the thread
