"""Approval receipts (`harness.receipts`): what one says, who can check it, and what it refuses; and a
module tool that gets its call's receipt in a real run (the loop against the stand-in Messages API)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import jwt
import pytest

from harness import receipts
from harness.config import ConfigError, load_config
from harness.loop import AwaitingApproval, Finished, drive
from harness.policy import Tier
from harness.receipts import How, Minter, RunFacts, Signer, audience_key, verify
from harness.state import Decision, GrantUse, PendingCall, Verdict, new_run, record_decisions
from harness.tools import ToolContext
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
from tests.harness.test_tool_modules import Write, catalog
from tests.harness.test_tool_modules import write_module as write_module  # a fixture

MASTER = "m" * 24 + "-receipts-master-key-for-tests"
NOW = 1_700_000_000.0  # in the past: a standard library checks `iat` by its own clock
FACTS = RunFacts(run="run-1", requester="U0REQ", team="T0TEAM", channel="C0CHAN")
APPROVED = Decision(Verdict.APPROVED, by="U0ANN")


def minted(
    call: PendingCall,
    arguments: dict[str, Any] | None = None,
    *,
    signer: Signer | None = None,
    audience: str = "mcp:tickets",
) -> str:
    mint = Minter(signer or Signer(MASTER), FACTS, lambda _name: audience, lambda: NOW)
    token = mint(call, call.input if arguments is None else arguments)
    assert token is not None
    return token


def ask(
    name: str = "tickets__open", decision: Decision | None = APPROVED, tier: Tier = Tier.ASK, why: str = ""
) -> PendingCall:
    return PendingCall("toolu_1", name, {"title": "disk full", "priority": 2}, tier, decision, why=why)


def part(token: str, index: int) -> dict[str, Any]:
    piece = token.split(".")[index]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(piece + "=" * (-len(piece) % 4)))
    return decoded


def forged(token: str, **claims: Any) -> str:
    """`token` with its claims changed and its signature kept."""
    header, _, signature = token.split(".")
    body = json.dumps({**part(token, 1), **claims}).encode()
    return ".".join((header, base64.urlsafe_b64encode(body).decode().rstrip("="), signature))


# --- what a receipt says ---------------------------------------------------------------------------


def test_an_approved_call_s_receipt_names_the_approver_the_arguments_hash_and_a_short_expiry() -> None:
    token = minted(ask())
    header, claims = part(token, 0), part(token, 1)

    assert header == {"alg": "HS256", "typ": "approval-receipt+jwt"}
    canonical = '{"priority":2,"title":"disk full"}'  # sorted keys, no spaces: the documented form
    assert claims["input_sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert (claims["iss"], claims["aud"], claims["sub"], claims["how"]) == (
        "slack-harness",
        "mcp:tickets",
        "tickets__open",
        "approved",
    )
    assert claims["approvers"] == ["U0ANN"] and claims["fp"] == ask().fingerprint
    assert (claims["requester"], claims["team"], claims["channel"]) == ("U0REQ", "T0TEAM", "C0CHAN")
    assert (claims["run"], claims["call"]) == ("run-1", "toolu_1")
    assert (claims["iat"], claims["exp"]) == (int(NOW), int(NOW) + 300)
    assert "edited" not in claims
    assert part(minted(ask()), 1)["jti"] != claims["jti"]  # every receipt is another


def test_a_quorum_s_receipt_names_every_approver_and_an_edit_is_hashed_as_it_runs() -> None:
    quorum = Decision(Verdict.APPROVED, by="U0BOB", approvers=("U0ANN", "U0BOB"))
    assert part(minted(ask(decision=quorum)), 1)["approvers"] == ["U0ANN", "U0BOB"]

    edited = {"title": "disk full on db-2", "priority": 1}
    call = ask(decision=Decision(Verdict.APPROVED, by="U0ANN", edited_input=edited))
    claims = part(minted(call, edited), 1)
    assert claims["edited"] is True
    assert claims["input_sha256"] == receipts.input_sha256(edited) != receipts.input_sha256(call.input)


@pytest.mark.parametrize(
    ("call", "how", "approvers"),
    [
        (ask(decision=Decision(Verdict.APPROVED, by="U0ANN", grant=GrantUse.USED)), How.GRANT, ["U0ANN"]),
        (ask(decision=Decision(Verdict.APPROVED, by="U0ANN", grant=GrantUse.GIVEN)), How.APPROVED, ["U0ANN"]),
        (ask(decision=None, tier=Tier.ALLOW, why="policy.tools.tickets__open"), How.ALLOW, []),
        (ask(decision=None, tier=Tier.ALLOW, why="own tier (get_time reads only)"), How.ALLOW, []),
        (
            ask(decision=None, tier=Tier.ALLOW, why='policy.rules[1] (tool = "tickets__*", title = "disk*")'),
            How.RULE,
            [],
        ),
    ],
)
def test_a_grant_and_an_allow_tier_call_carry_a_receipt_that_says_so(
    call: PendingCall, how: How, approvers: list[str]
) -> None:
    claims = part(minted(call), 1)
    assert (claims["how"], claims["approvers"], claims["why"]) == (how.value, approvers, call.why)


def test_a_built_in_tool_gets_no_receipt() -> None:
    mint = Minter(Signer(MASTER), FACTS, lambda _name: None, lambda: NOW)
    assert mint(ask("write_file"), {"path": "x"}) is None


# --- who can check it, and what is refused ---------------------------------------------------------


def test_a_receipt_verifies_with_the_master_key_and_with_its_audience_s_key_alone() -> None:
    token = minted(ask())
    checked = verify(token, MASTER, NOW + 10, arguments={"priority": 2, "title": "disk full"})
    assert checked.valid and checked.claims is not None and checked.claims["how"] == "approved"

    # A service in any language: a standard JWT library and the key `receipt-key mcp:tickets` prints.
    key = audience_key(MASTER, "mcp:tickets")
    assert len(key) == 64 and MASTER not in key
    claims = jwt.decode(
        token,
        key,
        algorithms=["HS256"],
        audience="mcp:tickets",
        issuer="slack-harness",
        options={"verify_exp": False},
    )
    assert claims["sub"] == "tickets__open"


def test_one_service_s_key_can_neither_check_nor_make_another_s_receipts() -> None:
    token = minted(ask(), audience="mcp:tickets")
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token, audience_key(MASTER, "mcp:mail"), algorithms=["HS256"], audience="mcp:tickets")
    # A receipt the mail server makes for the tickets server with its own key does not hold.
    fake = jwt.encode(part(token, 1), audience_key(MASTER, "mcp:mail"), "HS256", part(token, 0))
    assert verify(fake, MASTER, NOW).problem == receipts.texts.RECEIPT_BAD_SIGNATURE
    # Nor does one that names the mail server as its audience to borrow the mail server's key.
    moved = forged(token, aud="mcp:mail")
    assert not verify(moved, MASTER, NOW).valid and verify(moved, MASTER, NOW).claims is None


@pytest.mark.parametrize(
    "change",
    [{"approvers": ["U0EVE"]}, {"input_sha256": "0" * 64}, {"exp": int(NOW) + 86_400}, {"how": "approved"}],
)
def test_a_changed_claim_breaks_the_signature(change: dict[str, Any]) -> None:
    token = minted(ask(decision=None, tier=Tier.ALLOW, why="policy.default"))
    checked = verify(forged(token, **change), MASTER, NOW)
    assert (checked.valid, checked.claims, checked.problem) == (
        False,
        None,
        receipts.texts.RECEIPT_BAD_SIGNATURE,
    )


def test_another_key_breaks_the_signature() -> None:
    checked = verify(minted(ask()), "another-master-key-of-32-characters!!", NOW)
    assert not checked.valid and checked.claims is None and "invalid signature" in checked.problem


def test_an_expired_receipt_is_told_apart_from_a_forged_one() -> None:
    token = minted(ask())
    assert verify(token, MASTER, NOW + 299).valid
    late = verify(token, MASTER, NOW + 300 + 41)
    assert (late.valid, late.expired) == (False, True)
    assert late.claims is not None and late.claims["approvers"] == ["U0ANN"]  # the signature held
    assert late.problem == "expired 41 s ago (the signature is valid)"


def test_a_receipt_for_other_arguments_is_refused_naming_both_hashes() -> None:
    other = {"title": "disk full", "priority": 1}
    checked = verify(minted(ask()), MASTER, NOW, arguments=other)
    assert not checked.valid and not checked.expired
    assert receipts.input_sha256(other) in checked.problem and "not the ones approved" in checked.problem


def test_a_key_id_is_carried_and_a_receipt_of_another_key_id_is_named() -> None:
    token = minted(ask(), signer=Signer(MASTER, key_id="2026-q3"))
    assert part(token, 0)["kid"] == "2026-q3"
    assert verify(token, MASTER, NOW, key_id="2026-q3").valid
    other = verify(token, MASTER, NOW, key_id="2026-q4")
    assert not other.valid and "'2026-q3'" in other.problem and "'2026-q4'" in other.problem


@pytest.mark.parametrize("token", ["", "not-a-jwt", "a.b.c"])
def test_what_is_not_a_receipt_says_so(token: str) -> None:
    checked = verify(token, MASTER, NOW)
    assert not checked.valid and checked.problem.startswith("not a receipt")


def test_a_jwt_of_another_kind_or_algorithm_is_not_taken_for_a_receipt() -> None:
    claims = part(minted(ask()), 1)
    key = audience_key(MASTER, "mcp:tickets")
    plain = jwt.encode(claims, key, "HS256")  # typ JWT: some other token signed with the same key
    assert "not an approval receipt" in verify(plain, MASTER, NOW).problem
    unsigned = jwt.encode(claims, None, "none", {"typ": receipts.TYPE})
    assert "not an approval receipt" in verify(unsigned, MASTER, NOW).problem


# --- the key ---------------------------------------------------------------------------------------


def test_the_key_comes_from_the_environment_and_never_shows() -> None:
    assert Signer.from_env({}) is None
    signer = Signer.from_env({"HARNESS_RECEIPT_KEY": MASTER, "HARNESS_RECEIPT_KEY_ID": "k1"})
    assert signer is not None and signer.key_id == "k1"
    assert MASTER not in repr(signer) and MASTER not in repr(ToolContext(Path("."), receipt="x"))
    with pytest.raises(ConfigError, match="at least 32 characters"):
        Signer.from_env({"HARNESS_RECEIPT_KEY": "short"})


def test_a_server_may_not_be_handed_the_receipts_key(tmp_path: Path) -> None:
    path = tmp_path / "harness.toml"
    path.write_text('[[mcp.servers]]\nname = "desk"\ncommand = "x"\nenv = { K = "${HARNESS_RECEIPT_KEY}" }\n')
    config = load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"mcp.servers\[desk\].env.K uses \$\{HARNESS_RECEIPT_KEY\}"):
        config.resolved_servers({"HARNESS_RECEIPT_KEY": MASTER})


# --- a module tool gets its receipt in a real run ---------------------------------------------------

CHECKER = '''
import json
from typing import Annotated

from pydantic import Field

from harness.tools import ToolContext, tool


@tool()
def open_ticket(ctx: ToolContext, title: Annotated[str, Field(description="What is wrong")]) -> str:
    """Open a ticket; hands its receipt on, as a tool would to the service it calls."""
    with open(ctx.workspace / "receipts.jsonl", "a") as handle:
        handle.write(json.dumps({"title": title, "receipt": ctx.receipt}) + "\\n")
    return "T-1"
'''


def received(workspace: Path) -> list[dict[str, Any]]:
    lines = (workspace / "receipts.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture
def ticket_agent(model: FakeMessagesAPI, workspace: Path, tmp_path: Path, write_module: Write) -> Any:  # noqa: F811
    write_module("ops_receipts", CHECKER)
    tools = catalog(tmp_path, "[tools]\nmodules = ['ops_receipts']\n")
    agent = make_agent(model, workspace, tools=tools.registry())
    mint = Minter(Signer(MASTER), FACTS, tools.audience, lambda: NOW)
    from dataclasses import replace

    return replace(agent, receipt=mint)


def test_a_module_tool_approved_on_its_card_gets_a_receipt_naming_the_approver(
    model: FakeMessagesAPI, workspace: Path, ticket_agent: Any
) -> None:
    model.script(reply(tool_use("open_ticket", {"title": "disk full"}, id="toolu_t")), reply(text("done")))
    parked, outcome = drive(new_run("open a ticket"), ticket_agent, lambda e: None)
    assert isinstance(outcome, AwaitingApproval)

    decided = record_decisions(parked, {"toolu_t": Decision(Verdict.APPROVED, by="U0ANN")})
    state, outcome = drive(decided, ticket_agent, lambda e: None)
    assert isinstance(outcome, Finished)

    (got,) = received(workspace)
    checked = verify(got["receipt"], MASTER, NOW + 1, arguments={"title": "disk full"})
    assert checked.valid and checked.claims is not None
    assert (checked.claims["aud"], checked.claims["sub"], checked.claims["how"]) == (
        "module:ops_receipts",
        "open_ticket",
        "approved",
    )
    assert (checked.claims["approvers"], checked.claims["call"]) == (["U0ANN"], "toolu_t")
    # Made as the call ran, for the tool alone: never in the state, nor sent to the model.
    assert got["receipt"] not in state.dumps()
    sent = json.dumps(model.requests)
    assert got["receipt"] not in sent and MASTER not in sent


def test_an_edited_call_s_receipt_is_for_the_arguments_it_ran_with(
    model: FakeMessagesAPI, workspace: Path, ticket_agent: Any
) -> None:
    model.script(reply(tool_use("open_ticket", {"title": "disk"}, id="toolu_t")), reply(text("done")))
    parked, _ = drive(new_run("open a ticket"), ticket_agent, lambda e: None)
    edit = Decision(Verdict.APPROVED, by="U0ANN", edited_input={"title": "disk full on db-2"})
    drive(record_decisions(parked, {"toolu_t": edit}), ticket_agent, lambda e: None)

    (got,) = received(workspace)
    assert got["title"] == "disk full on db-2"
    assert verify(got["receipt"], MASTER, NOW, arguments={"title": "disk full on db-2"}).valid
    assert not verify(got["receipt"], MASTER, NOW, arguments={"title": "disk"}).valid


def test_an_allowed_module_call_s_receipt_says_allow(
    model: FakeMessagesAPI, workspace: Path, ticket_agent: Any
) -> None:
    from dataclasses import replace

    from harness.policy import Policy

    agent = replace(ticket_agent, policy=Policy(tools={"open_ticket": Tier.ALLOW}))
    model.script(reply(tool_use("open_ticket", {"title": "disk full"})), reply(text("done")))
    _, outcome = drive(new_run("open a ticket"), agent, lambda e: None)
    assert isinstance(outcome, Finished)
    claims = verify(received(workspace)[0]["receipt"], MASTER, NOW).claims
    assert claims is not None and (claims["how"], claims["approvers"]) == ("allow", [])
    assert claims["why"] == "policy.tools.open_ticket"


def test_without_a_key_a_module_tool_gets_none(
    model: FakeMessagesAPI, workspace: Path, ticket_agent: Any
) -> None:
    from dataclasses import replace

    agent = replace(ticket_agent, receipt=None)
    model.script(reply(tool_use("open_ticket", {"title": "x"}, id="toolu_t")), reply(text("done")))
    parked, _ = drive(new_run("open a ticket"), agent, lambda e: None)
    drive(record_decisions(parked, {"toolu_t": APPROVED}), agent, lambda e: None)
    assert received(workspace)[0]["receipt"] is None
