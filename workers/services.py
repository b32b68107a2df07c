"""What a job needs, built once per worker process from the environment and passed explicitly."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import ssl
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anthropic
import redis
import rq
from rq import Retry
from rq.exceptions import InvalidJobOperation
from rq.job import JobStatus
from rq.serializers import JSONSerializer
from rq.utils import now as rq_now
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.http_retry import HttpRequest, HttpResponse, RetryState
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)

from harness.client import make_client
from harness.config import Config, load_config
from harness.tools.catalog import Catalog
from workers import connection, metrics
from workers.live import LiveStreams
from workers.slack_http import KeepAliveWebClient
from workers.store import DAY, QueuedJob, RunRecord, Store

log = logging.getLogger(__name__)

QUEUE_NAME = "harness"
DEFAULT_SLACK_API_URL = "https://slack.com/api/"
RUN_JOB_TIMEOUT = 3600  # a whole run between two parks: (max_turns + 1) requests with retries
MESSAGE_EVENT_TYPE = "harness_message"  # Slack message metadata that names a run's post
RETRY_INTERVALS = [1, 5, 15]
COURTESY_TIMEOUT = 5  # seconds: a status line is not worth a stalled run
COURTESY_MAX_WAIT = 5  # seconds of a 429's Retry-After a courtesy call waits out (once); longer: skipped


def make_queue(connection: redis.Redis) -> rq.Queue:
    """The bot's queue. JSON, never pickle: whoever can write to Redis must not get code execution."""
    return rq.Queue(QUEUE_NAME, connection=connection, serializer=JSONSerializer)


def enqueue_job(
    queue: rq.Queue, func: str | Any, *args: Any, pipeline: Any = None, job_id: str | None = None
) -> rq.job.Job:
    """Enqueue a job with the timeout of a whole run and RQ retries, whoever enqueues it."""
    _check_serializer(queue)
    return queue.enqueue_call(func, args=args, **_job_options(), pipeline=pipeline, job_id=job_id)


def queued_job(queue: rq.Queue, func: str | Any, *args: Any, job_id: str) -> QueuedJob:
    """The job `enqueue_job` would enqueue, as the writes RQ makes for it, for a Lua script to make
    along with writes of its own (`Store.accept_event`).

    RQ builds the job and its hash (`Job.to_dict`, as RQ's own unique enqueue does); what is left
    is what `Queue.enqueue_job` sets on a job it enqueues: its queue, when, and its status. No
    dependencies, no TTL and no rate limit: RQ would write more for those.
    """
    _check_serializer(queue)
    job = queue.create_job(func, args=args, **_job_options(), job_id=job_id, status=JobStatus.QUEUED)
    job.origin, job.enqueued_at = queue.name, rq_now()
    fields: list[str | bytes] = []
    for name, value in job.to_dict().items():
        if value is not None:
            fields += (name, value if isinstance(value, bytes | str) else str(value))
    return QueuedJob(job.id, job.key, queue.key, queue.redis_queues_keys, tuple(fields))


def _job_options() -> dict[str, Any]:
    return {
        "timeout": RUN_JOB_TIMEOUT,
        "result_ttl": 600,
        "failure_ttl": DAY,
        "retry": Retry(max=len(RETRY_INTERVALS), interval=list(RETRY_INTERVALS)),
    }


def _check_serializer(queue: rq.Queue) -> None:
    if queue.serializer is not JSONSerializer:
        raise ValueError("the bot's queue must use RQ's JSONSerializer (see make_queue), never pickle")


def enqueue_run_job(
    store: Store, queue: rq.Queue, func: str | Any, run_id: str, *args: Any, pipeline: Any = None
) -> None:
    """Enqueue a job about `run_id`, marked pending in the same step so the watchdog sends no other."""
    job_id = uuid.uuid4().hex
    if pipeline is not None:
        store.mark_pending(run_id, job_id, pipeline=pipeline)
        enqueue_job(queue, func, run_id, *args, pipeline=pipeline, job_id=job_id)
        return
    with store.redis.pipeline() as pipe:
        pipe.multi()
        store.mark_pending(run_id, job_id, pipeline=pipe)
        enqueue_job(queue, func, run_id, *args, pipeline=pipe, job_id=job_id)
        pipe.execute()


def job_waiting(queue: rq.Queue, job_id: str) -> bool:
    """Whether job `job_id` still waits to start: in the queue, or scheduled for a retry.

    A job a worker took off the queue but never ran (it died in between) still reads "queued":
    only its place in the queue's list tells it apart.
    """
    job = rq.job.Job(job_id, connection=queue.connection, serializer=queue.serializer)
    try:
        status = job.get_status(refresh=True)
    except InvalidJobOperation:  # the job is gone: nothing is on its way
        return False
    if status == JobStatus.QUEUED:
        return queue.get_job_position(job_id) is not None
    return status in (JobStatus.SCHEDULED, JobStatus.DEFERRED)


class SettingsError(ValueError):
    """A required setting is missing; the message says what to set and where to get it."""


def slack_client(env: Mapping[str, str] | None = None) -> WebClient:
    """A `WebClient` on `SLACK_API_URL` that retries 429 (honouring Retry-After) and 5xx, and keeps
    its connections open between calls (`workers.slack_http`)."""
    env = os.environ if env is None else env
    token = env.get("SLACK_BOT_TOKEN")
    if not token:
        raise SettingsError(
            "SLACK_BOT_TOKEN is not set: copy the Bot User OAuth Token (xoxb-…) from your app's "
            "OAuth & Permissions page at https://api.slack.com/apps"
        )
    return KeepAliveWebClient(
        token=token,
        base_url=env.get("SLACK_API_URL") or DEFAULT_SLACK_API_URL,
        timeout=15,
        ssl=tls_context(),
        retry_handlers=[
            ConnectionErrorRetryHandler(max_retry_count=2),
            RateLimitErrorRetryHandler(max_retry_count=3),
            ServerErrorRetryHandler(max_retry_count=2),
        ],
    )


class ShortRateLimitRetry(RateLimitErrorRetryHandler):
    """Waits out a 429 once, and only when Slack asks for at most `COURTESY_MAX_WAIT` seconds.

    slack_sdk's own handler sleeps whatever Retry-After says, in the calling thread.
    """

    def __init__(self) -> None:
        super().__init__(max_retry_count=1)

    def _can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        if response is None or response.status_code != 429:
            return False
        wait = next((v for k, v in response.headers.items() if k.lower() == "retry-after"), ["1"])
        try:
            return int(wait[0]) <= COURTESY_MAX_WAIT
        except (IndexError, ValueError):
            return False


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The one TLS context of the process's Slack clients (certificates checked as by default).

    Without one, every HTTPS call of a `WebClient` makes its own (Python 3.11's `http.client` does,
    for a connection given no context), loading the CA bundle again: milliseconds of CPU per call.
    """
    return ssl.create_default_context()


def redis_connection(env: Mapping[str, str] | None = None) -> redis.Redis:
    """This process's Redis client: `REDIS_URL`, or the master of `REDIS_SENTINELS` (`workers.connection`).

    Raises `SettingsError` (one line) when those settings cannot be used.
    """
    try:
        return connection.connect(env)
    except connection.RedisSettingsError as exc:
        raise SettingsError(str(exc)) from None


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

    @classmethod
    def from_env(
        cls, connection: redis.Redis | None = None, env: Mapping[str, str] | None = None
    ) -> Services:
        connection = connection or redis_connection(env)
        config = load_config(env=env)
        return cls(
            store=metrics.count_shortfalls(Store(connection)),
            queue=make_queue(connection),
            slack=slack_client(env),
            config=config,
            model=make_client(),
            catalog=Catalog.from_config(config),
        )

    def settings_of(self, record: RunRecord) -> Config:
        """The settings of `record`'s run now: its channel's profile as configured now. That is the
        profile it started under while the channel still maps to it (as configured now), else the
        one the channel maps to now: a run never outlives its channel's rules."""
        return self.config.for_run(record.channel, record.team)

    @functools.cached_property
    def courtesy_slack(self) -> WebClient:
        """The client for calls a run can do without (its status line): short timeout, short 429 waits."""
        return KeepAliveWebClient(
            token=self.slack.token,
            base_url=self.slack.base_url,
            timeout=COURTESY_TIMEOUT,
            ssl=self.slack.ssl,
            headers=self.slack.headers,
            retry_handlers=[ConnectionErrorRetryHandler(max_retry_count=1), ShortRateLimitRetry()],
        )

    def post(
        self,
        channel: str,
        thread_ts: str,
        text: str,
        blocks: list[dict[str, Any]],
        *,
        tag: dict[str, str] | None = None,
    ) -> str | None:
        """Post in a thread; a failure after the client's retries is logged, never raised.

        Unfurling is off: a link in model or tool text must not make Slack fetch it (a way to
        exfiltrate data). `tag` goes into the message's metadata, so a post can be found again.
        """
        metadata = {"event_type": MESSAGE_EVENT_TYPE, "event_payload": tag} if tag else None
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
        found: dict[str, str] = {}
        cursor = None
        try:
            for _ in range(50):  # 50 pages of 200: a thread far longer than any run's
                reply = self.slack.conversations_replies(
                    channel=channel, ts=thread_ts, include_all_metadata=True, limit=200, cursor=cursor
                )
                for message in reply.get("messages") or []:
                    meta = message.get("metadata") or {}
                    payload = meta.get("event_payload") or {}
                    if meta.get("event_type") == MESSAGE_EVENT_TYPE and payload.get("run") == run_id:
                        found[str(payload.get("key"))] = str(message["ts"])
                    for shared in message.get("files") or []:  # a file has no metadata: its name says
                        named = re.fullmatch(rf"[\w.-]+?-{run_id}-(\d+)\.\w+", str(shared.get("name") or ""))
                        if named:
                            found[file_key(named.group(1))] = str(message["ts"])
                cursor = (reply.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    break
        except (SlackApiError, OSError) as exc:
            log.warning(
                "cannot read thread %s/%s to find earlier posts: %s", channel, thread_ts, _slack_error(exc)
            )
            return None
        return found

    @functools.cached_property
    def live_streams(self) -> LiveStreams:
        """The process's live messages (`workers.live`) and the pacing of stream writes per thread."""
        return LiveStreams()

    def settle_live(
        self,
        channel: str,
        thread_ts: str,
        ts: str,
        msg: tuple[str, list[dict[str, Any]]],
        tag: dict[str, str],
    ) -> bool:
        """Settle live message `ts` as `msg` (text, blocks), tagged like a post: its stream stopped
        first (by its writer, when this process runs it; one already stopped is fine)."""
        text, blocks = msg
        if not self.live_streams.stopped(ts):
            try:
                self.courtesy_slack.chat_stopStream(channel=channel, ts=ts)
            except (SlackApiError, OSError) as exc:
                log.debug("stopping stream %s/%s: %s", channel, ts, _slack_error(exc))
        metadata = {"event_type": MESSAGE_EVENT_TYPE, "event_payload": tag}
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


def file_key(key: str) -> str:
    """The outbox key of the file that goes with post `key`."""
    return f"{key}:file"


def upload_name(stem: str, run_id: str, key: str) -> str:
    """The name of a run's file in Slack, from which `find_posted` reads the run and key back."""
    name, dot, ext = stem.rpartition(".")
    return f"{name}-{run_id}-{key}.{ext}" if dot else f"{stem}-{run_id}-{key}.txt"


def _slack_error(exc: Exception) -> str:
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error"))
    return f"{type(exc).__name__}: {exc}"
