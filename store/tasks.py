"""The tasks parked runs wait on (`harness.tools.tasks`): which is polled when, by whom, and what
each ended with.

A park on a task keeps, beside the park, the task's entry (`harness:task:<run>:<park>`: the call,
its tool's name and the task's handle, later its result) and the time of its next poll in a
sorted set: `harness:task-polls` for a task any worker's hub reaches (an HTTP server's), or
`harness:task-polls:<hub>` for one only that hub reaches (a stdio server's lives in that worker's
child process). A watchdog claims the due ones of both sets it may poll, each poll by one
watchdog; the entry outlives the park by a day, for the resume that reads its result.

What a server said of its task (status, message, result) is untrusted input: it is stored as
JSON and read back through `TaskHandle.from_json` and `ToolResult.from_json`, never evaluated.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from harness.tools import ToolResult
from harness.tools.tasks import BadTask, TaskHandle
from store.base import StorePart, as_text
from store.held import held_runs
from store.keys import DAY, BadId, Keys, check_id, park_member

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskEntry:
    """What a park on a task keeps: the call it answers, its tool, the task, and (once it ended)
    the result that answers the call."""

    call_id: str
    name: str
    handle: TaskHandle
    result: ToolResult | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"call": self.call_id, "name": self.name, "handle": self.handle.to_json()}
        if self.result is not None:
            data["result"] = self.result.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskEntry:
        result = data.get("result")
        return cls(
            call_id=check_id("call", data["call"]),
            name=str(data["name"]),
            handle=TaskHandle.from_json(data["handle"]),
            result=ToolResult.from_json(result) if isinstance(result, dict) else None,
        )


CLAIM_SECONDS = 30.0  # a claimed poll is due again this much later unless its poller says otherwise

# KEYS[1] a polls set. ARGV[1] now, ARGV[2] the claim's end, ARGV[3] at most this many. Each member
# due by now is moved to the claim's end, in one step: two pollers never claim the same one.
_CLAIM = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, member in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], member) end
return due
"""


class TaskStore(StorePart):
    """Parked tasks: their entries and their polls."""

    def schedule(self, run_id: str, park_id: int, entry: TaskEntry, due: float, ttl: int) -> None:
        """Keep `entry` for park `park_id` of `run_id` (for `ttl` seconds and a day) and poll it at
        `due`; written before the park, so a driver dying between them leaves a poll that finds no
        park, and cancels the task."""
        member = f"{check_id('run', run_id)}:{int(park_id)}"
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(Keys.task(run_id, park_id), _pack(entry), ex=ttl + DAY)
            pipe.zadd(Keys.task_polls(entry.handle.holder), {member: due})
            pipe.zadd(Keys.task_parks(), {member: entry.handle.deadline})
            if entry.handle.holder:
                pipe.sadd(Keys.task_hubs(), entry.handle.holder)
            pipe.execute()

    def claim_due(
        self, holder: str, now: float, limit: int = 100, claim: float = CLAIM_SECONDS
    ) -> list[tuple[str, int]]:
        """The parks whose task is due a poll by `now` that hub `holder` reaches (its own and any
        worker's), each returned to exactly one caller (but those of held runs). A claim is a lease:
        the poll is due again `claim` seconds later, so a poller that dies mid-poll loses nothing;
        the poll's `again`, `ended` or `forget` then says when (or that) it is due next."""
        claimed: list[tuple[str, int]] = []
        held = held_runs(self.redis)
        for key in (Keys.task_polls(), Keys.task_polls(holder)):
            found = self._script(_CLAIM)(keys=[key], args=[now, now + claim, limit + len(held)])
            for raw in found:
                member = as_text(raw)
                run, park = park_member(member)
                if run in held or len(claimed) >= limit:
                    self.redis.zadd(key, {member: now}, xx=True)  # not ours to poll now: due as it was
                    continue
                try:
                    claimed.append((check_id("run", run), park))
                except BadId:
                    log.warning("dropped a task poll of a shape never written: %r", member[:80])
                    self.redis.zrem(key, member)
        return claimed

    def alive(self, holder: str, seconds: int) -> None:
        """Hub `holder` is alive for `seconds` more (its poller says so, again and again)."""
        self.redis.set(Keys.task_hub(holder), "1", ex=seconds)

    def orphaned(self, limit: int = 100) -> list[tuple[str, int]]:
        """The parks whose task only a hub that is gone reached (its worker ended, and its stdio
        servers with it), each returned to exactly one caller; a hub with none left is forgotten."""
        claimed: list[tuple[str, int]] = []
        for raw in self.redis.smembers(Keys.task_hubs()):
            holder = as_text(raw)
            try:
                if self.redis.exists(Keys.task_hub(holder)):
                    continue
                key = Keys.task_polls(holder)
            except BadId:
                self.redis.srem(Keys.task_hubs(), raw)
                continue
            for raw_member in self.redis.zrange(key, 0, limit - len(claimed) - 1):
                member = as_text(raw_member)
                if self.redis.zrem(key, member):
                    run, park = park_member(member)
                    try:
                        claimed.append((check_id("run", run), park))
                    except BadId:
                        continue
            if self.redis.zcard(key) == 0:
                self.redis.srem(Keys.task_hubs(), raw)
            if len(claimed) >= limit:
                break
        return claimed

    def entry(self, run_id: str, park_id: int) -> TaskEntry | None:
        """Park `park_id`'s task entry; None when there is none (or it cannot be read: logged)."""
        raw = self.redis.get(Keys.task(run_id, park_id))
        if raw is None:
            return None
        try:
            return TaskEntry.from_json(json.loads(as_text(raw)))
        except (ValueError, KeyError, TypeError, BadTask, BadId) as exc:
            log.warning("run %s park %d: its task entry cannot be read (%s)", run_id, park_id, exc)
            return None

    def again(self, run_id: str, park_id: int, entry: TaskEntry, due: float) -> None:
        """Keep what the last poll found, and poll again at `due` (the entry keeps its lifetime)."""
        member = f"{check_id('run', run_id)}:{int(park_id)}"
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(Keys.task(run_id, park_id), _pack(entry), xx=True, keepttl=True)
            pipe.zadd(Keys.task_polls(entry.handle.holder), {member: due})
            pipe.execute()

    def ended(self, run_id: str, park_id: int, entry: TaskEntry) -> None:
        """The task ended with `entry.result`: kept for the resume, on a replica before the park's
        decision that names it is recorded (a failover keeps what it names); it is polled no more."""
        member = f"{check_id('run', run_id)}:{int(park_id)}"
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(Keys.task(run_id, park_id), _pack(entry), xx=True, keepttl=True)
            pipe.zrem(Keys.task_polls(entry.handle.holder), member)
            waited = self.replicas.waits(pipe)
            answers = pipe.execute(raise_on_error=False)
        if isinstance(answers[0], Exception):
            raise answers[0]
        if waited:
            self.replicas.check(answers[-1], "decision")

    def poke(self, run_id: str, park_id: int, holder: str) -> None:
        """Poll park `park_id`'s task at once (a Stop: its poller then cancels it), if it is still
        scheduled (one being polled now is scheduled again after, and that poll sees the Stop)."""
        member = f"{check_id('run', run_id)}:{int(park_id)}"
        self.redis.zadd(Keys.task_polls(holder), {member: 0}, xx=True)

    def unpark(self, run_id: str, park_id: int) -> None:
        """The run no longer waits on park `park_id`'s task (it resumed or stopped)."""
        self.redis.zrem(Keys.task_parks(), f"{check_id('run', run_id)}:{int(park_id)}")

    def forget(self, run_id: str, park_id: int, holder: str | None = None) -> None:
        """The task is over for its run (answered, cancelled): its entry goes, and (`holder`: the
        set it is polled from) its polls."""
        member = f"{check_id('run', run_id)}:{int(park_id)}"
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(Keys.task(run_id, park_id))
            if holder is not None:
                pipe.zrem(Keys.task_polls(holder), member)
            pipe.execute()


def _pack(entry: TaskEntry) -> str:
    return json.dumps(entry.to_json(), ensure_ascii=False, separators=(",", ":"))
