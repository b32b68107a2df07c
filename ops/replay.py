"""`python -m workers replay DRAFT.toml [--days N]`: what a draft config would have done to the calls
the audit recorded (`ops.rulings`).

Each recorded call is ruled again as a run would rule it under the draft: the profile of its
channel and workspace (`Config.match`), whether that profile offers the tool at all (its
built-ins, modules and MCP servers, from where the tool came when it was called), then the
profile's policy over the recorded arguments and the tool's own tier. One line is printed per call
whose tier would change, then a summary. Nothing is started: no MCP server, no module, no model;
Redis is only read.

Counting rules (`max_calls`, `max_sum`) are replayed in the order the calls were recorded: each
call meets the window its earlier calls filled under the draft, in its own scope (run, thread,
channel, requester or workspace, from the entry) and at its recorded time. A replayed call is
counted when the draft would let it run: `allow`, or `ask` and a person approved it then
(`approved`, from the decisions' audit).

A rule that reads an argument the audit kept only in part (a long string cut, or left out) may
decide differently over the whole value: such calls are counted as uncertain and say so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness import texts
from harness.config import BUILTIN_TOOL_NAMES, Config
from harness.counting import Count, MemoryMeter, Where
from harness.policy import Tier
from harness.tools.files import BUILTIN_TOOLS
from ops.audit import RULED, _safe, _when

MCP_SOURCE = "mcp:"
APPROVALS_READ = 50_000  # the newest decisions read to know which asked calls a person approved


def approved_calls(decisions: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """The (run, call) pairs the decisions' audit says a person approved (not a grant)."""
    return {
        (str(e.get("run_id")), str(e.get("call_id")))
        for e in decisions
        if e.get("verdict") == "approved" and e.get("grant") != "used"
    }


@dataclass(frozen=True)
class Replayed:
    """One recorded call ruled again: the tier it had, the tier it would get, and why."""

    entry: Mapping[str, Any]
    was: Tier
    would_be: Tier
    why: str
    uncertain: bool = False

    @property
    def changed(self) -> bool:
        return self.was is not self.would_be

    def line(self) -> str:
        """`WHEN<TAB>CHANNEL<TAB>TOOL<TAB>WAS<TAB>WOULD_BE<TAB>WHY`, nothing in it a terminal acts on."""
        fields = (
            _when(self.entry),
            _safe(str(self.entry.get("channel") or "")),
            _safe(str(self.entry.get("tool") or "")),
            self.was.value,
            self.would_be.value,
            _safe(self.why),
        )
        return "\t".join(fields)


def recorded_calls(entries: Iterable[Mapping[str, Any]]) -> Iterator[tuple[Mapping[str, Any], Tier]]:
    """The audit's tier decisions among `entries`, each with the tier it got; other kinds of
    entries, and decisions whose tier cannot be read, are passed over."""
    for entry in entries:
        if entry.get("event") != RULED or entry.get("verdict") is not None:
            continue
        tier = _tier(entry.get("tier"))
        if tier is not None and isinstance(entry.get("tool"), str):
            yield entry, tier


def replay(
    draft: Config, entries: Iterable[Mapping[str, Any]], approved: Collection[tuple[str, str]] = ()
) -> Iterator[Replayed]:
    """Every recorded call of `entries` ruled again under `draft`, in order, counting rules counting
    what would have run (`approved`: the (run, call) pairs a person approved)."""
    meter = MemoryMeter()
    for entry, was in recorded_calls(entries):
        yield rule_again(draft, entry, was, meter, approved)


def rule_again(
    draft: Config,
    entry: Mapping[str, Any],
    was: Tier,
    meter: MemoryMeter | None = None,
    approved: Collection[tuple[str, str]] = (),
) -> Replayed:
    """The tier `draft` gives the recorded call `entry` (which had `was`), and why; with `meter`,
    counting rules read and count its windows (without, they are passed over)."""
    channel, team = str(entry.get("channel") or ""), str(entry.get("team") or "")
    match = draft.match(channel, team)
    settings, tool = match.settings, str(entry["tool"])
    source = _source(entry, tool)
    refused = _not_offered(draft, settings, tool, source)
    if refused:
        where = f"profile {settings.profile}" if settings.profile else "the top level"
        return Replayed(entry, was, Tier.DENY, f"not offered in {where} ({match.why}): {refused}")
    own_tier, own_why = _own_tier(draft, entry, source)
    recorded = entry.get("input")
    arguments = recorded if isinstance(recorded, dict) else {}
    rules = settings.policy.counting_rules(tool, arguments)
    call_id = str(entry.get("call_id") or "")
    if meter is not None:
        _place(meter, entry)
    seen = {r.key: meter.seen(r, call_id) for r in rules} if meter is not None else None
    ruling = settings.policy.decide(tool, arguments, own_tier, own_why, _always_ask_why(entry, source), seen)
    person = (str(entry.get("run_id") or ""), call_id) in approved
    if meter is not None and rules and (ruling.tier is Tier.ALLOW or (ruling.tier is Tier.ASK and person)):
        counts = [Count(r, (r.window.amount(arguments) if r.window else None) or 0.0, True) for r in rules]
        meter.take(call_id, counts)
    why = ruling.why
    if settings.profile_label != str(entry.get("profile") or ""):
        where = f"profile {settings.profile}" if settings.profile else "the top level"
        why += f" (now under {where}: {match.why})"
    unsure = _unsure_arguments(settings, tool, entry, arguments)
    if unsure:
        why += f" (uncertain: the audit kept only part of {', '.join(unsure)})"
    return Replayed(entry, was, ruling.tier, why, uncertain=bool(unsure))


@dataclass
class Tally:
    """What a replay found, counted as it goes (the calls themselves are not kept)."""

    calls: int = 0
    changes: Counter[str] = field(default_factory=Counter)  # "allow→ask" -> how many
    uncertain: int = 0

    def add(self, result: Replayed) -> None:
        self.calls += 1
        if result.changed:
            self.changes[f"{result.was.value}→{result.would_be.value}"] += 1
        self.uncertain += result.uncertain

    def summary(self) -> str:
        """`120 calls, 7 would change: 5 allow→ask, 2 ask→deny` (or `…, none would change`)."""
        line = f"{self.calls} calls, "
        if not self.changes:
            line += "none would change"
        else:
            ordered = sorted(self.changes.items(), key=lambda kv: (-kv[1], kv[0]))
            line += f"{self.changes.total()} would change: " + ", ".join(f"{n} {kind}" for kind, n in ordered)
        if self.uncertain:
            line += f"; {self.uncertain} uncertain (a rule reads an argument the audit kept only in part)"
        return line


def summary(results: Iterable[Replayed]) -> str:
    """The summary line of `results` (`Tally.summary`)."""
    tally = Tally()
    for result in results:
        tally.add(result)
    return tally.summary()


def _place(meter: MemoryMeter, entry: Mapping[str, Any]) -> None:
    """`meter` set where and when the recorded call was made."""
    at = entry.get("at")
    when = float(at) if isinstance(at, int | float) and not isinstance(at, bool) else 0.0
    meter.where = Where(
        *(str(entry.get(k) or "") for k in ("run_id", "team", "channel", "thread_ts", "requester"))
    )
    meter.clock = lambda: when


def _source(entry: Mapping[str, Any], tool: str) -> str:
    """Where the recorded tool came from; a tool not offered then is a built-in if one is so named."""
    source = entry.get("source")
    if isinstance(source, str) and source:
        return source
    return "builtin" if tool in BUILTIN_TOOL_NAMES else ""


def _not_offered(draft: Config, settings: Config, tool: str, source: str) -> str:
    """Why `settings` would not offer `tool` (from `source`); "" when it would."""
    prefix = f"profiles[{settings.profile}]." if settings.profile else ""
    if source == "builtin":
        if tool in settings.tools.builtin:
            return ""
        return f"{prefix}tools.builtin does not list {tool}"
    if source.startswith(MCP_SOURCE):
        server = source[len(MCP_SOURCE) :]
        if not any(s.name == server for s in draft.mcp_servers):
            return f"no [[mcp.servers]] is named {server}"
        return "" if settings.offers_server(server) else f"{prefix}tools.mcp does not list {server}"
    if source:
        return "" if source in settings.tools.modules else f"{prefix}tools.modules does not list {source}"
    return "no tool of that name was offered when the call was made"


def _own_tier(draft: Config, entry: Mapping[str, Any], source: str) -> tuple[Tier | None, str]:
    """The tool's own tier under `draft`: a built-in's own; an MCP tool's read-only claim counts
    only on a server the draft trusts; any other tool's is what was recorded."""
    builtin = next((t for t in BUILTIN_TOOLS if t.name == entry.get("tool")), None)
    if source == "builtin" and builtin is not None:
        return builtin.own_tier, builtin.own_tier_why
    if source.startswith(MCP_SOURCE):
        server = source[len(MCP_SOURCE) :]
        if entry.get("claims_read_only") is not True:
            return None, ""
        trusted = any(s.name == server and s.trust_annotations for s in draft.mcp_servers)
        if trusted:
            return Tier.ALLOW, texts.WHY_MCP_READ_ONLY.format(server=server)
        return None, texts.WHY_MCP_CLAIM_NOT_TRUSTED.format(server=server)
    own_why = entry.get("own_why")
    return _tier(entry.get("own_tier")), own_why if isinstance(own_why, str) else ""


def _always_ask_why(entry: Mapping[str, Any], source: str) -> str:
    """Why the recorded MCP tool asks on every call, when its server said so (`_meta`) then."""
    if source.startswith(MCP_SOURCE) and entry.get("requires_interaction") is True:
        return texts.WHY_MCP_ALWAYS_ASK.format(server=source[len(MCP_SOURCE) :])
    return ""


def _unsure_arguments(
    settings: Config, tool: str, entry: Mapping[str, Any], arguments: Mapping[str, Any]
) -> list[str]:
    """The arguments a rule of `settings` over `tool` reads that the audit did not keep whole."""
    cut = entry.get("cut")
    cut_names = {str(k) for k in cut} if isinstance(cut, list) else set()
    more = bool(entry.get("cut_more"))
    rules = settings.policy.rules_for(tool)
    read = dict.fromkeys(
        [k for rule in rules for k in rule.args]
        + [r.window.sum_arg for r in rules if r.window and r.window.sum_arg]
    )
    return [k for k in read if k in cut_names or (more and k not in arguments)]


def _tier(value: Any) -> Tier | None:
    try:
        return Tier(value)
    except (TypeError, ValueError):
        return None
