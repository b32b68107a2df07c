"""The policy: a pure function from one call to its tier and why.

The tier of a call, first match wins (the contract's order):

1. `[[policy.rules]]` whose `tool` and every `args` glob match the call: a matching `deny` wins
   over any other match; otherwise the first matching rule in file order.
2. `[policy.tools]`: the exact name, else the longest glob that matches (the first of equals).
3. The tool's own tier (a built-in's, or an MCP tool's `readOnlyHint` on a trusted server).
4. `[policy].default`.

A counting rule (`max_calls` or `max_sum`, with `per` and `scope`: `harness.counting`) matches a
call only past its limit: within it, it is passed over as if absent, and the next matching rule (or
step 2) decides. What its window holds comes in as `Seen` values, read by the caller's `Meter`.

Then, unless the tier is `deny`: a tool that `[policy] always_ask` lists (a glob, as in
`[policy.tools]`), or whose MCP `_meta` says `anthropic/requiresUserInteraction: true`, asks, with
that as its why (`always_asks`): no grant, Approve all or suggested rule covers such a call.

Globs: `*` matches within one path segment, `**` across segments, `?` one character of a
segment. An argument glob matches the string value of the named top-level argument, after both
are normalised the way the file tools resolve paths (`drafts/../x` is `x`); a missing or
non-string argument never matches. No I/O, no clock: the `why` travels to cards and the audit.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from harness.counting import LimitSeen, Seen, Window, counter_id, limit_tail, limit_why, read_limit
from harness.flows import Flows, flow_why
from harness.globs import glob_match, normalise_path
from harness.texts import WHY_DECIDED_AGAIN, WHY_MCP_ALWAYS_ASK


class Tier(StrEnum):
    """How a tool call is treated: run at once, run after a human says yes, or never run."""

    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


@dataclass(frozen=True)
class Rule:
    """One `[[policy.rules]]` table: a tool name or glob, argument globs, and the tier they give."""

    number: int  # 1-based, in file order: how cards and --list-tools name it
    tool: str
    args: Mapping[str, str]
    tier: Tier
    table: str = "policy.rules"  # a profile's own rules: "profiles[NAME].policy.rules"
    window: Window | None = None  # a counting rule's limit: it speaks only past it

    @property
    def key(self) -> str:
        """`policy.rules[2]`: unique within one policy (what `Seen` values are keyed by)."""
        return f"{self.table}[{self.number}]"

    @property
    def counter_id(self) -> str:
        """The counter a counting rule keeps (`harness.counting.counter_id`)."""
        assert self.window is not None
        return counter_id(self.tool, self.args, self.window)

    def matches(self, name: str, arguments: Mapping[str, Any]) -> bool:
        """Whether a call of `name` with `arguments` is one this rule speaks of."""
        if not glob_match(self.tool, name, paths=False):
            return False
        for arg, pattern in self.args.items():
            value = arguments.get(arg)
            if not isinstance(value, str) or not glob_match(pattern, value, paths=True):
                return False
        return True

    def describe(self) -> str:
        """`policy.rules[N] (tool = "…", path = "…")`."""
        parts = [f"tool = {_quoted(self.tool)}"] + [f"{k} = {_quoted(v)}" for k, v in self.args.items()]
        return f"{self.table}[{self.number}] ({', '.join(parts)})"


@dataclass(frozen=True)
class Ruling:
    """A call's tier and the step, key or rule that decided it, in words."""

    tier: Tier
    why: str


@dataclass(frozen=True)
class Policy:
    """The `[policy]` table: a default tier, tiers by tool name or glob, and argument rules."""

    default: Tier = Tier.ASK
    tools: Mapping[str, Tier] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    # Where an entry of `tools` (and the default) was written, when not `[policy]`: a profile's
    # own entries are named "profiles[NAME].policy.tools", so a why points at the right line.
    origins: Mapping[str, str] = field(default_factory=dict)
    default_key: str = "policy.default"
    # `[policy] always_ask`: names or globs of tools asked about on every call (unless denied).
    always_ask: tuple[str, ...] = ()
    # Where an entry of `always_ask` was written, when not `[policy]` (a profile's own list).
    always_ask_origins: Mapping[str, str] = field(default_factory=dict)
    # `[policy.flows]`: after a run read an untrusted tool's output, its sends-out calls ask.
    flows: Flows = field(default_factory=Flows)

    def decide(
        self,
        name: str,
        arguments: Any,
        own_tier: Tier | None = None,
        own_why: str = "",
        always_ask_why: str = "",
        seen: Mapping[str, Seen] | None = None,
        untrusted: str = "",
    ) -> Ruling:
        """The tier of one call of `name` with `arguments`, and why.

        `always_ask_why`: the tool itself says every call needs a person (an MCP tool's `_meta`), and
        why. Like `always_ask`, it only ever makes a call stricter: `deny` still wins.
        `seen`: what the windows of the counting rules the call matches hold, by `Rule.key`; a rule
        missing from it was not read, and counts as past its limit (fail closed). None: no counter
        was consulted (`--list-tools`), so counting rules are passed over.
        """
        args = arguments if isinstance(arguments, Mapping) else {}
        matched = []
        for rule in self.rules:
            if rule.matches(name, args) and (why := self._speaks(rule, args, seen)):
                matched.append((rule, why))
        if matched:
            chosen, why = next(((r, w) for r, w in matched if r.tier is Tier.DENY), matched[0])
            ruling = Ruling(chosen.tier, why)
        else:
            ruling = self.decide_tool(name, own_tier, own_why)
        if ruling.tier is Tier.DENY:
            return ruling
        always = self.always_ask_key(name) or always_ask_why
        if always:
            return Ruling(Tier.ASK, always)
        if untrusted and self.flows and (sends := self.flows.sends(name)):
            return Ruling(Tier.ASK, flow_why(sends, untrusted))
        return ruling

    @staticmethod
    def _speaks(rule: Rule, args: Mapping[str, Any], seen: Mapping[str, Seen] | None) -> str:
        """The why of `rule` deciding a call it matches; "" for a counting rule within its limit."""
        if rule.window is None:
            return rule.describe()
        if seen is None:
            return ""
        tail = limit_tail(rule.window, args, seen.get(rule.key, Seen.unknown()))
        return limit_why(rule.describe(), rule.window, tail) if tail else ""

    def counting_rules(self, name: str, arguments: Any) -> tuple[Rule, ...]:
        """The counting rules a call of `name` with `arguments` matches: whose windows it is read
        against when ruled, and counted in when it runs."""
        args = arguments if isinstance(arguments, Mapping) else {}
        return tuple(r for r in self.rules if r.window is not None and r.matches(name, args))

    def always_ask_key(self, name: str) -> str:
        """`policy.always_ask["deploy_*"]`: the entry of `always_ask` that lists `name` (the exact
        name, else the longest glob, as in `[policy.tools]`); "" when none does."""
        if name in self.always_ask:
            return self._always_key(name)
        globs = [(len(p), i, p) for i, p in enumerate(self.always_ask) if _is_glob(p) and glob_match(p, name)]
        if not globs:
            return ""
        _, _, pattern = max(globs, key=lambda g: (g[0], -g[1]))
        return self._always_key(pattern)

    def _always_key(self, pattern: str) -> str:
        return f"{self.always_ask_origins.get(pattern, 'policy.always_ask')}[{_quoted(pattern)}]"

    def decide_tool(self, name: str, own_tier: Tier | None = None, own_why: str = "") -> Ruling:
        """Steps 2 to 4 only: the tier of `name` whatever its arguments.

        `own_why` with no `own_tier` says why the tool gives itself none (an MCP tool's read-only
        claim on a server whose annotations are not trusted): the default's why carries it.
        """
        if name in self.tools:
            return Ruling(self.tools[name], f"{self._table(name)}.{_key(name)}")
        globs = [(len(p), i, p) for i, p in enumerate(self.tools) if _is_glob(p) and glob_match(p, name)]
        if globs:
            _, _, pattern = max(globs, key=lambda g: (g[0], -g[1]))
            return Ruling(self.tools[pattern], f"{self._table(pattern)}.{_key(pattern)}")
        if own_tier is not None:
            return Ruling(own_tier, own_why or "tool's own tier")
        return Ruling(self.default, f"{self.default_key} ({own_why})" if own_why else self.default_key)

    def _table(self, key: str) -> str:
        return self.origins.get(key, "policy.tools")

    def rules_for(self, name: str) -> tuple[Rule, ...]:
        """The rules whose `tool` matches `name`: they may decide a call of it by its arguments."""
        return tuple(r for r in self.rules if glob_match(r.tool, name, paths=False))


@dataclass(frozen=True)
class Source:
    """A `why` read back into its parts, so cards can say it in plain words (`read_why`).

    `step`: "rule" (`[[policy.rules]]`), "limit" (a counting rule past its limit: `limit` says
    what its window held), "tools" (`[policy.tools]`), "own" (the tool's own tier),
    "default" (`[policy].default`), "always" (`[policy] always_ask`, or the tool's MCP `_meta`)
    or "other" (anything else, shown as it is). `profile`: the profile whose table decided, or "".
    `number`, `tool`, `args`: a rule's number, tool glob and argument globs; `tool` is the
    `[policy.tools]` or `always_ask` entry for "tools" and "always" (none: the server asked).
    `detail`: the default's note in parentheses, or the tool's own why, or the server that asks
    every call. `was`: the tier before, when decided again.
    """

    step: str
    text: str
    profile: str = ""
    number: int = 0
    tool: str = ""
    args: tuple[tuple[str, str], ...] = ()
    detail: str = ""
    was: Tier | None = None
    limit: LimitSeen | None = None


_AGAIN = re.compile(
    "(?s)" + re.escape(WHY_DECIDED_AGAIN).replace(r"\{why\}", "(.*)").replace(r"\{was\}", "(allow|ask|deny)")
)
_PROFILE = re.compile(r"profiles\[([^\]]*)\]\.(.*)", re.DOTALL)
_RULE = re.compile(r"policy\.rules\[([0-9]+)\] \((.*)\)", re.DOTALL)
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ALWAYS = re.compile(r'policy\.always_ask\[("(?:[^"\\]|\\.)*")\]', re.DOTALL)
_FLOW = re.compile(r'policy\.flows\.sends_out\[("(?:[^"\\]|\\.)*")\] after (.+)', re.DOTALL)
_MCP_ALWAYS = re.compile(re.escape(WHY_MCP_ALWAYS_ASK).replace(r"\{server\}", "(.*)"), re.DOTALL)


def read_why(why: str) -> Source:
    """`why` as `Policy.decide` wrote it, read back into a `Source` (step "other" when unknown)."""
    was: Tier | None = None
    if again := _AGAIN.fullmatch(why):
        why, was = again.group(1), Tier(again.group(2))
    profile = ""
    rest = why
    if found := _PROFILE.fullmatch(why):
        profile, rest = found.group(1), found.group(2)
    source = _read_step(rest, why)
    return replace(source, profile=profile if source.step != "other" else "", was=was)


def _read_step(rest: str, why: str) -> Source:
    if counted := read_limit(rest):
        rule_part, limit = counted
        if (source := _read_step(rule_part, why)).step == "rule":
            return replace(source, step="limit", limit=limit)
    if rule := _RULE.fullmatch(rest):
        parts = _read_parts(rule.group(2))
        if parts and parts[0][0] == "tool":
            return Source("rule", why, number=int(rule.group(1)), tool=parts[0][1], args=tuple(parts[1:]))
    if rest.startswith("policy.tools."):
        key = rest.removeprefix("policy.tools.")
        quoted = _QUOTED.fullmatch(key)
        return Source("tools", why, tool=_unquoted(quoted.group(1)) if quoted else key)
    if rest == "policy.default":
        return Source("default", why)
    if rest.startswith("policy.default (") and rest.endswith(")"):
        return Source("default", why, detail=rest[len("policy.default (") : -1])
    if why.startswith("tool's own tier"):
        return Source("own", why, detail=why)
    if flow := _FLOW.fullmatch(rest):
        return Source("flow", why, tool=_unquoted(flow.group(1)[1:-1]), detail=flow.group(2))
    if always := _ALWAYS.fullmatch(rest):
        return Source("always", why, tool=_unquoted(always.group(1)[1:-1]))
    if server := _MCP_ALWAYS.fullmatch(why):
        return Source("always", why, detail=server.group(1))
    return Source("other", why)


def always_asks(why: str) -> bool:
    """Whether a call ruled with `why` asks on every call (`[policy] always_ask`, or its server's
    `_meta`): no grant, Approve all or suggested rule may stand in for a person's look at it."""
    return read_why(why).step == "always"


def no_grant(why: str) -> bool:
    """Whether no grant may stand in for a person's look at a call ruled with `why`: one that always
    asks (`always_asks`), one past a counting rule's limit (`limit_asks`), or one that sends out
    after the run read untrusted output (`flow_asks`)."""
    return read_why(why).step in ("always", "limit", "flow")


def flow_asks(why: str) -> bool:
    """Whether a call ruled with `why` asks because its run read an untrusted tool's output and
    it sends data out (`harness.flows`): no grant or suggested rule covers it."""
    return read_why(why).step == "flow"


def limit_asks(why: str) -> bool:
    """Whether a call ruled with `why` asks because a counting rule's limit is reached: no grant
    covers it (a grant would lift the limit it is there to hold); a person approves it."""
    return read_why(why).step == "limit"


def _read_parts(text: str) -> list[tuple[str, str]]:
    """`tool = "…", path = "…"` (as `Rule.describe` writes them) as (key, value) pairs; [] if not."""
    parts = []
    at = 0
    while at < len(text):
        equals = text.find(' = "', at)
        if equals < 0:
            return []
        value = _QUOTED.match(text, equals + 3)
        if value is None:
            return []
        parts.append((text[at:equals], _unquoted(value.group(1))))
        at = value.end()
        if at < len(text):
            if not text.startswith(", ", at):
                return []
            at += 2
    return parts


def _unquoted(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?")


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _quoted(name)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class PathArgs:
    """Which of a tool's top-level arguments hold paths (`paths`), and which hold text the tool
    never reads as a path (`text`, the built-in write_file's `content`): what a directory grant, a
    card's `approve_dir` and a suggested rule need to know of the tool, carried with each call."""

    paths: tuple[str, ...] = ()
    text: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"paths": list(self.paths), "text": list(self.text)}

    @classmethod
    def from_json(cls, data: Any) -> PathArgs | None:
        """As `to_json` wrote it; None (not known) for anything else."""
        if not isinstance(data, Mapping):
            return None
        paths, text = data.get("paths", []), data.get("text", [])
        if not isinstance(paths, list) or not isinstance(text, list):
            return None
        return cls(tuple(str(p) for p in paths), tuple(str(t) for t in text))


_PATH_FORMATS = ("path", "uri")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


def schema_path_arguments(schema: Any) -> tuple[str, ...]:
    """The top-level properties of an input schema marked as paths: `format: "path"` or `"uri"`,
    or `x-path: true`, on the property (or on one branch of its `anyOf`/`oneOf`/`allOf`), or on
    its `items` for an array."""
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(properties, Mapping):
        return ()
    return tuple(str(name) for name, prop in properties.items() if _marked(prop, items=True))


def _marked(prop: Any, *, items: bool) -> bool:
    if not isinstance(prop, Mapping):
        return False
    if prop.get("format") in _PATH_FORMATS or prop.get("x-path") is True:
        return True
    branches = [b for key in ("anyOf", "oneOf", "allOf") for b in _listed(prop.get(key))]
    if any(_marked(b, items=items) for b in branches):
        return True
    return items and _marked(prop.get("items"), items=False)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def looks_like_path(value: str) -> bool:
    """Whether a string another argument carries may name a file: it holds `/` or `\\`, starts
    with `~` or `..`, or is a `file:` URI."""
    return "/" in value or "\\" in value or value.startswith(("~", "..")) or value[:5].lower() == "file:"


def call_paths(call_input: Any, path_args: PathArgs) -> tuple[list[str], bool]:
    """Every path a call carries, and whether it carries one the policy cannot place.

    The paths: every string anywhere in a path argument (in lists and objects too). Cannot place:
    a string that looks like a path anywhere else (nested objects and lists included, and their
    keys), outside the `text` arguments.
    """
    if not isinstance(call_input, Mapping):
        return [], False
    placed: list[str] = []
    unplaced = False
    stack: list[tuple[Any, bool]] = []
    for name, value in call_input.items():
        if name in path_args.text:
            continue
        unplaced = unplaced or looks_like_path(str(name))
        stack.append((value, name in path_args.paths))
    while stack:
        value, is_path = stack.pop()
        if isinstance(value, str):
            if is_path:
                placed.append(value)
            elif looks_like_path(value):
                unplaced = True
        elif isinstance(value, Mapping):
            unplaced = unplaced or any(looks_like_path(str(k)) for k in value)
            stack.extend((v, is_path) for v in value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, is_path) for v in value)
    placed.reverse()
    return placed, unplaced


def relative_path(value: str) -> str | None:
    """`value` normalised, if it names a place inside the workspace: None for an absolute path,
    one starting with `~`, one that climbs above the workspace with `..`, a URI other than a
    relative `file:` one (whose path part is read percent-decoded), and a drive (`C:`)."""
    if scheme := _SCHEME.match(value):
        rest = value[scheme.end() :]
        if scheme.group(1).lower() != "file" or rest.startswith("//"):
            return None  # another scheme, or `file://host/…` (absolute)
        value = urllib.parse.unquote(rest)
    if value.startswith("~"):
        return None
    path = normalise_path(value)
    parts = path.split("/")
    if not path or path.startswith("/") or ".." in parts or parts[0].startswith("~"):
        return None
    return path


def grant_directory(call_input: Any, path_args: PathArgs | None) -> str | None:
    """The directory (`docs/`) a grant scoped by this call would cover: the deepest one holding
    every path it carries; None when there is nothing to scope (no path, one at the workspace's
    root or outside it, a path the policy cannot place, or the tool's path arguments not known)."""
    if path_args is None:
        return None
    paths, unplaced = call_paths(call_input, path_args)
    relative = [relative_path(p) for p in paths]
    if unplaced or not relative or None in relative:
        return None
    common: list[str] | None = None
    for path in relative:
        parent = (path or "").split("/")[:-1]
        common = parent if common is None else _common(common, parent)
    return "/".join(common) + "/" if common else None  # the workspace's root is no narrower than the thread


def _common(a: list[str], b: list[str]) -> list[str]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def inside_directory(call_input: Any, directory: str, path_args: PathArgs | None) -> bool:
    """Whether the call carries paths, and every one normalises to inside `directory` (`docs/`)
    with none the policy cannot place.

    `docs/../x` is `x`, outside; absolute paths, `~…` and paths that climb above the workspace
    never are; nor is any call of a tool whose path arguments are not known.
    """
    if path_args is None or not directory.endswith("/"):
        return False
    paths, unplaced = call_paths(call_input, path_args)
    if unplaced or not paths:
        return False
    for value in paths:
        path = relative_path(value)
        if path is None or not path.startswith(directory):
            return False
    return True
