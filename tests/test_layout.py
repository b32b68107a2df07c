"""The packages import downwards only: harness at the bottom, then what Slack is shown (messages),
then the workers, then the bot. Read from the source's own import statements, so a module that
reaches up (a worker importing the bot, say) fails here before anyone draws the picture."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What each package may not import. harness imports neither Slack nor Redis nor RQ (the contract's
# layout); messages builds Block Kit with slack_sdk's models and knows no process, store or app.
FORBIDDEN = {
    "harness": {"messages", "workers", "bot", "playground", "slack_bolt", "slack_sdk", "redis", "rq"},
    "messages": {"workers", "bot", "playground", "slack_bolt", "redis", "rq"},
    "workers": {"bot"},
}


def imported(path: Path) -> set[str]:
    """The top-level names of every module `path` imports (absolute imports; relative ones stay inside)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_nothing_above_it(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    climbing = {
        str(path.relative_to(ROOT)): sorted(imported(path) & FORBIDDEN[package])
        for path in files
        if imported(path) & FORBIDDEN[package]
    }
    assert climbing == {}


def test_the_import_reader_sees_every_kind_of_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import bot.app\nimport os, workers.store as s\nfrom messages.cards import x\n"
        "from . import sibling\ndef f():\n    from rq import Queue\n"
    )
    assert imported(module) == {"bot", "os", "workers", "messages", "rq"}
