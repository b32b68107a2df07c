"""The `edit_call` modal's submission: the arguments a reviewer wrote, checked before anything runs.

Each top-level argument has one text input (block_id = its name). Strings are taken as typed;
every other value is JSON text. The result is validated against the tool's input schema, then
the policy decides its tier again: an edit that is invalid, or that the policy denies, is refused
inside the modal (`response_action: errors`) and nothing is decided. So is one whose arguments are
too large to review in Slack (`messages.arguments.fully_reviewable`), as Approve refuses them:
submitted as the modal opened, or shortened too little. An argument too long for an input is kept
as it is unless the reviewer types its replacement.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from jsonschema.exceptions import SchemaError, ValidationError
from referencing.exceptions import Unresolvable

from harness.config import Config
from harness.policy import Tier
from harness.state import PendingCall
from harness.tools.schemas import validator_of
from messages import texts
from messages.arguments import fully_reviewable
from messages.modals import EDIT_VALUE_MAX, edit_value
from messages.reasons import denied_subject, plain_quote, plain_why
from messages.text import plural
from store import CallTool

_MESSAGE_MAX = 150  # Slack shows a short line under the input


def first_block(view: Mapping[str, Any], call: PendingCall) -> str:
    """The block an error that belongs to no one argument is shown under."""
    values = _values(view)
    return next(iter(values), next(iter(call.input), "value") if isinstance(call.input, dict) else "value")


def read(
    view: Mapping[str, Any], call: PendingCall, tool: CallTool, config: Config
) -> tuple[dict[str, Any], dict[str, str]]:
    """The edited arguments, and the errors to show by block_id (empty when the edit may run)."""
    schema: dict[str, Any] = tool.schema or {}
    edited, errors = _typed(_values(view), call, schema)
    if not errors:
        errors = _schema_errors(view, call, schema, edited)
    if not errors:
        errors = _policy_errors(view, call, tool, config, edited)
    return edited, errors


@dataclass(frozen=True)
class _Refused:
    """An argument as typed that cannot be used, and why."""

    message: str


_LEFT_OUT = object()  # an optional argument left empty: not passed at all


def _typed(
    values: Mapping[str, str | None], call: PendingCall, schema: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The arguments as typed, each read as its schema says, and why those that cannot be are not."""
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    original = call.input if isinstance(call.input, dict) else {}
    # An argument the modal offered no input for (too long to edit there) is kept as it is.
    edited: dict[str, Any] = {k: v for k, v in original.items() if k not in values}
    errors: dict[str, str] = {}
    for name, raw in values.items():
        value = _argument(name, raw, original, properties, required)
        if isinstance(value, _Refused):
            errors[name] = value.message
        elif value is not _LEFT_OUT:
            edited[name] = value
    return edited, errors


def _argument(
    name: str, raw: str | None, original: Mapping[str, Any], properties: Any, required: set[Any]
) -> Any:
    """The value typed for argument `name`: `_LEFT_OUT`, or `_Refused` with the reason."""
    if name not in properties and name not in original:
        return _Refused("Not an argument of this tool.")
    if raw is None or raw == "":
        if name in original and _too_long_to_show(original[name]):
            return original[name]  # its input started empty: nothing typed keeps it
        return _Refused("This argument is required.") if name in required else _LEFT_OUT
    kind = (properties.get(name) or {}).get("type")
    if kind == "string" or (kind is None and isinstance(original.get(name), str)):
        return raw
    try:
        return json.loads(raw)
    except ValueError as exc:
        return _Refused(f"Not valid JSON: {exc}"[:_MESSAGE_MAX])


def _schema_errors(
    view: Mapping[str, Any], call: PendingCall, schema: Mapping[str, Any], edited: dict[str, Any]
) -> dict[str, str]:
    """Where the edited arguments break the tool's schema: the first problem under each block."""
    fallback, shown = first_block(view, call), _values(view)
    errors: dict[str, str] = {}
    for where, message in _schema_problems(schema, edited):
        errors.setdefault(where if where in shown else fallback, message[:_MESSAGE_MAX])
    return errors


def _policy_errors(
    view: Mapping[str, Any],
    call: PendingCall,
    tool: CallTool,
    config: Config,
    edited: dict[str, Any],
) -> dict[str, str]:
    """The refusal of an edit the policy now denies, or of one still too large to review."""
    own = Tier(tool.own_tier) if tool.own_tier in set(Tier) else None  # as kept: anything else is none
    ruling = config.policy.decide(call.name, edited, own, tool.own_why)
    fallback = first_block(view, call)
    if ruling.tier is Tier.DENY:
        what = denied_subject(call.name, ruling.why, edited, plain_quote)
        why = plain_why(ruling.why, plain_quote)
        return {fallback: texts.EDIT_DENIED.format(what=what, why=why)[:_MESSAGE_MAX]}
    if not fully_reviewable(replace(call, input=edited)):
        # What Approve refuses, Edit must refuse too: submitted as it opened, or still too long.
        return {_longest(edited, view) or fallback: texts.EDIT_STILL_NOT_REVIEWABLE[:_MESSAGE_MAX]}
    return {}


def _too_long_to_show(value: Any) -> bool:
    """Whether the modal offers `value` no input holding it (`messages.modals.edit_modal`)."""
    return len(edit_value(value)) > EDIT_VALUE_MAX


def _longest(edited: Mapping[str, Any], view: Mapping[str, Any]) -> str | None:
    """The modal's input of the longest argument: where a "too large" error is shown."""
    shown = [name for name in _values(view) if name in edited]
    return max(shown, key=lambda name: len(edit_value(edited[name])), default=None)


def _values(view: Mapping[str, Any]) -> dict[str, str | None]:
    state = view.get("state")
    values = state.get("values") if isinstance(state, dict) else None
    if not isinstance(values, dict):
        return {}
    out: dict[str, str | None] = {}
    for block_id, actions in values.items():
        action = actions.get("value") if isinstance(actions, dict) else None
        raw = action.get("value") if isinstance(action, dict) else None
        out[str(block_id)] = raw if isinstance(raw, str) else None
    return out


def _schema_problems(schema: Mapping[str, Any], value: dict[str, Any]) -> list[tuple[str, str]]:
    """(argument, message) for each way `value` breaks `schema`.

    The schema is the tool's own (an MCP server's): a `$ref` in it is never fetched, and a schema
    that cannot be used refuses the edit rather than let it through unchecked.
    """
    if not schema:
        return []
    try:
        validator = validator_of(schema)
        found = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
    except (SchemaError, Unresolvable, RecursionError):
        return [("", texts.EDIT_SCHEMA_UNUSABLE)]
    problems = []
    for error in found:
        where = str(error.path[0]) if error.path else ""
        if not where and error.validator == "required":
            missing = [r for r in error.validator_value if r not in value]
            where = str(missing[0]) if missing else ""
        problems.append((where, _reason(error)))
    return problems


def _reason(error: ValidationError) -> str:
    """What is wrong, without the value itself: a long value would push the reason past what fits."""
    limit, value = error.validator_value, error.instance
    if error.validator == "maxLength" and isinstance(value, str):
        size, allowed = plural(len(value), "character"), plural(limit, "character")
        return texts.EDIT_TOO_LONG.format(size=size, limit=allowed)
    if error.validator == "minLength" and isinstance(value, str):
        size, needed = plural(len(value), "character"), plural(limit, "character")
        return texts.EDIT_TOO_SHORT.format(size=size, limit=needed)
    message, shown = error.message, repr(value)
    return "This value" + message[len(shown) :] if message.startswith(shown) else message
