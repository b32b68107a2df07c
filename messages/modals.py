"""The modals a card opens: every argument in full, Edit then approve, and Decline with a reason."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from slack_sdk.models.blocks import (
    ContextBlock,
    InputBlock,
    MarkdownTextObject,
    PlainTextInputElement,
    PlainTextObject,
)
from slack_sdk.models.views import View

from harness.state import PendingCall
from messages import texts
from messages.arguments import MODAL_SECTIONS, arguments_of, fully_reviewable, modal_layout
from messages.blocks import section
from messages.cards import button_value
from messages.limits import MODAL_BLOCKS_MAX, PRIVATE_METADATA_MAX, SECTION_MAX
from messages.markdown import FENCE
from messages.text import fence_safe, inline, plural, visible_as

EDIT_VALUE_MAX = 3000  # Slack's plain_text_input max_length


def arguments_modal(*, call: PendingCall, preview: str | None = None) -> dict[str, Any]:
    """The modal behind "View all arguments": every argument of `call` in full, nothing to submit.

    `preview`: what the call would change (a diff), shown whole after the arguments as far as the
    modal's blocks allow.
    """
    args = arguments_of(call)
    packed, shown = modal_layout(args)
    count = len(args)
    intro = (
        f"{inline(call.name, 200)} with {plural(count, 'argument')}, each in full, those naming what "
        "the call acts on first. Characters nobody could see, or that turn text around, are shown "
        "as `[U+XXXX]`."
    )
    blocks = [section(intro), *(section(s) for s in packed)]
    room = MODAL_BLOCKS_MAX - len(blocks) - 2
    if preview and room > 0:
        blocks += [section(s) for s in _preview_sections(preview, room)]
    if shown.hidden:
        blocks.append(
            section(
                "⛔ *These arguments are too large to review in Slack:* "
                f"{plural(shown.hidden, 'character')} of them cannot be shown here, so this call "
                "cannot be approved in Slack."
            )
        )
    view = View(
        type="modal",
        callback_id="view_args",
        title=PlainTextObject(text="All arguments"),
        close=PlainTextObject(text="Close"),
        blocks=blocks,
    )
    return view.to_dict()


def _preview_sections(preview: str, room: int) -> list[str]:
    """The whole preview as fenced sections, at most `room` of them (the last says if it is cut)."""
    body = fence_safe(visible_as(preview))
    size = SECTION_MAX - 2 * len(FENCE) - 80
    chunks = [body[i : i + size] for i in range(0, len(body), size)] or [""]
    sections = []
    for n, chunk in enumerate(chunks[:room]):
        head = "*What it would change:*\n" if n == 0 else ""
        sections.append(f"{head}{FENCE}\n{chunk}\n{FENCE}")
    if len(chunks) > room:
        sections[-1] += (
            f"\n_…the rest of the change ({len(body) - room * size:,} characters) does not fit here._"
        )
    return sections


def edit_value(value: Any) -> str:
    """An argument as the edit modal shows it: strings as they are, anything else as JSON text."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def edit_modal(*, run_id: str, call: PendingCall, schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """The `edit_call` modal: one input per top-level argument, its current value to change.

    Every property of the tool's schema gets an input (absent ones start empty); strings are
    edited as they are, other values as JSON text. Submitting approves the edited call. A value too
    long for an input (`EDIT_VALUE_MAX`) gets none: the modal says it is kept as it is. Unless the
    call is too large to review (`fully_reviewable`): then the modal says it cannot be approved as
    it is, and such a value gets an empty input to replace it (left empty, it is kept, and the
    submission is refused while the call is still too large to review).
    """
    metadata = button_value(run_id, call)
    properties = dict((schema or {}).get("properties") or {})
    names = list(call.input) if isinstance(call.input, dict) else []
    names += [n for n in properties if n not in names]
    required = set((schema or {}).get("required") or ())
    reviewable = fully_reviewable(call)
    intro = (
        f"Editing {inline(call.name, 120)}: the call runs with what you submit, "
        "and the model is told a reviewer changed it. Strings as they are; other values as JSON."
    )
    if not reviewable:
        intro = f"{texts.EDIT_NOT_REVIEWABLE}\n{intro}"
    blocks: list[Any] = [ContextBlock(elements=[MarkdownTextObject(text=intro)])]
    kept = names[MODAL_SECTIONS:]
    for name in names[:MODAL_SECTIONS]:
        current = call.input.get(name) if isinstance(call.input, dict) else None
        initial = edit_value(current) if isinstance(call.input, dict) and name in call.input else None
        if initial is not None and len(initial) > EDIT_VALUE_MAX:
            if not reviewable:  # the one way to approve it here: replace what nobody could read
                blocks.append(_replace_input(name, len(initial)))
                continue
            kept.append(name)  # an input would hold it cut, and submitting would cut the argument
            continue
        kind = (properties.get(name) or {}).get("type")
        long = kind not in ("integer", "number", "boolean") and (initial is None or len(initial) > 60)
        element = PlainTextInputElement(
            action_id="value",
            multiline=long,
            initial_value=initial[:EDIT_VALUE_MAX] if initial is not None else None,
            max_length=EDIT_VALUE_MAX,
        )
        hint = (properties.get(name) or {}).get("description")
        blocks.append(
            InputBlock(
                block_id=name[:255],
                label=PlainTextObject(text=name[:2000]),
                element=element,
                optional=name not in required,
                hint=PlainTextObject(text=str(hint)[:2000]) if hint else None,
            )
        )
    if kept:
        listed = ", ".join(inline(n, 80) for n in kept[:20]) + (" …" if len(kept) > 20 else "")
        note = f"Kept as they are (too long to edit here): {listed}"
        blocks.append(ContextBlock(elements=[MarkdownTextObject(text=note[:3000])]))
    view = View(
        type="modal",
        callback_id="edit_call",
        private_metadata=metadata,
        title=PlainTextObject(text="Edit, then approve"),
        submit=PlainTextObject(text="Approve edited"),
        close=PlainTextObject(text="Cancel"),
        blocks=blocks,
    )
    return view.to_dict()


def _replace_input(name: str, size: int) -> InputBlock:
    """An empty input for an argument too long to show in one: what is typed replaces it."""
    hint = texts.EDIT_REPLACE_HINT.format(size=f"{size:,}")
    element = PlainTextInputElement(action_id="value", multiline=True, max_length=EDIT_VALUE_MAX)
    return InputBlock(
        block_id=name[:255],
        label=PlainTextObject(text=name[:2000]),
        element=element,
        optional=True,
        hint=PlainTextObject(text=hint),
    )


def decline_reason_modal(*, run_id: str, call: PendingCall) -> dict[str, Any]:
    """The modal behind "Decline with reason…": one multiline input the model will read."""
    metadata = button_value(run_id, call)
    if len(metadata) > PRIVATE_METADATA_MAX:
        raise ValueError(f"private_metadata of {len(metadata)} characters exceeds {PRIVATE_METADATA_MAX}")
    view = View(
        type="modal",
        callback_id="decline_reason",
        private_metadata=metadata,
        title=PlainTextObject(text="Decline"),
        submit=PlainTextObject(text="Decline"),
        close=PlainTextObject(text="Cancel"),
        blocks=[
            ContextBlock(
                elements=[
                    MarkdownTextObject(
                        text=f"Declining {inline(call.name, 120)}: the call will not run, "
                        "and the model is told why."
                    )
                ]
            ),
            InputBlock(
                block_id="reason",
                label=PlainTextObject(text="Why? (the model will read this)"),
                element=PlainTextInputElement(action_id="reason", multiline=True, max_length=500),
            ),
        ],
    )
    return view.to_dict()
