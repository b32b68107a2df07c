"""Property tests: whatever the model replies and whatever humans decide, the harness keeps the rules."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.loop import AwaitingApproval, ToolReturned, drive
from harness.policy import Tier
from harness.request import build_request
from harness.state import Decision, RunState, Verdict, new_run, record_decisions
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, Reply, reply, text, tool_use, validate_request

CALLS = st.sampled_from(
    [
        ("get_time", {}),
        ("read_file", {"path": "README.md"}),
        ("read_file", {"path": "../escape"}),
        ("read_file", {"path": 7}),
        ("list_files", {}),
        ("write_file", {"path": "w.txt", "content": "x"}),
        ("delete_file", {"path": "README.md"}),
    ]
)
STOPS = st.sampled_from(["end_turn", "stop_sequence", "pause_turn", "max_tokens", "refusal"])


@st.composite
def replies(draw: st.DrawFn) -> Reply:
    calls = draw(st.lists(CALLS, max_size=3))
    words = draw(st.lists(st.text(min_size=1, max_size=20).filter(str.strip), max_size=2))
    uses = [tool_use(name, args) for name, args in calls]
    if len(uses) > 1 and draw(st.integers(0, 4)) == 0:  # a buggy or hostile endpoint: two blocks, one id
        uses[-1] = {**uses[-1], "id": uses[0]["id"]}
    blocks = [text(w) for w in words] + uses
    if calls:
        stop = draw(st.sampled_from(["tool_use", "tool_use", "tool_use", "max_tokens"]))
    else:
        blocks = blocks or [text("answer")]
        stop = draw(STOPS)
    usage = {"input_tokens": draw(st.integers(0, 300)), "output_tokens": draw(st.integers(0, 100))}
    return reply(*blocks, stop_reason=stop, usage=usage, verbatim_ids=True)


@pytest.fixture(scope="module")
def shared_model() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as fake:
        yield fake


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    script=st.lists(replies(), min_size=1, max_size=8),
    verdicts=st.lists(st.sampled_from(list(Verdict)), min_size=30, max_size=30),
    max_turns=st.integers(0, 5),
    budget=st.integers(1, 2000),
    policy=st.dictionaries(
        st.sampled_from(["get_time", "read_file", "write_file"]), st.sampled_from(list(Tier))
    ),
)
def test_every_request_is_valid_and_no_unapproved_call_runs(
    shared_model: FakeMessagesAPI,
    script: list[Reply],
    verdicts: list[Verdict],
    max_turns: int,
    budget: int,
    policy: dict[str, Tier],
) -> None:
    model = shared_model
    model.reset()
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        (ws / "README.md").write_text("hello")
        model.script(*script, reply(text("fallback")))  # a pause_turn may need one more reply
        tiers = {"list_files": "allow", "delete_file": "ask", **{k: v.value for k, v in policy.items()}}
        agent = make_agent(model, ws, policy=tiers, max_turns=max_turns, token_budget=budget)
        ran: list[Any] = []
        decided: dict[str, Verdict] = {}
        state = new_run("go")
        while True:
            assert RunState.loads(state.dumps()) == state
            state, outcome = drive(state, agent, ran.append)
            if not isinstance(outcome, AwaitingApproval):
                break
            for call in outcome.calls:
                decided[call.id] = verdicts[len(decided) % len(verdicts)]
            state = record_decisions(state, {c.id: Decision(decided[c.id]) for c in outcome.calls})

        assert model.errors == []
        for body in model.requests:
            assert validate_request(body) == []
        for event in ran:
            if isinstance(event, ToolReturned) and event.call.tier is not Tier.ALLOW:
                assert event.call.result is not None
                if event.call.tier is Tier.DENY or decided.get(event.call.id) is not Verdict.APPROVED:
                    assert event.call.result.is_error
        # A file changed exactly when a call that may change it ran and succeeded: no more, no less.
        done = [e.call for e in ran if isinstance(e, ToolReturned) and e.call.result is not None]
        permitted = [c for c in done if c.tier is Tier.ALLOW or decided.get(c.id) is Verdict.APPROVED]
        succeeded = {c.name for c in permitted if not c.result.is_error}  # type: ignore[union-attr]
        assert (ws / "w.txt").exists() == ("write_file" in succeeded)
        assert (ws / "README.md").exists() == ("delete_file" not in succeeded)
        for call in done:  # a block that shared its id with another never ran
            if "__dup" in call.id:
                assert (
                    call.result is not None
                    and call.result.is_error
                    and "none of them was run" in call.result.content
                )
        follow_up = build_request(new_run("and then?", state.messages), agent)
        assert validate_request(follow_up) == []
