"""The Slack clients of the bot and the workers: one TLS context per process, certificates checked."""

from __future__ import annotations

import ssl

from gates.deciders import GroupDirectory
from runtime.clients import slack_client

ENV = {"SLACK_BOT_TOKEN": "xoxb-test", "SLACK_API_URL": "https://slack.example/api/"}


def test_every_slack_client_shares_one_tls_context_that_checks_certificates() -> None:
    # Without a context of its own, each HTTPS call of a WebClient loads the CA bundle again.
    first, second = slack_client(ENV), slack_client(ENV)
    groups = GroupDirectory()
    groups.bind(first)
    assert isinstance(first.ssl, ssl.SSLContext)
    assert first.ssl is second.ssl is groups._client.ssl  # type: ignore[union-attr]
    assert first.ssl.verify_mode is ssl.CERT_REQUIRED and first.ssl.check_hostname
