"""Reminders before expiry and Extend, end to end: signed HTTP into the real bot, a real
`python -m workers` (its watchdog posts the reminders and expires parks), real Redis, the loopback
Slack and model.

Calls expire 6 s after their park; 3 s before that, the park's thread gets one reminder with an
Extend button that UANN (the approver) or the requester may click, once (`max_extensions = 1`).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from messages import texts
from store import RunRecord, RunStatus, Store
from store.keys import Keys
from tests.fakes.messages_api import reply, text, tool_use
from tests.observe.test_metrics_access import get
from tests.stack import RedisServer, Stack, has_actions, running_stack, thread, wait_post, wait_until

pytestmark = pytest.mark.e2e
DB = 15  # other stacks: see tests/e2e/test_groups_escalation_home.py
TOKEN = "reminders-metrics-token-0123456789"
CONFIG = """
[approvals]
approvers = ["UANN"]
expire_after_minutes = 0.1
remind_before_minutes = 0.05
max_extensions = 1
[limits]
max_runs_per_user = 1000
max_runs_per_channel = 1000
"""
_channels = itertools.count(700)


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {"HARNESS_LEASE_SECONDS": "2", "METRICS_TOKEN": TOKEN}  # a watchdog pass every second
    yield from running_stack(redis_server, tmp_path_factory.mktemp("reminders"), CONFIG, DB, extra_env=env)


# --- helpers ---------------------------------------------------------------------------------------


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
    card = wait_post(stack, channel, ts, lambda m: has_actions(m) and "Approve" in str(m["blocks"]))
    return channel, ts, card


def is_reminder(message: dict[str, Any]) -> bool:
    return message["text"].startswith(":hourglass:") and has_actions(message)


def reminders(stack: Stack, channel: str, ts: str) -> list[dict[str, Any]]:
    """The reminders in the thread, extended ones (`:hourglass_flowing_sand:`) too."""
    return [m for m in thread(stack, channel, ts) if m["text"].startswith(":hourglass")]


def message_now(stack: Stack, channel: str, ts: str, message: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in thread(stack, channel, ts) if m["ts"] == message["ts"])


def replies_to(stack: Stack, user: str, channel: str) -> list[str]:
    return [e["text"] for e in stack.slack.ephemerals if e["user"] == user and e["channel"] == channel]


def record_of(stack: Stack, channel: str) -> RunRecord:
    client = redis.Redis.from_url(stack.redis_url)
    store = Store(client)
    records = [store.runs.load(k.decode().rsplit(":", 1)[1]) for k in client.scan_iter("harness:run:*")]
    found = [r for r in records if r is not None and r.channel == channel]
    assert len(found) == 1
    return found[0]


def expiries(stack: Stack, record: RunRecord) -> dict[str, float | None]:
    """Every place that holds the park's expiry."""
    client = redis.Redis.from_url(stack.redis_url)
    member = f"{record.run_id}:{record.park_id}"
    held = client.hget(Keys.approvals(record.run_id, record.park_id), "~expires")
    return {
        "hash": float(held) if held else None,
        "expiries": client.zscore(Keys.expiries(), member),
        "team": client.zscore(Keys.team_parks(record.team), member),
        "user": client.zscore(Keys.user_parks(record.team, record.requester), member),
        "record": Store(client).runs.load(record.run_id).expires_at,  # type: ignore[union-attr]
    }


def all_at(held: dict[str, float | None], when: float | None) -> bool:
    """Whether every place holds `when` (to the millisecond)."""
    return when is not None and all(v is not None and abs(v - when) < 0.001 for v in held.values())


def finished(stack: Stack, channel: str, ts: str, word: str) -> dict[str, Any]:
    return wait_post(stack, channel, ts, lambda m: f"{word}: done." in m["text"])


def metric(stack: Stack, line_start: str) -> float:
    status, body, _ = get(stack.url + "/metrics", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    found = [ln for ln in body.splitlines() if ln.startswith(line_start)]
    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0


# --- tests -----------------------------------------------------------------------------------------


def test_a_reminder_before_expiry_mentions_who_may_decide_and_extend_outlives_the_first_expiry(
    stack: Stack,
) -> None:
    waits_before = metric(stack, 'harness_approval_wait_seconds_count{profile=""}')
    channel, ts, card = park_a_write(stack, "extended")
    record = record_of(stack, channel)
    assert record.expires_at is not None
    first_expiry = record.expires_at

    reminder = wait_post(stack, channel, ts, is_reminder)
    assert "<@UANN>" in reminder["text"] and "`write_file`" in reminder["text"]
    assert "<@UALICE>" in reminder["text"] and reminder["thread_ts"] == ts
    assert float(reminder["ts"]) > float(card["ts"])

    # A double click (two at once) extends once; the other hears it already was.
    clicks = [threading.Thread(target=stack.click, args=(reminder, "extend"), kwargs={"user": "UANN"})]
    clicks.append(threading.Thread(target=stack.click, args=(reminder, "extend"), kwargs={"user": "UANN"}))
    for click in clicks:
        click.start()
    for click in clicks:
        click.join()
    told = wait_until(lambda: replies_to(stack, "UANN", channel))
    assert len(told) == 1 and "already extended" in told[0]
    moved = wait_until(
        lambda: next(
            (m for m in thread(stack, channel, ts) if m["ts"] == reminder["ts"] and not has_actions(m)), None
        )
    )
    assert moved["text"].startswith(":hourglass_flowing_sand: <@UANN> extended")

    # Every place that holds the expiry moved by expire_after_minutes, together.
    held = expiries(stack, record)
    assert all_at(held, first_expiry + 6), held
    # The card says so too, still with its buttons.
    new_date = f"<!date^{int(first_expiry + 6)}^"
    shown = wait_until(
        lambda: next(
            (m for m in thread(stack, channel, ts) if m["ts"] == card["ts"] and new_date in str(m["blocks"])),
            None,
        )
    )
    assert has_actions(shown) and f"<!date^{int(first_expiry)}^" not in str(shown["blocks"])

    # An extended park gets a reminder before its new expiry. It is due 3 s after the first expiry,
    # and the watchdog's pass that posts it expired what was due first: the park outlived it.
    second = wait_post(stack, channel, ts, lambda m: is_reminder(m) and m["ts"] != reminder["ts"])
    assert time.time() > first_expiry
    assert record_of(stack, channel).status is RunStatus.AWAITING_APPROVAL

    # Past max_extensions: refused, nothing moves.
    assert stack.click(second, "extend", user="UALICE") == 200
    refusal = wait_until(lambda: replies_to(stack, "UALICE", channel))
    assert "extended 1 time already" in refusal[0]
    assert all_at(expiries(stack, record), first_expiry + 6)

    # It can still be approved, and runs.
    assert stack.click(card, "approve", user="UANN") == 200
    finished(stack, channel, ts, "extended")
    assert (stack.workspace / "extended.txt").read_text() == "hello"
    stack.settled()
    assert len(reminders(stack, channel, ts)) == 2
    assert metric(stack, 'harness_approval_wait_seconds_count{profile=""}') == waits_before + 1


def test_extend_by_someone_who_may_not_decide_or_after_expiry_is_refused(stack: Stack) -> None:
    expired_before = metric(stack, 'harness_approval_expirations_total{profile=""}')
    channel, ts, card = park_a_write(stack, "lapsed")
    record = record_of(stack, channel)
    reminder = wait_post(stack, channel, ts, is_reminder)

    # Someone who may not decide: refused, told who may, nothing moves.
    assert stack.click(reminder, "extend", user="UMALLORY") == 200
    refusal = wait_until(lambda: replies_to(stack, "UMALLORY", channel))
    assert refusal[0].startswith("Only") and "<@UANN>" in refusal[0] and "extend" in refusal[0]
    assert all_at(expiries(stack, record), record.expires_at)

    # Nobody extends: the call expires (never as a "no"), and a late Extend is refused.
    expired = wait_until(
        lambda: "Expired" in message_now(stack, channel, ts, card)["text"] or None, timeout=30
    )
    assert "declined" not in str(expired).lower()
    assert stack.click(reminder, "extend", user="UANN") == 200
    late = wait_until(lambda: replies_to(stack, "UANN", channel))
    assert late == [texts.EXTEND_EXPIRED]
    stack.settled()
    assert not (stack.workspace / "lapsed.txt").exists()
    assert len(reminders(stack, channel, ts)) == 1
    assert metric(stack, 'harness_approval_expirations_total{profile=""}') == expired_before + 1


def test_a_forged_extend_value_changes_nothing(stack: Stack) -> None:
    channel, ts, _ = park_a_write(stack, "forged")
    record = record_of(stack, channel)
    reminder = wait_post(stack, channel, ts, is_reminder)
    for value in ("nonsense", f"{record.run_id}:x:0", f"{record.run_id}:{record.park_id}:-1", ""):
        status, _ = stack.click_value(reminder, "extend", value, user="UANN", block_id="reminder")
        assert status == 200
    told = wait_until(lambda: len(replies_to(stack, "UANN", channel)) == 4 or None)
    assert told and set(replies_to(stack, "UANN", channel)) == {texts.UNKNOWN_APPROVAL}
    assert all_at(expiries(stack, record), record.expires_at)
