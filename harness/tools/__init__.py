"""Tools the model may call, all of one kind (`Tool`), from three sources.

- `files`: the built-ins (the clock and the workspace-jailed file tools);
- `modules`: every tool an operator's Python module defines with `@tool()`;
- `mcp`: the tools of MCP servers, over sessions kept warm for the life of the process.

`catalog` puts the three together for a config; `registry` runs a call and never raises.
"""

from harness.tools.base import RESULT_LIMIT_CHARS, Tool, ToolContext, ToolError, ToolResult, cut, tool
from harness.tools.files import BUILTIN_NAMES, BUILTIN_TOOLS
from harness.tools.registry import ToolRegistry

__all__ = [
    "BUILTIN_NAMES",
    "BUILTIN_TOOLS",
    "RESULT_LIMIT_CHARS",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "cut",
    "tool",
]
