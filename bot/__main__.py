"""`python -m bot`: HTTP mode on gunicorn by default; Socket Mode when SLACK_APP_TOKEN is set.
`python -m bot --version` prints the release and exits, reading no setting."""

from __future__ import annotations

import argparse
import logging
import os
import sys

import redis
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot import socket_mode
from bot.access import OperatorAccess
from bot.app import create_app
from bot.listening import BotDeps
from bot.web import serve, wsgi_app
from gates import approvers_from
from harness import release
from harness.config import ConfigError, load_config
from messages import text
from observe import logs, metrics, ports
from runtime.clients import SettingsError, redis_connection, slack_client
from runtime.connection import RedisTarget
from runtime.queue import make_queue
from runtime.reload import LiveConfig, reload

MISSING_SIGNING_SECRET = (
    "SLACK_SIGNING_SECRET is not set: copy the Signing Secret from your app's Basic Information "
    "page at https://api.slack.com/apps (or set SLACK_APP_TOKEN to use Socket Mode instead)"
)


# Bot scopes the bot cannot work without, and those whose absence only costs a feature.
REQUIRED_SCOPES = ("app_mentions:read", "chat:write", "reactions:write")
USEFUL_SCOPES = {
    "channels:history": "after a worker crash a run may repeat its last post in a public channel",
    "groups:history": "after a worker crash a run may repeat its last post in a private channel",
    "usergroups:read": "a user group (S…) in approvers or escalate_to will have no members",
    "files:write": "an answer too long for a message is cut instead of coming whole as a file",
    "im:history": "a direct message to the bot (or the assistant pane) starts nothing",
    "assistant:write": "the assistant pane suggests no prompts and its threads show no status line",
}


def _check_token(client: WebClient) -> str | None:
    """`auth.test` before anything else: None, or why the bot cannot start, in one line.

    Bolt would make the same call in its constructor, but its failures are a traceback (or a
    `BoltError` with the whole response) after several log lines of retries. Slack names the
    token's scopes in the `x-oauth-scopes` header of every answer: a missing one the bot needs is
    a reason not to start, one that only costs a feature a warning.
    """
    quiet = logging.getLogger("slack_sdk")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the retry handler logs each attempt; the one line below says it all
    try:
        reply = client.auth_test()
    except SlackApiError as exc:
        return _refused(str(exc.response.get("error")))
    except OSError as exc:  # urllib's URLError and socket errors: Slack could not be reached at all
        return _unreachable(client.base_url, exc)
    finally:
        quiet.setLevel(level)
    headers = {str(k).lower(): str(v) for k, v in (reply.headers or {}).items()}
    if "x-oauth-scopes" not in headers:
        return None  # a proxy or stand-in that does not say: the first call that needs a scope will
    granted = {scope.strip() for scope in headers["x-oauth-scopes"].split(",")}
    missing = [scope for scope in REQUIRED_SCOPES if scope not in granted]
    if missing:
        return _refused("missing_scope", detail=", ".join(missing))
    for scope, cost in USEFUL_SCOPES.items():
        if scope not in granted:
            logging.getLogger(__name__).warning("the app lacks the %s scope: %s", scope, cost)
    return None


def _refused(error: str, detail: str = "") -> str:
    """Why Slack refused the bot token at start, and what to do, in one line."""
    hints = {
        "invalid_auth": "SLACK_BOT_TOKEN is not a valid token: copy the Bot User OAuth Token (xoxb-…)",
        "not_authed": "SLACK_BOT_TOKEN is empty: copy the Bot User OAuth Token (xoxb-…)",
        "account_inactive": "the app's token was revoked or its workspace deleted: reinstall the app",
        "token_revoked": "SLACK_BOT_TOKEN was revoked: reinstall the app and copy the new token",
        "missing_scope": "the app lacks a scope it needs: paste manifest.yml (or manifest.socket.yml) "
        "again under App Manifest and reinstall the app",
    }
    hint = hints.get(error, "check SLACK_BOT_TOKEN")
    what = f"{error}: {detail}" if detail else error
    return f"Slack refused SLACK_BOT_TOKEN ({what}): {hint} (https://api.slack.com/apps)"


def _unreachable(base_url: str, exc: OSError) -> str:
    reason = getattr(exc, "reason", None) or exc
    return (
        f"cannot reach Slack at {base_url} ({reason}): check the network or proxy, or SLACK_API_URL; "
        "the token is checked with auth.test at start"
    )


def _reload(live: LiveConfig) -> bool:
    """SIGHUP: the new config swapped in once every `approvers_from` callable it names is imported;
    one that cannot be keeps the running config (one line says why)."""
    return reload(approvers_from.check_config, live.swap)


def main(argv: list[str] | None = None) -> int:
    """Check settings and Redis (exit 2 and one line when one is wrong), build the app (auth.test runs
    here, not in Slack's 3 s window), serve. `--version` (and `--help`) answer before any of that."""
    parser = argparse.ArgumentParser(
        prog="python -m bot",
        description="The Bolt app: HTTP mode on $PORT, or Socket Mode when SLACK_APP_TOKEN is set. "
        "Its settings come from the environment (docs/configuration.md).",
    )
    parser.add_argument("--version", action="version", version=release.line())
    parser.parse_args(argv)
    logs.configure()  # text, or JSON lines with LOG_FORMAT=json
    logging.getLogger("slack_bolt").setLevel(logging.WARNING)  # it logs whole bodies at INFO
    env = os.environ
    app_token = env.get("SLACK_APP_TOKEN")
    signing_secret = env.get("SLACK_SIGNING_SECRET")
    port = int(env.get("PORT") or 3000)
    try:
        config = approvers_from.check_config(load_config())  # its callables imported: fail fast
        client = slack_client()
        if not app_token and not signing_secret:
            raise SettingsError(MISSING_SIGNING_SECRET)
        operators = OperatorAccess.from_env(env, bot_port=port)
        connection = redis_connection()
    except (ConfigError, SettingsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problem = _check_token(client)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:  # a Redis that never answers would only show as /healthz 503, request after request
        connection.ping()
    except redis.RedisError as exc:
        print(f"error: cannot reach Redis at {RedisTarget.from_env().describe()} ({exc})", file=sys.stderr)
        return 2
    if warning := RedisTarget.from_env().open_warning():
        print(warning, file=sys.stderr)
    live = LiveConfig(config)  # SIGHUP reads HARNESS_CONFIG again (runtime.reload)
    store = metrics.counting_store(connection)
    deps = BotDeps(store=store, queue=make_queue(connection), config=live)
    try:
        app = create_app(deps, client=client, signing_secret=signing_secret)
    except SlackApiError as exc:
        print(f"error: {_refused(str(exc.response.get('error')))}", file=sys.stderr)
        return 2
    text.warm()  # before gunicorn forks: no worker's first card or click pays for it
    if app_token:
        try:
            socket_mode.serve(app, app_token, on_reload=lambda: _reload(live))
        except SlackApiError as exc:
            print(f"error: Slack refused SLACK_APP_TOKEN ({exc.response.get('error')})", file=sys.stderr)
            return 2
        return 0
    assert signing_secret  # checked above: HTTP mode needs it
    workers = int(env.get("WEB_CONCURRENCY") or 2 * (os.cpu_count() or 1))
    host = env.get("HOST") or "0.0.0.0"  # `make run` sets 127.0.0.1: a laptop's bot is not a server
    metrics_listener = ((env.get("METRICS_HOST") or host, operators.port),) if operators.port else ()
    for listen_host, listen_port in ((host, port), *metrics_listener):
        if ports.taken(listen_host, listen_port):  # gunicorn would retry 5 s, then blame itself
            print(ports.taken_line("the bot", listen_host, listen_port), file=sys.stderr)
            return 2
    serve(
        wsgi_app(
            app, connection, signing_secret=signing_secret, operators=operators, config=lambda: live.current
        ),
        port,
        host=host,
        workers=workers,
        threads=4,
        also=metrics_listener,
        on_reload=lambda: _reload(live),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
