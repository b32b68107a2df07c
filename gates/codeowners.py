"""An example `approvers_from` callable: approve a change to files only if you own them in CODEOWNERS.

    [approvals]
    approvers = ["S0DEVS"]                       # who may click at all, as before
    [approvals.approvers_from_tools]
    write_file = "gates.codeowners:may_approve"  # and, of those, who may approve a write
    delete_file = "gates.codeowners:may_approve"

At an approval of a call, every path in the tool's path arguments must have an owner in the
repository's `CODEOWNERS` (GitHub's syntax: the last pattern that matches a path gives its owners,
`@user`, `@org/team` or an email), and the clicker must be one of the owners of every path.

Who the clicker is on GitHub comes from a small TOML file the operator keeps (Slack knows nothing
of GitHub logins), named by `CODEOWNERS_PEOPLE`:

    [users]                # Slack user ID = the owner as CODEOWNERS names them
    U0ANN = "@ann"
    U0BEN = "ben@example.com"
    [teams]                # a team of CODEOWNERS = its members, as the users above are named
    "@myorg/platform" = ["@ann", "@carol"]

`CODEOWNERS_FILE` names the CODEOWNERS file; by default the first of `.github/CODEOWNERS`,
`CODEOWNERS` and `docs/CODEOWNERS` in the bot's `HARNESS_WORKSPACE` (GitHub's order). Both files
are read again when they change.

The answers: yes when the clicker owns every path; no when some path has owners and the clicker is
not among them; unknown (so refused) when the call carries no path, a path that is absolute or
outside the workspace, a path-looking string outside its path arguments, a path nobody owns, a team
the people file does not list, or the clicker has no entry in the people file, or a file cannot
be read. GitHub's own rules beyond these (sections, `!` negation, optional approvals) are not read:
such a line is skipped, so it never grants anything.
"""

from __future__ import annotations

import os
import re
import threading
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gates.approvers_from import ApprovalClick, ApproverAnswer, no, unknown, yes
from harness.policy import relative_path

CODEOWNERS_PLACES = (".github/CODEOWNERS", "CODEOWNERS", "docs/CODEOWNERS")  # GitHub's order
_OWNER = re.compile(r"@[A-Za-z0-9][A-Za-z0-9-]*(?:/[A-Za-z0-9._-]+)?|[^@\s]+@[^@\s]+")


@dataclass(frozen=True)
class Rule:
    """One line of CODEOWNERS: its pattern, compiled, and its owners (none: the path is unowned)."""

    line: int
    pattern: str
    regex: re.Pattern[str]
    owners: tuple[str, ...]


def parse(text: str) -> list[Rule]:
    """The rules of a CODEOWNERS file, in file order; comments, blank and unreadable lines skipped."""
    rules = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = _without_comment(raw).strip()
        if not line or line.startswith(("[", "^[", "!")):
            continue  # a section header (GitLab's) or a negation: not read, so it grants nothing
        pattern, *owners = line.split()
        if not all(_OWNER.fullmatch(o) for o in owners):
            continue  # an owner of a shape we do not know: the line is left out, never half read
        rules.append(Rule(number, pattern, _compile(pattern), tuple(o.lower() for o in owners)))
    return rules


def owners_of(rules: Sequence[Rule], path: str) -> Rule | None:
    """The rule that gives `path` (relative to the repository's root) its owners: the last that
    matches it; None when none does."""
    return next((r for r in reversed(rules) if r.regex.fullmatch(path)), None)


def _without_comment(line: str) -> str:
    r"""The line before an unescaped `#` (`\#` is a literal one)."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            out.append(line[i : i + 2])
            i += 2
            continue
        if line[i] == "#":
            break
        out.append(line[i])
        i += 1
    return "".join(out)


def _compile(pattern: str) -> re.Pattern[str]:
    """A CODEOWNERS pattern (gitignore's rules, as GitHub reads them) as a regex over a path.

    Anchored at the root when it starts with `/` or holds a `/` before its end; else it matches at
    any depth. `*` is any run of characters but `/`, `?` one of them, `**` any run of segments.
    """
    anchored = "/" in pattern.rstrip("/")
    body = pattern.strip("/") if pattern != "/" else ""
    out = []
    i = 0
    while i < len(body):
        if body.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif body.startswith("**", i):
            out.append(".*")
            i += 2
        elif body[i] == "*":
            out.append("[^/]*")
            i += 1
        elif body[i] == "?":
            out.append("[^/]")
            i += 1
        elif body[i] == "\\" and i + 1 < len(body):
            out.append(re.escape(body[i + 1]))
            i += 2
        else:
            out.append(re.escape(body[i]))
            i += 1
    prefix = "" if anchored else "(?:.*/)?"
    # A name (or a directory, `/` at the end) covers all below it; a last segment with a wildcard
    # matches in its own directory only: `docs/*` owns `docs/a.md`, not `docs/sub/b.md` (GitHub's words).
    last = body.rsplit("/", 1)[-1]
    below = "(?:/.*)?" if pattern.endswith("/") or not any(c in last for c in "*?") else ""
    return re.compile(prefix + "".join(out) + below, re.DOTALL)


@dataclass(frozen=True)
class People:
    """The people file: Slack user ID -> owner (as CODEOWNERS names them), team -> its members."""

    users: Mapping[str, str]
    teams: Mapping[str, tuple[str, ...]]


def read_people(text: str) -> People:
    """The people file's `[users]` and `[teams]`; `ValueError` when it is not that."""
    data = tomllib.loads(text)
    users, teams = data.get("users", {}), data.get("teams", {})
    if set(data) - {"users", "teams"} or not isinstance(users, dict) or not isinstance(teams, dict):
        raise ValueError("expected only the tables [users] and [teams]")
    if not all(isinstance(v, str) for v in users.values()):
        raise ValueError("[users] maps Slack user IDs to owners, as strings")
    if not all(isinstance(v, list) and all(isinstance(m, str) for m in v) for v in teams.values()):
        raise ValueError("[teams] maps a team to a list of owners")
    return People(
        {k: v.lower() for k, v in users.items()},
        {k.lower(): tuple(m.lower() for m in v) for k, v in teams.items()},
    )


def decide(rules: Sequence[Rule], people: People, click: ApprovalClick) -> ApproverAnswer:
    """May `click.clicker` approve the call, by `rules` and `people`? (See the module's docstring.)"""
    if click.paths is None:
        return unknown("the tool's path arguments are not known")
    if click.stray_paths:
        return unknown("the call holds a path outside its path arguments")
    if not click.paths:
        return unknown("the call names no path")
    me = people.users.get(click.clicker)
    if me is None:
        return unknown("you have no entry in the CODEOWNERS people file")
    lines = []
    for raw in click.paths:
        path = relative_path(raw)
        if path is None:
            return unknown(f"{raw[:80]} is not a path inside the repository")
        rule = owners_of(rules, path)
        if rule is None or not rule.owners:
            return unknown(f"nobody owns {path[:80]} in CODEOWNERS")
        unlisted = [o for o in rule.owners if "/" in o and o not in people.teams]
        mine = me in rule.owners or any(me in people.teams.get(o, ()) for o in rule.owners)
        if not mine and unlisted:
            return unknown(
                f"{path[:80]} is owned by {', '.join(unlisted)[:80]}, whose members are not listed"
            )
        if not mine:
            return no(f"{path[:80]} is owned by {', '.join(rule.owners)[:120]} (CODEOWNERS line {rule.line})")
        lines.append(str(rule.line))
    return yes(f"{me} owns every path (CODEOWNERS line {', '.join(dict.fromkeys(lines))})")


class _Cached:
    """A file read again only when its modification time or size changes (the bot reads it per click)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[Path, tuple[tuple[int, int], Any]] = {}

    def read(self, path: Path, parse_text: Any) -> Any:
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        with self._lock:
            seen = self._seen.get(path)
            if seen is not None and seen[0] == stamp:
                return seen[1]
        value = parse_text(path.read_text(encoding="utf-8"))
        with self._lock:
            self._seen[path] = (stamp, value)
        return value


_FILES = _Cached()


def codeowners_file(workspace: Path, env: Mapping[str, str]) -> Path | None:
    """`CODEOWNERS_FILE`, else the first of GitHub's places that exists in `workspace`."""
    if env.get("CODEOWNERS_FILE"):
        return Path(env["CODEOWNERS_FILE"])
    return next((workspace / p for p in CODEOWNERS_PLACES if (workspace / p).is_file()), None)


def may_approve(click: ApprovalClick) -> ApproverAnswer:
    """The `approvers_from` callable: yes only to an owner of every path the call carries."""
    env = os.environ
    where = codeowners_file(click.workspace, env)
    people_file = env.get("CODEOWNERS_PEOPLE")
    if where is None:
        return unknown("no CODEOWNERS file found")
    if not people_file:
        return unknown("CODEOWNERS_PEOPLE names no people file")
    try:
        rules = _FILES.read(where, parse)
        people = _FILES.read(Path(people_file), read_people)
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # tomllib's error is a ValueError
        return unknown(f"cannot read CODEOWNERS or the people file ({type(exc).__name__})")
    return decide(rules, people, click)
