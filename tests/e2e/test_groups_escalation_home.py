"""Approver groups, escalation and the Home tab, end to end: signed HTTP into the real bot, a real
`python -m workers` (its watchdog posts the reminders), real Redis, the loopback Slack and model.

The stack's approvers are UANN and the user group SOPS (handle `ops`); a call still undecided after
6 s gets one reminder mentioning the group SLEADS (`leads`) and UBOSS, who may then decide it too;
calls expire after 60 s. Cards and replies name a group by its handle and ping nobody; only the
reminder pings.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from messages import texts
from store import GROUP_TTL, RunRecord, Store
from store.keys import Keys
from tests.fakes.messages_api import reply, text, tool_use
from tests.fakes.signing import event_body
from tests.stack import RedisServer, Stack, has_actions, running_stack, thread, wait_post, wait_until

pytestmark = pytest.mark.e2e
DB = 13  # other stacks: test_slack_surface 1 and 2, test_fuzz_bot 3, test_mcp/test_socket_mode 5, gate 6
CONFIG = """
[approvals]
approvers = ["UANN", "SOPS"]
escalate_to = ["SLEADS", "UBOSS"]
escalate_after_minutes = 0.1
expire_after_minutes = 1
[limits]
max_runs_per_user = 1000
max_runs_per_channel = 1000
"""
OPS, LEADS = ["UCAROL", "UERIN"], ["UFRANK"]
_channels = itertools.count(900)


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from running_stack(redis_server, tmp_path_factory.mktemp("groups"), CONFIG, DB)


@pytest.fixture(autouse=True)
def groups(stack: Stack) -> Iterator[None]:
    """Both groups readable, and nothing cached from an earlier test."""
    stack.slack.set_usergroup("SOPS", OPS, "ops")
    stack.slack.set_usergroup("SLEADS", LEADS, "leads")
    forget_groups(stack)
    yield
    stack.slack.clear_failures("usergroups.users.list")
    stack.slack.clear_failures("usergroups.list")


# --- helpers ---------------------------------------------------------------------------------------


def forget_groups(stack: Stack) -> None:
    """What `GROUP_TTL` seconds would do: the next check reads the groups from Slack again."""
    client = redis.Redis.from_url(stack.redis_url)
    for group in ("SOPS", "SLEADS"):
        client.delete(Keys.group_members("T1", group))
    client.delete(Keys.group_handles("T1"))


def park_a_write(stack: Stack, word: str) -> tuple[str, str, dict[str, Any]]:
    """UALICE asks for a write (tier ask): returns the channel, the mention's ts and the card."""
    channel = f"C{next(_channels)}"
    stack.model.script_for(
        word,
        reply(tool_use("write_file", {"path": f"{word}.txt", "content": "hello"})),
        reply(text(f"{word}: done.")),
    )
    status, ts, _ = stack.mention(f"{word}: write hello to {word}.txt", channel=channel)
    assert status == 200
    card = wait_post(stack, channel, ts, has_actions)
    return channel, ts, card


def card_now(stack: Stack, channel: str, ts: str, card: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in thread(stack, channel, ts) if m["ts"] == card["ts"])


def reminders(stack: Stack, channel: str, ts: str) -> list[dict[str, Any]]:
    return [m for m in thread(stack, channel, ts) if m["text"].startswith(":bell:")]


def replies_to(stack: Stack, user: str, channel: str) -> list[str]:
    return [e["text"] for e in stack.slack.ephemerals if e["user"] == user and e["channel"] == channel]


def lookups(stack: Stack, group: str) -> int:
    return sum(
        1
        for c in stack.slack.calls
        if c.method == "usergroups.users.list" and c.params.get("usergroup") == group
    )


def record_of(stack: Stack, channel: str) -> RunRecord:
    client = redis.Redis.from_url(stack.redis_url)
    store = Store(client)
    records = [store.runs.load(k.decode().rsplit(":", 1)[1]) for k in client.scan_iter("harness:run:*")]
    found = [r for r in records if r is not None and r.channel == channel]
    assert len(found) == 1
    return found[0]


def escalation_due(stack: Stack, record: RunRecord) -> float | None:
    score = redis.Redis.from_url(stack.redis_url).zscore(
        Keys.escalations(), f"{record.run_id}:{record.park_id}"
    )
    return None if score is None else float(score)


def finished(stack: Stack, channel: str, ts: str, word: str) -> dict[str, Any]:
    return wait_post(stack, channel, ts, lambda m: f"{word}: done." in m["text"])


# --- approver groups -------------------------------------------------------------------------------


def test_a_user_group_in_approvers_lets_its_members_decide_and_nobody_else(stack: Stack) -> None:
    read_before = lookups(stack, "SOPS")
    channel, ts, card = park_a_write(stack, "grpmember")

    assert "*Who may decide:* only <@UANN>, @ops" in str(card["blocks"])  # the group, never pinged
    assert "subteam" not in json.dumps(card)
    assert stack.click(card, "approve", user="UDAVE") == 200  # in no group: refused, told who may
    refusal = wait_until(lambda: replies_to(stack, "UDAVE", channel))
    assert "<@UANN>, @ops" in refusal[0] and "subteam" not in refusal[0] and "SOPS" not in refusal[0]
    assert lookups(stack, "SOPS") == read_before + 1
    assert has_actions(card_now(stack, channel, ts, card))  # nothing changed
    assert not (stack.workspace / "grpmember.txt").exists()

    assert stack.click(card, "approve", user="UCAROL") == 200  # a member of SOPS
    finished(stack, channel, ts, "grpmember")
    assert (stack.workspace / "grpmember.txt").read_text() == "hello"
    decided = card_now(stack, channel, ts, card)
    assert not has_actions(decided) and "<@UCAROL>" in str(decided["blocks"])
    # The members were read once and cached for a short time, under harness:.
    assert lookups(stack, "SOPS") == read_before + 1
    client = redis.Redis.from_url(stack.redis_url)
    assert 0 < client.ttl(Keys.group_members("T1", "SOPS")) <= GROUP_TTL
    assert replies_to(stack, "UCAROL", channel) == []


def test_group_members_are_read_again_once_the_cache_lapses(stack: Stack) -> None:
    read_before = lookups(stack, "SOPS")
    channel, ts, card = park_a_write(stack, "grpfresh")
    assert stack.click(card, "approve", user="UDAVE") == 200  # reads SOPS: UDAVE is not in it
    wait_until(lambda: replies_to(stack, "UDAVE", channel))
    stack.slack.set_usergroup("SOPS", [*OPS, "UDAVE"])  # UDAVE joins the group

    forget_groups(stack)  # the short cache lapses: the next click reads the group again
    assert stack.click(card, "approve", user="UDAVE") == 200
    finished(stack, channel, ts, "grpfresh")
    assert lookups(stack, "SOPS") == read_before + 2
    assert len(replies_to(stack, "UDAVE", channel)) == 1  # only the first click was refused


# --- escalation ------------------------------------------------------------------------------------


def test_an_undecided_call_gets_one_reminder_that_mentions_escalate_to(stack: Stack) -> None:
    second = stack.start_worker()  # two watchdogs race for the reminder: one posts it
    try:
        channel, ts, card = park_a_write(stack, "escalated")
        record = record_of(stack, channel)
        due = escalation_due(stack, record)
        assert due is not None and record.expires_at is not None and due < record.expires_at

        # Before the escalation time only the approvers may decide; UBOSS is not one of them yet.
        assert stack.click(card, "approve", user="UBOSS") == 200
        refusal = wait_until(lambda: replies_to(stack, "UBOSS", channel))
        assert "<@UBOSS>" not in refusal[0] and time.time() < due

        reminder = wait_post(stack, channel, ts, lambda m: m["text"].startswith(":bell:"))
        assert "<!subteam^SLEADS>" in reminder["text"] and "<@UBOSS>" in reminder["text"]  # the one ping
        assert "`write_file`" in reminder["text"] and "<@UALICE>" in reminder["text"]
        assert reminder["thread_ts"] == ts and float(reminder["ts"]) > float(card["ts"])
        assert escalation_due(stack, record) is None  # claimed: nobody can post it again
        assert f"/archives/{channel}/p{card['ts'].replace('.', '')}" in home_of(stack, "UFRANK")  # via SLEADS

        # Escalated: UBOSS may decide now, and does.
        assert stack.click(card, "approve", user="UBOSS") == 200
        finished(stack, channel, ts, "escalated")
        stack.settled()
        assert len(reminders(stack, channel, ts)) == 1
        assert (stack.workspace / "escalated.txt").read_text() == "hello"
    finally:
        second.stop()


def test_a_call_decided_before_its_escalation_time_gets_no_reminder(stack: Stack) -> None:
    channel, ts, card = park_a_write(stack, "nochase")
    record = record_of(stack, channel)
    assert stack.click(card, "approve", user="UANN") == 200
    finished(stack, channel, ts, "nochase")

    # The watchdog takes the park's escalation when it falls due, sees it decided, and posts nothing.
    skipped = (
        f"run {record.run_id} park {record.park_id}: decided (or expired) in time, no escalation reminder"
    )
    wait_until(lambda: any(skipped in p.output() for p in stack.processes if p.name == "worker"), timeout=30)
    assert escalation_due(stack, record) is None
    assert reminders(stack, channel, ts) == []


def test_a_group_that_cannot_be_read_lets_nobody_in_and_the_reminder_still_names_it(stack: Stack) -> None:
    stack.slack.fail_next("usergroups.users.list", error="missing_scope", times=1000)
    stack.slack.fail_next("usergroups.list", error="missing_scope", times=1000)
    sops_before, leads_before = lookups(stack, "SOPS"), lookups(stack, "SLEADS")
    channel, ts, card = park_a_write(stack, "grpdown")
    assert "*Who may decide:* only <@UANN>, SOPS" in str(card["blocks"])  # no handle: the id, inert

    assert stack.click(card, "approve", user="UCAROL") == 200  # SOPS cannot be read: fail closed
    refusal = wait_until(lambda: replies_to(stack, "UCAROL", channel))
    assert "<@UANN>, SOPS" in refusal[0] and "subteam" not in refusal[0]
    reminder = wait_post(stack, channel, ts, lambda m: m["text"].startswith(":bell:"))
    assert "<!subteam^SLEADS>" in reminder["text"] and "<@UBOSS>" in reminder["text"]

    assert stack.click(card, "approve", user="UFRANK") == 200  # SLEADS cannot be read either
    assert wait_until(lambda: replies_to(stack, "UFRANK", channel))
    assert has_actions(card_now(stack, channel, ts, card))
    assert not (stack.workspace / "grpdown.txt").exists()
    # A failure is not cached: each click asked Slack again.
    assert lookups(stack, "SOPS") == sops_before + 2 and lookups(stack, "SLEADS") > leads_before
    bot = next(p for p in stack.processes if p.name == "bot")
    assert "cannot read user group SOPS (missing_scope)" in bot.output()

    assert stack.click(card, "approve", user="UANN") == 200  # a user named in person still decides
    finished(stack, channel, ts, "grpdown")
    assert len(reminders(stack, channel, ts)) == 1


# --- the Home tab ----------------------------------------------------------------------------------


def open_home(stack: Stack, user: str, tab: str = "home") -> None:
    event = {
        "type": "app_home_opened",
        "user": user,
        "channel": "D0HOME",
        "tab": tab,
        "event_ts": str(time.time()),
    }
    body = event_body(event, event_id=f"Ev{time.time_ns()}")
    status, _ = stack.post(body, "application/json")
    assert status == 200


def publishes(stack: Stack, user: str) -> int:
    return sum(
        1 for c in stack.slack.calls if c.method == "views.publish" and c.params.get("user_id") == user
    )


def home_of(stack: Stack, user: str) -> str:
    """Open `user`'s Home tab and return the text of the view the bot publishes for it."""
    before = publishes(stack, user)
    open_home(stack, user)
    wait_until(lambda: publishes(stack, user) > before)
    view = stack.slack.home(user)
    assert view is not None and view["type"] == "home"
    return str(view["blocks"])


def test_the_home_tab_lists_what_waits_on_each_approver_with_a_link_to_its_card(stack: Stack) -> None:
    channel, ts, card = park_a_write(stack, "homelist")
    link = f"/archives/{channel}/p{card['ts'].replace('.', '')}"
    # The card's ts reaches the run record with the write that settles the park, just after the post.
    wait_until(lambda: card["ts"] in record_of(stack, channel).cards.values())

    for approver in ("UANN", "UCAROL"):  # in person, and through the group SOPS
        home = home_of(stack, approver)
        assert link in home and "homelist.txt" in home and "`write_file`" in home
        assert "<@UALICE>" in home and f"<#{channel}>" in home and "<!date^" in home
    stranger = home_of(stack, "UDAVE")
    assert link not in stranger and "homelist" not in stranger

    assert stack.click(card, "approve", user="UANN") == 200
    finished(stack, channel, ts, "homelist")
    assert link not in home_of(stack, "UANN")  # decided: no longer waiting on anyone


def test_an_empty_home_tab_says_so(stack: Stack) -> None:
    home = home_of(stack, "UNOBODY")
    assert texts.HOME_EMPTY in home and texts.HOME_TITLE in home
    assert "Open the card" not in home


def test_suggested_rules_show_on_approvers_home_tabs_only(stack: Stack) -> None:
    """Ten approvals of writes under `sug<b>&/` (as the audit records them) and no decline:
    an approver's Home tab offers the rule, escaped in a code block, with what replay would change;
    a requester who approves nothing is not shown it."""
    store = Store(redis.Redis.from_url(stack.redis_url))
    client = redis.Redis.from_url(stack.redis_url)
    for n in range(10):
        ids = {"run_id": f"rsuggest{n}", "call_id": f"toolu_suggest{n}", "team": "T1", "channel": "C999"}
        arguments = {"path": f"sug<b>&/{n}.md", "content": "x"}
        ruled = {**ids, "event": "ruled", "at": time.time(), "profile": "", "tool": "write_file"}
        ruled |= {"source": "builtin", "tier": "ask", "why": "policy.default", "input": arguments}
        client.xadd(Keys.audit_calls(), {"entry": json.dumps(ruled)})
        store.audit.append({**ids, "verdict": "approved", "by": "UANN", "tool": "write_file"})
    home = home_of(stack, "UANN")
    assert texts.HOME_SUGGESTED_TITLE in home
    assert '```\\n[[policy.rules]]\\ntool = "write_file"\\nargs = { path = "sug&lt;b&gt;&amp;/**" }' in home
    assert "<b>" not in home and "10 would change: 10 ask→allow." in home  # other tests ruled calls too
    stranger = home_of(stack, "UDAVE")
    assert texts.HOME_SUGGESTED_TITLE not in stranger and "sug&lt;b&gt;" not in stranger
