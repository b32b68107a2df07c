"""The job queue both processes share: RQ with JSON jobs, a whole run's timeout and its retries."""

from __future__ import annotations

import uuid
from typing import Any

import redis
import rq
from rq import Retry
from rq.exceptions import InvalidJobOperation
from rq.job import JobStatus
from rq.serializers import JSONSerializer
from rq.utils import now as rq_now

from store import DAY, QueuedJob, Store

QUEUE_NAME = "harness"
RUN_JOB_TIMEOUT = 3600  # a whole run between two parks: (max_turns + 1) requests with retries
RETRY_INTERVALS = [1, 5, 15]


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
    along with writes of its own (`store.admission.accept_event`).

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
        store.runs.mark_pending(run_id, job_id, pipeline=pipeline)
        enqueue_job(queue, func, run_id, *args, pipeline=pipeline, job_id=job_id)
        return
    with store.redis.pipeline() as pipe:
        pipe.multi()
        store.runs.mark_pending(run_id, job_id, pipeline=pipe)
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
