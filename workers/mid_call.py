"""A question a server asks in the middle of a call, put to the run's requester while the call waits.

Under the protocol before 2026-07-28 a server asks (`elicitation/create`) while its `tools/call`
is open, and the call cannot be parked: the server waits on its own process for the answer. So the
worker that holds the session (the hub: `harness.tools.mcp`) puts the question to the requester of
the call's run, as a question after a call is put (`messages.inputs`: a prompt only they see, a
note for everyone), and waits for the answer within the call's own `timeout_seconds`. The bot
records the first answer (`store.questions`) and hands it over; nobody answering in time is a
cancel. The wait holds the call's slot, as a slow tool does: an operator raises the server's
`timeout_seconds` to give people more time.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from harness.tools.inputs import InputAsk, MidCallQuestion
from messages import inputs
from messages.inputs import MID_CALL
from store import Store
from workers.services import Services

log = logging.getLogger(__name__)

SHORTEST_SECONDS = 5.0  # less time left than this, and nobody could answer: cancel at once


class MidCallQuestions:
    """The worker's `PersonAsker`: each question put to the run's requester, its answer awaited."""

    def __init__(self, services: Callable[[], Services], store: Store) -> None:
        """`services`: the services in force (a reload replaces them); `store`: a connection of its
        own (its waits block it), never shared with a fork."""
        self._services = services
        self._store = store

    async def __call__(self, asked: MidCallQuestion) -> dict[str, Any]:
        return await asyncio.to_thread(self.ask, asked)

    def ask(self, asked: MidCallQuestion) -> dict[str, Any]:
        """The requester's answer as an ElicitResult (JSON); cancel when there is none in time."""
        if asked.seconds < SHORTEST_SECONDS:
            log.info(
                "run %s: %s asked mid-call with %.0f s left: cancel", asked.who, asked.server, asked.seconds
            )
            return {"action": "cancel"}
        try:
            record = self._store.runs.load(asked.who)
        except Exception as exc:  # noqa: BLE001 - an unreadable run gets a cancel, the call goes on
            log.warning("run %s: cannot read it to ask its requester (%s): cancel", asked.who, exc)
            return {"action": "cancel"}
        if record is None:
            return {"action": "cancel"}
        svc, question = self._services(), asked.question
        question_id = secrets.token_hex(8)
        ask = InputAsk(asked.server, (question,), None)
        kept = {
            "question": question.to_json(),
            "server": asked.server,
            "tool": asked.tool,
            "requester": record.requester,
            "channel": record.channel,
        }
        try:
            self._store.questions.open(record.run_id, question_id, kept, asked.seconds)
        except redis.RedisError as exc:
            log.warning(
                "run %s: cannot write down %s's mid-call question (%s): cancel", asked.who, asked.server, exc
            )
            return {"action": "cancel"}
        until = datetime.now(UTC) + timedelta(seconds=asked.seconds)
        prompt = inputs.input_prompt(
            run_id=record.run_id,
            call_id=MID_CALL,
            tool=asked.tool,
            ask=ask,
            question=question,
            expires_at=until,
            question_id=question_id,
        )
        svc.whisper(record.channel, record.thread_ts, record.requester, prompt.text, prompt.blocks)
        note = inputs.input_note(
            run_id=record.run_id,
            call_id=MID_CALL,
            tool=asked.tool,
            ask=ask,
            question=question,
            requester=record.requester,
            question_id=question_id,
        )
        tag = (record.run_id, f"question-{question_id}")
        note_ts = svc.post(record.channel, record.thread_ts, note.text, note.blocks, tag=tag)
        log.info(
            "run %s: %s asked its requester mid-call (%s); waiting up to %.0f s",
            asked.who,
            asked.server,
            question.mode,
            asked.seconds,
        )
        try:
            answer = self._store.questions.wait(record.run_id, question_id, asked.seconds)
        except redis.RedisError as exc:
            log.warning("run %s: lost the wait for %s's answer (%s): cancel", asked.who, asked.server, exc)
            answer = None
        finally:
            try:
                self._store.questions.close(record.run_id, question_id)
            except redis.RedisError:
                log.warning("run %s: could not close %s's mid-call question", asked.who, asked.server)
        action = str(answer.get("action")) if answer else "cancel"
        if action not in ("accept", "decline", "cancel"):
            action = "cancel"
        if note_ts:
            by = str(answer.get("by") or "") if answer else None
            settled = inputs.input_settled(
                ask=ask, tool=asked.tool, outcome=action, by=by, at=datetime.now(UTC)
            )
            svc.update(record.channel, note_ts, settled.text, settled.blocks)
        log.info("run %s: the mid-call question of %s was answered: %s", asked.who, asked.server, action)
        if action == "accept" and question.mode == "form":
            content = answer.get("content") if answer else None
            return {"action": "accept", "content": content if isinstance(content, dict) else {}}
        return {"action": action}
