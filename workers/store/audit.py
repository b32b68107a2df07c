"""The audit stream of decisions and the feedback stream of answers: appended, trimmed by count
and by age, read back newest last. (What `python -m workers audit` prints of them: `workers.audit`.)

Decisions are appended by the decide script (`ParkStore.decide`), in the step that records them.
Every call's tier decision (`workers.rulings`) has a stream of its own, bounded the same way, so
that the many calls never push decisions out of theirs: it rides on the save of the step that
ruled it (`rulings_write`), written once per run and call id whatever is sent twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

from workers.store.base import Beside, StorePart, as_text
from workers.store.keys import DAY, Keys
from workers.store.records import FINISHED_RUN_TTL

AUDIT_MAX_ENTRIES = 100_000
AUDIT_MAX_AGE = 90 * DAY
FEEDBACK_MAX_ENTRIES = 100_000
FEEDBACK_PER_MINUTE = 10  # feedback clicks of one person recorded per minute, over every answer


class FeedbackOutcome(StrEnum):
    """What became of a click on an answer's thumbs."""

    RECORDED = "recorded"
    SAME = "same"  # the person's standing feedback on this answer already says so
    LIMITED = "limited"  # past the person's share of the minute: not recorded


# KEYS[1] feedback stream, KEYS[2] the person's count this minute, KEYS[3] their standing feedback
# on the answer. ARGV[1] entry JSON, ARGV[2] good/bad, ARGV[3] most a person may give a minute,
# ARGV[4] that minute in s, ARGV[5] stream max length, ARGV[6] oldest id kept, ARGV[7] standing TTL s.
# The same feedback again on the same answer adds nothing (a double click, a replay, redis-py
# sending the script again); past the person's share of the minute nothing is written either.
_FEEDBACK = """
if redis.call('GET', KEYS[3]) == ARGV[2] then return 'same' end
local n = redis.call('INCR', KEYS[2])
if n == 1 then redis.call('EXPIRE', KEYS[2], ARGV[4]) end
if n > tonumber(ARGV[3]) then return 'limited' end
redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[7])
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[5], '*', 'entry', ARGV[1])
redis.call('XTRIM', KEYS[1], 'MINID', '~', ARGV[6])
return 'recorded'
"""


# KEYS[1] the calls' stream, KEYS[2] the run's call ids already recorded. ARGV[1] stream max length,
# ARGV[2] oldest id kept, ARGV[3] TTL s of the ids, ARGV[4..] call id, entry JSON, call id, ...
# A call already recorded adds nothing: a save (and its besides) sent again after a lost reply
# writes each ruling once.
_RULINGS = """
for i = 4, #ARGV, 2 do
  if redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'entry', ARGV[i + 1])
  end
end
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('XTRIM', KEYS[1], 'MINID', '~', ARGV[2])
return 1
"""
AUDIT_PAGE = 1000  # entries read per round trip by `calls_since`


def rulings_write(run_id: str, entries: list[dict[str, Any]], *, now: float | None = None) -> Beside:
    """The audit entries of a reply's calls (each with its `call_id`), as a write for the run's
    next save to carry; each call is recorded once, however often the write is sent."""
    now = time.time() if now is None else now
    args: list[Any] = [AUDIT_MAX_ENTRIES, f"{int((now - AUDIT_MAX_AGE) * 1000)}-0", FINISHED_RUN_TTL]
    for entry in entries:
        args += [str(entry["call_id"]), json.dumps(entry, ensure_ascii=False)]
    keys = (Keys.audit_calls(), Keys.audit_ruled(run_id))
    return Beside("the calls' tier decisions", _RULINGS, keys, tuple(args))


class AuditStore(StorePart):
    """The decisions' audit, the calls' tier decisions and the answers' feedback, each a capped stream."""

    def append_audit(self, entry: dict[str, Any], *, now: float | None = None) -> None:
        """One audit entry written outside a decision (a call a grant let run)."""
        now = time.time() if now is None else now
        oldest = f"{int((now - AUDIT_MAX_AGE) * 1000)}-0"
        with self.redis.pipeline() as pipe:
            pipe.xadd(
                Keys.audit(),
                {"entry": json.dumps({"at": now, **entry}, ensure_ascii=False)},
                maxlen=AUDIT_MAX_ENTRIES,
                approximate=True,
            )
            pipe.xtrim(Keys.audit(), minid=oldest, approximate=True)
            pipe.execute()

    def audit_entries(self, count: int = 100) -> list[dict[str, Any]]:
        """The newest `count` audit entries, oldest first (see `_stream_entries`)."""
        return self._stream_entries(Keys.audit(), count)

    def call_entries(self, count: int = 100) -> list[dict[str, Any]]:
        """The newest `count` tier decisions of calls, oldest first."""
        return self._stream_entries(Keys.audit_calls(), count)

    def calls_since(self, since: float) -> Iterator[dict[str, Any]]:
        """Every call's tier decision recorded at or after `since` (epoch seconds), oldest first,
        read a page at a time; an unreadable one comes back as `{"unreadable": ...}`."""
        start = f"{max(int(since * 1000), 0)}-0"
        while True:
            rows: list[Any] = self.redis.xrange(Keys.audit_calls(), min=start, count=AUDIT_PAGE) or []
            for _, fields_ in rows:
                yield _entry(fields_.get(b"entry", b""))
            if len(rows) < AUDIT_PAGE:
                return
            start = "(" + as_text(rows[-1][0])

    def _stream_entries(self, key: str, count: int) -> list[dict[str, Any]]:
        """The newest `count` entries of stream `key`, oldest first. An entry that is not a JSON
        object (written by hand, or by something else) comes back as `{"unreadable": ...}`."""
        rows: list[Any] = self.redis.xrevrange(key, count=count) or []
        return [_entry(fields_.get(b"entry", b"")) for _, fields_ in reversed(rows)]

    # --- feedback on answers --------------------------------------------------------------------

    def record_feedback(
        self, entry: dict[str, Any], *, team: str, user: str, run_id: str, now: float | None = None
    ) -> FeedbackOutcome:
        """Append a click on an answer's thumbs (`entry["feedback"]`: good or bad) to the feedback
        stream, unless it repeats `user`'s standing feedback on that answer or `user` has already
        given `FEEDBACK_PER_MINUTE` this minute. One script: the checks and the write are one step."""
        now = time.time() if now is None else now
        keys = [Keys.feedback(), Keys.feedback_rate(team, user), Keys.feedback_given(run_id, user)]
        args: list[Any] = [
            json.dumps({"at": now, **entry}, ensure_ascii=False),
            str(entry["feedback"]),
            FEEDBACK_PER_MINUTE,
            60,
            FEEDBACK_MAX_ENTRIES,
            f"{int((now - AUDIT_MAX_AGE) * 1000)}-0",
            FINISHED_RUN_TTL,
        ]
        return FeedbackOutcome(as_text(self._script(_FEEDBACK)(keys=keys, args=args)))

    def feedback_entries(self, count: int = 100) -> list[dict[str, Any]]:
        """The newest `count` feedback entries, oldest first."""
        return self._stream_entries(Keys.feedback(), count)


def _entry(raw: Any) -> dict[str, Any]:
    """A stream entry's JSON object, or `{"unreadable": ...}` (written by hand, or by something else)."""
    try:
        entry = json.loads(raw)
    except ValueError:
        entry = None
    return entry if isinstance(entry, dict) else {"unreadable": as_text(raw)[:200]}
