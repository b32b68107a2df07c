"""Grants ("Approve for this thread", or only under one directory): one tool in one thread, written
by the decision that gave it (`ParkStore.decide`), read before a later call of that tool asks for a
card. A grant limited in uses is spent one use per call, atomically (`take_grant`).

A grant is JSON with its format version (`GRANT_VERSION`; one stored without a version is 1). One
this release cannot read, a newer release's among them, reads as no grant: it is neither used nor
spent here, and the call it would have covered asks (a grant only ever saves a card).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from harness.policy import PathArgs, call_paths, inside_directory, relative_path
from harness.state import format_version
from store.base import StorePart, as_text
from store.keys import Keys


def grant_slot(directory: str) -> str:
    """The key suffix of a grant scoped to `directory` ("" for the whole thread)."""
    return hashlib.sha256(directory.encode()).hexdigest()[:24] if directory else ""


@dataclass(frozen=True)
class Grant:
    """`by` let later `ask` calls of `tool` by `requester` run until `until`: anywhere in the thread,
    or only calls every path of which lies in `directory` (`harness.policy.inside_directory`); at
    most `uses` of them (0: no limit)."""

    key: str
    tool: str
    by: str
    requester: str
    until: float
    run_id: str = ""
    directory: str = ""
    uses: int = 0
    taken: tuple[str, ...] = field(default=())  # the calls that spent a use ("run:call")

    @classmethod
    def given(
        cls,
        team: str,
        channel: str,
        thread_ts: str,
        tool: str,
        by: str,
        requester: str,
        until: float,
        run_id: str = "",
        *,
        directory: str = "",
        uses: int = 0,
    ) -> Grant:
        """A grant of `tool` in the thread (under `directory`; "" the whole thread), keyed where
        `GrantStore.grant` and `covering` find it, for the decision that gives it to write
        (`ParkStore.decide`). `BadId` when an id is not one the store writes."""
        key = Keys.grant(team, channel, thread_ts, tool, grant_slot(directory))
        return cls(key, tool, by, requester, until, run_id, directory=directory, uses=uses)

    @property
    def seconds(self) -> float:
        return self.until - time.time()

    @property
    def slot(self) -> str:
        return grant_slot(self.directory)

    @property
    def left(self) -> int | None:
        """Uses left (None: not limited)."""
        return max(0, self.uses - len(self.taken)) if self.uses else None

    def covers(self, call_input: Any, path_args: PathArgs | None) -> bool:
        """Whether a call with these arguments (of a tool whose path arguments are `path_args`)
        lies in the grant's scope (any call, unscoped)."""
        return not self.directory or inside_directory(call_input, self.directory, path_args)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "version": GRANT_VERSION,
            "key": self.key,
            "tool": self.tool,
            "by": self.by,
            "requester": self.requester,
            "until": self.until,
            "run_id": self.run_id,
        }
        if self.directory:
            data["directory"] = self.directory
        if self.uses:
            data["uses"] = self.uses
        if self.taken:  # never an empty list: Lua's cjson would write it back as {}
            data["taken"] = list(self.taken)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Grant:
        """A stored grant of any version this release reads (`NewerRecord`: a newer release's)."""
        return _GRANT_READERS[format_version(data, "grant", GRANT_VERSIONS, unversioned=1)](data)

    @classmethod
    def _from_v1(cls, data: dict[str, Any]) -> Grant:
        taken = data.get("taken") or []
        return cls(
            key=str(data["key"]),
            tool=str(data["tool"]),
            by=str(data["by"]),
            requester=str(data["requester"]),
            until=float(data["until"]),
            run_id=str(data.get("run_id", "")),
            directory=str(data.get("directory") or ""),
            uses=int(data.get("uses") or 0),
            taken=tuple(str(t) for t in taken) if isinstance(taken, list) else (),
        )


GRANT_VERSION = 1  # what `Grant.to_json` writes
# Every version of a stored grant this release reads, and how (tests/store/test_formats.py).
_GRANT_READERS: dict[int, Callable[[dict[str, Any]], Grant]] = {1: Grant._from_v1}
GRANT_VERSIONS = frozenset(_GRANT_READERS)


# KEYS[1] the grant. ARGV[1] the call spending a use ("run:call"). Returns the grant after the use,
# or nothing when it is gone or spent. A grant not limited in uses is only read. The same call
# spending again gets the same answer (a reply lost and the script sent again spends nothing more).
_TAKE = """
local raw = redis.call('GET', KEYS[1])
if not raw then return false end
local g = cjson.decode(raw)
local uses = tonumber(g['uses'] or 0) or 0
if uses <= 0 then return raw end
local taken = g['taken']
if type(taken) ~= 'table' then taken = {} end
for _, id in ipairs(taken) do
  if id == ARGV[1] then return raw end
end
if #taken >= uses then return false end
table.insert(taken, ARGV[1])
g['taken'] = taken
local out = cjson.encode(g)
redis.call('SET', KEYS[1], out, 'KEEPTTL')
return out
"""


def _parse(raw: Any, key: str) -> Grant | None:
    """The grant stored at `key` (its own `key` field is not trusted), unless unreadable or over."""
    if not raw:
        return None
    try:
        found = replace(Grant.from_json(json.loads(as_text(raw))), key=key)
    except (ValueError, KeyError, TypeError, AttributeError):  # StateError, NewerRecord: ValueErrors
        return None
    return found if found.until > time.time() else None


def _directories(call_input: Any, path_args: PathArgs | None) -> list[str]:
    """Every directory (`docs/`, `docs/a/`) holding one of the call's paths."""
    found: dict[str, None] = {}
    paths = call_paths(call_input, path_args)[0] if path_args is not None else []
    for value in paths:
        parts = (relative_path(value) or "").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            found["/".join(parts[:i]) + "/"] = None
    return list(found)[:64]


class GrantStore(StorePart):
    """A thread's standing grants, read, spent and revoked (each key expires with its grant)."""

    def grant(self, team: str, channel: str, thread_ts: str, tool: str, slot: str = "") -> Grant | None:
        """The thread's standing grant of `tool` (scoped to the directory `slot` names), if any."""
        key = Keys.grant(team, channel, thread_ts, tool, slot)
        return _parse(self.redis.get(key), key)

    def covering(
        self, team: str, channel: str, thread_ts: str, tool: str, call_input: Any, path_args: PathArgs | None
    ) -> list[Grant]:
        """The thread's standing grants of `tool` whose scope holds a call with `call_input`, the
        whole-thread one first, then the narrowest directory first (one round trip)."""
        directories = _directories(call_input, path_args)
        keys = [Keys.grant(team, channel, thread_ts, tool)]
        keys += [Keys.grant(team, channel, thread_ts, tool, grant_slot(d)) for d in reversed(directories)]
        found = [_parse(raw, key) for raw, key in zip(self.redis.mget(keys), keys, strict=True)]
        return [g for g in found if g is not None and g.left != 0 and g.covers(call_input, path_args)]

    def take(self, grant: Grant, use: str) -> Grant | None:
        """Spend one use of `grant` for the call `use` ("run:call"), atomically: the grant as it
        stands after, or None when it is gone or spent (then the call asks)."""
        return _parse(self._script(_TAKE)(keys=[grant.key], args=[use]), grant.key)

    def revoke(self, team: str, channel: str, thread_ts: str, tool: str, slot: str = "") -> bool:
        return bool(self.redis.delete(Keys.grant(team, channel, thread_ts, tool, slot)))
