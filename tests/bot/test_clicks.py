"""One way to open a click (`bot.listening.open_click`): the button's value parsed, its run loaded,
the workspace, the channel and who may act checked, each refusal with its own ephemeral reply, and
a typed `Click` handed on. Driven with the real openings of a card, a batch, a limit and a Stop."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import pytest
import redis
from slack_bolt import BoltContext

from bot.listeners.approvals import CardRef, _on_decision, card_opening
from bot.listeners.batches import ParkRef, _park_opening
from bot.listeners.runs import _limit_opening, request_stop
from bot.listening import REPLY, BotDeps, Click, Clicker, Opening, Where, listener, open_click
from harness.config import Approvals, Config
from harness.policy import Tier
from harness.state import PendingCall, Status, Verdict, new_run
from messages import texts
from runtime.queue import make_queue
from store import RECORD_VERSION, RunRecord, RunStatus, Store, new_run_id, pack
from store.keys import Keys

ALICE = Clicker("UALICE", "T1")  # the requester
ANN = Clicker("UANN", "T1")  # the one approver
CALL = PendingCall("toolu_1", "write_file", {"path": "a"}, Tier.ASK)


@pytest.fixture
def deps(store: Store, conn: redis.Redis) -> BotDeps:
    config = Config(approvals=Approvals(approvers=("UANN",)))
    return BotDeps(store=store, queue=make_queue(conn), config=config)


def parked(conn: redis.Redis, **changes: Any) -> RunRecord:
    """A run of UALICE's in C1, parked (park 1) on one write_file call, stored as a worker parks it."""
    state = replace(new_run("write a"), status=Status.AWAITING_APPROVAL, pending=(CALL,))
    record = RunRecord(
        new_run_id(),
        "T1",
        "C1",
        "1.2",
        "UALICE",
        "write a",
        status=RunStatus.AWAITING_APPROVAL,
        state=state.to_json(),
        park_id=1,
        expires_at=time.time() + 3600,
    )
    record = replace(record, **changes)
    conn.set(Keys.run(record.run_id), pack(record.to_json()))
    return record


def card(record: RunRecord) -> str:
    return f"{record.run_id}:{CALL.id}:{CALL.fingerprint}"


def opened(
    deps: BotDeps, opening: Opening[Any], value: Any, clicker: Clicker, channel: str | None = "C1"
) -> tuple[Click[Any] | None, BoltContext]:
    context = BoltContext()
    return open_click(deps, opening, value, clicker, channel, context), context


def test_a_card_click_by_an_approver_is_handed_on_typed(deps: BotDeps, conn: redis.Redis) -> None:
    record = parked(conn)
    click, context = opened(deps, card_opening(deps), card(record), ANN)
    assert click == Click(ANN, "C1", record, CardRef(record.run_id, CALL.id, CALL.fingerprint))
    assert REPLY not in context


@pytest.mark.parametrize("value", [None, "", "nope", "x:y:z", "a" * 3000, 42, {"run": "r"}])
def test_a_value_no_button_of_ours_carries_is_refused(deps: BotDeps, value: Any) -> None:
    for opening, unknown in (
        (card_opening(deps), texts.UNKNOWN_APPROVAL),
        (_park_opening(deps), texts.UNKNOWN_APPROVAL),
    ):
        click, context = opened(deps, opening, value, ANN)
        assert click is None and context[REPLY] == unknown
    click, context = opened(deps, _limit_opening(deps), value, ANN)
    assert click is None and context[REPLY] == texts.STOP_UNKNOWN


def test_a_run_that_is_not_stored_is_unknown(deps: BotDeps) -> None:
    missing = new_run_id()
    click, context = opened(deps, card_opening(deps), f"{missing}:{CALL.id}:{CALL.fingerprint}", ANN)
    assert click is None and context[REPLY] == texts.UNKNOWN_APPROVAL
    click, context = opened(deps, _park_opening(deps), f"{missing}:1", ANN)
    assert click is None and context[REPLY] == texts.UNKNOWN_APPROVAL
    click, context = opened(deps, _limit_opening(deps), missing, ANN)
    assert click is None and context[REPLY] == texts.STOP_UNKNOWN


def test_a_record_that_cannot_be_read_is_refused_as_unreadable(deps: BotDeps, conn: redis.Redis) -> None:
    run_id = new_run_id()
    for stored in ('{"version": 1}', '{"version": 2, "run_id": "x"}', "not json"):  # older, malformed
        conn.set(Keys.run(run_id), pack(stored))
        click, context = opened(deps, card_opening(deps), f"{run_id}:{CALL.id}:{CALL.fingerprint}", ANN)
        assert click is None and context[REPLY] == texts.UNREADABLE_RUN


def newer(record: RunRecord, conn: redis.Redis) -> bytes:
    """`record` stored as a newer release would write it (a record version this one does not read)."""
    data = json.loads(record.to_json())
    data["version"] = RECORD_VERSION + 1
    conn.set(Keys.run(record.run_id), pack(json.dumps(data)))
    return bytes(conn.get(Keys.run(record.run_id)))


def test_a_click_on_a_run_a_newer_release_saved_says_it_waits_for_it_and_records_nothing(
    deps: BotDeps, conn: redis.Redis
) -> None:
    record = parked(conn)
    conn.hset(Keys.approvals(record.run_id, 1), mapping={CALL.id: "", "~expires": repr(time.time() + 60)})
    stored = newer(record, conn)
    for opening, value in (
        (card_opening(deps), card(record)),
        (_park_opening(deps), f"{record.run_id}:1"),
        (_limit_opening(deps), record.run_id),
    ):
        click, context = opened(deps, opening, value, ANN)
        assert click is None and context[REPLY] == texts.NEWER_RUN
    assert "newer version" in texts.NEWER_RUN and "Nothing was recorded" in texts.NEWER_RUN
    # Through the listener Slack's click reaches: the same reply, nothing written, no job.
    context = click_approve(deps, record)
    assert context[REPLY] == texts.NEWER_RUN
    assert conn.get(Keys.run(record.run_id)) == stored
    assert conn.hget(Keys.approvals(record.run_id, 1), CALL.id) == b""
    assert make_queue(conn).count == 0 and conn.xlen(Keys.audit()) == 0


def test_a_click_on_a_park_a_newer_release_wrote_records_nothing(deps: BotDeps, conn: redis.Redis) -> None:
    """The run's record reads, but its park's approvals are of a newer format: the decide step
    itself refuses to write into them."""
    record = parked(conn)
    key = Keys.approvals(record.run_id, 1)
    conn.hset(key, mapping={CALL.id: "", "~expires": repr(time.time() + 60), "~version": 2})
    before = conn.hgetall(key)
    context = click_approve(deps, record)
    assert context[REPLY] == texts.NEWER_RUN
    assert conn.hgetall(key) == before and make_queue(conn).count == 0 and conn.xlen(Keys.audit()) == 0


def click_approve(deps: BotDeps, record: RunRecord, user: str = "UANN") -> BoltContext:
    """An Approve click on `record`'s card, through the listener Bolt calls (`bot.listening.listener`)."""
    handler = listener(deps, None, _on_decision(deps, Verdict.APPROVED), lambda *args: None)  # type: ignore[arg-type]
    body = {"user": {"id": user, "team_id": "T1"}, "team": {"id": "T1"}, "channel": {"id": record.channel}}
    context = BoltContext()
    handler(ack=lambda: None, body=body, context=context, action={"value": card(record)})  # type: ignore[arg-type]
    return context


def test_a_click_from_another_workspace_is_refused(deps: BotDeps, conn: redis.Redis) -> None:
    record = parked(conn)
    stranger = Clicker("UANN", "T2")
    for opening, value in (
        (card_opening(deps), card(record)),
        (_park_opening(deps), f"{record.run_id}:1"),
        (_limit_opening(deps), record.run_id),
    ):
        click, context = opened(deps, opening, value, stranger)
        assert click is None and context[REPLY] == texts.WRONG_TEAM


def test_a_click_from_another_channel_is_refused(deps: BotDeps, conn: redis.Redis) -> None:
    record = parked(conn)
    for opening, value in (
        (card_opening(deps), card(record)),
        (_park_opening(deps), f"{record.run_id}:1"),
        (_limit_opening(deps), record.run_id),
    ):
        click, context = opened(deps, opening, value, ANN, channel="C2")
        assert click is None and context[REPLY] == texts.WRONG_CHANNEL


def test_a_click_that_names_no_channel_passes_only_where_the_opening_allows(
    deps: BotDeps, conn: redis.Redis
) -> None:
    record = parked(conn)
    click, context = opened(deps, _park_opening(deps), f"{record.run_id}:1", ANN, channel=None)
    assert click is None and context[REPLY] == texts.WRONG_CHANNEL
    assert _park_opening(deps).where is Where.RUN_CHANNEL
    click, context = opened(deps, _limit_opening(deps), record.run_id, ANN, channel=None)
    assert click is not None and "reply_channel" not in context
    # A modal's submission names no channel: a refusal is told in the run's channel.
    click, context = opened(deps, card_opening(deps), card(record), ALICE, channel=None)
    assert click is None and context["reply_channel"] == "C1"


def test_a_clicker_who_may_not_decide_is_refused_naming_who_may(deps: BotDeps, conn: redis.Redis) -> None:
    record = parked(conn)
    click, context = opened(deps, card_opening(deps), card(record), ALICE)
    assert click is None and context[REPLY] == (texts.NOT_ALLOWED, {"who": ["UANN"]})
    click, context = opened(deps, _park_opening(deps), f"{record.run_id}:1", ALICE)
    assert click is None and context[REPLY] == (texts.NOT_ALLOWED, {"who": ["UANN"]})
    click, context = opened(deps, _limit_opening(deps), record.run_id, ALICE)
    assert click is None and context[REPLY] == (texts.LIMIT_NOT_ALLOWED, {"who": ["UANN"]})
    # The requester may view a call's arguments, not decide it.
    click, context = opened(deps, card_opening(deps, viewing=True), card(record), ALICE)
    assert click is not None and REPLY not in context


def test_a_stop_by_someone_who_may_not_stop_names_who_may(deps: BotDeps, conn: redis.Redis) -> None:
    record = parked(conn)
    context = BoltContext()
    request_stop(deps, record.run_id, Clicker("UBOB", "T1"), "C1", context)
    assert context[REPLY] == (texts.STOP_NOT_ALLOWED, {"who": ["UALICE", "UANN"]})


def test_the_checks_of_a_surface_run_in_its_order(deps: BotDeps, conn: redis.Redis) -> None:
    """A batch asks who may act before whether the park is open; a card asks the other way round."""
    record = parked(conn, status=RunStatus.FINISHED)
    click, context = opened(deps, _park_opening(deps), f"{record.run_id}:1", ALICE)
    assert click is None and context[REPLY] == (texts.NOT_ALLOWED, {"who": ["UANN"]})
    click, context = opened(deps, _park_opening(deps), f"{record.run_id}:1", ANN)
    assert click is None and context[REPLY] == texts.BATCH_CLOSED
    click, context = opened(deps, card_opening(deps), card(record), ALICE)
    assert click is None and context[REPLY] == texts.UNKNOWN_APPROVAL  # learns nothing more
    click, context = opened(deps, _limit_opening(deps), record.run_id, ALICE)
    assert click is None and context[REPLY] == texts.LIMIT_NOT_OPEN


def test_a_batch_click_names_its_park(deps: BotDeps, conn: redis.Redis) -> None:
    record = parked(conn)
    click, _ = opened(deps, _park_opening(deps), f"{record.run_id}:1", ANN)
    assert click is not None and click.ref == ParkRef(record.run_id, 1)
    click, context = opened(deps, _park_opening(deps), f"{record.run_id}:2", ANN)
    assert click is None and context[REPLY] == texts.BATCH_CLOSED
