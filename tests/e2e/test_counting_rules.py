"""Rules with memory, end to end (a real bot, a real `python -m workers`, real Redis; loopback Slack
and model): `[[policy.rules]] tool = "deploy" max_calls = 3 per = "1h" scope = "channel"` over a
`deploy` that `[policy.tools]` allows. Three deploys in a channel run at once; the fourth, in
another thread of that channel, gets a card saying 3 of 3 ran this hour here, with no grant to
lift the limit; approved, it runs and is counted. Another channel has a window of its own.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.e2e.test_approvals import action_ids, audit, call_id, cards, done, final, shown
from tests.fakes.messages_api import reply, text, tool_use
from tests.stack import ROOT, RedisServer, Stack, running_stack, wait_until

pytestmark = pytest.mark.e2e

DB = 12  # a stack lives for its module only; see tests/e2e/test_groups_escalation_home.py
CONFIG = """
[approvals]
approvers = ["UANN"]
grant_minutes = 30
[limits]
max_runs_per_user = 1000
max_runs_per_channel = 1000
[tools]
builtin = ["get_time"]
modules = ["deploy_tools"]
[[policy.rules]]
tool = "deploy"
tier = "ask"
max_calls = 3
per = "1h"
scope = "channel"
[policy.tools]
deploy = "allow"
"""
TOOLS = """
    from __future__ import annotations

    import json
    from typing import Annotated

    from pydantic import Field

    from harness.tools import ToolContext, tool


    @tool()
    def deploy(ctx: ToolContext, service: Annotated[str, Field(description="What to deploy")]) -> str:
        \"\"\"Deploy a service.\"\"\"
        with (ctx.workspace / "deploys.log").open("a", encoding="utf-8") as log:
            log.write(json.dumps({"service": service}) + "\\n")
        return f"deployed {service}"
"""


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    modules = tmp_path_factory.mktemp("modules")
    (modules / "deploy_tools.py").write_text(textwrap.dedent(TOOLS), encoding="utf-8")
    env = {"PYTHONPATH": f"{ROOT}:{modules}"}
    yield from running_stack(redis_server, tmp_path_factory.mktemp("counting"), CONFIG, DB, extra_env=env)


def deployed(stack: Stack) -> list[str]:
    log = stack.workspace / "deploys.log"
    if not log.exists():
        return []
    return [json.loads(line)["service"] for line in log.read_text(encoding="utf-8").splitlines()]


def mention(stack: Stack, marker: str, channel: str, *script: Any) -> str:
    stack.model.script_for(marker, *script)
    status, ts, _ = stack.mention(f"{marker}: please", channel=channel)
    assert status == 200
    return ts


def test_the_fourth_deploy_in_a_channel_gets_a_card_that_says_why(stack: Stack) -> None:
    channel = "C0DEPLOY1"
    three = [tool_use("deploy", {"service": s}) for s in ("web", "api", "db")]
    ts = mention(stack, "crfirst", channel, reply(*three), reply(text("crfirst done")))
    done(stack, channel, ts, "crfirst")
    assert sorted(deployed(stack)) == ["api", "db", "web"]
    assert cards(stack, channel, ts) == []

    ts = mention(
        stack,
        "crfourth",
        channel,
        reply(tool_use("deploy", {"service": "cache"})),
        reply(text("crfourth done")),
    )
    card = wait_until(lambda: next(iter(cards(stack, channel, ts)), None))
    assert "3 of at most 3 calls of `deploy` ran in the last hour in this channel" in shown(card)
    assert "Past a limit" in shown(card)
    assert {"approve", "decline"} <= action_ids(card)
    assert "approve_thread" not in action_ids(card)  # a grant would lift the limit
    stack.settled()
    assert "cache" not in deployed(stack)

    # Another channel has a window of its own: its deploy runs at once.
    other = mention(
        stack,
        "crother",
        "C0DEPLOY2",
        reply(tool_use("deploy", {"service": "elsewhere"})),
        reply(text("crother done")),
    )
    done(stack, "C0DEPLOY2", other, "crother")
    assert cards(stack, "C0DEPLOY2", other) == [] and "elsewhere" in deployed(stack)

    # A person says yes: it runs, and is counted (4 in the channel's window now).
    stack.click(card, "approve", user="UANN")
    done(stack, channel, ts, "crfourth")
    assert deployed(stack).count("cache") == 1
    (decision,) = final(audit(stack, call_id(card)))
    assert decision["verdict"] == "approved" and decision["by"] == "UANN"
    conn = redis.Redis.from_url(stack.redis_url)
    windows = [k.decode() for k in conn.keys("harness:meter:*")]  # type: ignore[union-attr]
    here = [k for k in windows if k.endswith(f":channel:T1:{channel}")]
    assert len(here) == 1 and conn.zcard(here[0]) == 4 and conn.ttl(here[0]) > 3600
