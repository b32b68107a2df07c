"""The decisions' audit, appended to daily JSONL files under `HARNESS_AUDIT_DIR`, so that what
Redis trims is never lost, and a chain recomputed in Redis is caught (`ops.audit_chain`).

The watchdog of each worker with the variable set runs `mirror`: one process at a time (a lease in
Redis) reads the entries after the files' cursor (`harness:audit:mirrored`), appends them to
`audit-YYYY-MM-DD.jsonl` (the UTC day the entry was appended), fsyncs the file (and the directory
for a new file), and only then moves the cursor. Redis trims nothing above the cursor
(`store.audit.trim`). A process killed at any step loses nothing: entries above the cursor
are still in Redis, and the next pass starts from the newest entry the files hold (a line cut off
by the kill is dropped first, since its entry was never counted as written), so none is written
twice either.

A line holds the entry as Redis holds it: its stream id, seq, prev, hash and the entry's JSON
text, which the hash covers byte for byte.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from store import AuditLink, Store

log = logging.getLogger("ops.audit")

PREFIX, SUFFIX = "audit-", ".jsonl"
LEASE_SECONDS = 30.0  # a mirror silent this long is taken over by another worker
BATCH = 1000  # entries per append and fsync
MOST_BATCHES = 20  # per watchdog pass: the rest waits for the next one
_STREAM_ID = re.compile(r"[0-9]+-[0-9]+")
_TAIL = 1 << 16  # bytes read back from a file's end to find its newest entry

Step = Callable[[str], None]  # told "written" (not yet fsynced) and "synced" (cursor not yet moved)


def directory_from_env(env: Mapping[str, str] | None = None) -> Path | None:
    """`HARNESS_AUDIT_DIR`, or None when it is unset (or empty)."""
    env = os.environ if env is None else env
    raw = env.get("HARNESS_AUDIT_DIR", "").strip()
    return Path(raw) if raw else None


def prepare(directory: Path) -> None:
    """Create the directory (private to this user) and check that it takes files; OSError if not."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    probe = directory / f".{PREFIX}probe-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()


def mirror(
    store: Store, directory: Path, token: str, *, step: Step | None = None, lease: float = LEASE_SECONDS
) -> int:
    """Append the entries the files do not hold yet, batch by batch; how many were appended.
    `step`: told each step (a test kills the process there); `lease`: how long a silent holder
    keeps the files from the others."""
    appended = 0
    for _ in range(MOST_BATCHES):
        done = mirror_batch(store, directory, token, step=step, lease=lease)
        appended += done
        if done < BATCH:
            break
    return appended


def mirror_batch(
    store: Store, directory: Path, token: str, *, step: Step | None = None, lease: float = LEASE_SECONDS
) -> int:
    """One batch: read after the cursor, append, fsync, then move the cursor (if still the lease's
    holder); 0 when another process holds the lease or nothing is new."""
    if not store.audit.take_mirror(token, lease):
        return 0
    cursor = store.audit.mirrored()
    filed = newest_filed(directory)  # newer than the cursor: a mirror was killed before moving it
    start = max((i for i in (cursor, filed) if i), key=_id_key, default="-")
    links = store.audit.links(start, count=BATCH)
    if not links:
        if start != "-" and start != cursor:
            store.audit.advance_mirror(token, start)
        return 0
    _append(directory, links, step)
    if step:
        step("synced")
    store.audit.advance_mirror(token, links[-1].id)
    return len(links)


def read_links(directory: Path) -> list[AuditLink]:
    """Every entry the files hold, oldest first, each once (a batch written again after a kill
    between its fsync and the cursor's move holds the same entries)."""
    seen: dict[str, AuditLink] = {}
    out: list[AuditLink] = []
    for path in files(directory):
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, 1):
                if not raw.endswith(b"\n"):
                    break  # cut off by a kill mid-write: never counted as written
                link = _link_of(raw) or AuditLink(f"{path.name}:{number}", None, None, None, raw.rstrip())
                if seen.get(link.id) == link:
                    continue
                seen[link.id] = link
                out.append(link)
    return out


def files(directory: Path) -> list[Path]:
    """The daily files, oldest day first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX))


def newest_filed(directory: Path) -> str | None:
    """The stream id of the newest entry the files hold; a line cut off at the end of the newest
    file (a kill mid-write) is removed first."""
    for path in reversed(files(directory)):
        size = path.stat().st_size
        with path.open("r+b") as handle:
            handle.seek(max(0, size - _TAIL))
            tail = handle.read()
            if tail and not tail.endswith(b"\n"):
                keep = tail.rfind(b"\n") + 1
                handle.truncate(size - len(tail) + keep)
                tail = tail[:keep]
        lines = tail.splitlines()
        link = _link_of(lines[-1]) if lines else None
        if link is not None:
            return link.id
    return None


def file_for(directory: Path, stream_id: str) -> Path:
    """The daily file of the entry appended at `stream_id`'s time (UTC)."""
    millis = int(stream_id.partition("-")[0])
    day = datetime.fromtimestamp(millis / 1000, UTC).strftime("%Y-%m-%d")
    return directory / f"{PREFIX}{day}{SUFFIX}"


def _append(directory: Path, links: list[AuditLink], step: Step | None) -> None:
    """Append `links` to their daily files and fsync them (and the directory, for a new file)."""
    by_file: dict[Path, list[AuditLink]] = {}
    for link in links:
        by_file.setdefault(file_for(directory, link.id), []).append(link)
    created = False
    for path, batch in by_file.items():
        created |= not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            data = b"".join(_line_of(link) for link in batch)
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            if step:
                step("written")
            os.fsync(fd)
        finally:
            os.close(fd)
    if created:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _line_of(link: AuditLink) -> bytes:
    """The file's line of an entry: ASCII JSON, the entry's bytes kept exactly (surrogateescape)."""
    entry = link.entry.decode("utf-8", "surrogateescape")
    fields = {"id": link.id, "seq": link.seq, "prev": link.prev, "hash": link.hash, "entry": entry}
    return json.dumps(fields, ensure_ascii=True).encode() + b"\n"


def _link_of(raw: bytes) -> AuditLink | None:
    """An entry read back from a line; None if the line is not one."""
    try:
        fields = json.loads(raw)
        entry = fields["entry"].encode("utf-8", "surrogateescape")
        seq = fields["seq"]
        return AuditLink(
            id=str(fields["id"]),
            seq=seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
            prev=fields["prev"] if isinstance(fields["prev"], str) else None,
            hash=fields["hash"] if isinstance(fields["hash"], str) else None,
            entry=entry,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _id_key(stream_id: str) -> tuple[int, int]:
    """A stream id as a sortable pair (milliseconds, sequence)."""
    millis, _, seq = stream_id.partition("-")
    return int(millis), int(seq or 0)


def collect(store: Store, directory: Path | None) -> tuple[list[AuditLink], list[AuditLink]]:
    """The whole audit, oldest first, and the entries Redis holds that the files hold too.

    Redis is read first, the files after: whatever a mirror appends and trims meanwhile is then in
    the files, so nothing falls between the two reads.
    """
    held = list(store.audit.all_links())
    if directory is None:
        return held, []
    filed = read_links(directory)
    newest = max((_id_key(link.id) for link in filed if _STREAM_ID.fullmatch(link.id)), default=(-1, -1))
    copies = [link for link in held if _id_key(link.id) <= newest]
    return filed + [link for link in held if _id_key(link.id) > newest], copies


def audit_pass(store: Store, directory: Path | None, token: str, now: float) -> None:
    """The watchdog's turn at the audit: append what the files lack (when kept), then trim Redis
    by count and age, never above what the files hold. A mirror that fails (a full disk) is logged
    and trims nothing more: entries wait in Redis until it works again."""
    if directory is not None:
        try:
            mirror(store, directory, token)
        except OSError:
            log.exception("cannot append the audit to %s; Redis keeps every entry until it can", directory)
    store.audit.trim(mirrored=directory is not None, now=now)
