"""`python -m bot`: HTTP mode on gunicorn by default; Socket Mode when SLACK_APP_TOKEN is set."""

from __future__ import annotations

import logging
import os
import sys

import redis
from slack_sdk.errors import SlackApiError

from bot import socket_mode
from bot.app import BotDeps, create_app
from bot.web import serve, wsgi_app
from harness.config import ConfigError, load_config
from workers.services import SettingsError, make_queue, redis_connection, slack_client
from workers.store import Store

MISSING_SIGNING_SECRET = (
    "SLACK_SIGNING_SECRET is not set: copy the Signing Secret from your app's Basic Information "
    "page at https://api.slack.com/apps (or set SLACK_APP_TOKEN to use Socket Mode instead)"
)


def main() -> int:
    """Check settings, build the app (auth.test runs here, not in Slack's 3 s window), serve."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("slack_bolt").setLevel(logging.WARNING)  # it logs whole bodies at INFO
    env = os.environ
    app_token = env.get("SLACK_APP_TOKEN")
    signing_secret = env.get("SLACK_SIGNING_SECRET")
    try:
        config = load_config()
        client = slack_client()
        if not app_token and not signing_secret:
            raise SettingsError(MISSING_SIGNING_SECRET)
    except (ConfigError, SettingsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    connection = redis_connection()
    deps = BotDeps(store=Store(connection), queue=make_queue(connection), config=config)
    try:
        app = create_app(deps, client=client, signing_secret=signing_secret)
    except SlackApiError as exc:
        print(f"error: Slack refused SLACK_BOT_TOKEN ({exc.response.get('error')})", file=sys.stderr)
        return 2
    if app_token:
        try:
            socket_mode.serve(app, app_token)
        except SlackApiError as exc:
            print(f"error: Slack refused SLACK_APP_TOKEN ({exc.response.get('error')})", file=sys.stderr)
            return 2
        return 0
    assert signing_secret  # checked above: HTTP mode needs it
    try:
        connection.ping()
    except redis.RedisError as exc:
        logging.getLogger(__name__).warning("Redis does not answer yet (%s); /healthz says so", exc)
    workers = int(env.get("WEB_CONCURRENCY") or 2 * (os.cpu_count() or 1))
    serve(
        wsgi_app(app, connection, signing_secret=signing_secret),
        int(env.get("PORT") or 3000),
        workers=workers,
        threads=4,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
