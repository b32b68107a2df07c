"""The decisions' audit as a hash chain, and its check (`python -m workers audit verify`).

Each entry carries its sequence number, the hash of the entry before it (`prev`) and its own:
SHA-1 of `"<prev>\\n<seq>\\n<entry JSON>"`, computed by the Lua script that appends it
(`store.audit.CHAIN_APPEND`; Redis scripts have SHA-1 only). The chain's head (the newest
seq and hash) is a key of its own, moved in the same step.

What the check catches, and what it cannot (docs/audit.md): an entry edited (its hash no longer
matches what it holds), removed (a seq missing, or the head ahead of the stream's end) or moved (a
seq out of place), when whoever did it did not recompute the hashes that follow. Someone with write
access to Redis can recompute the whole chain; the JSONL files (`ops.audit_files`) are the
anchor against that: every entry they hold must be in Redis as they hold it, or trimmed.

The first link read is accepted as the start when the older ones are gone (trimmed, in Redis and
with no files): its `prev` is taken on trust, and the report says from which entry it checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from store import AuditLink


def link_hash(prev: str, seq: int, entry: bytes) -> str:
    """The hash a link of sequence number `seq` after `prev` holding `entry` must carry."""
    return hashlib.sha1(f"{prev}\n{seq}\n".encode() + entry).hexdigest()


@dataclass(frozen=True)
class ChainReport:
    """What `verify` found: `ok`, how many entries it checked, and one line to print."""

    ok: bool
    checked: int
    line: str


def verify(
    links: Sequence[AuditLink], head: tuple[int, str] | None, *, copies: Iterable[AuditLink] = ()
) -> ChainReport:
    """Check `links` (oldest first: the files' entries, then Redis's newer ones) against each
    other and the `head` Redis holds; `copies`: the entries Redis still holds that the files hold
    too, each of which must be the files' entry unchanged. Names the first entry that is not."""
    for problem in (_copies_problem(links, copies), _links_problem(links)):
        if problem:
            return ChainReport(False, 0, problem)
    chained = [link for link in links if link.seq is not None]
    problem = _head_problem(chained, head)
    if problem:
        return ChainReport(False, 0, problem)
    older = len(links) - len(chained)
    line = f"{len(chained)} entries, chain intact"
    if chained and chained[0].seq != 1:
        line += f" (from entry #{chained[0].seq}: the older ones were trimmed)"
    if older:
        line += f"; {older} older entries were written before the chain and are not covered"
    return ChainReport(True, len(chained), line)


def name(link: AuditLink) -> str:
    """How a report names an entry: its number, stream id and time."""
    seq = f"#{link.seq}" if link.seq is not None else "(no number)"
    return f"entry {seq} (id {link.id}, {_when(link.id)})"


def _links_problem(links: Sequence[AuditLink]) -> str | None:
    """The first link that is changed, missing, out of place or unchained; None if none is."""
    position = {link.seq: i for i, link in enumerate(links) if link.seq is not None}
    expected: int | None = None
    before: AuditLink | None = None
    for i, link in enumerate(links):
        if link.seq is None or link.hash is None or link.prev is None:
            if before is None:
                continue  # written before the chain existed
            return f"{name(link)} carries no chain: it was inserted, or changed"
        if expected is not None and link.seq != expected:
            if link.seq > expected and position.get(expected, -1) > i:
                moved = links[position[expected]]
                return f"{name(moved)} was reordered: it stands after entry #{link.seq}"
            if link.seq > expected:
                gone = f"#{expected}" if link.seq == expected + 1 else f"#{expected} to #{link.seq - 1}"
                return f"entry {gone} was removed: {name(link)} follows entry #{expected - 1}"
            return f"{name(link)} was reordered: it stands after entry #{expected - 1}"
        if link.hash != link_hash(link.prev, link.seq, link.entry):
            return f"{name(link)} was changed: its hash does not match what it holds"
        if before is not None and link.prev != before.hash:
            return f"{name(link)} does not follow {name(before)}: one of them was changed or replaced"
        expected, before = link.seq + 1, link
    return None


def _head_problem(chained: Sequence[AuditLink], head: tuple[int, str] | None) -> str | None:
    """Whether the newest entries are the head Redis holds (none removed from the end)."""
    if head is None:
        return "the chain's head is missing from Redis: it was removed" if chained else None
    seq, digest = head
    last = chained[-1] if chained else None
    if last is None or last.seq is None or last.seq < seq:
        after = f"after {name(last)}" if last else "(none is left)"
        return f"entry #{seq} was removed: the chain's head names it, and no entry stands {after}"
    if last.seq > seq:
        return f"{name(last)} was added after the chain's head (entry #{seq}): it was inserted"
    if last.hash != digest:
        return f"{name(last)} was changed: the chain's head holds another hash for it"
    return None


def _copies_problem(links: Sequence[AuditLink], copies: Iterable[AuditLink]) -> str | None:
    """The first entry Redis holds that the files hold otherwise, or do not hold at all."""
    kept = {link.id: link for link in links}
    before: AuditLink | None = None
    for copy in copies:
        filed = kept.get(copy.id)
        if filed is None:
            return f"{name(copy)} is in Redis but not in the files that hold its time: it was inserted"
        if filed != copy:
            return f"{name(copy)} was changed in Redis: the files hold it otherwise"
        if before is not None and before.seq is not None and copy.seq != before.seq + 1:
            gone = before.seq + 1
            return f"entry #{gone} was removed from Redis, or moved there (the files still hold it)"
        before = copy
    return None


def _when(stream_id: str) -> str:
    """The time a stream id was given (when the entry was appended), in UTC."""
    millis = stream_id.partition("-")[0]
    if not millis.isdigit():
        return "no time"
    return datetime.fromtimestamp(int(millis) / 1000, UTC).isoformat(timespec="seconds")
