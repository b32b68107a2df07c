"""What a job needs, built once per worker process from the environment and handed to each job.

RQ calls a job by its dotted name with the run id alone, so the worker hands the job its services
around the call (`handed`, a context variable: each slot thread has its own), from the `InForce`
the process built before any horse or slot started. No job builds or caches shared state itself."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import anthropic
import redis
import rq
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
)

from gates.deciders import GroupDirectory
from harness.client import make_client
from harness.config import Config, load_config
from harness.receipts import Signer
from harness.tools.catalog import Catalog
from messages.metadata import tag_of, tagged, untagged_streams
from observe import metrics
from runtime.clients import COURTESY_TIMEOUT, ShortRateLimitRetry, redis_connection, slack_client
from runtime.queue import make_queue
from runtime.slack_http import KeepAliveWebClient
from store import RunRecord, Store
from workers.live import LiveStreams

log = logging.getLogger(__name__)

_HANDED: ContextVar[Services | None] = ContextVar("harness_services", default=None)


@dataclass(frozen=True)
class Services:
    """Redis store, job queue, Slack client and config of one process."""

    store: Store
    queue: rq.Queue
    slack: WebClient
    config: Config
    # Built once per process: a new client costs 25-120 ms (an SSL context and the CA bundle).
    model: anthropic.Anthropic
    # The tools offered: modules imported once at start; MCP tools through the worker's hub.
    catalog: Catalog | None = None
    # Shared by every run a horse drives on its slot threads: built here, before any slot starts,
    # never lazily on a slot (two threads would each build one and split the pacing).
    live_streams: LiveStreams = field(default_factory=LiveStreams)
    courtesy_slack: WebClient = field(default=None)  # type: ignore[assignment]  # built from `slack`
    # Who is in a user group, and the handles groups are shown by on cards: read with `slack`'s token.
    groups: GroupDirectory = field(default=None)  # type: ignore[assignment]  # built from `slack`
    _who: list[tuple[str, str]] = field(default_factory=list, repr=False)  # `_identity`, once read
    # Signs each call's approval receipt (`harness.receipts`): HARNESS_RECEIPT_KEY. None: no receipts.
    signer: Signer | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.courtesy_slack is None:
            object.__setattr__(self, "courtesy_slack", _courtesy_client(self.slack))
        if self.groups is None:
            groups = GroupDirectory()
            groups.bind(self.slack)
            object.__setattr__(self, "groups", groups)

    def group_handles(self, team: str, names: Iterable[str]) -> dict[str, str]:
        """The handles of the user groups among `names` (`GroupDirectory.handles`); none when they
        cannot be read (Redis too: a card goes out with the groups' ids rather than not at all)."""
        try:
            return self.groups.handles(self.store, team, names)
        except redis.RedisError as exc:
            log.warning("could not read the user groups' handles: %s", exc)
            return {}

    @classmethod
    def from_env(
        cls, connection: redis.Redis | None = None, env: Mapping[str, str] | None = None
    ) -> Services:
        connection = connection or redis_connection(env)
        config = load_config(env=env)
        return cls(
            store=metrics.counting_store(connection),
            queue=make_queue(connection),
            slack=slack_client(env),
            config=config,
            model=make_client(),
            catalog=Catalog.from_config(config),
            signer=Signer.from_env(os.environ if env is None else env),
        )

    def settings_of(self, record: RunRecord) -> Config:
        """The settings of `record`'s run now: its channel's profile as configured now. That is the
        profile it started under while the channel still maps to it (as configured now), else the
        one the channel maps to now: a run never outlives its channel's rules."""
        return self.config.for_run(record.channel, record.team)

    def post(
        self,
        channel: str,
        thread_ts: str,
        text: str,
        blocks: list[dict[str, Any]],
        *,
        tag: tuple[str, str],
    ) -> str | None:
        """Post in a thread; a failure after the client's retries is logged, never raised.

        Unfurling is off: a link in model or tool text must not make Slack fetch it (a way to
        exfiltrate data). `tag` (the run, the post's key in it) goes into the message's metadata,
        so a post can be found again (`find_posted`), and is never taken for a stream
        (`find_streams`).
        """
        metadata = tagged(*tag)
        try:
            reply = self.slack.chat_postMessage(
                channel=channel,
                thread_ts=thread_ts,
                text=text,
                blocks=blocks,
                unfurl_links=False,
                unfurl_media=False,
                metadata=metadata,
            )
            self.live_streams.pacer.note(channel, thread_ts)  # a stream write waits its turn after it
            return str(reply["ts"])
        except (SlackApiError, OSError) as exc:
            log.error("could not post to %s/%s: %s", channel, thread_ts, _slack_error(exc))
            return None

    def whisper(
        self, channel: str, thread_ts: str, user: str, text: str, blocks: list[dict[str, Any]]
    ) -> bool:
        """A message in a thread that only `user` sees (`chat.postEphemeral`); a failure is logged."""
        try:
            self.slack.chat_postEphemeral(
                channel=channel, thread_ts=thread_ts, user=user, text=text, blocks=blocks
            )
            return True
        except (SlackApiError, OSError) as exc:
            log.error("could not tell %s in %s/%s: %s", user, channel, thread_ts, _slack_error(exc))
            return False

    def update(self, channel: str, ts: str, text: str, blocks: list[dict[str, Any]]) -> bool:
        """Replace a message's text AND blocks (omitted blocks would keep old buttons clickable)."""
        try:
            self.slack.chat_update(channel=channel, ts=ts, text=text, blocks=blocks)
            return True
        except (SlackApiError, OSError) as exc:
            log.error("could not update %s/%s: %s", channel, ts, _slack_error(exc))
            return False

    def find_posted(self, channel: str, thread_ts: str, run_id: str) -> dict[str, str] | None:
        """The posts of `run_id` already in the thread, by the key they were tagged with.

        None when the thread cannot be read (say, the app lacks the history scopes): the caller
        then posts without knowing, at least once rather than exactly once.
        """
        thread = self._thread(channel, thread_ts, "to find earlier posts")
        if thread is None:
            return None
        found: dict[str, str] = {}
        for message in thread:
            if (found_tag := tag_of(message)) is not None and found_tag[0] == run_id:
                found[found_tag[1]] = str(message["ts"])
            for shared in message.get("files") or []:  # a file has no metadata: its name says
                named = _UPLOADED.fullmatch(str(shared.get("name") or ""))
                if named and run_id.startswith(named.group(1)) and len(named.group(1)) >= RUN_IN_NAME:
                    found[file_key(named.group(2))] = str(message["ts"])
        return found

    def find_streams(self, channel: str, thread_ts: str, after: str) -> list[str] | None:
        """The streams of ours in the thread after message `after` that nobody stopped: every other
        message this product writes carries its tag (`messages.metadata`). None when the thread
        (or who we are) cannot be read."""
        thread = self._thread(channel, thread_ts, "to find streams left open")
        ours = self._identity()
        if thread is None or ours is None:
            return None
        return untagged_streams(thread, ours=ours, after=after)

    def _thread(self, channel: str, thread_ts: str, why: str) -> list[dict[str, Any]] | None:
        """Every message of the thread, with its metadata; None (logged) when it cannot be read."""
        messages: list[dict[str, Any]] = []
        cursor = None
        try:
            for _ in range(50):  # 50 pages of 200: a thread far longer than any run's
                reply = self.slack.conversations_replies(
                    channel=channel, ts=thread_ts, include_all_metadata=True, limit=200, cursor=cursor
                )
                messages.extend(reply.get("messages") or [])
                cursor = (reply.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    break
        except (SlackApiError, OSError) as exc:
            log.warning("cannot read thread %s/%s %s: %s", channel, thread_ts, why, _slack_error(exc))
            return None
        return messages

    def _identity(self) -> tuple[str, str] | None:
        """The bot's user id and bot id (`auth.test`, asked once per process); None if unanswered."""
        if self._who:
            return self._who[0]
        try:
            reply = self.slack.auth_test()
        except (SlackApiError, OSError) as exc:
            log.warning("cannot ask Slack who the bot is: %s", _slack_error(exc))
            return None
        who = (str(reply.get("user_id") or ""), str(reply.get("bot_id") or ""))
        self._who.append(who)
        return who

    def settle_live(
        self,
        channel: str,
        thread_ts: str,
        ts: str,
        msg: tuple[str, list[dict[str, Any]]],
        tag: tuple[str, str],
    ) -> bool:
        """Settle live message `ts` as `msg` (text, blocks), tagged like a post: its stream stopped
        first (by its writer, when this process runs it; one already stopped is fine)."""
        text, blocks = msg
        if not self.live_streams.stopped(ts):
            try:
                self.courtesy_slack.chat_stopStream(channel=channel, ts=ts, metadata=tagged(*tag))
            except (SlackApiError, OSError) as exc:
                log.debug("stopping stream %s/%s: %s", channel, ts, _slack_error(exc))
        metadata = tagged(*tag)
        self.live_streams.pacer.wait(channel, thread_ts)
        try:
            self.slack.chat_update(channel=channel, ts=ts, text=text, blocks=blocks, metadata=metadata)
            return True
        except (SlackApiError, OSError) as exc:
            log.error("could not settle stream %s/%s: %s", channel, ts, _slack_error(exc))
            return False
        finally:
            self.live_streams.pacer.note(channel, thread_ts)

    def discard_live(self, channel: str, ts: str) -> None:
        """Take live message `ts` out of the thread (stopped, then deleted): what it showed is
        posted whole instead, or was never owed (a reply lost with its driver)."""
        self.live_streams.stopped(ts)
        with contextlib.suppress(SlackApiError, OSError):
            self.courtesy_slack.chat_stopStream(channel=channel, ts=ts)
        try:
            self.slack.chat_delete(channel=channel, ts=ts)
        except (SlackApiError, OSError) as exc:
            log.warning("could not delete stream %s/%s: %s", channel, ts, _slack_error(exc))

    def upload(self, channel: str, thread_ts: str, filename: str, title: str, content: str) -> bool:
        """Post a file in a thread (`files_upload_v2`); a failure is logged, never raised.

        `filename` carries the run and key (see `upload_name`), so a file that reached Slack before
        a crash is found in the thread instead of being posted twice.
        """
        try:
            self.slack.files_upload_v2(
                channel=channel, thread_ts=thread_ts, content=content, filename=filename, title=title
            )
            return True
        except (SlackApiError, SlackRequestError, OSError) as exc:
            log.error("could not upload %s to %s/%s: %s", filename, channel, thread_ts, _slack_error(exc))
            return False

    def react(self, channel: str, ts: str, name: str, *, remove: str | None = None) -> None:
        """Best effort: a reaction is a courtesy, never a reason to fail a run."""
        try:
            if remove:
                self.slack.reactions_remove(channel=channel, timestamp=ts, name=remove)
        except (SlackApiError, OSError):
            pass
        with contextlib.suppress(SlackApiError, OSError):
            self.slack.reactions_add(channel=channel, timestamp=ts, name=name)


def _courtesy_client(slack: WebClient) -> WebClient:
    """The client for calls a run can do without (its status line): short timeout, short 429 waits."""
    return KeepAliveWebClient(
        token=slack.token,
        base_url=slack.base_url,
        timeout=COURTESY_TIMEOUT,
        ssl=slack.ssl,
        headers=slack.headers,
        retry_handlers=[ConnectionErrorRetryHandler(max_retry_count=1), ShortRateLimitRetry()],
    )


def file_key(key: str) -> str:
    """The outbox key of the file that goes with post `key`."""
    return f"{key}:file"


RUN_IN_NAME = 8  # the run id's first hex digits in a file's name: unique among a thread's runs
# A run's file: a name to read, then the run (its first digits, or the whole id as releases
# before 0.2.0 wrote it) and the outbox key; `find_posted` reads the last two back.
_UPLOADED = re.compile(r"[\w.-]+?-([0-9a-f]{8,})-(\d+)\.\w+")


def upload_name(stem: str, run_id: str, key: str) -> str:
    """The name of a run's file in Slack: the readable `stem` first (q3-sales.md), then what
    `find_posted` reads back, the run's first digits and the key (q3-sales-1a2b3c4d-7.md)."""
    name, dot, ext = stem.rpartition(".")
    run = run_id[:RUN_IN_NAME]
    return f"{name}-{run}-{key}.{ext}" if dot else f"{stem}-{run}-{key}.txt"


def _slack_error(exc: Exception) -> str:
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error"))
    return f"{type(exc).__name__}: {exc}"


@dataclass
class InForce:
    """The services in force in a worker process: built once before any horse or slot starts, handed
    by the worker to each job; a reload (SIGHUP) replaces them for the jobs that start after it."""

    services: Services


@contextlib.contextmanager
def handed(services: Services) -> Iterator[None]:
    """Within the block (one job, on this thread), `handed_services()` is `services`."""
    token = _HANDED.set(services)
    try:
        yield
    finally:
        _HANDED.reset(token)


def handed_services() -> Services | None:
    """The services handed to the job running on this thread, if a worker handed any."""
    return _HANDED.get()


def keep_handed(services: Services) -> None:
    """Hand `services` to this thread's jobs from now on (a worker that hands none: `jobs.services`)."""
    _HANDED.set(services)
