"""`python -m workers audit export`: every entry of the decisions' audit, for an auditor's tools.

JSON lines (each entry's own fields, its time in ISO 8601, and its place in the chain: `seq`,
`stream_id`, `prev`, `hash`) or CSV (one column per field an auditor asks about, then the whole
entry as JSON). The answers' feedback is not in it: it has a stream of its own, apart.

Entries hold text from the model and from Slack: JSON lines are ASCII (every other character
escaped), and no CSV cell reaches a terminal as a control sequence or a spreadsheet as a formula.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import IO, Any

from ops.audit import _safe
from store import AuditLink

FORMATS = ("jsonl", "csv")
COLUMNS = (
    "time",
    "verdict",
    "by",
    "tool",
    "fingerprint",
    "input_sha256",
    "input_preview",
    "reason",
    "approvers",
    "grant",
    "approvers_from",
    "tier_why",
    "run_id",
    "park_id",
    "call_id",
    "team",
    "channel",
    "thread_ts",
    "requester",
    "seq",
    "stream_id",
    "prev",
    "hash",
    "entry",
)
_FORMULA = ("=", "+", "-", "@", "\t", "\r")  # a cell starting so is a formula to a spreadsheet


def since_of(text: str) -> float:
    """`--since`: an ISO 8601 date or time (UTC unless it says otherwise), as epoch seconds."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def rows(links: Iterable[AuditLink], since: float | None = None) -> Iterator[dict[str, Any]]:
    """Each entry at or after `since` as one flat record: its fields, its time and its chain."""
    for link in links:
        entry = link.fields()
        at = entry.get("at")
        if not isinstance(at, int | float) or isinstance(at, bool):
            at = int(link.id.partition("-")[0]) / 1000 if link.id[:1].isdigit() else None
        if since is not None and (at is None or at < since):
            continue
        when = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds") if at is not None else None
        chain = {"seq": link.seq, "stream_id": link.id, "prev": link.prev, "hash": link.hash}
        yield {"time": when, **entry, **chain}


def write(records: Iterable[dict[str, Any]], out: IO[str], fmt: str) -> int:
    """Write `records` to `out` as JSON lines or CSV; how many."""
    count = 0
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(COLUMNS)
        for record in records:
            writer.writerow(_cells(record))
            count += 1
        return count
    for record in records:
        out.write(json.dumps(record, ensure_ascii=True, default=str) + "\n")
        count += 1
    return count


def _cells(record: dict[str, Any]) -> list[str]:
    """A CSV row: the columns, then the whole entry as ASCII JSON."""
    entry = {k: v for k, v in record.items() if k not in ("time", "seq", "stream_id", "prev", "hash")}
    values = {**record, "verdict": record.get("verdict") or record.get("event")}
    cells = [_cell(values.get(column)) for column in COLUMNS[:-1]]
    return [*cells, json.dumps(entry, ensure_ascii=True, default=str, sort_keys=True)]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        text = ",".join(str(v) for v in value)
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    text = _safe(text)
    return "'" + text if text.startswith(_FORMULA) else text
