"""What became of a run's calls that never ran, read from its conversation: for how its end is told.

A run that wraps up after people declined its calls (or let them expire, or the policy denied
them) did not do what it was asked: its thread should not end on "Done" with a ✅. The
conversation is the record that survives every park and process: each call of this run was
answered by a `tool_result`, and one that did not run says why in the harness's own words.
"This run" is everything after the user message that holds its task (the last one with text);
the calls of earlier runs of the thread sit before it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from harness import texts
from harness.state import RunState


@dataclass(frozen=True)
class NotRun:
    """How many calls of a run did not run, by why: a person declined, nobody decided, the policy."""

    declined: int = 0
    expired: int = 0
    denied: int = 0

    @property
    def total(self) -> int:
        return self.declined + self.expired + self.denied


def _head(template: str) -> str:
    """The fixed words a sentence starts with, before its first field."""
    return template.split("{", 1)[0]


_DECLINED = os.path.commonprefix([texts.RESULT_DECLINED, _head(texts.RESULT_DECLINED_REASON)])
_DENIED = tuple(_head(t) for t in (texts.RESULT_DENIED, texts.RESULT_DENIED_ARGS, texts.RESULT_EDIT_DENIED))


def calls_not_run(state: RunState) -> NotRun:
    """The calls of this run (not of earlier runs of its thread) that were declined, expired or denied."""
    declined = expired = denied = 0
    for result in _results_of_this_run(state.messages):
        if not result.get("is_error"):
            continue
        text = _text(result.get("content"))
        if text.startswith(_DECLINED):
            declined += 1
        elif text == texts.RESULT_EXPIRED:
            expired += 1
        elif text.startswith(_DENIED) and "forbidden by policy" in text:
            denied += 1
    return NotRun(declined, expired, denied)


def _results_of_this_run(messages: tuple[dict[str, Any], ...]) -> Iterator[dict[str, Any]]:
    start = 0
    for i, message in enumerate(messages):
        if message["role"] == "user" and _has_text(message["content"]):
            start = i + 1
    for message in messages[start:]:
        if message["role"] == "user" and isinstance(message["content"], list):
            yield from (b for b in message["content"] if b.get("type") == "tool_result")


def _has_text(content: Any) -> bool:
    if isinstance(content, str):
        return True
    return any(isinstance(b, dict) and b.get("type") == "text" for b in content)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""
