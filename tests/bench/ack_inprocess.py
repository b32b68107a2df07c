"""CPU per ack without the HTTP server: one app's WSGI callable driven in this process.

    python -m tests.bench.ack_inprocess ours|ours-without-eyes|peer [COUNT]

Prints one JSON object: {"app", "count", "cpu_ms" (this process, every thread, per ack, once every
job is queued and every :eyes: made), "request_thread_ms" (the thread that answered, per ack)}.
Redis is a private redis-server; the Slack stand-in runs in another process, so its CPU is not
counted. No gunicorn, no sockets for the requests: what is left is what the app itself costs, and
the figures move far less with a busy machine than the HTTP benchmark's.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis

from tests.bench.bench_ack import UNCAPPED
from tests.fakes.signing import event_body, signed_headers
from tests.fakes.slack_api import FakeSlackAPI
from tests.stack import ROOT, SIGNING_SECRET, RedisServer, wait_until

WARMUP = 300
Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class AnyMessage(FakeSlackAPI):
    """The Slack stand-in, taking a reaction to any message (this benchmark posts none first)."""

    def _find_message(self, channel: str, ts: str) -> dict[str, Any] | None:
        return {"channel": channel, "ts": ts}


def serve_slack() -> None:
    """`--slack`: run the stand-in until stdin closes; its base URL is the first line out."""
    with AnyMessage(bot_token="xoxb-test") as slack:
        print(slack.base_url, flush=True)
        sys.stdin.read()


EYES_MADE = [0]  # :eyes: calls `ours` has finished (counted on its after-answer threads)
EYES_LOCK = threading.Lock()


def build(app: str, env: dict[str, str]) -> Wsgi:
    logging.basicConfig(stream=io.StringIO(), level=logging.INFO)  # lines are made, not kept
    if app == "peer":
        from slack_bolt.adapter.wsgi import SlackRequestHandler

        from tests.bench.plain_bolt_app import create_app

        return SlackRequestHandler(create_app(env))  # type: ignore[return-value]
    import bot.app
    import bot.listeners.mentions
    import bot.listening
    from bot.web import wsgi_app
    from harness.config import load_config
    from runtime.clients import redis_connection, slack_client
    from runtime.queue import make_queue
    from store import Store

    if app == "ours-without-eyes":
        bot.listeners.mentions.acknowledge_visibly = lambda body, context, client: None  # type: ignore[assignment]
    else:
        acknowledge = bot.listeners.mentions.acknowledge_visibly

        def counted(body: Any, context: Any, client: Any) -> None:
            acknowledge(body, context, client)
            with EYES_LOCK:
                EYES_MADE[0] += 1

        bot.listeners.mentions.acknowledge_visibly = counted  # type: ignore[assignment]
    logging.getLogger("slack_bolt").setLevel(logging.WARNING)  # as `python -m bot`
    conn = redis_connection(env)
    deps = bot.listening.BotDeps(store=Store(conn), queue=make_queue(conn), config=load_config(env=env))
    bolt = bot.app.create_app(deps, client=slack_client(env), signing_secret=SIGNING_SECRET)
    return wsgi_app(bolt, conn, signing_secret=SIGNING_SECRET)


def environs(prefix: str, count: int) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        event = {
            "type": "app_mention",
            "user": "UALICE",
            "text": f"<@UBOT> {prefix}{i}: say hi",
            "ts": f"1700000000.{i:06d}",
            "channel": f"C{prefix.upper()}{i:05d}",
        }
        body = event_body(event, event_id=f"Ev{prefix}{i:06d}").encode()
        signed = signed_headers(SIGNING_SECRET, body)
        out.append(
            {
                "REQUEST_METHOD": "POST",
                "PATH_INFO": "/slack/events",
                "QUERY_STRING": "",
                "SERVER_PROTOCOL": "HTTP/1.1",
                "CONTENT_TYPE": "application/json",
                "CONTENT_LENGTH": str(len(body)),
                "HTTP_X_SLACK_REQUEST_TIMESTAMP": signed["X-Slack-Request-Timestamp"],
                "HTTP_X_SLACK_SIGNATURE": signed["X-Slack-Signature"],
                "wsgi.input": io.BytesIO(body),
                "wsgi.url_scheme": "http",
            }
        )
    return out


def send(app: Wsgi, requests: list[dict[str, Any]]) -> None:
    statuses: list[str] = []
    for environ in requests:
        statuses.clear()
        answer = app(environ, lambda status, headers, exc_info=None: statuses.append(status))
        for _ in answer:
            pass
        close = getattr(answer, "close", None)
        if close:
            close()  # as a WSGI server does once the answer is sent
        assert statuses[0].startswith("200"), statuses


def measure(app_name: str, count: int) -> dict[str, Any]:
    server = RedisServer().start()
    slack = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.ack_inprocess", "--slack"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert slack.stdout is not None
        with tempfile.NamedTemporaryFile("w", suffix=".toml") as config:
            config.write(UNCAPPED)
            config.flush()
            env = {
                "SLACK_BOT_TOKEN": "xoxb-test",
                "SLACK_SIGNING_SECRET": SIGNING_SECRET,
                "SLACK_API_URL": slack.stdout.readline().strip(),
                "REDIS_URL": server.url,
                "HARNESS_CONFIG": config.name,
            }
            app = build(app_name, env)
            conn = redis.Redis.from_url(server.url)

            def settled(total: int) -> None:  # every job queued and, for ours, every :eyes: made
                wait_until(lambda: conn.llen("rq:queue:harness") >= total, 60)
                if app_name == "ours":
                    wait_until(lambda: EYES_MADE[0] >= total, 60)

            send(app, environs("warm", WARMUP))
            settled(WARMUP)
            requests = environs("run", count)
            cpu, thread = time.process_time(), time.thread_time()
            send(app, requests)
            thread = time.thread_time() - thread
            settled(WARMUP + count)
            cpu = time.process_time() - cpu  # the polls of `settled` included: a few hundred µs
        return {
            "app": app_name,
            "count": count,
            "cpu_ms": cpu / count * 1000,
            "request_thread_ms": thread / count * 1000,
        }
    finally:
        if slack.stdin:
            slack.stdin.close()
        slack.wait(10)
        server.cleanup()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--slack"]:
        serve_slack()
        return 0
    app_name = argv[0]
    count = int(argv[1]) if len(argv) > 1 else 2000
    os.environ.pop("HARNESS_CONFIG", None)
    print(json.dumps(measure(app_name, count)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
