"""The `e2e` marker's guard (tests/e2e_guard.py): which commands are the product's processes, and
an unmarked test that starts one is refused before it starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e_guard import ENTRY_POINTS, ROOT, UnmarkedEndToEnd, forget_refusals, product_process


@pytest.mark.parametrize(
    ("args", "started"),
    [
        ([sys.executable, "-m", "bot"], "python -m bot"),
        ([sys.executable, "-u", "-m", "workers", "audit", "verify"], "python -m workers"),
        ((sys.executable, "-m", "launch.local"), "python -m launch.local"),
        ([sys.executable, "-m", "harness", "--list-tools"], "python -m harness"),
        ([sys.executable, "-m", "playground"], "python -m playground"),
        (["make", "--no-print-directory", "run"], "make run"),
        (f"{sys.executable} -m bot", "python -m bot"),
        ([sys.executable, "-m", "pytest"], None),
        ([sys.executable, "-m", "tests.bench"], None),
        ([sys.executable, "-c", "import bot"], None),
        (["redis-server", "--port", "0"], None),
        (["make", "lint"], None),
    ],
)
def test_the_products_processes_are_told_apart(args: object, started: str | None) -> None:
    assert product_process(args) == started


def test_every_package_with_a_main_is_an_entry_point() -> None:
    mains = {p.parent.name for p in ROOT.glob("*/__main__.py")} - {"tests"}
    assert mains == ENTRY_POINTS


def test_an_unmarked_test_starting_the_bot_is_refused_first(request: pytest.FixtureRequest) -> None:
    with pytest.raises(UnmarkedEndToEnd, match="without the e2e marker"):
        subprocess.Popen([sys.executable, "-m", "bot"])
    forget_refusals(request.node)  # refused on purpose; any other refusal still fails its test


def test_what_is_not_the_product_still_starts() -> None:
    assert subprocess.run([sys.executable, "-c", "pass"], timeout=30).returncode == 0


@pytest.mark.e2e
def test_a_marked_test_may_start_one() -> None:
    done = subprocess.run([sys.executable, "-m", "harness", "--help"], capture_output=True, text=True)
    assert "usage" in done.stdout + done.stderr


def test_every_file_under_tests_e2e_is_marked(request: pytest.FixtureRequest) -> None:
    """The marker comes from where a file lives: a new file in tests/e2e/ cannot forget it."""
    items = [i for i in request.session.items if i.path.is_relative_to(ROOT / "tests" / "e2e")]
    assert all(i.get_closest_marker("e2e") for i in items)
