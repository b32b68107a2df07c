"""What the thread shows when a tool's server asks the requester something (`harness.tools.inputs`).

Three messages and a modal:

- the prompt, that only the requester sees (`chat.postEphemeral`): who asks, why, and the buttons,
  `provide_input` (a form: opens the modal; a URL: "I've finished") and `decline_input`; a URL
  question shows the domain it sends them to and a link button to it;
- the note everyone sees, that the run waits for the requester's answer (for a form, with the
  same `provide_input` button: the prompt goes when Slack is reloaded); never the URL;
- the note once answered, declined, not answered in time, or stopped (no buttons);
- the modal (`callback_id` `mcp_input`): one input per field of the question's schema, its
  `block_id` the field's name, read back and checked against the schema (`read_answers`).

Everything a server wrote (its message, field titles and descriptions) is untrusted: shown as
text, escaped, cut to Slack's limits, never as a link or a mention.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from harness.tools.inputs import InputAsk, InputQuestion, is_date, typed_answer
from messages.blocks import Message, context, fit, scaled, section
from messages.limits import MODAL_BLOCKS_MAX, PRIVATE_METADATA_MAX, SECTION_MAX
from messages.text import inert, inline, mention, plain, slack_date

BUTTON_VALUE_MAX = 2000
MID_CALL = "mid-call"  # what the buttons of a question asked mid-call name in place of a call id
TEXT_VALUE_MAX = 3000  # Slack's plain_text_input max_length
OPTIONS_MAX = 100  # a static select's options
LABEL_MAX = 2000
HINT_MAX = 2000


def input_value(run_id: str, call_id: str, question_id: str) -> str:
    """`run:call:question`: an answer binds to the question its prompt showed."""
    value = f"{run_id}:{call_id}:{question_id}"
    if len(value) > BUTTON_VALUE_MAX:
        raise ValueError(f"button value of {len(value)} characters exceeds {BUTTON_VALUE_MAX}")
    return value


def _asks(ask: InputAsk, question: InputQuestion, tool: str, limit: int) -> str:
    said = inert(question.message, max(limit - 200, 40)) or "(no message)"
    return f"*{inert(ask.server, 40)}* asks, before {inline(tool, 120)} can go on:\n>{said}"


def input_prompt(
    *,
    run_id: str,
    call_id: str,
    tool: str,
    ask: InputAsk,
    question: InputQuestion,
    expires_at: datetime,
    question_id: str | None = None,
) -> Message:
    """The requester's prompt (ephemeral): the question, and how to answer it. `question_id`: what
    its answer binds to (default: the question's id in `ask`; a mid-call question has its own)."""
    value = input_value(run_id, call_id, question_id or ask.question_id(question))
    decline = _button("decline_input", "Decline", value, style="danger")
    secret = question.secret_fields if question.mode == "form" else ()
    when = f"Unanswered by {slack_date(expires_at)}, the server is told it was cancelled."
    if question.mode == "url":
        where = f"It sends you to *{inert(question.domain, 200)}*. Open it, finish there, then say so here."
        link = {
            "type": "button",
            "action_id": "open_input_url",
            "text": _plain("Open " + question.domain[:60]),
        }
        link["url"] = question.url
        actions = [link, _button("provide_input", "I've finished", value, style="primary"), decline]
        lines = [where, when]
    elif secret:
        names = ", ".join(inline(n, 60) for n in secret[:10])
        lines = [
            f"It asks for a secret ({names}), which is never typed into Slack: the server must ask "
            "for it by a link instead. You can only decline here.",
            when,
        ]
        actions = [decline]
    else:
        fields = ", ".join(inline(n, 60) for n in list(question.fields)[:10]) or "nothing but a yes"
        lines = [f"It asks for: {fields}.", when]
        actions = [_button("provide_input", "Answer…", value, style="primary"), decline]

    def blocks(scale: float) -> list[dict[str, Any]]:
        limit = scaled(SECTION_MAX, scale)
        return [
            section(_asks(ask, question, tool, limit)),
            context(*lines),
            {"type": "actions", "elements": actions},
        ]

    text = f"{ask.server} asks you something before {tool} can go on"
    return Message(text=plain(text, 300), blocks=fit(blocks))


def input_note(
    *,
    run_id: str,
    call_id: str,
    tool: str,
    ask: InputAsk,
    question: InputQuestion,
    requester: str,
    question_id: str | None = None,
) -> Message:
    """What everyone sees while the run waits for the requester's answer (never the URL)."""
    who = mention(requester)
    line = f"⏳ *{inert(ask.server, 40)}* asked {who} something before {inline(tool, 120)} can go on; "
    line += "the run waits for their answer (only they can give it)."
    blocks: list[dict[str, Any]] = [section(line)]
    if question.mode == "form" and not question.secret_fields:
        value = input_value(run_id, call_id, question_id or ask.question_id(question))
        blocks.append({"type": "actions", "elements": [_button("provide_input", "Answer…", value)]})
    return Message(text=plain(f"{ask.server} asked the requester something", 300), blocks=blocks)


def input_settled(*, ask: InputAsk, tool: str, outcome: str, by: str | None, at: datetime) -> Message:
    """The note once settled: `outcome` is accept, decline, cancel (nobody answered) or stopped."""
    server = f"*{inert(ask.server, 40)}*"
    said = {
        "accept": f"✅ {mention(by)} answered what {server} asked for {inline(tool, 120)}",
        "decline": f"🚫 {mention(by)} declined to answer what {server} asked for {inline(tool, 120)}",
        "cancel": f"⌛ Nobody answered what {server} asked for {inline(tool, 120)} in time: it was told so",
        "stopped": f"🛑 The run was stopped by {mention(by)} while {server} waited for an answer",
    }[outcome]
    return Message(
        text=plain(f"{ask.server}'s question: {outcome}", 300), blocks=[section(f"{said} · {slack_date(at)}")]
    )


# --- the modal ---------------------------------------------------------------------------------


def input_modal(
    *,
    run_id: str,
    call_id: str,
    ask: InputAsk,
    question: InputQuestion,
    tool: str,
    question_id: str | None = None,
) -> dict[str, Any]:
    """The form of `question` as a modal (`mcp_input`): one input per field, `block_id` its name."""
    metadata = input_value(run_id, call_id, question_id or ask.question_id(question))
    if len(metadata) > PRIVATE_METADATA_MAX:
        raise ValueError(f"private_metadata of {len(metadata)} characters exceeds {PRIVATE_METADATA_MAX}")
    blocks: list[dict[str, Any]] = [section(_asks(ask, question, tool, SECTION_MAX))]
    required = set(question.required)
    for name, spec in list(question.fields.items())[: MODAL_BLOCKS_MAX - 2]:
        block = {
            "type": "input",
            "block_id": name[:255],
            "label": _plain(str(spec.get("title") or name)[:LABEL_MAX]),
            "element": _element(spec),
            "optional": name not in required,
        }
        if spec.get("description"):
            block["hint"] = _plain(str(spec["description"])[:HINT_MAX])
        blocks.append(block)
    blocks.append(
        context(
            "What you send goes to the server: this app keeps it in no thread, log or record "
            "(the server's answer may quote it)."
        )
    )
    return {
        "type": "modal",
        "callback_id": "mcp_input",
        "private_metadata": metadata,
        "title": _plain("Answer"),
        "submit": _plain("Send"),
        "close": _plain("Cancel"),
        "blocks": blocks,
    }


def _element(spec: dict[str, Any]) -> dict[str, Any]:
    kind, default = spec.get("type"), spec.get("default")
    choices = _choices(spec)
    element: dict[str, Any]
    if kind == "array":
        items = _choices(_mapping(spec.get("items")))
        element = {
            "type": "multi_static_select",
            "action_id": "value",
            "options": items or [_option("—", "")],
        }
        if isinstance(default, list):
            initial = [o for o in items if o["value"] in {str(d) for d in default}]
            if initial:
                element["initial_options"] = initial
        return element
    if choices:
        element = {"type": "static_select", "action_id": "value", "options": choices}
        chosen = [o for o in choices if default is not None and o["value"] == str(default)]
        if chosen:
            element["initial_option"] = chosen[0]
        return element
    if kind == "boolean":
        options = [_option("Yes", "true"), _option("No", "false")]
        element = {"type": "radio_buttons", "action_id": "value", "options": options}
        if isinstance(default, bool):
            element["initial_option"] = options[0 if default else 1]
        return element
    if kind in ("number", "integer"):
        element = {"type": "number_input", "action_id": "value", "is_decimal_allowed": kind == "number"}
        for key, field in (("minimum", "min_value"), ("maximum", "max_value")):
            if isinstance(spec.get(key), int | float) and not isinstance(spec.get(key), bool):
                element[field] = str(spec[key])
        if isinstance(default, int | float) and not isinstance(default, bool):
            element["initial_value"] = str(default)
        return element
    fmt = spec.get("format")
    if fmt == "date":
        element = {"type": "datepicker", "action_id": "value"}
        if isinstance(default, str) and is_date(default):
            element["initial_date"] = default
        return element
    kinds = {"email": "email_text_input", "uri": "url_text_input"}
    element = {"type": kinds.get(str(fmt), "plain_text_input"), "action_id": "value"}
    if element["type"] == "plain_text_input":
        longest = spec.get("maxLength")
        element["max_length"] = (
            min(int(longest), TEXT_VALUE_MAX) if isinstance(longest, int) and longest > 0 else TEXT_VALUE_MAX
        )
        if isinstance(spec.get("minLength"), int) and 0 < spec["minLength"] <= element["max_length"]:
            element["min_length"] = spec["minLength"]
        element["multiline"] = bool(longest is None or (isinstance(longest, int) and longest > 200))
    if isinstance(default, str) and default:
        element["initial_value"] = default[:TEXT_VALUE_MAX]
    return element


def _choices(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """A field's choices as options: `enum` (titled by `enumNames`), or `oneOf` of `const`/`title`."""
    if isinstance(spec.get("enum"), list):
        found_names = spec.get("enumNames")
        names: list[Any] = found_names if isinstance(found_names, list) else []
        values = [str(v) for v in spec["enum"]][:OPTIONS_MAX]
        return [_option(str(names[i]) if i < len(names) else v, v) for i, v in enumerate(values)]
    for key in ("oneOf", "anyOf"):  # titled choices: `const` with a `title` each
        if isinstance(spec.get(key), list):
            found = [o for o in spec[key] if isinstance(o, dict) and "const" in o][:OPTIONS_MAX]
            return [_option(str(o.get("title") or o["const"]), str(o["const"])) for o in found]
    return []


def read_answers(view: dict[str, Any], question: InputQuestion) -> tuple[dict[str, Any], dict[str, str]]:
    """The values the modal holds, checked against the question's schema: (values, errors by
    block id). Only the schema's fields are read; anything else in the submission is ignored."""
    state = _mapping(view.get("state"))
    submitted = _mapping(state.get("values"))
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
    required = set(question.required)
    for name, spec in question.fields.items():
        raw = _mapping(_mapping(submitted.get(name[:255])).get("value"))
        try:
            value = _read(raw, spec)
        except ValueError as exc:
            errors[name[:255]] = str(exc)[:150]
            continue
        if value is None:
            if name in required:
                errors[name[:255]] = "This is required."
            continue
        values[name] = value
    return values, errors


def _read(raw: dict[str, Any], spec: dict[str, Any]) -> Any:
    kind = spec.get("type")
    element = raw.get("type")
    if element == "multi_static_select":
        chosen = [str(o.get("value")) for o in raw.get("selected_options") or [] if isinstance(o, dict)]
        allowed = {o["value"] for o in _choices(_mapping(spec.get("items")))}
        if any(c not in allowed for c in chosen):
            raise ValueError("Choose from the list.")
        return chosen or None
    if element in ("static_select", "radio_buttons"):
        option = raw.get("selected_option")
        text = str(option.get("value")) if isinstance(option, dict) else None
        if text is None:
            return None
        if kind == "boolean":
            if text not in ("true", "false"):
                raise ValueError("Choose yes or no.")
            return text == "true"
        choices = {o["value"] for o in _choices(spec)}
        if text not in choices:
            raise ValueError("Choose from the list.")
        return typed_answer(text, spec)
    if element == "datepicker":
        picked = raw.get("selected_date")
        return str(picked) if isinstance(picked, str) and is_date(picked) else None
    text = raw.get("value")
    if not isinstance(text, str) or not text.strip():
        return None
    return typed_answer(text.strip() if kind in ("number", "integer") else text, spec)


def _mapping(value: Any) -> dict[str, Any]:
    """`value` when it is a dict (a payload's part), else an empty one: nothing from outside is
    trusted to have the shape Slack documents."""
    return value if isinstance(value, dict) else {}


def _plain(text: str) -> dict[str, Any]:
    return {"type": "plain_text", "text": text or " ", "emoji": False}


def _option(text: str, value: str) -> dict[str, Any]:
    return {"text": _plain(text[:75]), "value": value[:150]}


def _button(action_id: str, label: str, value: str, *, style: str | None = None) -> dict[str, Any]:
    button: dict[str, Any] = {"type": "button", "action_id": action_id, "text": _plain(label), "value": value}
    if style:
        button["style"] = style
    return button


def now() -> datetime:
    return datetime.now(UTC)
