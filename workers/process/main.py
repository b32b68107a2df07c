"""`python -m workers`: an RQ worker (with its scheduler) for the bot's queue, plus its watchdog.

`python -m workers audit [--limit N] [--feedback | --calls]` prints the approval audit log (or the
answers' feedback, or every call's tier decision) instead; `python -m workers audit export [--since
ISO-DATE] [--format jsonl|csv]` writes every entry of it, `python -m workers audit verify` checks
its hash chain (`ops.audit_chain`), `verify-receipt` an approval receipt (`ops.receipts`);
`python -m workers status` the runs in flight, parked (and who must decide) and failed; `python -m
workers replay DRAFT.toml [--days N]` what a draft config would have changed of the recorded calls'
tiers. `python -m workers --version` prints the release and exits, reading no setting.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from rq.scheduler import RQScheduler
from rq.serializers import JSONSerializer

from gates import deciders
from harness import release
from harness.client import warm_up
from harness.config import Config, ConfigError, ResolvedServer, load_config
from harness.state import NewerRecord
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from harness.tools.mcp_transports import guard_forks
from harness.tools.relay import RelayServer, private_directory
from harness.tools.undumpable import protect_process
from messages import text
from messages.cards import escalation_reminder, expiry_reminder
from observe import families, logs, metrics, tracing
from observe.health import WORKER_TTL
from ops import audit as audit_lines
from ops import audit_chain, audit_export, audit_files, explain, receipts, replay, status
from ops.replay import APPROVALS_READ
from runtime import local_redis
from runtime.clients import SettingsError, redis_connection
from runtime.connection import RedisTarget
from runtime.queue import enqueue_run_job, job_waiting, make_queue
from runtime.reload import Hangup, reload, servers_kept
from store import DAY, RunStatus, Store
from workers import jobs, newer, task_polls
from workers.driver import lease_seconds
from workers.mcp_health import ServerReports
from workers.mid_call import MidCallQuestions
from workers.process import horses
from workers.process.slots import Slots
from workers.services import InForce, Services

log = logging.getLogger("workers.watchdog")


ESCALATION_RETRY_SECONDS = 30  # a reminder Slack refused is tried again this much later (before expiry)


def watchdog(
    store: Store,
    stop: threading.Event,
    svc: Callable[[], Services] | None = None,
    audit_dir: Path | None = None,
    servers: ServerReports | None = None,
) -> None:
    """Expire parks whose time has come, remind `escalate_to` of those nobody decided in time, and
    hand runs with no driver to any worker. `svc` gives the services in force at each pass (a
    reload swaps them: a reminder reads the run's settings as configured now).

    A run needs a driver when it is marked active (queued, running, ending, or parked with every
    decision in) and nobody holds its lease: its driver died. It is continued within about one
    and a half lease periods, whatever step the driver died at. A run held for a newer release is
    none of that (`workers.newer`): each pass looks whether this release reads it now, and takes
    it back if so.

    Each pass also appends the audit to the files of `audit_dir` (`HARNESS_AUDIT_DIR`), then trims it,
    and says where the worker's MCP servers stand when that changed (`servers`, for status).
    """
    seconds = lease_seconds()
    queue = make_queue(store.redis)
    token = uuid.uuid4().hex  # this process's hold of the audit files' lease
    take_back = newer.TakeBack(every=seconds)
    while not stop.wait(min(max(seconds / 2, 0.5), 5.0)):
        try:
            now = time.time()
            take_back.run(store, queue, now)
            jobs.expire_due(store, queue, now)
            if svc is not None:
                services = svc()
                escalate_due(services, now)
                remind_due(services, now)
            for run_id in store.runs.orphans(now - seconds, lambda job_id: job_waiting(queue, job_id)):
                log.warning("run %s has no driver; continuing it on another worker", run_id)
                enqueue_run_job(store, queue, jobs.recover_run, run_id)
                metrics.incr(store.redis, families.RECOVERED)
            audit_files.audit_pass(store, audit_dir, token, now)
            if servers is not None:
                servers.say(store, now)
        except redis.RedisError as exc:
            log.warning("watchdog cannot reach Redis (%s); trying again", exc)
        except Exception:  # the watchdog must outlive any one bad run
            log.exception("watchdog pass failed; trying again")


def escalate_due(svc: Services, now: float) -> int:
    """Post the one reminder of every park whose escalation time has come; returns how many.

    Each due park is claimed by removing it from `harness:escalations`, so of two watchdogs only
    one posts. A park decided (or expired) meanwhile gets no reminder. A post Slack refused is
    tried again later (before the expiry), unless the thread shows it did arrive.
    """
    claimed = svc.store.escalations.claim_due_escalations(now)
    return _post_due(
        svc, claimed, _reminder, svc.store.escalations.schedule_escalation, "escalation reminder", now
    )


Due = tuple[str, str, Any, float, str]  # channel, thread, message, the park's expiry, its outbox key


def _post_due(
    svc: Services,
    claimed: Iterable[tuple[str, int]],
    build: Callable[[Services, str, int, float], Due | None],
    again: Callable[[str, int, float], object],
    what: str,
    now: float,
) -> int:
    """Post the message `build` makes for each claimed park, at most once (a post whose answer was
    lost is found in the thread); one Slack refused is scheduled `again` before the expiry."""
    posted = 0
    for run_id, park_id in claimed:
        try:
            due = build(svc, run_id, park_id, now)
        except NewerRecord as exc:  # due again at once, for the newer release (held runs wait)
            newer.leave(svc.store, run_id, exc)
            again(run_id, park_id, now)
            continue
        except Exception:  # one unreadable run must not keep the others from their reminders
            log.exception("run %s: cannot build its %s", run_id, what)
            continue
        if due is None:
            log.info("run %s park %d: decided (or expired) in time, no %s", run_id, park_id, what)
            continue
        channel, thread_ts, msg, expires_at, key = due
        tag = (run_id, key)
        if key in (svc.find_posted(channel, thread_ts, run_id) or {}):
            continue  # an earlier attempt did post it (its answer was lost): never twice
        if svc.post(channel, thread_ts, msg.text, msg.blocks, tag=tag):
            log.info("run %s park %d: %s posted", run_id, park_id, what)
            posted += 1
        elif now + ESCALATION_RETRY_SECONDS < expires_at:
            again(run_id, park_id, now + ESCALATION_RETRY_SECONDS)
    return posted


def _reminder(svc: Services, run_id: str, park_id: int, now: float) -> Due | None:
    """Where to post the reminder of park `park_id` of `run_id`, and what; None if it is not due one."""
    record = svc.store.runs.load(run_id)
    if record is None or record.status is not RunStatus.AWAITING_APPROVAL or record.park_id != park_id:
        return None  # resumed, ended or parked again since: decided (or expired) in time
    if record.expires_at is None or now >= record.expires_at:
        return None  # the expiry answers it now
    decisions = svc.store.parks.decisions(run_id, park_id)
    undecided = [c for c in record.run_state().awaiting if c.id in decisions and decisions[c.id] is None]
    if not undecided:
        return None
    expires_at = datetime.fromtimestamp(record.expires_at, UTC)
    msg = escalation_reminder(
        calls=undecided,
        requester=record.requester,
        escalate_to=svc.settings_of(record).approvals.escalate_to,
        expires_at=expires_at,
    )
    return record.channel, record.thread_ts, msg, record.expires_at, f"escalation-{park_id}"


def remind_due(svc: Services, now: float) -> int:
    """Post the reminder, with Extend, of every park whose time before expiry has come; returns how
    many. Claimed as escalations are (one watchdog posts); a park decided or expired meanwhile gets
    none; one Slack refused is tried again later (before the expiry)."""
    claimed = svc.store.escalations.claim_due_reminders(now)
    return _post_due(
        svc, claimed, _expiry_reminder, svc.store.escalations.schedule_reminder, "reminder before expiry", now
    )


def _expiry_reminder(svc: Services, run_id: str, park_id: int, now: float) -> Due | None:
    """Where to post park `park_id`'s reminder before expiry, and what; None if it is due none."""
    record = svc.store.runs.load(run_id)
    if record is None or record.status is not RunStatus.AWAITING_APPROVAL or record.park_id != park_id:
        return None
    expires, extensions = svc.store.escalations.extensions(run_id, park_id)  # what a click reads: the truth
    if not expires or now >= expires:
        return None  # the expiry answers it now
    decisions = svc.store.parks.decisions(run_id, park_id)
    undecided = [c for c in record.run_state().awaiting if c.id in decisions and decisions[c.id] is None]
    if not undecided:
        return None
    approvals = svc.settings_of(record).approvals
    msg = expiry_reminder(
        run_id=run_id,
        park_id=park_id,
        calls=undecided,
        requester=record.requester,
        deciders=deciders.deciders(approvals, record, now),
        expires_at=datetime.fromtimestamp(expires, UTC),
        extend_minutes=approvals.expire_after_minutes,
        extensions=extensions,
        max_extensions=approvals.max_extensions,
    )
    return record.channel, record.thread_ts, msg, expires, f"reminder-{park_id}-{extensions}"


def work() -> int:
    """Check settings, then work the queue until SIGTERM/SIGINT (a warm shutdown)."""
    if not protect_process():  # its /proc entries hold every secret: closed to the rest of its user
        log.warning("cannot make the worker non-dumpable (prctl); its MCP servers are sandboxed anyway")
    try:
        svc = Services.from_env()
        svc.store.redis.ping()
    except (ConfigError, SettingsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except redis.RedisError as exc:
        print(redis_problem(exc), file=sys.stderr)
        return 2
    if warning := RedisTarget.from_env().open_warning():
        print(warning, file=sys.stderr)
    try:
        servers = svc.config.resolved_servers()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # `python -m workers status` reads the same config
        status.announce_config(svc.store)
    except redis.RedisError:
        log.warning("could not say in Redis which config this worker runs with")
    audit_dir = audit_files.directory_from_env()
    try:
        if audit_dir is not None:
            audit_files.prepare(audit_dir)
    except OSError as exc:
        print(f"error: HARNESS_AUDIT_DIR cannot hold the audit's files ({exc})", file=sys.stderr)
        return 2
    try:
        kind = horses.worker_class_name()
        limits = horses.Limits.from_env()
        slots = horses.concurrency(kind)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    receipts.announce(svc.signer)  # every setting checked: a worker that cannot start says only why
    in_force: InForce | None = None  # set below, before any job can call a server
    asker = MidCallQuestions(
        lambda: in_force.services if in_force is not None else svc, Store(redis_connection())
    )
    hub, relay = _start_mcp(svc, servers, asker)
    reports = ServerReports(hub.health) if hub is not None else None
    if relay is not None:
        svc = replace(svc, catalog=_relayed(svc, relay))
    if reports is not None:
        try:  # what status shows of them, said at once: the watchdog says it again as it changes
            reports.say(svc.store, time.time())
        except redis.RedisError:
            log.warning("could not say in Redis where this worker's MCP servers stand")
    in_force = InForce(svc)  # every worker hands it to its jobs; forked horses inherit it
    try:  # parks made before the Home tab's index existed (an upgrade) join it now
        svc.store.parks.index_older_parks(time.time())
    except redis.RedisError:
        log.exception("could not index the open parks for the Home tab; they join it when parked again")
    warm_up()  # both before any fork: every horse inherits them ready
    text.warm()
    stop = threading.Event()
    watch_store = Store(redis_connection())  # its own connection: never shared with a fork
    # The watchdog posts escalation reminders with the worker's client, under the config in force.
    threading.Thread(
        target=watchdog,
        args=(watch_store, stop, lambda: replace(in_force.services, store=watch_store), audit_dir, reports),
        name="watchdog",
        daemon=True,
    ).start()
    if hub is not None:  # the tasks its servers hold are polled here, where its sessions are
        poll_store = Store(redis_connection())
        threading.Thread(
            target=task_polls.poller,
            args=(poll_store, stop, lambda: replace(in_force.services, store=poll_store), hub),
            name="task-poller",
            daemon=True,
        ).start()
    try:
        if kind == "prefork":
            scheduler = RQScheduler([svc.queue], connection=svc.store.redis, serializer=JSONSerializer)
            supervisor = horses.Supervisor(
                lambda: _serve_horse(in_force, limits, slots), svc.store.redis, scheduler
            )
            Hangup(lambda: _reload(in_force, supervisor.replace_horse)).install()
            supervisor.run()
        else:
            Hangup(lambda: _reload(in_force)).install()  # `fork`: the next job's fork; `simple`: the next job
            _serve(in_force, horses.HarnessSimpleWorker if kind == "simple" else horses.HarnessWorker)
    finally:
        stop.set()
        if reports is not None:
            reports.take_back(svc.store)
        if relay is not None:
            relay.close()
        if hub is not None:
            hub.close()
    return 0


def _reload(in_force: InForce, then: Callable[[], None] = lambda: None) -> bool:
    """SIGHUP: read the config again and hand the new services to the next job (`then`: have the
    prefork horse replaced after its job); a bad config changes nothing (`runtime.reload`)."""
    running = in_force.services

    def install(fresh: Services) -> None:
        in_force.services = fresh
        servers_kept(running.config, fresh.config)
        then()

    return reload(lambda config: _services_for(running, config), install)


def _services_for(running: Services, config: Config) -> Services:
    """The services of the running worker under `config`: its modules imported, its `${VAR}`s
    checked (a `ConfigError` refuses the reload). MCP servers are started once per worker, so the
    running ones stay: a new server's tools are offered after a restart, a removed one's no more."""
    config.resolved_servers()  # the secrets are not kept: only whether each one is there
    catalog = Catalog.from_config(config)
    host = running.catalog.host if running.catalog is not None else None
    return replace(running, config=config, catalog=catalog if host is None else catalog.with_host(host))


def _serve(in_force: InForce, worker_class: type[horses.HarnessWorker | horses.HarnessSimpleWorker]) -> None:
    """Work the queue in this process (`simple`, or RQ's `fork` per job) until asked to stop."""
    backoff = 1.0
    while True:
        svc = in_force.services
        worker = worker_class(
            [svc.queue], connection=svc.store.redis, serializer=JSONSerializer, worker_ttl=WORKER_TTL
        )
        worker.in_force = in_force
        worker.work(with_scheduler=True, logging_level="INFO")
        if worker.stop_requested:
            return
        # RQ quits its loop on any unexpected error (a Redis restart during its heartbeat, say):
        # a worker process must outlive that, so start a new loop.
        log.warning("the RQ worker loop stopped on an error; starting it again in %.0f s", backoff)
        time.sleep(backoff)
        backoff = min(backoff * 2, 10.0)


def _serve_horse(in_force: InForce, limits: horses.Limits, slots: int = 1) -> int:
    """A prefork horse's life: work the queue until asked to stop or until `limits` says leave,
    driving up to `slots` jobs at once (`workers.process.slots`); it leaves only once they have ended."""
    svc = in_force.services
    worker = horses.HarnessHorseWorker(
        [svc.queue], connection=svc.store.redis, serializer=JSONSerializer, worker_ttl=WORKER_TTL
    )
    worker.in_force, worker.limits = in_force, limits
    if slots > 1:
        worker.slots = Slots(slots)
        worker.death_penalty_class = horses.SlotDeathPenalty
    # Traces are set up here, after the fork and before the first job: the exporter's thread is the
    # horse's own from the start, not a thread a job left behind (which would replace the horse).
    tracing.current()
    try:
        worker.work(logging_level="INFO")  # RQ's scheduler runs in the worker process, beside the horse
    except Exception:  # RQ's loop, or its teardown, met an error (Redis away): the runs go on first
        if worker.slots is None:
            raise
        log.exception("the RQ loop of work horse %d stopped on an error", os.getpid())
    if worker.slots is not None:  # a warm stop or a leave (a cold stop raises past this: it is cold)
        if worker.slots.busy:
            log.info("work horse %d leaves once its %d running jobs end", os.getpid(), worker.slots.busy)
        worker.slots.wait_idle()
        worker.slots.close()
    if worker.stop_requested:
        return horses.exit_status(None)
    return horses.exit_status(worker.leaving or horses.LOOP)


def _start_mcp(
    svc: Services, servers: tuple[ResolvedServer, ...], asker: MidCallQuestions | None = None
) -> tuple[McpHub | None, RelayServer | None]:
    """Open every MCP session here, in the worker, for its whole life, and serve them to its jobs.

    RQ forks a work horse per job, and a fork gets neither the hub's loop thread nor a safe share
    of its pipes; so the sessions stay in this process and each horse calls them over a Unix
    socket (`harness.tools.relay`). No job ever starts a server. The socket's directory exists
    before any server starts, so that every stdio server's sandbox hides it.
    """
    if not servers:
        return None, None
    guard_forks()  # RQ forks a horse per job while the hub may be spawning a stdio server
    directory = private_directory()
    hub = McpHub(servers, hidden=(directory,), ask_person=asker).start()
    return hub, RelayServer(hub, directory).start()


def _relayed(svc: Services, relay: RelayServer) -> Catalog:
    assert svc.catalog is not None
    longest = max((s.timeout_seconds for s in svc.config.mcp_servers), default=60.0)
    client = relay.client(call_timeout=longest)  # with the relay's token: forked horses inherit it
    return svc.catalog.with_host(client)


def redis_problem(exc: Exception) -> str:
    """One line on why Redis cannot be used: its settings, or where it was looked for (no password)."""
    if isinstance(exc, SettingsError):
        return f"error: {exc}"
    return f"error: cannot reach Redis at {RedisTarget.from_env().describe()} ({exc})"


def _operator_store() -> Store:
    """The store an operator's command reads: its own Redis setting, else `make run`'s own Redis
    (`runtime.local_redis`), else the default; which one is said on stderr, first."""
    env, said = local_redis.operator_env(os.environ)
    print(said, file=sys.stderr)
    return Store(redis_connection(env))


def audit(limit: int, *, feedback: bool = False, calls: bool = False) -> int:
    """Print the newest `limit` entries of the decisions' audit (or, `feedback`, of the answers'
    feedback; `calls`, of the calls' tier decisions), one line each whatever its kind (`ops.audit`)."""
    try:
        store = _operator_store()
        if feedback:
            entries = store.audit.feedback_entries(limit)
        else:
            entries = store.audit.call_entries(limit) if calls else store.audit.entries(limit)
    except (redis.RedisError, SettingsError) as exc:
        print(redis_problem(exc), file=sys.stderr)
        return 2
    for line in audit_lines.lines(entries, feedback=feedback):
        print(line)
    return 0


def audit_export_all(since: str | None, fmt: str) -> int:
    """`python -m workers audit export`: every entry of the decisions' audit (the files', then
    Redis's newer ones, when `HARNESS_AUDIT_DIR` is set), at or after `since`, to stdout."""
    try:
        after = audit_export.since_of(since) if since else None
    except ValueError:
        print(f"error: --since must be an ISO 8601 date or time, got {since!r}", file=sys.stderr)
        return 2
    read = _audit_read()
    if read is None:
        return 2
    links, _, _ = read
    audit_export.write(audit_export.rows(links, after), sys.stdout, fmt)
    return 0


def _audit_read() -> tuple[Any, Any, Any] | None:
    """The audit's entries (Redis, then the files of HARNESS_AUDIT_DIR), their copies in the files,
    and the chain's head; None, with one line on stderr, when either cannot be read."""
    try:
        store = _operator_store()
        links, copies = audit_files.collect(store, audit_files.directory_from_env())
        return links, copies, store.audit.head()
    except (redis.RedisError, SettingsError) as exc:
        print(redis_problem(exc), file=sys.stderr)
    except OSError as exc:
        print(f"error: cannot read HARNESS_AUDIT_DIR ({exc})", file=sys.stderr)
    return None


def audit_verify() -> int:
    """`python -m workers audit verify`: exit 0 and `N entries, chain intact`, or 1 and the first
    entry that was changed, removed or reordered (`ops.audit_chain`)."""
    read = _audit_read()
    if read is None:
        return 2
    links, copies, head = read
    report = audit_chain.verify(links, head, copies=copies)
    print(report.line if report.ok else f"chain broken: {report.line}")
    return 0 if report.ok else 1


def replay_draft(path: str, days: float) -> int:
    """`python -m workers replay`: the recorded calls of the last `days` days ruled again under the
    draft at `path`; one line per call whose tier would change, then a summary (`ops.replay`)."""
    try:
        draft = load_config(path)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        store = _operator_store()
        entries = store.audit.calls_since(time.time() - days * DAY)
        tally = replay.Tally()
        for result in replay.replay(
            draft, entries, replay.approved_calls(store.audit.entries(APPROVALS_READ))
        ):
            tally.add(result)
            if result.changed:
                print(result.line())
    except (redis.RedisError, SettingsError) as exc:
        print(redis_problem(exc), file=sys.stderr)
        return 2
    print(tally.summary())
    return 0


def print_status() -> int:
    """`python -m workers status`: what is in flight, parked and failed now."""
    try:
        store = _operator_store()
        config, which = status.config_for_status(store)
        print(which)
        print(status.report(store, config, groups=status.group_directory()))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (redis.RedisError, SettingsError) as exc:
        print(redis_problem(exc), file=sys.stderr)
        return 2
    return 0


def _days(raw: str) -> float:
    """`--days`: a number of days > 0 (fractions allowed)."""
    try:
        days = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of days, got {raw!r}") from None
    if not 0 < days <= 3650:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 3650, got {raw!r}")
    return days


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers")
    parser.add_argument("--version", action="version", version=release.line())
    sub = parser.add_subparsers(dest="command")
    audit_parser = sub.add_parser("audit", help="print the approval audit log")
    audit_parser.add_argument("--limit", type=int, default=100)
    shown = audit_parser.add_mutually_exclusive_group()
    shown.add_argument(
        "--feedback", action="store_true", help="print the answers' feedback (its own stream) instead"
    )
    shown.add_argument(
        "--calls", action="store_true", help="print every call's tier decision (its own stream) instead"
    )
    audit_sub = audit_parser.add_subparsers(dest="audit_command")
    export_parser = audit_sub.add_parser("export", help="write every entry of the decisions' audit")
    export_parser.add_argument("--since", metavar="ISO-DATE", help="only entries at or after (UTC)")
    export_parser.add_argument("--format", choices=audit_export.FORMATS, default="jsonl")
    audit_sub.add_parser("verify", help="check the audit's hash chain")
    receipts.add_commands(audit_sub)  # verify-receipt, receipt-key
    sub.add_parser("status", help="print the runs in flight, parked (and who must decide) and failed")
    replay_parser = sub.add_parser(
        "replay", help="print the recorded calls whose tier a draft config would change, then a summary"
    )
    replay_parser.add_argument("draft", metavar="DRAFT.toml", help="the draft config")
    replay_parser.add_argument("--days", type=_days, default=30, help="how far back to look (default 30)")
    explaining = sub.add_parser("explain-call", help="python -m harness --explain-call, with counters read")
    explaining.add_argument("rest", nargs=argparse.REMAINDER, help="NAME JSON [--channel C…] [--team T…] …")
    args = parser.parse_args(argv)
    logs.configure()  # text, or JSON lines with LOG_FORMAT=json (work horses inherit it)
    if args.command == "audit" and args.audit_command == "export":
        return audit_export_all(args.since, args.format)
    if args.command == "audit" and args.audit_command == "verify":
        return audit_verify()
    if args.command == "audit" and args.audit_command in receipts.COMMANDS:
        return receipts.run(args)
    if args.command == "audit":
        return audit(args.limit, feedback=args.feedback, calls=args.calls)
    if args.command == "status":
        return print_status()
    if args.command == "replay":
        return replay_draft(args.draft, args.days)
    if args.command == "explain-call":
        return explain.explain_call(args.rest)
    return work()


if __name__ == "__main__":
    raise SystemExit(main())
