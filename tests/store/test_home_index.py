"""The Home tab's index of what waits on whom, on a real Redis through the store's own scripts.

Parks are made as a worker makes them (`store.parks.park` under a lease), closed as a resume, a stop, an
expiry or a limit's answer closes them (`store.threads.resumed`, `store.parks.forget`, `expire_due`), and
the Home tab is read as the bot reads it (`bot.listeners.home.waiting_on`), with approvers, user groups,
`escalate_to` and requesters.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from slack_sdk import WebClient

from bot.listeners.home import HOME_SCAN, waiting_on
from bot.listening import BotDeps
from harness.config import Approvals, Config
from harness.policy import Tier
from harness.state import Decision, PendingCall, RunState, Verdict
from messages.home import HOME_ITEMS_MAX
from runtime.queue import make_queue
from store import DAY, RunRecord, RunStatus, Store, new_run_id
from store.keys import Keys
from tests.fakes.slack_api import FakeSlackAPI
from workers.jobs import expire_due

TEAM = "T1"


@pytest.fixture
def slack() -> Iterator[FakeSlackAPI]:
    with FakeSlackAPI(bot_token="xoxb-test") as fake:
        yield fake


def deps_for(store: Store, slack: FakeSlackAPI, **approvals: Any) -> BotDeps:
    deps = BotDeps(
        store=store, queue=make_queue(store.redis), config=Config(approvals=Approvals(**approvals))
    )
    deps.groups.bind(WebClient(token="xoxb-test", base_url=slack.base_url))
    return deps


def park(
    store: Store,
    requester: str,
    *,
    expires_in: float = 3600,
    calls: int = 1,
    team: str = TEAM,
    park_id: int = 1,
) -> RunRecord:
    """A run parked on `calls` ask-tier calls, as a worker parks it (under its lease)."""
    pending = tuple(
        PendingCall(f"toolu_{i}", "write_file", {"path": f"n{i}.txt", "content": "x"}, Tier.ASK)
        for i in range(calls)
    )
    state = RunState(messages=({"role": "user", "content": "go"},), pending=pending)
    record = RunRecord(
        run_id=new_run_id(),
        team=team,
        channel="C1",
        thread_ts=f"{int(time.time())}.{uuid.uuid4().int % 10**6:06d}",
        requester=requester,
        task="go",
        status=RunStatus.AWAITING_APPROVAL,
        state=state.to_json(),
        park_id=park_id,
        expires_at=time.time() + expires_in,
    )
    token = uuid.uuid4().hex
    assert store.runs.acquire_lease(record.run_id, token, 30)
    assert store.parks.park(record, token, 30, [c.id for c in pending], ttl=DAY)
    store.runs.release_lease(record.run_id, token)
    return record


def shown(deps: BotDeps, user: str, team: str = TEAM) -> list[str]:
    """The runs whose calls `user`'s Home tab lists, in order (one entry per call)."""
    items, _ = waiting_on(deps, team, user)
    return [item.call.input["path"] + "@" + item.requester for item in items]


def members(conn: redis.Redis, key: str) -> set[str]:
    return {m.decode() for m in conn.zrange(key, 0, -1)}


def member(record: RunRecord) -> str:
    return f"{record.run_id}:{record.park_id}"


def test_a_park_enters_its_teams_and_its_requesters_index_with_its_expiry_and_a_ttl(
    store: Store, conn: redis.Redis
) -> None:
    record = park(store, "UALICE", expires_in=600)
    for key in (Keys.team_parks(TEAM), Keys.user_parks(TEAM, "UALICE")):
        assert members(conn, key) == {member(record)}
        assert conn.zscore(key, member(record)) == pytest.approx(record.expires_at)
        assert 0 < conn.ttl(key) <= DAY and key.startswith("harness:")
    assert members(conn, Keys.user_parks(TEAM, "UBOB")) == set()


def test_a_resume_a_stop_and_an_answered_limit_take_the_park_out_of_every_index(
    store: Store, conn: redis.Redis
) -> None:
    resumed, stopped, other = park(store, "UALICE"), park(store, "UALICE"), park(store, "UBOB")
    store.runs.write_besides([store.threads.resumed(resumed, 60)])  # what the resume's save carries
    store.parks.forget(stopped)  # `_stop_parked`, `_resume_at_limit`
    assert members(conn, Keys.team_parks(TEAM)) == {member(other)}
    assert members(conn, Keys.user_parks(TEAM, "UALICE")) == set()
    assert members(conn, Keys.expiries()) == {member(other)}


def test_an_expired_park_leaves_every_index_and_a_later_park_trims_what_a_crash_left(
    store: Store, conn: redis.Redis
) -> None:
    late = park(store, "UALICE", expires_in=0.2)
    kept = park(store, "UBOB")
    expire_due(store, make_queue(conn), time.time() + 1)  # the watchdog, once the park's time has come
    assert members(conn, Keys.team_parks(TEAM)) == {member(kept)}
    assert members(conn, Keys.user_parks(TEAM, "UALICE")) == set()
    assert member(late) not in members(conn, Keys.expiries())

    conn.zadd(Keys.team_parks(TEAM), {f"{new_run_id()}:1": time.time() - 5})  # a crash between two steps
    newer = park(store, "UCAROL")
    assert members(conn, Keys.team_parks(TEAM)) == {member(kept), member(newer)}


def test_each_person_sees_exactly_the_calls_waiting_on_them(
    store: Store, conn: redis.Redis, slack: FakeSlackAPI
) -> None:
    slack.set_usergroup("SOPS", ["UOPS"])
    alice, bob = park(store, "UALICE", calls=2), park(store, "UBOB")
    elsewhere = park(store, "UALICE", team="T2")

    requesters_decide = deps_for(store, slack)  # no approvers: each requester decides their runs
    assert sorted(shown(requesters_decide, "UALICE")) == ["n0.txt@UALICE", "n1.txt@UALICE"]
    assert shown(requesters_decide, "UBOB") == ["n0.txt@UBOB"]
    assert shown(requesters_decide, "UOPS") == []
    assert shown(requesters_decide, "UALICE", team="T2") == ["n0.txt@UALICE"]

    approvers = deps_for(store, slack, approvers=("UANN", "SOPS"))
    for who in ("UANN", "UOPS"):  # in person, and as a member of the group
        assert sorted(shown(approvers, who)) == ["n0.txt@UALICE", "n0.txt@UBOB", "n1.txt@UALICE"]
    assert shown(approvers, "UALICE") == [] and shown(approvers, "UDAVE") == []

    store.parks.decide(alice.run_id, 1, "toolu_0", Decision(Verdict.APPROVED, by="UANN"))
    assert sorted(shown(approvers, "UANN")) == ["n0.txt@UBOB", "n1.txt@UALICE"]  # the decided call goes
    store.parks.decide(alice.run_id, 1, "toolu_1", Decision(Verdict.DECLINED, by="UANN"))
    assert shown(approvers, "UANN") == ["n0.txt@UBOB"]
    # every call decided, its resume not yet run: the read took it out of the index
    assert members(conn, Keys.team_parks(TEAM)) == {member(bob)}
    assert members(conn, Keys.user_parks(TEAM, "UALICE")) == set()
    assert elsewhere.team == "T2" and members(conn, Keys.team_parks("T2")) == {member(elsewhere)}


def test_escalate_to_sees_only_the_parks_past_their_escalation_time(
    store: Store, slack: FakeSlackAPI
) -> None:
    slack.set_usergroup("SLEADS", ["UFRANK"])
    deps = deps_for(
        store,
        slack,
        approvers=("UANN",),
        escalate_to=("SLEADS",),
        escalate_after_minutes=10.0,
        expire_after_minutes=60.0,
    )
    park(store, "UALICE", expires_in=45 * 60)  # parked 15 minutes ago: escalated
    park(store, "UBOB", expires_in=55 * 60)  # parked 5 minutes ago: not yet
    assert shown(deps, "UFRANK") == ["n0.txt@UALICE"]
    assert sorted(shown(deps, "UANN")) == ["n0.txt@UALICE", "n0.txt@UBOB"]


def test_a_requesters_run_is_listed_however_many_other_runs_expire_before_it(
    store: Store, slack: FakeSlackAPI
) -> None:
    """The old Home tab read the 500 soonest-expiring parks of everyone and missed the rest."""
    for i in range(HOME_SCAN + 550):
        park(store, f"UOTHER{i % 50}", expires_in=600 + i)
    mine = park(store, "UALICE", expires_in=7200)
    deps = deps_for(store, slack)
    items, more = waiting_on(deps, TEAM, "UALICE")
    assert [(i.requester, i.expires_at.timestamp()) for i in items] == [
        ("UALICE", pytest.approx(mine.expires_at))
    ]
    assert not more
    approver = deps_for(store, slack, approvers=("UANN",))
    items, more = waiting_on(approver, TEAM, "UANN")
    assert len(items) == HOME_ITEMS_MAX and more


def test_a_hostile_team_id_reads_nothing(store: Store, slack: FakeSlackAPI) -> None:
    park(store, "UALICE")
    deps = deps_for(store, slack)
    assert waiting_on(deps, "T1:*", "UALICE") == ([], False)


def test_parks_made_before_the_index_existed_join_it_once_the_worker_starts(
    store: Store, conn: redis.Redis, slack: FakeSlackAPI
) -> None:
    """An upgrade: the parks of an older version are in `expiries` only, so nobody's Home tab listed
    them until they were parked again. The worker indexes them at start; the index is unchanged by a
    second start, and a park the run moved on from, or one of a run gone, stays out."""
    open_park, moved_on, gone = park(store, "UALICE"), park(store, "UBOB"), park(store, "UCAROL")
    conn.delete(*(key for key in conn.scan_iter("harness:parks:*")))  # as an older version left it
    conn.delete(Keys.run(gone.run_id))
    conn.zadd(Keys.expiries(), {f"{moved_on.run_id}:{moved_on.park_id + 7}": time.time() + 60})
    deps = deps_for(store, slack, approvers=("UANN",))
    assert shown(deps, "UANN") == []

    assert store.parks.index_open_parks(time.time()) == 2  # the open one and UBOB's current park
    assert store.parks.index_open_parks(time.time()) == 2
    assert members(conn, Keys.team_parks(TEAM)) == {member(open_park), member(moved_on)}
    assert members(conn, Keys.user_parks(TEAM, "UALICE")) == {member(open_park)}
    assert conn.zscore(Keys.team_parks(TEAM), member(open_park)) == pytest.approx(open_park.expires_at)
    assert 0 < conn.ttl(Keys.team_parks(TEAM)) <= DAY + 3600
    assert sorted(shown(deps, "UANN")) == ["n0.txt@UALICE", "n0.txt@UBOB"]

    # A worker's start makes the pass once per Redis: later starts read no run record for it.
    assert store.parks.index_older_parks(time.time()) == 2
    assert store.parks.index_older_parks(time.time()) is None
    assert members(conn, Keys.team_parks(TEAM)) == {member(open_park), member(moved_on)}
