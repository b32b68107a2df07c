"""Suggested rules: calls people approved again and again and never declined, as a ready
`[[policy.rules]]` snippet with what replaying it over the recorded calls would change.

A pure function of the decisions' audit and the calls' tier decisions (`ops.rulings`), both
read by the caller, bounded. Approved calls are grouped by profile, tool and, for a tool with path
arguments, the directory its paths lie in (`harness.policy.grant_directory`); a group
approved at least `MIN_APPROVALS` times by people (not by a grant) in the window, with no decline
the candidate rule would cover, becomes a suggestion. An expiry is nobody's "no": it counts neither
way. An approval whose input was edited is treated as a decline (the call as asked was not fine).
A call whose path lies at the workspace's root, or outside it, is never suggested: a rule over it
would be no narrower than the whole tool.

A rule's `args` globs match only string values of top-level arguments, so a rule is suggested only
where one can hold every path: it names every path argument of the tool (`source` and `destination`
alike), each a string in the call. A call that carries a path in a list (`paths = [...]`), in an
argument not known to hold paths, or with one of the tool's path arguments missing, gets no
suggestion at all (never an `allow` without `args`); nor does a call whose tool's path arguments
are not known (its tier decision, which records them, no longer read or written before they were).

Nor is a tool that always asks (`[policy] always_ask`, or its server's `_meta`, then or now): a
person is to look at every call of it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from harness.config import Config
from harness.policy import PathArgs, Policy, Rule, Tier, call_paths, grant_directory, no_grant
from harness.tools.files import BUILTIN_TOOLS
from messages.home import SUGGEST_DAYS, SUGGEST_MIN_APPROVALS, SUGGESTIONS_MAX
from ops.replay import Tally, recorded_calls, rule_again

DAY = 86_400
WINDOW = SUGGEST_DAYS * DAY  # decisions read back this far
MIN_APPROVALS = SUGGEST_MIN_APPROVALS  # approvals by people a group needs before it is suggested
SCAN_MAX = 5_000  # entries of each stream read at most for one Home tab
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_GLOB_CHARS = ("*", "?", "[", "]", "{", "}")


@dataclass(frozen=True)
class Suggestion:
    """One candidate rule: where it goes, how often people approved its calls, its TOML, and
    what replaying the recorded calls with it added would change."""

    profile: str  # "" = the top level
    tool: str
    args: Mapping[str, str]  # argument -> glob ("docs/**"); empty: every call of the tool
    approvals: int
    snippet: str
    effect: str  # `Tally.summary` of the replay with the rule added


@dataclass
class _Group:
    approvals: int = 0
    inputs: list[Mapping[str, Any]] = field(default_factory=list)


def suggest(
    config: Config,
    decisions: Iterable[Mapping[str, Any]],
    calls: Iterable[Mapping[str, Any]],
    *,
    now: float,
    team: str | None = None,
    profiles: Collection[str] | None = None,
    limit: int = SUGGESTIONS_MAX,
) -> list[Suggestion]:
    """The suggested rules from `decisions` (the decisions' audit) and `calls` (the calls' tier
    decisions, for each decided call's profile and arguments), most approved first; only entries
    of the last `WINDOW` (and of workspace `team`, when given) count, and only rules for
    `profiles` ("" = the top level; None = every one) are suggested."""
    since = now - WINDOW
    ruled = [c for c in calls if _recent(c, since, team)]
    by_call = {(c.get("run_id"), c.get("call_id")): c for c in ruled}
    groups: dict[tuple[str, str, tuple[tuple[str, str], ...]], _Group] = {}
    refused: list[tuple[str, str, Mapping[str, Any]]] = []  # (profile, tool, input) of each "no"
    for entry in decisions:
        verdict = entry.get("verdict")
        if verdict not in ("approved", "declined") or not _recent(entry, since, team):
            continue
        if entry.get("kind") in ("input", "task"):  # a server's question or task's end, not a decision
            continue
        found = _call_of(config, entry, by_call)
        if found is None:
            continue
        profile, tool, arguments, path_args = found
        if _always_asks(config, profile, tool, entry, by_call):
            continue
        if verdict == "declined" or entry.get("edited_input") is not None:
            refused.append((profile, tool, arguments))
            continue
        if entry.get("grant_until") is not None or not entry.get("by"):
            continue  # a grant let it run: nobody looked at this one
        args = _rule_args(arguments, path_args)
        if args is None:
            continue
        group = groups.setdefault((profile, tool, tuple(sorted(args.items()))), _Group())
        group.approvals += 1
    kept: list[tuple[int, str, str, Rule]] = []
    for (profile, tool, args_key), group in groups.items():
        if group.approvals < MIN_APPROVALS or config.for_profile(profile) is None:
            continue
        if profiles is not None and profile not in profiles:
            continue
        probe = Rule(number=0, tool=tool, args=dict(args_key), tier=Tier.ALLOW)
        if not any(p == profile and t == tool and probe.matches(tool, a) for p, t, a in refused):
            kept.append((group.approvals, profile, tool, probe))
    kept.sort(key=lambda k: (-k[0], k[1], k[2], sorted(k[3].args.items())))
    # Only the shown ones are replayed, each over the recorded calls it covers: no other call's
    # tier can change by it.
    return [
        Suggestion(profile, tool, rule.args, n, snippet(profile, rule), _replay(config, profile, rule, ruled))
        for n, profile, tool, rule in kept[:limit]
    ]


def snippet(profile: str, rule: Rule) -> str:
    """The TOML of `rule` as a `[[policy.rules]]` table, or `[[profiles.policy.rules]]` to go
    under the `[[profiles]]` table of `profile`."""
    lines = []
    if profile:
        lines.append(f"# under the [[profiles]] table with name = {_toml_str(profile)}")
        lines.append("[[profiles.policy.rules]]")
    else:
        lines.append("[[policy.rules]]")
    lines.append(f"tool = {_toml_str(rule.tool)}")
    if rule.args:
        pairs = ", ".join(f"{_toml_key(k)} = {_toml_str(v)}" for k, v in rule.args.items())
        lines.append(f"args = {{ {pairs} }}")
    lines.append(f"tier = {_toml_str(rule.tier.value)}")
    return "\n".join(lines)


def _recent(entry: Mapping[str, Any], since: float, team: str | None) -> bool:
    at = entry.get("at")
    if not isinstance(at, (int, float)) or at < since:
        return False
    return team is None or entry.get("team") == team


def _call_of(
    config: Config, entry: Mapping[str, Any], by_call: Mapping[tuple[Any, Any], Mapping[str, Any]]
) -> tuple[str, str, Mapping[str, Any], PathArgs | None] | None:
    """The decided call's profile, tool, arguments and path arguments: from its tier decision when
    the calls' stream still holds it, else from the entry's own preview (when whole) and its
    channel's profile (its path arguments then not known)."""
    ruled = by_call.get((entry.get("run_id"), entry.get("call_id")))
    tool = entry.get("tool")
    path_args = None
    if ruled is not None and not ruled.get("cut"):
        arguments, profile = ruled.get("input"), str(ruled.get("profile") or "")
        path_args = _path_args_of(ruled)
    elif ruled is None:
        try:
            arguments = json.loads(str(entry.get("input_preview") or ""))
        except ValueError:
            return None  # cut, or not JSON: which directory it named is not known
        profile = config.match(str(entry.get("channel") or ""), str(entry.get("team") or "")).profile or ""
    else:
        return None  # its arguments were kept only in part
    if not isinstance(tool, str) or not tool or not isinstance(arguments, dict):
        return None
    return profile, tool, arguments, path_args


def _always_asks(
    config: Config,
    profile: str,
    tool: str,
    entry: Mapping[str, Any],
    by_call: Mapping[tuple[Any, Any], Mapping[str, Any]],
) -> bool:
    """Whether the decided call's tool asks on every call: it did when it was asked about (its
    why), or `profile`'s policy lists it in `always_ask` now."""
    ruled = by_call.get((entry.get("run_id"), entry.get("call_id"))) or {}
    whys = (str(entry.get("tier_why") or ""), str(ruled.get("why") or ""))
    if any(no_grant(why) for why in whys):  # always asks, past a limit, or a flow: no rule lifts it
        return True
    if ruled.get("requires_interaction") is True:
        return True
    settings = config.for_profile(profile)
    return settings is not None and bool(settings.policy.always_ask_key(tool))


def _path_args_of(ruled: Mapping[str, Any]) -> PathArgs | None:
    """The path arguments a tier decision recorded; for one written before they were, a built-in's
    own (they never change); else None."""
    if "path_args" in ruled:
        return PathArgs.from_json(ruled["path_args"])
    if ruled.get("source") == "builtin":
        return next((t.path_args for t in BUILTIN_TOOLS if t.name == ruled.get("tool")), None)
    return None


def _rule_args(arguments: Mapping[str, Any], path_args: PathArgs | None) -> dict[str, str] | None:
    """The `args` of a rule covering this call: every path argument of its tool under the
    directory they lie in (`docs/**`); {} for a tool with none and a call carrying no path; None
    when no rule would fit narrowly or safely."""
    if path_args is None:
        return None  # which arguments hold paths is not known
    if call_paths(arguments, path_args)[1]:
        return None  # a path under an argument no rule would name
    if not path_args.paths:
        return {}
    if not all(isinstance(arguments.get(name), str) for name in path_args.paths):
        return None  # one missing (a rule naming it would never match), or a list or an object
    directory = grant_directory(arguments, path_args)
    if directory is None or any(c in directory for c in _GLOB_CHARS):
        return None  # at the root, outside the workspace, or a name a glob would read as a pattern
    return {name: f"{directory}**" for name in path_args.paths}


def _replay(config: Config, profile: str, rule: Rule, calls: Iterable[Mapping[str, Any]]) -> str:
    """What the recorded `calls` that `rule` covers would get with it added to `profile`'s own
    rules, in words (`Tally.summary`: `40 calls, 12 would change: 12 ask→allow`)."""
    draft = _with_rule(config, profile, rule)
    tally = Tally()
    covered = (c for c in calls if c.get("tool") == rule.tool and rule.matches(rule.tool, _input(c)))
    for entry, was in recorded_calls(covered):
        tally.add(rule_again(draft, entry, was))
    return tally.summary()


def _input(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    recorded = entry.get("input")
    return recorded if isinstance(recorded, dict) else {}


def _with_rule(config: Config, profile: str, rule: Rule) -> Config:
    """`config` with `rule` appended where the snippet says: the top level's rules (every profile
    inherits them, after its own), or after `profile`'s own rules."""
    if not profile:
        top = config.policy
        added = replace(rule, number=len(top.rules) + 1)
        profiles = tuple(
            replace(p, settings=replace(p.settings, policy=_appended(p.settings.policy, added)))
            for p in config.profiles
        )
        return replace(config, policy=_appended(top, added), profiles=profiles)
    table = f"profiles[{profile}].policy.rules"
    changed = []
    for p in config.profiles:
        if p.name == profile:
            policy = p.settings.policy
            own = [r for r in policy.rules if r.table == table]
            added = replace(rule, number=len(own) + 1, table=table)
            rules = (*own, added, *(r for r in policy.rules if r.table != table))
            p = replace(p, settings=replace(p.settings, policy=replace(policy, rules=rules)))
        changed.append(p)
    return replace(config, profiles=tuple(changed))


def _appended(policy: Policy, rule: Rule) -> Policy:
    return replace(policy, rules=(*policy.rules, rule))


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml_str(key)


def _toml_str(text: str) -> str:
    """A TOML basic string: quotes, backslashes and every control character escaped."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
