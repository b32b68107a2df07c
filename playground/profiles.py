"""What the page says of each channel: its profile, the tools a run there is offered, who may do what.

Read from the same config the bot and the worker run with (`HARNESS_CONFIG`), by the functions
they use: `Config.match` picks the profile, `Catalog.narrowed` the tools, `Policy.decide` their
tiers, so the page shows what `python -m harness --list-tools --channel C…` prints for the
built-ins. Module and MCP tools are only named by where they come from: the playground imports no
module and starts no server. A stdio server that cannot start is shown as down, with the reason
the worker logs: no bubblewrap on the PATH (`harness.tools.sandbox`), or a command that is not
there (`harness.tools.mcp_command`), told without the command. (A kernel that refuses bubblewrap
its namespaces is found out only when the worker tries: the worker's log says so.) Nothing here is
secret: profile, tool and server names, tiers and why, user IDs; never a server's command, URL,
environment or headers.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from typing import Any

from harness import texts
from harness.config import Config, McpServerConfig
from harness.tools.catalog import Catalog
from harness.tools.files import BUILTIN_TOOLS
from harness.tools.mcp_command import command_problem
from playground.slack import TEAM_ID, Channel, Person

Json = dict[str, Any]
# The demo workspace's user groups, to name in `approvers` and `requesters`, and their handles.
GROUPS = {"S01REVIEWERS": ["U01ALICE", "U02BOB"], "S02ONCALL": ["U01ALICE", "U02BOB"]}
HANDLES = {"S01REVIEWERS": "reviewers", "S02ONCALL": "oncall"}


def members(ids: Iterable[str], groups: Mapping[str, list[str]] = GROUPS) -> set[str]:
    """The user IDs `ids` stand for, a user group standing for its members."""
    return {u for i in ids for u in groups.get(i, [i])}


def notes(
    settings: Config, people: Iterable[Person], groups: Mapping[str, list[str]] = GROUPS
) -> dict[str, str]:
    """What each demo user may do under `settings`, shown beside their name in the user switcher."""
    approvals = settings.approvals
    askers = members(settings.requesters, groups) if settings.requesters else None
    deciders = members(approvals.approvers, groups)
    out = {}
    for person in people:
        if approvals.approvers:
            role = "approver" if person.id in deciders else "not an approver"
            if person.id in deciders and not approvals.self_approval:
                role = "approver, not of their own runs"
        else:
            role = "decides their own runs" if approvals.self_approval else ""
        if askers is not None and person.id not in askers:
            role = "may not ask here" + (f" · {role}" if role else "")
        out[person.id] = role
    return out


def tools(settings: Config) -> list[Json]:
    """The built-in tools a run under `settings` is offered, each with its tier and why."""
    offered = Catalog(BUILTIN_TOOLS).narrowed(settings).registry()
    listed = []
    for found in offered:
        ruling = settings.policy.decide(found.name, {}, found.own_tier, found.own_tier_why)
        ruled_by_args = any(r.args for r in settings.policy.rules_for(found.name))
        listed.append(
            {"name": found.name, "tier": ruling.tier.value, "why": ruling.why, "rules": ruled_by_args}
        )
    return listed


def _problem(server: McpServerConfig, environ: Mapping[str, str]) -> str | None:
    """Why the worker cannot start `server` here, as it says it (without the command), or None.

    A stdio server runs only in bubblewrap, which the worker looks for first, on its PATH."""
    if server.command is not None and shutil.which("bwrap", path=environ.get("PATH")) is None:
        return texts.SANDBOX_MISSING
    return command_problem(server, environ, os.getcwd(), named=False)


def describe(
    config: Config,
    channels: Iterable[Channel],
    people: Iterable[Person],
    groups: Mapping[str, list[str]] = GROUPS,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Json]:
    """Channel id -> its profile (name, the `# profile:` line), the model its runs ask for, tools,
    other tool sources (and the MCP servers among them that are down, with why), budgets and each
    demo user's note, as `GET /play/channels` serves them. `environ`: where commands are looked
    for (this process's environment and directory, which `make run` gives its worker too)."""
    people = tuple(people)
    environ = os.environ if environ is None else environ
    problems = {s.name: _problem(s, environ) for s in config.mcp_servers}
    described = {}
    for channel in channels:
        match = config.match(channel.id, TEAM_ID)
        settings = match.settings
        offered = [s.name for s in config.mcp_servers if settings.offers_server(s.name)]
        servers = [s for s in offered if not problems[s]]
        budgets = settings.budgets
        described[channel.id] = {
            "profile": match.profile,
            "header": match.header(),
            "model": settings.model,  # a profile's own model.name wins over HARNESS_MODEL
            "tools": tools(settings),
            "elsewhere": [f"module {m}" for m in settings.tools.modules]
            + [f"MCP server {s}" for s in servers],
            "down": [{"name": f"MCP server {s}", "why": problems[s]} for s in offered if problems[s]],
            "restricted": bool(settings.requesters),
            "budgets": {
                "per_user_daily_tokens": budgets.per_user_daily_tokens,
                "per_channel_daily_tokens": budgets.per_channel_daily_tokens,
            },
            "notes": notes(settings, people, groups),
        }
    return described
