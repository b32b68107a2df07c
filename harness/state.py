"""A run as a value: its whole state is one JSON-serialisable object.

The conversation is the checkpoint. A state parked while calls await approval holds the
assistant message with their `tool_use` blocks plus one `PendingCall` per block, carrying its
tier, decision and (once run) result. Given the decisions, `harness.loop.step` continues it
exactly where it stopped, in any process.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from harness.policy import PathArgs, Tier
from harness.tools import ToolResult
from harness.tools.inputs import InputAnswer, InputAsk
from harness.tools.tasks import TaskHandle

FORMAT_VERSION = 2  # what `RunState.to_json` writes; `_STATE_READERS` holds what this release reads


class StateError(ValueError):
    """A stored state or a decision that cannot be used; nothing is executed because of it."""


class NewerRecord(StateError):
    """A stored record in a format version newer than this release reads: a newer release wrote it.

    Not malformed: whoever meets one leaves it as it is (a queued run stays queued, a parked one
    parked) for a release that reads it, and never refuses, fails or rewrites it. `what` names the
    record, `found` its version, `known` the versions this release reads.
    """

    def __init__(self, what: str, found: int, known: Collection[int]) -> None:
        self.what, self.found, self.known = what, found, tuple(sorted(known))
        super().__init__(
            f"stored {what} has format version {found}, newer than this release reads "
            f"({_versions(self.known)}): a newer release wrote it"
        )


def _versions(known: Collection[int]) -> str:
    listed = sorted(known)
    return ("version " if len(listed) == 1 else "versions ") + ", ".join(str(v) for v in listed)


def format_version(data: Any, what: str, known: Collection[int], *, unversioned: int | None = None) -> int:
    """The format version of `data`, a stored JSON object, when it is one this release reads.

    `unversioned`: the version of an object written with no `version` (before it carried one).
    A version newer than every one in `known` raises `NewerRecord`; any other (older, missing, not a
    number, `data` not an object) `StateError`: refused, never misread.
    """
    found = data.get("version", unversioned) if isinstance(data, dict) else None
    if isinstance(found, int) and not isinstance(found, bool):
        if found in known:
            return found
        if known and found > max(known):
            raise NewerRecord(what, found, known)
    raise StateError(
        f"stored {what} has format version {found!r}; this release reads {_versions(known)}, "
        "so it is refusing to use it"
    )


class Status(StrEnum):
    """Where a run is."""

    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_LIMIT = "awaiting_limit"  # at max_turns or token_budget with on_limit = "ask"
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"


class Verdict(StrEnum):
    """A human's answer to an `ask` call (or the clock's, when nobody answered)."""

    APPROVED = "approved"
    DECLINED = "declined"
    EXPIRED = "expired"


class GrantUse(StrEnum):
    """How a grant ("Approve for this thread", or for a directory) bears on a decision."""

    GIVEN = "given"  # this click granted it
    USED = "used"  # an earlier such grant let the call run


@dataclass(frozen=True)
class ClickCheck:
    """What an `[approvals] approvers_from` callable answered at the click that approved a call:
    the callable (`module:function`), its answer (yes, no, unknown) and its reason (cut, untrusted)."""

    ref: str
    answer: str
    reason: str = ""

    def to_json(self) -> dict[str, str]:
        return {"function": self.ref, "answer": self.answer, "reason": self.reason}

    @classmethod
    def from_json(cls, data: Any) -> ClickCheck | None:
        """As `to_json` wrote it; None for anything else."""
        if not isinstance(data, dict) or not isinstance(data.get("function"), str):
            return None
        return cls(data["function"], str(data.get("answer") or ""), str(data.get("reason") or ""))


@dataclass(frozen=True)
class Decision:
    """Who decided an `ask` call, how, and optionally why.

    `edited_input`: a reviewer approved the call with these arguments instead of the model's.
    `approvers`: with a quorum, everyone whose approval counted (`by` made it complete).
    `grant`: approved for the thread (`by` granted it), or let run by an earlier such grant.
    `grant_dir`: that grant covers only calls whose paths lie in this directory (`docs/`).
    `grant_uses`, `grant_left`: a grant limited in uses, and how many were left after this call.
    `check`: what the `approvers_from` callable answered at the click that approved it.
    """

    verdict: Verdict
    by: str | None = None
    reason: str | None = None
    edited_input: dict[str, Any] | None = None
    approvers: tuple[str, ...] = ()
    grant: GrantUse | None = None
    grant_dir: str | None = None
    grant_uses: int = 0  # 0: not limited
    grant_left: int | None = None
    check: ClickCheck | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"verdict": self.verdict.value, "by": self.by, "reason": self.reason}
        if self.edited_input is not None:
            data["edited_input"] = self.edited_input
        if self.approvers:
            data["approvers"] = list(self.approvers)
        if self.grant:
            data["grant"] = self.grant
        if self.grant_dir:
            data["grant_dir"] = self.grant_dir
        if self.grant_uses:
            data["grant_uses"] = self.grant_uses
        if self.grant_left is not None:
            data["grant_left"] = self.grant_left
        if self.check is not None:
            data["approvers_from"] = self.check.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Decision:
        edited = data.get("edited_input")
        return cls(
            Verdict(data["verdict"]),
            data.get("by"),
            data.get("reason"),
            edited_input=edited if isinstance(edited, dict) else None,
            approvers=tuple(str(a) for a in data.get("approvers") or ()),
            grant=GrantUse(data["grant"]) if data.get("grant") in set(GrantUse) else None,
            grant_dir=str(data["grant_dir"]) if data.get("grant_dir") else None,
            grant_uses=int(data.get("grant_uses") or 0),
            grant_left=int(data["grant_left"]) if data.get("grant_left") is not None else None,
            check=ClickCheck.from_json(data.get("approvers_from")),
        )


@dataclass(frozen=True)
class PendingCall:
    """One `tool_use` block of the current turn and everything decided about it so far."""

    id: str
    name: str
    input: dict[str, Any]
    tier: Tier
    decision: Decision | None = None
    result: ToolResult | None = None
    started: bool = False  # write-ahead mark: set (and persisted) before a side-effecting call runs
    why: str = ""  # the step, key or rule of the policy that gave the tier (cards, summaries, audit)
    # Which arguments of its tool hold paths, as the worker that ruled the call knew the tool: what
    # a directory grant's scope is computed from, by the bot too. None: not known (a call ruled
    # before calls carried it), so no directory grant is offered for it or covers it.
    path_args: PathArgs | None = None
    # The call's server asked a person for input (`harness.tools.inputs`): the call waits for the
    # answers, then goes again with them. Nothing ran yet, so it is not `started`.
    asking: InputAsk | None = None
    # The call's server works on it as a task (`harness.tools.tasks`): it started, and its result
    # comes once the task ends.
    tasking: TaskHandle | None = None

    @property
    def waits_on_task(self) -> bool:
        """Whether this call waits for its server's task to end."""
        return self.tasking is not None and self.result is None

    @property
    def waits_for_input(self) -> bool:
        """Whether this call waits for a person to answer its server's question."""
        return self.asking is not None and self.asking.next_question is not None and self.result is None

    @property
    def signature(self) -> str:
        """`name(json-of-input)`, the unit of the no-progress valve."""
        return f"{self.name}({canonical_json(self.input)})"

    @property
    def fingerprint(self) -> str:
        """What a decision binds to: the tool and its exact arguments (16 hex digits of SHA-256)."""
        return fingerprint(self.name, self.input)

    @property
    def awaiting(self) -> bool:
        """Whether this call still needs a human decision before it may run."""
        return self.tier is Tier.ASK and self.decision is None and self.result is None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "input": self.input,
            "tier": self.tier.value,
            "decision": self.decision.to_json() if self.decision else None,
            "result": self.result.to_json() if self.result else None,
            "started": self.started,
            "why": self.why,
        }
        if self.path_args is not None:
            data["path_args"] = self.path_args.to_json()
        if self.asking is not None:
            data["asking"] = self.asking.to_json()
        if self.tasking is not None:
            data["tasking"] = self.tasking.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PendingCall:
        return cls(
            id=data["id"],
            name=data["name"],
            input=data["input"],
            tier=Tier(data["tier"]),
            decision=Decision.from_json(data["decision"]) if data.get("decision") else None,
            result=ToolResult.from_json(data["result"]) if data.get("result") else None,
            started=bool(data.get("started", False)),
            why=str(data.get("why", "")),
            path_args=PathArgs.from_json(data.get("path_args")),
            asking=InputAsk.from_json(data["asking"]) if isinstance(data.get("asking"), dict) else None,
            tasking=TaskHandle.from_json(data["tasking"]) if isinstance(data.get("tasking"), dict) else None,
        )


@dataclass(frozen=True)
class Usage:
    """Tokens billed so far, by kind; `total` is what the token-budget valve counts."""

    input: int = 0
    output: int = 0
    cache_creation: int = 0
    cache_read: int = 0

    @property
    def total(self) -> int:
        return self.input + self.output + self.cache_creation + self.cache_read

    def plus(self, other: Usage) -> Usage:
        return Usage(
            self.input + other.input,
            self.output + other.output,
            self.cache_creation + other.cache_creation,
            self.cache_read + other.cache_read,
        )


@dataclass(frozen=True)
class RunState:
    """The whole of a run: conversation, counters, spin history and the current turn's calls."""

    messages: tuple[dict[str, Any], ...]
    status: Status = Status.RUNNING
    turns: int = 0
    requests: int = 0
    usage: Usage = field(default_factory=Usage)
    signatures: tuple[str, ...] = ()
    pending: tuple[PendingCall, ...] = ()
    # Granted by Continue at a limit (on_limit = "ask"): the valves allow max_turns + extra_turns
    # turns and token_budget + extra_tokens tokens. `at_limit`: the valve the run waits at, or "".
    extra_turns: int = 0
    extra_tokens: int = 0
    at_limit: str = ""
    # Continue at the daily budget (valve `budget`): below this many tokens of its own usage the run
    # may make requests past the budget (they are still counted). 0: never granted.
    past_budget_until: int = 0

    @property
    def awaiting(self) -> tuple[PendingCall, ...]:
        """The calls of this turn that still need a decision."""
        return tuple(c for c in self.pending if c.awaiting)

    @property
    def waiting_on_task(self) -> tuple[PendingCall, ...]:
        """The calls of this turn whose server's task has not ended yet."""
        return tuple(c for c in self.pending if c.waits_on_task)

    @property
    def waiting_for_input(self) -> tuple[PendingCall, ...]:
        """The calls of this turn whose server waits for a person's answer."""
        return tuple(c for c in self.pending if c.waits_for_input)

    def to_json(self) -> dict[str, Any]:
        """A plain dict for `json.dumps`; read back with `RunState.from_json`."""
        return {
            # A state with a call waiting for input or on a task is of version 2, which 0.2.0 does not
            # read (it leaves the run for a newer worker); any other is written as version 1, as before.
            "version": FORMAT_VERSION if any(c.asking or c.tasking for c in self.pending) else 1,
            "messages": list(self.messages),
            "status": self.status.value,
            "turns": self.turns,
            "requests": self.requests,
            "usage": [self.usage.input, self.usage.output, self.usage.cache_creation, self.usage.cache_read],
            "signatures": list(self.signatures),
            "pending": [c.to_json() for c in self.pending],
            "extra_turns": self.extra_turns,
            "extra_tokens": self.extra_tokens,
            "at_limit": self.at_limit,
            "past_budget_until": self.past_budget_until,
        }

    @classmethod
    def from_json(cls, data: Any) -> RunState:
        """Read a stored state of any version this release reads (`_STATE_READERS`); a newer one
        raises `NewerRecord`, one of another version or shape `StateError`."""
        reader = _STATE_READERS[format_version(data, "run state", _STATE_READERS)]
        try:
            return reader(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"stored run state is malformed ({exc!r}); refusing to resume it") from None

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def loads(cls, text: str | bytes) -> RunState:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise StateError(f"stored run state is not JSON ({exc}); refusing to resume it") from None
        return cls.from_json(data)


def _state_v1(data: dict[str, Any]) -> RunState:
    return RunState(
        messages=tuple(data["messages"]),
        status=Status(data["status"]),
        turns=int(data["turns"]),
        requests=int(data["requests"]),
        usage=Usage(*(int(n) for n in data["usage"])),
        signatures=tuple(str(s) for s in data["signatures"]),
        pending=tuple(PendingCall.from_json(c) for c in data["pending"]),
        # Absent from states stored before limits could ask: nothing granted, not waiting.
        extra_turns=int(data.get("extra_turns", 0)),
        extra_tokens=int(data.get("extra_tokens", 0)),
        at_limit=str(data.get("at_limit", "")),
        past_budget_until=int(data.get("past_budget_until", 0)),
    )


# Every version of a stored state this release reads, and how: a release keeps the reader of the
# version the release before it wrote (tests/harness/test_formats.py loads one of each).
_STATE_READERS: dict[int, Callable[[dict[str, Any]], RunState]] = {1: _state_v1, 2: _state_v1}
STATE_VERSIONS = frozenset(_STATE_READERS)


def newer_state(data: Any) -> None:
    """Raise `NewerRecord` when `data`, a stored state, is of a version newer than this release
    reads (a record holding it was written by a newer release); anything else passes, to be
    refused or read by `RunState.from_json` when the state is used."""
    version = data.get("version") if isinstance(data, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > max(STATE_VERSIONS):
        raise NewerRecord("run state", version, STATE_VERSIONS)


def fingerprint(name: str, arguments: Any) -> str:
    """The fingerprint of a call of `name` with `arguments`: equal calls, equal fingerprints."""
    text = canonical_json({"name": name, "input": arguments})
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted keys: equal inputs give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def new_run(task: str, history: tuple[dict[str, Any], ...] = ()) -> RunState:
    """A fresh run of `task`, continuing the conversation `history` (empty for a new one)."""
    task = task.strip()
    if not task:
        raise ValueError("a run needs a non-empty task")
    block = {"type": "text", "text": task}
    if history and history[-1]["role"] == "user":
        # The last run ended on tool results (a stop); the new words join that user message.
        last = history[-1]
        content = (
            last["content"]
            if isinstance(last["content"], list)
            else [{"type": "text", "text": last["content"]}]
        )
        messages = (*history[:-1], {"role": "user", "content": [*content, block]})
    else:
        messages = (*history, {"role": "user", "content": [block]})
    return RunState(messages=messages)


def record_decisions(state: RunState, decisions: dict[str, Decision]) -> RunState:
    """`state` with human decisions applied; an unknown or already decided id is refused."""
    by_id = {c.id: c for c in state.pending}
    for call_id in decisions:
        call = by_id.get(call_id)
        if call is None:
            raise StateError(f"no pending call with id {call_id!r} in this run")
        if not call.awaiting:
            raise StateError(f"call {call_id!r} ({call.name}) is not awaiting a decision")
    pending = tuple(replace(c, decision=decisions[c.id]) if c.id in decisions else c for c in state.pending)
    return replace(state, pending=pending)


def record_task_result(state: RunState, call_id: str, result: ToolResult) -> RunState:
    """`state` with the task of call `call_id` ended: `result` answers it (others unchanged)."""
    pending = tuple(
        replace(c, result=result) if c.id == call_id and c.waits_on_task else c for c in state.pending
    )
    return replace(state, pending=pending)


def record_input_answers(state: RunState, answers: dict[str, InputAnswer]) -> RunState:
    """`state` with each call's open question answered (`answers` by call id); others unchanged."""
    pending = []
    for call in state.pending:
        answer = answers.get(call.id)
        if answer is not None and call.asking is not None and (question := call.asking.next_question):
            call = replace(call, asking=call.asking.answered(question.key, answer))
        pending.append(call)
    return replace(state, pending=tuple(pending))
