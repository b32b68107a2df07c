"""The windows of a run's counting rules (`harness.counting`), in Redis: the `Meter` its agent reads
them with when a call is ruled, and counts a call in as it is let run, atomically with every other
worker (`store.meters`).

A run's scopes are its own id (`run`), its thread, its channel, its requester and its workspace.
A window that cannot be read is not known (the call asks, `harness.counting.Seen.unknown`); one
that cannot be counted in raises, as any other write of the step would.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from harness.counting import Count, Seen, Where
from harness.policy import Rule
from store import BadId, Entry, RunRecord, Store, Window

log = logging.getLogger(__name__)


def where_of(record: RunRecord) -> Where:
    """Where a run is, as the windows' scopes see it."""
    return Where(record.run_id, record.team, record.channel, record.thread_ts, record.requester)


def window_of(rule: Rule, where: Where) -> Window:
    """`rule`'s window for a run at `where`."""
    assert rule.window is not None
    return Window(rule.counter_id, rule.window.scope, where.ids(rule.window.scope))


@dataclass(frozen=True)
class RunMeter:
    """`harness.counting.Meter` for one run: its windows in Redis."""

    store: Store
    where: Where

    def seen(self, rule: Rule, call_id: str) -> Seen:
        assert rule.window is not None
        try:
            window = window_of(rule, self.where)
            total = self.store.meters.seen(
                window, rule.window.seconds, rule.window.kind, self.where.run, call_id
            )
        except (BadId, redis.RedisError) as exc:
            log.warning(
                "run %s: the counter of %s could not be read (%s): the call asks",
                self.where.run,
                rule.key,
                exc,
            )
            return Seen.unknown()
        return Seen.unknown() if total is None else Seen(total)

    def take(self, call_id: str, counts: Sequence[Count]) -> tuple[Rule, Seen] | None:
        entries, rules = [], []
        for count in counts:
            window = count.rule.window
            assert window is not None
            where = window_of(count.rule, self.where)
            try:
                where.key  # noqa: B018 - an id the store does not write: no window can hold the call
            except BadId:
                if count.forced:
                    continue
                return count.rule, Seen.unknown()  # past the limit (fail closed): a person may say yes
            entries.append(
                Entry(where, window.seconds, window.kind, window.limit, count.amount, count.forced)
            )
            rules.append(count.rule)
        over = self.store.meters.take(self.where.run, call_id, entries)
        if over is None:
            return None
        index, total = over
        return rules[index], Seen.unknown() if total is None else Seen(total)

    def give_back(self, call_id: str, rules: Sequence[Rule]) -> None:
        windows = [window_of(rule, self.where) for rule in rules if rule.window is not None]
        try:
            self.store.meters.give_back(windows, self.where.run, call_id)
        except (BadId, redis.RedisError):  # counted, not run: one more than ran is the safe side
            log.exception("run %s: call %s could not be uncounted", self.where.run, call_id)
