"""observe.logs: JSON lines (LOG_FORMAT=json) or readable text, the run's fields from the context,
known secrets masked. The processes' own output is checked end to end in test_operations.py."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from observe import logs


@pytest.fixture
def capture() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    """A logger of its own whose lines go to a string, through the handler `configure` would set up."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.ContextFilter())
    logger = logging.getLogger(f"test.logs.{id(stream)}")
    logger.propagate, logger.level = False, logging.DEBUG
    logger.addHandler(handler)
    yield logger, stream, handler
    logger.removeHandler(handler)


def test_log_format_json_picks_json_lines_and_anything_else_readable_text() -> None:
    assert isinstance(logs.formatter({"LOG_FORMAT": "json"}), logs.JsonFormatter)
    assert isinstance(logs.formatter({"LOG_FORMAT": " JSON "}), logs.JsonFormatter)
    assert isinstance(logs.formatter({}), logs.TextFormatter)
    assert isinstance(logs.formatter({"LOG_FORMAT": "text"}), logs.TextFormatter)


def test_a_json_line_is_one_object_with_time_level_logger_message_and_the_exception(
    capture: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, handler = capture
    handler.setFormatter(logs.JsonFormatter())
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("a message\nthat spans\u2028lines: %s", "é")
    lines = stream.getvalue().splitlines()  # splitlines also splits on U+2028: still one line
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["level"] == "ERROR" and entry["logger"] == logger.name
    assert entry["message"] == "a message\nthat spans\u2028lines: é"
    assert entry["time"].endswith("+00:00") and "T" in entry["time"]
    assert "ValueError: boom" in entry["exception"] and "Traceback" in entry["exception"]
    assert not {"run_id", "team", "channel", "thread_ts"} & set(entry)  # logged outside any run


def test_lines_logged_inside_a_bound_block_name_the_run_and_the_next_ones_do_not(
    capture: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, handler = capture
    handler.setFormatter(logs.JsonFormatter())
    run = {"run_id": "a" * 32, "team": "T1", "channel": "C1", "thread_ts": "1.2"}
    with logs.bound(**run):
        logger.info("inside")
        with logs.bound(channel="C2"):
            logger.info("nested")
        seen_in_thread: list[dict[str, str]] = []
        worker = threading.Thread(target=lambda: seen_in_thread.append(logs.current()))
        worker.start()
        worker.join()
    logger.info("after")
    inside, nested, after = (json.loads(line) for line in stream.getvalue().splitlines())
    assert {k: inside[k] for k in run} == run
    assert nested["channel"] == "C2" and nested["run_id"] == run["run_id"]
    assert not {"run_id", "team", "channel", "thread_ts"} & set(after)
    assert seen_in_thread == [{}]  # another thread has its own context: no borrowed run


def test_a_text_line_shows_the_run_after_the_message_and_before_a_traceback(
    capture: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    logger, stream, handler = capture
    handler.setFormatter(logs.TextFormatter())
    with logs.bound(run_id="b" * 32, team="T1", channel="C1", thread_ts="1.2"):
        try:
            raise KeyError("k")
        except KeyError:
            logger.exception("it failed")
    first, *rest = stream.getvalue().splitlines()
    assert first.endswith(
        f"ERROR {logger.name}: it failed [run_id={'b' * 32} team=T1 channel=C1 thread_ts=1.2]"
    )
    assert rest[0].startswith("Traceback")


@pytest.mark.parametrize("kind", [logs.JsonFormatter, logs.TextFormatter])
def test_the_processs_secrets_are_masked_in_every_line_whatever_logged_them(
    capture: tuple[logging.Logger, io.StringIO, logging.Handler], kind: type[logs.JsonFormatter]
) -> None:
    env = {
        "SLACK_BOT_TOKEN": "xoxb-123-secret",
        "SLACK_SIGNING_SECRET": "sign-me-secret",
        "ANTHROPIC_API_KEY": "sk-ant-very-secret",
        "REDIS_URL": "redis://user:redis-pass-secret@127.0.0.1:6379/0",
        "SLACK_APP_TOKEN": "xapp",  # too short to be a secret: masking it would blank out words
    }
    logger, stream, handler = capture
    handler.setFormatter(kind(secrets=logs.secrets_of(env)))
    logger.warning("token %s key %s", env["SLACK_BOT_TOKEN"], env["ANTHROPIC_API_KEY"])
    try:
        raise RuntimeError(f"cannot connect to {env['REDIS_URL']} signed {env['SLACK_SIGNING_SECRET']}")
    except RuntimeError:
        logger.exception("xapp stays readable")
    out = stream.getvalue()
    for secret in ("xoxb-123-secret", "sign-me-secret", "sk-ant-very-secret", "redis-pass-secret"):
        assert secret not in out
    assert out.count("***") == 4
    assert "xapp stays readable" in out


def test_a_slack_body_names_its_team_channel_thread_and_the_run_of_a_button() -> None:
    run_id = "c" * 32
    click = {
        "type": "block_actions",
        "team": {"id": "T1"},
        "channel": {"id": "C9"},
        "message": {"ts": "5.6", "thread_ts": "1.2"},
        "actions": [{"action_id": "approve", "value": f"{run_id}:toolu_1:0123456789abcdef"}],
    }
    assert logs.slack_fields(click) == {"team": "T1", "channel": "C9", "thread_ts": "1.2", "run_id": run_id}
    mention = {"team_id": "T1", "event": {"type": "app_mention", "channel": "C3", "ts": "7.8"}}
    assert logs.slack_fields(mention) == {"team": "T1", "channel": "C3", "thread_ts": "7.8"}
    forged = {"team": ["T1"], "channel": "C1", "actions": [{"value": "not-a-run:x"}]}
    assert logs.slack_fields(forged) == {}
    assert logs.slack_fields("not a body") == {}


def test_workers_dev_with_log_format_json_writes_every_childs_line_as_json_naming_it() -> None:
    from launch.children import PrefixedOutput

    stream = io.StringIO()
    output = PrefixedOutput(stream, json_lines=True)
    entry = {"time": "t", "level": "WARNING", "logger": "workers.jobs", "message": "m"}
    child_line = json.dumps(entry)
    output.say("worker", child_line + "\n")
    output.say("redis", "12:M 01 Jan 2026 * Ready to accept connections tcp\r\n")
    output.say("dev", "started web (pid 42)")
    worker, redis_line, dev = (json.loads(line) for line in stream.getvalue().splitlines())
    assert worker == {
        "process": "worker",
        "time": "t",
        "level": "WARNING",
        "logger": "workers.jobs",
        "message": "m",
    }
    assert redis_line["process"] == "redis" and redis_line["message"].endswith(
        "Ready to accept connections tcp"
    )
    assert dev["process"] == "dev" and dev["message"] == "started web (pid 42)" and dev["level"] == "INFO"

    text = io.StringIO()
    PrefixedOutput(text, json_lines=False).say("worker", child_line)
    assert text.getvalue() == f"worker | {child_line}\n"  # the default stays the prefixed text
