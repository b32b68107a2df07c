"""A turn's tool calls, one at a time: the tier each gets, whether it runs, and what it answers.

The loop walks a turn's calls in the model's order and decides when to park or stop; this is what
it asks of each call: ruled by the policy over the tools offered now (again just before it runs),
marked write-ahead when it changes the world, and run or refused with the words the model reads.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from harness import texts
from harness.agent import Agent
from harness.counting import Count, Seen, limit_tail, limit_why
from harness.policy import Rule, Tier, no_grant, read_why
from harness.request import DUPLICATE_ID_MARK
from harness.state import GrantUse, PendingCall, RunState, Status, Verdict, canonical_json
from harness.tools import ToolContext, ToolResult
from harness.tools.base import BadInput
from harness.tools.inputs import reply_to


def calls_in(content: list[dict[str, Any]], agent: Agent, untrusted: str = "") -> tuple[PendingCall, ...]:
    """The reply's calls with their tiers. A call that can never run is answered at once, unasked:
    a tool not offered (an invented name, or one of a server that is away), input its schema
    refuses, or a shared id."""
    calls = []
    for block in content:
        if block["type"] != "tool_use":
            continue
        call = _ruled(agent, PendingCall(block["id"], block["name"], block["input"], Tier.DENY), untrusted)
        if DUPLICATE_ID_MARK in block["id"] and call.result is None:
            original = block["id"].split(DUPLICATE_ID_MARK)[0]
            call = replace(call, result=ToolResult(texts.RESULT_DUPLICATE_ID.format(id=original), True))
        calls.append(call)
    return tuple(calls)


def untrusted_read(state: RunState, agent: Agent) -> str:
    """The untrusted-output tool whose result the run's conversation holds (`harness.flows`); ""."""
    return agent.policy.flows.read_untrusted(state.messages) if agent.policy.flows else ""


def _ruled(agent: Agent, call: PendingCall, untrusted: str = "") -> PendingCall:
    """`call` with the tier the policy gives it now, over the tools offered now (`untrusted`: what
    the run read that makes its sends-out calls ask).

    A tool not offered is answered `is_error` (never `allow`, never asked about); input the
    tool's schema refuses is answered `is_error` before anyone is asked to approve it.
    """
    found = agent.tools.get(call.name)
    if found is None:
        return replace(
            call, tier=Tier.DENY, why=texts.WHY_UNKNOWN_TOOL, result=agent.tools.not_offered(call.name)
        )
    arguments = _effective_input(call)
    seen = _seen(agent, call.id, agent.policy.counting_rules(call.name, arguments))
    ruling = agent.policy.decide(
        call.name, arguments, found.own_tier, found.own_tier_why, found.always_ask_why, seen, untrusted
    )
    call = replace(call, tier=ruling.tier, why=ruling.why, path_args=found.path_args)
    if ruling.tier is Tier.ASK and call.decision is None:  # an `allow` call is checked as it runs
        try:
            found.checked(arguments)
        except BadInput as exc:
            return replace(
                call, result=ToolResult(texts.RESULT_BAD_INPUT.format(name=call.name, problems=exc), True)
            )
    return call


def _seen(agent: Agent, call_id: str, rules: tuple[Rule, ...]) -> dict[str, Seen]:
    """What the windows of `rules` hold now (read by the agent's meter; with none, not known)."""
    if agent.meter is None:
        return {rule.key: Seen.unknown() for rule in rules}
    return {rule.key: agent.meter.seen(rule, call_id) for rule in rules}


def metered(agent: Agent, call: PendingCall) -> PendingCall:
    """`call`, about to run, counted in the window of every counting rule it matches, in one atomic
    step (`Meter.take`): the call itself when it was counted. Past a limit (another run's call may
    have taken the last place since it was ruled) it does not run: it waits for a person (`ask`), or
    is refused (`deny`). A person's approval carries it past an `ask` limit: it runs and is counted;
    a grant's does not."""
    arguments = _effective_input(call)
    rules = agent.policy.counting_rules(call.name, arguments)
    decision = call.decision
    approved = decision is not None and decision.verdict is Verdict.APPROVED
    runs = call.tier is Tier.ALLOW or (call.tier is Tier.ASK and approved)
    if not rules or agent.meter is None or not runs or call.result is not None:
        return call  # a call that does not run is not counted
    person = approved and decision is not None and decision.grant is not GrantUse.USED
    counts = []
    for rule in rules:
        assert rule.window is not None
        forced = person and rule.tier is Tier.ASK
        amount = rule.window.amount(arguments)
        if amount is None and not forced:
            return _past(call, rule, Seen.unknown(), arguments)
        counts.append(Count(rule, amount or 0.0, forced))
    over = agent.meter.take(call.id, counts)
    return call if over is None else _past(call, *over, arguments)


def _past(call: PendingCall, rule: Rule, seen: Seen, arguments: Any) -> PendingCall:
    """`call` past `rule`'s limit: waiting for a person, or refused; its why says which limit."""
    assert rule.window is not None
    tail = limit_tail(rule.window, arguments, seen) or limit_tail(rule.window, arguments, Seen.unknown())
    now = replace(
        call, tier=rule.tier, why=limit_why(rule.describe(), rule.window, tail or ""), decision=None
    )
    now = replace(now, why=_changed_why(call, now))
    if rule.tier is Tier.DENY:
        return replace(now, result=ToolResult(_denied_text(now), True))
    return now


def uncount(agent: Agent, call: PendingCall) -> None:
    """Give back what `metered` counted for `call`, which did not run after all (a Stop came first)."""
    rules = agent.policy.counting_rules(call.name, _effective_input(call))
    if rules and agent.meter is not None:
        agent.meter.give_back(call.id, rules)


def _effective_input(call: PendingCall) -> Any:
    """The arguments a call would run with: a reviewer's edit, else the model's."""
    if call.decision is not None and call.decision.edited_input is not None:
        return call.decision.edited_input
    return call.input


def _ruled_again(agent: Agent, call: PendingCall, untrusted: str = "") -> PendingCall:
    """`call`, about to run, under the policy and the tools of this moment (after a park too).

    A tool no longer offered is answered `is_error`; a tier now `deny` is answered as denied; a
    call now `ask` without an approval waits for one. A decision already taken stands: a decline
    never runs, and an approval counts only where the tier is still `ask` or `allow`; one a grant
    gave counts for no tool that now always asks (`always_asks`): that call waits for a person.
    """
    if call.decision is not None and call.decision.verdict is not Verdict.APPROVED:
        return call  # a decline or an expiry stands: the call never runs
    now = _ruled(agent, replace(call, result=None), untrusted)
    if now.result is not None:
        return replace(now, why=_changed_why(call, now))
    if now.tier is Tier.DENY:
        return replace(now, why=_changed_why(call, now), result=ToolResult(_denied_text(call), True))
    used = call.decision is not None and call.decision.grant is GrantUse.USED
    if used and no_grant(now.why):  # always asks, past a limit, or sends out after untrusted input
        return replace(now, decision=None, why=_changed_why(call, now))
    if call.decision is not None and call.tier is Tier.ASK:
        return replace(now, tier=Tier.ASK)  # decided as an `ask`: answer_call reads its decision
    return now


def _changed_why(before: PendingCall, now: PendingCall) -> str:
    if before.tier is now.tier and before.why == now.why:
        return now.why
    return texts.WHY_DECIDED_AGAIN.format(why=now.why, was=before.tier.value)


def _denied_text(call: PendingCall) -> str:
    if call.decision is not None and call.decision.edited_input is not None:
        return texts.RESULT_EDIT_DENIED.format(name=call.name)
    source = read_why(call.why)
    if source.step == "limit":
        return texts.RESULT_DENIED_LIMIT.format(name=call.name, limit=source.text)
    denied = [f"{arg} {call.input.get(arg)!r}" for arg, _ in source.args if arg in call.input]
    if source.step == "rule" and denied:  # the path is forbidden, not the tool: say which
        return texts.RESULT_DENIED_ARGS.format(name=call.name, args=" and ".join(denied))
    return texts.RESULT_DENIED.format(name=call.name)


def rule_open_calls(state: RunState, agent: Agent) -> RunState:
    """Every call not yet answered nor begun, ruled again right before the turn's calls run."""
    untrusted = untrusted_read(state, agent)
    pending = tuple(
        c if c.result is not None or c.started else _ruled_again(agent, c, untrusted) for c in state.pending
    )
    return replace(state, pending=pending) if pending != state.pending else state


def with_call(state: RunState, index: int, call: PendingCall) -> RunState:
    return replace(state, pending=(*state.pending[:index], call, *state.pending[index + 1 :]))


def saves_first(state: RunState, agent: Agent) -> bool:
    """Whether the next step's first act is to hand `state`, plus a write-ahead mark, to `before_tool`.

    Then nothing happens between this step and that write (no call runs, nothing is asked, no
    request is made), so a driver may leave `state` to it rather than write it twice in a row.
    """
    if agent.before_tool is None or state.status is not Status.RUNNING:
        return False
    first = next((c for c in state.pending if c.result is None), None)
    if first is None:
        return False
    first = first if first.started else _ruled_again(agent, first, untrusted_read(state, agent))
    return first.result is None and marks_first(agent, first)  # an awaiting call is not marked


def marks_first(agent: Agent, call: PendingCall) -> bool:
    """Whether resolving `call` begins by writing its write-ahead mark (through `before_tool`)."""
    return agent.before_tool is not None and not call.started and needs_write_ahead(agent, call)


def needs_write_ahead(agent: Agent, call: PendingCall) -> bool:
    """A call that changes the world is marked started before it runs, and never run twice."""
    found = agent.tools.get(call.name)
    approved = call.decision is not None and call.decision.verdict is Verdict.APPROVED
    runs = call.tier is Tier.ALLOW or approved
    return found is not None and runs and (found.side_effects or call.tier is Tier.ASK)


def answer_call(agent: Agent, call: PendingCall) -> ToolResult:
    """Run `call` if its tier and decision allow it; otherwise say why it did not run."""
    if call.tier is Tier.DENY:
        return ToolResult(_denied_text(call), True)
    if call.tier is Tier.ASK:
        assert call.decision is not None  # harness.loop parks undecided calls
        if call.decision.verdict is Verdict.EXPIRED:
            return ToolResult(texts.RESULT_EXPIRED, True)
        if call.decision.verdict is not Verdict.APPROVED:
            if call.decision.reason:
                return ToolResult(texts.RESULT_DECLINED_REASON.format(reason=call.decision.reason), True)
            return ToolResult(texts.RESULT_DECLINED, True)
        if call.decision.edited_input is not None:
            return _run_edited(agent, call, call.decision.edited_input)
    return agent.tools.run(call.name, call.input, _context(agent, call, call.input))


def _context(agent: Agent, call: PendingCall, arguments: dict[str, Any]) -> ToolContext:
    """The tool context of `call`: with its receipt, and the answers to its server's questions."""
    context = agent.context
    if agent.receipt is not None:  # made now, as it runs: in no state, no record, no request
        context = replace(context, receipt=agent.receipt(call, arguments))
    if call.asking is None:
        return context
    values = agent.input_values(call.asking) if agent.input_values is not None else {}
    return replace(context, reply=reply_to(call.asking, values))


def _run_edited(agent: Agent, call: PendingCall, edited: dict[str, Any]) -> ToolResult:
    """Run a call with a reviewer's arguments, telling the model so (ruled on them just before)."""
    result = agent.tools.run(call.name, edited, _context(agent, call, edited))
    note = texts.RESULT_EDITED.format(arguments=canonical_json(edited))
    if isinstance(result.content, list):
        return ToolResult([{"type": "text", "text": note}, *result.content], result.is_error)
    return ToolResult(f"{note}\n{result.content}", result.is_error)


def tool_result(call_id: str, result: ToolResult | None) -> dict[str, Any]:
    assert result is not None
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id, "content": result.content}
    if result.is_error:
        block["is_error"] = True
    return block
