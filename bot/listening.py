"""What every listener shares: its dependencies, how it runs, who clicked, and the reply after.

Listeners run before Slack gets its answer (`process_before_response=True`), so the job is in
Redis before the 200 and a Redis failure answers 500 (Slack retries). That is why each one does
Redis work only; Slack Web API calls happen in jobs, or on a background thread after the answer
(`listener` hands each handler's `after` to `Background`). The one exception is `views.open`,
whose trigger_id lives 3 s.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

import redis
import rq
from slack_bolt import Ack, BoltContext
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from gates import deciders
from gates.approvers_from import ApproverChecks
from harness.config import Config
from harness.state import NewerRecord, StateError
from messages import texts
from messages.blocks import notice
from observe import logs
from runtime.queue import enqueue_run_job
from runtime.reload import LiveConfig
from store import (
    BadId,
    RunRecord,
    Store,
)

log = logging.getLogger(__name__)

START_RUN = "workers.jobs.start_run"
APPLY_DECISIONS = "workers.jobs.apply_decisions"
SHOW_NEW_EXPIRY = "workers.jobs.show_new_expiry"
RETRY_RUN = "workers.jobs.retry_run"
HONOUR_STOP = "workers.jobs.honour_stop"
REPLY = "ephemeral_reply"  # context key: what the background reply tells the clicker
DEPS = "harness_deps"  # context key: the listener's `BotDeps`, for what runs after the answer
# A text, or a text and the users (one id or several) it names by placeholder.
Reply = str | tuple[str, Mapping[str, str | Sequence[str]]]
AFTER_THREADS = "slack-after"  # the threads that make Slack calls after the answer
# What a surface registers each listener with: a handler run before Slack gets its answer, and a
# Slack call made after it (`listener`).
Then = Callable[[Callable[..., None], Callable[..., None]], Callable[..., None]]
R = TypeVar("R")  # what a button's value names besides its run


class Background:
    """A small thread pool for Slack calls made after the answer; safe across gunicorn's fork."""

    def __init__(self, workers: int = 4) -> None:
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():  # a forked child has no threads
                self._pool = ThreadPoolExecutor(
                    self._workers, thread_name_prefix=AFTER_THREADS, initializer=_name_os_thread
                )
                self._pid = os.getpid()
            self._pool.submit(contextvars.copy_context().run, _logged, fn, *args)  # its lines name the run


def _name_os_thread() -> None:
    """Name the calling thread for the OS too (`top -H`, /proc/PID/task/TID/comm; Linux only), so
    the CPU of the calls made after the answer can be told apart (tests/bench/bench_ack.py)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(15, AFTER_THREADS.encode())  # 15: PR_SET_NAME


def _logged(fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # a courtesy call must never take a thread down silently
        log.exception("background Slack call %s failed", getattr(fn, "__name__", fn))


@dataclass(frozen=True, init=False)
class BotDeps:
    """What the listeners need: the store, the queue and the config.

    The config is `live`: a reload (SIGHUP) swaps it, and `config` reads the one in force now.
    A listener reads it once per request and keeps that value.
    """

    store: Store
    queue: rq.Queue
    live: LiveConfig
    background: Background
    groups: deciders.GroupDirectory
    checks: ApproverChecks

    def __init__(
        self,
        store: Store,
        queue: rq.Queue,
        config: Config | LiveConfig,
        background: Background | None = None,
        groups: deciders.GroupDirectory | None = None,
        checks: ApproverChecks | None = None,
    ) -> None:
        set_field = functools.partial(object.__setattr__, self)  # frozen: fields are set once, here
        set_field("store", store)
        set_field("queue", queue)
        set_field("live", config if isinstance(config, LiveConfig) else LiveConfig(config))
        set_field("background", Background() if background is None else background)
        set_field("groups", deciders.GroupDirectory() if groups is None else groups)
        set_field("checks", ApproverChecks() if checks is None else checks)

    @property
    def config(self) -> Config:
        """The top-level config in force now (a reload may swap it between two reads)."""
        return self.live.current

    def settings_of(self, record: RunRecord) -> Config:
        """The settings of `record`'s run now: its channel's profile as configured now. That is the
        profile it started under while the channel still maps to it (as configured now), else the
        one the channel maps to now: a run never outlives its channel's rules."""
        return self.config.for_run(record.channel, record.team)

    def no_more_work(self, record: RunRecord) -> tuple[str, dict[str, Any]] | None:
        """Why no model work may be started or extended for `record` now (Retry, Continue, Extend):
        its requester is not among its channel's profile's `requesters` as configured now; None when
        it may go on. The same rule as a mention's, so an old run never outlives its channel's rules."""
        settings = self.settings_of(record)
        requesters = settings.requesters
        if not requesters or self.groups.includes(self.store, record.team, record.requester, requesters):
            return None
        return texts.NOT_A_REQUESTER_NOW.format(profile=settings.profile_label), {"who": list(requesters)}

    def enqueue(self, func: str, run_id: str, *args: Any) -> None:
        """Enqueue a job about `run_id` with the retry policy every job gets."""
        enqueue_run_job(self.store, self.queue, func, run_id, *args)

    def may_decide(self, user: str, record: RunRecord) -> bool:
        """Whether `user` may decide `record` now (`gates.deciders.may_decide`)."""
        approvals = self.settings_of(record).approvals
        return deciders.may_decide(user, record, approvals=approvals, groups=self.groups, store=self.store)

    def deciders(self, record: RunRecord) -> list[str]:
        """Who may decide `record` now, users and user groups (`gates.deciders.deciders`)."""
        return deciders.deciders(self.settings_of(record).approvals, record)


def listener(
    deps: BotDeps, client: WebClient, handler: Callable[..., None], after: Callable[..., None]
) -> Callable[..., None]:
    """Run `handler` before Slack gets its answer, then `after` (a Slack call) in the background.

    Bolt's lazy listeners would do the same but deep-copy the whole request first: a fifth of an
    ack's CPU (tests/bench/bench_ack.py). Both are given the app's own `client` (one token, one
    workspace), whose connections stay open between calls, rather than the fresh `WebClient` Bolt
    builds for every request.
    """
    wanted = list(inspect.signature(handler).parameters)

    def listener(
        ack: Ack,
        body: dict[str, Any],
        context: BoltContext,
        action: dict[str, Any] | None = None,
        view: dict[str, Any] | None = None,
        event: dict[str, Any] | None = None,
    ) -> None:
        given = {"ack": ack, "body": body, "context": context, "client": client}
        given.update(action=action, view=view, event=event)
        token = logs.enter(**logs.slack_fields(body))  # every line logged meanwhile names the thread
        context[DEPS] = deps
        try:
            handler(**{name: given[name] for name in wanted})
        except NewerRecord as exc:  # read after the run's record (its park): it waits, untouched
            log.info("a click on a run a newer release saved changed nothing: %s", exc)
            context[REPLY] = texts.NEWER_RUN
        finally:
            deps.background.submit(after, body, context, client)
            logs.leave(token)

    return listener


@dataclass(frozen=True)
class Clicker:
    """Who clicked, from which workspace (an org-wide install sends `team: null`: the user's team)."""

    user: str
    team: str | None

    @classmethod
    def of(cls, body: dict[str, Any]) -> Clicker:
        user = as_dict(body.get("user"))
        team = as_dict(body.get("team")).get("id") or user.get("team_id")
        uid = user.get("id")
        return cls(uid if isinstance(uid, str) else "", team if isinstance(team, str) else None)


class Where(StrEnum):
    """Where a click must come from to be let through."""

    RUN_CHANNEL = "run_channel"  # the run's channel: a click naming no channel is refused
    NO_CHANNEL_TOO = "no_channel_too"  # the run's channel, or none (a body that names no channel)
    # As NO_CHANNEL_TOO; with none (a modal's submission), a refusal is told in the run's channel.
    CARD = "card"


@dataclass(frozen=True)
class Click(Generic[R]):
    """A click let through: who clicked, from which channel, the run its button names, and what
    else the button names (`ref`, its parsed value)."""

    clicker: Clicker
    channel: str | None
    record: RunRecord
    ref: R


@dataclass(frozen=True)
class Opening(Generic[R]):
    """How one kind of button is opened: its value parsed, the run it names, what must hold of the
    click (in order; the first reply refuses it), and what the clicker hears at each refusal."""

    parse: Callable[[Any], R]  # raises BadId
    run_of: Callable[[R], str]
    unknown: Reply  # a value that names no run (or not well formed)
    checks: Sequence[Callable[[Click[R]], Reply | None]] = ()
    where: Where = Where.NO_CHANNEL_TOO
    unreadable: Reply = texts.UNREADABLE_RUN
    newer: Reply = texts.NEWER_RUN  # a newer release wrote the run: it waits for it, untouched
    wrong_team: Reply = texts.WRONG_TEAM
    wrong_channel: Reply = texts.WRONG_CHANNEL


def open_click(
    deps: BotDeps,
    opening: Opening[R],
    value: Any,
    clicker: Clicker,
    channel: str | None,
    context: BoltContext,
) -> Click[R] | None:
    """The click on a button of `value`, if the run it names is of the clicker's workspace and
    channel and every check of `opening` passes; else the clicker's reply is set and None."""
    try:
        ref = opening.parse(value)
        record = deps.store.runs.load(opening.run_of(ref))
    except BadId:
        record = None
    except NewerRecord as exc:
        log.info("a click on a run a newer release saved changed nothing: %s", exc)
        context[REPLY] = opening.newer
        return None
    except StateError:
        context[REPLY] = opening.unreadable
        return None
    if record is None:
        context[REPLY] = opening.unknown
        return None
    click = Click(clicker, channel, record, ref)
    refusal = _refusal(opening, click, context)
    if refusal is not None:
        context[REPLY] = refusal
        return None
    return click


def _refusal(opening: Opening[R], click: Click[R], context: BoltContext) -> Reply | None:
    """Why `click` may not go on: the workspace, the channel, then the opening's own checks."""
    record, channel = click.record, click.channel
    if click.clicker.team != record.team:
        return opening.wrong_team
    if channel is None and opening.where is Where.CARD:
        context["reply_channel"] = record.channel  # a modal's submission: told where the card is
    if channel != record.channel and (channel is not None or opening.where is Where.RUN_CHANNEL):
        return opening.wrong_channel
    return next((r for check in opening.checks if (r := check(click)) is not None), None)


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def clicker_and_channel(body: dict[str, Any]) -> tuple[Clicker, str | None]:
    channel = as_dict(body.get("channel")).get("id") or as_dict(body.get("container")).get("channel_id")
    return Clicker.of(body), channel if isinstance(channel, str) else None


def tell_clicker(body: dict[str, Any], context: BoltContext, client: WebClient) -> None:
    """After Slack has its answer: an ephemeral reply when a click changed nothing."""
    reply, channel, user = context.get(REPLY), context.get("reply_channel"), context.get("reply_user")
    if not (reply and channel and user):
        return
    text, users = reply if isinstance(reply, tuple | list) else (reply, {})
    thread_ts = as_dict(body.get("message")).get("thread_ts") or context.get("reply_thread") or None
    msg = notice(text, group_handles(context, Clicker.of(body).team, users), **users)
    try:
        client.chat_postEphemeral(
            channel=channel, user=user, text=msg.text, blocks=msg.blocks, thread_ts=thread_ts
        )
    except SlackApiError as exc:
        log.warning("could not send an ephemeral reply: %s", exc.response.get("error"))


def group_handles(
    context: BoltContext, team: str | None, users: Mapping[str, str | Sequence[str]]
) -> dict[str, str]:
    """The handles of the user groups a reply names (after Slack has its answer: this may ask
    Slack, `GroupDirectory.handles`); none when they cannot be had, and the groups show as ids."""
    deps, team = context.get(DEPS), team or context.team_id
    ids = [i for named in users.values() for i in ([named] if isinstance(named, str) else named)]
    if not isinstance(deps, BotDeps) or not team:
        return {}
    try:
        return deps.groups.handles(deps.store, team, ids)
    except redis.RedisError as exc:  # a courtesy: the reply goes out with the groups' ids
        log.warning("could not read the user groups' handles: %s", exc)
        return {}
