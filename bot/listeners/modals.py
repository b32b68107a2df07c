"""Modals about a call: its whole arguments, a decline with a reason, and an edit.

A button opens its modal at once (a trigger_id lives 3 s); a submission is checked like a click
(`approvals.open_record`) and decided like one (`approvals.decide`); an edit is validated inside
the modal, which stays open with the errors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from slack_bolt import Ack, App, BoltContext
from slack_sdk import WebClient

from bot import approver_checks, edits
from bot.listeners.approvals import awaiting_call, decide, open_record
from bot.listening import (
    REPLY,
    BotDeps,
    Clicker,
    Then,
    as_dict,
    clicker_and_channel,
    tell_clicker,
)
from gates import deciders
from harness.state import Decision, PendingCall, Verdict
from messages import texts
from messages.modals import arguments_modal, decline_reason_modal, edit_modal
from store import (
    RunRecord,
)

log = logging.getLogger(__name__)


def _modal_opener(
    deps: BotDeps, build: Callable[[RunRecord, PendingCall], dict[str, Any]], *, viewing: bool
) -> Callable[..., None]:
    """A listener for a card button that opens a modal about its call (at once: trigger_id lives 3 s).

    `viewing`: the requester may open it too, not only those who may decide.
    """

    def open_modal(
        ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext, client: WebClient
    ) -> None:
        ack()
        clicker, channel = clicker_and_channel(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        click = open_record(deps, action.get("value"), clicker, channel, context, viewing=viewing)
        if click is None:
            return
        record = click.record
        call = awaiting_call(record, click.ref.call_id)
        trigger_id = body.get("trigger_id")
        if call is None or not isinstance(trigger_id, str):
            context[REPLY] = texts.UNKNOWN_APPROVAL
            return
        client.views_open(trigger_id=trigger_id, view=build(record, call))

    return open_modal


def _on_view_args(deps: BotDeps) -> Callable[..., None]:
    def build(record: RunRecord, call: PendingCall) -> dict[str, Any]:
        return arguments_modal(call=call, preview=record.call_tool(call.id).preview)

    return _modal_opener(deps, build, viewing=True)


def _on_decline_with_reason(deps: BotDeps) -> Callable[..., None]:
    return _modal_opener(
        deps, lambda record, call: decline_reason_modal(run_id=record.run_id, call=call), viewing=False
    )


def _on_decline_reason(deps: BotDeps) -> Callable[..., None]:
    def on_decline_reason(ack: Ack, body: dict[str, Any], view: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker = Clicker.of(body)
        user = clicker.user
        values = as_dict(as_dict(view.get("state")).get("values"))
        raw_reason = as_dict(as_dict(values.get("reason")).get("reason")).get("value")
        reason = (raw_reason if isinstance(raw_reason, str) else "").strip()
        click = open_record(deps, view.get("private_metadata"), clicker, None, context)
        context["reply_user"] = user
        if click is None:
            return
        context["reply_channel"] = click.record.channel
        decide(deps, click, Decision(Verdict.DECLINED, by=user, reason=reason[:500] or None), context)

    return on_decline_reason


def _on_edit(deps: BotDeps) -> Callable[..., None]:
    def build(record: RunRecord, call: PendingCall) -> dict[str, Any]:
        return edit_modal(run_id=record.run_id, call=call, schema=record.call_tool(call.id).schema)

    return _modal_opener(deps, build, viewing=False)


def _on_edit_submitted(deps: BotDeps) -> Callable[..., None]:
    """`edit_call`: validate the edited arguments (schema, then policy) inside the modal; approve them."""

    def on_edit_submitted(ack: Ack, body: dict[str, Any], view: dict[str, Any], context: BoltContext) -> None:
        clicker = Clicker.of(body)
        context["reply_user"] = clicker.user
        click = open_record(deps, view.get("private_metadata"), clicker, None, context)
        if click is None:
            ack()
            return
        record, ref = click.record, click.ref
        context["reply_channel"] = record.channel
        call = awaiting_call(record, ref.call_id)
        if call is None or call.fingerprint != ref.fingerprint:
            ack()
            context[REPLY] = texts.STALE_CARD if call is not None else texts.UNKNOWN_APPROVAL
            return
        settings = deps.settings_of(record)
        edited, errors = edits.read(view, call, record.call_tool(call.id), settings)
        if not errors and settings.approvals.required > 1:
            errors = {edits.first_block(view, call): texts.NO_EDIT_WITH_QUORUM}
        if not errors and deciders.self_approval_refused(settings.approvals, clicker.user, record):
            errors = {edits.first_block(view, call): texts.NO_SELF_APPROVAL}
        if not errors and deps.no_more_work(record) is not None:
            errors = {edits.first_block(view, call): texts.NOT_A_REQUESTER_NOW_SHORT}
        changed = edited if edited != call.input else None
        check = None
        if not errors:  # the callable is asked of the arguments that would run
            asked = approver_checks.ask(deps, record, call, clicker.user, edited=changed)
            if asked.refusal is not None and asked.check is not None:
                errors = {edits.first_block(view, call): approver_checks.refusal_line(asked.check, 150)}
            check = asked.check
        if errors:
            ack(response_action="errors", errors=errors)  # the modal stays open; nothing is decided
            return
        ack()
        decision = Decision(Verdict.APPROVED, by=clicker.user, edited_input=changed, check=check)
        decide(deps, click, decision, context)

    return on_edit_submitted


def register(app: App, deps: BotDeps, then: Then) -> None:
    """Register this surface's listeners."""
    app.action("view_args")(then(_on_view_args(deps), tell_clicker))
    app.action("decline_with_reason")(then(_on_decline_with_reason(deps), tell_clicker))
    app.view("decline_reason")(then(_on_decline_reason(deps), tell_clicker))
    app.action("edit")(then(_on_edit(deps), tell_clicker))
    app.view("edit_call")(then(_on_edit_submitted(deps), tell_clicker))
