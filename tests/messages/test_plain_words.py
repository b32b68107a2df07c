"""Plain words on every card, summary and ending: what a busy approver reads in Slack.

Every kind of message is rendered by the real builders from what the real harness says (valve
stops from the valves themselves, tier decisions from the real policy) and read for jargon: no
"valve", no "tier", no config key such as `policy.rules[1]` or "tool's own tier (built-in)", no
"1 turns" or "1 calls". A path denied by an argument rule is named as the path, and a run whose
calls were declined ends "Finished — …", never "Done" with a ✅.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from bot.edits import _reason
from harness import texts as harness_texts
from harness.config.settings import Limits
from harness.outcomes import NotRun, calls_not_run
from harness.policy import Policy, Rule, Tier
from harness.state import Decision, GrantUse, PendingCall, RunState, Verdict, new_run
from harness.stops import terminal_stop
from harness.tools import ToolResult
from harness.valves import check_budget, check_progress, check_turn
from messages import texts
from messages.batch_cards import batch_card, batch_decided, batch_stopped
from messages.blocks import Message
from messages.cards import (
    CallCard,
    LimitCard,
    approval_card,
    card_stopped,
    decided_card,
    expiry_reminder,
    grant_notice,
    limit_card,
    limit_decided,
)
from messages.endings import stopped, stopped_by
from messages.reasons import plain_quote, plain_why
from messages.text import plural
from messages.turns import turn_summary, working_closed

AT = datetime(2026, 12, 4, 9, 30, tzinfo=UTC)
RUN = "0123456789abcdef0123456789abcdef"
FOOTER = re.compile(
    re.escape(harness_texts.FOOTER).replace(r"\{turns\}", "[0-9,]+").replace(r"\{requests\}", "[0-9,]+")
)
JARGON = ("valve", "tier", "own tier", "built-in)", "policy.rules", "policy.tools", "policy.default", "(s)")
BAD_PLURAL = re.compile(r"\b1 (turns|calls|tokens|requests|times|uses|characters|arguments)\b")

POLICY = Policy(
    default=Tier.ASK,
    tools={"read_file": Tier.ALLOW, "tickets__*": Tier.ASK},
    rules=(
        Rule(1, "write_file", {"path": "secrets/**"}, Tier.DENY),
        Rule(2, "write_file", {"path": "drafts/**"}, Tier.ALLOW),
        Rule(3, "desk__delete_*", {}, Tier.DENY),
        Rule(1, "write_file", {"path": "runbooks/**"}, Tier.ASK, table="profiles[ops].policy.rules"),
    ),
)


def ruled(
    call_id: str, name: str, args: dict[str, Any], own: Tier | None = None, own_why: str = ""
) -> PendingCall:
    """A call with the tier and why the real policy gives it."""
    ruling = POLICY.decide(name, args, own, own_why)
    return PendingCall(call_id, name, args, ruling.tier, why=ruling.why)


def every_kind_of_call() -> list[PendingCall]:
    trusted = harness_texts.WHY_MCP_READ_ONLY.format(server="desk")
    untrusted = harness_texts.WHY_MCP_CLAIM_NOT_TRUSTED.format(server="odd")
    ran = ToolResult("ok", False)
    return [
        PendingCall(
            "c1", "get_time", {}, Tier.ALLOW, why=harness_texts.WHY_BUILTIN, result=ran
        ),  # the built-in's own
        PendingCall("c2", "desk__get", {"id": "T-1"}, Tier.ALLOW, why=trusted, result=ran),
        PendingCall(
            "c3",
            "odd__get",
            {},
            Tier.ASK,
            why=f"policy.default ({untrusted})",
            decision=Decision(Verdict.APPROVED, "UANN"),
            result=ran,
        ),
        PendingCall(
            "c4",
            "tickets__close",
            {},
            Tier.ASK,
            why='policy.tools."tickets__*"',
            decision=Decision(Verdict.DECLINED, "UANN", "not now"),
        ),
        PendingCall(
            "c5", "read_file", {"path": "a.txt"}, Tier.ALLOW, why="policy.tools.read_file", result=ran
        ),
        ruled("c6", "write_file", {"path": "secrets/key.txt", "content": "k"}),
        ruled("c7", "write_file", {"path": "drafts/a.md", "content": "d"}),
        ruled("c8", "desk__delete_ticket", {"id": "T-1"}),
        PendingCall(
            "c9",
            "write_file",
            {"path": "x.txt"},
            Tier.ASK,
            why="profiles[ops].policy.default",
            decision=Decision(Verdict.EXPIRED),
        ),
        PendingCall(
            "c10",
            "write_file",
            {"path": "runbooks/a.md"},
            Tier.ASK,
            why='profiles[ops].policy.rules[1] (tool = "write_file", path = "runbooks/**")',
            decision=Decision(Verdict.APPROVED, "UANN", grant=GrantUse.USED, grant_uses=1, grant_left=1),
            result=ran,
        ),
        PendingCall(
            "c11",
            "delete_file",
            {"path": "b.txt"},
            Tier.DENY,
            why=harness_texts.WHY_DECIDED_AGAIN.format(why="policy.tools.delete_file", was="ask"),
        ),
        PendingCall(
            "c12",
            "list_files",
            {},
            Tier.ALLOW,
            why=harness_texts.WHY_BUILTIN,
            result=ToolResult(harness_texts.RESULT_NOT_RUN_STOPPED.format(valve="stopped_by_user"), True),
        ),
    ]


def stop_reasons() -> list[str]:
    """What the valves and the model's stop reasons say, from the harness itself, at counts of 1."""
    one_turn = RunState(messages=(), turns=1)
    reasons = [
        check_turn(one_turn, Limits(max_turns=1), "x()"),
        check_budget(RunState(messages=()), Limits(token_budget=0)),
        check_progress(("a()", "a()"), 4),
        check_progress(("a()", "b()", "a()", "b()"), 4),
        terminal_stop("max_tokens", Limits(max_tokens=1), [{"type": "tool_use"}]),
        terminal_stop("refusal", Limits(), []),
        terminal_stop("something_new", Limits(), []),
    ]
    said = [r.reason for r in reasons if r is not None]
    assert len(said) == len(reasons)
    return [
        *said,
        harness_texts.STOP_BUDGET.format(detail="the daily budget is spent."),
        harness_texts.STOP_BY_USER,
    ]


def every_message() -> list[Message]:
    calls = every_kind_of_call()
    asked = [c for c in calls if c.tier is Tier.ASK]
    decisions = {c.id: c.decision for c in calls}
    messages = [turn_summary(1, calls, 1, 1000)]
    for call in asked:
        for required, votes in ((1, ()), (2, ("UANN",))):  # grants are offered without a quorum
            messages.append(
                approval_card(
                    CallCard(
                        run_id=RUN,
                        call=call,
                        requester="UALICE",
                        tier_source=call.why,
                        approvers=["UANN"],
                        expires_at=AT,
                        required=required,
                        votes=votes,
                        self_approval=False,
                        grant_minutes=30,
                        grant_uses=1,
                    )
                )
            )
        for verdict in Verdict:
            messages.append(decided_card(call=call, requester="UALICE", verdict=verdict, by="UANN", at=AT))
        messages.append(card_stopped(call=call, requester="UALICE", by="UANN", at=AT))
    messages += [
        batch_card(run_id=RUN, park_id=1, calls=asked, requester="UALICE", expires_at=AT),
        batch_decided(calls=asked, decisions=decisions),
        batch_stopped(calls=asked, by="UANN", at=AT),
        grant_notice(tool="write_file", by="UANN", requester="UALICE", until=AT, value="v", uses=1),
        expiry_reminder(
            run_id=RUN,
            park_id=1,
            calls=asked,
            requester="UALICE",
            deciders=["UANN"],
            expires_at=AT,
            extend_minutes=60,
            extensions=0,
            max_extensions=1,
        ),
        stopped_by(by="UANN", turns=1, requests=1),
    ]
    for reason in stop_reasons():
        messages.append(stopped(reason, 1, 1))
    question = harness_texts.LIMIT_MAX_TURNS.format(turns=plural(1, "turn"))
    more = harness_texts.LIMIT_MORE_TURNS.format(more=1, s="")
    messages.append(
        limit_card(
            LimitCard(
                run_id=RUN, question=question, more=more, requester="UALICE", deciders=["UANN"], expires_at=AT
            )
        )
    )
    for verdict in Verdict:
        messages.append(limit_decided(question=question, verdict=verdict, by="UANN", at=AT, more=more))
    for outcome in ("finished", "stopped", "failed"):
        for by in (None, "UANN"):
            for not_run in (None, NotRun(declined=1), NotRun(1, 1, 1)):
                messages.append(working_closed(outcome=outcome, by=by, not_run=not_run))
    return messages


def shown(msg: Message) -> str:
    """Everything a person may read of a message, without the contract's fixed footer."""
    return FOOTER.sub("", f"{msg.text}\n{msg.blocks}")


def test_no_message_a_person_reads_speaks_jargon_or_says_1_turns() -> None:
    for msg in every_message():
        said = shown(msg)
        assert not [j for j in JARGON if j in said.lower()], said
        assert BAD_PLURAL.search(said) is None, said


def test_no_sentence_of_the_bot_says_valve_or_tier_or_counts_with_s_in_brackets() -> None:
    sentences = [v for k, v in vars(texts).items() if k.isupper() and isinstance(v, str)]
    stops = [
        v for k, v in vars(harness_texts).items() if k.startswith(("STOP_", "LIMIT_")) and isinstance(v, str)
    ]
    for sentence in [*sentences, *stops]:
        assert not [j for j in ("valve", "tier", "(s)") if j in sentence.lower()], sentence


def test_every_stop_still_names_its_valve_in_plain_words() -> None:
    max_turns, budget, repeat, cycle, *_ = stop_reasons()
    assert max_turns.startswith("Stopped at max turns") and max_turns.endswith("allowed only 1 turn.")
    assert budget.startswith("Stopped at the token budget") and "0 tokens" in budget
    assert repeat.startswith("Stopped for no progress") and cycle.startswith("Stopped for no progress")
    assert "the last 4 turns repeat the same cycle of 2 turns" in cycle
    assert "budget" in harness_texts.STOP_BUDGET
    assert "limit of 1 token per request" in stop_reasons()[4]


@pytest.mark.parametrize(
    ("why", "plain"),
    [
        (
            'policy.rules[2] (tool = "write_file", path = "drafts/**")',
            "rule 2 of the policy: path matches `drafts/**`",
        ),
        ('policy.rules[3] (tool = "desk__delete_*")', "rule 3 of the policy, for `desk__delete_*`"),
        (
            'profiles[ops].policy.rules[1] (tool = "w", path = "a, b", mode = "x\\"y")',
            'rule 1 of the policy of profile `ops`: path matches `a, b` and mode matches `x"y`',
        ),
        ("policy.tools.write_file", "the setting for `write_file` in the policy"),
        (
            'profiles[ops].policy.tools."tickets__*"',
            "the setting for `tickets__*` in the policy of profile `ops`",
        ),
        ("policy.default", "the default in the policy, which has no setting for this tool"),
        (
            f"policy.default ({harness_texts.WHY_MCP_CLAIM_NOT_TRUSTED.format(server='odd')})",
            "the default in the policy, which has no setting for this tool; server `odd` says the tool only "
            "reads, but is not trusted to say so",
        ),
        (harness_texts.WHY_BUILTIN, "the built-in setting for this tool"),
        (
            harness_texts.WHY_MCP_READ_ONLY.format(server="desk"),
            "server `desk` says the tool only reads, and is trusted to say so",
        ),
        (
            harness_texts.WHY_DECIDED_AGAIN.format(why="policy.tools.write_file", was="ask"),
            "the setting for `write_file` in the policy; the policy changed while it waited: before, it "
            "needed approval",
        ),
        (harness_texts.WHY_UNKNOWN_TOOL, harness_texts.WHY_UNKNOWN_TOOL),
        ("something <!channel> new", "`something &lt;!channel&gt; new`"),  # unknown: shown inert
    ],
)
def test_why_a_call_has_its_tier_is_said_in_plain_words(why: str, plain: str) -> None:
    assert plain_why(why) == plain


def test_a_path_denied_by_an_argument_rule_is_named_not_the_tool() -> None:
    denied = ruled("c1", "write_file", {"path": "secrets/key.txt", "content": "k"})
    line = turn_summary(1, [denied], 10, 100).blocks[0]["text"]["text"]
    assert "⛔ path `secrets/key.txt` is denied by the policy (not run)" in line
    assert "_(denied: rule 1 of the policy: path matches `secrets/**`)_" in line
    assert "`write_file` is denied" not in line

    by_name = ruled("c2", "desk__delete_ticket", {"id": "T-1"})  # no argument decided: the tool is
    assert (
        "⛔ `desk__delete_ticket` is denied by the policy"
        in turn_summary(1, [by_name], 1, 9).blocks[0]["text"]["text"]
    )
    said = plain_why(denied.why, plain_quote)
    assert said == "rule 1 of the policy: path matches “secrets/**”" and "`" not in said


def test_a_finished_run_says_how_many_calls_did_not_run_and_why_instead_of_done() -> None:
    assert working_closed(outcome="finished").text == ":white_check_mark: Done."
    assert working_closed(outcome="finished", not_run=NotRun()).text == ":white_check_mark: Done."
    one = working_closed(outcome="finished", not_run=NotRun(declined=1))
    assert one.text == ":no_entry_sign: Finished — 1 call declined."
    many = working_closed(outcome="finished", not_run=NotRun(2, 1, 3), by="UANN").text
    assert many == (
        ":no_entry_sign: Finished before Stop (pressed by <@UANN>) could take effect — 2 calls declined, "
        "1 call expired (nobody decided in time), 3 calls denied by the policy."
    )
    assert "Done" not in working_closed(outcome="finished", by="UANN").text  # Stop was pressed


def _answered(*results: str) -> dict[str, Any]:
    blocks = [
        {"type": "tool_result", "tool_use_id": f"t{i}", "content": r, "is_error": True}
        for i, r in enumerate(results)
    ]
    return {"role": "user", "content": blocks}


def test_the_calls_not_run_are_counted_for_this_run_only_not_earlier_runs_of_the_thread() -> None:
    declined = harness_texts.RESULT_DECLINED
    earlier = new_run("first task").messages + (
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t0", "name": "x", "input": {}}]},
        _answered(declined),
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
    )
    state = new_run("second task", earlier)
    assert calls_not_run(state) == NotRun()
    tool = {"role": "assistant", "content": [{"type": "tool_use", "id": "t0", "name": "x", "input": {}}]}
    denied_path = harness_texts.RESULT_DENIED_ARGS.format(name="write_file", args="path 'secrets/a'")
    results = _answered(
        harness_texts.RESULT_DECLINED_REASON.format(reason="no"),
        declined,
        harness_texts.RESULT_EXPIRED,
        harness_texts.RESULT_DENIED.format(name="rm"),
        denied_path,
        "Error: read_file failed: gone",  # a tool's own error is no decision
    )
    state = RunState(messages=(*state.messages, tool, results))
    assert calls_not_run(state) == NotRun(declined=2, expired=1, denied=2)


def test_an_edit_refused_for_its_length_counts_in_plain_words() -> None:
    [short] = Draft202012Validator({"type": "string", "minLength": 1}).iter_errors("")
    [long] = Draft202012Validator({"type": "string", "maxLength": 1}).iter_errors("ab")
    assert _reason(short) == "Too short: 0 characters; it needs at least 1 character."
    assert _reason(long) == "Too long: 2 characters; at most 1 character allowed."
