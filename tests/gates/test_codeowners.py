"""The example callable `gates.codeowners:may_approve`: CODEOWNERS read as GitHub reads it (the last
matching pattern wins), Slack users mapped to owners by a people file, and unknown whenever it
cannot be sure."""

from __future__ import annotations

from pathlib import Path

import pytest

from gates.approvers_from import Answer, ApproverAnswer, click_of
from gates.codeowners import People, decide, may_approve, owners_of, parse, read_people
from harness.policy import PathArgs, Tier
from harness.state import PendingCall
from store import RunRecord

CODEOWNERS = """\
# A comment, then the catch-all
*                   @myorg/everyone
*.js                @js-owner
/docs/              @ann docs@example.com
apps/               @ben
docs/*.md           @carol
/build/logs/        @ann
/scripts/\\#odd      @ben   # an escaped hash is part of the name
/unowned/
[Section] @nobody
!negated @ann
/weird/             not-an-owner
"""
RULES = parse(CODEOWNERS)
PEOPLE = People(
    users={"UANN": "@ann", "UBEN": "@ben", "UCAROL": "@carol", "UDAVE": "dave@example.com"},
    teams={"@myorg/everyone": ("@ann", "@ben", "@carol")},
)
RECORD = RunRecord("r1", "T1", "C1", "1.2", "UALICE", "task")
WRITE = PathArgs(("path",), ("content",))


def owners(path: str) -> tuple[str, ...] | None:
    rule = owners_of(RULES, path)
    return rule.owners if rule else None


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("README", ("@myorg/everyone",)),
        ("src/app.js", ("@js-owner",)),  # *.js at any depth
        ("docs/guide.txt", ("@ann", "docs@example.com")),  # /docs/ at the root, and below
        ("docs/deep/guide.txt", ("@ann", "docs@example.com")),
        ("docs/intro.md", ("@carol",)),  # a later line wins over /docs/
        ("docs/deep/intro.md", ("@ann", "docs@example.com")),  # docs/*.md is one level only
        ("lib/docs/x.txt", ("@myorg/everyone",)),  # /docs/ is anchored
        ("apps/web/x.py", ("@ben",)),  # apps/ anywhere
        ("src/apps/x.py", ("@ben",)),
        ("build/logs/today.log", ("@ann",)),
        ("scripts/#odd", ("@ben",)),
        ("unowned/x", ()),  # a line with no owner leaves the path unowned
        ("weird/x", ("@myorg/everyone",)),  # a line with an owner of unknown shape is skipped
    ],
)
def test_the_last_matching_pattern_gives_a_path_its_owners(path: str, expected: tuple[str, ...]) -> None:
    assert owners(path) == expected


def test_lines_it_does_not_read_grant_nothing() -> None:
    patterns = [r.pattern for r in RULES]
    assert "[Section]" not in patterns and "!negated" not in patterns and "/weird/" not in patterns
    assert owners_of(parse("docs/ @ann\n"), "src/x") is None


def call(path: object, name: str = "write_file", **more: object) -> PendingCall:
    return PendingCall("toolu_1", name, {"path": path, "content": "a/b", **more}, Tier.ASK, path_args=WRITE)


def answer(user: str, the_call: PendingCall) -> ApproverAnswer:
    return decide(RULES, PEOPLE, click_of(the_call, clicker=user, record=RECORD, workspace=Path("/ws")))


def test_an_owner_of_every_path_may_approve_and_is_told_which_line() -> None:
    said = answer("UCAROL", call("docs/intro.md"))
    assert said.answer is Answer.YES and "line 6" in said.reason
    assert answer("UANN", call("./docs/../docs/deep/x.txt")).answer is Answer.YES  # normalised first
    assert answer("UBEN", call("README")).answer is Answer.YES  # through a team


def test_someone_who_owns_a_path_not_is_told_no_naming_its_owners() -> None:
    said = answer("UANN", call("apps/web/x.py"))
    assert said.answer is Answer.NO and "@ben" in said.reason and "line 5" in said.reason
    assert answer("UDAVE", call("docs/x.txt")).answer is Answer.NO


@pytest.mark.parametrize(
    ("user", "the_call", "why"),
    [
        ("UANN", call("unowned/x"), "nobody owns"),
        ("UERIN", call("docs/x.txt"), "no entry"),  # the clicker is not in the people file
        ("UANN", call("/etc/passwd"), "not a path inside"),
        ("UANN", call("../outside"), "not a path inside"),
        ("UANN", PendingCall("t", "write_file", {"path": "docs/x"}, Tier.ASK), "not known"),
        ("UANN", call("docs/x.txt", extra="../../etc/cron.d/x"), "outside its path arguments"),
        ("UANN", PendingCall("t", "list_files", {}, Tier.ASK, path_args=WRITE), "names no path"),
    ],
)
def test_unknown_whenever_it_cannot_be_sure(user: str, the_call: PendingCall, why: str) -> None:
    said = answer(user, the_call)
    assert said.answer is Answer.UNKNOWN and why in said.reason


def test_a_team_nobody_listed_makes_a_non_owner_unknown_rather_than_no() -> None:
    rules = parse("src/ @myorg/backend\n")
    said = decide(
        rules, PEOPLE, click_of(call("src/x.py"), clicker="UANN", record=RECORD, workspace=Path("/"))
    )
    assert said.answer is Answer.UNKNOWN and "@myorg/backend" in said.reason


def test_every_path_must_be_owned_by_the_clicker() -> None:
    copy = PendingCall(
        "t", "copy", {"from": "docs/x.txt", "to": "apps/y"}, Tier.ASK, path_args=PathArgs(("from", "to"))
    )
    assert answer("UANN", copy).answer is Answer.NO  # owns docs/, not apps/


def test_the_people_file_is_read_strictly() -> None:
    people = read_people('[users]\nUANN = "@Ann"\n[teams]\n"@MyOrg/X" = ["@ann"]\n')
    assert people.users == {"UANN": "@ann"} and people.teams == {"@myorg/x": ("@ann",)}
    for bad in ("users = 3\n", "[users]\nUANN = 3\n", '[teams]\nx = "a"\n', "[other]\n"):
        with pytest.raises(ValueError):
            read_people(bad)


def test_may_approve_reads_the_workspace_s_codeowners_and_the_people_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".github").mkdir()
    (tmp_path / ".github" / "CODEOWNERS").write_text("/docs/ @ann\n")
    people = tmp_path / "people.toml"
    people.write_text('[users]\nUANN = "@ann"\n')
    given = click_of(call("docs/a.md"), clicker="UANN", record=RECORD, workspace=tmp_path)
    monkeypatch.delenv("CODEOWNERS_FILE", raising=False)
    monkeypatch.delenv("CODEOWNERS_PEOPLE", raising=False)
    assert may_approve(given).answer is Answer.UNKNOWN  # no people file named
    monkeypatch.setenv("CODEOWNERS_PEOPLE", str(people))
    assert may_approve(given).answer is Answer.YES
    (tmp_path / ".github" / "CODEOWNERS").write_text("/docs/ @ben  \n")  # read again once changed
    assert may_approve(given).answer is Answer.NO
    monkeypatch.setenv("CODEOWNERS_FILE", str(tmp_path / "missing"))
    said = may_approve(given)
    assert said.answer is Answer.UNKNOWN and "cannot read" in said.reason
