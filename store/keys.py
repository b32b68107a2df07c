"""Every key the store writes, spelled in one place (`Keys`): under `harness:`, from ids checked first.

An id that comes from outside (Slack, a button's value, a member read back from a set) and does
not have the shape we write is refused with `BadId` before any key is built from it.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from store.base import as_text

PREFIX = "harness:"
DAY = 24 * 3600  # the unit of the keys' lifetimes

_ID = {
    "run": re.compile(r"^[0-9a-f]{32}$"),
    "team": re.compile(r"^[A-Z0-9_-]{1,32}$"),
    "channel": re.compile(r"^[A-Z0-9]{1,32}$"),
    "ts": re.compile(r"^[0-9]{1,12}\.[0-9]{1,9}$"),
    "event": re.compile(r"^[A-Za-z0-9_-]{1,64}$"),
    "call": re.compile(r"^[A-Za-z0-9_-]{1,128}$"),
    "user": re.compile(r"^[A-Z][A-Z0-9]{1,31}$"),
    "tool": re.compile(r"^[A-Za-z0-9_-]{1,128}$"),
    "fingerprint": re.compile(r"^[0-9a-f]{16}$"),
    "group": re.compile(r"^S[A-Z0-9]{1,31}$"),
    "request": re.compile(r"^[0-9a-f]{32}$"),
    "day": re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"),
    "scope": re.compile(r"^(user|channel)$"),
    "slot": re.compile(r"^[0-9a-f]{24}$"),
    "profile": re.compile(r"^[a-z0-9-]{1,32}$"),
    "server": re.compile(r"^[a-z0-9-]{1,32}$"),  # an MCP server's name, as the config allows it
    "ref": re.compile(r"^[0-9a-f]{16}$"),  # a form's values kept for a call (`store.inputs`)
    "holder": re.compile(r"^[0-9a-f]{32}$"),  # an MCP hub that alone reaches its tasks (`store.tasks`)
    "counter": re.compile(r"^[0-9a-f]{24}$"),  # a counting rule's counter (`harness.counting.counter_id`)
    "meter_scope": re.compile(r"^(run|thread|channel|requester|workspace)$"),
}


class BadId(ValueError):
    """An id from outside (Slack, a button value) that does not have the shape we write."""


def check_id(kind: str, value: Any) -> str:
    """`value` if it is a well-formed id of `kind`, else `BadId`."""
    if not isinstance(value, str) or not _ID[kind].fullmatch(value):
        raise BadId(f"not a valid {kind} id: {value!r}"[:200])
    return value


def new_run_id() -> str:
    return uuid.uuid4().hex


class Keys:
    """The one home of every key name."""

    @staticmethod
    def run(run_id: str) -> str:
        return f"{PREFIX}run:{check_id('run', run_id)}"

    @staticmethod
    def approvals(run_id: str, park_id: int) -> str:
        """One hash per park: a new park never touches (or wipes) an older park's decisions."""
        return f"{PREFIX}approvals:{check_id('run', run_id)}:{int(park_id)}"

    @staticmethod
    def cards_done(run_id: str, park_id: int) -> str:
        return f"{PREFIX}cards:{check_id('run', run_id)}:{int(park_id)}"

    @staticmethod
    def retry_claim(run_id: str, failure_ts: str) -> str:
        return f"{PREFIX}retry:{check_id('run', run_id)}:{check_id('ts', failure_ts)}"

    @staticmethod
    def event(team: str, event_id: str) -> str:
        return f"{PREFIX}event:{check_id('team', team)}:{check_id('event', event_id)}"

    @staticmethod
    def history(team: str, channel: str, thread_ts: str) -> str:
        """The thread's conversation (a hash: `data`, and `seq`, the count of runs that saved it)."""
        return f"{PREFIX}history:{_thread_id(team, channel, thread_ts)}"

    @staticmethod
    def thread_lock(team: str, channel: str, thread_ts: str) -> str:
        return f"{PREFIX}lock:{_thread_id(team, channel, thread_ts)}"

    @staticmethod
    def thread_waiting(team: str, channel: str, thread_ts: str) -> str:
        return f"{PREFIX}waiting:{_thread_id(team, channel, thread_ts)}"

    @staticmethod
    def user_runs(team: str, user: str) -> str:
        return f"{PREFIX}runs:user:{check_id('team', team)}:{check_id('user', user)}"

    @staticmethod
    def channel_runs(team: str, channel: str) -> str:
        return f"{PREFIX}runs:channel:{check_id('team', team)}:{check_id('channel', channel)}"

    @staticmethod
    def busy_notice(team: str, user: str) -> str:
        return f"{PREFIX}busy:{check_id('team', team)}:{check_id('user', user)}"

    @staticmethod
    def audit() -> str:
        return f"{PREFIX}audit"

    @staticmethod
    def audit_head() -> str:
        """The audit chain's newest link, `<seq> <hash>`: whoever appends chains to it in the same
        script (`store.audit`). No TTL: losing it would restart the chain."""
        return f"{PREFIX}audit:head"

    @staticmethod
    def audit_mirrored() -> str:
        """The id of the newest audit entry the JSONL files hold (fsynced): nothing above it is
        trimmed. No TTL; deleted by hand when the files are given up (docs/audit.md)."""
        return f"{PREFIX}audit:mirrored"

    @staticmethod
    def audit_mirror_lock() -> str:
        """The one process appending audit entries to the JSONL files now (a short lease)."""
        return f"{PREFIX}audit:mirror:lock"

    @staticmethod
    def audit_calls() -> str:
        """Every call's tier decision: a stream of its own, so that calls (many) never push the
        decisions (who approved what) out of theirs."""
        return f"{PREFIX}audit:calls"

    @staticmethod
    def audit_ruled(run_id: str) -> str:
        """The call ids of `run_id` whose tier decision is in `audit_calls`: each is written once."""
        return f"{PREFIX}audit:ruled:{check_id('run', run_id)}"

    @staticmethod
    def feedback() -> str:
        """The answers' feedback stream: apart from the decisions' audit, with its own bounds."""
        return f"{PREFIX}feedback"

    @staticmethod
    def feedback_rate(team: str, user: str) -> str:
        """How many feedback clicks of a person were recorded in the current minute."""
        return f"{PREFIX}feedback:rate:{check_id('team', team)}:{check_id('user', user)}"

    @staticmethod
    def feedback_given(run_id: str, user: str) -> str:
        """A person's standing feedback on one answer (good or bad): the same click again is not news."""
        return f"{PREFIX}feedback:given:{check_id('run', run_id)}:{check_id('user', user)}"

    @staticmethod
    def lease(run_id: str) -> str:
        return f"{PREFIX}lease:{check_id('run', run_id)}"

    @staticmethod
    def pending(run_id: str) -> str:
        """Set while a job for the run waits in the queue: the watchdog leaves such a run alone."""
        return f"{PREFIX}pending:{check_id('run', run_id)}"

    @staticmethod
    def active() -> str:
        """Runs that need a driver now (score: when one was last heard from)."""
        return f"{PREFIX}active"

    @staticmethod
    def held() -> str:
        """Runs a worker left as they were for a newer release, which wrote a record of theirs this
        release cannot read (member: run id, score: when first left). No expiry, reminder or
        recovery touches them until a worker that reads them takes them back (`store.held`)."""
        return f"{PREFIX}held"

    @staticmethod
    def expiries() -> str:
        """Parks awaiting decisions (member `run:park`, score: when they expire)."""
        return f"{PREFIX}expiries"

    @staticmethod
    def grant(team: str, channel: str, thread_ts: str, tool: str, slot: str = "") -> str:
        """A grant of one tool for a thread (expires with the grant); `slot`: the hash of the
        directory a scoped grant covers ("" for the whole thread)."""
        key = f"{PREFIX}grant:{_thread_id(team, channel, thread_ts)}:{check_id('tool', tool)}"
        return f"{key}:dir:{check_id('slot', slot)}" if slot else key

    @staticmethod
    def group_members(team: str, group: str) -> str:
        """The members of a user group as `usergroups.users.list` gave them (a short-lived cache)."""
        return f"{PREFIX}group:{check_id('team', team)}:{check_id('group', group)}"

    @staticmethod
    def group_handles(team: str) -> str:
        """The handles of the team's user groups as `usergroups.list` gave them (a short-lived cache)."""
        return f"{PREFIX}grouphandles:{check_id('team', team)}"

    @staticmethod
    def mcp_server(name: str) -> str:
        """Where each worker's MCP server `name` stands, as the workers said (a hash by worker)."""
        return f"{PREFIX}mcp:{check_id('server', name)}"

    @staticmethod
    def parks_indexed() -> str:
        """Set once every park older than the park indexes was put in them (an upgrade's one pass;
        `:2` since the profiles' index came, so that one pass puts the older parks there too)."""
        return f"{PREFIX}parks:indexed:2"

    @staticmethod
    def team_parks(team: str) -> str:
        """The team's open parks (member `run:park`, score: when it expires): the Home tab's index
        for approvers and `escalate_to`, kept with `expiries` by the scripts that park and resume."""
        return f"{PREFIX}parks:team:{check_id('team', team)}"

    @staticmethod
    def user_parks(team: str, user: str) -> str:
        """The open parks of the runs `user` asked for (as `team_parks`): the requester's Home tab."""
        return f"{PREFIX}parks:user:{check_id('team', team)}:{check_id('user', user)}"

    @staticmethod
    def profile_parks(profile: str) -> str:
        """The open parks of runs under `profile` ("": the top level), as `team_parks`: what
        `/metrics` counts, at scrape, as the runs waiting on each profile's approvers."""
        name = check_id("profile", profile) if profile else "~top"  # "~": never a profile's name
        return f"{PREFIX}parks:profile:{name}"

    @staticmethod
    def escalations() -> str:
        """Parks due a reminder to `escalate_to` (member `run:park`, score: when it is due)."""
        return f"{PREFIX}escalations"

    @staticmethod
    def reminders() -> str:
        """Parks due a reminder before they expire, with Extend (member `run:park`, score: when due)."""
        return f"{PREFIX}reminders"

    @staticmethod
    def config_source() -> str:
        """Which config file the workers run with (JSON: its absolute path, or "" for the built-in
        defaults), so that `python -m workers status` reads the same one."""
        return f"{PREFIX}config:source"

    @staticmethod
    def live(run_id: str) -> str:
        """The ts of a run's live messages still streaming or unsettled (`workers.live`): a set, so a
        successor of a driver that died stops and removes those no saved step owes a settlement."""
        return f"{PREFIX}live:{check_id('run', run_id)}"

    @staticmethod
    def question(run_id: str, question_id: str) -> str:
        """A question a server asks in the middle of a call, while the call waits (`store.questions`)."""
        return f"{PREFIX}question:{check_id('run', run_id)}:{check_id('ref', question_id)}"

    @staticmethod
    def question_answers(run_id: str, question_id: str) -> str:
        """The answer to that question, on its way to the worker that waits for it (a list)."""
        return f"{PREFIX}question-answer:{check_id('run', run_id)}:{check_id('ref', question_id)}"

    @staticmethod
    def question_answered(run_id: str, question_id: str) -> str:
        """Set by the first answer to that question: any later one changes nothing."""
        return f"{PREFIX}question-answered:{check_id('run', run_id)}:{check_id('ref', question_id)}"

    @staticmethod
    def input_values(run_id: str, ref: str) -> str:
        """The values of a form a person accepted for a server's question (`store.inputs`)."""
        return f"{PREFIX}input:{check_id('run', run_id)}:{check_id('ref', ref)}"

    @staticmethod
    def task_polls(holder: str = "") -> str:
        """When each parked task is polled next (member `run:park`): those any worker may poll, or
        (`holder`) those only that hub reaches, a stdio server's (`store.tasks`)."""
        return f"{PREFIX}task-polls" + (f":{check_id('holder', holder)}" if holder else "")

    @staticmethod
    def task_parks() -> str:
        """The parks that wait on a server's task, by deadline (member `run:park`): what `/metrics`
        counts apart from the parks that wait on a person (`store.tasks`)."""
        return f"{PREFIX}task-parks"

    @staticmethod
    def task_hubs() -> str:
        """The hubs that hold tasks only they reach (a set), each alive while its `task_hub` key is."""
        return f"{PREFIX}task-hubs"

    @staticmethod
    def task_hub(holder: str) -> str:
        """Set, with a short lifetime, by the poller of a hub that is alive (`store.tasks`)."""
        return f"{PREFIX}task-hub:{check_id('holder', holder)}"

    @staticmethod
    def meter(counter: str, scope: str, ids: tuple[str, ...]) -> str:
        """One window of a counting rule (`store.meters`): its counter, its scope and the ids that
        name the scope's instance (the run; team and channel; …), each checked by its kind."""
        kinds = {
            "run": ("run",),
            "thread": ("team", "channel", "ts"),
            "channel": ("team", "channel"),
            "requester": ("team", "user"),
            "workspace": ("team",),
        }[check_id("meter_scope", scope)]
        if len(ids) != len(kinds):
            raise BadId(f"a {scope} window is named by {len(kinds)} ids, got {len(ids)}")
        named = ":".join(check_id(kind, value) for kind, value in zip(kinds, ids, strict=True))
        return f"{PREFIX}meter:{check_id('counter', counter)}:{scope}:{named}"

    @staticmethod
    def task(run_id: str, park_id: int) -> str:
        """The task a park waits on (its handle, for the poller), then its result (`store.tasks`)."""
        return f"{PREFIX}task:{check_id('run', run_id)}:{int(park_id)}"

    @staticmethod
    def live_opening(run_id: str) -> str:
        """Set while a run's live message is opening and its ts is not yet written down: a driver
        after a crash then looks for the stream in the thread (`LiveStore.opening`)."""
        return f"{PREFIX}live-opening:{check_id('run', run_id)}"

    @staticmethod
    def stop_request(run_id: str) -> str:
        """Someone asked the run to stop (the value: who); its driver stops before its next step."""
        return f"{PREFIX}stop:{check_id('run', run_id)}"

    @staticmethod
    def all_runs() -> str:
        """A SCAN pattern matching every run record's key (the failed runs' listing)."""
        return f"{PREFIX}run:*"

    @staticmethod
    def budget_spent(day: str) -> str:
        """The tokens spent on UTC day `day` (YYYY-MM-DD), one hash for every user and channel
        (`store.budgets` spells its fields)."""
        return f"{PREFIX}budget:{check_id('day', day)}:spent"

    @staticmethod
    def budget_holds(day: str, scope: str, team: str, who: str) -> str:
        """The holds of requests in flight on `day` against one user's or channel's budget (a hash:
        request id -> "tokens deadline")."""
        kind = check_id("scope", scope)
        owner = f"{kind}:{check_id('team', team)}:{check_id(kind, who)}"
        return f"{PREFIX}budget:{check_id('day', day)}:holds:{owner}"

    @staticmethod
    def budget_settled(day: str) -> str:
        """The requests of `day` whose cost is counted (a set of request ids): counted once."""
        return f"{PREFIX}budget:{check_id('day', day)}:settled"

    @staticmethod
    def metric_counters() -> str:
        """Every counter and histogram bucket of `/metrics`, one hash (`store.counters`; fields named by
        `observe.metrics`)."""
        return f"{PREFIX}metrics:counters"

    @staticmethod
    def metric_run(run_id: str) -> str:
        """What of a run the metrics have counted already, so nothing is counted twice."""
        return f"{PREFIX}metrics:run:{check_id('run', run_id)}"

    @staticmethod
    def metric_clicked(run_id: str, park_id: int) -> str:
        """When the click that completed a park happened: the resume observes click-to-resume."""
        return f"{PREFIX}metrics:clicked:{check_id('run', run_id)}:{int(park_id)}"


def _thread_id(team: str, channel: str, thread_ts: str) -> str:
    return f"{check_id('team', team)}:{check_id('channel', channel)}:{check_id('ts', thread_ts)}"


def run_of_key(key: Any) -> str:
    """The run id of a run record's key (`Keys.run`), as `SCAN` of `Keys.all_runs` returns it."""
    return as_text(key).rpartition(":")[2]


def park_member(member: Any) -> tuple[str, int]:
    """(run id, park id) of a `run:park` member of the expiries or escalations set."""
    run_id, _, park = as_text(member).partition(":")
    return run_id, int(park) if park.isdigit() else 0
