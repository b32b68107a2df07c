"""Which model the playground's runs talk to, as the page says it: the demo model, forced or for want
of a key, or Claude's model by name. A real key reaches neither the page nor, with the demo model
forced, any process `make run` starts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.playground_support import ALICE, Page, Running, playground

pytestmark = pytest.mark.e2e

REAL_KEY = "sk-ant-api03-the-real-key-0b3f9c"
FOOTER = "That took"


def environ(running: Running, name: str) -> dict[str, str]:
    """The environment `make run` gave its child `name` (web, worker or playground), read from /proc."""
    pid = re.search(rf"started {name} \(pid (\d+)\)", running.output())
    assert pid, running.output()
    raw = Path(f"/proc/{pid[1]}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if "=" in entry)


def test_playground_model_demo_forces_the_demo_model_and_the_key_reaches_no_process(
    redis_url: str, tmp_path: Path
) -> None:
    forced = playground(
        redis_url,
        tmp_path,
        cwd=tmp_path,
        ANTHROPIC_API_KEY=REAL_KEY,
        ANTHROPIC_AUTH_TOKEN=REAL_KEY,
        PLAYGROUND_MODEL="demo",
    )
    with forced as running:
        page = Page(running.url)
        model = page.state()["model"]
        assert model["demo"] is True and "PLAYGROUND_MODEL=demo" in model["label"]

        ts = page.mention(ALICE, "list the files forever")  # runs at once: no approval to wait for
        stopped = page.wait_text(ts, FOOTER)
        assert "for no progress" in stopped["text"]  # the demo model's loop, stopped by the valve

        for name in ("playground", "web", "worker"):
            env = environ(running, name)
            assert REAL_KEY not in "\0".join(env.values()), name
            if name != "playground":
                assert env["ANTHROPIC_BASE_URL"] == running.url + "model"
        assert "ANTHROPIC_API_KEY" not in environ(running, "playground")
        assert REAL_KEY not in str(page.state()) + str(page.request("GET", "play/channels")[1])
        assert REAL_KEY not in running.output()


def test_with_a_key_the_page_names_the_model_and_never_the_key(redis_url: str, tmp_path: Path) -> None:
    started = playground(
        redis_url, tmp_path, cwd=tmp_path, ANTHROPIC_API_KEY=REAL_KEY, HARNESS_MODEL="claude-test-model-7"
    )
    with started as running:
        page = Page(running.url)
        assert page.state()["model"] == {"demo": False, "label": "Model: claude-test-model-7"}
        status, channels = page.request("GET", "play/channels")
        assert status == 200 and {c["model"] for c in channels["channels"]} == {"claude-test-model-7"}
        # the demo model does not answer: the workers talk to the real API with the real key
        status, _ = page.request("POST", "model/v1/messages", {"model": "x", "max_tokens": 1, "messages": []})
        assert status == 404
        assert environ(running, "worker")["ANTHROPIC_API_KEY"] == REAL_KEY
        assert "ANTHROPIC_BASE_URL" not in environ(running, "worker")
        play = environ(running, "playground")
        assert "ANTHROPIC_API_KEY" not in play and "PLAYGROUND_DEMO_MODEL" not in play
        assert REAL_KEY not in str(page.state()) + str(channels)
