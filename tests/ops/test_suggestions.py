"""Suggested rules (`ops.suggestions`): calls approved at least 10 times and never declined in
30 days become a `[[policy.rules]]` snippet that loads, with what replaying it would change; and
the Home view shows them under "Suggested rules" to whoever the bot passes them to."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.config import Config, load_config
from harness.policy import PathArgs, Tier
from messages.home import SuggestedRule, home_view
from ops.suggestions import DAY, MIN_APPROVALS, snippet, suggest

NOW = 1_800_000_000.0
CONFIG = """
[[profiles]]
name = "ops"
channels = ["COPS"]
[profiles.tools]
builtin = ["read_file", "write_file", "list_files", "get_time"]
"""


def _config(tmp_path: Path, text: str = CONFIG) -> Config:
    path = tmp_path / "harness.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)})


class Audit:
    """Calls as the streams record them: each call's tier decision, then its decision."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []

    def add(
        self,
        verdict: str,
        tool: str = "write_file",
        arguments: Mapping[str, Any] | None = None,
        *,
        channel: str = "COPS",
        profile: str = "ops",
        at: float = NOW - 60,
        source: str = "builtin",
        path_args: PathArgs | None = None,
        **extra: Any,
    ) -> None:
        n = len(self.calls)
        arguments = dict(arguments if arguments is not None else {"path": f"docs/page{n}.md", "content": "x"})
        ids = {"run_id": f"r{n}", "call_id": f"toolu_{n}", "team": "T1", "channel": channel, "at": at}
        self.calls.append(
            {**ids, "event": "ruled", "profile": profile, "tool": tool, "source": source, "tier": "ask",
             "why": "policy.default", "input": arguments}
        )  # fmt: skip
        if path_args is not None:  # as `ruling_entry` records it (a release before recorded none)
            self.calls[-1]["path_args"] = path_args.to_json()
        by = "" if verdict == "expired" else "UAPPROVER"
        preview = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
        self.decisions.append(
            {**ids, "verdict": verdict, "by": by, "tool": tool, "input_preview": preview, **extra}
        )

    def suggest(self, config: Config, **kw: Any) -> list[Any]:
        return suggest(config, self.decisions, self.calls, now=NOW, **kw)


def test_nine_approvals_suggest_nothing(tmp_path: Path) -> None:
    audit = Audit()
    for _ in range(MIN_APPROVALS - 1):
        audit.add("approved")
    assert audit.suggest(_config(tmp_path)) == []


def test_ten_approvals_and_one_decline_suggest_nothing(tmp_path: Path) -> None:
    audit = Audit()
    for _ in range(10):
        audit.add("approved")
    audit.add("declined")
    assert audit.suggest(_config(tmp_path)) == []


def test_answers_to_a_servers_questions_are_not_approvals(tmp_path: Path) -> None:
    audit = Audit()
    for _ in range(12):  # the requester answered a server's question each time: nobody approved
        audit.add("approved", kind="input")
    assert audit.suggest(_config(tmp_path)) == []


def test_an_approval_with_edited_input_counts_as_a_no(tmp_path: Path) -> None:
    audit = Audit()
    for _ in range(12):
        audit.add("approved")
    audit.add("approved", edited_input={"path": "docs/other.md", "content": "y"})
    assert audit.suggest(_config(tmp_path)) == []


def test_ten_approvals_give_one_snippet_with_what_replay_would_change(tmp_path: Path) -> None:
    audit = Audit()
    for _ in range(10):
        audit.add("approved")
    for _ in range(3):
        audit.add("expired")  # nobody's "no": it counts neither way
    audit.add("approved", at=NOW - 31 * DAY)  # outside the window: not replayed either
    (found,) = audit.suggest(_config(tmp_path))
    assert (found.profile, found.tool, dict(found.args), found.approvals) == (
        "ops",
        "write_file",
        {"path": "docs/**"},
        10,
    )
    assert found.snippet.splitlines()[1:] == [
        "[[profiles.policy.rules]]",
        'tool = "write_file"',
        'args = { path = "docs/**" }',
        'tier = "allow"',
    ]
    assert found.effect == "13 calls, 13 would change: 13 ask→allow"


def test_calls_are_grouped_by_directory_and_a_decline_elsewhere_does_not_count(tmp_path: Path) -> None:
    audit = Audit()
    for i in range(10):
        audit.add("approved", arguments={"path": f"docs/a{i}.md"})
    for i in range(10):
        audit.add("approved", arguments={"path": f"src/b{i}.py"})
    audit.add("declined", arguments={"path": "src/evil.py"})
    for i in range(10):
        audit.add("approved", arguments={"path": f"top{i}.md"})  # the root: no narrower than the tool
    (found,) = audit.suggest(_config(tmp_path))
    assert dict(found.args) == {"path": "docs/**"}
    assert found.effect == "10 calls, 10 would change: 10 ask→allow"  # only the calls it covers


def test_a_decline_in_a_subdirectory_the_rule_would_cover_blocks_it(tmp_path: Path) -> None:
    audit = Audit()
    for i in range(10):
        audit.add("approved", arguments={"path": f"docs/a{i}.md"})
    audit.add("declined", arguments={"path": "docs/secret/keys.md"})
    assert audit.suggest(_config(tmp_path)) == []


def test_grant_runs_and_other_workspaces_are_not_approvals_by_people(tmp_path: Path) -> None:
    audit = Audit()
    for _ in range(9):
        audit.add("approved")
    audit.add("approved", grant_until=NOW + 60)
    assert audit.suggest(_config(tmp_path)) == []
    audit.add("approved")
    assert audit.suggest(_config(tmp_path), team="T2") == []
    assert len(audit.suggest(_config(tmp_path), team="T1")) == 1


def test_a_tool_without_paths_is_suggested_whole_at_the_top_level(tmp_path: Path) -> None:
    audit = Audit()
    for _ in range(10):
        audit.add("approved", tool="get_time", arguments={}, channel="CELSE", profile="")
    (found,) = audit.suggest(_config(tmp_path))
    assert found.snippet == '[[policy.rules]]\ntool = "get_time"\ntier = "allow"'
    assert found.effect.startswith("10 calls, 10 would change: 10 ask→allow")


def test_the_snippets_parse_as_toml_and_load_as_rules(tmp_path: Path) -> None:
    audit = Audit()
    for i in range(10):
        audit.add("approved", arguments={"path": f'we"ird\\dir/f{i}'})
    for _ in range(10):
        audit.add("approved", tool="get_time", arguments={}, channel="CELSE", profile="")
    found = audit.suggest(_config(tmp_path))
    assert [s.profile for s in found] == ["", "ops"] or [s.profile for s in found] == ["ops", ""]
    text = CONFIG + "\n" + "\n".join(s.snippet for s in found if s.profile) + "\n"
    text += "\n".join(s.snippet for s in found if not s.profile) + "\n"
    tomllib.loads(text)
    config = _config(tmp_path, text)
    ops = config.for_profile("ops")
    assert ops is not None
    (rule,) = [r for r in ops.policy.rules if r.table == "profiles[ops].policy.rules"]
    assert dict(rule.args) == {"path": 'we"ird/dir/**'} and rule.tier is Tier.ALLOW
    assert ops.policy.decide("write_file", {"path": 'we"ird/dir/x'}).tier is Tier.ALLOW
    assert config.policy.decide("get_time", {}).tier is Tier.ALLOW


def test_a_snippets_strings_escape_what_toml_would_read(tmp_path: Path) -> None:
    from harness.policy import Rule

    rule = Rule(number=1, tool="t\x7f\n", args={"odd key": 'a"\\b/**'}, tier=Tier.ALLOW)
    parsed = tomllib.loads(snippet("", rule))
    assert parsed["policy"]["rules"][0] == {
        "tool": "t\x7f\n",
        "args": {"odd key": 'a"\\b/**'},
        "tier": "allow",
    }


def test_at_most_three_are_suggested_most_approved_first(tmp_path: Path) -> None:
    audit = Audit()
    for n, directory in enumerate(["a", "b", "c", "d"]):
        for i in range(10 + n):
            audit.add("approved", arguments={"path": f"{directory}/f{i}"})
    found = audit.suggest(_config(tmp_path))
    assert [dict(s.args)["path"] for s in found] == ["d/**", "c/**", "b/**"]


def test_the_home_view_shows_suggestions_escaped_in_a_code_block() -> None:
    rule = SuggestedRule(snippet='[[policy.rules]]\ntool = "<@U1> & co"\ntier = "allow"', effect="3 calls")
    view = home_view([], at=datetime.now(UTC), suggestions=[rule])
    text = json.dumps(view)
    assert "Suggested rules" in text
    assert "```\\n[[policy.rules]]" in text and "&lt;@U1&gt; &amp; co" in text and "<@U1>" not in text
    assert "Suggested rules" not in json.dumps(home_view([], at=datetime.now(UTC)))


def test_only_the_levels_asked_for_are_suggested(tmp_path: Path) -> None:
    audit = Audit()
    for _ in range(10):
        audit.add("approved")  # profile ops
    assert audit.suggest(_config(tmp_path), profiles={""}) == []
    assert len(audit.suggest(_config(tmp_path), profiles={"ops"})) == 1


# --- issue 30: a suggested rule constrains every path argument it saw -------------------------------

TWO = PathArgs(("source", "destination"))


def test_the_rule_suggested_for_copy_constrains_both_its_paths(tmp_path: Path) -> None:
    audit = Audit()
    copy = PathArgs(("path", "destination"))
    for i in range(10):
        args = {"path": f"docs/a{i}.md", "destination": f"docs/sub/b{i}.md"}
        audit.add("approved", tool="desk__copy", arguments=args, source="mcp:desk", path_args=copy)
    (found,) = audit.suggest(_config(tmp_path))
    assert dict(found.args) == {"path": "docs/**", "destination": "docs/**"}
    assert 'args = { destination = "docs/**", path = "docs/**" }' in found.snippet
    config = _config(tmp_path, CONFIG + found.snippet.split("\n", 1)[1] + "\n")
    ops = config.for_profile("ops")
    assert ops is not None
    assert ops.policy.decide("desk__copy", {"path": "docs/x", "destination": "docs/y"}).tier is Tier.ALLOW
    for outside in ("/etc/cron.d/evil", "../../home/alice/.ssh/authorized_keys", "docs/../../x"):
        ruled = ops.policy.decide("desk__copy", {"path": "docs/x", "destination": outside})
        assert ruled.tier is Tier.ASK, outside


def test_move_file_with_paths_nothing_marks_gets_no_argument_less_allow(tmp_path: Path) -> None:
    audit = Audit()
    for i in range(10):
        args = {"source": f"docs/a{i}.md", "destination": f"docs/b{i}.md"}
        audit.add("approved", tool="fs__move_file", arguments=args, source="mcp:fs", path_args=PathArgs())
    assert audit.suggest(_config(tmp_path)) == []


def test_move_file_with_its_paths_marked_is_suggested_with_both(tmp_path: Path) -> None:
    audit = Audit()
    for i in range(10):
        args = {"source": f"docs/a{i}.md", "destination": f"docs/b{i}.md"}
        audit.add("approved", tool="fs__move_file", arguments=args, source="mcp:fs", path_args=TWO)
    (found,) = audit.suggest(_config(tmp_path))
    assert dict(found.args) == {"source": "docs/**", "destination": "docs/**"}


def test_a_list_of_paths_gets_no_suggestion_at_all(tmp_path: Path) -> None:
    audit = Audit()
    for marks in (PathArgs(("paths",)), PathArgs()):
        for i in range(10):
            args = {"paths": [f"docs/a{i}.md", f"docs/b{i}.md"]}
            audit.add(
                "approved", tool="fs__read_multiple_files", arguments=args, source="mcp:fs", path_args=marks
            )
        assert audit.suggest(_config(tmp_path)) == []


def test_a_path_where_no_rule_can_name_it_or_a_path_argument_left_out_gets_no_suggestion(
    tmp_path: Path,
) -> None:
    audit = Audit()
    for i in range(10):
        args = {"source": f"docs/a{i}.md", "destination": f"docs/b{i}.md", "options": {"log": "/tmp/log"}}
        audit.add("approved", tool="fs__move_file", arguments=args, source="mcp:fs", path_args=TWO)
    for i in range(10):
        args = {"source": f"docs/a{i}.md"}  # a rule naming `destination` would never match it
        audit.add("approved", tool="fs__move_file", arguments=args, source="mcp:fs", path_args=TWO)
    assert audit.suggest(_config(tmp_path)) == []


def test_a_tool_whose_path_arguments_were_not_recorded_gets_no_suggestion(tmp_path: Path) -> None:
    audit = Audit()
    for _ in range(10):
        audit.add("approved", tool="desk__ping", arguments={"note": "hi"}, source="mcp:desk")
    assert audit.suggest(_config(tmp_path)) == []  # a built-in's are known (the tests above)
