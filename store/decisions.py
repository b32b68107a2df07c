"""A park's approvals hash and the decisions in it, as stored: their format versions and readers.

A park's approvals hash (one field per call, holding its decision once made, and `~expires`, `~fp:`,
`~at:`, `~votes:`, `~extensions`) is written by `store.parks`; a decision in it is JSON. Both carry
their format version, read here before anything of them is used.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from harness.state import Decision, StateError, format_version
from store.base import as_text

# The format of a park's approvals hash (its fields: a call's decision, `~expires`, `~fp:`, `~at:`,
# `~votes:`, `~extensions`), kept in its field `~version` (a hash without one was written as 1),
# and of each decision stored in it (the JSON's `version`; none: 1). A newer release that changes
# either writes a higher number, and this release leaves such a park as it is (`NewerRecord`).
VERSION_FIELD = "~version"
APPROVALS_VERSION = 1
DECISION_VERSION = 1
APPROVALS_VERSIONS = frozenset({1})


def _decision_v1(data: dict[str, Any]) -> Decision:
    return Decision.from_json(data)


# Every version of a stored decision this release reads, and how (tests/store/test_formats.py).
_DECISION_READERS: dict[int, Callable[[dict[str, Any]], Decision]] = {1: _decision_v1}
DECISION_VERSIONS = frozenset(_DECISION_READERS)


def decision_of(stored: Any) -> Decision:
    """A decision as a park's approvals hash holds it (JSON); `NewerRecord` when a newer release
    wrote it, `StateError` when it cannot be read."""
    try:
        data = json.loads(stored)
    except ValueError as exc:
        raise StateError(f"stored decision is not JSON ({exc}); refusing to use it") from None
    reader = _DECISION_READERS[format_version(data, "decision", DECISION_VERSIONS, unversioned=1)]
    try:
        return reader(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"stored decision is malformed ({exc!r}); refusing to use it") from None


def stored_decision(decision: Decision) -> str:
    """What a park's approvals hash holds of `decision`: its JSON with its format version."""
    return json.dumps({**decision.to_json(), "version": DECISION_VERSION}, sort_keys=True)


def check_approvals_version(raw: dict[Any, Any]) -> None:
    """Refuse a park's approvals hash of a format this release does not read (`NewerRecord` when newer)."""
    found = raw.get(VERSION_FIELD.encode(), raw.get(VERSION_FIELD))
    if found is None:
        return  # written before the hash carried its version: 1
    text = as_text(found)
    version = int(text) if text.isdigit() else text
    format_version({"version": version}, "park's approvals", APPROVALS_VERSIONS)
