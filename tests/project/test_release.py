"""The release: one version in pyproject.toml, the newest heading of CHANGELOG.md and what
`--version` prints; the Apache-2.0 license; and the stored formats the changelog names."""

from __future__ import annotations

import hashlib
import importlib
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import pytest

import bot.__main__ as bot_main
from harness import cli, release
from workers.process import main as workers_main

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
CHANGELOG = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")
# Keep a Changelog: `## [Unreleased]`, then `## [X.Y.Z] - YYYY-MM-DD`, newest first.
RELEASE_HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\] - (?P<date>\d{4}-\d{2}-\d{2})$", re.MULTILINE)
# The stored formats: (module, constant), each named in CHANGELOG.md as `NAME = N` (its convention).
FORMATS = [
    ("store.records", "RECORD_VERSION"),
    ("harness.state", "FORMAT_VERSION"),
    ("store.threads", "HISTORY_VERSION"),
    ("store.decisions", "APPROVALS_VERSION"),
    ("store.decisions", "DECISION_VERSION"),
    ("store.grants", "GRANT_VERSION"),
]
# sha256 of LICENSE with its whitespace runs made single spaces: the Apache License 2.0 as
# https://www.apache.org/licenses/LICENSE-2.0.txt gives it, appendix included.
APACHE_2_0 = "0ffddef9e48f8a09aed5caf2d44f7ba1c1be2d9b8e0a6f693b1635b2d5566645"


def releases() -> list[tuple[str, str]]:
    """(version, date) of every release heading of CHANGELOG.md, in the file's order."""
    return [(m["version"], m["date"]) for m in RELEASE_HEADING.finditer(CHANGELOG)]


# --- one version ---------------------------------------------------------------------------------


def test_the_version_is_semantic_and_the_distribution_is_named_once() -> None:
    assert SEMVER.fullmatch(PROJECT["version"]), PROJECT["version"]
    assert PROJECT["name"] == release.DISTRIBUTION


def test_the_newest_release_in_the_changelog_is_pyprojects() -> None:
    newest, _ = releases()[0]
    assert newest == PROJECT["version"], (
        "a release moves Unreleased under its heading and bumps pyproject.toml"
    )


def test_the_code_reads_the_release_from_pyproject() -> None:
    assert release.version() == PROJECT["version"]


def test_the_changelog_keeps_a_changelog() -> None:
    """Unreleased first, then every release once, newest first, each a semantic version."""
    assert CHANGELOG.startswith("# Changelog\n")
    found = releases()
    assert found, "no release heading `## [X.Y.Z] - YYYY-MM-DD`"
    assert CHANGELOG.index("\n## [Unreleased]\n") < CHANGELOG.index(f"\n## [{found[0][0]}]")
    assert all(SEMVER.fullmatch(version) for version, _ in found), found
    versions = [tuple(int(n) for n in version.split(".")) for version, _ in found]
    assert versions == sorted(set(versions), reverse=True)
    dates = [date for _, date in found]
    assert dates == sorted(dates, reverse=True)


@pytest.mark.parametrize(("module", "name"), FORMATS)
def test_the_changelog_names_every_stored_format_as_it_is(module: str, name: str) -> None:
    """A format's version bumped without a **Format:** entry naming the new one fails here."""
    value = getattr(importlib.import_module(module), name)
    assert f"`{name} = {value}`" in CHANGELOG


# --- where the release is read from ---------------------------------------------------------------


def test_a_checkout_reads_its_own_pyproject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An editable install's metadata is as old as its last `pip install`: the checkout's file wins."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "slack-harness"\nversion = "9.8.7"\n')
    monkeypatch.setattr(release, "CHECKOUT", tmp_path)
    assert release.line() == "slack-harness 9.8.7"


@pytest.mark.parametrize(
    "pyproject",
    [None, '[project]\nname = "another"\nversion = "9.8.7"\n', "not toml ["],
    ids=["none", "another project's", "unreadable"],
)
def test_without_a_pyproject_of_ours_the_installed_metadata_says(
    pyproject: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed wheel: its packages stand in site-packages, where no pyproject.toml of ours lies."""
    if pyproject is not None:
        (tmp_path / "pyproject.toml").write_text(pyproject)
    monkeypatch.setattr(release, "CHECKOUT", tmp_path)
    try:
        installed = metadata.version(release.DISTRIBUTION)
    except metadata.PackageNotFoundError:
        installed = release.UNKNOWN
    assert release.version() == installed


# --- --version ----------------------------------------------------------------------------------


@pytest.mark.parametrize("main", [bot_main.main, workers_main.main], ids=["bot", "workers"])
def test_version_prints_the_release_and_exits_0(
    main: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:  # argparse's version action
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"slack-harness {PROJECT['version']}\n"


def test_the_terminal_agent_prints_the_release_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"slack-harness {PROJECT['version']}\n"


def test_the_workers_commands_stay_beside_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`--version` is an option of `python -m workers`, not a command: `audit`, `status`, `replay`,
    `explain-call` stay."""
    with pytest.raises(SystemExit) as exited:
        workers_main.main(["--help"])
    assert exited.value.code == 0
    usage = capsys.readouterr().out
    assert "{audit,status,replay,explain-call}" in usage and "[--version]" in usage


@pytest.mark.e2e
@pytest.mark.parametrize("package", ["bot", "workers", "harness"])
def test_version_needs_no_setting_and_starts_nothing(package: str, tmp_path: Path) -> None:
    """With no Slack token, no Redis and a config that would stop the process if it were read,
    `python -m PACKAGE --version` prints the release and exits 0 (a server would never exit)."""
    env = {"PATH": "/usr/bin:/bin", "HARNESS_CONFIG": str(tmp_path / "not-there.toml")}
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", package, "--version"],
        cwd=ROOT,  # `-m` imports from here first: the checkout under test
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"slack-harness {PROJECT['version']}\n", "")
    assert time.monotonic() - began < 30


# --- the license ---------------------------------------------------------------------------------


def test_the_license_is_apache_2_0_whole_and_declared() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert [line.strip() for line in text.splitlines()[:3]] == [
        "Apache License",
        "Version 2.0, January 2004",
        "http://www.apache.org/licenses/",
    ]
    assert hashlib.sha256(" ".join(text.split()).encode()).hexdigest() == APACHE_2_0, (
        "LICENSE must be the Apache License 2.0 word for word"
    )
    assert PROJECT["license"] == "Apache-2.0"  # an SPDX expression (PEP 639)
    assert PROJECT["license-files"] == ["LICENSE"]
