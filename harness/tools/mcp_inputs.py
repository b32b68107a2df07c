"""What the hub does when a server asks a person (`harness.tools.inputs`).

Under MCP 2026-07-28 a call may answer with an input request instead of a result: `rounds` sends
the call (again, with a person's answers and the server's `requestState`, exactly as it came) and
returns the result or the request, which `asks_person` turns into a result that asks, for the run
to park on. A server of the older protocol asks in the middle of a call instead
(`elicitation/create`), while the call waits: `mid_call` puts that question to the run's requester
through the worker's `PersonAsker`, within the call's own time.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from mcp_types import ElicitResult, InputRequiredResult

from harness import texts
from harness.tools.base import ToolResult
from harness.tools.inputs import (
    QUESTIONS_MAX,
    BadInputRequest,
    InputAsk,
    InputReply,
    MidCallQuestion,
    PersonAsker,
    question_of,
)
from harness.tools.mcp_listing import SEPARATOR

log = logging.getLogger("harness.mcp")

# A server that answers with state alone is asked again after this long, doubling (as `mcp` does).
_STATE_ONLY_FIRST, _STATE_ONLY_MAX = 0.05, 0.25
ROUNDS_MAX = 10  # input requests one call may make before it is answered is_error (a server looping)


async def rounds(
    client: Any,
    tool: str,
    arguments: dict[str, Any],
    reply: InputReply | None,
    meta: dict[str, Any] | None = None,
) -> Any:
    """The call's result, the input request a person must answer first, or the task it runs as.

    The call is sent with `reply`'s answers and state (its first time: none). A server that answers
    with state alone (it is still working) is asked again with that state, backing off as the MCP
    client does; one that asks a question is answered by a person, in the run's park, not here.
    """
    responses = _responses(reply)
    state = reply.state if reply is not None else None
    delay = _STATE_ONLY_FIRST
    while True:
        result = await client.session.call_tool(
            tool,
            arguments,
            input_responses=responses,
            request_state=state,
            meta=meta,
            allow_input_required=True,
            allow_claimed=True,  # a task (`harness.tools.mcp_tasks`) comes back unresolved
        )
        if not isinstance(result, InputRequiredResult) or result.input_requests:
            return result
        responses, state = None, result.request_state
        await asyncio.sleep(delay)
        delay = min(delay * 2, _STATE_ONLY_MAX)


def _responses(reply: InputReply | None) -> dict[str, ElicitResult] | None:
    if reply is None:
        return None
    return {key: ElicitResult.model_validate(answer) for key, answer in reply.responses.items()}


def asks_person(
    server: str, qualified: str, result: InputRequiredResult, reply: InputReply | None
) -> ToolResult:
    """An input request as a result that asks a person (`asks`); one this client cannot put to a
    person (sampling, roots, a form it cannot draw, an address not https) answers `is_error`."""
    count = 1 + (reply.rounds if reply is not None else 0)  # the input requests this call met
    if count > ROUNDS_MAX:
        return ToolResult(texts.MCP_INPUT_ROUNDS.format(name=qualified, rounds=ROUNDS_MAX), True)
    questions = []
    try:
        for key, request in list((result.input_requests or {}).items())[: QUESTIONS_MAX + 1]:
            params = request.params.model_dump(by_alias=True, exclude_none=True) if request.params else {}
            questions.append(question_of(str(key), str(request.method), params))
        if len(questions) > QUESTIONS_MAX:
            raise BadInputRequest(f"it asked more than {QUESTIONS_MAX} questions at once")
    except BadInputRequest as exc:
        log.info(
            "MCP server %s: an input request of %s cannot be put to a person: %s", server, qualified, exc
        )
        return ToolResult(texts.MCP_INPUT_REFUSED.format(name=qualified, why=exc), True)
    ask = InputAsk(server, tuple(questions), result.request_state, rounds=count)
    return ToolResult(texts.MCP_INPUT_WAITING.format(name=qualified), asks=ask)


async def mid_call(
    server: str,
    name: str,
    calls: list[tuple[str | None, str, float]],
    params: Any,
    ask_person: PersonAsker | None,
) -> ElicitResult:
    """A question the server asks while a call of it waits (`elicitation/create`, the protocol
    before 2026-07-28): put to the requester of the call's run, who may answer while the call
    still may wait (its `timeout_seconds`). It cannot be told which call asks when several are
    in flight, nor to whom when none names its run: then, and when nobody can be asked, it is
    answered cancel. A question no person may be shown (`question_of`) is declined."""
    if len(calls) != 1 or calls[0][0] is None or ask_person is None:
        why = "several calls wait on it" if len(calls) > 1 else "no run's requester can be asked"
        log.info("MCP server %s asked a question mid-call; answered cancel: %s", name, why)
        return ElicitResult(action="cancel")
    who, tool, deadline = calls[0]
    assert who is not None
    try:
        raw = params.model_dump(by_alias=True, exclude_none=True) if params is not None else {}
        question = question_of("mid-call", "elicitation/create", raw)
    except BadInputRequest as exc:
        log.info("MCP server %s asked a question mid-call that cannot be put to a person: %s", name, exc)
        return ElicitResult(action="decline")
    seconds = deadline - asyncio.get_running_loop().time()
    asked = MidCallQuestion(who, server, f"{server}{SEPARATOR}{tool}", question, seconds)
    try:
        return ElicitResult.model_validate(await ask_person(asked))
    except Exception as exc:  # noqa: BLE001 - whatever went wrong, the server hears cancel
        log.warning("MCP server %s: its mid-call question could not be answered (%s): cancel", name, exc)
        return ElicitResult(action="cancel")
