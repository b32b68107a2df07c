"""The release this code is: `pyproject.toml`'s version (tagged `vX.Y.Z` in git; CHANGELOG.md says
what each release holds), printed by `--version` of `python -m bot`, `workers` and `harness`.

It stands on the bottom floor so that every process reads it the same way, and it reads nothing
else: no setting, no Redis, no Slack.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "slack-harness"  # `[project] name` in pyproject.toml (tests/project/test_release.py)
CHECKOUT = Path(__file__).resolve().parents[1]  # the repository's root, when this runs from one
UNKNOWN = "unknown"


def version() -> str:
    """The release: a checkout's own `pyproject.toml` first, else the installed distribution's
    metadata. A checkout wins because an editable install's metadata is as old as its last
    `pip install`: a version bumped since, or another checkout run on the same venv, would print
    a release this code is not."""
    return _checkout_version(CHECKOUT / "pyproject.toml") or _installed_version() or UNKNOWN


def line() -> str:
    """What `--version` prints: `slack-harness 0.2.0`."""
    return f"{DISTRIBUTION} {version()}"


def _checkout_version(pyproject: Path) -> str | None:
    """The version in `pyproject` when it is this distribution's; None when it is missing or another's
    (a wheel's packages stand in site-packages, where no pyproject.toml of ours lies)."""
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    if not isinstance(project, dict) or project.get("name") != DISTRIBUTION:
        return None
    found = project.get("version")
    return found if isinstance(found, str) and found else None


def _installed_version() -> str | None:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
