"""`python -m workers status`: the runs in flight, parked (and who must decide) and failed, from the store.

In flight: the members of `harness:active` (queued, running, or parked with every decision in),
each with whether a driver holds it now. Parked: the open parks of `harness:expiries`, the soonest
to expire first. Failed: run records whose status is `failed` (a model API error; their thread has
a Retry button), found by a SCAN of every run record, so this reads every run of the last 7 days:
an operator's command, not something to poll. Waiting for a newer version: runs a newer release
wrote a record of that this release cannot read, found by the same SCAN or held by a worker that
met one (`store.held`): they wait, untouched, for a worker of that release. Near a budget: every user
and channel that spent at least 80% of a daily budget today (UTC), with the profile whose budget it is.
MCP servers down: each configured server a worker said is down (and why: a command that is not
there, say), as the workers said within the last two minutes (`store.mcp_servers`: status starts
no server).

It reads the config the workers run with (each says which at start, `harness:config:source`)
unless `HARNESS_CONFIG` is set where it runs, and its first line says which it read. A user group
among who must decide is named by its handle and id, `@oncall (S02ONCALL)`: the handle as the bot
and the workers last read it (their cache in Redis), or from Slack when the cache has none and
`SLACK_BOT_TOKEN` is set here; else by its id alone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from gates import budgets
from gates.deciders import GroupDirectory, deciders
from harness.config import Config, load_config
from harness.state import NewerRecord, PendingCall, StateError
from harness.texts import plural
from harness.tools.sandbox import escape
from messages.text import group_handle
from runtime.clients import slack_client
from runtime.queue import make_queue
from store import LIMIT_CALL, USER_SCOPE, BadId, RunRecord, RunStatus, Store, utc_day
from store.mcp_servers import STATE_TTL

SCAN_BATCH = 200
CONFIG_SOURCE_TTL = 7 * 86400  # a worker says it again at every start


@dataclass(frozen=True)
class Newer:
    """A run that waits for a newer release: why (what it wrote that this one cannot read), what its
    record shows of itself, and since when a worker holds it (None: no worker has met it yet)."""

    run_id: str
    why: str
    shows: dict[str, str]
    held_since: float | None = None


@dataclass(frozen=True)
class Parked:
    record: RunRecord
    park_id: int
    undecided: tuple[str, ...]  # the tools (or "limit") still waiting for a decision


def in_flight(store: Store) -> list[tuple[RunRecord, bool]]:
    """The runs marked active, with whether a driver holds each now (its lease)."""
    found = []
    for run_id in store.runs.active():
        record = _load(store, run_id)
        if record is not None:
            found.append((record, store.runs.leased(run_id)))
    return found


def parked(store: Store, now: float, limit: int = 500) -> list[Parked]:
    """The open parks, the soonest to expire first, with what each still waits for."""
    found = []
    for run_id, park_id in store.escalations.parked(now, limit):
        record = _load(store, run_id)
        if record is None or record.status is not RunStatus.AWAITING_APPROVAL or record.park_id != park_id:
            continue
        tools = {c.id: c.name for c in _pending(record)}
        decisions = store.parks.decisions(run_id, park_id)
        waiting = [
            "limit" if call_id == LIMIT_CALL else tools.get(call_id, call_id)
            for call_id, decision in decisions.items()
            if decision is None
        ]
        found.append(Parked(record, park_id, tuple(waiting)))
    return found


def failed(store: Store, newer: dict[str, Newer] | None = None) -> Iterator[RunRecord]:
    """Every run record in the store whose run failed (SCAN, in batches of `SCAN_BATCH`); `newer`
    gathers the records a newer release wrote, met on the way."""

    def seen(run_id: str, exc: NewerRecord, shows: dict[str, str]) -> None:
        if newer is not None:
            newer[run_id] = Newer(run_id, str(exc), shows)

    every = store.runs.every(SCAN_BATCH, newer=seen)
    return (record for record in every if record.status is RunStatus.FAILED)


def waiting_for_newer(store: Store, scanned: dict[str, Newer]) -> list[Newer]:
    """The runs that wait for a newer release: those whose record the SCAN found newer, and those
    a worker holds (whatever of theirs was newer: the record, the thread's history, the park's
    decisions), the longest held first."""
    found = dict(scanned)
    for run_id, since in store.held.held():
        why, shows = (
            (found[run_id].why, found[run_id].shows) if run_id in found else _newer_part(store, run_id)
        )
        found[run_id] = Newer(run_id, why, shows, since)
    return sorted(found.values(), key=lambda n: (n.held_since is None, n.held_since or 0, n.run_id))


def _newer_part(store: Store, run_id: str) -> tuple[str, dict[str, str]]:
    """Why a held run waits (its record, or what its next step reads: its thread's history, its
    park's decisions), and what its record shows of itself when it reads."""
    record = None
    try:
        record = store.runs.load(run_id)
        if record is not None and record.status is RunStatus.QUEUED:
            store.threads.load_history(*record.thread)
        elif record is not None and record.status is RunStatus.AWAITING_APPROVAL:
            store.parks.decisions(run_id, record.park_id)
        why = "this release reads it now: a watchdog takes it back at its next look"
    except (BadId, StateError) as exc:
        why = str(exc)
    shows = (
        {}
        if record is None
        else {"status": record.status.value, "team": record.team, "channel": record.channel}
    )
    return why, shows


def announce_config(store: Store, env: Mapping[str, str] | None = None) -> None:
    """Say in Redis which config file this worker runs with (a worker does, at start)."""
    env = os.environ if env is None else env
    raw = env.get("HARNESS_CONFIG") or ""
    path = str(Path(raw).resolve()) if raw else ""
    store.config_source.announce(path, CONFIG_SOURCE_TTL)


def config_for_status(store: Store, env: Mapping[str, str] | None = None) -> tuple[Config, str]:
    """The config `status` reads, and a line saying which: `HARNESS_CONFIG` when set here, else the
    one the workers announced (ages, deciders and budgets come out as the workers see them)."""
    env = os.environ if env is None else env
    workers_path = store.config_source.announced()
    if env.get("HARNESS_CONFIG"):
        mine = str(Path(env["HARNESS_CONFIG"]).resolve())
        line = f"Config: {mine} (HARNESS_CONFIG)"
        if workers_path is not None and workers_path != mine:
            line += f"; the workers run with {workers_path or 'the built-in defaults'}"
        return load_config(env=env), line
    if workers_path:
        return load_config(workers_path, env=env), f"Config: {workers_path} (the one the workers run with)"
    if workers_path == "":
        return load_config(env=env), "Config: the built-in defaults (as the workers run)"
    return load_config(env=env), "Config: the built-in defaults (no worker has said which it runs with)"


def group_directory(env: Mapping[str, str] | None = None) -> GroupDirectory:
    """Where status reads the handles of user groups: the cache alone, or Slack too when
    `SLACK_BOT_TOKEN` is set here."""
    env = os.environ if env is None else env
    groups = GroupDirectory()
    if env.get("SLACK_BOT_TOKEN"):
        groups.bind(slack_client(env))
    return groups


def report(
    store: Store, config: Config, now: float | None = None, groups: GroupDirectory | None = None
) -> str:
    """The whole status, as text for a terminal; `groups`: where user groups' handles are read
    (default: the cache the bot and the workers keep)."""
    now = time.time() if now is None else now
    groups = GroupDirectory() if groups is None else groups
    lines: list[str] = []
    flying, held = in_flight(store), store.held.ids()
    lines.append(f"In flight: {len(flying)}")
    for record, driven in flying:
        how = "driven now" if driven else "waiting for a worker"
        if not driven and record.run_id in held:
            how = "waiting for a newer version (below)"
        lines.append(
            f"  {_where(record)} {record.status.value}, {how}, started {_ago(now - record.created_at)}"
        )
    waiting = parked(store, now)
    lines.append(f"Parked: {len(waiting)}")
    for park in waiting:
        record = park.record
        expires_at = record.expires_at or now
        approvals = config.settings(record.profile).approvals
        since = record.parked_at(approvals.expire_after_minutes) or now
        who = deciders(approvals, record, now)
        lines.append(
            f"  {_where(record)} park {park.park_id}, parked {_ago(now - since)}, "
            f"expires in {_span(expires_at - now)}; waiting for: {', '.join(park.undecided) or '-'}; "
            f"must decide: {_named(who, groups.handles(store, record.team, who))}"
        )
    scanned: dict[str, Newer] = {}
    broken = sorted(failed(store, scanned), key=lambda r: r.created_at)
    lines.append(f"Failed: {len(broken)}")
    for record in broken:
        error = (record.error or "").splitlines()[0][:200] if record.error else "(no error recorded)"
        lines.append(f"  {_where(record)} started {_ago(now - record.created_at)}: {error}")
    lines.extend(_newer_lines(waiting_for_newer(store, scanned), now))
    lines.extend(_near_budgets(store, config, now))
    lines.extend(_servers_down(store, config, now))
    queue = make_queue(store.redis)
    lines.append(
        f"Queue {queue.name}: {queue.count} waiting, {queue.scheduled_job_registry.count} scheduled, "
        f"{queue.failed_job_registry.count} failed jobs"
    )
    return "\n".join(lines)


def _newer_lines(waiting: list[Newer], now: float) -> list[str]:
    lines = [f"Waiting for a newer version: {len(waiting)}"]
    for newer in waiting:
        shows = newer.shows
        where = f" in {shows.get('team', '?')}/{shows.get('channel', '?')}" if "channel" in shows else ""
        status = f" {shows['status']}" if "status" in shows else ""
        held = (
            f"left by a worker {_ago(now - newer.held_since)}"
            if newer.held_since is not None
            else "no worker has met it yet"
        )
        lines.append(f"  run {newer.run_id}{where}{status}: {held}; {newer.why}")
    return lines


def _servers_down(store: Store, config: Config, now: float) -> list[str]:
    """The configured MCP servers a worker said are down, each with why and since when."""
    names = [s.name for s in config.mcp_servers]
    if not names:
        return []
    said = store.mcp_servers.said(names, now)
    workers = {s.worker for states in said.values() for s in states}
    if not workers:
        return [
            f"MCP servers down: unknown (no worker said how its {len(names)} configured servers stand "
            f"in the last {STATE_TTL // 60} min: is one running?)"
        ]
    down = [(name, s) for name in names for s in said[name] if not s.up]
    running = plural(len(workers), "running worker")
    lines = [f"MCP servers down: {len(down)} (of {len(names)}, as {running} said)"]
    for name, state in down:
        why = escape(state.reason)  # a server's own words may be in it: nothing moves the terminal
        lines.append(f"  {name} on {escape(state.worker)}, down for {_span(now - state.since)}: {why}")
    return lines


def _near_budgets(store: Store, config: Config, now: float) -> list[str]:
    found = budgets.near(store, config, now)
    lines = [
        f"Near a budget (>= {budgets.NEAR:.0%} of a daily budget, UTC day {utc_day(now)}, resets in "
        f"{budgets.until_reset(now)}): {len(found)}"
    ]
    for near in found:
        key = "per_user_daily_tokens" if near.kind == USER_SCOPE else "per_channel_daily_tokens"
        lines.append(
            f"  {near.kind} {near.who} in {near.team}: {near.spent:,} of {near.budget:,} tokens "
            f"({near.spent / near.budget:.0%}), profile {near.profile or 'none'} ({key})"
        )
    return lines


def _named(who: list[str], handles: Mapping[str, str]) -> str:
    """Users by id; a user group by its handle and id (`@oncall (S02ONCALL)`), or its id alone."""
    return ", ".join(f"@{h} ({w})" if (h := group_handle(w, handles)) else w for w in who)


def _where(record: RunRecord) -> str:
    profile = f" (profile {record.profile})" if record.profile else ""
    return (
        f"run {record.run_id} in {record.team}/{record.channel} thread {record.thread_ts}{profile} "
        f"asked by {record.requester}:"
    )


def _load(store: Store, run_id: str) -> RunRecord | None:
    try:
        return store.runs.load(run_id)
    except (BadId, StateError):
        return None


def _pending(record: RunRecord) -> tuple[PendingCall, ...]:
    try:
        return record.run_state().pending
    except StateError:
        return ()


def _span(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} days"


def _ago(seconds: float) -> str:
    return f"{_span(seconds)} ago"
