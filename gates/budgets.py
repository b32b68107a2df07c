"""The daily budgets of a run (`[budgets]`): the gate its agent asks before every model request,
the bot's check before a mention starts a run, and who is near a budget (`python -m workers status`).

The counting itself, atomic across workers, is `store.budgets`. A run counts against its
requester's budget (across every channel) and its channel's, each as large as the run's settings
(its profile's, else the top level's) say; 0 is no budget, though what it spends is still counted.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from harness import texts as harness_texts
from harness.config import Budgets, Config
from harness.state import Usage
from harness.valves import Stop, Valve
from messages import texts
from observe import metrics
from store import (
    CHANNEL_SCOPE,
    HOLD_SECONDS,
    USER_SCOPE,
    Admission,
    Admitted,
    Beside,
    Scope,
    Store,
    budget_settled,
    utc_day,
)

log = logging.getLogger(__name__)

NEAR = 0.8  # `status` lists a budget once this share of it is spent today
FIRST_PAUSE, LONGEST_PAUSE = 0.05, 0.5  # the poll while the requests in flight hold a budget


def scopes(budgets: Budgets, team: str, user: str, channel: str) -> tuple[Scope, Scope]:
    """The two budgets a request of `user` in `channel` counts against (size 0: no budget)."""
    return (
        Scope(USER_SCOPE, team, user, budgets.per_user_daily_tokens),
        Scope(CHANNEL_SCOPE, team, channel, budgets.per_channel_daily_tokens),
    )


@dataclass
class Gate:
    """`harness.valves.Budget` for one run: its requester's and channel's budgets, in Redis.

    Admitting holds an upper bound of the request's cost; `spent` settles it with the real cost.
    While the budget is not spent but the requests in flight hold the rest of it, `admit` waits for
    them (a poll backing off to `LONGEST_PAUSE`; a Stop pressed meanwhile is heard), at most
    `hold_seconds`: by then every hold that was there has settled or lapsed.
    """

    store: Store
    team: str
    user: str
    channel: str
    profile: str  # "" the top level
    budgets: Budgets
    stop_check: Callable[[], Stop | None] | None = None
    # Where the cost of a request that held nothing goes: beside the run's next save (one round
    # trip fewer per request); None: counted at once.
    defer: Callable[[Beside], None] | None = None
    hold_seconds: float = HOLD_SECONDS
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    _open: tuple[str, str] | None = field(default=None, init=False)  # (day, request id) admitted

    @property
    def scopes(self) -> tuple[Scope, ...]:
        return scopes(self.budgets, self.team, self.user, self.channel)

    def admit(self, estimate: int, *, granted: bool) -> Stop | None:
        if not any(scope.budget > 0 for scope in self.scopes):
            return None  # no budget to hold anything against: `spent` still counts what it costs
        request_id, pause = uuid.uuid4().hex, FIRST_PAUSE
        give_up = time.monotonic() + self.hold_seconds
        while True:
            now = self.clock()
            found = self.store.budgets.admit(
                self.scopes, request_id, estimate, granted=granted, now=now, hold_seconds=self.hold_seconds
            )
            if found.outcome is Admission.ADMITTED:
                self._open = (found.day, request_id)
                return None
            if found.outcome is Admission.SPENT or time.monotonic() >= give_up:
                return self._stop(found, now)
            if self.stop_check is not None and (stop := self.stop_check()):
                return stop
            self.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE)

    def spent(self, usage: Usage) -> None:
        held, self._open = self._open, None
        day, request_id = held or (utc_day(self.clock()), uuid.uuid4().hex)
        if held is None and self.defer is not None:  # nothing held for it: the count rides the next save
            self.defer(
                budget_settled(
                    day,
                    self.scopes,
                    request_id,
                    usage.total,
                    profile=self.profile,
                    counted_in=metrics.budget_counter(self.profile),
                )
            )
        else:  # a hold to drop now: others may be waiting on it
            self.store.budgets.settle(
                day,
                self.scopes,
                request_id,
                usage.total,
                profile=self.profile,
                counted_in=metrics.budget_counter(self.profile),
            )

    def _stop(self, found: Admitted, now: float) -> Stop:
        scope = found.scope
        assert scope is not None
        if found.outcome is Admission.SPENT:
            detail = describe(scope, self.profile, found.spent, now)
        else:
            what = "per person" if scope.kind == USER_SCOPE else f"of this {_where(scope.who)}"
            detail = texts.BUDGET_HELD.format(
                what=what, budget=scope.budget, spent=found.spent, left=until_reset(now)
            )
        return Stop(Valve.BUDGET, harness_texts.STOP_BUDGET.format(detail=detail), detail)


def describe(scope: Scope, profile: str, spent: int, now: float) -> str:
    """Which budget is spent, its size, what was used, and when it resets (a stop's words)."""
    named = texts.BUDGET_PROFILE.format(profile=profile) if profile else ""
    if scope.kind == USER_SCOPE:
        return texts.BUDGET_USER.format(
            profile=named, budget=scope.budget, spent=spent, left=until_reset(now)
        )
    return texts.BUDGET_CHANNEL.format(
        where=_where(scope.who), profile=named, budget=scope.budget, spent=spent, left=until_reset(now)
    )


def refusal(
    store: Store, settings: Config, team: str, user: str, channel: str, now: float | None = None
) -> str | None:
    """Why a mention starts nothing: a budget of these settings already spent today; else None."""
    now = time.time() if now is None else now
    found = [s for s in scopes(settings.budgets, team, user, channel) if s.budget > 0]
    named = texts.BUDGET_PROFILE.format(profile=settings.profile) if settings.profile else ""
    for scope, spent in zip(found, store.budgets.spent(found, now), strict=True):
        if spent < scope.budget:
            continue
        if scope.kind == USER_SCOPE:
            return texts.BUDGET_SPENT_USER.format(
                profile=named, budget=scope.budget, spent=spent, left=until_reset(now)
            )
        return texts.BUDGET_SPENT_CHANNEL.format(
            where=_where(channel), profile=named, budget=scope.budget, spent=spent, left=until_reset(now)
        )
    return None


@dataclass(frozen=True)
class Near:
    """A user or channel that spent at least `NEAR` of a budget today."""

    kind: str
    team: str
    who: str
    profile: str  # whose budget it is ("" the top level)
    spent: int  # the user's or channel's whole spend today
    budget: int


def near(store: Store, config: Config, now: float | None = None, share: float = NEAR) -> list[Near]:
    """Everyone at or past `share` of a budget today, the fullest first.

    A user's or channel's spend today is compared with the budget of each profile it spent under
    (as configured now): one line each, so a budget of any of them that is nearly spent shows.
    """
    found = []
    for line in store.budgets.today(now):
        settings = config.settings(line.profile or None)
        budgets = settings.budgets
        budget = (
            budgets.per_user_daily_tokens if line.kind == USER_SCOPE else budgets.per_channel_daily_tokens
        )
        if budget > 0 and line.total >= share * budget:
            found.append(Near(line.kind, line.team, line.who, line.profile, line.total, budget))
    return sorted(found, key=lambda n: (-n.spent / n.budget, n.kind, n.who))


def until_reset(now: float) -> str:
    """How long until the budgets reset (00:00 UTC next), in words: "3 h 12 min", "40 min", "25 s"."""
    today = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    seconds = max(1, int((today + timedelta(days=1)).timestamp() - now))
    if seconds < 60:
        return f"{seconds} s"
    hours, minutes = divmod(-(-seconds // 60), 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"


def _where(channel: str) -> str:
    return "conversation" if channel.startswith("D") else "channel"
