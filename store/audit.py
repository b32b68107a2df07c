"""The audit stream of decisions and the feedback stream of answers: appended, trimmed by count
and by age, read back newest last. (What `python -m workers audit` prints of them: `ops.audit`.)

Decisions are appended by the decide script (`ParkStore.decide`), in the step that records them.
Every entry of the decisions' audit is a link of a hash chain (`CHAIN_APPEND`): it carries its
sequence number, the hash of the entry before it and its own, and the chain's head
(`harness:audit:head`) moves in the same script, so concurrent appends from any number of bots
and workers extend one chain. Appends never trim: `trim_audit` (the watchdog's pass) does, by
count and by age, and never past the entries the JSONL files hold when they are kept
(`ops.audit_files`). `ops.audit_chain` checks the chain.
Every call's tier decision (`ops.rulings`) has a stream of its own, bounded the same way, so
that the many calls never push decisions out of theirs: it rides on the save of the step that
ruled it (`rulings_write`), written once per run and call id whatever is sent twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from store.base import Beside, StorePart, as_text
from store.keys import DAY, Keys
from store.records import FINISHED_RUN_TTL

AUDIT_MAX_ENTRIES = 100_000
AUDIT_MAX_AGE = 90 * DAY
FEEDBACK_MAX_ENTRIES = 100_000
FEEDBACK_PER_MINUTE = 10  # feedback clicks of one person taken per minute, over every answer


class FeedbackOutcome(StrEnum):
    """What became of a click on an answer's thumbs."""

    RECORDED = "recorded"
    SAME = "same"  # the person's standing feedback on this answer already says so
    LIMITED = "limited"  # the first click past the person's share of the minute: not recorded
    IGNORED = "ignored"  # a later one that minute: not recorded, and they were told already


# KEYS[1] feedback stream, KEYS[2] the person's clicks this minute, KEYS[3] their standing feedback
# on the answer. ARGV[1] entry JSON, ARGV[2] good/bad, ARGV[3] most clicks a person may give a
# minute, ARGV[4] that minute in s, ARGV[5] stream max length, ARGV[6] oldest id kept, ARGV[7]
# standing TTL s. Every click counts, over every answer: past the person's share of the minute
# nothing is written (the first such click is 'limited', to be told so; the rest 'ignored'). The
# same feedback again on the same answer adds nothing (a double click, a replay).
_FEEDBACK = """
local n = redis.call('INCR', KEYS[2])
if n == 1 then redis.call('EXPIRE', KEYS[2], ARGV[4]) end
if n > tonumber(ARGV[3]) then
  if n == tonumber(ARGV[3]) + 1 then return 'limited' end
  return 'ignored'
end
if redis.call('GET', KEYS[3]) == ARGV[2] then return 'same' end
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
AUDIT_PAGE = 1000  # entries read per round trip by `calls_since` and `audit_links`
TRIM_MOST = 10_000  # entries one trim pass removes by count at most (a pass never blocks Redis long)

# A Lua function that the scripts appending to the decisions' audit include: `chain_append(stream,
# head, entry)` appends `entry` (JSON text) as the next link of the chain and moves the head, in the
# caller's atomic step. hash = SHA-1 of "<prev hash>\n<seq>\n<entry>" (`ops.audit_chain`);
# the first link has seq 1 and prev "". A head that is not `<seq> <hash>` restarts the chain at 1,
# which `audit verify` reports: an append never fails for it.
CHAIN_APPEND = """
local function chain_append(stream, head, entry)
  local seq, prev = 1, ''
  local s, p = string.match(redis.call('GET', head) or '', '^(%d+) (%x+)$')
  if s then seq, prev = tonumber(s) + 1, p end
  local n = string.format('%d', seq)
  local hash = redis.sha1hex(prev .. '\\n' .. n .. '\\n' .. entry)
  redis.call('XADD', stream, '*', 'entry', entry, 'seq', n, 'prev', prev, 'hash', hash)
  redis.call('SET', head, n .. ' ' .. hash)
end
"""

# KEYS[1] audit stream, KEYS[2] chain head. ARGV[1] entry JSON.
_APPEND = (
    CHAIN_APPEND
    + """
chain_append(KEYS[1], KEYS[2], ARGV[1])
return 1
"""
)

# KEYS[1] audit stream, KEYS[2] the files' cursor (newest id they hold). ARGV[1] most entries kept,
# ARGV[2] oldest id kept (by age), ARGV[3] '1': the files are kept (no cursor yet: trim nothing),
# ARGV[4] most entries removed by count in one pass. Trims below the id the count and the age ask
# for, but never an entry above the files' cursor when there is one: trimming never loses an entry.
_TRIM = """
local function older(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as < bs)
end
local minid = ARGV[2]
local excess = redis.call('XLEN', KEYS[1]) - tonumber(ARGV[1])
if excess > 0 then
  local rows = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', math.min(excess, tonumber(ARGV[4])) + 1)
  local by_count = rows[#rows][1]
  if older(minid, by_count) then minid = by_count end
end
local cursor = redis.call('GET', KEYS[2])
if not cursor and ARGV[3] == '1' then return 0 end
if cursor then
  local ms, sq = string.match(cursor, '^(%d+)-(%d+)$')
  if not ms then return 0 end
  local above = ms .. '-' .. string.format('%d', tonumber(sq) + 1)
  if older(above, minid) then minid = above end
end
return redis.call('XTRIM', KEYS[1], 'MINID', minid)
"""

# KEYS[1] the mirror lock. ARGV[1] the taker's token, ARGV[2] the lease in ms. Taken if free,
# renewed if the taker holds it already.
_LEASE = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS[1] the files' cursor, KEYS[2] the mirror lock. ARGV[1] the lock's token, ARGV[2] the newest
# id now fsynced in the files. Only the lock's holder moves the cursor, and only forward.
_ADVANCE = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""


@dataclass(frozen=True)
class AuditLink:
    """One entry of the decisions' audit as stored: its stream id, and its chain fields as written
    (None for an entry written before the chain, or without them), the entry's JSON as bytes."""

    id: str
    seq: int | None
    prev: str | None
    hash: str | None
    entry: bytes

    def fields(self) -> dict[str, Any]:
        """The entry's JSON object (or `{"unreadable": ...}`)."""
        return _entry(self.entry)


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

    def append(self, entry: dict[str, Any], *, now: float | None = None) -> None:
        """One audit entry written outside a decision (a call a grant let run), chained."""
        now = time.time() if now is None else now
        text = json.dumps({"at": now, **entry}, ensure_ascii=False)
        self._script(_APPEND)(keys=[Keys.audit(), Keys.audit_head()], args=[text])

    def links(self, after: str = "-", *, count: int = AUDIT_PAGE) -> list[AuditLink]:
        """Up to `count` entries of the decisions' audit after stream id `after` (exclusive;
        "-": from the first), oldest first, with their chain fields."""
        start = after if after == "-" else "(" + after
        rows: list[Any] = self.redis.xrange(Keys.audit(), min=start, count=count) or []
        return [_link(as_text(id_), fields_) for id_, fields_ in rows]

    def all_links(self, after: str = "-") -> Iterator[AuditLink]:
        """Every entry of the decisions' audit after `after`, oldest first, a page at a time."""
        while True:
            page = self.links(after)
            yield from page
            if len(page) < AUDIT_PAGE:
                return
            after = page[-1].id

    def head(self) -> tuple[int, str] | None:
        """The chain's head (seq, hash) as Redis holds it; None if there is none (or it is not one)."""
        raw = self.redis.get(Keys.audit_head())
        seq, _, digest = as_text(raw or b"").partition(" ")
        return (int(seq), digest) if seq.isdigit() and digest else None

    def trim(self, *, mirrored: bool, now: float | None = None, most: int = AUDIT_MAX_ENTRIES) -> int:
        """Trim the decisions' audit to `most` entries and `AUDIT_MAX_AGE`, never above the files'
        cursor (`mirrored`: this process keeps the files, so without a cursor nothing goes); how
        many entries went."""
        now = time.time() if now is None else now
        oldest = f"{int((now - AUDIT_MAX_AGE) * 1000)}-0"
        keys = [Keys.audit(), Keys.audit_mirrored()]
        args: list[Any] = [most, oldest, "1" if mirrored else "0", TRIM_MOST]
        return int(self._script(_TRIM)(keys=keys, args=args))

    def mirrored(self) -> str | None:
        """The newest stream id the JSONL files hold, or None before the first is written."""
        raw = self.redis.get(Keys.audit_mirrored())
        return as_text(raw) if raw else None

    def take_mirror(self, token: str, seconds: float) -> bool:
        """Hold (or renew) the lease of the one process appending to the files now."""
        args: list[Any] = [token, int(seconds * 1000)]
        return bool(self._script(_LEASE)(keys=[Keys.audit_mirror_lock()], args=args))

    def advance_mirror(self, token: str, newest: str) -> bool:
        """Move the files' cursor to `newest` (fsynced there already), if the lease is still ours."""
        keys = [Keys.audit_mirrored(), Keys.audit_mirror_lock()]
        return bool(self._script(_ADVANCE)(keys=keys, args=[token, newest]))

    def entries(self, count: int = 100) -> list[dict[str, Any]]:
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
        stream, unless `user` has already clicked `FEEDBACK_PER_MINUTE` times this minute or it
        repeats their standing feedback on that answer. One script: the count, the checks and the
        write are one step."""
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


def _link(stream_id: str, fields_: dict[bytes, Any]) -> AuditLink:
    """A stream entry as an `AuditLink` (chain fields None where absent or not what we write)."""
    seq = as_text(fields_.get(b"seq", b""))
    prev, digest = fields_.get(b"prev"), fields_.get(b"hash")
    return AuditLink(
        id=stream_id,
        seq=int(seq) if seq.isdigit() else None,
        prev=as_text(prev) if prev is not None else None,
        hash=as_text(digest) if digest is not None else None,
        entry=bytes(fields_.get(b"entry", b"")),
    )
