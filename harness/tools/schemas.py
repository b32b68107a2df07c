"""A tool's input checked against a JSON schema it did not write itself (an MCP server's inputSchema).

The schema is hostile like everything a server sends: a `$ref` is resolved inside the schema only
and never fetched (jsonschema's default registry would fetch an `http://` `$ref` with urllib), a
schema that is not a valid JSON schema is reported, never raised past the caller, and a problem
is described without echoing the value, so a 100 kB argument does not make a 100 kB message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import islice
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import Unresolvable

from harness import texts
from harness.tools.base import BadInput

# Resolves a `$ref` only within the schema it is given: no retrieval of any URI.
_NO_RETRIEVAL: Registry[Any] = Registry()
_PROBLEMS_SHOWN = 3
_PROBLEM_CHARS = 200


def validator_of(schema: Any) -> Validator:
    """A validator for `schema` in its own dialect (2020-12 when it names none), or `SchemaError`."""
    if not isinstance(schema, Mapping):
        raise SchemaError("the schema is not a JSON object")
    schema = dict(schema)
    try:
        cls = validators.validator_for(schema, default=Draft202012Validator)
        cls.check_schema(schema)
    except RecursionError:
        raise SchemaError("the schema is nested too deeply to check") from None
    return cls(schema, registry=_NO_RETRIEVAL)


def schema_problem(schema: Any) -> str | None:
    """Why `schema` is not a usable JSON schema, in one short line; None when it is."""
    try:
        validator_of(schema)
    except SchemaError as exc:
        return _short(exc.message)
    return None


def input_checker(schema: Any) -> Callable[[Any], dict[str, Any]]:
    """A `Tool.validate` for `schema`: the input unchanged when it fits, else `BadInput`.

    The validator is built on the first call (a listing of many tools costs nothing until one is
    called). A schema that cannot be used fails closed: the call is refused, never sent unchecked.
    """
    built: list[Validator] = []

    def check(raw: Any) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise BadInput("input: must be a JSON object")
        try:
            if not built:
                built.append(validator_of(schema))
            problems = list(islice(built[0].iter_errors(raw), _PROBLEMS_SHOWN))
        except SchemaError as exc:
            raise BadInput(texts.SCHEMA_UNUSABLE.format(why=_short(exc.message))) from None
        except (Unresolvable, RecursionError) as exc:
            raise BadInput(texts.SCHEMA_UNUSABLE.format(why=_short(f"{type(exc).__name__}: {exc}"))) from None
        if problems:
            raise BadInput("; ".join(_described(p) for p in problems))
        return raw

    return check


def _described(error: ValidationError) -> str:
    """`where: what`, the value itself left out (it may be long, and the model has it anyway)."""
    where = ".".join(str(part) for part in error.absolute_path) or "input"
    message, shown = error.message, repr(error.instance)
    if message.startswith(shown):
        message = "the value" + message[len(shown) :]
    return f"{where}: {_short(message)}"


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _PROBLEM_CHARS else text[: _PROBLEM_CHARS - 1] + "…"
