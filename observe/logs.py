"""Log lines of every process: readable text by default, one JSON object per line with LOG_FORMAT=json.

Every line logged while a run is being driven (or while the bot handles a mention or a click about
one) names the run: its id, team, channel and thread, from a context variable that the driver and
the bot's listeners set and clear (`bound`, `enter`/`leave`). A context variable, not a global: a
bot process handles several requests at once on its threads, and each sees only its own.

The known secrets of the process (Slack tokens and signing secret, the Anthropic key, the receipts'
key, the Redis password in REDIS_URL) are replaced by `***` in every line, whatever logged them: nothing logs
them on purpose, and this makes sure a library's error message cannot either.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import urlsplit

# The context fields, in the order a text line shows them.
FIELDS = ("run_id", "team", "channel", "thread_ts")
SECRET_SETTINGS = (
    "SLACK_BOT_TOKEN",
    "SLACK_SIGNING_SECRET",
    "SLACK_APP_TOKEN",
    "ANTHROPIC_API_KEY",
    "HARNESS_RECEIPT_KEY",
)
MIN_SECRET_CHARS = 6  # shorter values would blank out ordinary words; no real secret is that short
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_context: ContextVar[Mapping[str, str] | None] = ContextVar("harness_log_context", default=None)

Fields = Mapping[str, str]


def json_mode(env: Mapping[str, str] | None = None) -> bool:
    """Whether LOG_FORMAT asks for one JSON object per line."""
    env = os.environ if env is None else env
    return (env.get("LOG_FORMAT") or "").strip().lower() == "json"


def current() -> dict[str, str]:
    """The run fields of the lines logged here and now."""
    return dict(_context.get() or {})


def enter(**fields: str | None) -> Token[Mapping[str, str] | None]:
    """Add `fields` (those not None or empty) to the context; `leave(token)` restores it."""
    merged = {**(_context.get() or {}), **{k: str(v) for k, v in fields.items() if k in FIELDS and v}}
    return _context.set(merged)


def leave(token: Token[Mapping[str, str] | None]) -> None:
    _context.reset(token)


@contextlib.contextmanager
def bound(**fields: str | None) -> Iterator[None]:
    """Lines logged inside the block carry `fields` (run_id, team, channel, thread_ts)."""
    token = enter(**fields)
    try:
        yield
    finally:
        leave(token)


def run_fields(record: Any) -> dict[str, str]:
    """The context fields of a run record (anything with run_id, team, channel, thread_ts)."""
    return {name: str(getattr(record, name, "") or "") for name in FIELDS}


def secrets_of(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The secret values of this process's settings that a log line must never show."""
    env = os.environ if env is None else env
    found = [env.get(name) or "" for name in SECRET_SETTINGS]
    with contextlib.suppress(ValueError):  # an unparsable URL has no password to hide
        found.append(urlsplit(env.get("REDIS_URL") or "").password or "")
    # Longest first, so a secret that contains another is replaced whole.
    return tuple(sorted({s for s in found if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True))


class ContextFilter(logging.Filter):
    """Stamps every record with the run fields of the context it was logged in (on a handler, so
    records of every logger that reach it get them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "harness_context"):
            record.harness_context = current()
        return True


class _Redacting(logging.Formatter):
    def __init__(self, fmt: str | None = None, *, secrets: tuple[str, ...] = ()) -> None:
        super().__init__(fmt)
        self.secrets = secrets

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, "***")
        return text


class TextFormatter(_Redacting):
    """The readable default: `time LEVEL logger: message [run_id=… team=… channel=… thread_ts=…]`."""

    def __init__(self, *, secrets: tuple[str, ...] = ()) -> None:
        super().__init__(TEXT_FORMAT, secrets=secrets)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "harness_context", None) or {}
        if fields:
            tags = " ".join(f"{k}={fields[k]}" for k in FIELDS if k in fields)
            head, sep, rest = line.partition("\n")  # after the message, before a traceback
            line = f"{head} [{tags}]{sep}{rest}"
        return self.redact(line)


class JsonFormatter(_Redacting):
    """One JSON object per line: time, level, logger, message, the run fields, and exception text.

    ASCII-only JSON: a message holding U+2028 or a newline still makes exactly one line.
    """

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update(getattr(record, "harness_context", None) or {})
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            data["exception"] = record.exc_text
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        return self.redact(json.dumps(data, ensure_ascii=True, default=str))


def formatter(env: Mapping[str, str] | None = None) -> logging.Formatter:
    """The formatter LOG_FORMAT asks for, redacting this environment's secrets."""
    secrets = secrets_of(env)
    return JsonFormatter(secrets=secrets) if json_mode(env) else TextFormatter(secrets=secrets)


def configure(level: int = logging.INFO, *, stream: TextIO | None = None) -> logging.Handler:
    """Send every logger's lines to stderr (or `stream`) in the format LOG_FORMAT asks for.

    Replaces the root logger's handlers, so calling it again (a forked process, a test) never
    doubles lines. RQ's loggers find this handler and add none of their own.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler


def restyle(logger: logging.Logger) -> None:
    """Give the handlers a library set up on `logger` (gunicorn's) this process's format, in JSON mode."""
    if not json_mode():
        return
    for handler in logger.handlers:
        handler.setFormatter(formatter())
        handler.addFilter(ContextFilter())


def bind(**fields: str | None) -> None:
    """Add `fields` to the context until the enclosing `bound` block (or `enter`) is left."""
    enter(**fields)


_RUN_ID = re.compile(r"[0-9a-f]{32}")


def slack_fields(body: Any) -> dict[str, str]:
    """The context fields a Slack request names: its team, channel and thread, and for a button or
    a modal of ours the run its value names (`run…:…`). Ill-typed fields are left out."""
    if not isinstance(body, dict):
        return {}
    parts = ("event", "message", "container", "channel")
    event, message, container, channel = (_dict(body.get(k)) for k in parts)
    actions = body.get("actions")
    action = _dict(actions[0]) if isinstance(actions, list) and actions else {}
    value = action.get("value") or _dict(body.get("view")).get("private_metadata")
    run_id = value.split(":", 1)[0] if isinstance(value, str) else ""
    found = {
        "team": body.get("team_id") or _dict(body.get("team")).get("id"),
        "channel": event.get("channel")
        or _dict(body.get("channel")).get("id")
        or container.get("channel_id"),
        "thread_ts": event.get("thread_ts")
        or event.get("ts")
        or message.get("thread_ts")
        or message.get("ts")
        or container.get("thread_ts"),
        "run_id": run_id if _RUN_ID.fullmatch(run_id) else None,
    }
    return {k: v for k, v in found.items() if isinstance(v, str) and v}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_json_line(process: str, line: str) -> str:
    """One line of a child process as a JSON object naming the `process`: its own JSON object with
    that field added, or (any other line: a banner, a crash's traceback) an object holding it."""
    try:
        entry = json.loads(line)
    except ValueError:
        entry = None
    if not isinstance(entry, dict):
        now = datetime.now(UTC).isoformat(timespec="milliseconds")
        entry = {"time": now, "level": "INFO", "logger": process, "message": line}
    return json.dumps({"process": process, **entry}, ensure_ascii=True)
