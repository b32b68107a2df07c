"""`python -m workers audit verify-receipt` and `receipt-key` (`ops.receipts`): what they print and
their exit codes (0 valid, 1 not valid, 2 not checkable); and the key's place in the logs."""

from __future__ import annotations

import io
import json
import logging
import sys
import time
from typing import Any

import pytest

from harness.policy import Tier
from harness.receipts import RunFacts, Signer, audience_key, claims_of
from harness.state import Decision, PendingCall, Verdict
from observe import logs
from ops import receipts as receipts_cli
from workers.process.main import main

MASTER = "receipts-master-key-for-the-cli-tests-0123456789"
FACTS = RunFacts(run="run-3", requester="U0REQ", team="T0TEAM", channel="C0CHAN")
ARGS = {"title": "disk full", "priority": 2}


def receipt(at: float | None = None, key_id: str | None = None) -> str:
    call = PendingCall("toolu_c", "tickets__open", ARGS, Tier.ASK, Decision(Verdict.APPROVED, by="U0ANN"))
    claims = claims_of(call, ARGS, "mcp:tickets", FACTS, time.time() if at is None else at)
    return Signer(MASTER, key_id).sign(claims)


@pytest.fixture(autouse=True)
def _logging_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """`main` in this process would point the root logger at the stderr pytest captures for one
    test; later tests' threads (an MCP hub's) would then write to it closed."""
    monkeypatch.setattr("workers.process.main.logs.configure", lambda *args, **kwargs: None)


def verify_receipt(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str, key: str | None = MASTER
) -> tuple[int, str, str]:
    if key is None:
        monkeypatch.delenv("HARNESS_RECEIPT_KEY", raising=False)
    else:
        monkeypatch.setenv("HARNESS_RECEIPT_KEY", key)
    code = main(["audit", "verify-receipt", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_valid_receipt_exits_0_saying_whose_approval_and_printing_its_claims(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = verify_receipt(capsys, monkeypatch, receipt(), "--args", json.dumps(ARGS))
    first, rest = out.split("\n", 1)
    assert code == 0
    assert first.startswith(
        "valid: a receipt for tickets__open (mcp:tickets), approved by U0ANN; it expires in"
    )
    claims = json.loads(rest)
    assert (claims["approvers"], claims["run"], claims["call"]) == (["U0ANN"], "run-3", "toolu_c")


def test_an_expired_receipt_exits_1_saying_its_signature_is_valid(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = verify_receipt(capsys, monkeypatch, receipt(at=time.time() - 3600))
    first, rest = out.split("\n", 1)
    assert code == 1
    assert first.startswith("not valid: expired ") and first.endswith(" s ago (the signature is valid)")
    assert json.loads(rest)["approvers"] == ["U0ANN"]


def test_a_forged_receipt_exits_1_and_prints_no_claims(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = verify_receipt(
        capsys, monkeypatch, receipt(), key="some-other-key-of-enough-characters-0123"
    )
    assert code == 1
    assert out == "not valid: invalid signature: not signed with this key, or changed since it was signed\n"


def test_a_receipt_for_other_arguments_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = verify_receipt(
        capsys, monkeypatch, receipt(), "--args", '{"title": "disk full", "priority": 1}'
    )
    assert code == 1 and out.startswith("not valid: the arguments given are not the ones approved")


@pytest.mark.parametrize(
    ("argv", "key", "error"),
    [
        (("TOKEN",), None, "error: HARNESS_RECEIPT_KEY is not set"),
        (("TOKEN", "--args", "{title"), MASTER, "error: --args is not JSON"),
        (("",), MASTER, "error: no receipt given"),
    ],
)
def test_what_cannot_be_checked_exits_2_on_stderr(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
    key: str | None,
    error: str,
) -> None:
    code, out, err = verify_receipt(capsys, monkeypatch, *argv, key=key)
    assert (code, out) == (2, "") and err.startswith(error)


def test_receipt_key_prints_an_audience_s_key_never_the_master(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARNESS_RECEIPT_KEY", MASTER)
    assert main(["audit", "receipt-key", "mcp:tickets"]) == 0
    out = capsys.readouterr().out
    assert out == audience_key(MASTER, "mcp:tickets") + "\n" and MASTER not in out
    assert main(["audit", "receipt-key", "tickets"]) == 2
    assert "an audience is mcp:SERVER or module:MODULE" in capsys.readouterr().err


def test_the_command_reads_a_receipt_from_standard_input(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(receipt() + "\n"))
    code, out, err = verify_receipt(capsys, monkeypatch, "-", "--args", json.dumps(ARGS))
    assert code == 0, err
    assert out.startswith("valid: a receipt for tickets__open") and MASTER not in out + err


def test_a_key_id_other_than_the_receipt_s_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    args: Any = type(
        "Args", (), {"audit_command": "verify-receipt", "token": receipt(key_id="old"), "args": None}
    )
    env = {"HARNESS_RECEIPT_KEY": MASTER, "HARNESS_RECEIPT_KEY_ID": "new"}
    assert receipts_cli.run(args, env=env, out=out) == 1
    assert "signed with key id 'old', not with this key ('new')" in out.getvalue()


def test_the_key_is_blanked_in_every_log_line_and_the_worker_says_whether_receipts_are_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert MASTER in logs.secrets_of({"HARNESS_RECEIPT_KEY": MASTER})
    formatter = logs.formatter({"HARNESS_RECEIPT_KEY": MASTER})
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "a library said %s", (MASTER,), None)
    assert MASTER not in formatter.format(record) and "***" in formatter.format(record)

    with caplog.at_level(logging.INFO, logger="ops.receipts"):
        receipts_cli.announce(None)
        receipts_cli.announce(Signer(MASTER, "2026-q3"))
    assert [r.getMessage() for r in caplog.records] == [
        "approval receipts are off: HARNESS_RECEIPT_KEY is not set, so tools get no receipt",
        "approval receipts are on: every module or MCP tool call gets one (key id 2026-q3)",
    ]
