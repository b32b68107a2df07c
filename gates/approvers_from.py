"""Approvers computed at the click: `[approvals] approvers_from = "module:function"`.

The static rule (`gates.deciders`: the `approvers`, their groups, four eyes, the quorum) still says
who may click at all. For an approval (Approve, Approve all, an approving edit, each vote of a
quorum) of a call whose tool has a callable (`Approvals.approvers_from_for`), the bot then asks it,
before anything is recorded, whether this clicker may approve this call:

    from gates.approvers_from import ApprovalClick, ApproverAnswer, no, unknown, yes

    def may_approve(click: ApprovalClick) -> ApproverAnswer:
        if click.clicker in on_call_now():
            return yes("on call this week")
        return no("not on call this week")

Only "yes" lets the approval through. "no", "unknown", an exception, anything else returned, and
no answer within `approvers_from_timeout_seconds` all refuse it (fail closed): nothing is recorded,
and the card stays open for someone else. A decline never asks: it runs nothing.

The callable runs in the bot's process, on a thread of its own, so the operator must trust its code
as any module the bot imports: it is handed only its `ApprovalClick` (no client, no token, no
config), but nothing stops its code from reading the process's environment. Each callable is
imported when the bot starts or reloads its config (`check_config`): one that cannot be imported
stops the start (or refuses the reload) with one line naming the key.
"""

from __future__ import annotations

import copy
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from harness.config import Approvals, Config, ConfigError
from harness.policy import call_paths
from harness.state import ClickCheck, PendingCall

log = logging.getLogger(__name__)

REASON_MAX = 300  # characters of a callable's reason kept (in the decision, the audit, the card)
MOST_AT_ONCE = 16  # callables running at once in one process; a stuck one holds its place until it returns


class Answer(StrEnum):
    """A callable's answer: may this clicker approve this call?"""

    YES = "yes"
    NO = "no"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class ApproverAnswer:
    """What a callable returns: its answer, and why (shown on the card or to the clicker, audited)."""

    answer: Answer
    reason: str = ""


def yes(reason: str = "") -> ApproverAnswer:
    return ApproverAnswer(Answer.YES, reason)


def no(reason: str = "") -> ApproverAnswer:
    return ApproverAnswer(Answer.NO, reason)


def unknown(reason: str = "") -> ApproverAnswer:
    return ApproverAnswer(Answer.UNKNOWN, reason)


@dataclass(frozen=True)
class ApprovalClick:
    """What a callable is given: the call as it would run, who clicked, and where.

    `arguments` are what would run: the card's, or the reviewer's when the approval is an edit
    (`edited`); a copy, so changing it changes nothing. `paths`: every string in the tool's path
    arguments (`path_arguments`; as on a directory grant), or None when the park does not know them
    (a call parked by an older release); `stray_paths`: a string that looks like a path sits
    outside them. `workspace` is the bot's `HARNESS_WORKSPACE`, which the paths are relative to.
    """

    tool: str
    arguments: Mapping[str, Any]
    edited: bool
    path_arguments: tuple[str, ...] | None
    paths: tuple[str, ...] | None
    stray_paths: bool
    clicker: str
    requester: str
    team: str
    channel: str
    thread_ts: str
    run_id: str
    call_id: str
    workspace: Path


Check = Callable[[ApprovalClick], Any]


def click_of(
    call: PendingCall,
    *,
    clicker: str,
    record: Any,
    workspace: Path,
    edited: Mapping[str, Any] | None = None,
) -> ApprovalClick:
    """The `ApprovalClick` of `clicker` approving `call` of the run `record` (its `edited` arguments)."""
    arguments = dict(copy.deepcopy(edited if edited is not None else call.input))
    paths: tuple[str, ...] | None = None
    stray = False
    if call.path_args is not None:
        found, stray = call_paths(arguments, call.path_args)
        paths = tuple(found)
    return ApprovalClick(
        tool=call.name,
        arguments=arguments,
        edited=edited is not None,
        path_arguments=call.path_args.paths if call.path_args is not None else None,
        paths=paths,
        stray_paths=stray,
        clicker=clicker,
        requester=record.requester,
        team=record.team,
        channel=record.channel,
        thread_ts=record.thread_ts,
        run_id=record.run_id,
        call_id=call.id,
        workspace=workspace,
    )


def resolve(ref: str) -> Check:
    """The function `ref` ("module:function") names, imported; `ConfigError` saying why not."""
    module_name, _, name = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any import failure is the operator's to fix
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ConfigError(f"cannot import {module_name!r}: {type(exc).__name__}: {first}") from None
    found = getattr(module, name, None)
    if not callable(found):
        raise ConfigError(f"{module_name!r} has no function {name!r}")
    return found


def check_config(config: Config) -> Config:
    """`config`, once every callable it names (top level and profiles) is imported; else the first
    that cannot be is a `ConfigError` naming its key."""
    levels: list[tuple[str, Approvals]] = [("", config.approvals)]
    levels += [(f"profiles[{p.name}].", p.settings.approvals) for p in config.profiles]
    for prefix, approvals in levels:
        for key, ref in approvals.approvers_from_refs():
            try:
                resolve(ref)
            except ConfigError as exc:
                raise ConfigError(f"{prefix}{key} = {ref!r}: {exc}") from None
    return config


class ApproverChecks:
    """Runs callables for the bot's clicks: each on a daemon thread, at most `MOST_AT_ONCE` at once
    in a process, waited for `timeout` seconds at most. Never raises: every failure is an answer
    that refuses. Safe across gunicorn's fork (a child starts with no check running)."""

    def __init__(self, most: int = MOST_AT_ONCE) -> None:
        self._most = most
        self._slots = threading.BoundedSemaphore(most)
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def ask(self, ref: str, click: ApprovalClick, timeout: float) -> ClickCheck:
        """What `ref` answers for `click`, as the decision and the audit keep it."""
        return self.ask_all([(ref, click)], timeout)[0]

    def ask_all(self, asks: list[tuple[str, ApprovalClick]], timeout: float) -> list[ClickCheck]:
        """What each callable answers for its click, asked all at once and waited for `timeout`
        seconds in all (Approve all on a park of many calls takes no longer than one)."""
        deadline = time.monotonic() + timeout
        waiting = [self._start(ref, click) for ref, click in asks]
        answers = []
        for (ref, _), started in zip(asks, waiting, strict=True):
            if isinstance(started, ClickCheck):
                answers.append(started)
                continue
            done, got = started
            if not done.wait(max(0.0, deadline - time.monotonic())) or not got:
                log.warning("approvers_from %s gave no answer within %g s; refused", ref, timeout)
                answers.append(ClickCheck(ref, Answer.UNKNOWN, f"it gave no answer within {timeout:g} s"))
            else:
                answers.append(got[0])
        return answers

    def _start(self, ref: str, click: ApprovalClick) -> ClickCheck | tuple[threading.Event, list[ClickCheck]]:
        """The callable started on a thread of its own (an event set when it has answered, and where
        its answer goes), or the answer that refuses when it cannot be."""
        try:
            check = resolve(ref)
        except ConfigError as exc:  # checked at start; a module gone since fails closed
            log.warning("approvers_from %s: %s", ref, exc)
            return ClickCheck(ref, Answer.UNKNOWN, "it could not be imported")
        slots = self._slots_now()
        if not slots.acquire(blocking=False):
            log.warning("approvers_from %s: %d checks still running; refused", ref, self._most)
            return ClickCheck(ref, Answer.UNKNOWN, f"{self._most} earlier checks have still not returned")
        done = threading.Event()
        got: list[ClickCheck] = []

        def run() -> None:
            try:
                got.append(_answer_of(ref, check(click)))
            except BaseException as exc:  # the callable's failure (even SystemExit) is an answer: it refuses
                log.warning("approvers_from %s raised %s: %s", ref, type(exc).__name__, str(exc)[:200])
                got.append(ClickCheck(ref, Answer.UNKNOWN, f"it raised {type(exc).__name__}"))
            finally:
                done.set()
                slots.release()

        try:
            threading.Thread(target=run, name="approvers-from", daemon=True).start()
        except RuntimeError:  # no thread to be had: no answer
            slots.release()
            return ClickCheck(ref, Answer.UNKNOWN, "it could not be started")
        return done, got

    def _slots_now(self) -> threading.BoundedSemaphore:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: its parent's checks do not run here
                self._slots, self._pid = threading.BoundedSemaphore(self._most), os.getpid()
            return self._slots


def _answer_of(ref: str, returned: Any) -> ClickCheck:
    """A callable's return value as a `ClickCheck`: an `ApproverAnswer`, or a pair (answer, reason)
    with answer "yes", "no" or "unknown"; anything else is unknown (refused)."""
    if isinstance(returned, ApproverAnswer):
        answer, reason = returned.answer, returned.reason
    elif isinstance(returned, tuple) and len(returned) == 2:
        answer, reason = returned
    else:
        return ClickCheck(ref, Answer.UNKNOWN, f"it returned {type(returned).__name__}, not an answer")
    if not isinstance(answer, str) or answer not in set(Answer):
        return ClickCheck(ref, Answer.UNKNOWN, f"it answered {str(answer)[:40]!r}, not yes, no or unknown")
    text = " ".join(str(reason or "").split())
    return ClickCheck(ref, Answer(answer).value, text[:REASON_MAX])
