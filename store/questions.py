"""Questions a server asks in the middle of a call (`elicitation/create`, the protocol before
2026-07-28), open while the call waits for the answer (`workers.mid_call`).

The worker that holds the call writes the question down, then waits on its answers' list; the bot
checks a click against the question (its run, its requester), records the first answer only (a
second changes nothing) and pushes it onto that list. A form's values ride in the answer: they
are in Redis for as long as the worker takes to pop them (it waits on the list), and no longer
than the question lives.
"""

from __future__ import annotations

import json
import time
from typing import Any

from store.base import StorePart, as_text
from store.keys import Keys

WAIT_SLICE_SECONDS = 5  # one BLPOP at most this long: well inside any socket timeout
LINGER_SECONDS = 60  # a question outlives its call's wait by this much (a late click is told so)

# KEYS: the question, its answers' list, its "answered" mark. ARGV: the answer, seconds to live.
# The first answer to a question still open is pushed; any other is refused (0).
_ANSWER = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if not redis.call('SET', KEYS[3], '1', 'NX', 'EX', tonumber(ARGV[2])) then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
return 1
"""


class QuestionStore(StorePart):
    """Mid-call questions by run and question id, and their answers."""

    def open(self, run_id: str, question_id: str, record: dict[str, Any], seconds: float) -> None:
        """Write the question down for as long as its call may wait (and a minute more)."""
        ttl = int(seconds) + LINGER_SECONDS
        self.redis.set(Keys.question(run_id, question_id), json.dumps(record, ensure_ascii=False), ex=ttl)

    def get(self, run_id: str, question_id: str) -> dict[str, Any] | None:
        """The question, while open; None once closed or expired."""
        raw = self.redis.get(Keys.question(run_id, question_id))
        if raw is None:
            return None
        try:
            found = json.loads(as_text(raw))
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    def answer(self, run_id: str, question_id: str, answer: dict[str, Any]) -> bool:
        """Hand `answer` to the waiting worker; False when the question is closed or answered."""
        keys = [
            Keys.question(run_id, question_id),
            Keys.question_answers(run_id, question_id),
            Keys.question_answered(run_id, question_id),
        ]
        ttl = max(1, int(self.redis.ttl(keys[0]) or 0)) + LINGER_SECONDS
        text = json.dumps(answer, ensure_ascii=False)
        return bool(self._script(_ANSWER)(keys=keys, args=[text, ttl]))

    def wait(self, run_id: str, question_id: str, seconds: float) -> dict[str, Any] | None:
        """The answer, once given, taken off its list; None when none came within `seconds`."""
        deadline = time.monotonic() + seconds
        key = Keys.question_answers(run_id, question_id)
        while (left := deadline - time.monotonic()) > 0:
            popped = self.redis.blpop([key], timeout=max(1, min(WAIT_SLICE_SECONDS, int(left))))
            if popped is not None:
                try:
                    found = json.loads(as_text(popped[1]))
                except ValueError:
                    return None
                return found if isinstance(found, dict) else None
        return None

    def close(self, run_id: str, question_id: str) -> None:
        """The call no longer waits: the question goes (its "answered" mark stays, to refuse a late one)."""
        self.redis.set(Keys.question_answered(run_id, question_id), "1", ex=LINGER_SECONDS, nx=True)
        self.redis.delete(Keys.question(run_id, question_id), Keys.question_answers(run_id, question_id))
