"""Rules with memory: a `[[policy.rules]]` table that counts the calls that ran (`max_calls`), or
adds up one of their numeric arguments (`max_sum`), over a sliding window of time (`per`) within a
scope (the run, the thread, the channel, the requester or the workspace), and speaks only past
its limit.

The policy stays a pure function: what a window holds is read by a `Meter` (the worker's counts
in Redis, `gates.meters`; the terminal's in memory, `MemoryMeter`) and handed to `Policy.decide`
as `Seen` values. A call is counted when it is let run (`Meter.take`), atomically with the check,
so two workers below the limit never both pass it. The `why` of a call past a limit names the
rule, the limit and what the window held (`limit_why`), and is read back by `read_limit`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from harness import texts

if TYPE_CHECKING:
    from harness.policy import Rule

SCOPES = ("run", "thread", "channel", "requester", "workspace")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_WINDOW = 31 * 86400  # the longest `per`: a month of entries is the most a window keeps
DURATION = re.compile(r"([1-9][0-9]{0,6})([smhd])")
ARG_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def parse_duration(value: Any) -> int:
    """`"30s"`, `"15m"`, `"1h"`, `"1d"` as seconds; ValueError for anything else (or past 31d)."""
    found = DURATION.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        raise ValueError("not a duration")
    seconds = int(found.group(1)) * UNITS[found.group(2)]
    if seconds > MAX_WINDOW:
        raise ValueError("longer than 31d")
    return seconds


def number_text(value: float) -> str:
    """`3`, `12.5`: a count or a sum as a person writes it."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:.15g}"


@dataclass(frozen=True)
class Window:
    """A counting rule's limit: at most `max_calls` calls, or at most `max_sum` of the argument
    `sum_arg` added up, among the calls that ran in the last `per` within one `scope`."""

    per: str  # as written: "1h"
    scope: str  # one of SCOPES
    max_calls: int = 0  # > 0: the rule counts calls
    sum_arg: str = ""  # set: the rule adds up this top-level argument instead
    max_sum: float = 0.0

    @property
    def seconds(self) -> int:
        return parse_duration(self.per)

    @property
    def limit(self) -> float:
        return float(self.max_sum) if self.sum_arg else float(self.max_calls)

    @property
    def kind(self) -> str:
        return "sum" if self.sum_arg else "calls"

    def amount(self, arguments: Any) -> float | None:
        """What one call adds to the window: 1 for a count; for a sum its argument, when that is a
        finite number >= 0 (a bool, a string, a negative number or one missing is None: not known)."""
        if not self.sum_arg:
            return 1.0
        value = arguments.get(self.sum_arg) if isinstance(arguments, Mapping) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        number = float(value)
        return number if math.isfinite(number) and number >= 0 else None

    def measure(self) -> str:
        """`max_calls = 3` or `max_sum = 500 of amount`: the limit, as the why names it."""
        if self.sum_arg:
            return texts.WHY_LIMIT_SUM.format(limit=number_text(self.max_sum), arg=self.sum_arg)
        return texts.WHY_LIMIT_CALLS.format(limit=self.max_calls)


def counter_id(tool: str, args: Mapping[str, str], window: Window) -> str:
    """What a counter is the counter of: the rule's tool and argument globs and what it counts
    (24 hex digits). Not its number, tier, limit or window: a rule moved, made stricter or given
    another `per` keeps counting the same calls; a top-level rule counts across profiles."""
    what = [tool, sorted(args.items()), window.kind, window.sum_arg]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Seen:
    """What a window held for a call when it was read: `total` calls (or the sum) of the calls that
    ran in it, the call itself left out; `known` false when it could not be read (fail closed)."""

    total: float = 0.0
    known: bool = True

    @classmethod
    def unknown(cls) -> Seen:
        return cls(0.0, known=False)


def limit_tail(window: Window, arguments: Any, seen: Seen) -> str | None:
    """Why a call goes past `window` (the end of its why), or None while it stays within it."""
    amount = window.amount(arguments)
    if amount is None:
        return texts.WHY_LIMIT_NOT_NUMBER.format(arg=window.sum_arg)
    if not seen.known:
        return texts.WHY_LIMIT_UNREAD
    if seen.total + amount <= window.limit:
        return None
    if window.sum_arg:
        return texts.WHY_LIMIT_SUMMED.format(seen=number_text(seen.total), adds=number_text(amount))
    return texts.WHY_LIMIT_RAN.format(seen=number_text(seen.total))


def limit_why(rule_text: str, window: Window, tail: str) -> str:
    """`policy.rules[2] (tool = "deploy_*"): max_calls = 3 per 1h by channel, 3 ran`."""
    return texts.WHY_LIMIT.format(
        rule=rule_text, measure=window.measure(), per=window.per, scope=window.scope, tail=tail
    )


@dataclass(frozen=True)
class LimitSeen:
    """A limit's why read back: the limit, its window and scope, and what the window held (`seen`,
    and for a sum what this call adds); `missing` when the call's argument was not a number,
    `unread` when the counter could not be read."""

    limit: str
    per: str
    scope: str
    arg: str = ""
    seen: str = ""
    adds: str = ""
    missing: bool = False
    unread: bool = False


_NUMBER = r"[0-9][0-9.e+]*"
_LIMIT = re.compile(
    r"(?s)(?P<rule>.*): (?:max_calls = (?P<calls>[0-9]+)|max_sum = (?P<sum>"
    + _NUMBER
    + r") of (?P<arg>[A-Za-z0-9_.-]+)) per (?P<per>[0-9]+[smhd]) by (?P<scope>"
    + "|".join(SCOPES)
    + r"), (?P<tail>.*)"
)
_RAN = re.compile(r"(?P<seen>" + _NUMBER + r") ran(?:, this call adds (?P<adds>" + _NUMBER + r"))?")


def read_limit(why: str) -> tuple[str, LimitSeen] | None:
    """A limit's why as `limit_why` wrote it: the rule's own why, and the limit read back; None if not."""
    found = _LIMIT.fullmatch(why)
    if found is None:
        return None
    limit = found.group("calls") or found.group("sum")
    seen = LimitSeen(limit, found.group("per"), found.group("scope"), found.group("arg") or "")
    tail = found.group("tail")
    if tail == texts.WHY_LIMIT_UNREAD:
        return found.group("rule"), replace(seen, unread=True)
    if tail == texts.WHY_LIMIT_NOT_NUMBER.format(arg=seen.arg):
        return found.group("rule"), replace(seen, missing=True)
    ran = _RAN.fullmatch(tail)
    if ran is None:
        return None
    return found.group("rule"), replace(seen, seen=ran.group("seen"), adds=ran.group("adds") or "")


@dataclass(frozen=True)
class Where:
    """Where a run is, as the scopes of a window see it (all "" in the terminal: one run)."""

    run: str = ""
    team: str = ""
    channel: str = ""
    thread: str = ""
    requester: str = ""

    def ids(self, scope: str) -> tuple[str, ...]:
        """The ids that name one window of `scope`: the run; the team, channel and thread; …"""
        return {
            "run": (self.run,),
            "thread": (self.team, self.channel, self.thread),
            "channel": (self.team, self.channel),
            "requester": (self.team, self.requester),
            "workspace": (self.team,),
        }[scope]


@dataclass(frozen=True)
class Count:
    """One counting rule a call about to run is counted in: with `amount` (1 for a count), checked
    against its limit, unless `forced` (a person approved the call: it runs and is counted)."""

    rule: Rule
    amount: float
    forced: bool = False


class Meter(Protocol):
    """Reads and counts the windows of counting rules, for the calls of one run."""

    def seen(self, rule: Rule, call_id: str) -> Seen:
        """What `rule`'s window holds now for this run's scope, `call_id` itself left out."""
        ...

    def take(self, call_id: str, counts: Sequence[Count]) -> tuple[Rule, Seen] | None:
        """Count `call_id` in every window of `counts` at once, or in none: None when counted (or
        counted already), else the first rule it would go past and what its window held."""
        ...

    def give_back(self, call_id: str, rules: Sequence[Rule]) -> None:
        """Uncount `call_id` (taken, then not run: a Stop came first)."""
        ...


@dataclass
class MemoryMeter:
    """A `Meter` in this process's memory: the terminal's (`python -m harness` is one run, so
    every scope is that run) and replay's (`where` and `clock` set for each recorded call)."""

    where: Where = field(default_factory=Where)
    clock: Callable[[], float] = time.time
    _windows: dict[tuple[str, ...], dict[str, tuple[float, float]]] = field(default_factory=dict)

    def _window(self, rule: Rule) -> dict[str, tuple[float, float]]:
        assert rule.window is not None
        key = (rule.counter_id, rule.window.scope, *self.where.ids(rule.window.scope))
        entries = self._windows.setdefault(key, {})
        since = self.clock() - rule.window.seconds
        for member in [m for m, (at, _) in entries.items() if at <= since]:
            del entries[member]
        return entries

    def _member(self, call_id: str) -> str:
        return f"{self.where.run}:{call_id}"

    def seen(self, rule: Rule, call_id: str) -> Seen:
        entries = self._window(rule)
        own = self._member(call_id)
        return Seen(sum(amount for member, (_, amount) in entries.items() if member != own))

    def take(self, call_id: str, counts: Sequence[Count]) -> tuple[Rule, Seen] | None:
        own = self._member(call_id)
        adding = []
        for count in counts:
            assert count.rule.window is not None
            entries = self._window(count.rule)
            if own in entries:
                continue
            total = sum(amount for _, amount in entries.values())
            if not count.forced and total + count.amount > count.rule.window.limit:
                return count.rule, Seen(total)
            adding.append((entries, count.amount))
        for entries, amount in adding:
            entries[own] = (self.clock(), amount)
        return None

    def give_back(self, call_id: str, rules: Sequence[Rule]) -> None:
        for rule in rules:
            self._window(rule).pop(self._member(call_id), None)
