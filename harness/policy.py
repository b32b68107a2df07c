"""The per-tool policy: three tiers, decided per `tool_use` block before anything runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType


class Tier(StrEnum):
    """How a tool call is treated: run at once, run after a human says yes, or never run."""

    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


# The policy used when the config file has no [policy] table at all. A config that has one is
# the whole policy: its listed tools get their tiers and every other tool gets its `default`.
BUILTIN_TIERS: Mapping[str, Tier] = MappingProxyType(
    {
        "get_time": Tier.ALLOW,
        "read_file": Tier.ALLOW,
        "list_files": Tier.ALLOW,
        "write_file": Tier.ASK,
        "delete_file": Tier.ASK,
    }
)


@dataclass(frozen=True)
class Policy:
    """Tier lookup: the listed tier of a tool, else `default`."""

    default: Tier = Tier.ASK
    tools: Mapping[str, Tier] = field(default_factory=lambda: dict(BUILTIN_TIERS))

    def tier(self, tool_name: str) -> Tier:
        """The tier of a call to `tool_name`."""
        return self.tools.get(tool_name, self.default)

    def source(self, tool_name: str) -> str:
        """Why `tool_name` has its tier, in words (shown on approval cards)."""
        if tool_name in self.tools:
            return f'policy.tools.{tool_name} = "{self.tools[tool_name]}"'
        return f'policy.default = "{self.default}"'
