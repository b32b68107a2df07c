"""Why a call has its tier, in the words of a person reading Slack, not of the config file.

The policy's `why` names the step and the key or rule that decided (`policy.rules[2] (tool =
"write_file", path = "secrets/**")`, `tool's own tier (built-in)`): right for `--list-tools` and
the audit, jargon on a card. Here it is read back (`harness.policy.read_why`) and said plainly,
naming the arguments a rule matched: "rule 2 of the policy: path matches `secrets/**`". A deny
by such a rule names the value that is denied (path `secrets/a.txt`), not the tool, which stays
allowed for other values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from harness import texts as harness_texts
from harness.policy import Source, read_why
from harness.state import PendingCall
from messages import texts
from messages.text import inline

Quote = Callable[[str], str]  # how a name or value from the call or the config is shown


def code_quote(text: str) -> str:
    """A name or value in `inline code`, escaped and cut (for mrkdwn)."""
    return inline(text, 200)


def plain_quote(text: str) -> str:
    """A name or value in quotes (for plain text, such as a modal's error)."""
    return f"“{text[:200]}”"


def _template(template: str) -> re.Pattern[str]:
    """A harness sentence with `{name}` fields as a pattern that reads the fields back."""
    pattern = re.escape(template)
    pattern = re.sub(r"\\\{(\w+)\\\}", lambda m: f"(?P<{m.group(1)}>.+?)", pattern)
    return re.compile(pattern, re.DOTALL)


_MCP_TRUSTED = _template(harness_texts.WHY_MCP_READ_ONLY)
_MCP_NOT_TRUSTED = _template(harness_texts.WHY_MCP_CLAIM_NOT_TRUSTED)
_NOT_RUN_STOPPED = _template(harness_texts.RESULT_NOT_RUN_STOPPED)


def stopped_before(result_text: str) -> bool:
    """Whether a call's result says only that the run stopped before it ran."""
    return _NOT_RUN_STOPPED.fullmatch(result_text) is not None


def effective_input(call: PendingCall) -> Mapping[str, Any]:
    """The arguments the call would run with: a reviewer's edit, else the model's."""
    if call.decision is not None and call.decision.edited_input is not None:
        return call.decision.edited_input
    return call.input if isinstance(call.input, Mapping) else {}


def plain_why(why: str, quote: Quote = code_quote) -> str:
    """Why a call has its tier, from the policy's `why`, in plain words."""
    source = read_why(why)
    said = _said(source, quote)
    if source.was is not None and source.step == "limit":
        said = texts.WHY_LIMIT_AGAIN.format(why=said, was=texts.TIER_BEFORE[source.was.value])
    elif source.was is not None:
        said = texts.WHY_AGAIN.format(why=said, was=texts.TIER_BEFORE[source.was.value])
    return said


def _said(source: Source, quote: Quote) -> str:
    policy = texts.POLICY_OF_PROFILE.format(profile=quote(source.profile)) if source.profile else "the policy"
    if source.step == "rule":
        return texts.WHY_RULE.format(number=source.number, policy=policy) + _matching(source, quote)
    if source.step == "limit":
        return texts.WHY_RULE.format(number=source.number, policy=policy) + ": " + _limit(source, quote)
    if source.step == "tools":
        return texts.WHY_TOOLS.format(tool=quote(source.tool), policy=policy)
    if source.step == "default":
        said = texts.WHY_DEFAULT.format(policy=policy)
        if found := _MCP_NOT_TRUSTED.fullmatch(source.detail):
            said += texts.WHY_CLAIM_NOT_TRUSTED.format(server=quote(found.group("server")))
        return said
    if source.step == "own":
        if source.detail == harness_texts.WHY_BUILTIN:
            return texts.WHY_BUILTIN
        if found := _MCP_TRUSTED.fullmatch(source.detail):
            return texts.WHY_CLAIM_TRUSTED.format(server=quote(found.group("server")))
        return texts.WHY_OWN
    if source.step == "flow":
        return texts.WHY_FLOW.format(read=quote(source.detail), glob=quote(source.tool))
    if source.step == "always":
        if source.tool:
            return texts.WHY_ALWAYS_ASK.format(policy=policy, glob=quote(source.tool))
        return texts.WHY_SERVER_ALWAYS_ASKS.format(server=quote(source.detail))
    if source.text == harness_texts.WHY_UNKNOWN_TOOL:
        return source.text  # our own words, already plain
    return quote(source.text)


def _limit(source: Source, quote: Quote) -> str:
    """What a counting rule's window held, in words: `3 of at most 3 calls of `deploy_*` ran …`."""
    limit = source.limit
    assert limit is not None
    tool = quote(source.tool)
    count, unit = int(limit.per[:-1]), texts.LIMIT_PER[limit.per[-1]]
    per = unit[0] if count == 1 else f"{count} {unit[1]}"
    scope = texts.LIMIT_SCOPE[limit.scope]
    if limit.missing:
        return texts.WHY_LIMIT_NOT_NUMBER.format(arg=quote(limit.arg), tool=tool)
    if limit.unread:
        return texts.WHY_LIMIT_UNREAD.format(tool=tool, per=per, scope=scope)
    if limit.arg:
        return texts.WHY_LIMIT_SUM.format(
            tool=tool,
            arg=quote(limit.arg),
            seen=limit.seen,
            limit=limit.limit,
            per=per,
            scope=scope,
            adds=limit.adds,
        )
    return texts.WHY_LIMIT_CALLS.format(seen=limit.seen, limit=limit.limit, tool=tool, per=per, scope=scope)


def _matching(source: Source, quote: Quote) -> str:
    """`: path matches `docs/**``, one clause per argument the rule looks at (the values are the
    call's own, shown beside)."""
    if not source.args:
        return texts.WHY_RULE_FOR.format(tool=quote(source.tool))
    clauses = [texts.WHY_RULE_MATCHES.format(argument=arg, glob=quote(glob)) for arg, glob in source.args]
    return ": " + " and ".join(clauses)


def denied_what(call: PendingCall, quote: Quote = code_quote) -> str:
    """What a `deny` refuses: the argument values a rule matched (`path `secrets/a.txt``), or the
    tool itself when no argument decided."""
    return denied_subject(call.name, call.why, effective_input(call), quote)


def denied_subject(name: str, why: str, arguments: Mapping[str, Any], quote: Quote = code_quote) -> str:
    """`denied_what` from a tool's name, the policy's `why` and the arguments."""
    source = read_why(why)
    values = [(arg, arguments.get(arg)) for arg, _ in source.args] if source.step == "rule" else []
    shown = [f"{arg} {quote(value)}" for arg, value in values if isinstance(value, str)]
    if shown:
        return " with ".join(shown)
    return quote(name)


def tier_reason(call: PendingCall, quote: Quote = code_quote) -> str:
    """`allowed: the built-in setting for this tool`, for a call's line in a turn summary."""
    return f"{texts.TIER_WORD[call.tier.value]}: {plain_why(call.why, quote)}"
