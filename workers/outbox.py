"""The transactional outbox: the Slack messages a run owes, stored in the same write as its state.

A step that owes Slack something (a turn summary, approval cards, the answer, a reaction) puts it
in `RunRecord.outbox`, and the checkpoint that saves the step saves the debt with it. Delivery
posts what is owed, then the next checkpoint drops it. A driver that dies in between leaves the
debt in Redis; whoever drives the run next pays it. Posts are tagged with the run and a key in
their Slack message metadata, so a driver that finds an unpaid post first looks for it in the
thread: a post that reached Slack before the crash is not posted again.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from harness.state import PendingCall
from messages import cards, texts
from messages.blocks import Message, notice
from store import RunRecord
from workers.services import Services, file_key, upload_name

log = logging.getLogger(__name__)

# What a post is, for what delivery does with its ts.
CARD = "card"  # an approval card: its ts is kept in RunRecord.cards under the call's id
FAILURE = "failure"  # a failure with a Retry button: its ts is RunRecord.failure_ts
MESSAGE = "message"  # anything else

# A decided card is owed as its call (rendered when paid) up to this size, else as the card.
DECIDED_CALL_MAX_CHARS = 2000


def owe_post(
    record: RunRecord, msg: Message, role: str = MESSAGE, call: str | None = None, *, live: str | None = None
) -> RunRecord:
    """`record` owing one more post in its thread (and the file that comes with it, if any).

    `live`: the ts of the live message (`workers.live`) that showed it happening; the post settles
    into that message, or, when it cannot, replaces it.
    """
    key = str(record.posted + 1)
    entry: dict[str, Any] = {"op": "post", "key": key, "role": role, "call": call, "text": msg.text}
    entry["blocks"] = msg.blocks
    if live:
        entry["live"] = live
    owed = [entry]
    if msg.attachment is not None:
        file = msg.attachment
        owed.append(
            {"op": "upload", "key": key, "name": file.filename, "title": file.title, "content": file.content}
        )
    return replace(record, outbox=[*record.outbox, *owed], posted=record.posted + 1)


def owe_update(record: RunRecord, ts: str, msg: Message) -> RunRecord:
    """`record` owing a replacement of its message `ts` (text and blocks: buttons go)."""
    entry = {"op": "update", "ts": ts, "text": msg.text, "blocks": msg.blocks}
    return replace(record, outbox=[*record.outbox, entry])


def owe_ephemeral(record: RunRecord, user: str, msg: Message) -> RunRecord:
    """`record` owing a message in its thread that only `user` sees (paid again after a crash, it
    shows twice to them alone: an ephemeral message cannot be found again)."""
    entry = {"op": "ephemeral", "user": user, "text": msg.text, "blocks": msg.blocks}
    return replace(record, outbox=[*record.outbox, entry])


def owe_discard(record: RunRecord, ts: str) -> RunRecord:
    """`record` owing the removal of its live message `ts` from the thread (stopped, then deleted):
    a message whose tasks can no longer follow their calls (`Driver.show_turn`)."""
    return replace(record, outbox=[*record.outbox, {"op": "discard", "ts": ts}])


def owe_decided(record: RunRecord, ts: str, call: PendingCall, at: float) -> RunRecord:
    """`record` owing the update of the card `ts` of `call`, decided (`call.decision`) at `at`.

    Kept as the call, not as the card: the card is rendered when it is paid, by the courier while
    the run goes on, and the debt weighs a tenth of the card in every save that carries it (an
    Approve all owes ten cards, carried by each of the ten write-ahead saves that follow).
    """
    entry = {"op": "decided", "ts": ts, "call": call.to_json(), "at": at}
    if len(json.dumps(entry["call"], ensure_ascii=False)) > DECIDED_CALL_MAX_CHARS:
        msg = _decided(record, entry)  # a card is cut to fit Slack; big arguments are not
        return record if msg is None else owe_update(record, ts, msg)
    return replace(record, outbox=[*record.outbox, entry])


def owe_reaction(record: RunRecord, name: str, *, remove: str | None = None) -> RunRecord:
    """`record` owing a reaction on the message that started it (inside a thread, not its root)."""
    entry = {"op": "react", "ts": record.asked_ts or record.thread_ts, "name": name, "remove": remove}
    return replace(record, outbox=[*record.outbox, entry])


def deliver(svc: Services, record: RunRecord, *, reconcile: bool) -> RunRecord:
    """Pay every debt of `record` in order; returns it with the outbox empty and the posts' ts kept.

    `reconcile`: an earlier driver may have posted some of these before it died, so look for
    them in the thread first. A post that fails for good (after the client's retries) is logged
    and dropped: the run goes on.
    """
    if not record.outbox:
        return record
    posted: dict[str, str] = {}
    if reconcile and any(e["op"] in ("post", "upload") for e in record.outbox):
        found = svc.find_posted(record.channel, record.thread_ts, record.run_id)
        posted = found or {}
    cards = dict(record.cards)
    failure_ts = record.failure_ts
    for entry in record.outbox:
        ts = _pay(svc, record, entry, posted)
        if ts and entry.get("role") == CARD and entry.get("call"):
            cards[entry["call"]] = ts
        elif ts and entry.get("role") == FAILURE:
            failure_ts = ts
    return replace(record, outbox=[], cards=cards, failure_ts=failure_ts)


def _settle(svc: Services, record: RunRecord, entry: dict[str, Any], tag: tuple[str, str]) -> str | None:
    """Settle the live message that showed a post happening as the post: its ts, or None (then it
    is taken out of the thread, and the post goes out whole as a message of its own)."""
    ts = entry["live"]
    msg = (entry["text"], entry["blocks"])
    settled = svc.settle_live(record.channel, record.thread_ts, ts, msg, tag)
    if not settled:
        svc.discard_live(record.channel, ts)
    svc.store.live.closed(record.run_id, ts)
    return ts if settled else None


def _pay(svc: Services, record: RunRecord, entry: dict[str, Any], posted: dict[str, str]) -> str | None:
    op = entry["op"]
    if op == "post":
        if entry["key"] in posted:
            if entry.get("live"):  # settled before its driver died: no longer open
                svc.store.live.closed(record.run_id, entry["live"])
            return posted[entry["key"]]
        tag = (record.run_id, entry["key"])
        if entry.get("live") and (settled := _settle(svc, record, entry, tag)):
            return settled
        return svc.post(record.channel, record.thread_ts, entry["text"], entry["blocks"], tag=tag)
    if op == "upload":
        if file_key(entry["key"]) in posted:
            return None
        name = upload_name(entry["name"], record.run_id, entry["key"])
        if not svc.upload(record.channel, record.thread_ts, name, entry["title"], entry["content"]):
            failed = notice(texts.FILE_NOT_POSTED.format(title=entry["title"]))
            svc.post(record.channel, record.thread_ts, failed.text, failed.blocks, tag=(record.run_id, name))
        return None
    if op == "update":
        svc.update(record.channel, entry["ts"], entry["text"], entry["blocks"])
        return None
    if op == "decided":
        msg = _decided(record, entry)
        if msg is not None:
            svc.update(record.channel, entry["ts"], msg.text, msg.blocks)
        return None
    if op == "react":
        svc.react(record.channel, entry["ts"], entry["name"], remove=entry.get("remove"))
        return None
    if op == "ephemeral":
        svc.whisper(record.channel, record.thread_ts, entry["user"], entry["text"], entry["blocks"])
        return None
    if op == "discard":  # paid twice (a driver died between), the second delete finds nothing: logged
        svc.discard_live(record.channel, entry["ts"])
        svc.store.live.closed(record.run_id, entry["ts"])
        return None
    log.error("run %s owes Slack something unknown (%r); dropped", record.run_id, op)
    return None


def _decided(record: RunRecord, entry: dict[str, Any]) -> Message | None:
    """The decided card a `decided` debt owes; None (logged) when it cannot be rendered: a card
    is never worth the run, and a debt that raised would raise again for every later driver."""
    try:
        call = PendingCall.from_json(entry["call"])
        if call.decision is None:
            raise ValueError("the call carries no decision")
        at = datetime.fromtimestamp(float(entry["at"]), UTC)
        return cards.card_of_decision(call=call, decision=call.decision, requester=record.requester, at=at)
    except Exception:
        log.exception("run %s: a decided card could not be rendered; its update is dropped", record.run_id)
        return None
