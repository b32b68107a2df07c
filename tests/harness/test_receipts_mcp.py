"""An MCP call carries its approval receipt in `_meta` (`io.github.slack-harness/approval-receipt`),
straight from the hub and across the relay from a work horse; the real stdio server behind its walls
(`tests/fakes/mcp_moving_server.py`) checks it with PyJWT and its own audience key, as a downstream
service would, and never sees the harness's key."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.config import load_config
from harness.loop import AwaitingApproval, Finished, drive
from harness.policy import Policy, Tier
from harness.receipts import META_KEY, Minter, RunFacts, Signer, audience_key, claims_of, verify
from harness.state import Decision, PendingCall, Verdict, new_run, record_decisions
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from harness.tools.relay import RelayServer
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.mcp_support import calls, moving_table

MASTER = "receipts-master-key-for-the-mcp-tests-0123456789"
FACTS = RunFacts(run="run-9", requester="U0REQ", team="T0TEAM", channel="C0CHAN")
ANN = Decision(Verdict.APPROVED, by="U0ANN")


def signed(name: str, arguments: dict[str, Any], audience: str) -> str:
    """A receipt made as the worker makes one, for a call of `name` that U0ANN approved."""
    call = PendingCall("toolu_r", name, arguments, Tier.ASK, ANN)
    return Signer(MASTER).sign(claims_of(call, arguments, audience, FACTS, time.time()))


@pytest.fixture
def desk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[McpHub, Catalog, Path]]:
    """The moving server, given only its own audience's key; the process holds the master key."""
    monkeypatch.setenv("HARNESS_RECEIPT_KEY", MASTER)
    (tmp_path / "server").mkdir()
    log = tmp_path / "server" / "calls.jsonl"
    table = moving_table(log).replace("env = {", 'env = { RECEIPT_KEY = "${MOVING_RECEIPT_KEY}",', 1)
    config_path = tmp_path / "harness.toml"
    config_path.write_text(table)
    config = load_config(config_path, env={"HARNESS_WORKSPACE": str(tmp_path)})
    environ = {"MOVING_RECEIPT_KEY": audience_key(MASTER, "mcp:moving")}
    with McpHub(config.resolved_servers(environ)) as hub:
        yield hub, Catalog.from_config(config, host=hub), log


def noted(log: Path, text: str) -> dict[str, Any]:
    (found,) = [c for c in calls(log) if c["tool"] == "note" and c.get("text") == text]
    return found


def agent_on(model: FakeMessagesAPI, workspace: Path, catalog: Catalog, **policy: str) -> Any:
    agent = make_agent(model, workspace, tools=catalog.registry())
    mint = Minter(Signer(MASTER), FACTS, catalog.audience, time.time)
    tiers = {name: Tier(tier) for name, tier in policy.items()}
    return replace(agent, receipt=mint, policy=Policy(tools=tiers) if tiers else agent.policy)


def test_an_approved_mcp_call_carries_a_receipt_the_server_checks_with_its_own_key(
    model: FakeMessagesAPI, workspace: Path, desk: tuple[McpHub, Catalog, Path]
) -> None:
    _, catalog, log = desk
    agent = agent_on(model, workspace, catalog)
    model.script(reply(tool_use("moving__note", {"text": "ship it"}, id="toolu_n")), reply(text("done")))
    parked, outcome = drive(new_run("note it"), agent, lambda e: None)
    assert isinstance(outcome, AwaitingApproval)
    decision = Decision(Verdict.APPROVED, by="U0BOB", approvers=("U0ANN", "U0BOB"))
    state, outcome = drive(record_decisions(parked, {"toolu_n": decision}), agent, lambda e: None)
    assert isinstance(outcome, Finished)

    got = noted(log, "ship it")
    assert got["receipt"]["matches"] is True, got["receipt"]
    claims = got["receipt"]["claims"]
    assert (claims["sub"], claims["aud"], claims["how"]) == ("moving__note", "mcp:moving", "approved")
    assert (claims["approvers"], claims["requester"], claims["call"]) == (
        ["U0ANN", "U0BOB"],
        "U0REQ",
        "toolu_n",
    )
    token = got["meta"][META_KEY]
    assert verify(token, MASTER, claims["iat"], arguments={"text": "ship it"}).valid
    # The server's environment holds its own key, not the harness's; nothing of the run keeps the receipt.
    assert "HARNESS_RECEIPT_KEY" not in got["environ"] and "RECEIPT_KEY" in got["environ"]
    assert MASTER not in log.read_text()
    assert token not in state.dumps() and token not in json.dumps(model.requests)


def test_an_allowed_mcp_call_s_receipt_says_allow(
    model: FakeMessagesAPI, workspace: Path, desk: tuple[McpHub, Catalog, Path]
) -> None:
    _, catalog, log = desk
    agent = agent_on(model, workspace, catalog, moving__note="allow")
    model.script(reply(tool_use("moving__note", {"text": "fyi"})), reply(text("done")))
    _, outcome = drive(new_run("note it"), agent, lambda e: None)
    assert isinstance(outcome, Finished)
    receipt = noted(log, "fyi")["receipt"]
    assert receipt["matches"] is True
    assert (receipt["claims"]["how"], receipt["claims"]["approvers"]) == ("allow", [])


def test_a_receipt_crosses_the_relay_from_a_work_horse(desk: tuple[McpHub, Catalog, Path]) -> None:
    hub, _, log = desk
    token = signed("moving__note", {"text": "relayed"}, "mcp:moving")
    relay = RelayServer(hub).start()
    try:
        assert not relay.client().call("moving", "note", {"text": "relayed"}, True, receipt=token).is_error
    finally:
        relay.close()
    got = noted(log, "relayed")
    assert got["meta"][META_KEY] == token
    assert got["receipt"]["matches"] is True and got["receipt"]["claims"]["approvers"] == ["U0ANN"]


def test_a_call_without_a_receipt_carries_none_and_a_server_s_check_says_so(
    desk: tuple[McpHub, Catalog, Path],
) -> None:
    hub, _, log = desk
    assert not hub.call("moving", "note", {"text": "bare"}, True).is_error
    got = noted(log, "bare")
    assert META_KEY not in (got["meta"] or {}) and got["receipt"] == {"error": "no receipt"}


def test_a_receipt_for_another_server_fails_the_server_s_check(desk: tuple[McpHub, Catalog, Path]) -> None:
    hub, _, log = desk
    token = signed("mail__send", {"text": "borrowed"}, "mcp:mail")
    assert not hub.call("moving", "note", {"text": "borrowed"}, True, receipt=token).is_error
    assert "InvalidSignatureError" in noted(log, "borrowed")["receipt"]["error"]
