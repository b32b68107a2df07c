"""The gauges of `/metrics` whose labels the config gives: the runs waiting on each approver, and
how much of each profile's daily budgets the fullest user or channel has spent today.

Both are read at scrape time, in the collector's one round trip (`observe.scrape.Collector`), and
cost a scrape the same whatever the number of parks, users or channels:

- Runs waiting: one ZCOUNT per profile (two when it escalates) of the profile's index of open
  parks (`store.counters.queue_profile_parks`; an index kept by the scripts that park, extend and
  resume beside the Home tab's indexes). A park waits on its profile's `approvers`, or on its
  requester when there are none (`requester`), as `gates.deciders` says; once past
  `escalate_after_minutes`, on `escalate_to` as well. A run waiting on several approvers counts
  under each of them, so the sum of the series is no total (`harness_approvals_pending` is).
- Budgets: one script (`store.budgets.BUDGET_PEAKS`) that works out in Redis, from the day's
  spend hash, the highest day total of a user and of a channel under each profile; here it is
  divided by the profile's budget as configured now. The question it answers is an SRE's "is anyone
  close to their daily budget?": the fullest one, not a sum that a thousand light users would
  inflate.

Label values come from the config only (approver ids from `approvers` and `escalate_to`, profile
names, `user` / `channel`): never a requester's id, a channel or a run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from redis.client import Pipeline

from harness.config import Approvals, Config
from store import CHANNEL_SCOPE, USER_SCOPE, budget_peaks, counters, queue_budget_peaks

REQUESTER = "requester"  # the label of parks decided by the person who asked for the run
SCOPES = (USER_SCOPE, CHANNEL_SCOPE)


def escalation_window(approvals: Approvals) -> float | None:
    """How long before its expiry a park is escalated (`gates.deciders.escalated`: parked at its
    expiry less `expire_after_minutes`, escalated `escalate_after_minutes` later); None: never."""
    if not approvals.escalate_after_minutes or not approvals.escalate_to:
        return None
    window = (approvals.expire_after_minutes - approvals.escalate_after_minutes) * 60
    return window if window > 0 else None


@dataclass(frozen=True)
class Reads:
    """What a scrape asked Redis for: the settings of each level (the top level, then every
    profile), in the order their counts come back, and how many replies that makes."""

    levels: tuple[Config, ...]
    replies: int


def queue_reads(pipe: Pipeline, config: Config, now: float) -> Reads:
    """Queue on `pipe` the reads of both gauges: each level's open parks (and escalated ones), then
    the budget peaks of today (`store.queue_budget_peaks`)."""
    levels = (config, *(p.settings for p in config.profiles))
    replies = 0
    for settings in levels:
        counters.queue_profile_parks(pipe, settings.profile_label, now)
        window = escalation_window(settings.approvals)
        if window is not None:
            counters.queue_profile_parks(pipe, settings.profile_label, now, until=now + window)
        replies += 1 if window is None else 2
    queue_budget_peaks(pipe, now)
    return Reads(levels, replies + 1)


def families(reads: Reads, replies: Sequence[Any]) -> Iterator[Metric]:
    """The two gauges, from what `queue_reads` queued and Redis answered."""
    answers = iter(replies)
    waiting: dict[str, int] = {}
    for settings in reads.levels:
        approvals = settings.approvals
        parked = int(next(answers))
        escalated = int(next(answers)) if escalation_window(approvals) is not None else 0
        named = approvals.approvers or (REQUESTER,)
        for who in named:
            waiting[who] = waiting.get(who, 0) + parked
        for who in approvals.escalate_to:
            if who not in named:
                waiting[who] = waiting.get(who, 0) + escalated
    gauge = GaugeMetricFamily(
        "harness_runs_waiting",
        "Runs parked for a decision that an approver (a user or group id of the config's approvers or "
        "escalate_to, or requester) may make now; a run waiting on several counts under each.",
        labels=["approvers"],
    )
    for who, count in sorted(waiting.items()):
        gauge.add_metric([who], count)
    yield gauge
    yield _budgets_used(reads.levels, budget_peaks(next(answers)))


def _budgets_used(levels: Sequence[Config], peaks: dict[tuple[str, str], int]) -> Metric:
    gauge = GaugeMetricFamily(
        "harness_budget_used_ratio",
        "The share of a profile's daily budget (per user or per channel) spent today by its fullest "
        'user or channel (1: spent); profile="" is the top-level settings. Only budgets that are set.',
        labels=["profile", "scope"],
    )
    for settings in levels:
        budgets = settings.budgets
        for scope, budget in zip(
            SCOPES, (budgets.per_user_daily_tokens, budgets.per_channel_daily_tokens), strict=True
        ):
            if budget > 0:
                spent = peaks.get((scope, settings.profile_label), 0)
                gauge.add_metric([settings.profile_label, scope], spent / budget)
    return gauge
