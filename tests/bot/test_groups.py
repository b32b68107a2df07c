"""Approver groups, escalation and the Home tab, piece by piece: the renderers (nothing untrusted
pings, everything fits Slack's limits), the store's keys (the reminder is claimed once, the group
cache expires), and who may decide when."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slack_sdk import WebClient

from bot.listening import BotDeps
from gates.deciders import GroupDirectory
from harness.config import Approvals, Config
from harness.policy import Tier
from harness.state import PendingCall
from messages import texts
from messages.blocks import notice
from messages.cards import CallCard, LimitCard, approval_card, escalation_reminder, limit_card
from messages.home import HOME_ITEMS_MAX, HomeItem, home_view
from messages.text import approver, decider, deciders_named, group_handle, mention
from runtime.queue import make_queue
from store import GROUP_TTL, HANDLE_TTL, RunRecord, RunStatus, Store, new_run_id
from store.keys import Keys
from tests.fakes.slack_api import MAX_BLOCKS_PER_VIEW, FakeSlackAPI, validate_blocks

AT = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
PINGS = ("<!channel>", "<!here>", "<@U999>", "<!subteam^S1|x>", "<#C9>", "<https://evil.example|x>")
OUR_MARKUP = re.compile(
    r"<@(?:UALICE|UANN|UBOSS)>|<!subteam\^SLEADS>|<#C0DESK>|<!date\^\d+\^[^|>]*\|[^>]*>"
    r"|<https://fake\.slack\.com/archives/C0DESK/p1700000000000100\|Open the card>"
)


def call(name: str = "write_file", args: Any = None, call_id: str = "toolu_1") -> PendingCall:
    return PendingCall(
        call_id, name, {"path": "notes.txt", "content": "hi"} if args is None else args, Tier.ASK
    )


def strings(obj: Any) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in strings(v)]
    return []


def assert_inert(obj: Any) -> None:
    """Apart from our own markup, no `<` or `>` survives anywhere."""
    for s in strings(obj):
        rest = OUR_MARKUP.sub("", s)
        assert "<" not in rest and ">" not in rest, s


# --- renderers -------------------------------------------------------------------------------------


def test_approver_mentions_users_and_groups_of_the_right_shape_only() -> None:
    assert approver("UANN") == "<@UANN>" and approver("W12") == "<@W12>"
    assert approver("SLEADS") == "<!subteam^SLEADS>"
    for bad in ("<!channel>", "S1|x", "s123", "SLEADS> <!here", "C123", "", None):
        assert "<" not in approver(bad)
    assert mention("SLEADS") == "SLEADS"  # a plain mention never turns into a group ping


def test_the_who_may_decide_reply_names_a_group_by_its_handle_and_pings_nobody() -> None:
    msg = notice(texts.NOT_ALLOWED, {"SOPS": "oncall"}, who=["UANN", "SOPS"])
    assert "<@UANN>, @oncall" in msg.text and "@oncall" in str(msg.blocks)
    assert "subteam" not in msg.text + str(msg.blocks) and "SOPS" not in msg.text + str(msg.blocks)
    unread = notice(texts.NOT_ALLOWED, who=["UANN", "SOPS"])  # no handle read: the id, inert
    assert "<@UANN>, SOPS" in unread.text and "subteam" not in unread.text + str(unread.blocks)


@pytest.mark.parametrize(
    "handle",
    [
        "<!here>",
        "on call",
        "x|y",
        "a<b",
        "ops>",
        "here",
        "Channel",
        "everyone",
        "",
        "x" * 81,
        "evil\u202e",
        "a&b",
    ],
)
def test_a_handle_that_is_no_handle_is_never_shown_the_group_is_named_by_its_id(handle: str) -> None:
    assert group_handle("SOPS", {"SOPS": handle}) is None
    assert decider("SOPS", {"SOPS": handle}) == "SOPS"
    msg = notice(texts.NOT_ALLOWED, {"SOPS": handle}, who=["SOPS"])
    assert_inert(msg.text)
    assert_inert(msg.blocks)


def test_decider_shows_users_as_mentions_groups_by_handle_and_anything_else_inert() -> None:
    handles = {"SOPS": "oncall", "SDEV": "dev.team_2-x"}
    assert decider("UANN", handles) == "<@UANN>" and decider("W12", handles) == "<@W12>"
    assert decider("SOPS", handles) == "@oncall" and decider("SDEV", handles) == "@dev.team_2-x"
    assert decider("SNEW", handles) == "SNEW"  # not read (yet): its id
    for bad in ("<!channel>", "S1|x", "s123", "SOPS> <!here", ""):
        assert "<" not in decider(bad, {bad: "oncall"})
    assert deciders_named(["UANN", "SOPS", *[f"U{n}" for n in range(25)]], handles, most=3) == (
        "<@UANN>, @oncall, <@U0> and 24 more"
    )


def test_approval_and_limit_cards_name_a_group_by_its_handle_never_pinging_it() -> None:
    handles = {"SOPS": "oncall"}
    card = approval_card(
        CallCard(
            run_id=new_run_id(),
            call=call(),
            requester="UALICE",
            tier_source="policy.default",
            approvers=["UANN", "SOPS"],
            expires_at=AT,
            handles=handles,
        )
    )
    shown = json.dumps(card.blocks)
    assert "*Who may decide:* only <@UANN>, @oncall" in shown and "subteam" not in shown + card.text
    limit = limit_card(
        LimitCard(
            run_id=new_run_id(),
            question="Reached max turns",
            more="8 more turns",
            requester="UALICE",
            deciders=["SOPS"],
            expires_at=AT,
            handles=handles,
        )
    )
    shown = json.dumps(limit.blocks)
    assert "@oncall" in shown and "subteam" not in shown and "SOPS" not in shown
    assert validate_blocks(card.blocks) == [] and validate_blocks(limit.blocks) == []


def test_the_escalation_reminder_mentions_escalate_to_and_nothing_the_model_wrote() -> None:
    evil = call(name="x" + "".join(PINGS), args={"path": "".join(PINGS)})
    msg = escalation_reminder(
        calls=[evil, call(call_id="toolu_2")],
        requester="UALICE",
        escalate_to=["SLEADS", "UBOSS"],
        expires_at=AT,
    )
    assert msg.text.startswith(":bell: <!subteam^SLEADS>, <@UBOSS>:")
    assert "<@UALICE>" in msg.text and "`write_file`" in msg.text and "<!date^" in msg.text
    assert_inert(msg.blocks)
    assert_inert(msg.text)
    assert validate_blocks(msg.blocks) == []


def item(n: int, **changes: Any) -> HomeItem:
    base = HomeItem(
        call=call(call_id=f"toolu_{n}"),
        requester="UALICE",
        channel="C0DESK",
        expires_at=AT + timedelta(minutes=n),
        card_ts="1700000000.000100",
        link="https://fake.slack.com/archives/C0DESK/p1700000000000100",
    )
    return replace(base, **changes)


def test_the_home_view_lists_each_call_with_who_asked_where_until_when_and_its_card() -> None:
    view = home_view([item(1)], at=AT)
    assert view["type"] == "home" and validate_blocks(view["blocks"], max_blocks=MAX_BLOCKS_PER_VIEW) == []
    text = "\n".join(strings(view["blocks"]))
    assert texts.HOME_TITLE in text and "`write_file`" in text and "notes.txt" in text
    assert "<@UALICE>" in text and "<#C0DESK>" in text and text.count("<!date^") == 2  # as of, expires
    assert "<https://fake.slack.com/archives/C0DESK/p1700000000000100|Open the card>" in text
    assert texts.HOME_EMPTY not in text and texts.HOME_MORE not in text


def test_an_empty_home_view_says_nothing_is_waiting() -> None:
    view = home_view([], at=AT)
    assert texts.HOME_EMPTY in strings(view["blocks"]) and validate_blocks(view["blocks"]) == []


@pytest.mark.parametrize(
    "link",
    [
        "https://evil.example/x|click",
        "javascript:alert(1)",
        "https://fake.slack.com/archives/C0DESK/p1>|x",
        "https://fake.slack.com/archives/C0DESK/p1 <!here>",
    ],
)
def test_a_link_that_is_not_a_permalink_is_not_linked(link: str) -> None:
    view = home_view([item(1, link=link)], at=AT)
    text = "\n".join(strings(view["blocks"]))
    assert texts.HOME_NO_LINK in text and "Open the card" not in text
    assert "evil" not in text and "<!here>" not in text


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    names=st.lists(st.text(max_size=300) | st.sampled_from(PINGS), min_size=1, max_size=40),
    value=st.text(max_size=5000) | st.sampled_from(PINGS),
)
def test_any_home_view_fits_slack_and_nothing_untrusted_pings(names: list[str], value: str) -> None:
    items = [
        item(n, call=call(name=name or "x", args={"path": value, name or "k": value * 3}, call_id=f"t{n}"))
        for n, name in enumerate(names)
    ]
    view = home_view(items, at=AT)
    assert validate_blocks(view["blocks"], max_blocks=MAX_BLOCKS_PER_VIEW) == []
    assert len(json.dumps(view)) < 100_000
    assert_inert(view["blocks"])
    assert (texts.HOME_MORE in strings(view["blocks"])) == (len(items) > HOME_ITEMS_MAX)


# --- the store -------------------------------------------------------------------------------------


def test_a_due_escalation_is_claimed_by_exactly_one_of_many_watchdogs(
    store: Store, conn: redis.Redis
) -> None:
    runs = [new_run_id() for _ in range(20)]
    now = time.time()
    for run_id in runs:
        store.escalations.schedule_escalation(run_id, 1, now - 1)
    store.escalations.schedule_escalation(
        runs[0], 1, now + 1000
    )  # scheduled again (a re-driven park): the first time stays
    store.escalations.schedule_escalation(new_run_id(), 1, now + 60)  # not due yet
    claims: list[list[tuple[str, int]]] = []
    start = threading.Barrier(8)

    def claim() -> None:
        start.wait()
        claims.append(
            Store(redis.Redis(connection_pool=conn.connection_pool)).escalations.claim_due_escalations(now)
        )

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [c for batch in claims for c in batch]
    assert sorted(claimed) == sorted((run_id, 1) for run_id in runs)  # every one once, none twice
    assert conn.zcard(Keys.escalations()) == 1  # the one not yet due is still there
    assert store.escalations.claim_due_escalations(now) == []


def test_group_members_are_cached_under_the_prefix_for_a_short_time(store: Store, conn: redis.Redis) -> None:
    assert store.groups.cached("T1", "SOPS") is None
    store.groups.cache("T1", "SOPS", frozenset({"UANN", "UBEN"}))
    assert store.groups.cached("T1", "SOPS") == {"UANN", "UBEN"}
    key = Keys.group_members("T1", "SOPS")
    assert key.startswith("harness:") and 0 < conn.ttl(key) <= GROUP_TTL
    conn.set(key, "not json")
    assert store.groups.cached("T1", "SOPS") is None  # unreadable: read from Slack again


def test_group_handles_are_cached_under_the_prefix_and_read_back_only_in_their_shape(
    store: Store, conn: redis.Redis
) -> None:
    assert store.groups.handles("T1") is None
    store.groups.cache_handles("T1", {"SOPS": "oncall"})
    key = Keys.group_handles("T1")
    assert store.groups.handles("T1") == {"SOPS": "oncall"}
    assert key.startswith("harness:") and 0 < conn.ttl(key) <= HANDLE_TTL
    conn.set(key, json.dumps({"SOPS": "oncall", "not a group": "x", "SDEV": 3}))
    assert store.groups.handles("T1") == {"SOPS": "oncall"}
    conn.set(key, "not json")
    assert store.groups.handles("T1") is None  # unreadable: read from Slack again


def test_parked_lists_open_parks_soonest_first(store: Store, conn: redis.Redis) -> None:
    now = time.time()
    late, soon, gone = new_run_id(), new_run_id(), new_run_id()
    conn.zadd(Keys.expiries(), {f"{late}:2": now + 600, f"{soon}:1": now + 60, f"{gone}:1": now - 1})
    assert store.escalations.parked(now) == [(soon, 1), (late, 2)]


# --- who may decide, and when ----------------------------------------------------------------------


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


def parked_record(minutes_ago: float, expire_after: float) -> RunRecord:
    parked_at = time.time() - minutes_ago * 60
    return RunRecord(
        run_id=new_run_id(),
        team="T1",
        channel="C1",
        thread_ts="1.1",
        requester="UALICE",
        task="x",
        status=RunStatus.AWAITING_APPROVAL,
        park_id=1,
        expires_at=parked_at + expire_after * 60,
    )


def test_escalate_to_may_decide_only_once_the_park_is_escalated(store: Store, slack: FakeSlackAPI) -> None:
    slack.set_usergroup("SLEADS", ["UFRANK"])
    deps = deps_for(
        store,
        slack,
        approvers=("UANN",),
        escalate_to=("SLEADS", "UBOSS"),
        escalate_after_minutes=10.0,
        expire_after_minutes=60.0,
    )
    fresh, late = parked_record(1, 60), parked_record(11, 60)
    assert deps.deciders(fresh) == ["UANN"] and deps.deciders(late) == ["UANN", "SLEADS", "UBOSS"]
    for who in ("UBOSS", "UFRANK"):
        assert not deps.may_decide(who, fresh) and deps.may_decide(who, late)
    assert deps.may_decide("UANN", fresh) and not deps.may_decide("UDAVE", late)
    assert not deps.may_decide("SLEADS", late)  # a group id is never a clicker
    assert not deps.may_decide("UFRANK", replace(late, status=RunStatus.FINISHED))  # a retry is not a park


def test_an_unreadable_group_lets_nobody_in_and_is_asked_again(store: Store, slack: FakeSlackAPI) -> None:
    deps = deps_for(store, slack, approvers=("SOPS",))
    record = parked_record(1, 60)
    assert not deps.may_decide("UCAROL", record)  # no such group: nobody
    slack.set_usergroup("SOPS", ["UCAROL"])
    assert deps.may_decide("UCAROL", record)  # the failure was not cached
    slack.set_usergroup("SOPS", [])
    assert deps.may_decide("UCAROL", record)  # the success is, for GROUP_TTL seconds
    store.redis.delete(Keys.group_members("T1", "SOPS"))
    assert not deps.may_decide("UCAROL", record)
    slack.fail_next("usergroups.users.list", status=500, times=5)
    store.redis.delete(Keys.group_members("T1", "SOPS"))
    slack.set_usergroup("SOPS", ["UCAROL"])
    assert not deps.may_decide("UCAROL", record)  # Slack failing: fail closed


# --- the handles groups are shown by --------------------------------------------------------------


def handle_lookups(slack: FakeSlackAPI) -> int:
    return sum(1 for c in slack.calls if c.method == "usergroups.list")


def test_handles_are_read_once_from_slack_cached_and_only_when_a_group_is_named(
    store: Store, slack: FakeSlackAPI
) -> None:
    slack.set_usergroup("SOPS", ["UCAROL"], "oncall")
    slack.set_usergroup("SOLD", ["UCAROL"], "retired", disabled=True)
    deps = deps_for(store, slack, approvers=("UANN", "SOPS"))
    assert deps.groups.handles(store, "T1", ["UANN"]) == {} and handle_lookups(slack) == 0
    assert deps.groups.handles(store, "T1", ["UANN", "SOPS", "SOLD", "SNONE"]) == {
        "SOPS": "oncall",
        "SOLD": "retired",  # a disabled group still has its handle
    }
    assert deps.groups.handles(store, "T1", ["SOPS"]) == {"SOPS": "oncall"}
    assert handle_lookups(slack) == 1  # the second came from the cache
    assert 0 < store.redis.ttl(Keys.group_handles("T1")) <= HANDLE_TTL


def test_a_failed_handle_lookup_shows_ids_and_is_asked_again_after_a_minute_not_per_card(
    store: Store, slack: FakeSlackAPI, caplog: pytest.LogCaptureFixture
) -> None:
    slack.set_usergroup("SOPS", ["UCAROL"], "oncall")
    slack.fail_next("usergroups.list", error="missing_scope", times=100)
    deps = deps_for(store, slack, approvers=("SOPS",))
    assert deps.groups.handles(store, "T1", ["SOPS"]) == {}
    assert deps.groups.handles(store, "T1", ["SOPS"]) == {}
    assert handle_lookups(slack) == 1  # the failure is remembered, briefly
    assert 0 < store.redis.ttl(Keys.group_handles("T1")) <= GROUP_TTL
    assert "cannot read the user groups' handles (missing_scope)" in caplog.text
    slack.clear_failures("usergroups.list")
    store.redis.delete(Keys.group_handles("T1"))  # what GROUP_TTL seconds would do
    assert deps.groups.handles(store, "T1", ["SOPS"]) == {"SOPS": "oncall"}


def test_without_a_client_handles_come_from_the_cache_alone(store: Store, slack: FakeSlackAPI) -> None:
    slack.set_usergroup("SOPS", ["UCAROL"], "oncall")
    unbound = GroupDirectory()
    assert unbound.handles(store, "T1", ["SOPS"]) == {}
    store.groups.cache_handles("T1", {"SOPS": "oncall"})
    assert unbound.handles(store, "T1", ["SOPS"]) == {"SOPS": "oncall"}
    assert handle_lookups(slack) == 0
