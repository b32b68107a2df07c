"""Operations end to end, on the real bot and worker processes: `/metrics` after a scripted run, JSON
log lines that name their run and show no secret, the deep health check, `python -m workers status`.

The stack logs JSON (LOG_FORMAT=json) and reaches Redis as a user with a password (an ACL user of
the session's private server, database 7), so the password is one more secret that must not show.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from store import RunStatus, Store
from tests.fakes.messages_api import FakeMessagesAPI, http_error, reply, text, tool_use
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import (
    BOT_TOKEN,
    ROOT,
    SIGNING_SECRET,
    RedisServer,
    Stack,
    has_actions,
    wait_post,
    wait_until,
)

pytestmark = pytest.mark.e2e

PASSWORD = "ops-redis-password-7f3a9c"
CONFIG = (
    '[approvals]\napprovers = ["UANN", "UBEN"]\n'
    "[limits]\nmax_runs_per_user = 1000\nmax_runs_per_channel = 1000\n"
    '[policy.tools]\nget_time = "allow"\nread_file = "allow"\nwrite_file = "ask"\n'
)
USAGE = {
    "input_tokens": 120,
    "output_tokens": 7,
    "cache_creation_input_tokens": 3,
    "cache_read_input_tokens": 2,
}
SECRETS = (BOT_TOKEN, SIGNING_SECRET, "sk-test", PASSWORD)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    admin = redis.Redis.from_url(redis_server.url)
    admin.acl_setuser(
        "harness-ops",
        enabled=True,
        passwords=[f"+{PASSWORD}"],
        keys=["*"],
        channels=["*"],
        commands=["+@all"],
    )
    url = f"redis://harness-ops:{PASSWORD}@127.0.0.1:{redis_server.port}/7"
    redis.Redis.from_url(url).flushdb()
    with FakeSlackAPI(bot_token=BOT_TOKEN) as slack, FakeMessagesAPI() as model:
        workdir = tmp_path_factory.mktemp("ops")
        running = Stack(url, slack, model, workdir, config=CONFIG, extra_env={"LOG_FORMAT": "json"})
        try:
            running.start_bot()
            running.start_worker()
            yield running
        finally:
            running.stop()


def get(stack: Stack, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{stack.url}{path}", timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def scrape(stack: Stack) -> Samples:
    status, body = get(stack, "/metrics")
    assert status == 200, body
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def moved(before: Samples, after: Samples) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of counters and histogram counts that changed, by how much."""
    kinds = ("_total", "_count")
    return {
        key: after[key] - before.get(key, 0.0)
        for key in after
        if key[0].endswith(kinds) and after[key] != before.get(key, 0.0)
    }


def lines_of(output: str) -> list[dict[str, Any]]:
    """Every line of a process's output, each parsed as JSON (one that is not fails the test)."""
    parsed = []
    for line in output.splitlines():
        try:
            parsed.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    return parsed


# --- /metrics ------------------------------------------------------------------------------------


def test_a_scrape_after_a_run_shows_exactly_what_the_run_did(stack: Stack) -> None:
    stack.settled()
    before = scrape(stack)
    stack.model.script_for(
        "metricsrun",
        reply(
            tool_use("read_file", {"path": "README.md"}),
            tool_use("write_file", {"path": "m.md", "content": "x"}),
            usage=USAGE,
        ),
        reply(tool_use("get_time", {}), usage=USAGE),
        reply(text("metrics done"), usage=USAGE),
    )
    status, ts, _ = stack.mention("metricsrun: read, write, tell the time", channel="C701", user="UALICE")
    assert status == 200
    card = wait_post(stack, "C701", ts, has_actions)
    parked = scrape(stack)
    assert parked[("harness_approvals_pending", ())] == before[("harness_approvals_pending", ())] + 1
    waiting = ("harness_runs_waiting", (("approvers", "UANN"),))  # the stack's approver
    assert parked[waiting] == before[waiting] + 1
    assert stack.click(card, "approve", user="UANN") == 200
    wait_post(stack, "C701", ts, lambda m: "metrics done" in m["text"])
    stack.settled()

    after = wait_until(lambda: _with_acks(stack, before), timeout=30)
    kinds = ("input", "output", "cache_creation", "cache_read")
    per_request = dict(zip(kinds, USAGE.values(), strict=True))
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {
        ("harness_mentions_total", (("result", "new"),)): 1,
        ("harness_turns_total", ()): 2,
        ("harness_model_requests_total", ()): 3,
        **{("harness_tokens_total", (("kind", k),)): 3 * per_request[k] for k in kinds},
        # Every token a run spends, under its profile ("" for the top level), budget or none.
        ("harness_budget_tokens_total", (("profile", ""),)): 3 * sum(per_request.values()),
        ("harness_tool_calls_total", (("outcome", "ran"), ("tier", "allow"))): 2,
        ("harness_tool_calls_total", (("outcome", "ran"), ("tier", "ask"))): 1,
        (
            "harness_approval_decisions_total",
            (("profile", ""), ("tool", "write_file"), ("verdict", "approved")),
        ): 1,
        ("harness_runs_ended_total", (("outcome", "finished"), ("valve", "none"))): 1,
        ("harness_approval_decision_seconds_count", (("verdict", "approved"),)): 1,
        ("harness_approval_wait_seconds_count", (("profile", ""),)): 1,
        ("harness_click_to_resume_seconds_count", ()): 1,
        ("harness_ack_seconds_count", (("kind", "event"),)): 1,
        ("harness_ack_seconds_count", (("kind", "interaction"),)): 1,
        # Two jobs (the start, the resume after the click), each started on a free slot.
        ("harness_job_slot_wait_seconds_count", ()): 2,
        ("harness_horse_runs_in_flight_count", ()): 2,
    }
    assert moved(before, after) == expected
    assert after[("harness_approvals_pending", ())] == before[("harness_approvals_pending", ())]
    assert after[("harness_queue_depth", ())] == 0
    assert after[("harness_workers_registered", ())] == 1


def test_a_run_a_valve_stops_counts_under_that_valve(stack: Stack) -> None:
    stack.settled()
    before = scrape(stack)
    same = tool_use("get_time", {})
    stack.model.script_for("valverun", reply(same), reply(same), reply(same))
    _, ts, _ = stack.mention("valverun: loop on the clock", channel="C705", user="UALICE")
    wait_post(stack, "C705", ts, lambda m: "That took" in m["text"])
    stack.settled()
    change = moved(before, scrape(stack))
    assert change[("harness_runs_ended_total", (("outcome", "stopped"), ("valve", "no_progress")))] == 1
    assert change[("harness_tool_calls_total", (("outcome", "ran"), ("tier", "allow")))] == 1
    assert ("harness_runs_ended_total", (("outcome", "finished"), ("valve", "none"))) not in change


def _with_acks(stack: Stack, before: Samples) -> Samples | None:
    """A scrape once the click's ack time is in (it is written after the answer went out)."""
    now = scrape(stack)
    key = ("harness_ack_seconds_count", (("kind", "interaction"),))
    return now if now.get(key, 0) > before.get(key, 0) else None


# --- logs ---------------------------------------------------------------------------------------


def test_every_line_is_json_run_lines_name_their_run_and_no_secret_shows(stack: Stack) -> None:
    stack.model.script_for(
        "logsrun", reply(tool_use("write_file", {"path": "l.md", "content": "l"})), reply(text("logs done"))
    )
    _, ts, _ = stack.mention("logsrun: write a file", channel="C702", user="UALICE")
    stack.click(wait_post(stack, "C702", ts, has_actions), "approve", user="UBEN")
    wait_post(stack, "C702", ts, lambda m: "logs done" in m["text"])
    stack.settled()
    [run] = [r for r in _runs(stack) if r.channel == "C702"]

    bot, worker = stack.processes[0], stack.processes[1]
    worker_lines = lines_of(worker.output())
    ours = [e for e in worker_lines if e.get("run_id") == run.run_id]
    assert {e["level"] for e in worker_lines} <= {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
    assert all({"time", "level", "logger", "message"} <= set(e) for e in worker_lines)
    # Lines of the jobs (RQ's own included) name the run; those logged while driving it name its
    # team, channel and thread too, like the line that says how it ended.
    assert any(e["logger"].startswith("rq.") for e in ours)
    ours_floors = ("workers.", "observe.", "store", "ops.", "gates.", "runtime.", "harness.")
    driven = [e for e in ours if e["logger"].startswith(ours_floors)]
    assert any(e["message"] == "run ended: finished" for e in driven)
    for entry in driven:
        assert (entry["team"], entry["channel"], entry["thread_ts"]) == ("T1", "C702", ts), entry
    bot_lines = lines_of(bot.output())
    assert any(e["logger"].startswith("gunicorn") for e in bot_lines)  # gunicorn's own lines too
    mention = [e for e in bot_lines if e["message"].startswith("app_mention") and e.get("channel") == "C702"]
    assert mention and mention[0]["thread_ts"] == ts and mention[0]["team"] == "T1"
    for process in (bot, worker):
        for secret in SECRETS:
            assert secret not in process.output(), f"{secret} appears in the {process.name} log"


def _runs(stack: Stack) -> list[Any]:
    client = redis.Redis.from_url(stack.redis_url)
    store = Store(client)
    records = (store.runs.load(k.decode().rsplit(":", 1)[1]) for k in client.scan_iter("harness:run:*"))
    return [r for r in records if r is not None]


# --- python -m workers status ------------------------------------------------------------------------


def test_status_names_who_must_decide_a_parked_run_and_lists_a_failed_one(stack: Stack) -> None:
    stack.model.script_for("statuspark", reply(tool_use("write_file", {"path": "s.md", "content": "s"})))
    stack.model.script_for("statusfail", http_error(400, message="bad request from fake"))
    _, parked_ts, _ = stack.mention("statuspark: write it", channel="C703", user="UCAROL")
    wait_post(stack, "C703", parked_ts, has_actions)
    _, failed_ts, _ = stack.mention("statusfail: this will fail", channel="C704", user="UDAVE")
    wait_post(stack, "C704", failed_ts, lambda m: "retry" in json.dumps(m.get("blocks")))
    stack.settled()
    runs = {r.channel: r for r in _runs(stack)}
    assert runs["C703"].status is RunStatus.AWAITING_APPROVAL and runs["C704"].status is RunStatus.FAILED

    done = subprocess.run(
        [sys.executable, "-m", "workers", "status"],
        env=stack.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    parked_line = next(line for line in out.splitlines() if runs["C703"].run_id in line)
    assert "asked by UCAROL" in parked_line and "waiting for: write_file" in parked_line
    assert "must decide: UANN, UBEN" in parked_line
    failed_part = out.split("Failed:", 1)[1]
    failed_line = next(line for line in failed_part.splitlines() if runs["C704"].run_id in line)
    assert "bad request from fake" in failed_line and "C704" in failed_line
    assert runs["C703"].run_id not in failed_part.split("Queue", 1)[0]
    assert PASSWORD not in out + done.stderr
    config_file = str((stack.workdir / "harness.toml").resolve())
    assert out.splitlines()[0] == f"Config: {config_file} (HARNESS_CONFIG)"

    # Beside the processes, in another terminal with no HARNESS_CONFIG: the workers' config is read,
    # so who must decide is still the stack's approvers, and the first line says which file.
    bare_env = {k: v for k, v in stack.env().items() if k != "HARNESS_CONFIG"}
    beside = subprocess.run(
        [sys.executable, "-m", "workers", "status"],
        env=bare_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert beside.returncode == 0, beside.stderr
    assert beside.stdout.splitlines()[0] == f"Config: {config_file} (the one the workers run with)"
    assert "must decide: UANN, UBEN" in next(
        line for line in beside.stdout.splitlines() if runs["C703"].run_id in line
    )

    # One read with another config says the workers run with a different one.
    other = stack.workdir / "other.toml"
    other.write_text('[approvals]\napprovers = ["UZED"]\n')
    mismatch = subprocess.run(
        [sys.executable, "-m", "workers", "status"],
        env={**bare_env, "HARNESS_CONFIG": str(other)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert mismatch.stdout.splitlines()[0] == (
        f"Config: {other.resolve()} (HARNESS_CONFIG); the workers run with {config_file}"
    )


# --- the deep health check --------------------------------------------------------------------------


def test_the_deep_health_check_says_503_with_no_worker_and_200_with_one(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    url = redis_server.url.rsplit("/", 1)[0] + "/8"
    redis.Redis.from_url(url).flushdb()
    with FakeSlackAPI(bot_token=BOT_TOKEN) as slack, FakeMessagesAPI() as model:
        bare = Stack(url, slack, model, tmp_path, config=CONFIG)
        try:
            bare.start_bot()
            status, body = get(bare, "/healthz?deep=1")
            assert status == 503, body
            report = json.loads(body)
            assert report["ok"] is False and report["workers_alive"] == 0 and report["redis"] == "ok"
            assert get(bare, "/healthz")[0] == 200  # the cheap check asks Redis only

            worker = bare.start_worker()
            status, body = get(bare, "/healthz?deep=1")
            assert status == 200, body
            report = json.loads(body)
            assert report["workers_alive"] == 1 and report["queue"] == {
                "name": "harness",
                "depth": 0,
                "scheduled": 0,
                "failed_jobs": 0,
            }
            [alive] = report["workers"]
            assert alive["pid"] in {worker.proc.pid, *(p for p in _children(worker.proc.pid))}
            assert 0 <= alive["seconds_since_heartbeat"] < 60

            # RQ registers a worker before it handles SIGTERM: stop it once it waits for jobs.
            wait_until(lambda: json.loads(get(bare, "/healthz?deep=1")[1])["workers"][0]["state"] == "idle")
            worker.stop()  # a warm shutdown unregisters it at once
            assert get(bare, "/healthz?deep=1")[0] == 503
        finally:
            bare.stop()


def _children(pid: int) -> list[int]:
    from tests.stack import descendants

    return descendants(pid)
