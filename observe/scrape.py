"""`GET /metrics`: one scrape reads every counter and gauge in one round trip and writes them as
Prometheus text, each family's series filtered to the values its labels allow."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from harness.config import Config
from observe import gauges
from observe.families import (
    FAMILIES,
    OTHER,
    Family,
    ToolNames,
    le,
    sum_field,
)
from store import counters


@dataclass(frozen=True)
class QueueKeys:
    """The RQ keys the gauges read: the queue's list, its scheduled registry, its workers' set."""

    queue: str
    scheduled: str
    workers: str

    @classmethod
    def of(cls, queue: Any) -> QueueKeys:
        from rq.worker_registration import WORKERS_BY_QUEUE_KEY

        return cls(queue.key, queue.scheduled_job_registry.key, WORKERS_BY_QUEUE_KEY % queue.name)


class Collector:
    """A prometheus_client collector of the figures in Redis plus gauges read at scrape time.

    One round trip per scrape: HGETALL of the counters pipelined with the gauges' reads (those
    whose labels the config gives, `observe.gauges`, with the config in force at the scrape). When
    Redis does not answer, the scrape raises (the bot answers 503: no figures rather than zeros).
    """

    def __init__(
        self, connection: redis.Redis, queue: QueueKeys, config: Callable[[], Config] | None = None
    ) -> None:
        self.connection = connection
        self.queue = queue
        default = Config()  # no config given (tests, tools): the built-in defaults
        self.config = config or (lambda: default)

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        with self.connection.pipeline(transaction=False) as pipe:
            counters.queue_counters(pipe)
            counters.queue_run_counts(pipe, now)
            pipe.llen(self.queue.queue)
            pipe.zcard(self.queue.scheduled)
            pipe.scard(self.queue.workers)
            reads = gauges.queue_reads(pipe, self.config(), now)
            raw, active, parked, tasks, depth, scheduled, workers, *configured = pipe.execute()
        stored = counters.counters_of(raw)
        for family in FAMILIES:
            yield _histogram(family, stored) if family.histogram else _counter(family, stored)
        yield GaugeMetricFamily(
            "harness_approvals_pending",
            "Parks waiting for a person (approval, limit and question cards).",
            max(0, parked - tasks),
        )
        yield GaugeMetricFamily("harness_tasks_waiting", "Parks waiting on an MCP server's task.", tasks)
        yield GaugeMetricFamily("harness_queue_depth", "Jobs waiting in the RQ queue.", depth)
        yield GaugeMetricFamily(
            "harness_jobs_scheduled", "Jobs scheduled to run later (RQ retries).", scheduled
        )
        yield GaugeMetricFamily("harness_runs_active", "Runs that need a driver now, or have one.", active)
        yield GaugeMetricFamily(
            "harness_workers_registered", "RQ workers registered on the queue (see /healthz?deep=1).", workers
        )
        yield from gauges.families(reads, configured)


def _counter(family: Family, stored: Mapping[str, str]) -> Metric:
    metric = CounterMetricFamily(family.name, family.help, labels=list(family.labels))
    prefix = f"c|{family.name}|" if family.labels else f"c|{family.name}"
    for key, value in stored.items():
        if family.labels and key.startswith(prefix):
            values = key[len(prefix) :].split("|")
            if _allowed(family, values):
                metric.add_metric(values, float(value))
        elif not family.labels and key == prefix:
            metric.add_metric([], float(value))
    if not family.labels and not metric.samples:
        metric.add_metric([], 0.0)  # an unlabelled counter exists from the start
    return metric


def _histogram(family: Family, stored: Mapping[str, str]) -> Metric:
    metric = HistogramMetricFamily(family.name, family.help, labels=list(family.labels))
    bounds = [le(b) for b in (*family.buckets, float("inf"))]
    series: dict[tuple[str, ...], dict[str, float]] = {}
    for key, value in stored.items():
        parts = key.split("|")
        if parts[0] == "b" and len(parts) == len(family.labels) + 3 and parts[1] == family.name:
            values, bound = tuple(parts[2:-1]), parts[-1]
            if _allowed(family, values) and bound in bounds:
                series.setdefault(values, {})[bound] = float(value)
    if not family.labels:
        series.setdefault((), {})
    for values, counts in sorted(series.items()):
        running, buckets = 0.0, []
        for bound in bounds:
            running += counts.get(bound, 0.0)
            buckets.append((bound, running))
        total = float(stored.get(sum_field(family, values), 0.0))
        metric.add_metric(list(values), buckets, total)
    return metric


def _allowed(family: Family, values: Sequence[str]) -> bool:
    return len(values) == len(family.labels) and all(
        v == OTHER or _fits(v, allowed) for v, allowed in zip(values, family.labels.values(), strict=True)
    )


def _fits(value: str, allowed: tuple[str, ...] | re.Pattern[str] | ToolNames) -> bool:
    if isinstance(allowed, ToolNames):
        return bool(allowed.shape.fullmatch(value))
    if isinstance(allowed, re.Pattern):
        return bool(allowed.fullmatch(value))
    return value in allowed


def registry(
    connection: redis.Redis, queue: Any, config: Callable[[], Config] | None = None
) -> CollectorRegistry:
    """A registry holding only the product's collector (none of prometheus_client's process ones:
    they would describe one gunicorn worker of several, picked at random by each scrape).
    `config`: the config in force now (a reload may swap it), which labels some gauges."""
    found = CollectorRegistry(auto_describe=False)
    found.register(Collector(connection, QueueKeys.of(queue), config))
    return found
