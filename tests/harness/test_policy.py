"""The tier of a call, in the contract's order: rules by arguments, then tools by name, own tier, default.

Each policy here is read from TOML by the real config loader, so file order is TOML's order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness import texts
from harness.config import load_config
from harness.policy import Policy, Rule, Ruling, Tier, glob_match, normalise_path
from harness.tools import BUILTIN_TOOLS

OWN = {t.name: (t.own_tier, t.own_tier_why) for t in BUILTIN_TOOLS}


def policy_of(tmp_path: Path, text: str) -> Policy:
    path = tmp_path / "harness.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, env={"HARNESS_WORKSPACE": str(tmp_path)}).policy


def ruling(policy: Policy, name: str, args: Any = None) -> Ruling:
    """The ruling the loop asks for: a built-in brings its own tier, any other tool none."""
    own, why = OWN.get(name, (None, ""))
    return policy.decide(name, {} if args is None else args, own, why)


DRAFTS_THEN_SECRETS = """
[[policy.rules]]
tool = "write_file"
args = { path = "drafts/**" }
tier = "allow"

[[policy.rules]]
tool = "write_file"
args = { path = "**/secret*" }
tier = "deny"

[[policy.rules]]
tool = "write_file"
args = { path = "drafts/**" }
tier = "ask"
"""


def on_path(number: int, glob: str) -> str:
    """The why of rule `number`, a `write_file` rule on `path`."""
    return f'policy.rules[{number}] (tool = "write_file", path = "{glob}")'


R1, R2 = on_path(1, "drafts/**"), on_path(2, "**/secret*")

ALLOW_THEN_ASK = """
[[policy.rules]]
tool = "delete_file"
tier = "allow"

[[policy.rules]]
tool = "delete_*"
tier = "ask"
"""
ASK_THEN_ALLOW = """
[[policy.rules]]
tool = "delete_*"
tier = "ask"

[[policy.rules]]
tool = "delete_file"
tier = "allow"
"""

TWO_ARGS = """
[[policy.rules]]
tool = "write_file"
args = { path = "drafts/**", content = "*ok*" }
tier = "allow"
"""
TWO_ARGS_WHY = 'policy.rules[1] (tool = "write_file", path = "drafts/**", content = "*ok*")'

GLOB_TOOL = """
[[policy.rules]]
tool = "tickets__*"
args = { id = "T-*" }
tier = "allow"
"""

SEGMENTS = """
[[policy.rules]]
tool = "write_file"
args = { path = "drafts/*" }
tier = "allow"

[[policy.rules]]
tool = "write_file"
args = { path = "deep/**" }
tier = "allow"

[[policy.rules]]
tool = "write_file"
args = { path = "draft?/x" }
tier = "allow"

[[policy.rules]]
tool = "write_file"
args = { path = "a/**/z" }
tier = "allow"
"""

DRAFTS_AND_SECRETS = """
[[policy.rules]]
tool = "write_file"
args = { path = "drafts/**" }
tier = "allow"

[[policy.rules]]
tool = "write_file"
args = { path = "secrets/**" }
tier = "deny"

[[policy.rules]]
tool = "write_file"
args = { path = "x" }
tier = "allow"
"""
DRAFTS, SECRETS, X = on_path(1, "drafts/**"), on_path(2, "secrets/**"), on_path(3, "x")

TOOL_TABLE = """
[policy]
default = "deny"
[policy.tools]
"*" = "allow"
"t*" = "deny"
"tickets__*" = "allow"
read_file = "deny"
"read_file*" = "allow"
"read_*" = "allow"
"ab*" = "allow"
"a*c" = "deny"
"""
EQUALS_REVERSED = """
[policy.tools]
"a*c" = "deny"
"ab*" = "allow"
"""

SEND_EMAIL_DENIED = """
[policy.tools]
send_email = "deny"
"""

DEFAULT_DENY = """
[policy]
default = "deny"
"""

RULE_OVER_TOOLS = """
[policy.tools]
write_file = "deny"
[[policy.rules]]
tool = "write_file"
args = { path = "drafts/**" }
tier = "allow"
"""

BUILTIN = texts.WHY_BUILTIN


@pytest.mark.parametrize(
    ("toml", "name", "args", "tier", "why"),
    [
        # Step 1: a matching deny wins over an earlier (and a later) allow or ask.
        pytest.param(DRAFTS_THEN_SECRETS, "write_file", {"path": "drafts/secret.txt"}, "deny", R2, id="deny"),
        pytest.param(DRAFTS_THEN_SECRETS, "write_file", {"path": "drafts/a.txt"}, "allow", R1, id="first"),
        pytest.param(DRAFTS_THEN_SECRETS, "write_file", {"path": "notes.txt"}, "ask", BUILTIN, id="no-rule"),
        # Otherwise the first matching rule in file order, whatever its tier.
        pytest.param(
            ALLOW_THEN_ASK,
            "delete_file",
            {},
            "allow",
            'policy.rules[1] (tool = "delete_file")',
            id="allow-1st",
        ),
        pytest.param(
            ASK_THEN_ALLOW, "delete_file", {}, "ask", 'policy.rules[1] (tool = "delete_*")', id="ask-1st"
        ),
        # A rule needs its tool and every args glob.
        pytest.param(
            TWO_ARGS, "write_file", {"path": "drafts/a", "content": "it is ok"}, "allow", TWO_ARGS_WHY
        ),
        pytest.param(
            TWO_ARGS, "write_file", {"path": "drafts/a", "content": "bad"}, "ask", BUILTIN, id="one"
        ),
        pytest.param(TWO_ARGS, "write_file", {"path": "drafts/a"}, "ask", BUILTIN, id="missing-arg"),
        pytest.param(
            TWO_ARGS, "read_file", {"path": "drafts/a", "content": "ok"}, "allow", BUILTIN, id="tool"
        ),
        pytest.param(
            GLOB_TOOL,
            "tickets__close",
            {"id": "T-1"},
            "allow",
            'policy.rules[1] (tool = "tickets__*", id = "T-*")',
        ),
        pytest.param(GLOB_TOOL, "tickets__close", {"id": "X-1"}, "ask", "policy.default", id="glob-no-arg"),
        pytest.param(GLOB_TOOL, "tickets_close", {"id": "T-1"}, "ask", "policy.default", id="glob-other"),
        # A missing or non-string argument never matches, nor do arguments that are not an object.
        pytest.param(DRAFTS_AND_SECRETS, "write_file", {"path": 5}, "ask", BUILTIN, id="int"),
        pytest.param(DRAFTS_AND_SECRETS, "write_file", {"path": ["drafts/a"]}, "ask", BUILTIN, id="list"),
        pytest.param(DRAFTS_AND_SECRETS, "write_file", {"path": None}, "ask", BUILTIN, id="null"),
        pytest.param(DRAFTS_AND_SECRETS, "write_file", {"path": {"p": "x"}}, "ask", BUILTIN, id="object"),
        pytest.param(DRAFTS_AND_SECRETS, "write_file", "drafts/a", "ask", BUILTIN, id="not-a-mapping"),
        pytest.param(DRAFTS_AND_SECRETS, "write_file", {"Path": "drafts/a"}, "ask", BUILTIN, id="case"),
        # `*` within one segment, `**` across, `?` one character of a segment.
        pytest.param(
            SEGMENTS, "write_file", {"path": "drafts/a"}, "allow", on_path(1, "drafts/*"), id="star"
        ),
        pytest.param(SEGMENTS, "write_file", {"path": "drafts/a/b"}, "ask", BUILTIN, id="star-one-segment"),
        pytest.param(
            SEGMENTS, "write_file", {"path": "deep/a/b/c"}, "allow", on_path(2, "deep/**"), id="doublestar"
        ),
        pytest.param(SEGMENTS, "write_file", {"path": "deep"}, "ask", BUILTIN, id="doublestar-not-itself"),
        pytest.param(SEGMENTS, "write_file", {"path": "deep2/x"}, "ask", BUILTIN, id="doublestar-sibling"),
        pytest.param(
            SEGMENTS,
            "write_file",
            {"path": "drafts/x"},
            "allow",
            on_path(1, "drafts/*"),
            id="question-after-star",
        ),
        pytest.param(
            SEGMENTS, "write_file", {"path": "draftz/x"}, "allow", on_path(3, "draft?/x"), id="question"
        ),
        pytest.param(SEGMENTS, "write_file", {"path": "draft/x"}, "ask", BUILTIN, id="question-is-one-char"),
        pytest.param(
            SEGMENTS, "write_file", {"path": "a/z"}, "allow", on_path(4, "a/**/z"), id="doublestar-slash-zero"
        ),
        pytest.param(
            SEGMENTS,
            "write_file",
            {"path": "a/b/c/z"},
            "allow",
            on_path(4, "a/**/z"),
            id="doublestar-slash-many",
        ),
        pytest.param(SEGMENTS, "write_file", {"path": "a/bz"}, "ask", BUILTIN, id="doublestar-slash-whole"),
        # Paths are normalised before matching.
        pytest.param(DRAFTS_AND_SECRETS, "write_file", {"path": "drafts/../secrets/x"}, "deny", SECRETS),
        pytest.param(
            DRAFTS_AND_SECRETS, "write_file", {"path": "./drafts//a"}, "allow", DRAFTS, id="dot-slash"
        ),
        pytest.param(
            DRAFTS_AND_SECRETS, "write_file", {"path": "drafts\\a"}, "allow", DRAFTS, id="backslash"
        ),
        pytest.param(
            DRAFTS_AND_SECRETS, "write_file", {"path": "drafts/a/.."}, "ask", BUILTIN, id="up-to-self"
        ),
        pytest.param(DRAFTS_AND_SECRETS, "write_file", {"path": "../x"}, "ask", BUILTIN, id="escape-not-x"),
        pytest.param(DRAFTS_AND_SECRETS, "write_file", {"path": "y/../x"}, "allow", X, id="inside-is-x"),
        pytest.param(DRAFTS_AND_SECRETS, "write_file", {"path": "/drafts/a"}, "ask", BUILTIN, id="absolute"),
        pytest.param(DRAFTS_AND_SECRETS, "write_file", {"path": "drafts/../../drafts/a"}, "ask", BUILTIN),
        # Step 2: an exact name beats any glob; a longer glob beats a shorter; equals: file order.
        pytest.param(TOOL_TABLE, "read_file", {}, "deny", "policy.tools.read_file", id="exact"),
        pytest.param(TOOL_TABLE, "tickets__list", {}, "allow", 'policy.tools."tickets__*"', id="longer"),
        pytest.param(TOOL_TABLE, "tools", {}, "deny", 'policy.tools."t*"', id="shorter-still-beats-star"),
        pytest.param(TOOL_TABLE, "abc", {}, "allow", 'policy.tools."ab*"', id="equal-length-first"),
        pytest.param(TOOL_TABLE, "read_more", {}, "allow", 'policy.tools."read_*"', id="glob"),
        pytest.param(TOOL_TABLE, "write_file", {}, "allow", 'policy.tools."*"', id="star-beats-own-tier"),
        pytest.param(EQUALS_REVERSED, "abc", {}, "deny", 'policy.tools."a*c"', id="equal-length-first-2"),
        # Step 3, only when steps 1 and 2 give nothing; step 4 last.
        pytest.param(DEFAULT_DENY, "read_file", {}, "allow", BUILTIN, id="own-tier-over-default"),
        pytest.param(DEFAULT_DENY, "delete_file", {}, "ask", BUILTIN, id="own-ask"),
        pytest.param(DEFAULT_DENY, "send_email", {}, "deny", "policy.default", id="default"),
        pytest.param("", "send_email", {}, "ask", "policy.default", id="default-default"),
        # Step 1 comes before step 2, even a deny there.
        pytest.param(
            RULE_OVER_TOOLS, "write_file", {"path": "drafts/a"}, "allow", DRAFTS, id="rule-over-tools"
        ),
        pytest.param(RULE_OVER_TOOLS, "write_file", {"path": "a"}, "deny", "policy.tools.write_file"),
    ],
)
def test_the_tier_of_a_call(tmp_path: Path, toml: str, name: str, args: Any, tier: str, why: str) -> None:
    assert ruling(policy_of(tmp_path, toml), name, args) == Ruling(Tier(tier), why)


def test_adding_a_deny_for_one_tool_leaves_the_built_ins_own_tiers(tmp_path: Path) -> None:
    """The regression: a [policy.tools] entry for send_email must not reset read_file to the default."""
    before = policy_of(tmp_path, "")
    after = policy_of(tmp_path, SEND_EMAIL_DENIED)
    for name in OWN:
        assert ruling(after, name) == ruling(before, name)
    assert ruling(after, "read_file") == Ruling(Tier.ALLOW, BUILTIN)
    assert ruling(after, "write_file") == Ruling(Tier.ASK, BUILTIN)
    assert ruling(after, "send_email") == Ruling(Tier.DENY, "policy.tools.send_email")


def test_the_built_ins_own_tiers_are_the_contracts() -> None:
    assert {name: own for name, (own, _) in OWN.items()} == {
        "get_time": Tier.ALLOW,
        "read_file": Tier.ALLOW,
        "list_files": Tier.ALLOW,
        "write_file": Tier.ASK,
        "delete_file": Tier.ASK,
    }


def test_an_mcp_tools_own_tier_names_its_reason() -> None:
    why = texts.WHY_MCP_READ_ONLY.format(server="tickets")
    got = Policy().decide("tickets__list", {}, Tier.ALLOW, why)
    assert got == Ruling(
        Tier.ALLOW, "tool's own tier (MCP readOnlyHint, trusted: trust_annotations = true for server tickets)"
    )


def test_a_tool_with_no_tier_of_its_own_may_say_why_and_the_default_carries_it() -> None:
    why = texts.WHY_MCP_CLAIM_NOT_TRUSTED.format(server="tickets")
    got = Policy(default=Tier.DENY).decide("tickets__list", {}, None, why)
    assert got == Ruling(Tier.DENY, f"policy.default ({why})")
    assert Policy().decide("tickets__list", {}, None, "") == Ruling(Tier.ASK, "policy.default")
    listed = Policy(tools={"tickets__*": Tier.ALLOW}).decide("tickets__list", {}, None, why)
    assert listed == Ruling(Tier.ALLOW, 'policy.tools."tickets__*"')  # a key that decides says only itself


def test_decide_tool_ignores_the_argument_rules(tmp_path: Path) -> None:
    policy = policy_of(tmp_path, RULE_OVER_TOOLS)
    assert policy.decide_tool("write_file") == Ruling(Tier.DENY, "policy.tools.write_file")
    assert policy.decide_tool("delete_file", Tier.ASK, BUILTIN) == Ruling(Tier.ASK, BUILTIN)
    assert policy.decide_tool("unknown") == Ruling(Tier.ASK, "policy.default")


def test_rules_for_names_the_rules_that_may_decide_a_tool(tmp_path: Path) -> None:
    policy = policy_of(tmp_path, ALLOW_THEN_ASK + GLOB_TOOL)
    assert [r.number for r in policy.rules_for("delete_file")] == [1, 2]
    assert [r.number for r in policy.rules_for("delete_all")] == [2]
    assert [r.number for r in policy.rules_for("tickets__x")] == [3]
    assert policy.rules_for("read_file") == ()


def test_a_why_quotes_what_toml_would_quote() -> None:
    rule = Rule(number=4, tool='we"ird', args={"q": "a\\b"}, tier=Tier.DENY)
    assert rule.describe() == 'policy.rules[4] (tool = "we\\"ird", q = "a\\\\b")'
    policy = Policy(tools={"my-tool": Tier.ALLOW, "x?z": Tier.DENY})
    assert policy.decide_tool("my-tool").why == "policy.tools.my-tool"
    assert policy.decide_tool("xyz").why == 'policy.tools."x?z"'


@pytest.mark.parametrize(
    ("pattern", "value", "matches"),
    [
        ("drafts/**", "drafts/a/b", True),
        ("drafts/**", "drafts", False),
        ("drafts/**", "drafts/", False),
        ("drafts/**", "drafts2/x", False),
        ("drafts/**", "drafts/../secrets/x", False),
        ("secrets/**", "drafts/../secrets/x", True),
        ("drafts/**", "./drafts//a", True),
        ("x", "../x", False),
        ("drafts/*.md", "drafts/a.md", True),
        ("drafts/*.md", "drafts/a/b.md", False),
        ("drafts/[a].md", "drafts/[a].md", True),
        ("drafts/[a].md", "drafts/a.md", False),
        ("a.b", "axb", False),
    ],
)
def test_path_globs(pattern: str, value: str, matches: bool) -> None:
    assert glob_match(pattern, value, paths=True) is matches


def test_tool_name_globs_are_not_paths() -> None:
    assert glob_match("tickets__*", "tickets__close")
    assert not glob_match("tickets__*", "tickets_close")
    assert not glob_match("a/b", "a/./b")  # no normalising outside paths


# --- properties ---------------------------------------------------------------------------------

SEGMENT = st.sampled_from(["a", "b", "drafts", "secrets", ".", "..", "", "x.md"])
PATHS = st.builds(
    lambda lead, parts, sep: lead + sep.join(parts),
    st.sampled_from(["", "/", "./", "\\"]),
    st.lists(SEGMENT, max_size=8),
    st.sampled_from(["/", "\\"]),
)
PREFIXES = st.sampled_from(["drafts", "a/b", "secrets/x.md"])


@given(PATHS)
def test_normalising_a_path_twice_changes_nothing(path: str) -> None:
    once = normalise_path(path)
    assert normalise_path(once) == once
    assert "//" not in once and "\\" not in once
    assert "." not in once.split("/")


@given(PREFIXES, PATHS)
def test_prefix_doublestar_matches_exactly_the_paths_under_the_prefix(prefix: str, path: str) -> None:
    assert glob_match(f"{prefix}/**", path, paths=True) is normalise_path(path).startswith(prefix + "/")


@given(PREFIXES, st.integers(min_value=1, max_value=3), st.lists(SEGMENT, max_size=5))
def test_a_dotdot_that_escapes_the_prefix_never_matches_under_it(
    prefix: str, extra: int, tail: list[str]
) -> None:
    depth = prefix.count("/") + 1
    path = "/".join([prefix, *[".."] * (depth + extra), prefix, *tail])
    assert not glob_match(f"{prefix}/**", path, paths=True)


TIERS = st.sampled_from(list(Tier))
RULES = st.lists(
    st.tuples(
        st.sampled_from(["write_file", "write_*", "*", "other"]),
        st.dictionaries(st.sampled_from(["path", "content"]), st.sampled_from(["**", "drafts/**", "*", "x"])),
        TIERS,
    ),
    max_size=6,
)
CALL_ARGS = st.fixed_dictionaries({}, optional={"path": PATHS, "content": st.sampled_from(["x", "y", 3])})


@given(
    RULES,
    st.integers(min_value=0, max_value=6),
    CALL_ARGS,
    st.dictionaries(st.sampled_from(["write_file", "write_*", "*"]), TIERS),
    st.one_of(st.none(), TIERS),
    TIERS,
)
def test_a_matching_deny_rule_always_denies(
    rules: list[tuple[str, dict[str, str], Tier]],
    at: int,
    args: dict[str, Any],
    tools: dict[str, Tier],
    own: Tier | None,
    default: Tier,
) -> None:
    specs = list(rules)
    specs.insert(min(at, len(specs)), ("write_*", {}, Tier.DENY))  # matches every call of write_file
    built = tuple(Rule(i + 1, tool, args_, tier) for i, (tool, args_, tier) in enumerate(specs))
    policy = Policy(default=default, tools=tools, rules=built)
    got = policy.decide("write_file", args, own, "own")
    assert got.tier is Tier.DENY
    assert got.why.startswith("policy.rules[")


@given(RULES, CALL_ARGS, st.dictionaries(st.sampled_from(["write_file", "write_*", "*"]), TIERS), TIERS)
def test_without_a_matching_rule_a_call_gets_its_tools_tier(
    rules: list[tuple[str, dict[str, str], Tier]], args: dict[str, Any], tools: dict[str, Tier], default: Tier
) -> None:
    built = tuple(Rule(i + 1, tool, args_, tier) for i, (tool, args_, tier) in enumerate(rules))
    policy = Policy(default=default, tools=tools, rules=built)
    matched = [r for r in built if r.matches("write_file", args)]
    got = policy.decide("write_file", args, Tier.ASK, BUILTIN)
    if matched:
        assert got.tier is next((r.tier for r in matched if r.tier is Tier.DENY), matched[0].tier)
    else:
        assert got == policy.decide_tool("write_file", Tier.ASK, BUILTIN)
