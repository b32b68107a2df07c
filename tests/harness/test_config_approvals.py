"""`[approvals]`: groups, four eyes, quorum, escalation and grants, strict like every other key."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config import Approvals, ConfigError, load_config

CONTRACT_APPROVALS = """
[approvals]
approvers = []         # user IDs (U…, W…) or user group IDs (S…); empty: the person who mentioned the bot
self_approval = true   # false: the requester may decline, never approve, calls of their own run
required = 1           # distinct approvals a call needs; any one decline declines it
expire_after_minutes = 1440   # a number; fractions allowed (0.05 = 3 s, for tests)
escalate_after_minutes = 0    # > 0: still undecided by then, one reminder in the thread mentions escalate_to
escalate_to = []       # user or user group IDs
grant_minutes = 0      # > 0: cards also offer "Approve for this thread" (see Slack surface)
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "harness.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_contract_example_gives_the_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, CONTRACT_APPROVALS), env={})
    assert config.approvals == Approvals()
    assert config.approvals.self_approval is True and config.approvals.required == 1
    assert config.approvals.escalate_after_minutes == 0 and config.approvals.grant_minutes == 0


def test_every_new_key_is_read(tmp_path: Path) -> None:
    text = (
        "[approvals]\napprovers = ['S0123ABCD', 'U123ABC', 'W9ZZ']\nself_approval = false\nrequired = 2\n"
        "expire_after_minutes = 30\nescalate_after_minutes = 0.5\nescalate_to = ['U777', 'S0999']\n"
        "grant_minutes = 15\n"
    )
    approvals = load_config(write(tmp_path, text), env={}).approvals
    assert approvals == Approvals(
        approvers=("S0123ABCD", "U123ABC", "W9ZZ"),
        self_approval=False,
        required=2,
        expire_after_minutes=30.0,
        escalate_after_minutes=0.5,
        escalate_to=("U777", "S0999"),
        grant_minutes=15.0,
    )
    assert isinstance(approvals.escalate_after_minutes, float) and isinstance(approvals.grant_minutes, float)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("self_approval = 'no'\n", "approvals.self_approval"),
        ("self_approval = 0\n", "approvals.self_approval"),
        ("required = 0\n", "approvals.required"),
        ("required = 1.5\n", "approvals.required"),
        ("required = true\n", "approvals.required"),
        ("required = '2'\n", "approvals.required"),
        ("escalate_after_minutes = -1\n", "approvals.escalate_after_minutes"),
        ("escalate_after_minutes = 'soon'\nescalate_to = ['U123']\n", "approvals.escalate_after_minutes"),
        ("escalate_to = 'S0123'\n", "approvals.escalate_to"),
        ("escalate_to = ['U123', '#ops']\n", "approvals.escalate_to[1]"),
        ("escalate_to = ['<!subteam^S0123>']\n", "approvals.escalate_to[0]"),
        ("escalate_to = [3]\n", "approvals.escalate_to[0]"),
        ("approvers = ['s0123']\n", "approvals.approvers[0]"),
        ("approvers = ['S0123\\n']\n", "approvals.approvers[0]"),
        ("grant_minutes = -0.5\n", "approvals.grant_minutes"),
        ("grant_minutes = false\n", "approvals.grant_minutes"),
        ("escalate_after = 5\n", "approvals.escalate_after"),
        # A reminder after the expiry, or one that mentions nobody, is a mistake worth stopping for.
        (
            "expire_after_minutes = 10\nescalate_after_minutes = 10\nescalate_to = ['U1234']\n",
            "approvals.escalate_after_minutes",
        ),
        ("escalate_after_minutes = 5\n", "approvals.escalate_to"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "[approvals]\n" + text), env={})
    message = str(info.value)
    assert key in message and "\n" not in message


def test_reminders_before_expiry_and_extensions_are_read_at_top_level_and_in_a_profile(
    tmp_path: Path,
) -> None:
    text = (
        "[approvals]\nexpire_after_minutes = 60\nremind_before_minutes = 10\nmax_extensions = 3\n"
        "[[profiles]]\nname = 'ops'\nchannels = ['C0OPS']\n[profiles.approvals]\nmax_extensions = 0\n"
    )
    config = load_config(write(tmp_path, text), env={})
    assert Approvals().remind_before_minutes == 0 and Approvals().max_extensions == 1
    assert config.approvals.remind_before_minutes == 10 and config.approvals.max_extensions == 3
    ops = config.settings("ops").approvals
    assert ops.max_extensions == 0 and ops.remind_before_minutes == 10  # the rest is inherited


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("remind_before_minutes = -1\n", "approvals.remind_before_minutes"),
        ("remind_before_minutes = 'soon'\n", "approvals.remind_before_minutes"),
        ("remind_before_minutes = true\n", "approvals.remind_before_minutes"),
        # A reminder due before the park exists would say nothing a card did not.
        ("expire_after_minutes = 10\nremind_before_minutes = 10\n", "approvals.remind_before_minutes"),
        ("expire_after_minutes = 0.1\nremind_before_minutes = 0.2\n", "approvals.remind_before_minutes"),
        ("max_extensions = -1\n", "approvals.max_extensions"),
        ("max_extensions = 1.5\n", "approvals.max_extensions"),
        ("max_extensions = false\n", "approvals.max_extensions"),
    ],
)
def test_a_bad_reminder_or_extension_value_is_one_line_naming_the_key(
    tmp_path: Path, text: str, key: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "[approvals]\n" + text), env={})
    message = str(info.value)
    assert key in message and "\n" not in message


def test_a_profile_whose_reminder_would_come_after_its_own_expiry_is_refused(tmp_path: Path) -> None:
    text = (
        "[approvals]\nremind_before_minutes = 30\n"
        "[[profiles]]\nname = 'ops'\nchannels = ['C0OPS']\n[profiles.approvals]\nexpire_after_minutes = 20\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert "remind_before_minutes" in str(info.value) and "profiles" in str(info.value)
