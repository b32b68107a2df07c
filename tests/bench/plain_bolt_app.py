"""The peer of the ack benchmark: the app a Bolt user would write instead of ours.

    python -m tests.bench.plain_bolt_app

A Bolt `App` with Bolt's defaults (the listener runs on Bolt's thread pool after the 200), one
`app_mention` listener that enqueues an RQ job with `JSONSerializer`, and nothing else: no dedup
of Slack's retries, no per-user or per-channel caps, no transaction, no reaction, no metrics. It
reads the same environment as `python -m bot` (SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET,
SLACK_API_URL, REDIS_URL, PORT, WEB_CONCURRENCY) and is served by the same gunicorn settings
(`bot.web.serve`: worker processes × 4 threads, gthread, the access log) through Bolt's own WSGI
adapter, the one `bot/web.py` builds on.
"""

from __future__ import annotations

import os
from typing import Any

from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer
from slack_bolt import App
from slack_bolt.adapter.wsgi import SlackRequestHandler
from slack_sdk import WebClient

from bot.web import serve

JOB = "tests.bench.plain_bolt_app.handle_mention"


def handle_mention(team: str, channel: str, ts: str, user: str, text: str) -> None:
    """The job (never run by the benchmark: the jobs stay queued)."""


def create_app(env: dict[str, str] | os._Environ[str]) -> App:
    client = WebClient(token=env["SLACK_BOT_TOKEN"], base_url=env["SLACK_API_URL"])
    app = App(client=client, signing_secret=env["SLACK_SIGNING_SECRET"])  # auth.test happens here
    queue = Queue("harness", connection=Redis.from_url(env["REDIS_URL"]), serializer=JSONSerializer)

    @app.event("app_mention")
    def on_mention(body: dict[str, Any], event: dict[str, Any]) -> None:
        thread_ts = event.get("thread_ts") or event["ts"]
        queue.enqueue(JOB, body["team_id"], event["channel"], thread_ts, event["user"], event["text"])

    return app


def main() -> int:
    env = os.environ
    workers = int(env.get("WEB_CONCURRENCY") or 2 * (os.cpu_count() or 1))  # as `python -m bot`
    handler = SlackRequestHandler(create_app(env))
    serve(handler, int(env["PORT"]), host=env.get("HOST") or "0.0.0.0", workers=workers, threads=4)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
