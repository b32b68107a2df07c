"""The Bolt app: Slack events and button clicks in, Redis writes and RQ jobs out.

`create_app` reads as the list of surfaces; each registers its own listeners (`bot.listeners`),
and what they share (dependencies, how a listener runs, the reply after) is `bot.listening`.
"""

from __future__ import annotations

import functools
import logging

from slack_bolt import App
from slack_bolt.logger.messages import warning_client_prioritized_and_token_skipped
from slack_sdk import WebClient

from bot.listeners import approvals, assistant, batches, home, inputs, mentions, modals, runs
from bot.listening import BotDeps, listener
from bot.web import bolt_error_handler

SURFACES = (mentions, approvals, batches, modals, inputs, runs, home, assistant)


def _same_token_not_a_warning(record: logging.LogRecord) -> bool:
    """Bolt reads SLACK_BOT_TOKEN itself and warns that it goes unused when given a `client`: the
    client was built from that same token, so every normal start would warn about nothing."""
    return record.getMessage() != warning_client_prioritized_and_token_skipped()


def create_app(
    deps: BotDeps, *, client: WebClient, signing_secret: str | None, token_verification: bool = True
) -> App:
    """The Bolt app with every listener registered; `client` is the Web API client on SLACK_API_URL."""
    bolt_log = logging.getLogger("slack_bolt.App")
    bolt_log.addFilter(_same_token_not_a_warning)
    app = App(
        client=client,
        signing_secret=signing_secret,
        process_before_response=True,
        token_verification_enabled=token_verification,
        logger=bolt_log,
    )
    app.error(bolt_error_handler)  # 400 for what a retry cannot cure; 500 only when Redis is down
    deps.groups.bind(client)
    then = functools.partial(listener, deps, client)
    for surface in SURFACES:
        surface.register(app, deps, then)
    return app
