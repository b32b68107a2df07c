"""What a streaming message is made of: the `chunks` of chat.startStream / appendStream / stopStream.

Slack streams a message as chunks (slack_sdk's ``models/messages/chunk.py``): ``markdown_text``
chunks add to its text, ``task_update`` chunks keep a list of tasks on it, each known by its id: a
later update of the same id replaces that task's title and status, and adds the details and output
it gives to what the task showed (as Slack does: see `tests/fakes/slack_api.py`), where the task
first appeared, so the list keeps the order tasks were first seen. Every field is plain text.
Slack keeps a stream's tasks when it is stopped and when chat.update later replaces its text and
blocks, so the playground does too.

The playground's Slack (`playground.slack`) validates chunks here and refuses a malformed one as
Slack does, with ``invalid_arguments``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

Json = dict[str, Any]

TASK_STATUSES = ("pending", "in_progress", "complete", "error")
TASK_DISPLAY_MODES = ("timeline", "plan")
TASK_FIELDS = ("title", "status")  # what a later update of a task replaces
TASK_ADDED = ("details", "output")  # what a later update of a task adds to


class BadChunks(ValueError):
    """Chunks (or a task display mode) Slack would refuse with ``invalid_arguments``; says why."""


def parse_chunks(value: Any) -> list[Json]:
    """The `chunks` a call sends (a list, or its JSON text in a form post), checked; [] when absent."""
    if isinstance(value, str) and value.strip():
        try:
            value = json.loads(value)
        except ValueError:
            raise BadChunks("chunks: not JSON") from None
    if value is None or value == "":
        return []
    if not isinstance(value, list):
        raise BadChunks("chunks: must be a list")
    for index, chunk in enumerate(value):
        _check(chunk, index)
    return copy.deepcopy(value)


def display_mode(value: Any) -> str | None:
    """chat.startStream's `task_display_mode`: how the tasks are drawn (timeline or plan), if given."""
    if value is None or value == "":
        return None
    if value not in TASK_DISPLAY_MODES:
        raise BadChunks(f"task_display_mode: one of {', '.join(TASK_DISPLAY_MODES)}")
    return str(value)


def apply(message: Json, markdown_text: str, chunks: list[Json]) -> None:
    """Add `markdown_text` and then `chunks` to a streaming message, as Slack shows them."""
    message["text"] += markdown_text
    tasks: list[Json] = message.setdefault("tasks", [])
    for chunk in chunks:
        if chunk["type"] == "markdown_text":
            message["text"] += chunk["text"]
            continue
        known = next((task for task in tasks if task["id"] == chunk["id"]), None)
        if known is None:
            known = {"id": chunk["id"]}
            tasks.append(known)
        known.update({key: chunk[key] for key in TASK_FIELDS if chunk.get(key) is not None})
        for key in TASK_ADDED:
            if chunk.get(key):
                known[key] = known.get(key, "") + chunk[key]


def _check(chunk: Any, index: int) -> None:
    if not isinstance(chunk, Mapping):
        raise BadChunks(f"chunks.{index}: must be an object")
    kind = chunk.get("type")
    if kind == "markdown_text":
        if not isinstance(chunk.get("text"), str):
            raise BadChunks(f"chunks.{index}: a markdown_text chunk needs its text")
    elif kind == "task_update":
        for key in ("id", "title"):
            if not isinstance(chunk.get(key), str) or not chunk[key]:
                raise BadChunks(f"chunks.{index}: a task_update chunk needs its {key}")
        if chunk.get("status") not in TASK_STATUSES:
            raise BadChunks(f"chunks.{index}: status is one of {', '.join(TASK_STATUSES)}")
        for key in ("details", "output"):
            if chunk.get(key) is not None and not isinstance(chunk[key], str):
                raise BadChunks(f"chunks.{index}: {key} must be text")
    else:
        raise BadChunks(f"chunks.{index}: no chunk type {kind!r} (markdown_text or task_update)")
