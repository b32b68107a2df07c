"""`python -m bot` with its :eyes: reaction replaced by nothing: how the ack benchmark tells what
that one Slack call costs, in the same server as ours and the peer."""

from __future__ import annotations

import bot.listeners.mentions
from bot.__main__ import main

if __name__ == "__main__":
    bot.listeners.mentions.acknowledge_visibly = lambda body, context, client: None  # type: ignore[assignment]
    raise SystemExit(main())
