"""Flows: a run that read what a stranger may have written asks before it sends anything out.

`[policy.flows]` names tools (names or globs, as in `[policy.tools]`) whose output is untrusted
(`untrusted_output`: a fetched page, an email, a ticket anyone can file) and tools that send data out
of the workspace (`sends_out`: mail, HTTP posts, messages). Once the conversation a run sends the
model holds the result of an untrusted-output call, every sends-out call of the run asks, whatever
tier it had: a `deny` stays `deny`, an `allow` becomes `ask`, and no grant, *Approve all* or
suggested rule covers it (its why names both tools, and cards say so in plain words).

What counts is read from the conversation itself, not kept beside it: a `tool_use` of an
untrusted-output tool that has its `tool_result` (run or refused: a refused one counts too, the
reading that fails closed). So the calls of the turn that read it are not touched (the model asked
for them before it saw that output), a later run of the same thread whose history holds it asks as
well, and once the history no longer holds it (trimmed), nothing it said is left to act on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.globs import glob_match

FLOW_KEY = "policy.flows.sends_out"


@dataclass(frozen=True)
class Flows:
    """`[policy.flows]`: the globs of tools whose output is untrusted, and of those that send out."""

    untrusted_output: tuple[str, ...] = ()
    sends_out: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.untrusted_output and self.sends_out)

    def untrusted(self, name: str) -> bool:
        return any(glob_match(p, name, paths=False) for p in self.untrusted_output)

    def sends(self, name: str) -> str:
        """The entry of `sends_out` that lists `name` (the exact name, else the longest glob); ""."""
        if name in self.sends_out:
            return name
        found = [p for p in self.sends_out if glob_match(p, name, paths=False)]
        return max(found, key=len) if found else ""

    def read_untrusted(self, messages: Sequence[dict[str, Any]]) -> str:
        """The first untrusted-output tool whose result the conversation holds; "" when none."""
        if not self:
            return ""
        asked: dict[str, str] = {}  # tool_use id -> name, of untrusted-output calls
        for message in messages:
            content = message.get("content")
            if not isinstance(content, list):
                continue
            for block in content:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "tool_use" and self.untrusted(str(block.get("name", ""))):
                    asked[str(block.get("id"))] = str(block["name"])
                elif block.get("type") == "tool_result" and str(block.get("tool_use_id")) in asked:
                    return asked[str(block["tool_use_id"])]
        return ""


def flow_why(pattern: str, untrusted: str) -> str:
    """The why of a sends-out call that asks because the run read `untrusted`'s output."""
    quoted = pattern.replace("\\", "\\\\").replace('"', '\\"')
    return f'{FLOW_KEY}["{quoted}"] after {untrusted}'
