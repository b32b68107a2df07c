"""Where a worker runs its jobs: `HARNESS_WORKER_CLASS`.

- `prefork` (the default): one long-lived work horse, forked once from the warmed worker, runs
  job after job in its own process. The worker process only supervises it: a horse that dies
  (a segfault, `os._exit` in a tool, the kernel's OOM killer) is replaced at once by a fresh
  fork, and a horse that grew past `HARNESS_WORKER_MAX_RSS_MB`, kept a thread a tool left
  running, or ran `HARNESS_WORKER_MAX_JOBS` jobs finishes its job and is replaced the same way.
  A job pays no fork, no new connections and no cold pages; the run a dead horse was driving is
  continued by the watchdog once its lease expires, as with any dead driver.
- `fork`: RQ's `Worker`, a work horse forked per job (RQ's default). The same isolation, paid on
  every job: the fork, the copy-on-write faults, new connections to Redis, Slack and the model.
- `simple`: RQ's `SimpleWorker`, jobs in the worker process itself; nothing replaces it when a
  job kills it but the process manager.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import resource
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC
from types import FrameType
from typing import Any

import redis
from rq import SimpleWorker, Worker
from rq.exceptions import StopRequested
from rq.scheduler import RQScheduler
from rq.timeouts import TimerDeathPenalty
from rq.worker import WorkerStatus

from harness.tools.registry import IDLE_LANE
from observe import families, logs, metrics, tracing
from workers.process.slots import Slots
from workers.services import InForce, handed

log = logging.getLogger("workers.process.horses")

CLASSES = ("prefork", "fork", "simple")
DEFAULT_CLASS = "prefork"
DEFAULT_MAX_RSS_MB = 1024
# Jobs one prefork horse drives at once (see workers/process/slots.py and README "Workers"): a run waiting
# on the model costs a thread, not a process. 16 keeps a horse's blast radius (runs re-driven after
# it dies) small while one horse tree serves hundreds of waiting runs per GiB.
DEFAULT_CONCURRENCY = 16
MAX_CONCURRENCY = 256
HEARTBEAT_WAIT = 15.0  # seconds a full horse waits for a free slot between two of its heartbeats
RESTART_BACKOFF_MAX = 10.0  # seconds between horses that die young, at most
SCHEDULER_CHECK_SECONDS = 15  # how often a worker checks that some worker runs RQ's scheduler

# Why a horse was replaced (the label of `harness_work_horses_replaced_total`).
CRASHED = "crashed"  # died mid-job or while idle: killed by a signal or an exit nobody asked for
MEMORY = "memory"  # its resident memory passed HARNESS_WORKER_MAX_RSS_MB
THREADS = "threads"  # a job left a thread running (a tool that timed out and never returned)
JOBS = "jobs"  # it ran HARNESS_WORKER_MAX_JOBS jobs
LOOP = "loop"  # RQ quit its loop on an error (a Redis restart during its heartbeat, say)
STOPPED = "stopped"  # the horse alone was asked to stop (a SIGTERM sent to its pid)
RELOAD = "reload"  # the worker read its config again (SIGHUP): the next horse is forked with it
REASONS = (CRASHED, MEMORY, THREADS, JOBS, LOOP, STOPPED, RELOAD)

# A horse's exit status says why it left, so the worker knows what to count.
_EXIT_STATUS = {STOPPED: 0, MEMORY: 10, THREADS: 11, JOBS: 12, LOOP: 13, RELOAD: 14}
_REASON_OF_STATUS = {code: reason for reason, code in _EXIT_STATUS.items()}

_PR_SET_PDEATHSIG = 1


def worker_class_name() -> str:
    """The configured class, checked: an unknown name is an error, not a silent default."""
    kind = (os.environ.get("HARNESS_WORKER_CLASS") or DEFAULT_CLASS).strip()
    if kind not in CLASSES:
        raise ValueError(f"HARNESS_WORKER_CLASS must be one of {', '.join(CLASSES)} (got {kind!r})")
    return kind


def _positive_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number (got {raw!r})") from None
    if value < 0:
        raise ValueError(f"{name} must be 0 (no limit) or more (got {raw!r})")
    return value


class Limits:
    """When a prefork horse is replaced after a job: too big, a thread left behind, or too many jobs."""

    def __init__(self, max_rss_mb: int, max_jobs: int) -> None:
        self.max_rss_bytes = max_rss_mb * 1024 * 1024
        self.max_jobs = max_jobs
        self.jobs = 0
        self.threads: int | None = None  # the horse's own threads, counted before its first job

    @classmethod
    def from_env(cls) -> Limits:
        return cls(
            _positive_int("HARNESS_WORKER_MAX_RSS_MB", DEFAULT_MAX_RSS_MB),
            _positive_int("HARNESS_WORKER_MAX_JOBS", 0),
        )

    def before_job(self) -> None:
        if self.threads is None:
            self.threads = _threads()

    def after_job(self, *, quiet: bool = True) -> str | None:
        """Why the horse should go now that a job ended; None: keep it.

        `quiet`: no other job is running in the horse. Only then can a thread a job left running be
        told from the threads of the jobs still running (their drivers' heartbeats, outboxes, live
        messages); a tool call hung past its timeout is seen either way (its lane is renamed).
        """
        self.jobs += 1
        if self.threads is not None and (_hung_lanes() or (quiet and _threads() > self.threads)):
            return THREADS
        if self.max_rss_bytes and resident_bytes() > self.max_rss_bytes:
            return MEMORY
        if self.max_jobs and self.jobs >= self.max_jobs:
            return JOBS
        return None


def _threads() -> int:
    """Threads alive here, not counting idle tool lanes: the registry keeps one per calling thread
    for the process's life, and renames a lane whose call timed out, so a hung tool counts."""
    return sum(1 for t in threading.enumerate() if t.name != IDLE_LANE)


def _hung_lanes() -> int:
    """Tool lanes whose call timed out and never returned (`harness.tools.registry`)."""
    return sum(1 for t in threading.enumerate() if t.name.startswith(f"{IDLE_LANE} (hung"))


def concurrency(kind: str) -> int:
    """`HARNESS_WORKER_CONCURRENCY`: jobs one horse drives at once, checked. Only a prefork horse
    has slots: with `fork` or `simple` it must be 1 (or unset)."""
    raw = os.environ.get("HARNESS_WORKER_CONCURRENCY", "").strip()
    if not raw:
        return DEFAULT_CONCURRENCY if kind == "prefork" else 1
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_CONCURRENCY:
        raise ValueError(
            f"HARNESS_WORKER_CONCURRENCY must be a whole number from 1 to {MAX_CONCURRENCY}, not {raw!r}"
        )
    if int(raw) > 1 and kind != "prefork":
        raise ValueError(f"HARNESS_WORKER_CONCURRENCY={raw} needs HARNESS_WORKER_CLASS=prefork (not {kind})")
    return int(raw)


def slot_wait(job: Any) -> float | None:
    """How long `job` waited in the queue for a slot: since it was enqueued (or re-enqueued)."""
    enqueued = getattr(job, "enqueued_at", None)
    if enqueued is None:
        return None
    return max(0.0, time.time() - enqueued.replace(tzinfo=UTC).timestamp())


class SlotDeathPenalty(TimerDeathPenalty):
    """RQ's job timeout in a slot thread (a signal would reach only the main thread): a timer
    thread raises the timeout in the job's thread. Named, and joined when the job ends, so that
    counting a horse's threads never mistakes it for one a tool left behind."""

    def new_timer(self) -> threading.Timer:
        timer = threading.Timer(self._timeout, self.handle_death_penalty)
        timer.name = "rq-job-timeout"
        timer.daemon = True
        return timer

    def cancel_death_penalty(self) -> None:
        timer = self._timer
        super().cancel_death_penalty()
        if timer is not None:
            timer.join()


def resident_bytes() -> int:
    """This process's resident set size now (Linux `/proc`; elsewhere its peak)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _StopAware:
    """Tells a warm shutdown (SIGTERM, SIGINT) apart from RQ quitting its loop on an error."""

    stop_requested = False

    def handle_warm_shutdown_request(self) -> None:
        self.stop_requested = True
        super().handle_warm_shutdown_request()  # type: ignore[misc]


class _PromptUnsubscribe:
    """Leaves RQ's pubsub channel at once when the worker stops.

    RQ 3 unsubscribes, then stops its pubsub thread, and redis-py 8's `stop()` waits for that
    thread. When the thread had already read the answer to the unsubscribe, it was no longer reading
    but waiting up to a minute (RQ's `sleep_time`) for a new subscription: a warm shutdown hung
    until RQ's cold one. Here the thread is told to stop first; one still reading is woken by the
    answer to the unsubscribe and waited for, one waiting for a subscription is left to end its wait
    (a daemon thread, which touches nothing but its flag then).
    """

    pubsub: Any
    pubsub_thread: Any

    def unsubscribe(self) -> None:
        thread = self.pubsub_thread
        if thread is None:
            return
        try:
            thread.stop(timeout=0)  # only its flag: it leaves when it next wakes
        except TypeError:  # a redis-py whose stop() takes no timeout only sets the flag anyway
            thread.stop()
        if self.pubsub.subscribed:  # it is reading the connection: the answer wakes it
            self.pubsub.unsubscribe()
            thread.join(timeout=5)
        self.pubsub.close()


class _Observed:
    """A job gets the services in force handed to it; its log lines name its run; a failed job
    counts as retried or failed in the metrics."""

    connection: redis.Redis
    in_force: InForce | None = None  # set by `python -m workers` before the worker starts

    def perform_job(self, job: Any, queue: Any, execution: Any) -> bool:
        run_id = job.args[0] if job.args and isinstance(job.args[0], str) else None
        in_force = self.in_force
        with (
            logs.bound(run_id=run_id),  # the driver adds the run's team, channel and thread
            handed(in_force.services) if in_force is not None else contextlib.nullcontext(),
        ):
            return bool(super().perform_job(job, queue, execution))  # type: ignore[misc]

    def handle_job_failure(self, job: Any, queue: Any, *args: Any, **kwargs: Any) -> None:
        retried = job.should_retry and getattr(self, "_stopped_job_id", None) != job.id
        super().handle_job_failure(job, queue, *args, **kwargs)  # type: ignore[misc]
        metrics.incr(self.connection, families.JOBS_RETRIED if retried else families.JOBS_FAILED)


class HarnessWorker(_Observed, _StopAware, _PromptUnsubscribe, Worker):
    """RQ's forking worker: every job in a fresh work horse (`fork`)."""

    def perform_job(self, job: Any, queue: Any, execution: Any) -> bool:
        try:
            return super().perform_job(job, queue, execution)
        finally:
            tracing.flush()  # the work horse leaves with os._exit, which skips the SDK's atexit


class HarnessSimpleWorker(_Observed, _StopAware, _PromptUnsubscribe, SimpleWorker):
    """RQ's worker that runs jobs in its own process (`simple`)."""


class HarnessHorseWorker(HarnessSimpleWorker):
    """The RQ worker inside a prefork horse: jobs in-process, and it leaves when `limits` says so,
    or after its job when its worker reloaded the config (SIGHUP, sent by `Supervisor.replace_horse`).

    With `slots` (`HARNESS_WORKER_CONCURRENCY` > 1) it drives that many jobs at once, one per slot
    thread (`workers.process.slots`): its RQ loop takes a job only when a slot is free, and a horse that
    must leave takes no more and leaves once its slots are empty, never with a run in it.
    """

    limits: Limits
    leaving: str | None = None
    slots: Slots | None = None

    def _install_signal_handlers(self) -> None:
        super()._install_signal_handlers()
        signal.signal(signal.SIGHUP, self._on_hangup)
        if _hangup_before_work.is_set():  # it came between the fork and now
            self._leave(RELOAD)

    def _on_hangup(self, signum: int, frame: FrameType | None) -> None:
        self._leave(RELOAD)
        if self.get_state() != WorkerStatus.BUSY:
            raise StopRequested()  # waiting for a job: leave now, as RQ's own warm shutdown does

    def _leave(self, reason: str) -> None:
        if self.leaving is None:
            log.info("work horse %d leaves after this job (%s); a fresh one replaces it", os.getpid(), reason)
            self.leaving = reason
        self._stop_requested = True  # RQ's loop checks this before it takes the next job

    def execute_job(self, job: Any, queue: Any) -> None:
        if self.slots is None:
            self.limits.before_job()
            super().execute_job(job, queue)
            reason = self.limits.after_job()
            if reason is not None:
                self._leave(reason)
            return
        slots = self.slots
        if not slots.busy:
            self.limits.before_job()  # the horse's own threads, its slots included, counted idle
        waited = slot_wait(job)
        execution = self.prepare_execution(job)  # here, as RQ's forking worker does before its fork
        slots.submit(lambda: self._drive(job, queue, execution, waited))
        # The loop dequeues the next job only once a slot is free; meanwhile the worker's key lives.
        while not slots.wait_free(timeout=HEARTBEAT_WAIT):
            with contextlib.suppress(redis.RedisError):
                self.heartbeat()

    def _drive(self, job: Any, queue: Any, execution: Any, waited: float | None) -> None:
        """One job on a slot thread: RQ's `perform_job`, then whether the horse should leave."""
        assert self.slots is not None
        metrics.observe_slot_wait(self.connection, waited, self.slots.busy)
        try:
            self.perform_job(job, queue, execution)
        finally:
            reason = self.limits.after_job(quiet=self.slots.busy <= 1)
            if reason is not None:
                self._leave(reason)
                # The loop may be waiting for a job: wake it to leave (the SIGHUP handler raises
                # StopRequested unless a job is being handed to a slot, which checks the flag after).
                with contextlib.suppress(ProcessLookupError):
                    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGHUP)


# A SIGHUP a horse got before its RQ worker started: the worker leaves before its first job.
_hangup_before_work = threading.Event()


def _early_hangup(signum: int, frame: FrameType | None) -> None:
    _hangup_before_work.set()


def _die_with_parent(signum: int) -> None:
    """Ask Linux to send `signum` to this process when its parent dies (no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Supervisor:
    """The prefork worker process: keeps one work horse alive and passes stop signals to it.

    `serve` runs in the horse and returns its exit status (0: asked to stop). A SIGTERM or SIGINT
    here is passed to the horse once each, as RQ reads them: the first a warm shutdown (finish the
    job, then leave), a second a cold one. The horse has its own process group, so a Ctrl-C in a
    terminal reaches it once, through here, and it dies with this process whatever kills it.

    RQ's scheduler (retries with a delay) runs beside the horses, not in them: a horse that stops
    its own scheduler waits up to a second for it, and a replaced horse must leave at once.
    """

    def __init__(self, serve: Callable[[], int], connection: redis.Redis, scheduler: RQScheduler) -> None:
        self.serve = serve
        self.connection = connection
        self.scheduler = scheduler
        self.horse = 0
        self.stopping = False
        self._done = threading.Event()
        self._forking = threading.Lock()  # a horse is forked, or told to leave, one at a time

    def replace_horse(self) -> None:
        """Have the horse leave after its current job (at once when it waits for one), so that the
        next is forked from this process as it is now: after a config reload (`RELOAD`)."""
        with self._forking:
            if self.horse:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.horse, signal.SIGHUP)

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        # Our forks (the scheduler) stop with this process; a horse asks for a SIGKILL instead.
        os.register_at_fork(after_in_child=lambda: _die_with_parent(signal.SIGTERM))
        keeper = threading.Thread(target=self._keep_scheduler, name="rq-scheduler-keeper", daemon=True)
        keeper.start()
        backoff = 0.0
        try:
            while not self.stopping:
                born = time.monotonic()
                with self._forking:
                    self.horse = self._fork()
                status = self._wait(self.horse)
                self.horse = 0
                if self.stopping:
                    break
                reason = _reason(status)
                metrics.incr(self.connection, families.HORSES_REPLACED, reason=reason)
                if reason in (CRASHED, LOOP):
                    log.error("work horse died (%s); forking a new one", _describe(status))
                    # A horse that dies young again and again (Redis gone, a broken install) is
                    # not forked in a tight loop; one that lived a while is replaced at once.
                    young = time.monotonic() - born < 5
                    backoff = min(max(backoff * 2, 0.5), RESTART_BACKOFF_MAX) if young else 0.0
                else:
                    log.info("work horse replaced (%s)", reason)
                    backoff = 0.0
                if backoff:
                    time.sleep(backoff)
        finally:
            self._done.set()
            keeper.join(5)
            self._stop_scheduler()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return 0

    def _keep_scheduler(self) -> None:
        """Run RQ's scheduler while this worker holds its lock; take it over when its holder dies."""
        while True:
            try:
                process = self.scheduler._process
                if process is None or not process.is_alive():
                    self.scheduler.acquire_locks(auto_start=True)
            except redis.RedisError as exc:
                log.warning("cannot reach Redis for RQ's scheduler lock (%s); trying again", exc)
            if self._done.wait(SCHEDULER_CHECK_SECONDS):
                return

    def _stop_scheduler(self) -> None:
        process = self.scheduler._process
        if process is not None and process.is_alive():
            process.terminate()  # SIGTERM: it releases its lock and stops
            process.join(10)

    def _fork(self) -> int:
        parent = os.getpid()
        # SIGHUP is held across the fork: one sent to the new horse before it has its own handler
        # waits for it instead of reaching the worker's (which does nothing in a horse).
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        pid = os.fork()
        if pid:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            return pid
        status = 1
        try:
            signal.signal(signal.SIGHUP, _early_hangup)
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            os.setpgid(0, 0)  # signals to our group (a terminal's Ctrl-C) reach the horse through us only
            _die_with_parent(signal.SIGKILL)
            if os.getppid() != parent:  # the worker died before the line above
                os._exit(1)
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, signal.SIG_DFL)  # RQ installs its own once it starts
            status = self.serve()
        except BaseException:
            log.exception("work horse failed")
        finally:
            tracing.flush()  # its buffered spans: os._exit skips the SDK's atexit
            logging.shutdown()
            os._exit(status)

    def _wait(self, pid: int) -> int:
        try:
            return os.waitpid(pid, 0)[1]  # a signal meanwhile runs its handler; the wait goes on
        except ChildProcessError:
            return 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        if self.horse:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.horse, signum)


def _reason(status: int) -> str:
    if os.WIFEXITED(status):
        return _REASON_OF_STATUS.get(os.WEXITSTATUS(status), CRASHED)
    return CRASHED


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.WEXITSTATUS(status)}"


def exit_status(reason: str | None) -> int:
    """The status a horse leaves with: 0 when asked to stop, else one naming `reason`."""
    return _EXIT_STATUS[reason or STOPPED]
