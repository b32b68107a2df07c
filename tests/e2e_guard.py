"""The `e2e` marker's guard: a test that starts one of the product's processes must carry it.

A product process is `python -m PACKAGE …` for a package of ours that has a `__main__` (the bot,
the worker and its commands, `make run`'s launcher, the harness's CLI, the playground) or `make
run` itself. A test that only starts a redis-server (the shared `redis_server` fixture, sentinels),
an MCP server or a helper script is not end to end: it starts none of the product's processes.

The tests/conftest.py loads this module as a plugin. Every `subprocess.Popen` of the test process
(`subprocess.run` and asyncio's subprocesses go through it) is looked at while a test, or a fixture
it asked for, runs; an unmarked one that would start a product process is refused before anything
starts, and the test fails even if the code under test swallowed the refusal. Files under
tests/e2e/ are marked by where they live.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
E2E_DIR = ROOT / "tests" / "e2e"
# The packages of ours that `python -m` starts (tests/project/test_e2e_guard.py keeps this the
# set of those with a __main__.py).
ENTRY_POINTS = frozenset({"bot", "harness", "launch", "playground", "workers"})


class UnmarkedEndToEnd(RuntimeError):
    """A test without the `e2e` marker tried to start one of the product's processes."""


def product_process(args: Any) -> str | None:
    """The product process `args` would start (`python -m bot`, `make run`), or None."""
    if isinstance(args, (str, bytes, os.PathLike)):
        argv = shlex.split(os.fsdecode(args)) if isinstance(args, (str, bytes)) else [os.fspath(args)]
    elif isinstance(args, Sequence):
        argv = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]
    else:
        return None
    if argv and Path(argv[0]).name == "make" and "run" in argv[1:]:
        return "make run"
    for flag, module in zip(argv, argv[1:], strict=False):
        if flag == "-m" and module.split(".")[0] in ENTRY_POINTS:
            return f"python -m {module}"
    return None


_running: list[pytest.Item] = []
_REFUSED = pytest.StashKey[list[str]]()
_real_init = subprocess.Popen.__init__


def _guarded_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
    item = _running[-1] if _running else None
    if item is not None and item.get_closest_marker("e2e") is None:
        started = product_process(args)
        if started is not None:
            message = (
                f"{item.nodeid} starts `{started}` without the e2e marker: mark it "
                "(`@pytest.mark.e2e`, or move its file to tests/e2e/) so `make test-fast` leaves it out"
            )
            item.stash.setdefault(_REFUSED, []).append(message)
            raise UnmarkedEndToEnd(message)
    _real_init(self, args, *rest, **kwargs)


def pytest_configure(config: pytest.Config) -> None:
    subprocess.Popen.__init__ = _guarded_init  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    subprocess.Popen.__init__ = _real_init  # type: ignore[method-assign]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Before `-m "not e2e"` deselects: everything under tests/e2e/ is end to end."""
    for item in items:
        if item.path.is_relative_to(E2E_DIR) and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object]:
    """Module and session fixtures are set up and torn down inside a test's protocol too."""
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    refused = item.stash.get(_REFUSED, None)
    if refused:
        pytest.fail("\n".join(refused), pytrace=False)


def forget_refusals(item: pytest.Item) -> None:
    """For the guard's own test, which is refused on purpose."""
    item.stash[_REFUSED] = []
