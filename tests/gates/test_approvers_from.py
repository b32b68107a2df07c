"""`[approvals] approvers_from`: its keys read strictly, which callable a tool gets, every callable
imported at the bot's start (one that cannot be names its key), and how a callable is asked: only
a yes passes; no, unknown, an exception, garbage and no answer in time refuse (fail closed)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gates.approvers_from import Answer, ApprovalClick, ApproverChecks, check_config, click_of
from harness.config import ConfigError, load_config
from harness.policy import PathArgs, Tier
from harness.state import ClickCheck, Decision, PendingCall, Verdict
from store import RunRecord
from tests.fakes import approver_checks

FAKES = "tests.fakes.approver_checks"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "harness.toml"
    path.write_text(text, encoding="utf-8")
    return path


# --- the config -------------------------------------------------------------------------------------


def test_the_keys_are_read_and_a_tool_gets_its_exact_entry_else_its_longest_glob_else_the_default(
    tmp_path: Path,
) -> None:
    text = (
        '[approvals]\napprovers_from = "myorg.approvers:on_call"\napprovers_from_timeout_seconds = 1.5\n'
        "[approvals.approvers_from_tools]\n"
        '"write_*" = "a.b:short"\n"write_f*" = "a.b:longer"\nwrite_file = "a.b:exact"\n"get_*" = ""\n'
    )
    approvals = load_config(write(tmp_path, text), env={}).approvals
    assert approvals.approvers_from == "myorg.approvers:on_call"
    assert approvals.approvers_from_timeout_seconds == 1.5
    assert approvals.approvers_from_for("write_file") == "a.b:exact"
    assert approvals.approvers_from_for("write_fast") == "a.b:longer"
    assert approvals.approvers_from_for("write_x") == "a.b:short"
    assert approvals.approvers_from_for("get_time") == ""  # "": none for these
    assert approvals.approvers_from_for("delete_file") == "myorg.approvers:on_call"


def test_none_by_default(tmp_path: Path) -> None:
    approvals = load_config(write(tmp_path, ""), env={}).approvals
    assert approvals.approvers_from_for("write_file") == "" and approvals.approvers_from_refs() == ()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('approvers_from = "myorg.approvers"\n', "approvals.approvers_from"),
        ('approvers_from = "myorg approvers:f"\n', "approvals.approvers_from"),
        ('approvers_from = "m:f.g"\n', "approvals.approvers_from"),
        ("approvers_from = true\n", "approvals.approvers_from"),
        ('approvers_from_tools = { write_file = "nocolon" }\n', "approvals.approvers_from_tools.write_file"),
        ("approvers_from_tools = { write_file = 3 }\n", "approvals.approvers_from_tools.write_file"),
        ('approvers_from_tools = { " " = "a:b" }\n', "approvals.approvers_from_tools"),
        ('approvers_from_tools = "a:b"\n', "approvals.approvers_from_tools"),
        ("approvers_from_timeout_seconds = 3\n", "approvals.approvers_from_timeout_seconds"),
        ("approvers_from_timeout_seconds = 0\n", "approvals.approvers_from_timeout_seconds"),
        ("approvers_from_from = 'a:b'\n", "approvals.approvers_from_from"),
    ],
)
def test_a_bad_value_stops_the_start_naming_its_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=r"[^\n]*" + key.replace(".", r"\.")) as raised:
        load_config(write(tmp_path, "[approvals]\n" + text), env={})
    assert "\n" not in str(raised.value)


def test_a_profile_replaces_each_key_it_gives_and_inherits_the_others(tmp_path: Path) -> None:
    text = (
        '[approvals]\napprovers_from = "top.level:f"\n'
        '[approvals.approvers_from_tools]\nwrite_file = "top.w:f"\n'
        '[[profiles]]\nname = "ops"\nchannels = ["C1"]\n[profiles.approvals.approvers_from_tools]\n'
        'delete_file = "ops.d:f"\n'
        '[[profiles]]\nname = "open"\nchannels = ["C2"]\n[profiles.approvals]\napprovers_from = ""\n'
    )
    config = load_config(write(tmp_path, text), env={})
    ops, open_ = config.for_run("C1").approvals, config.for_run("C2").approvals
    assert ops.approvers_from_for("delete_file") == "ops.d:f"
    assert ops.approvers_from_for("write_file") == "top.level:f"  # the profile's table replaced the top's
    assert (
        open_.approvers_from_for("delete_file") == "" and open_.approvers_from_for("write_file") == "top.w:f"
    )


def test_the_bot_imports_every_callable_at_start_and_names_the_key_of_one_it_cannot(tmp_path: Path) -> None:
    good = f'[approvals]\napprovers_from = "{FAKES}:only_ann"\n'
    assert check_config(load_config(write(tmp_path, good), env={})).approvals.approvers_from.endswith(
        "only_ann"
    )
    cases = {
        "[approvals]\napprovers_from = 'no_such_module_here:f'\n": (
            r"^approvals\.approvers_from = 'no_such_module_here:f': cannot import 'no_such_module_here': "
            "ModuleNotFoundError"
        ),
        f"[approvals.approvers_from_tools]\nwrite_file = '{FAKES}:nope'\n": (
            r"^approvals\.approvers_from_tools\.write_file = .*has no function 'nope'"
        ),
        f"[approvals]\napprovers_from = '{FAKES}:NOT_CALLABLE'\n": "has no function 'NOT_CALLABLE'",
        f"[[profiles]]\nname = 'ops'\n[profiles.approvals]\napprovers_from = '{FAKES}:gone'\n": (
            r"^profiles\[ops\]\.approvals\.approvers_from = "
        ),
    }
    for text, expected in cases.items():
        with pytest.raises(ConfigError, match=expected) as raised:
            check_config(load_config(write(tmp_path, text), env={}))
        assert "\n" not in str(raised.value)


# --- asking a callable ------------------------------------------------------------------------------

CALL = PendingCall(
    "toolu_1",
    "write_file",
    {"path": "docs/a.md", "content": "x/y"},
    Tier.ASK,
    path_args=PathArgs(("path",), ("content",)),
)
RECORD = RunRecord("r1", "T1", "C1", "1.2", "UALICE", "task")


def click(user: str = "UANN", call: PendingCall = CALL, **kw: object) -> ApprovalClick:
    return click_of(call, clicker=user, record=RECORD, workspace=Path("/ws"), **kw)  # type: ignore[arg-type]


def test_the_click_carries_the_call_as_it_would_run_and_a_copy_of_its_arguments() -> None:
    given = click("UBEN")
    assert (given.tool, given.clicker, given.requester, given.team, given.channel) == (
        "write_file",
        "UBEN",
        "UALICE",
        "T1",
        "C1",
    )
    assert given.paths == ("docs/a.md",) and not given.stray_paths and given.path_arguments == ("path",)
    assert given.edited is False and given.workspace == Path("/ws") and given.call_id == "toolu_1"
    given.arguments["path"] = "/etc/passwd"  # type: ignore[index]
    assert CALL.input["path"] == "docs/a.md"  # a callable that changes its copy changes nothing
    edited = click(edited={"path": "/etc/x", "content": "c"})
    assert edited.edited and edited.paths == ("/etc/x",)
    stray = click(
        call=PendingCall("t", "copy", {"path": "a", "to": "../b"}, Tier.ASK, path_args=PathArgs(("path",)))
    )
    assert stray.stray_paths is True
    unknown_args = click(call=PendingCall("t", "copy", {"path": "a"}, Tier.ASK))
    assert unknown_args.paths is None and unknown_args.path_arguments is None


@pytest.mark.parametrize(
    ("function", "user", "answer", "reason"),
    [
        ("only_ann", "UANN", "yes", "UANN may approve write_file <!channel> <@U999>"),
        ("only_ann", "UBEN", "no", "only UANN may approve write_file"),
        ("not_sure", "UANN", "unknown", "the rota could not be read"),
        ("raises", "UANN", "unknown", "it raised KeyError"),
        ("garbage", "UANN", "unknown", "it returned bool, not an answer"),
        ("pair", "UANN", "yes", "a pair will do"),
    ],
)
def test_a_callable_answers_and_anything_but_an_answer_is_unknown(
    function: str, user: str, answer: str, reason: str
) -> None:
    ref = f"{FAKES}:{function}"
    assert ApproverChecks().ask(ref, click(user), timeout=2) == ClickCheck(ref, answer, reason)


def test_an_exception_s_text_stays_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    check = ApproverChecks().ask(f"{FAKES}:raises", click(), timeout=2)
    assert "secret-looking" not in check.reason and "secret-looking" in caplog.text


def test_a_callable_that_hangs_is_refused_at_its_timeout_and_holds_one_of_the_places() -> None:
    approver_checks.RELEASE.clear()
    checks = ApproverChecks(most=2)
    ref = f"{FAKES}:stuck"
    try:
        first = checks.ask(ref, click(), timeout=0.05)
        assert first == ClickCheck(ref, Answer.UNKNOWN, "it gave no answer within 0.05 s")
        checks.ask(ref, click(), timeout=0.05)
        full = checks.ask(f"{FAKES}:only_ann", click(), timeout=2)  # both places held: refused at once
        assert full == ClickCheck(f"{FAKES}:only_ann", "unknown", "2 earlier checks have still not returned")
    finally:
        approver_checks.RELEASE.set()


def test_many_calls_are_asked_at_once_within_one_timeout() -> None:
    """Two that hang cost one timeout, not two: Approve all stays within Slack's 3 s."""
    approver_checks.RELEASE.clear()
    asks = [(f"{FAKES}:stuck", click()), (f"{FAKES}:only_ann", click()), (f"{FAKES}:stuck", click())]
    started = time.monotonic()
    try:
        answers = ApproverChecks().ask_all(asks, timeout=0.5)
    finally:
        approver_checks.RELEASE.set()
    assert time.monotonic() - started < 0.95  # one after the other would take at least 1 s
    assert [a.answer for a in answers] == ["unknown", "yes", "unknown"]


def test_a_module_gone_since_the_start_is_refused() -> None:
    assert ApproverChecks().ask("no_such_module_here:f", click(), 1).answer == "unknown"


def test_a_long_reason_is_cut_and_kept_on_one_line() -> None:
    from gates.approvers_from import REASON_MAX, _answer_of

    check = _answer_of("a:b", ("no", "x\n" * 500))
    assert len(check.reason) == REASON_MAX and "\n" not in check.reason


def test_the_decision_keeps_the_answer_and_reads_it_back() -> None:
    decision = Decision(Verdict.APPROVED, by="UANN", check=ClickCheck("a.b:f", "yes", "owner"))
    data = decision.to_json()
    assert data["approvers_from"] == {"function": "a.b:f", "answer": "yes", "reason": "owner"}
    assert Decision.from_json(data) == decision
    assert Decision.from_json({"verdict": "approved", "by": "U1"}).check is None  # one written before
