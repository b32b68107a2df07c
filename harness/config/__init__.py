"""The configuration: the `HARNESS_CONFIG` file (`file`) and the settings a run gets (`settings`).

An unknown key, a bad tier name or a wrong type raises `ConfigError` with one line naming the
key; the entry points print it and exit with status 2. Nothing is silently defaulted.
"""

from harness.config.file import accepted_keys, load_config
from harness.config.settings import (
    BUILTIN_TOOL_NAMES,
    DEFAULT_MODEL,
    IM_CHANNELS,
    ON_LIMIT_CHOICES,
    Approvals,
    Budgets,
    Config,
    ConfigError,
    Limits,
    Match,
    McpServerConfig,
    ModelConfig,
    Profile,
    ResolvedServer,
    ToolsConfig,
)

__all__ = [
    "BUILTIN_TOOL_NAMES",
    "DEFAULT_MODEL",
    "IM_CHANNELS",
    "ON_LIMIT_CHOICES",
    "Approvals",
    "Budgets",
    "Config",
    "ConfigError",
    "Limits",
    "Match",
    "McpServerConfig",
    "ModelConfig",
    "Profile",
    "ResolvedServer",
    "ToolsConfig",
    "accepted_keys",
    "load_config",
]
