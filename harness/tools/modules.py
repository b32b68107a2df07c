"""Operator tool modules: `[tools] modules` names modules whose `@tool()` functions are offered."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from harness.config import ConfigError
from harness.tools.base import Tool

# This project's own top-level packages: an operator's module under one of these names would be
# this project's, not theirs (or hide it), so it is refused by name with one line.
OWN_PACKAGES = frozenset(
    {
        "harness",
        "messages",
        "store",
        "observe",
        "runtime",
        "gates",
        "ops",
        "workers",
        "bot",
        "playground",
        "launch",
    }
)


def load_module_tools(names: Iterable[str]) -> list[Tool]:
    """Every tool each module defines, in module order; an import failure is a `ConfigError`.

    "Defines" means made with `harness.tools.tool` in that module: a tool it merely imports
    from elsewhere is not offered twice.
    """
    found: list[Tool] = []
    for name in names:
        top = name.split(".")[0]
        if top in OWN_PACKAGES and name.split(".")[0] != "harness":
            raise ConfigError(
                f"tools.modules: {name!r} is inside {top!r}, a package of this project: "
                f"put your tools in a package of another name"
            )
        try:
            module = importlib.import_module(name)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - any import failure is the operator's to fix
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise ConfigError(
                f"tools.modules: cannot import {name!r}: {type(exc).__name__}: {first}"
            ) from None
        own = [v for v in vars(module).values() if isinstance(v, Tool) and v.module == module.__name__]
        if not own:
            raise ConfigError(
                f"tools.modules: {name!r} defines no tools (decorate functions with @harness.tools.tool())"
            )
        found.extend(own)
    return found
