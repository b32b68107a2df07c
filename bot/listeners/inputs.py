"""The requester's answers to what a tool's server asks (`harness.tools.inputs`, `messages.inputs`).

`provide_input` opens the form's modal (at once: a trigger_id lives 3 s), or, for a URL question,
says the requester finished there; `decline_input` declines; the modal's submission (`mcp_input`)
is read and checked against the question's schema inside the modal, which stays open with the
errors. Each answer is checked like a click (`open_click`: the run, the workspace, the channel)
and more: only the requester answers, and only the question the run waits on now (its id is in the
button). It is recorded as the park's one decision, atomically and once (`store.parks.decide`); a
form's values are kept apart (`store.inputs`), named by the decision, and never logged or audited
(the audit keeps who answered and the names of the fields).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slack_bolt import Ack, App, BoltContext
from slack_sdk import WebClient

from bot.listening import (
    APPLY_DECISIONS,
    REPLY,
    BotDeps,
    Click,
    Clicker,
    Opening,
    Reply,
    Then,
    Where,
    clicker_and_channel,
    open_click,
    tell_clicker,
)
from harness.state import Decision, PendingCall, StateError, Verdict
from harness.tools.inputs import InputAsk, InputQuestion
from messages import inputs, texts
from messages.inputs import MID_CALL
from store import DecideOutcome, RunStatus, check_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputRef:
    """What an answer's button names: the run, the call, and the question it showed."""

    run_id: str
    call_id: str
    question_id: str

    @classmethod
    def parse(cls, value: Any) -> InputRef:
        run_id, _, rest = str(value or "").partition(":")
        call_id, _, question_id = rest.partition(":")
        return cls(check_id("run", run_id), check_id("call", call_id), check_id("fingerprint", question_id))


@dataclass(frozen=True)
class _Asked:
    """The question a click answers: one a parked call waits on (`call`), or one a server asks
    while its call waits (`call` None: the older protocol's, in `store.questions`)."""

    question: InputQuestion
    server: str
    tool: str
    call: PendingCall | None = None


def _opening(deps: BotDeps) -> Opening[InputRef]:
    def still_waiting(click: Click[InputRef]) -> Reply | None:
        return texts.INPUT_NOT_OPEN if _asked(deps, click) is None else None

    def the_requester(click: Click[InputRef]) -> Reply | None:
        if click.clicker.user == click.record.requester:
            return None
        return (texts.INPUT_ONLY_REQUESTER, {"who": click.record.requester})

    return Opening(
        InputRef.parse,
        lambda ref: ref.run_id,
        texts.INPUT_NOT_OPEN,
        (still_waiting, the_requester),
        where=Where.CARD,
    )


def _asked(deps: BotDeps, click: Click[InputRef]) -> _Asked | None:
    """The question the click answers, if it is still open and is the one its button showed;
    None when the run moved on (or the button is forged)."""
    record, ref = click.record, click.ref
    if ref.call_id == MID_CALL:
        if record.status is not RunStatus.RUNNING:
            return None
        kept = deps.store.questions.get(record.run_id, ref.question_id)
        if (
            kept is None
            or kept.get("requester") != record.requester
            or not isinstance(kept.get("question"), dict)
        ):
            return None
        try:
            question = InputQuestion.from_json(kept["question"])
        except (KeyError, TypeError, ValueError):
            return None
        return _Asked(question, str(kept.get("server") or ""), str(kept.get("tool") or ""))
    if record.status is not RunStatus.AWAITING_APPROVAL:
        return None
    try:
        call = next((c for c in record.run_state().pending if c.id == ref.call_id), None)
    except StateError:
        return None
    if call is None or not call.waits_for_input or call.asking is None:
        return None
    waiting = call.asking.next_question
    if waiting is None or call.asking.question_id(waiting) != ref.question_id:
        return None
    return _Asked(waiting, call.asking.server, call.name, call)


def _answer(
    deps: BotDeps,
    click: Click[InputRef],
    verdict: Verdict,
    context: BoltContext,
    values: dict[str, Any] | None = None,
) -> None:
    """Record the requester's answer, once: a parked call's as the park's decision on it (the run
    resumes), a mid-call question's handed to the worker that waits for it.

    A parked call's accepted form's `values` are kept first (`store.inputs`), under a reference the
    decision carries; a second answer finds the decision made and changes nothing (its values
    expire). The audit keeps who answered, how, and the names of the fields, never their values."""
    record, ref = click.record, click.ref
    asked = _asked(deps, click)
    if asked is None:
        context[REPLY] = texts.INPUT_NOT_OPEN
        return
    names = ", ".join(sorted(values or {}))[:300]
    kind = "input request" if asked.call is not None else "mid-call question"
    said = (
        f"{asked.question.mode}, fields answered: {names or 'none'}"
        if verdict is Verdict.APPROVED
        else asked.question.mode
    )
    audit = record.audit_fields(asked.call)
    audit["tier_why"] = f"{kind} of MCP server {asked.server}: {said}"
    audit["kind"] = "input"  # an answer to a server, not an approval: no rule is suggested from it
    if asked.call is None:
        _answer_mid_call(deps, click, verdict, context, values, {**audit, "tool": asked.tool})
        return
    if refused := deps.no_more_work(record):  # an answer resumes the run: its model work goes on
        context[REPLY] = refused
        return
    kept = None
    if values is not None:
        ttl = int(deps.settings_of(record).approvals.expire_after_minutes * 60)  # `keep` adds a day
        kept = deps.store.inputs.keep(record.run_id, values, ttl)
    decision = Decision(verdict, by=click.clicker.user, reason=kept)
    result = deps.store.parks.decide(
        record.run_id, record.park_id, ref.call_id, decision, audit=audit, fingerprint=ref.question_id
    )
    if result.outcome in (DecideOutcome.RECORDED, DecideOutcome.EXPIRED):
        deps.enqueue(APPLY_DECISIONS, record.run_id)  # the run resumes (no approval metric: an answer)
    if result.outcome is DecideOutcome.RECORDED:
        return
    if kept is not None:
        deps.store.inputs.drop(record.run_id, [kept])
    if result.outcome is DecideOutcome.STALE:
        context[REPLY] = texts.INPUT_NOT_OPEN
    elif result.decision is not None and result.decision.verdict is Verdict.EXPIRED:
        context[REPLY] = texts.INPUT_EXPIRED
    else:
        context[REPLY] = texts.INPUT_ALREADY_ANSWERED


def _answer_mid_call(
    deps: BotDeps,
    click: Click[InputRef],
    verdict: Verdict,
    context: BoltContext,
    values: dict[str, Any] | None,
    audit: dict[str, Any],
) -> None:
    """Hand the answer to the worker whose call waits for it, if it is the first; audit it."""
    record, ref, user = click.record, click.ref, click.clicker.user
    action = "accept" if verdict is Verdict.APPROVED else "decline"
    answer: dict[str, Any] = {"action": action, "by": user}
    if values is not None:
        answer["content"] = values
    if not deps.store.questions.answer(record.run_id, ref.question_id, answer):
        context[REPLY] = texts.INPUT_ALREADY_ANSWERED
        return
    entry = {"run_id": record.run_id, "call_id": MID_CALL, **audit, "verdict": verdict.value, "by": user}
    deps.store.audit.append(entry)


def _on_provide(deps: BotDeps) -> Callable[..., None]:
    def on_provide(
        ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext, client: WebClient
    ) -> None:
        ack()
        clicker, channel = clicker_and_channel(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        click = open_click(deps, _opening(deps), action.get("value"), clicker, channel, context)
        if click is None:
            return
        asked = _asked(deps, click)
        if asked is None:
            context[REPLY] = texts.INPUT_NOT_OPEN
            return
        question = asked.question
        if question.mode == "url":  # "I've finished": nothing to carry, the server knows what was done
            _answer(deps, click, Verdict.APPROVED, context)
            return
        if question.secret_fields:
            context[REPLY] = texts.INPUT_SECRET
            return
        trigger_id = body.get("trigger_id")
        if not isinstance(trigger_id, str):
            context[REPLY] = texts.INPUT_NOT_OPEN
            return
        view = inputs.input_modal(
            run_id=click.record.run_id,
            call_id=click.ref.call_id,
            ask=InputAsk(asked.server, (question,)),
            question=question,
            tool=asked.tool,
            question_id=click.ref.question_id,
        )
        client.views_open(trigger_id=trigger_id, view=view)

    return on_provide


def _on_decline(deps: BotDeps) -> Callable[..., None]:
    def on_decline(ack: Ack, body: dict[str, Any], action: dict[str, Any], context: BoltContext) -> None:
        ack()
        clicker, channel = clicker_and_channel(body)
        context["reply_channel"], context["reply_user"] = channel, clicker.user
        click = open_click(deps, _opening(deps), action.get("value"), clicker, channel, context)
        if click is not None:
            _answer(deps, click, Verdict.DECLINED, context)

    return on_decline


def _on_submitted(deps: BotDeps) -> Callable[..., None]:
    """`mcp_input`: the form checked against its schema inside the modal, then sent once."""

    def on_submitted(ack: Ack, body: dict[str, Any], view: dict[str, Any], context: BoltContext) -> None:
        clicker = Clicker.of(body)
        context["reply_user"] = clicker.user
        click = open_click(deps, _opening(deps), view.get("private_metadata"), clicker, None, context)
        if click is None:
            ack()
            return
        context["reply_channel"] = click.record.channel
        asked = _asked(deps, click)
        if asked is None:
            ack()
            context[REPLY] = texts.INPUT_NOT_OPEN
            return
        question = asked.question
        if question.mode != "form" or question.secret_fields:
            ack()
            context[REPLY] = texts.INPUT_SECRET if question.secret_fields else texts.INPUT_NOT_OPEN
            return
        values, errors = inputs.read_answers(view, question)
        if errors:
            ack(response_action="errors", errors=errors)  # the modal stays open; nothing is sent
            return
        ack()
        _answer(deps, click, Verdict.APPROVED, context, values)

    return on_submitted


def _on_link(ack: Ack) -> None:
    """The link button of a URL question: Slack opens the address; there is nothing to record."""
    ack()


def register(app: App, deps: BotDeps, then: Then) -> None:
    """Register this surface's listeners."""
    app.action("provide_input")(then(_on_provide(deps), tell_clicker))
    app.action("decline_input")(then(_on_decline(deps), tell_clicker))
    app.view("mcp_input")(then(_on_submitted(deps), tell_clicker))
    app.action("open_input_url")(_on_link)
