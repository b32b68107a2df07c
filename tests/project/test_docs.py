"""The docs stay true to the code: every config key and environment variable is in the reference,
every key the reference names exists, and every relative link leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.config import ConfigError, accepted_keys, load_config

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "configuration.md"
# The README, the release's pages beside it, and docs/.
ROOT_PAGES = ("README.md", "CHANGELOG.md", "SECURITY.md", "CONTRIBUTING.md")
PAGES = sorted([*(ROOT / page for page in ROOT_PAGES), *(ROOT / "docs").glob("*.md")])
PRODUCT = ("harness", "store", "observe", "runtime", "gates", "ops", "bot", "workers", "playground", "launch")

# Landing in parallel (issue 19): documented already, read by the code once merged (then these
# entries change nothing and may go).
PENDING_KEYS: set[str] = set()
PENDING_VARIABLES: set[str] = set()
# Documented variables that the product's own code never reads: others read them.
READ_BY_OTHERS = {
    "ANTHROPIC_BASE_URL",  # the anthropic SDK
    "PYTHONPATH",  # Python, for [tools] modules
}

# A table row whose first cell is written `like.this` (config keys) or `LIKE_THIS` (variables).
_ROW = re.compile(r"^\|\s*(?P<cell>[^|]*?)\s*\|", re.MULTILINE)
_CODE = re.compile(r"`([^`]+)`")
_CONFIG_KEY = re.compile(r"[a-z_]+(\.[a-z_]+)+")
_VARIABLE = re.compile(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)+|PORT|HOST|PATH|HOME")
# How product code reads a variable: env.get("X"), os.environ["X"], os.getenv("X"), and the names
# it passes to helpers that read them (a string literal with one of the product's prefixes).
_READS = re.compile(
    r"""(?:environ|env)(?:\.get)?\s*[\[(]\s*["']([A-Z][A-Z0-9_]*)["']|getenv\(\s*["']([A-Z][A-Z0-9_]*)["']"""
)
_PREFIXES = "HARNESS|SLACK|ANTHROPIC|REDIS|METRICS|LOG|WEB|PLAYGROUND|OTEL"
_PREFIXED = re.compile(rf"""["']((?:{_PREFIXES})_[A-Z0-9_]+)["']""")
# Upper-case strings that are not variables: a request's WSGI environ keys, read from a request.
_NOT_VARIABLES = re.compile(
    r"HTTP_.*|REQUEST_METHOD|PATH_INFO|QUERY_STRING|CONTENT_(LENGTH|TYPE)|REMOTE_ADDR|SERVER_(PORT|NAME)"
)


def first_cells(text: str) -> list[str]:
    """The code spans of every table row's first cell."""
    return [code for row in _ROW.finditer(text) for code in _CODE.findall(row.group("cell"))]


def documented_keys() -> set[str]:
    cells = first_cells(REFERENCE.read_text(encoding="utf-8"))
    return {cell for cell in cells if _CONFIG_KEY.fullmatch(cell)}


def documented_variables() -> set[str]:
    cells = first_cells(REFERENCE.read_text(encoding="utf-8"))
    return {cell for cell in cells if _VARIABLE.fullmatch(cell)}


def variables_read_by_the_product() -> dict[str, str]:
    """Every environment variable name the product code reads, and one file that reads it."""
    found: dict[str, str] = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            names = {a or b for a, b in _READS.findall(source)} | set(_PREFIXED.findall(source))
            for name in names - {n for n in names if _NOT_VARIABLES.fullmatch(n)}:
                found.setdefault(name, str(path.relative_to(ROOT)))
    return found


# --- config keys --------------------------------------------------------------------------------


def test_every_key_the_code_accepts_is_in_the_reference() -> None:
    missing = accepted_keys() - documented_keys()
    assert not missing, f"docs/configuration.md has no row for: {sorted(missing)}"


def test_every_key_in_the_reference_is_accepted_by_the_code() -> None:
    unknown = documented_keys() - accepted_keys() - PENDING_KEYS
    assert not unknown, f"docs/configuration.md documents keys the code refuses: {sorted(unknown)}"


def test_the_reference_finds_its_keys() -> None:
    """The reader of the reference is not vacuous: the well-known keys are found in it."""
    well_known = {"limits.max_turns", "mcp.servers.name", "policy.rules.tier", "approvals.required"}
    assert well_known <= documented_keys()


# The table the parser checks, a TOML that puts an unknown key in it, and the prefix of its error.
_PROBES = [
    ("", "zz_unknown = 1\n"),
    ("model", "[model]\nzz_unknown = 1\n"),
    ("limits", "[limits]\nzz_unknown = 1\n"),
    ("tools", "[tools]\nzz_unknown = 1\n"),
    ("approvals", "[approvals]\nzz_unknown = 1\n"),
    ("policy", "[policy]\nzz_unknown = 1\n"),
    ("policy.rules", "[[policy.rules]]\nzz_unknown = 1\n"),
    ("mcp", "[mcp]\nzz_unknown = 1\n"),
    ("mcp.servers", '[[mcp.servers]]\nname = "a"\nzz_unknown = 1\n'),
]


@pytest.mark.parametrize(("table", "toml"), _PROBES, ids=[t or "top" for t, _ in _PROBES])
def test_accepted_keys_are_what_the_parser_allows(table: str, toml: str, tmp_path: Path) -> None:
    """`accepted_keys()` agrees with the parser itself: an unknown key's error lists the allowed ones."""
    path = tmp_path / "h.toml"
    path.write_text(toml, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown key .*zz_unknown \(allowed: ") as raised:
        load_config(path, env={})
    allowed = set(str(raised.value).rsplit("(allowed: ", 1)[1].rstrip(")").split(", "))
    if table == "":
        assert allowed == {key.split(".")[0] for key in accepted_keys()}
    else:
        keys = (key.rpartition(".") for key in accepted_keys())
        assert allowed == {name for parent, _, name in keys if parent == table}


# --- environment variables ----------------------------------------------------------------------


def test_every_variable_the_product_reads_is_in_the_reference() -> None:
    read = variables_read_by_the_product()
    missing = {name: where for name, where in read.items() if name not in documented_variables()}
    assert not missing, f"docs/configuration.md has no row for these variables (read in): {missing}"


def test_every_variable_in_the_reference_is_read_by_someone() -> None:
    read = set(variables_read_by_the_product())
    unknown = documented_variables() - read - READ_BY_OTHERS - PENDING_VARIABLES
    assert not unknown, f"docs/configuration.md documents variables nothing reads: {sorted(unknown)}"


def test_the_variable_scan_finds_what_it_should() -> None:
    """The scan is not vacuous: reads through env.get, os.environ.get and a helper are all found."""
    read = variables_read_by_the_product()
    assert {"SLACK_BOT_TOKEN", "REDIS_URL", "HARNESS_LEASE_SECONDS", "HARNESS_WORKER_MAX_RSS_MB"} <= set(read)
    assert {"PORT", "HOST"} <= set(read)
    assert "HTTP_X_SLACK_SIGNATURE" not in read


# --- links ---------------------------------------------------------------------------------------

_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings of `page`: lower case, punctuation dropped, spaces as -."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.MULTILINE):
        plain = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", plain).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def relative_links(page: Path) -> list[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans may hold ]( that is no link
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_lead_to_files_and_headings_that_exist(page: Path) -> None:
    broken = []
    for link in relative_links(page):
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link} (no file {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path})")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{link} (no heading #{anchor} in {path.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_link_checker_catches_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# A title\n\n[ok](#a-title) [gone](nowhere.md) [bad](#no-such) `[code](x)`\n")
    links = relative_links(page)
    assert links == ["#a-title", "nowhere.md", "#no-such"]
    assert anchors(page) == {"a-title"}


def test_the_readme_starts_small() -> None:
    """Issue 24: the README is the front door (at most ~250 lines); docs/ holds the rest. Issue 20
    adds "Rolling it out" (~40 lines: three channels' real `--list-tools --channel` output); issue 32
    the license and links to the release's pages (6 lines); issue 33 what the ops channel's MCP
    server costs a request, in that output (2 lines)."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 268, f"README.md has {lines} lines"
    for page in ("approvals", "tools-and-mcp", "configuration", "operations", "reliability", "performance"):
        assert (ROOT / "docs" / f"{page}.md").is_file()


# --- tests the docs name -------------------------------------------------------------------------

# `tests/FLOOR/test_NAME.py`, `…::test_function` or a glob such as `tests/*/test_stop_*.py`; a bare
# `test_NAME.py` would send the reader looking, so a doc names a test file by its path.
_TEST_REF = re.compile(r"(?<![\w/*])((?:tests/[\w*]+/)?test_[\w*]+\.py)(?:::(\w+))?")


def named_tests(text: str) -> list[tuple[str, str]]:
    return _TEST_REF.findall(text)


@pytest.mark.parametrize("page", [*PAGES, ROOT / "BENCHMARKS.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_the_tests_a_page_names_exist(page: Path) -> None:
    missing = []
    for path, function in named_tests(page.read_text(encoding="utf-8")):
        files = sorted(ROOT.glob(path)) if path.startswith("tests/") else []
        if not files:
            missing.append(f"{path} (no such file; name it by its path, tests/FLOOR/test_NAME.py)")
        elif function and not any(re.search(rf"^\s*def {function}\b", f.read_text(), re.M) for f in files):
            missing.append(f"{path}::{function} (no such test)")
    assert not missing, f"{page.relative_to(ROOT)}: {missing}"


def test_the_test_reference_checker_reads_paths_functions_and_bare_names() -> None:
    text = "`tests/harness/test_loop.py::test_x`, `test_cli.py`, `tests/*/test_stop_*.py`"
    assert named_tests(text) == [
        ("tests/harness/test_loop.py", "test_x"),
        ("test_cli.py", ""),
        ("tests/*/test_stop_*.py", ""),
    ]
