"""`python -m playground`: the playground's page, Slack stand-in and demo model on 127.0.0.1:$PORT.

`make run` (`python -m launch.local`) starts it, with the bot and a worker, when no Slack settings
are given; run alone it needs what `launch.local` hands it: ``PLAYGROUND_BOT_URL`` (the bot's
``/slack/events``), ``SLACK_SIGNING_SECRET`` and ``SLACK_BOT_TOKEN`` (the bot's, which it checks),
``PLAYGROUND_DEMO_MODEL=1`` to answer as the offline demo model (``PLAYGROUND_MODEL=demo`` when it
was asked for, not for want of a key: the label then says how to leave it), ``PORT`` (3000) and
``HOST`` (127.0.0.1; a loopback address only, see `playground.bind_problem`).

The page labels the model the workers talk to: the demo model, or the name of the model the config
gives them (``HARNESS_MODEL`` winning over its ``model.name``). Never a key: `launch.local` gives
this process none.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping

from harness.config import ConfigError, load_config
from observe import logs, ports
from playground import bind_problem, url_host
from playground.bot_client import Bot
from playground.profiles import GROUPS, HANDLES, describe
from playground.server import Playground, Server
from playground.slack import CHANNEL_ID, CHANNELS, PEOPLE, Workspace

DEMO_LABEL = "Offline demo model: scripted replies, not Claude. Set ANTHROPIC_API_KEY to use Claude."
FORCED_DEMO_LABEL = (
    "Offline demo model (PLAYGROUND_MODEL=demo): scripted replies, not Claude. Unset it to use Claude."
)
MODEL_LABEL = "Model: {model}"


def model_label(env: Mapping[str, str], model: str) -> str:
    """What the page's banner says of the model: the demo model and how to leave it, or `model`'s name."""
    if env.get("PLAYGROUND_DEMO_MODEL") != "1":
        return MODEL_LABEL.format(model=model)
    return FORCED_DEMO_LABEL if env.get("PLAYGROUND_MODEL", "").strip() == "demo" else DEMO_LABEL


def main(env: Mapping[str, str] = os.environ) -> int:
    logs.configure()  # text, or JSON lines with LOG_FORMAT=json
    missing = [n for n in ("PLAYGROUND_BOT_URL", "SLACK_SIGNING_SECRET", "SLACK_BOT_TOKEN") if not env.get(n)]
    if missing:
        print(f"error: {', '.join(missing)} not set: start the playground with `make run`", file=sys.stderr)
        return 2
    host, port = env.get("HOST") or "127.0.0.1", int(env.get("PORT") or 3000)
    problem = bind_problem(host, port)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        config = load_config(env=env)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    base_url = f"http://{url_host(host)}:{port}/"
    demo = env.get("PLAYGROUND_DEMO_MODEL") == "1"
    profiles = describe(config, CHANNELS, PEOPLE)
    playground = Playground(
        workspace=Workspace(token=env["SLACK_BOT_TOKEN"], usergroups=GROUPS, handles=HANDLES),
        bot=Bot(env["PLAYGROUND_BOT_URL"], env["SLACK_SIGNING_SECRET"]),
        base_url=base_url,
        demo=demo,
        model_label=model_label(env, config.model),
        notes=profiles[CHANNEL_ID]["notes"],
        profiles=profiles,
    )
    playground.workspace.upload_base = f"{base_url}upload/"
    try:
        server = Server((host, port), playground)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            print(ports.taken_line("the playground", host, port), file=sys.stderr)
        else:
            print(
                f"error: the playground cannot listen on {host}:{port} ({exc.strerror}): set PORT",
                file=sys.stderr,
            )
        return 2
    playground.deliveries.watch_start()  # the page says the bot is starting until it answers
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    logging.getLogger(__name__).info("the playground is at %s", base_url)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.stopping = True
        playground.deliveries.stop()
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
