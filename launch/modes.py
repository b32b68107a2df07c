"""Slack or the playground: which one `make run` runs (no Slack setting at all: the playground),
what each needs set, and the environments the playground gives its three processes.

Apart from `launch.local`, which starts whatever was chosen: the choice and its settings (which
keys reach which child, the demo model's stand-in key) are read here on their own.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from launch.children import POLL_INTERVAL, Child, DevError, free_port
from playground import url_host

SLACK_SETTINGS = ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN")
PLAYGROUND_PORT = 3000
ROOT = Path(__file__).resolve().parents[1]
PLAYGROUND_CONFIG = ROOT / "playground" / "config.toml"
PLAYGROUND_START_TIMEOUT = 15.0
BOT_START_TIMEOUT = 60.0
SLACK_APPS = "https://api.slack.com/apps"
MISSING_BOT_TOKEN = (
    "SLACK_BOT_TOKEN is not set: export it with your bot token (xoxb-…) from the "
    f'"OAuth & Permissions" page of your app at {SLACK_APPS}'
)
MISSING_SIGNING_SECRET = (
    "SLACK_SIGNING_SECRET is not set: export it with the Signing Secret from "
    f'"Basic Information → App Credentials" of your app at {SLACK_APPS} '
    "(or set SLACK_APP_TOKEN to use Socket Mode instead)"
)
MISSING_API_KEY = (
    "ANTHROPIC_API_KEY is not set: export it with an API key from https://console.anthropic.com/settings/keys"
)
# The model API credentials the SDK reads: kept from the playground's page process always, and from
# every child when the demo model answers (the demo endpoint is the playground's, so a real key sent
# there would reach it).
MODEL_CREDENTIALS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
DEMO_MODEL_KEY = "playground-demo-model"  # the SDK insists on a key; the demo model reads none
BAD_PLAYGROUND_MODEL = (
    "PLAYGROUND_MODEL={value}: the only value is demo (the offline demo model, even with "
    "ANTHROPIC_API_KEY set); unset it to talk to the model ANTHROPIC_API_KEY opens"
)


def wants_playground(env: Mapping[str, str]) -> bool:
    """No Slack setting at all: the playground (a half-set Slack is a mistake to report instead)."""
    return not any(env.get(name, "").strip() for name in SLACK_SETTINGS)


def wants_demo_model(env: Mapping[str, str]) -> bool:
    """The playground's offline demo model: asked for (``PLAYGROUND_MODEL=demo``), or no key to use."""
    return env.get("PLAYGROUND_MODEL", "").strip() == "demo" or not env.get("ANTHROPIC_API_KEY", "").strip()


def check_settings(env: Mapping[str, str]) -> list[str]:
    """Return one line per missing setting, naming what to set and where to get it."""
    if wants_playground(env):
        # the playground brings its own Slack, and the demo model stands in for a key
        chosen = env.get("PLAYGROUND_MODEL", "").strip()
        return [BAD_PLAYGROUND_MODEL.format(value=chosen)] if chosen not in ("", "demo") else []
    missing = []
    if not env.get("SLACK_BOT_TOKEN", "").strip():
        missing.append(MISSING_BOT_TOKEN)
    if not env.get("SLACK_SIGNING_SECRET", "").strip() and not env.get("SLACK_APP_TOKEN", "").strip():
        missing.append(MISSING_SIGNING_SECRET)
    if not env.get("ANTHROPIC_API_KEY", "").strip():
        missing.append(MISSING_API_KEY)
    return missing


def playground_envs(env: Mapping[str, str]) -> tuple[dict[str, dict[str, str]], str]:
    """The environment of each child in the playground, and the page's address.

    The playground listens on ``$PORT`` (3000) and the bot on a free port behind it; all three
    share a bot token and signing secret made for this start. Without ``ANTHROPIC_API_KEY``, or
    with ``PLAYGROUND_MODEL=demo``, the worker's SDK talks to the playground's offline demo model
    with a dummy key: the real key and token reach no child. The playground's own process never
    gets them (it shows the model's name, never a key). Without ``HARNESS_CONFIG`` the
    playground's own settings give the demo users their roles. ``PLAYGROUND_PYTHON_BIN`` (the
    folder of this Python) and ``PLAYGROUND_ROOT`` (this project) are what those settings start
    the playground's own MCP server with.
    """
    host = env.get("HOST") or "127.0.0.1"  # a loopback address: `prepare` refuses any other
    port = int(env.get("PORT") or PLAYGROUND_PORT)
    page = f"http://{url_host(host)}:{port}/"
    bot_port = free_port()
    common = dict(env)
    common.update(
        SLACK_BOT_TOKEN=f"xoxb-playground-{secrets.token_hex(16)}",
        SLACK_SIGNING_SECRET=secrets.token_hex(32),
        SLACK_API_URL=f"{page}api/",
    )
    common.setdefault("HARNESS_CONFIG", str(PLAYGROUND_CONFIG))
    # What the playground's config starts its own MCP server with (`rooms`): this Python, this project.
    common.update({"PLAYGROUND_PYTHON_BIN": os.path.dirname(sys.executable), "PLAYGROUND_ROOT": str(ROOT)})
    if wants_demo_model(env):
        for name in MODEL_CREDENTIALS:
            common.pop(name, None)
        common.update(
            ANTHROPIC_API_KEY=DEMO_MODEL_KEY,
            ANTHROPIC_BASE_URL=f"{page}model",
            PLAYGROUND_DEMO_MODEL="1",
        )
    else:
        common.pop("PLAYGROUND_DEMO_MODEL", None)  # the page would call Claude's answers the demo's
    web = {**common, "PORT": str(bot_port), "HOST": "127.0.0.1"}
    playground = {
        **{k: v for k, v in common.items() if k not in MODEL_CREDENTIALS},
        "PORT": str(port),
        "HOST": host,
        "PLAYGROUND_BOT_URL": f"http://127.0.0.1:{bot_port}/slack/events",
    }
    return {"playground": playground, "web": web, "worker": common}, page


def wait_until_healthy(
    child: Child, url: str, stop: threading.Event, timeout: float = PLAYGROUND_START_TIMEOUT
) -> None:
    """Wait until `child` answers ``GET {url}healthz`` with 200: the playground before the bot starts
    (the bot checks its token against it), the bot before the page is worth opening.

    Asking over HTTP, not just connecting, so that another program on the same port is not taken
    for the child.
    """
    proc = child.proc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None and not stop.is_set():
        try:
            with urllib.request.urlopen(f"{url}healthz", timeout=1.0) as answer:
                if answer.status == 200:
                    return
        except (OSError, ValueError):
            pass
        stop.wait(POLL_INTERVAL)
    if proc.poll() is not None:
        raise DevError(f"{child.name} exited (code {proc.returncode}); see its output above")
    if not stop.is_set():
        raise DevError(
            f"{child.name} did not answer at {url}healthz within {timeout:g} s; see its output above"
        )
