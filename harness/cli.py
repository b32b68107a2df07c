"""`python -m harness "TASK"`: the terminal driver of the step function."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from harness import release, texts
from harness.agent import with_tools
from harness.config import Config, ConfigError, Limits, load_config
from harness.counting import MemoryMeter, Meter, Seen, number_text
from harness.loop import (
    Agent,
    AwaitingApproval,
    AwaitingInput,
    AwaitingLimit,
    AwaitingTask,
    Event,
    Failed,
    Finished,
    Outcome,
    Stopped,
    ToolReturned,
    ToolsRequested,
    WrappedUp,
    continue_at_limit,
    step,
    stop_run,
)
from harness.policy import Policy, Rule, Tier
from harness.state import (
    Decision,
    RunState,
    Verdict,
    new_run,
    record_decisions,
    record_input_answers,
    record_task_result,
)
from harness.tools import ToolResult
from harness.tools.catalog import Catalog, open_catalog
from harness.tools.inputs import InputAnswer, InputAsk, InputQuestion, typed_answer
from harness.tools.registry import ToolRegistry
from harness.tools.tasks import TaskHandle, TaskHost, follow
from harness.tools.tool_search import definition_tokens
from harness.tools.undumpable import protect_process

SHOWN_RESULT_CHARS = 200
# What approves an `ask` call at the prompt; anything else, and end of input, declines (fail closed).
APPROVING_ANSWERS = frozenset({"", "y", "yes"})
EXIT_FINISHED, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
INSPECT_FLAGS = ("--list-tools", "--explain-call")
# Where an explanation is about: the flag, the Where field, the ID's shape and how to say it.
WHERE_FLAGS = {
    "--channel": (
        "channel",
        re.compile(r"[CGD][A-Z0-9]{1,31}"),
        "a channel ID like C0123ABCD (C…, G… or D…)",
    ),
    "--team": ("team", re.compile(r"[TE][A-Z0-9]{1,31}"), "a workspace ID like T0123ABCD"),
    "--user": ("user", re.compile(r"[UW][A-Z0-9]{1,31}"), "a user ID like U012AB3CD (U… or W…)"),
    "--thread": ("thread", re.compile(r"[0-9]{1,12}\.[0-9]{1,9}"), "a thread's ts like 1712345678.000100"),
}
# The flags that name the window of a counting rule's scope (a new run's own window is empty).
SCOPE_FLAGS = {
    "run": (),
    "thread": ("--team", "--channel", "--thread"),
    "channel": ("--team", "--channel"),
    "requester": ("--team", "--user"),
    "workspace": ("--team",),
}


def compact(value: object) -> str:
    """JSON as the seed printed it: no spaces, non-ASCII kept."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def show_result(text: str) -> str:
    """A tool result as the transcript shows it: cut, then quoted as JSON."""
    return compact(text if len(text) <= SHOWN_RESULT_CHARS else text[:SHOWN_RESULT_CHARS] + "…")


class Terminal:
    """Prints events and asks for approvals on a terminal."""

    def __init__(self, out: TextIO, ask: Callable[[str], str]) -> None:
        self.out = out
        self.ask = ask
        self.values: dict[str, dict[str, Any]] = {}  # a form's values, by reference, until sent

    def show(self, event: Event) -> None:
        if isinstance(event, ToolsRequested):
            for call in event.calls:
                self.say(
                    texts.CLI_REQUESTS_TOOL.format(turn=event.turn, name=call.name, args=compact(call.input))
                )
        elif isinstance(event, ToolReturned):
            assert event.call.result is not None
            self.say(
                texts.CLI_TOOL_RETURNED.format(turn=event.turn, result=show_result(event.call.result.text))
            )
        elif isinstance(event, WrappedUp):
            self.say(texts.CLI_WRAPS_UP.format(turn=event.turn, stop_reason=event.stop_reason))

    def decide(self, outcome: AwaitingApproval) -> dict[str, Decision]:
        decisions = {}
        for call in outcome.calls:
            try:
                answer = self.ask(texts.CLI_APPROVE_PROMPT.format(name=call.name, args=compact(call.input)))
            except EOFError:  # no one at the terminal: fail closed
                answer = "n"
                self.say("")
            approved = answer.strip().lower() in APPROVING_ANSWERS  # anything else declines
            decisions[call.id] = Decision(Verdict.APPROVED if approved else Verdict.DECLINED, by="terminal")
        return decisions

    def follow(self, outcome: AwaitingTask, host: TaskHost | None) -> ToolResult:
        """Wait here for the task the call's server works on, saying how it stands as it changes:
        its result, or (past the server's time) a timeout, the server told to cancel it."""
        call, handle = outcome.call, outcome.call.tasking
        assert handle is not None

        def seen(now: TaskHandle) -> None:
            if now.message:
                self.say(texts.CLI_TASK_STATUS.format(server=now.server, message=compact(now.message)))

        self.say(texts.CLI_TASK_WORKS.format(server=handle.server, name=call.name))
        seen(handle)
        if host is None:  # a task from a host that cannot poll it: nothing to wait for
            return ToolResult(texts.MCP_TASK_RESULT_LOST.format(server=handle.server, name=call.name), True)
        try:
            return follow(host, handle, call.name, seen=seen)
        except KeyboardInterrupt:  # the person stopped the run: the server is told, then it ends
            host.cancel_task(handle)
            raise

    def answer(self, outcome: AwaitingInput) -> InputAnswer:
        """The person's answer to the question the call's server asks; its values kept here (for
        `values`), never in the state. A closed stdin, or an empty first answer, cancels."""
        call = outcome.call
        assert call.asking is not None
        question = call.asking.next_question
        assert question is not None
        self.say(
            texts.CLI_INPUT_ASKS.format(server=call.asking.server, name=call.name, message=question.message)
        )
        try:
            if question.mode == "url":
                self.say(texts.CLI_INPUT_URL.format(url=question.url))
                done = self.ask(texts.CLI_INPUT_URL_DONE).strip().lower()
                return InputAnswer("accept" if done in APPROVING_ANSWERS - {""} else "decline", by="terminal")
            if question.secret_fields:  # typed here it would sit in the terminal's scrollback
                self.say(texts.CLI_INPUT_SECRET.format(fields=", ".join(question.secret_fields)))
                return InputAnswer("decline", by="terminal")
            values = self._form(question)
        except EOFError:  # no one at the terminal
            self.say("")
            return InputAnswer("cancel", by="terminal")
        if values is None:
            return InputAnswer("decline", by="terminal")
        ref = f"{len(self.values):016x}"
        self.values[ref] = values
        return InputAnswer("accept", by="terminal", ref=ref)

    def _form(self, question: InputQuestion) -> dict[str, Any] | None:
        """Each field asked in turn, typed by its schema; None: declined (an `n` to the first)."""
        if self.ask(texts.CLI_INPUT_ANSWER).strip().lower() in ("n", "no"):
            return None
        values: dict[str, Any] = {}
        for name, spec in question.fields.items():
            while True:
                raw = self.ask(texts.CLI_INPUT_FIELD.format(name=name, kind=spec.get("type", "string")))
                if not raw.strip() and name not in question.required:
                    break
                try:
                    values[name] = typed_answer(raw.strip(), spec)
                    break
                except ValueError as exc:
                    self.say(f"  {exc}")
        return values

    def values_of(self, ask: InputAsk) -> dict[str, dict[str, Any]]:
        """What was typed for `ask`'s answers (`Agent.input_values`), taken: it goes once."""
        return {k: self.values.pop(a.ref, {}) for k, a in ask.answers.items() if a.ref}

    def keep_going(self, outcome: AwaitingLimit) -> bool:
        """Whether to continue past a limit ([limits] on_limit = "ask"); a closed stdin stops."""
        prompt = texts.CLI_LIMIT_PROMPT.format(question=outcome.question, more=outcome.more)
        try:
            answer = self.ask(prompt)
        except EOFError:  # no one at the terminal: stop
            self.say("")
            return False
        return answer.strip().lower() not in ("n", "no")

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)


def run_in_terminal(
    task: str,
    agent: Agent,
    terminal: Terminal,
    offered: Callable[[], ToolRegistry] | None = None,
    tasks: TaskHost | None = None,
) -> tuple[RunState, Outcome]:
    """Drive one run to its end, asking the terminal for every approval (and every question a
    tool's server asks); `offered`: the tools offered now (an MCP server's may change), read again
    before every step; `tasks`: who polls a task a server works on (the terminal waits for it)."""
    agent = replace(agent, input_values=terminal.values_of)

    def now(agent: Agent, state: RunState) -> Agent:
        return with_tools(agent, offered(), state) if offered is not None else agent

    state = new_run(task)
    result = step(state, now(agent, state))
    while True:
        for event in result.events:
            terminal.show(event)
        state, outcome = result.state, result.outcome
        if isinstance(outcome, AwaitingLimit):
            if not terminal.keep_going(outcome):
                return stop_run(state, outcome.valve, outcome.reason), Stopped(outcome.valve, outcome.reason)
            result = continue_at_limit(state, agent)
            continue
        if isinstance(outcome, AwaitingApproval):
            state = record_decisions(state, terminal.decide(outcome))
        elif isinstance(outcome, AwaitingInput):
            state = record_input_answers(state, {outcome.call.id: terminal.answer(outcome)})
        elif isinstance(outcome, AwaitingTask):
            state = record_task_result(state, outcome.call.id, terminal.follow(outcome, tasks))
        elif outcome is not None:
            return state, outcome
        agent = now(agent, state)
        result = step(state, agent)


class UsageError(ValueError):
    """The command line cannot be used; the message is the one line to print."""


@dataclass(frozen=True)
class Inspection:
    """`--list-tools` or `--explain-call NAME JSON`, and where a run would be (`--channel` …)."""

    flag: str
    values: tuple[str, ...] = ()
    where: dict[str, str] = field(default_factory=dict)  # channel, team, user: the flags given


def parse_inspection(args: list[str]) -> Inspection:
    """The inspection `args` ask for: one of `INSPECT_FLAGS` and any of `WHERE_FLAGS`, in any order."""
    flag: str | None = None
    values: tuple[str, ...] = ()
    where: dict[str, str] = {}
    rest = list(args)
    while rest:
        token = rest.pop(0)
        if token in INSPECT_FLAGS:
            wanted = 2 if token == "--explain-call" else 0
            if flag is not None or len(rest) < wanted:
                raise UsageError(texts.CLI_USAGE)
            flag, values, rest = token, tuple(rest[:wanted]), rest[wanted:]
        elif token in WHERE_FLAGS:
            name, pattern, expected = WHERE_FLAGS[token]
            if not rest:
                raise UsageError(texts.CLI_FLAG_NEEDS_VALUE.format(flag=token))
            if name in where:
                raise UsageError(texts.CLI_FLAG_TWICE.format(flag=token))
            value = rest.pop(0)
            if not pattern.fullmatch(value):
                raise UsageError(texts.CLI_BAD_ID.format(flag=token, expected=expected, value=value))
            where[name] = value
        else:
            raise UsageError(texts.CLI_USAGE)
    if flag is None:
        raise UsageError(texts.CLI_WHERE_ALONE)
    return Inspection(flag, values, where)


def explain_where(config: Config, where: dict[str, str], out: TextIO) -> Config:
    """The settings a run there would get, after printing which profile and why (and, with a
    user, whether they may start it and the budgets in force)."""
    match = config.match(where.get("channel", ""), where.get("team", ""))
    print(match.header(), file=out)
    settings = match.settings
    if "user" in where:
        print(requester_line(settings, where["user"]), file=out)
        print(budgets_line(settings), file=out)
    return settings


def requester_line(settings: Config, user: str) -> str:
    """`# requester: …`: whether `user` may start a run under `settings`; a user group listed in
    `requesters` cannot be resolved offline, so that case says so rather than guess."""
    key = f"profiles[{settings.profile}].requesters"
    if settings.profile is None:
        return texts.CLI_REQUESTER_TOP.format(user=user)
    if not settings.requesters:
        return texts.CLI_REQUESTER_ANYONE.format(user=user, key=key)
    if user in settings.requesters:
        return texts.CLI_REQUESTER_LISTED.format(user=user, key=key)
    groups = [who for who in settings.requesters if who.startswith("S")]
    if groups:
        return texts.CLI_REQUESTER_GROUPS.format(user=user, key=key, groups=", ".join(groups))
    return texts.CLI_REQUESTER_REFUSED.format(user=user, key=key, who=", ".join(settings.requesters))


def budgets_line(settings: Config) -> str:
    """`# budgets: …`: the daily token budgets a run under `settings` counts against."""
    budgets = settings.budgets

    def shown(tokens: int) -> str:
        return texts.CLI_BUDGET_TOKENS.format(tokens=tokens) if tokens else texts.CLI_NO_BUDGET

    key = f"profiles[{settings.profile}].budgets" if settings.profile else "budgets"
    return texts.CLI_BUDGETS.format(
        user=shown(budgets.per_user_daily_tokens), channel=shown(budgets.per_channel_daily_tokens), key=key
    )


def list_tools(catalog: Catalog, policy: Policy, out: TextIO, token_budget: int = Limits.token_budget) -> int:
    """`--list-tools`: one `NAME<TAB>TIER<TAB>WHY` line per tool offered; then, with MCP servers, a
    `#` line per server with what its tools add to every request and the total (`cost_lines`), and
    a `# left out:` line per tool of a server that its `include_tools` / `exclude_tools` leave out."""
    for found in catalog.registry():
        ruling = policy.decide(found.name, {}, found.own_tier, found.own_tier_why, found.always_ask_why)
        rules = policy.rules_for(found.name)
        others = [r for r in rules if r.args and r.window is None]
        counting = [r for r in rules if r.window is not None]
        why = ruling.why
        if others:
            numbers = ", ".join(f"policy.rules[{r.number}]" for r in others)
            why += texts.CLI_RULES_MAY_DECIDE.format(rules=numbers)
        if counting:
            why += texts.CLI_RULES_COUNT.format(rules=", ".join(r.key for r in counting))
        print(f"{found.name}\t{ruling.tier.value}\t{why}", file=out)
    for line in cost_lines(catalog, token_budget):
        print(line, file=out)
    for name, left_out_by in sorted(catalog.left_out().items()):
        print(texts.CLI_LEFT_OUT.format(name=name, why=left_out_by), file=out)
    return 0


def cost_lines(catalog: Catalog, token_budget: int) -> list[str]:
    """What the tool definitions cost every request, per MCP server and in all, with their share of
    `token_budget` (none without an MCP server: the built-ins alone cost little and never change)."""
    costs = [c for c in catalog.costs() if c.tools]
    if not costs:
        return []
    budget = f"limits.token_budget {token_budget}"

    def share(tokens: int) -> str:
        return f"{tokens / token_budget:.1%}"

    lines = []
    for cost in costs:
        form = texts.CLI_SERVER_DEFERRED if cost.deferred_why else texts.CLI_SERVER_COST
        lines.append(
            form.format(
                server=cost.server,
                tools=cost.tools,
                tokens=cost.tokens,
                why=cost.deferred_why,
                share=share(cost.tokens),
                budget=budget,
            )
        )
    total = sum(
        definition_tokens(s) for s in catalog.registry().schemas() if s.get("defer_loading") is not True
    )
    lines.append(texts.CLI_TOOLS_COST.format(tokens=total, share=share(total), budget=budget))
    return lines


def explain_call(
    catalog: Catalog,
    policy: Policy,
    name: str,
    raw: str,
    out: TextIO,
    not_offered: str = "",
    *,
    where: dict[str, str] | None = None,
    meter: Meter | None = None,
) -> int:
    """`--explain-call NAME JSON`: the tier one call would get, and why (`not_offered`: why a tool
    of that name is not offered, when it is offered elsewhere); then a `# counter:` line per
    counting rule it matches, with what its window holds when `meter` can read it (`where`: the
    flags given, naming the windows)."""
    try:
        arguments = json.loads(raw)
    except ValueError as exc:
        print(texts.CLI_EXPLAIN_BAD_JSON.format(error=exc), file=sys.stderr)
        return EXIT_USAGE
    if not isinstance(arguments, dict):
        print(texts.CLI_EXPLAIN_BAD_JSON.format(error="the arguments must be a JSON object"), file=sys.stderr)
        return EXIT_USAGE
    found = catalog.registry().get(name)
    if found is None:
        print(f"{name}\t-\t{not_offered or texts.WHY_UNKNOWN_TOOL}", file=out)
        return EXIT_FAILED
    rules = policy.counting_rules(name, arguments)
    lines, seen = counter_lines(rules, arguments, where or {}, meter)
    ruling = policy.decide(name, arguments, found.own_tier, found.own_tier_why, found.always_ask_why, seen)
    print(f"{name}\t{ruling.tier.value}\t{ruling.why}", file=out)
    for line in lines:
        print(line, file=out)
    if ruling.tier is not Tier.DENY and policy.flows and (sends := policy.flows.sends(name)):
        print(texts.CLI_FLOW_LINE.format(glob=sends), file=out)  # a deny stays deny
    return 0


def counter_lines(
    rules: tuple[Rule, ...], arguments: dict[str, Any], where: dict[str, str], meter: Meter | None
) -> tuple[list[str], dict[str, Seen]]:
    """A `# counter:` line per counting rule, and what to rule the call with: the windows read, and
    room assumed in those not read (their lines say so)."""
    lines, seen = [], {}
    for rule in rules:
        window = rule.window
        assert window is not None
        head = {
            "rule": rule.describe(),
            "measure": window.measure(),
            "per": window.per,
            "scope": window.scope,
        }
        missing = [f for f in SCOPE_FLAGS[window.scope] if f.removeprefix("--") not in where]
        amount = window.amount(arguments)
        if amount is None:
            state = texts.CLI_COUNTER_NOT_NUMBER.format(arg=window.sum_arg, tier=rule.tier.value)
        elif meter is None:
            state = texts.CLI_COUNTER_NOT_READ.format(tier=rule.tier.value)
        elif missing:
            state = texts.CLI_COUNTER_NEEDS.format(flags=" and ".join(missing))
        else:
            seen[rule.key] = meter.seen(rule, "explain")
            total = seen[rule.key]
            if not total.known:
                state = texts.CLI_COUNTER_UNREAD.format(scope=window.scope)
            else:
                past = total.total + amount > window.limit
                verdict = (
                    texts.CLI_COUNTER_PAST.format(tier=rule.tier.value) if past else texts.CLI_COUNTER_WITHIN
                )
                state = texts.CLI_COUNTER_SEEN.format(
                    seen=number_text(total.total),
                    scope=window.scope,
                    adds=number_text(amount),
                    verdict=verdict,
                )
        seen.setdefault(rule.key, Seen(0.0))
        lines.append(texts.CLI_COUNTER.format(**head, state=state))
    return lines, seen


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:
        print(release.line())
        return 0
    inspection = None
    if args and (args[0] in INSPECT_FLAGS or args[0] in WHERE_FLAGS):
        try:
            inspection = parse_inspection(args)
        except UsageError as exc:
            print(exc, file=sys.stderr)
            return EXIT_USAGE
    task = " ".join(args).strip()
    if not task or task in ("-h", "--help"):
        print(texts.CLI_USAGE, file=sys.stderr)
        return EXIT_USAGE
    # Warnings (an MCP server that cannot start) go to stderr, one line each; stdout stays the transcript.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("harness.mcp.stderr").setLevel(logging.INFO)  # a stdio server's stderr, as data
    protect_process()  # this process holds the API key: its /proc entries closed to the rest of its user
    try:
        config = load_config()
        opened = open_catalog(config)
        catalog = opened.__enter__()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if inspection is not None:
            return inspect(inspection, config, catalog)
        return _run(task, config, catalog)
    finally:
        opened.__exit__(None, None, None)


def inspect(inspection: Inspection, config: Config, catalog: Catalog, meter: Meter | None = None) -> int:
    """`--list-tools` / `--explain-call`: as the config's top level sees them, or, with `--channel`,
    `--team` or `--user`, exactly what a run there gets (its profile's tools and policy); `meter`
    reads the windows of counting rules (`python -m workers explain-call`'s, in Redis)."""
    settings, offered, not_offered = config, catalog, ""
    if inspection.where:
        settings = explain_where(config, inspection.where, sys.stdout)
        offered = catalog.narrowed(settings)
        where = f"profile {settings.profile}" if settings.profile else "the top level"
        not_offered = texts.WHY_NOT_OFFERED_HERE.format(where=where)
    if inspection.flag == "--list-tools":
        return list_tools(offered, settings.policy, sys.stdout, settings.limits.token_budget)
    name, raw = inspection.values
    if catalog.registry().get(name) is None:
        not_offered = ""  # offered nowhere: the unknown tool's why
    if left_out := catalog.left_out().get(name):
        not_offered = texts.WHY_LEFT_OUT.format(why=left_out)
    return explain_call(
        offered, settings.policy, name, raw, sys.stdout, not_offered, where=inspection.where, meter=meter
    )


def _run(task: str, config: Config, catalog: Catalog) -> int:
    if not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")):
        print(texts.CLI_NO_API_KEY, file=sys.stderr)
        return EXIT_USAGE
    terminal = Terminal(sys.stdout, input)
    try:
        host = catalog.host if isinstance(catalog.host, TaskHost) else None
        # One process, one run: counting rules count in memory, every scope being this run.
        agent = Agent.from_config(config, catalog, meter=MemoryMeter())
        state, outcome = run_in_terminal(task, agent, terminal, catalog.registry, host)
    except KeyboardInterrupt:
        terminal.say("\n" + texts.CLI_INTERRUPTED)
        return EXIT_INTERRUPTED
    footer = texts.FOOTER.format(turns=state.turns, requests=state.requests)
    if isinstance(outcome, Finished):
        terminal.say(outcome.answer)
        terminal.say(footer)
        return EXIT_FINISHED
    if isinstance(outcome, Stopped):
        terminal.say(texts.CLI_STOPPED.format(turn=state.turns + 1, reason=outcome.reason))
        terminal.say(footer)
        return EXIT_STOPPED
    assert isinstance(outcome, Failed)
    print(f"error: {outcome.error}", file=sys.stderr)
    terminal.say(footer)
    return EXIT_FAILED
