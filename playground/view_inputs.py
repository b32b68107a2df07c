"""A modal's input blocks as Slack takes them and gives them back: what `views.open` refuses, and
the `state.values` a `view_submission` carries.

The elements are those a bot's modals use: `plain_text_input`, `email_text_input`,
`url_text_input`, `number_input`, `datepicker`, `static_select`, `multi_static_select`,
`radio_buttons` and `checkboxes`. Slack refuses a view whose input block has no label or an
element it does not know, a select or radio group without options, an initial choice that is not
one of them, a `number_input` that does not say whether decimals are allowed, or a malformed
date (`invalid_arguments`); so does the stand-in, so a bot that works here is not refused there.

In `state.values`, each input block's element is reported in Slack's shape: text and number
elements as `value` (a string; `None` when empty), a datepicker as `selected_date`, a single
choice as `selected_option` (the option object as the view gave it; `None` when nothing is
chosen), several as `selected_options`.
"""

from __future__ import annotations

import copy
import re
from typing import Any

Json = dict[str, Any]

TEXT_ELEMENTS = ("plain_text_input", "email_text_input", "url_text_input", "number_input")
ONE_CHOICE = ("static_select", "radio_buttons")
MANY_CHOICES = ("multi_static_select", "checkboxes")
ELEMENTS = (*TEXT_ELEMENTS, "datepicker", *ONE_CHOICE, *MANY_CHOICES)
MAX_OPTIONS = {"static_select": 100, "multi_static_select": 100, "radio_buttons": 10, "checkboxes": 10}
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class Refused(ValueError):
    """A view Slack would refuse: its API's `invalid_arguments`."""


def check_inputs(blocks: list[Json]) -> None:
    """`Refused` when an input block of `blocks` is one Slack's `views.open` would refuse."""
    for block in blocks:
        if block.get("type") != "input":
            continue
        label, element = block.get("label"), block.get("element")
        if not isinstance(label, dict) or label.get("type") != "plain_text" or not label.get("text"):
            raise Refused("an input block needs a plain_text label")
        if not isinstance(element, dict) or element.get("type") not in ELEMENTS:
            raise Refused(f"an input block's element must be one of {', '.join(ELEMENTS)}")
        _check_element(element)


def _check_element(element: Json) -> None:
    kind = element["type"]
    if kind == "number_input" and not isinstance(element.get("is_decimal_allowed"), bool):
        raise Refused("a number_input needs is_decimal_allowed")
    if kind == "datepicker" and "initial_date" in element and not _is_date(element["initial_date"]):
        raise Refused("a datepicker's initial_date must be YYYY-MM-DD")
    if kind not in MAX_OPTIONS:
        return
    options = element.get("options")
    if not isinstance(options, list) or not 1 <= len(options) <= MAX_OPTIONS[kind]:
        raise Refused(f"a {kind} needs 1 to {MAX_OPTIONS[kind]} options")
    if not all(isinstance(o, dict) and isinstance(o.get("text"), dict) and "value" in o for o in options):
        raise Refused("each option needs a text and a value")
    initial = (
        [element["initial_option"]] if "initial_option" in element else element.get("initial_options", [])
    )
    if not isinstance(initial, list) or any(i not in options for i in initial):
        raise Refused("an initial option must be one of the options")


def _is_date(value: Any) -> bool:
    return isinstance(value, str) and DATE.fullmatch(value) is not None


def state_values(view: Json, typed: Json) -> Json:
    """A view's `state.values` from what the page sent, `{block_id: {action_id: what}}` (a string,
    a list of option values, or None for nothing): every input block, sent or not (then its
    initial value)."""
    values: Json = {}
    for block in view.get("blocks") or []:
        if not isinstance(block, dict) or block.get("type") != "input":
            continue
        element = block.get("element") or {}
        block_id, action_id = str(block.get("block_id")), str(element.get("action_id"))
        sent = typed.get(block_id)
        given = sent.get(action_id, _UNSENT) if isinstance(sent, dict) else _UNSENT
        values[block_id] = {action_id: _state(element, given)}
    return values


_UNSENT = object()  # the page sent nothing for this element: its initial value stands


def _state(element: Json, given: Any) -> Json:
    kind = str(element.get("type", "plain_text_input"))
    options = [o for o in element.get("options") or [] if isinstance(o, dict)]
    if kind in ONE_CHOICE:
        if given is _UNSENT:
            picked = element.get("initial_option")
        else:
            picked = next(iter(_options(options, [given])), None)
        return {"type": kind, "selected_option": copy.deepcopy(picked if isinstance(picked, dict) else None)}
    if kind in MANY_CHOICES:
        many = element.get("initial_options") if given is _UNSENT else _options(options, given)
        return {"type": kind, "selected_options": copy.deepcopy(many if isinstance(many, list) else [])}
    if kind == "datepicker":
        date = element.get("initial_date") if given is _UNSENT else given
        return {"type": kind, "selected_date": date if _is_date(date) else None}
    text = element.get("initial_value") if given is _UNSENT else given
    return {"type": kind, "value": text if isinstance(text, str) and text else None}


def _options(options: list[Json], values: Any) -> list[Json]:
    """The options whose values were sent, in the order sent (a value no option has is dropped)."""
    by_value = {o.get("value"): o for o in options}
    sent = values if isinstance(values, list) else []
    return [by_value[v] for v in sent if isinstance(v, str) and v in by_value]
