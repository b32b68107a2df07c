"""A thread's runs, one at a time: the thread's lock, the runs queued behind its holder, and the
thread's conversation kept for its next run (the history, written by a run's `finish`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from harness.state import StateError, format_version
from store.base import Beside, StorePart, as_text
from store.keys import DAY, Keys, check_id
from store.parks import park_indexes
from store.records import RunRecord, unpack

HISTORY_VERSION = 1  # what a run's `finish` writes; read: `HISTORY_VERSIONS`
THREAD_TTL = 30 * DAY
Messages = tuple[dict[str, Any], ...]


def _history_v1(data: dict[str, Any]) -> Messages:
    return tuple(data["messages"])


# Every version of a stored thread history this release reads, and how: a release keeps the reader
# of the version the release before it wrote (tests/store/test_formats.py loads one of each).
_HISTORY_READERS: dict[int, Callable[[dict[str, Any]], Messages]] = {1: _history_v1}
HISTORY_VERSIONS = frozenset(_HISTORY_READERS)


def history_of(text: str) -> Messages:
    """A stored thread history's conversation; one newer than this release reads raises
    `NewerRecord`, anything else it cannot read `StateError`."""
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise StateError(f"stored thread is unreadable ({exc}); refusing to use it") from None
    reader = _HISTORY_READERS[format_version(parsed, "thread history", HISTORY_VERSIONS)]
    try:
        return reader(parsed)
    except (KeyError, TypeError) as exc:
        raise StateError(f"stored thread is malformed ({exc!r}); refusing to use it") from None


# KEYS[1] thread lock, KEYS[2] waiting list. ARGV[1] run id, ARGV[2] lock TTL, ARGV[3] list TTL,
# ARGV[4] "1" to queue behind the holder when the thread is taken.
_TAKE_THREAD = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('EXPIRE', KEYS[1], ARGV[2]) return 1 end
if ARGV[4] ~= '1' then return 0 end
if redis.call('LPOS', KEYS[2], ARGV[1]) == false then redis.call('RPUSH', KEYS[2], ARGV[1]) end
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 0
"""

# `_TAKE_THREAD` for a resumed run, its park forgotten first: KEYS[3..] expiries and the Home tab's
# indexes (team's, requester's), ARGV[5] the park's member there. Idempotent, as a write beside a
# save must be.
_RESUME_THREAD = "for i = 3, #KEYS do redis.call('ZREM', KEYS[i], ARGV[5]) end\n" + _TAKE_THREAD

# KEYS[1] lease, KEYS[2] active set, KEYS[3] waiting list. ARGV[1] token, ARGV[2] run id.
# A run queued behind another in its thread lets go: no driver until the thread is handed to it
# (unless that already happened, in which case it stays active).
_LEAVE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
if redis.call('LPOS', KEYS[3], ARGV[2]) ~= false then redis.call('ZREM', KEYS[2], ARGV[2]) end
return 1
"""


# KEYS[1] thread lock, KEYS[2] waiting list, KEYS[3] active set. ARGV[1] run id, ARGV[2] now.
# A run that took its thread and cannot start in it (a newer release wrote the thread's history)
# lets it go as an ending run would: the run queued next is marked active. Idempotent.
_GIVE_BACK = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return '' end
redis.call('DEL', KEYS[1])
local nxt = redis.call('LPOP', KEYS[2])
if nxt then redis.call('ZADD', KEYS[3], ARGV[2], nxt) return nxt end
return ''
"""


class ThreadStore(StorePart):
    """Who holds a thread, who waits for it, and what was said in it."""

    def load_history(self, team: str, channel: str, thread_ts: str) -> tuple[Messages, int]:
        """The thread's conversation so far and its `seq` (0 for a new thread); `NewerRecord` when
        a newer release wrote it."""
        data, seq = self.redis.hmget(Keys.history(team, channel, thread_ts), ["data", "seq"])
        if data is None:
            return (), int(seq or 0)
        return history_of(unpack(data)), int(seq or 0)

    def profile(self, team: str, channel: str, thread_ts: str) -> str | None:
        """The profile the thread's first run started under ("": the top level); None: none yet."""
        raw = self.redis.hget(Keys.history(team, channel, thread_ts), "profile")
        return None if raw is None else as_text(raw)

    def keep_profile(self, record: RunRecord) -> None:
        """Remember `record`'s profile as its thread's: later mentions there continue under it."""
        key = Keys.history(*record.thread)
        with self.redis.pipeline() as pipe:
            pipe.hset(key, "profile", record.profile)
            pipe.expire(key, THREAD_TTL)
            pipe.execute()

    def take(self, record: RunRecord, ttl: int, *, queue: bool = True) -> bool:
        """Make `record` the active run of its thread, or (`queue`) queue it behind the one that is."""
        keys = [Keys.thread_lock(*record.thread), Keys.thread_waiting(*record.thread)]
        args: list[Any] = [record.run_id, ttl, THREAD_TTL, "1" if queue else "0"]
        return bool(self._script(_TAKE_THREAD)(keys=keys, args=args))

    def give_back(self, record: RunRecord) -> str | None:
        """Let go of the thread `record` took (`take`), handing it to the run queued next, if any
        (marked active: the watchdog starts it); that run's id."""
        keys = [Keys.thread_lock(*record.thread), Keys.thread_waiting(*record.thread), Keys.active()]
        nxt = self._script(_GIVE_BACK)(keys=keys, args=[record.run_id, time.time()])
        return as_text(nxt) or None

    def holder(self, record: RunRecord) -> str | None:
        raw = self.redis.get(Keys.thread_lock(*record.thread))
        return as_text(raw) if raw else None

    def thread_run(self, team: str, channel: str, thread_ts: str) -> str | None:
        """The run working in (or parked in) a thread now, if any."""
        raw = self.redis.get(Keys.thread_lock(team, channel, thread_ts))
        return as_text(raw) if raw else None

    def resumed(self, record: RunRecord, ttl: int) -> Beside:
        """A resumed run's park expiry forgotten and its thread taken (`take_thread`, queued behind
        a holder that took it meanwhile), as a write for the resume's save to carry."""
        member = f"{check_id('run', record.run_id)}:{int(record.park_id)}"
        keys = (
            Keys.thread_lock(*record.thread),
            Keys.thread_waiting(*record.thread),
            Keys.expiries(),
            *park_indexes(record),
        )
        return Beside(
            "the resumed run's thread and expiry",
            _RESUME_THREAD,
            keys,
            (record.run_id, ttl, THREAD_TTL, "1", member),
        )

    def leave(self, record: RunRecord, token: str) -> None:
        """A run queued behind another in its thread lets go of its driver (see `_LEAVE`)."""
        keys = [Keys.lease(record.run_id), Keys.active(), Keys.thread_waiting(*record.thread)]
        self._script(_LEAVE)(keys=keys, args=[token, record.run_id])
