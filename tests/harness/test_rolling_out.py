"""The README's "Rolling it out" stays true: its example configs load, and the `--list-tools
--channel` output it shows is what the example config gives and what the command prints.

The example's `#ops` offers a real MCP server (docs/examples/tickets_server.py, started as the
README says: `python` on PATH being this virtualenv's, from the repository's root; in bubblewrap).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import list_tools
from harness.config import load_config
from harness.tools.catalog import open_catalog
from tests.mcp_support import require_bwrap

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
EXAMPLE = ROOT / "docs" / "examples" / "company.toml"
DRAFT = ROOT / "docs" / "examples" / "company-next.toml"
COMMAND = re.compile(
    r"^\$ HARNESS_CONFIG=(?P<config>\S+) python -m harness --list-tools --channel (?P<channel>\S+)$"
)


def shown_in_readme() -> dict[str, str]:
    """Channel -> the output the README shows under its `--list-tools --channel` command."""
    section = README.read_text(encoding="utf-8").split("## Rolling it out\n", 1)[1].split("\n## ", 1)[0]
    shown: dict[str, str] = {}
    channel = None
    for line in section.splitlines():
        command = COMMAND.match(line)
        if command:
            assert command["config"] == str(EXAMPLE.relative_to(ROOT))
            channel = command["channel"]
            shown[channel] = ""
        elif line.startswith(("$ ", "```")):
            channel = None
        elif channel is not None:
            shown[channel] += line + "\n"
    return shown


def example_environ() -> dict[str, str]:
    """The README's shell: the virtualenv's `python` first on PATH, run from the repository's root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARNESS_", "SLACK_", "ANTHROPIC_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT))
    return env


def test_the_readme_shows_three_channels_each_under_its_own_profile() -> None:
    shown = shown_in_readme()
    assert list(shown) == ["C0GENERAL", "C0ENG", "C0OPS"]
    heads = [text.splitlines()[0] for text in shown.values()]
    assert heads == [
        f"# profile: {n} (channel {c} is in profiles[{n}].channels)"
        for n, c in [("general", "C0GENERAL"), ("eng", "C0ENG"), ("ops", "C0OPS")]
    ]
    tools = {c: [line.split("\t")[0] for line in text.splitlines()[1:]] for c, text in shown.items()}
    assert "write_file" not in tools["C0GENERAL"] and "write_file" in tools["C0ENG"]
    assert any(t.startswith("tickets__") for t in tools["C0OPS"])
    assert not any(t.startswith("tickets__") for t in tools["C0GENERAL"] + tools["C0ENG"])


def test_the_readme_output_is_what_the_example_config_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    require_bwrap()
    monkeypatch.chdir(ROOT)
    environ = example_environ()
    monkeypatch.setenv("PATH", environ["PATH"])  # the servers' PATH is the process's own
    config = load_config(EXAMPLE, env=environ)
    with open_catalog(config, environ) as catalog:
        for channel, text in shown_in_readme().items():
            match = config.match(channel, "")
            out = io.StringIO()
            print(match.header(), file=out)
            list_tools(catalog.narrowed(match.settings), match.settings.policy, out)
            assert out.getvalue() == text, channel


@pytest.mark.e2e
def test_the_readme_output_is_what_the_command_prints() -> None:
    require_bwrap()
    env = {**example_environ(), "HARNESS_CONFIG": str(EXAMPLE.relative_to(ROOT))}
    for channel, text in shown_in_readme().items():
        done = subprocess.run(
            [sys.executable, "-m", "harness", "--list-tools", "--channel", channel],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if not done.stdout.startswith("# profile:"):
            pytest.skip(
                "`python -m harness --list-tools --channel` is not on this branch yet (branch replay)"
            )
        assert (done.returncode, done.stdout) == (0, text), done.stderr


def test_the_example_and_its_draft_load_and_differ_where_the_draft_says() -> None:
    now, draft = load_config(EXAMPLE, env={}), load_config(DRAFT, env={})
    assert [p.name for p in now.profiles] == ["general", "eng", "ops", "dm", "elsewhere"]
    assert now.match("D0123ABCD").profile == "dm" and now.match("C0RANDOM").profile == "elsewhere"
    assert now.match("C0RANDOM").settings.offered_servers == ()
    ops = now.for_run("C0OPS")
    assert (
        ops.requesters == ("S0SRE",) and ops.approvals.required == 2 and ops.offered_servers == ("tickets",)
    )
    assert "delete_file" in now.for_run("C0ENG").tools.builtin
    assert "delete_file" not in draft.for_run("C0ENG").tools.builtin
    assert draft.for_run("C0OPS").policy.tools["tickets__create"].value == "allow"
