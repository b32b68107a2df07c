"""`[limits] max_input_tokens`: old tool results are cleared so a long thread's requests stay within it.

The loop runs over the real SDK against the loopback Messages API, which refuses a `tool_use`
without its `tool_result` and a thinking block that is not sent back as returned.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import texts
from harness.context import (
    CLEAR_TO,
    IMAGE_TOKENS,
    block_tokens,
    clear_old_results,
    estimate_tokens,
    messages_tokens,
    within_input_limit,
)
from harness.loop import Agent, Finished, drive
from harness.request import build_request
from harness.state import RunState, new_run
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, thinking, tool_use

BIG = 3_000  # characters of each old tool result: about 1,000 tokens by the estimate


def past_turn(k: int, size: int = BIG, think: bool = False) -> list[dict[str, Any]]:
    """One finished turn of an earlier mention: task, a tool call, its (large) result, an answer."""
    lead = [thinking(f"turn {k}: read it")] if think else []
    return [
        {"role": "user", "content": [text(f"task {k}")]},
        {
            "role": "assistant",
            "content": [*lead, tool_use("read_file", {"path": f"f{k}.txt"}, id=f"toolu_old{k}")],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": f"toolu_old{k}",
                    "content": f"{k}" * size,
                    "is_error": k == 0,
                }
            ],
        },
        {"role": "assistant", "content": [text(f"answer {k}")]},
    ]


def long_history(turns: int = 12, think: bool = False) -> tuple[dict[str, Any], ...]:
    return tuple(m for k in range(turns) for m in past_turn(k, think=think))


def results(messages: Any) -> list[dict[str, Any]]:
    return [
        b
        for m in messages
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_result"
    ]


def blocks_of(messages: Any, *kinds: str) -> list[dict[str, Any]]:
    return [b for m in messages if isinstance(m["content"], list) for b in m["content"] if b["type"] in kinds]


def limited(model: FakeMessagesAPI, workspace: Path, limit: int, **limits: Any) -> Agent:
    return make_agent(model, workspace, default="allow", max_input_tokens=limit, **limits)


def unmarked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` without cache breakpoints (they move with the end of the conversation)."""
    return [
        {**m, "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]]}
        for m in messages
    ]


def run(agent: Agent, history: tuple[dict[str, Any], ...], task: str = "and now?") -> tuple[RunState, Any]:
    return drive(new_run(task, history), agent, lambda event: None)


# --- through the loop ---------------------------------------------------------------------------


def test_a_long_thread_gets_its_oldest_results_cleared_and_stays_within_the_limit(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    history = long_history()
    limit = 8_000
    agent = limited(model, workspace, limit)
    assert estimate_tokens(build_request(new_run("and now?", history), agent)) > limit  # it would not fit
    model.script(reply(tool_use("read_file", {"path": "README.md"}, id="toolu_now")), reply(text("done")))

    state, outcome = run(agent, history)

    assert outcome == Finished("done", "end_turn")
    assert model.errors == []  # every tool_use still had its tool_result
    sent = model.valid_requests
    assert [estimate_tokens(body) <= limit for body in sent] == [True, True]
    assert estimate_tokens(sent[0]) <= CLEAR_TO * limit  # cleared in bulk, not just under the line
    first = results(sent[0]["messages"])
    cleared = [r for r in first if r["content"] == texts.RESULT_CLEARED]
    assert cleared and first[: len(cleared)] == cleared  # the oldest ones, in order
    assert all(r["content"] != texts.RESULT_CLEARED for r in first[len(cleared) :])
    assert [r["tool_use_id"] for r in first] == [r["tool_use_id"] for r in results(history)]
    assert first[0].get("is_error") is True  # the flag stays with the cleared result
    assert blocks_of(sent[0]["messages"], "tool_use") == blocks_of(history, "tool_use")
    latest = results(sent[1]["messages"][-1:])
    assert latest[0]["tool_use_id"] == "toolu_now" and latest[0]["content"].startswith("# My project")
    # The second request changed nothing old: the cached prefix holds.
    old = len(sent[0]["messages"])
    assert unmarked(sent[1]["messages"][:old]) == unmarked(sent[0]["messages"])
    # The stored conversation is the cleared one, so the saved thread stays bounded.
    assert results(state.messages)[: len(cleared)] == cleared
    assert messages_tokens(state.messages) <= limit


def test_a_history_that_fits_is_sent_untouched(model: FakeMessagesAPI, workspace: Path) -> None:
    history = long_history(3)
    agent = limited(model, workspace, 100_000)
    start = new_run("and now?", history)
    model.script(reply(text("done")))

    state, _ = run(agent, history)

    canonical = json.dumps(build_request(start, agent), sort_keys=True)
    assert json.dumps(model.valid_requests[0], sort_keys=True) == canonical
    assert state.messages[: len(start.messages)] == start.messages


def test_the_latest_turn_results_are_kept_even_when_they_alone_exceed_the_limit(
    model: FakeMessagesAPI, workspace: Path
) -> None:
    (workspace / "huge.txt").write_text("z" * 9_000)
    agent = limited(model, workspace, 1_000)
    model.script(reply(tool_use("read_file", {"path": "huge.txt"})), reply(text("done")))

    state, outcome = run(agent, ())

    assert isinstance(outcome, Finished) and model.errors == []
    last = results(model.valid_requests[1]["messages"][-1:])[0]
    assert last["content"].startswith("z" * 100)  # nothing older to clear: sent as it is
    assert estimate_tokens(model.valid_requests[1]) > 1_000


def test_clearing_keeps_every_thinking_block_as_returned(model: FakeMessagesAPI, workspace: Path) -> None:
    history = long_history(think=True)
    agent = replace(limited(model, workspace, 8_000, max_tokens=2048), thinking_budget=1024)
    model.script(reply(thinking("now then"), tool_use("get_time", {})), reply(text("done")))

    state, outcome = run(agent, history)

    assert isinstance(outcome, Finished) and model.errors == []
    sent = model.valid_requests
    assert all("thinking" in body for body in sent)
    assert any(r["content"] == texts.RESULT_CLEARED for r in results(sent[0]["messages"]))
    assert blocks_of(sent[1]["messages"], "thinking")[:-1] == blocks_of(history, "thinking")
    assert sent[1]["messages"][-2]["content"][0] == thinking("now then")


# --- the pure parts -----------------------------------------------------------------------------


def test_the_estimate_counts_images_flat_and_ignores_cache_breakpoints() -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "A" * 1_000_000},
    }
    result = {"type": "tool_result", "tool_use_id": "t", "content": [image, text("caption")]}
    assert block_tokens(image) == IMAGE_TOKENS
    assert IMAGE_TOKENS < block_tokens(result) < IMAGE_TOKENS + 50
    plain = text("x" * 300)
    assert block_tokens({**plain, "cache_control": {"type": "ephemeral"}}) == block_tokens(plain)
    assert len(json.dumps(plain)) == 328 and block_tokens(plain) == 110  # a third, rounded up


def test_non_latin_text_is_counted_more_than_ascii() -> None:
    assert block_tokens(text("日本語" * 100)) > 3 * block_tokens(text("abc" * 100))


def test_clearing_is_oldest_first_deterministic_and_idempotent() -> None:
    messages = (*long_history(6), {"role": "user", "content": [text("go")]})
    once = clear_old_results(messages, 4_000)
    assert once == clear_old_results(messages, 4_000)
    assert clear_old_results(once, 4_000) is once  # it fits now: nothing more happens
    flags = [r["content"] == texts.RESULT_CLEARED for r in results(once)]
    assert flags == sorted(flags, reverse=True) and any(flags) and not all(flags)
    assert messages_tokens(once) <= CLEAR_TO * 4_000


def test_a_history_that_fits_is_the_same_object() -> None:
    messages = long_history(2)
    assert clear_old_results(messages, 100_000) is messages
    state = new_run("x", messages)
    assert within_input_limit(state, {"system": "s", "tools": []}, 100_000) is state


def test_the_latest_user_message_is_never_cleared_even_mid_turn() -> None:
    big = "q" * 6_000
    messages = (
        {"role": "user", "content": [text("go")]},
        {"role": "assistant", "content": [tool_use("read_file", {"path": "a"}, id="toolu_a")]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": big}]},
        {"role": "assistant", "content": [tool_use("read_file", {"path": "b"}, id="toolu_b")]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_b", "content": big}]},
    )
    out = clear_old_results(messages, 1_000)
    assert results(out)[0]["content"] == texts.RESULT_CLEARED  # an earlier step of this very turn
    assert out[-1] == messages[-1]  # the results being answered now


def test_a_result_shorter_than_the_note_is_left_alone() -> None:
    messages = (
        {"role": "user", "content": [text("go " * 2_000)]},
        {"role": "assistant", "content": [tool_use("get_time", {}, id="toolu_t")]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_t", "content": "12:00"}]},
        {"role": "assistant", "content": [text("noon")]},
        {"role": "user", "content": [text("again")]},
    )
    assert clear_old_results(messages, 1_000) is messages


def test_once_it_clears_it_leaves_room_so_the_next_turns_keep_the_cached_prefix() -> None:
    messages = (
        *(m for k in range(18) for m in past_turn(k, size=900)),
        {"role": "user", "content": [text("go")]},
    )
    once = clear_old_results(messages, 8_000)
    assert once is not messages and messages_tokens(once) <= 6_000  # three quarters of the limit
    grown = (
        *once,
        {"role": "assistant", "content": [tool_use("read_file", {"path": "new"}, id="toolu_new")]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_new", "content": "n" * 1_500}],
        },
    )
    assert messages_tokens(grown) > messages_tokens(once) + 500
    assert clear_old_results(grown, 8_000) is grown  # no second clearing: the prefix stays as cached


def test_the_memo_estimates_as_the_estimate_does_and_only_new_messages() -> None:
    from harness.context import TokenMemo

    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    history = (
        {"role": "user", "content": "a plain string, naïve ünïcödé \u2603"},
        *(m for k in range(6) for m in past_turn(k, size=k * 7)),
        {"role": "user", "content": [image, text("x")]},
    )
    memo = TokenMemo()
    assert memo.messages_tokens(history) == messages_tokens(history)
    grown = (*history[:-1], {**history[-1], "content": [text("y" * 300)]})  # a new last message
    assert memo.messages_tokens(grown) == messages_tokens(grown)
    small = TokenMemo(size=3)  # starts afresh when full, never wrong
    assert small.messages_tokens(grown) == messages_tokens(grown) == small.messages_tokens(grown)
    for limit in (0, 500, 2_000, 10**6):
        assert clear_old_results(grown, limit, memo=TokenMemo()) == clear_old_results(grown, limit)
