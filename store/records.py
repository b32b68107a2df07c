"""The run record and how it is stored.

`RunRecord` is a run as the Slack side knows it. It is stored as JSON with a format version, read
by the reader of its version (`_RECORD_READERS`: this release's and the one before it wrote); one
newer than this release reads raises `NewerRecord` (left as it is for a newer release), any other
is refused, never misread. It is zlib-compressed when that pays (`pack`, `unpack`), or, save after
save, packed a message of its conversation at a time (`RecordEncoder`, `z2:`).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from harness.state import NewerRecord, RunState, StateError, format_version, newer_state
from store.keys import DAY

RECORD_VERSION = 2  # what `to_json` writes (2: per-park approvals, the outbox); read: `RECORD_VERSIONS`
FINISHED_RUN_TTL = 7 * DAY
AUDIT_PREVIEW_CHARS = 500
IM = "im"  # RunRecord.surface of a run asked for in a direct message (or the assistant pane)


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"


ENDED = (RunStatus.FINISHED, RunStatus.STOPPED, RunStatus.FAILED)


LIMIT_CALL = "limit"  # the one "call" of a park at a limit (on_limit = "ask"); tool_use ids are toolu_…


def _text(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _optional_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _mapping(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class CallTool:
    """What a parked call's card and edit modal need of its tool and of the reply, kept from the
    park (`RunRecord.call_tools`): read back field by field, a stored value of the wrong type as unset."""

    intent: str = ""  # the model's own words in the reply that made the call
    schema: dict[str, Any] | None = None  # the tool's input schema
    own_tier: str | None = None  # the tool's own tier (an MCP read-only hint believed), if any
    own_why: str = ""
    title: str | None = None
    annotations: dict[str, Any] | None = None
    preview: str | None = None  # what the call would change, drawn by the tool's `preview`

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v for k, v in data.items() if v not in (None, "")}

    @classmethod
    def from_json(cls, data: Any) -> CallTool:
        found = data if isinstance(data, dict) else {}
        return cls(
            intent=_text(found.get("intent")),
            schema=_mapping(found.get("schema")),
            own_tier=_optional_text(found.get("own_tier")),
            own_why=_text(found.get("own_why")),
            title=_optional_text(found.get("title")),
            annotations=_mapping(found.get("annotations")),
            preview=_optional_text(found.get("preview")),
        )


@dataclass(frozen=True)
class LimitAsk:
    """What the card of a run parked at a limit asks, kept from the park (`call_tools[LIMIT_CALL]`)."""

    question: str = ""
    reason: str = ""  # the stop's own words, used if the answer is Stop (or none comes)
    more: str = ""  # what Continue would allow

    def to_json(self) -> dict[str, Any]:
        return {"question": self.question, "reason": self.reason, "more": self.more}

    @classmethod
    def from_json(cls, data: Any) -> LimitAsk:
        found = data if isinstance(data, dict) else {}
        return cls(_text(found.get("question")), _text(found.get("reason")), _text(found.get("more")))


@dataclass
class RunRecord:
    """A run as the Slack side knows it: where it talks, who asked, its harness state, what it owes Slack."""

    run_id: str
    team: str
    channel: str
    thread_ts: str
    requester: str
    task: str
    status: RunStatus = RunStatus.QUEUED
    state: dict[str, Any] | None = None  # RunState.to_json(); None until the run starts
    cards: dict[str, str] = field(default_factory=dict)  # tool_use_id -> ts of its approval card
    park_id: int = 0  # increases every time the run parks; keys the park's approvals
    expires_at: float | None = None
    failure_ts: str | None = None
    error: str | None = None
    created_at: float = field(default_factory=time.time)
    # The transactional outbox: messages the run owes Slack, saved in the same write as the state
    # that owes them, removed once delivered (see workers.delivery).
    outbox: list[dict[str, Any]] = field(default_factory=list)
    posted: int = 0  # how many posts the run has queued so far: keys its messages for reconciliation
    recoveries: int = 0  # how often the watchdog re-drove it after its driver died
    history_seq: int = 0  # the thread history's `seq` this run continued; its save is refused if it moved on
    # For each parked call: what its card and the edit modal need of its tool (schema, own tier,
    # title, annotations) and of the reply (the model's words, a preview), kept from the park.
    call_tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    working_ts: str | None = None  # the "Working on it…" message that carries the Stop button
    stopped_by: str | None = None  # who pressed Stop, once the run ended because of it
    surface: str = "channel"  # where it was asked for: "channel" (a mention) or IM (a direct message)
    asked_ts: str | None = None  # the message that asked (it carries the :eyes:); None: thread_ts
    # What Slack shows of the run (workers.thread_status): per status method, the status it last
    # showed, or "refused" once Slack refused it for this run (then it is not called again).
    status_shown: dict[str, str] = field(default_factory=dict)
    # The `[[profiles]]` name the run started under ("": the top level), for metrics and the audit;
    # its settings are always its channel's profile as configured now (`Services.settings_of`).
    profile: str = ""
    extensions: int = 0  # how many times Extend has moved this park's expiry later
    # The live message (workers.live) of the turn the run parked in: its turn summary settles into it.
    live_ts: str | None = None
    # The run's trace: the W3C traceparent of its root span, made at the mention ("": untraced), and
    # when its current park began, where each `await_approval` span starts (observe.tracing).
    trace: str = ""
    parked_since: float | None = None

    def parked_at(self, expire_after_minutes: float) -> float | None:
        """When the current park was made: its expiry less `expire_after_minutes` for it and for
        each Extend since (each moved the expiry that much later)."""
        if self.expires_at is None:
            return None
        return self.expires_at - expire_after_minutes * 60 * (1 + max(0, int(self.extensions)))

    def call_tool(self, call_id: str) -> CallTool:
        """What the park kept for the card of call `call_id` (nothing kept: an empty `CallTool`)."""
        return CallTool.from_json(self.call_tools.get(call_id))

    def limit_ask(self) -> LimitAsk:
        """What the park at a limit kept for its card (under `LIMIT_CALL`)."""
        return LimitAsk.from_json(self.call_tools.get(LIMIT_CALL))

    @property
    def thread(self) -> tuple[str, str, str]:
        return (self.team, self.channel, self.thread_ts)

    def audit_fields(self, call: Any = None) -> dict[str, Any]:
        """What the audit log keeps besides who decided and how: where, what, the input's hash and preview."""
        raw_input = getattr(call, "input", None)
        text = json.dumps(raw_input, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        preview = text if len(text) <= AUDIT_PREVIEW_CHARS else text[:AUDIT_PREVIEW_CHARS] + "…"
        return {
            "team": self.team,
            "channel": self.channel,
            "thread_ts": self.thread_ts,
            "requester": self.requester,
            "tool": getattr(call, "name", None),
            "input_sha256": hashlib.sha256(text.encode("utf-8", "replace")).hexdigest(),
            "input_chars": len(text),
            "input_preview": preview,
            "tier_why": getattr(call, "why", "") or "",  # the policy step, key or rule that asked
            "fingerprint": getattr(call, "fingerprint", None),
        }

    def run_state(self) -> RunState:
        if self.state is None:
            raise StateError(f"run {self.run_id} has no harness state yet")
        return RunState.from_json(self.state)

    def to_json(self) -> str:
        return _dumps(self.json_fields())

    def json_fields(self) -> dict[str, Any]:
        """What `to_json` writes: the version and every field, as JSON values."""
        # Shallow: every field already holds JSON values, and `asdict` deep-copied the whole
        # conversation on every checkpoint (most of a worker's own cost per turn).
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["status"] = self.status.value
        return {"version": RECORD_VERSION, **data}

    @classmethod
    def from_json(cls, raw: str | bytes) -> RunRecord:
        """Read a stored record of any version this release reads. One newer than it reads, or
        holding a harness state newer than it reads, raises `NewerRecord`; anything else it cannot
        read `StateError`."""
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise StateError(f"stored run record is not JSON ({exc}); refusing to use it") from None
        reader = _RECORD_READERS[format_version(data, "run record", RECORD_VERSIONS)]
        del data["version"]
        newer_state(data.get("state"))  # a state only a newer harness reads: the record is the newer's
        try:
            record = reader(data)
        except (TypeError, ValueError, KeyError) as exc:
            raise StateError(f"stored run record is malformed ({exc!r}); refusing to use it") from None
        if not isinstance(record.profile, str):
            raise StateError(
                "stored run record names its profile with something not text; refusing to use it"
            )
        return record


def _record_v2(data: dict[str, Any]) -> RunRecord:
    data["status"] = RunStatus(data["status"])
    return RunRecord(**data)


# Every version of a stored run record this release reads, and how: a release keeps the reader of
# the version the release before it wrote (tests/store/test_formats.py loads one of each).
_RECORD_READERS: dict[int, Callable[[dict[str, Any]], RunRecord]] = {2: _record_v2}
RECORD_VERSIONS = frozenset(_RECORD_READERS)


_PACKED = b"z1:"  # zlib, level 1: conversations shrink 3-10x (tests/bench/bench_state.py)
_SPLIT = b"z2:"  # zlib of the conversation first, then the rest of the record (`RecordEncoder`)
# A packing is tagged `z<N>:` (plain JSON starts with `{`): N is its version, plain JSON 0. A tag of a
# packing this release does not know was written by a newer release (`NewerRecord`), not garbage.
_TAG = re.compile(rb"z([0-9]{1,6}):")
PACKINGS = frozenset({0, 1, 2})
_PACK_ABOVE = 1024
_LEVEL = 1


def pack(text: str) -> bytes:
    """What a record is stored as: JSON, zlib-compressed (and tagged) when that pays."""
    raw = text.encode()
    return _PACKED + zlib.compress(raw, _LEVEL) if len(raw) > _PACK_ABOVE else raw


def unpack(stored: bytes | str) -> str:
    """The JSON text of a stored record, compressed or not; garbage raises `StateError`, a packing
    of a newer release `NewerRecord`."""
    data = stored.encode() if isinstance(stored, str) else stored
    tag = _TAG.match(data)
    if tag is not None and int(tag.group(1)) not in PACKINGS:
        raise NewerRecord("record's packing", int(tag.group(1)), PACKINGS)
    try:
        if data.startswith(_PACKED):
            data = zlib.decompress(data[len(_PACKED) :])
        elif data.startswith(_SPLIT):
            messages, newline, rest = zlib.decompress(data[len(_SPLIT) :]).partition(b"\n")
            if not newline:
                raise zlib.error("no end to its conversation")
            data = rest + messages + b"}}"  # the messages close the state, which closes the record
        return data.decode()
    except (zlib.error, UnicodeDecodeError) as exc:
        raise StateError(f"stored record cannot be decoded ({exc}); refusing to use it") from None


def peek(stored: bytes | str) -> dict[str, str]:
    """What a stored record this release cannot read shows of itself, for an operator's eyes only
    (its status, where, who asked): those top-level fields that are text; {} when not even that."""
    try:
        data = json.loads(unpack(stored))
    except ValueError:  # StateError, NewerRecord among them
        return {}
    if not isinstance(data, dict):
        return {}
    wanted = ("status", "team", "channel", "thread_ts", "requester")
    return {name: data[name] for name in wanted if isinstance(data.get(name), str)}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class RecordEncoder:
    """Packs the records of one run save after save, encoding and compressing each message of its
    conversation once instead of the whole conversation on every save.

    A record is mostly its conversation, which only grows: `pack` re-encoded it to JSON and
    re-compressed it all on every save, twice a tool turn, so a worker's cost per turn grew with
    the conversation faster than the model request's own encoding (tests/bench/bench_overhead.py).
    Here a zlib compressor keeps the messages already seen; a save copies it and compresses only
    the messages after them and the rest of the record.

    Stored as `z2:` and zlib of `M "\n" R`: M is the JSON array of the messages, R the record's
    JSON up to where they go (the state last in the record, the messages last in the state), so the
    record's JSON is `R M "}}"` (`unpack`). JSON as `json.dumps` writes it has no raw newline.

    A message is recognised by identity: the harness never changes one in place (it builds new
    messages, as a `pause_turn` merge replaces the last one). Any other sequence (an older state,
    cleared results) starts the compressor again. The last message is kept out of the compressor
    until another follows it, since it is the one that may be replaced.
    """

    def __init__(self) -> None:
        self._restart()

    def _restart(self) -> None:
        self._kept: list[dict[str, Any]] = []  # the messages in the compressor, in order
        self._compressor = zlib.compressobj(_LEVEL)
        self._out = bytearray(_SPLIT)  # what the compressor gave out so far
        self._last: tuple[Any, bytes] | None = None  # the last message and its JSON, from the last save

    def encode(self, record: RunRecord) -> bytes:
        fields_ = record.json_fields()
        state = fields_.pop("state")
        messages = state.get("messages") if isinstance(state, dict) else None
        if not isinstance(messages, list) or not messages:
            return pack(_dumps({**fields_, "state": state}))
        kept = self._kept
        if len(messages) <= len(kept) or any(m is not k for m, k in zip(messages, kept, strict=False)):
            self._restart()
            kept = self._kept
        for message in messages[len(kept) : -1]:
            self._out += self._compressor.compress((b"," if kept else b"[") + self._json(message))
            kept.append(message)
        rest = {k: v for k, v in state.items() if k != "messages"}
        tail = b"".join(
            (
                b"," if kept else b"[",
                self._json(messages[-1], last=True),
                b"]\n",
                _dumps(fields_)[:-1].encode(),
                b',"state":',
                _dumps(rest)[:-1].encode(),
                b"," if rest else b"",
                b'"messages":',
            )
        )
        compressor = self._compressor.copy()
        return bytes(self._out) + compressor.compress(tail) + compressor.flush()

    def _json(self, message: Any, *, last: bool = False) -> bytes:
        if self._last is not None and self._last[0] is message:
            text = self._last[1]
        else:
            text = _dumps(message).encode()
        self._last = (message, text) if last else None
        return text
