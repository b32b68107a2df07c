"""End to end: signed HTTP into the real bot (`python -m bot`), a real `python -m workers`, real Redis.

Slack and the Messages API are loopback stand-ins that enforce their APIs' rules. Each test uses
its own channel and marks its task with a unique word, so tests share one stack safely.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from messages import texts
from store import RunRecord, Store
from tests.fakes.messages_api import http_error, reply, text, tool_use
from tests.fakes.signing import event_body, signed_headers
from tests.stack import (
    SIGNING_SECRET,
    RedisServer,
    Stack,
    has_actions,
    running_stack,
    thread,
    wait_post,
    wait_until,
)

pytestmark = pytest.mark.e2e
_channels = itertools.count(100)


def new_channel() -> str:
    return f"C{next(_channels)}"


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # One stack for the module: its many parked, never-decided runs must not hit the requester bound.
    yield from running_stack(redis_server, tmp_path_factory.mktemp("stack"), GENEROUS, db=1)


@pytest.fixture(scope="module")
def team_stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Approvers UANN and UBEN decide; approvals expire after 3 seconds."""
    config = '[approvals]\napprovers = ["UANN", "UBEN"]\nexpire_after_minutes = 0.05\n' + GENEROUS
    yield from running_stack(redis_server, tmp_path_factory.mktemp("team"), config, db=2)


GENEROUS = "[limits]\nmax_runs_per_user = 1000\nmax_runs_per_channel = 1000\n"


def footer(turns: int, requests: int) -> str:
    return f"That took {turns} turns of tool calls across {requests} model requests."


def asked(stack: Stack, marker: str) -> list[dict[str, Any]]:
    """The model requests whose conversation mentions `marker`."""
    return [r for r in stack.model.requests if marker in str(r["messages"])]


def runs_in(stack: Stack, channel: str) -> list[RunRecord]:
    """Every run record Redis holds for `channel`: what a mention that started a run leaves behind."""
    client = redis.Redis.from_url(stack.redis_url)
    store = Store(client)
    records = (store.runs.load(key.decode().rsplit(":", 1)[1]) for key in client.scan_iter("harness:run:*"))
    return [r for r in records if r is not None and r.channel == channel]


def bot_traces(stack: Stack, channel: str) -> list[Any]:
    """Whatever the bot posted or reacted in `channel`."""
    posts = [m for m in stack.slack.messages(channel) if m["user"] == "UBOT"]
    return posts + [r for r in stack.slack.reactions if r[0] == channel]


# --- the whole flow ------------------------------------------------------------------------------------


def test_a_mention_runs_in_its_thread_with_turn_summaries_and_a_footer(stack: Stack) -> None:
    channel = new_channel()
    stack.model.script_for(
        "seedflow",
        reply(tool_use("read_file", {"path": "README.md"})),
        reply(tool_use("get_time", {})),
        reply(text("The first line is # My project.")),
    )
    status, ts, _ = stack.mention(
        "seedflow: read the first line of README.md, then tell me the time", channel=channel
    )
    assert status == 200

    answer = wait_post(stack, channel, ts, lambda m: footer(2, 3) in m["text"])
    posts = thread(stack, channel, ts)
    summaries = [m for m in posts if m["ts"] != answer["ts"] and "turn" in m["text"].lower()]
    assert len(summaries) == 2
    assert "read_file" in summaries[0]["text"] + str(summaries[0]["blocks"])
    assert "# My project" in str(summaries[0]["blocks"])
    assert "The first line is # My project." in answer["text"]
    assert all(m["thread_ts"] == ts for m in posts)
    assert (channel, ts, "eyes") in stack.slack.reactions or wait_until(
        lambda: (channel, ts, "white_check_mark") in stack.slack.reactions
    )
    assert stack.model.errors == []


def test_a_mention_inside_a_thread_replies_in_that_thread_and_continues_it(stack: Stack) -> None:
    channel = new_channel()
    stack.model.script_for("continued", reply(text("first answer")), reply(text("second answer")))
    _, root, _ = stack.mention("continued: remember the word banana", channel=channel)
    wait_post(stack, channel, root, lambda m: "first answer" in m["text"])

    _, _, _ = stack.mention("what was the word?", channel=channel, thread_ts=root)
    wait_post(stack, channel, root, lambda m: "second answer" in m["text"])
    second_request = [r for r in stack.model.requests if "continued" in str(r["messages"][0])][-1]
    texts = [b.get("text", "") for m in second_request["messages"] for b in m["content"]]
    assert any("remember the word banana" in t for t in texts)
    assert any("first answer" in t for t in texts)
    assert any("what was the word?" in t for t in texts)


# --- approvals -----------------------------------------------------------------------------------------


def ask_to_write(stack: Stack, marker: str, *files: str) -> tuple[str, str, list[dict[str, Any]]]:
    channel = new_channel()
    calls = [tool_use("write_file", {"path": f, "content": f"hello {f}"}) for f in files]
    stack.model.script_for(marker, reply(*calls), reply(text(f"{marker} done")))
    _, ts, _ = stack.mention(f"{marker}: write {' and '.join(files)}", channel=channel)
    wait_until(lambda: len([m for m in thread(stack, channel, ts) if is_card(m)]) == len(files))
    cards = [m for m in thread(stack, channel, ts) if is_card(m)]
    return channel, ts, cards


def is_card(message: dict[str, Any]) -> bool:
    """An approval card (one call), not the Approve all message of a park of several calls."""
    blocks = message.get("blocks") or []
    return any(
        e.get("action_id") == "approve" for b in blocks if b["type"] == "actions" for e in b["elements"]
    )


def test_approve_runs_the_call_and_updates_the_card(stack: Stack) -> None:
    channel, ts, [card] = ask_to_write(stack, "approveme", "approved.txt")
    assert "write_file" in str(card["blocks"]) and "<@UALICE>" in str(card["blocks"])
    assert not (stack.workspace / "approved.txt").exists()
    action_ids = {e["action_id"] for b in card["blocks"] if b["type"] == "actions" for e in b["elements"]}
    assert {"approve", "decline"} <= action_ids

    assert stack.click(card, "approve") == 200
    wait_post(stack, channel, ts, lambda m: "approveme done" in m["text"])
    assert (stack.workspace / "approved.txt").read_text() == "hello approved.txt"
    updated = next(m for m in stack.slack.messages(channel, ts) if m["ts"] == card["ts"])
    assert not has_actions(updated)
    assert "Approved" in str(updated["blocks"]) and "<@UALICE>" in str(updated["blocks"])


def test_decline_never_runs_the_call_and_tells_the_model(stack: Stack) -> None:
    channel, ts, [card] = ask_to_write(stack, "declineme", "declined.txt")
    assert stack.click(card, "decline") == 200
    wait_post(stack, channel, ts, lambda m: "declineme done" in m["text"])
    assert not (stack.workspace / "declined.txt").exists()
    updated = next(m for m in stack.slack.messages(channel, ts) if m["ts"] == card["ts"])
    assert not has_actions(updated) and "Declined" in str(updated["blocks"])
    result = [r for r in stack.model.requests if "declineme" in str(r["messages"][0])][-1]["messages"][-1]
    assert result["content"][0]["is_error"] is True and "declined" in result["content"][0]["content"]
    with urllib.request.urlopen(f"{stack.url}/metrics", timeout=10) as scrape:  # the worker counted it
        scraped = scrape.read().decode()
    declined = r'^harness_approval_decisions_total\{profile="",tool="write_file",verdict="declined"\} [1-9]'
    assert re.search(declined, scraped, re.MULTILINE), scraped[-3000:]


def test_decline_with_reason_reaches_the_model(stack: Stack) -> None:
    channel, ts, [card] = ask_to_write(stack, "reasonme", "reason.txt")
    views_before = len(stack.slack.views)
    assert stack.click(card, "decline_with_reason") == 200
    wait_until(lambda: len(stack.slack.views) > views_before)
    view = stack.slack.views[-1]["view"]
    assert stack.submit_view(view, "use the docs folder instead") == 200
    wait_post(stack, channel, ts, lambda m: "reasonme done" in m["text"])
    result = [r for r in stack.model.requests if "reasonme" in str(r["messages"][0])][-1]["messages"][-1]
    assert "use the docs folder instead" in result["content"][0]["content"]
    assert not (stack.workspace / "reason.txt").exists()


def test_two_approvals_in_one_turn_resume_only_when_both_are_decided(stack: Stack) -> None:
    channel, ts, cards = ask_to_write(stack, "twocalls", "one.txt", "two.txt")
    requests_before = len(stack.model.requests)
    stack.click(cards[0], "approve")
    wait_until(
        lambda: (
            not has_actions(next(m for m in stack.slack.messages(channel, ts) if m["ts"] == cards[0]["ts"]))
        )
    )
    stack.settled()  # the first decision has done all it will do
    assert len(stack.model.requests) == requests_before
    assert not (stack.workspace / "one.txt").exists()  # nothing runs ahead of the undecided second call

    stack.click(cards[1], "decline")
    wait_post(stack, channel, ts, lambda m: "twocalls done" in m["text"])
    assert (stack.workspace / "one.txt").exists() and not (stack.workspace / "two.txt").exists()


def test_a_non_approver_click_changes_nothing_and_gets_an_ephemeral_reply(stack: Stack) -> None:
    channel, ts, [card] = ask_to_write(stack, "notyours", "notyours.txt")
    assert stack.click(card, "approve", user="UMALLORY") == 200
    wait_until(lambda: any(e["user"] == "UMALLORY" for e in stack.slack.ephemerals))
    assert "Only <@UALICE>" in str([e for e in stack.slack.ephemerals if e["user"] == "UMALLORY"][-1])
    stack.settled()  # a click that had been taken as a decision would have resumed the run by now
    current = next(m for m in stack.slack.messages(channel, ts) if m["ts"] == card["ts"])
    assert has_actions(current)
    assert not (stack.workspace / "notyours.txt").exists()
    assert len(asked(stack, "notyours")) == 1
    stack.click(card, "decline")  # the requester can still decide
    wait_post(stack, channel, ts, lambda m: "notyours done" in m["text"])


def test_a_double_click_yields_one_decision(stack: Stack) -> None:
    channel, ts, [card] = ask_to_write(stack, "doubleclick", "double.txt")
    stack.click(card, "approve")
    stack.click(card, "decline")
    wait_post(stack, channel, ts, lambda m: "doubleclick done" in m["text"])
    assert (stack.workspace / "double.txt").exists()
    wait_until(lambda: any("already approved" in e["text"] for e in stack.slack.ephemerals))
    stack.settled()
    requests = [r for r in stack.model.requests if "doubleclick" in str(r["messages"][0])]
    assert len(requests) == 2


def test_a_click_after_the_run_moved_on_says_who_decided(stack: Stack) -> None:
    """The second click of a double click may arrive after the first one's resume; it hears the same."""
    channel, ts, [card] = ask_to_write(stack, "lateclick", "late.txt")
    stack.click(card, "approve")
    wait_post(stack, channel, ts, lambda m: "lateclick done" in m["text"])
    stack.settled()

    def told(user: str) -> list[str]:
        return [e["text"] for e in stack.slack.ephemerals if e["user"] == user and e["channel"] == channel]

    stack.click(card, "decline")
    wait_until(lambda: told("UALICE"))
    assert told("UALICE") == ["This approval was already approved by <@UALICE>. Nothing was changed."]
    stack.click(card, "decline", user="UMALLORY")  # not an approver: learns nothing about who decided
    wait_until(lambda: told("UMALLORY"))
    assert "no longer open" in told("UMALLORY")[0]
    stack.settled()
    assert (stack.workspace / "late.txt").exists()
    assert len([r for r in stack.model.requests if "lateclick" in str(r["messages"][0])]) == 2


def test_concurrent_clicks_by_two_approvers_yield_one_decision(team_stack: Stack) -> None:
    stack = team_stack
    channel = new_channel()
    stack.model.script_for(
        "raceclick",
        reply(tool_use("write_file", {"path": "race.txt", "content": "x"})),
        reply(text("raceclick done")),
    )
    _, ts, _ = stack.mention("raceclick: write race.txt", channel=channel, user="UANN")
    card = wait_post(stack, channel, ts, has_actions)
    barrier = threading.Barrier(2)
    statuses: list[int] = []

    def click(user: str, action: str) -> None:
        barrier.wait()
        statuses.append(stack.click(card, action, user=user))

    threads = [threading.Thread(target=click, args=a) for a in (("UANN", "approve"), ("UBEN", "decline"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200, 200]
    wait_post(stack, channel, ts, lambda m: "raceclick done" in m["text"])
    updated = next(m for m in stack.slack.messages(channel, ts) if m["ts"] == card["ts"])
    approved = "Approved" in str(updated["blocks"])
    assert approved != ("Declined" in str(updated["blocks"]))
    assert (stack.workspace / "race.txt").exists() == approved
    stack.settled()
    assert len([r for r in stack.model.requests if "raceclick" in str(r["messages"][0])]) == 2


def test_an_unanswered_approval_expires_and_the_run_goes_on(team_stack: Stack) -> None:
    stack = team_stack
    channel = new_channel()
    stack.model.script_for(
        "expireme",
        reply(tool_use("delete_file", {"path": "README.md"})),
        reply(text("expireme done")),
    )
    _, ts, _ = stack.mention("expireme: delete the readme", channel=channel, user="UANN")
    card = wait_post(stack, channel, ts, has_actions)
    wait_post(stack, channel, ts, lambda m: "expireme done" in m["text"])
    updated = next(m for m in stack.slack.messages(channel, ts) if m["ts"] == card["ts"])
    assert not has_actions(updated) and "xpired" in str(updated["blocks"])
    assert "eclined" not in str(updated["blocks"])
    result = [r for r in stack.model.requests if "expireme" in str(r["messages"][0])][-1]["messages"][-1]
    assert "expired" in result["content"][0]["content"] and "declined" not in result["content"][0]["content"]
    assert (stack.workspace / "README.md").exists()
    stack.click(card, "approve", user="UANN")  # a late click changes nothing
    wait_until(lambda: any(e["user"] == "UANN" for e in stack.slack.ephemerals))
    stack.settled()
    assert (stack.workspace / "README.md").exists()
    assert len([r for r in stack.model.requests if "expireme" in str(r["messages"][0])]) == 2
    late = next(m for m in stack.slack.messages(channel, ts) if m["ts"] == card["ts"])
    assert late["blocks"] == updated["blocks"]


def test_a_parked_run_does_not_occupy_the_worker(stack: Stack) -> None:
    channel, ts, [card] = ask_to_write(stack, "parkedfirst", "parked.txt")
    other = new_channel()
    stack.model.script_for("meanwhile", reply(text("meanwhile done")))
    _, other_ts, _ = stack.mention("meanwhile: say hi", channel=other)
    wait_post(stack, other, other_ts, lambda m: "meanwhile done" in m["text"])  # one worker, still free
    stack.click(card, "approve")
    wait_post(stack, channel, ts, lambda m: "parkedfirst done" in m["text"])


# --- Slack's delivery rules ----------------------------------------------------------------------------


def test_a_retried_delivery_makes_one_run(stack: Stack) -> None:
    channel = new_channel()
    stack.model.script_for("dedup", reply(text("dedup done")), reply(text("dedup AGAIN")))
    status, ts, event_id = stack.mention("dedup: hello", channel=channel)
    for _ in range(3):
        again, _, _ = stack.mention("dedup: hello", channel=channel, ts=ts, event_id=event_id)
        assert again == 200
    wait_post(stack, channel, ts, lambda m: "dedup done" in m["text"])
    stack.settled()  # a second run, had a retry made one, has made its request by now
    assert not any("AGAIN" in m["text"] for m in thread(stack, channel, ts))
    assert len(runs_in(stack, channel)) == 1
    assert len([r for r in stack.model.requests if "dedup" in str(r["messages"][0])]) == 1


@pytest.mark.parametrize("kind", ["forged", "stale", "missing"])
def test_bad_signatures_are_rejected_and_start_nothing(stack: Stack, kind: str) -> None:
    channel = new_channel()
    marker = f"badsig{kind}"
    stack.model.script_for(marker, reply(text(f"{marker} answered")))
    ts = stack.slack.add_message(channel, f"<@UBOT> {marker}", user="UALICE")
    event = {
        "type": "app_mention",
        "user": "UALICE",
        "text": f"<@UBOT> {marker}",
        "ts": ts,
        "channel": channel,
    }
    body = event_body(event, event_id=f"Ev{marker}{channel}")
    headers = {
        "forged": signed_headers("not-the-secret", body),
        "stale": signed_headers(SIGNING_SECRET, body, int(time.time()) - 600),
        "missing": {"X-Unrelated": "1"},
    }[kind]
    status, _ = stack.post(body, "application/json", headers=headers)
    assert status == 401
    stack.settled()  # a run the delivery had started would have asked the model by now
    assert asked(stack, marker) == [] and runs_in(stack, channel) == [] and bot_traces(stack, channel) == []

    # The same delivery, signed: the worker is live, and the rejected one used up nothing (its event_id).
    status, _ = stack.post(body, "application/json")
    assert status == 200
    wait_post(stack, channel, ts, lambda m: f"{marker} answered" in m["text"])
    stack.settled()
    assert len(asked(stack, marker)) == 1 and len(runs_in(stack, channel)) == 1


def test_other_bots_and_edits_never_start_a_run(stack: Stack) -> None:
    channel = new_channel()
    stack.model.script_for("botloop", reply(text("botloop answered")))
    for i, extra in enumerate([{"bot_id": "BOTHER"}, {"subtype": "message_changed"}]):
        ts = stack.slack.add_message(channel, "<@UBOT> botloop", user="UALICE")
        event = {
            "type": "app_mention",
            "user": "UALICE",
            "text": "<@UBOT> botloop",
            "ts": ts,
            "channel": channel,
        }
        status, _ = stack.post(
            event_body({**event, **extra}, event_id=f"EvBot{i}{channel}"), "application/json"
        )
        assert status == 200
    stack.settled()  # a run either delivery had started would have asked the model by now
    assert (
        asked(stack, "botloop") == [] and runs_in(stack, channel) == [] and bot_traces(stack, channel) == []
    )

    # The same mention from a person does reach the model: the worker was live all along.
    _, ts, _ = stack.mention("botloop", channel=channel)
    wait_post(stack, channel, ts, lambda m: "botloop answered" in m["text"])
    stack.settled()
    assert len(asked(stack, "botloop")) == 1 and len(runs_in(stack, channel)) == 1


def test_healthz_answers_when_redis_answers(stack: Stack) -> None:
    assert stack.healthz() == 200


# --- failures and escaping ---------------------------------------------------------------------------


def test_slack_429_and_500_are_retried(stack: Stack) -> None:
    """A post answered 429, then 500, is sent a third time and lands. Without the client's retry
    handlers Slack sees it once: the answer still reaches the thread by another post, so only the
    attempts tell a retry from none."""
    channel = new_channel()
    stack.model.script_for("flaky", reply(text("flaky done")))
    stack.settled()  # no other test's run may take the failures queued here
    stack.slack.fail_next("chat.postMessage", status=429, headers={"Retry-After": "0"})
    stack.slack.fail_next("chat.postMessage", status=500)
    _, ts, _ = stack.mention("flaky: hi", channel=channel)
    wait_post(stack, channel, ts, lambda m: "flaky done" in m["text"])
    posts = [
        c for c in stack.slack.calls if c.method == "chat.postMessage" and c.params.get("channel") == channel
    ]
    assert [c.status for c in posts[:3]] == [429, 500, 200]
    assert posts[0].params == posts[1].params == posts[2].params  # one message, three attempts


def test_model_failure_posts_a_retry_button_that_resumes(stack: Stack) -> None:
    channel = new_channel()
    stack.model.script_for(
        "failing", *[http_error(400, message="bad request from fake")], reply(text("failing done"))
    )
    _, ts, _ = stack.mention("failing: do it", channel=channel)
    failure = wait_post(stack, channel, ts, has_actions)
    assert "bad request from fake" in str(failure["blocks"])
    assert stack.click(failure, "retry", user="UMALLORY") == 200  # not the requester: refused
    wait_until(lambda: any(e["user"] == "UMALLORY" for e in stack.slack.ephemerals))
    assert stack.click(failure, "retry") == 200
    wait_post(stack, channel, ts, lambda m: "failing done" in m["text"])
    updated = next(m for m in stack.slack.messages(channel, ts) if m["ts"] == failure["ts"])
    assert not has_actions(updated)


def test_a_retry_clicked_before_the_failure_is_saved_still_retries_once(stack: Stack) -> None:
    """The failure card is in Slack before its ts is saved with the run: a click then still counts."""
    channel = new_channel()
    stack.model.script_for("hasty", http_error(400, message="hasty failure"), reply(text("hasty done")))
    # The failing worker posts the card, then closes its Working message: frozen there, the run
    # is saved as failed but not yet with the card's ts.
    held = stack.slack.hold_next("chat.update", only=texts.WORKING_FAILED)
    _, ts, _ = stack.mention("hasty: do it", channel=channel)
    failure = wait_post(stack, channel, ts, has_actions)
    assert held.arrived.wait(30)
    store = Store(redis.Redis.from_url(stack.redis_url))
    run_id = next(e["value"] for b in failure["blocks"] if b["type"] == "actions" for e in b["elements"])
    assert store.runs.load(run_id).failure_ts is None  # type: ignore[union-attr]
    assert stack.click(failure, "retry") == 200
    wait_until(lambda: store.admission.retry_claimed_by(run_id, failure["ts"]) == "UALICE")
    assert stack.click(failure, "retry") == 200  # a second click: the first one has it
    told = wait_until(lambda: [e["text"] for e in stack.slack.ephemerals if e["channel"] == channel])
    held.release.set()
    wait_post(stack, channel, ts, lambda m: "hasty done" in m["text"])
    assert told == [texts.RETRY_TAKEN]  # the first click said nothing: it was honoured
    assert len([m for m in stack.slack.messages(channel, ts) if "hasty done" in m["text"]]) == 1
    (updated,) = [m for m in stack.slack.messages(channel, ts) if m["ts"] == failure["ts"]]
    assert not has_actions(updated)  # retried: its button is gone, and it says who retried
    assert "UALICE" in updated["text"] + str(updated["blocks"])


def test_model_text_cannot_ping_or_smuggle_links(stack: Stack) -> None:
    channel = new_channel()
    evil = "<!channel> <!here> <@U999> <!subteam^S1> <#C9> <https://evil.example|click me>"
    stack.model.script_for("pingme", reply(text(evil)))
    _, ts, _ = stack.mention("pingme: be evil", channel=channel)
    answer = wait_post(stack, channel, ts, lambda m: "evil.example" in m["text"])
    posted = answer["text"] + str(answer["blocks"])
    for token in ("<!channel>", "<!here>", "<@U999>", "<!subteam", "<#C9>", "<https://evil"):
        assert token not in posted


def test_a_markdown_answer_reads_as_written_and_feedback_on_it_is_recorded(stack: Stack) -> None:
    channel = new_channel()
    stack.model.script_for(
        "mdfb", reply(text("## Result\n\n- **one** <!channel>\n- [docs](https://example.com)"))
    )
    _, ts, _ = stack.mention("mdfb: sum it up", channel=channel)
    answer = wait_post(stack, channel, ts, lambda m: footer(0, 1) in m["text"])
    sections = [b["text"]["text"] for b in answer["blocks"] if b["type"] == "section"]
    assert sections == ["*Result*\n\n• *one* &lt;!channel&gt;\n• docs (https://example.com)"]

    (buttons,) = answer["blocks"][-1]["elements"]
    bad = buttons["negative_button"]["value"]
    status, _ = stack.click_value(
        answer, "feedback", bad, user="UBOB", block_id="feedback", kind="feedback_buttons"
    )
    assert status == 200
    thanked = wait_until(lambda: [e for e in stack.slack.ephemerals if e["user"] == "UBOB"])
    assert "feedback" in thanked[-1]["text"]
    store = Store(redis.Redis.from_url(stack.redis_url))
    (entry,) = [e for e in store.audit.feedback_entries() if e["thread_ts"] == ts]
    assert (entry["feedback"], entry["by"], entry["channel"]) == ("bad", "UBOB", channel)
    assert not [e for e in store.audit.entries(10_000) if e.get("event") == "feedback"]  # decisions only
    with urllib.request.urlopen(f"{stack.url}/metrics", timeout=10) as scrape:
        scraped = scrape.read().decode()
    assert re.search(r'^harness_feedback_total\{feedback="bad"\} [1-9]', scraped, re.MULTILINE)

    status, _ = stack.click_value(
        answer, "feedback", "bad:nosuchrun", block_id="feedback", kind="feedback_buttons"
    )
    assert status == 200
    wait_until(lambda: any("no longer" in e["text"] for e in stack.slack.ephemerals if e["user"] == "UALICE"))


def test_an_answer_or_a_result_too_long_for_a_message_comes_whole_as_a_file(stack: Stack) -> None:
    channel = new_channel()
    many = stack.workspace / "many"
    many.mkdir()
    for n in range(150):
        (many / f"report-{n:04d}.txt").touch()  # a listing of 2,700 characters
    long_answer = "## Findings\n\n" + "- a finding <!channel>\n" * 1500
    stack.model.script_for(
        "longout", reply(tool_use("list_files", {"path": "many"})), reply(text(long_answer))
    )
    _, ts, _ = stack.mention("longout: read and report", channel=channel)
    answer = wait_post(stack, channel, ts, lambda m: footer(1, 2) in m["text"])
    assert "the whole of it is in the file below" in str(answer["blocks"])

    def shared() -> list[dict[str, Any]]:
        return [f for f in stack.slack.files() if f.get("shared", {}).get("thread_ts") == ts]

    wait_until(lambda: len(shared()) == 2)
    stack.settled()
    files = shared()
    by_title = {f["title"]: f for f in files}
    assert set(by_title) == {"The whole answer", "Turn 1: every call in full"}
    assert by_title["The whole answer"]["text"] == long_answer.strip()  # a file cannot ping: kept as written
    assert re.fullmatch(r"findings-[0-9a-f]{8}-\d+\.md", by_title["The whole answer"]["name"])  # its heading
    turn_file = by_title["Turn 1: every call in full"]["text"]
    assert "report-0000.txt" in turn_file and "report-0149.txt" in turn_file
    summary = next(m for m in thread(stack, channel, ts) if "Turn 1" in m["text"])
    assert "every call in full is in the file below" in str(summary["blocks"])


def test_the_answer_streams_into_the_thread_then_settles_and_a_refused_stream_falls_back_to_a_post(
    stack: Stack,
) -> None:
    channel = new_channel()
    stack.model.script_for("streamit", reply(text("**Streamed** <!here> " + "word " * 200)))
    _, ts, _ = stack.mention("streamit: go", channel=channel)
    answer = wait_post(stack, channel, ts, lambda m: footer(0, 1) in m["text"])
    methods = [c.method for c in stack.slack.calls if c.params.get("channel") == channel]
    streamed = [m for m in methods if m.startswith("chat.") and "Stream" in m]
    assert streamed[0] == "chat.startStream" and streamed[-1] == "chat.stopStream"
    start = next(
        c for c in stack.slack.calls if c.method == "chat.startStream" and c.params["channel"] == channel
    )
    assert (start.params["recipient_team_id"], start.params["recipient_user_id"]) == ("T1", "UALICE")
    appended = "".join(
        c.params.get("markdown_text") or ""
        for c in stack.slack.calls
        if "Stream" in c.method and c.params["channel"] == channel
    )
    assert "<!here>" not in appended and "&lt;!here&gt;" in appended  # inert while it streams too
    assert answer["blocks"][0]["text"]["text"].startswith("*Streamed* &lt;!here&gt;")  # then settled
    assert not any(s["streaming"] for s in stack.slack.streams())

    refused = new_channel()
    stack.slack.fail_next("chat.startStream", error="not_allowed_token_type")
    stack.model.script_for("nostream", reply(text("posted instead")))
    _, ts, _ = stack.mention("nostream: go", channel=refused)
    wait_post(stack, refused, ts, lambda m: "posted instead" in m["text"] and footer(0, 1) in m["text"])
    assert not [s for s in stack.slack.streams() if s["channel"] == refused]


def test_a_valve_stop_is_posted_in_plain_words(stack: Stack) -> None:
    channel = new_channel()
    same = tool_use("read_file", {"path": "README.md"})
    stack.model.script_for("spinning", reply(same), reply(tool_use("read_file", {"path": "README.md"})))
    _, ts, _ = stack.mention("spinning: read it forever", channel=channel)
    stop = wait_post(stack, channel, ts, lambda m: "Stopped for no progress" in m["text"])
    assert footer(1, 2) in stop["text"]


def test_slacks_url_verification_is_answered_with_the_challenge(stack: Stack) -> None:
    import json

    body = json.dumps({"token": "t", "challenge": "abc123challenge", "type": "url_verification"})
    status, answer = stack.post(body, "application/json")
    assert status == 200 and "abc123challenge" in answer
