"""The floors: which folder may import which, read from the source's own import statements, so a
module that reaches up or sideways (a worker importing the bot, the store importing a metric) fails
here before anyone draws the picture. And no module grows past what one sitting reads.

From the bottom: `harness` (the agent loop: no Slack, Redis or RQ), `messages` (what Slack is shown),
`store` (every Redis key), `observe` (logs, metrics, traces, health) and `runtime` (clients, queue,
reloads), `gates` (who may decide, ask, spend), `ops` (the operator's commands); then the two
processes side by side, `workers` (the run engine) and `bot` (Slack in), which never import each
other; `playground` (a stand-in for Slack) and `launch` (`make run`) on top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.tools.modules import OWN_PACKAGES

ROOT = Path(__file__).resolve().parents[2]

OURS = set(OWN_PACKAGES)  # the project's own top-level packages (tool modules may not take their names)
# Which of our packages each may import (besides itself).
ALLOWED = {
    "harness": set(),
    "messages": {"harness"},
    "store": {"harness"},
    "observe": {"harness", "store"},
    "runtime": {"harness", "store"},
    "gates": {"harness", "messages", "store", "observe", "runtime"},
    "ops": {"harness", "messages", "store", "observe", "runtime", "gates"},
    "workers": {"harness", "messages", "store", "observe", "runtime", "gates", "ops"},
    "bot": {"harness", "messages", "store", "observe", "runtime", "gates", "ops"},
    "playground": {"harness", "observe"},
    "launch": {"harness", "store", "observe", "runtime", "playground"},
}
# What each may not import of the platform: harness imports neither Slack nor Redis nor RQ (the
# contract's layout); messages builds Block Kit with slack_sdk's models and knows no process or store.
PLATFORM = {
    "harness": {"slack_bolt", "slack_sdk", "redis", "rq"},
    "messages": {"slack_bolt", "redis", "rq"},
    "store": {"slack_bolt", "slack_sdk", "rq"},
}
MOST_LINES = 600  # a module past this is usually two concepts (STYLE.md)
KEY_PREFIX = "harness:"  # every key of the store (`store.keys`): spelled and sent only in `store/`


def imported(path: Path) -> set[str]:
    """The top-level names of every module `path` imports (absolute imports; relative ones stay inside)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_floors_below_it(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    refused = (OURS - ALLOWED[package] - {package}) | PLATFORM.get(package, set())
    climbing = {
        str(path.relative_to(ROOT)): sorted(imported(path) & refused)
        for path in files
        if imported(path) & refused
    }
    assert climbing == {}


def reaching_into_the_store(path: Path) -> list[str]:
    """What of the store's keys `path` holds, line by line: an import of `store.keys` (or of `Keys`),
    a string literal starting with `harness:` (an f-string's first part, a docstring included)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name == "store.keys"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in ("store", "store.keys"):
            names = [a.name for a in node.names]
            if node.module == "store.keys" or {"keys", "Keys"} & set(names):
                found.append((node.lineno, f"from {node.module} import {', '.join(names)}"))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith(KEY_PREFIX)
        ):
            found.append((node.lineno, repr(node.value[:40])))
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_no_key_of_the_store_is_spelled_or_sent_outside_it() -> None:
    """The store's keys are its own: every other floor calls the store's API, so a command on a
    `harness:` key (and the shape of its key) has one home, `store/`."""
    reaching = {
        str(path.relative_to(ROOT)): found
        for package in sorted(OURS - {"store"})
        for path in sorted((ROOT / package).rglob("*.py"))
        if (found := reaching_into_the_store(path))
    }
    assert reaching == {}


def test_every_package_of_ours_has_a_floor() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages == OURS


def test_no_module_passes_600_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for package in sorted(OURS)
        for path in sorted((ROOT / package).rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MOST_LINES
    }
    assert long == {}


def test_the_import_reader_sees_every_kind_of_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import bot.app\nimport os, workers.jobs as j\nfrom messages.cards import x\n"
        "from . import sibling\ndef f():\n    from rq import Queue\n"
    )
    assert imported(module) == {"bot", "os", "workers", "messages", "rq"}


def test_the_key_reader_sees_every_way_in(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import store.keys\nfrom store.keys import DAY\nfrom store import Keys, Store\n"
        "from store import keys\nfrom store import Store\nx = 'harness:active'\n"
        "y = f\"harness:run:{x}\"\nz = 'rq:harness:'\n"
        '"""harness: a docstring that names a key is a string too."""\n'
    )
    lines = [int(found.split(":")[0]) for found in reaching_into_the_store(module)]
    assert lines == [1, 2, 3, 4, 6, 7, 9]
