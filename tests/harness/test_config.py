"""HARNESS_CONFIG: strict, one clear line naming the key, never a silent default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.config import BUILTIN_TOOL_NAMES, ConfigError, load_config
from harness.policy import Policy, Ruling, Tier
from harness.tools import BUILTIN_NAMES, BUILTIN_TOOLS

# The contract's example, less the keys that later issues bring: [limits] on_limit and
# [approvals] self_approval, required, escalate_after_minutes, escalate_to, grant_minutes.
CONTRACT_EXAMPLE = """
[model]
name = "claude-…"      # HARNESS_MODEL, when set, wins
system = "…"           # the system prompt (default: the built-in one); or system_file = "prompt.md"
thinking_budget = 0    # > 0: extended thinking; thinking blocks are sent back as the API requires

[limits]
max_turns = 8          # valve 1
token_budget = 40000   # valve 2: input + output + cache-creation + cache-read tokens
max_tokens = 1024      # per model request

[tools]
builtin = ["get_time", "read_file", "list_files", "write_file", "delete_file"]  # default: all
modules = []           # importable modules: every tool they define with `harness.tools.tool` is offered
allow_hidden = false   # file tools refuse any path with a component starting with "." (.env, .git, …)

[[mcp.servers]]        # one table per MCP server; its tools are offered as "<name>__<tool>"
name = "tickets"       # 1–32 characters of a–z, 0–9, -
command = "python"     # stdio transport: command, args, env, cwd …
args = ["-m", "tickets_server"]
env = { TICKETS_TOKEN = "${TICKETS_TOKEN}" }   # ${VAR} is taken from the process environment
# url = "https://mcp.example.com/mcp"          # … or streamable HTTP: url, headers
# headers = { Authorization = "Bearer ${TOKEN}" }
timeout_seconds = 60   # per call; past it a side-effecting call answers "outcome unknown"
trust_annotations = false  # true: this server's readOnlyHint may make a tool allow (step 3 below)

[policy]
default = "ask"        # tier of a tool that gets no tier from the steps below
[policy.tools]         # exact names or globs; an exact name beats a glob, a longer glob beats a shorter
get_time = "allow"
read_file = "allow"
write_file = "ask"
"tickets__*" = "ask"
send_email = "deny"
[[policy.rules]]       # argument rules: tool (name or glob), args (argument -> glob over its value), tier
tool = "write_file"
args = { path = "drafts/**" }
tier = "allow"

[approvals]
approvers = []         # Slack user IDs; empty: the person who mentioned the bot
expire_after_minutes = 1440   # a number; fractions allowed (0.05 = 3 s, for tests)
"""

OWN = {t.name: (t.own_tier, t.own_tier_why) for t in BUILTIN_TOOLS}


def tier_of(policy: Policy, name: str, args: dict[str, Any] | None = None) -> Tier:
    """The tier the loop would give a call of `name`: a built-in brings its own tier."""
    own, why = OWN.get(name, (None, ""))
    return policy.decide(name, args or {}, own, why).tier


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "harness.toml"
    path.write_text(text)
    return path


def test_no_config_gives_the_built_in_defaults(workspace: Path) -> None:
    config = load_config(env={"HARNESS_WORKSPACE": str(workspace)})
    assert (config.limits.max_turns, config.limits.token_budget, config.limits.max_tokens) == (8, 40000, 1024)
    assert tier_of(config.policy, "get_time") is Tier.ALLOW
    assert tier_of(config.policy, "write_file") is Tier.ASK
    assert config.policy.decide_tool("some_new_tool") == Ruling(Tier.ASK, "policy.default")
    assert config.tools.builtin == BUILTIN_NAMES and config.tools.modules == ()
    assert config.mcp_servers == () and config.policy.rules == ()
    assert config.model_settings.system is None and config.model_settings.thinking_budget == 0
    assert config.limits.max_input_tokens == 100_000
    assert config.approvals.expire_after_minutes == 1440
    assert config.workspace == workspace.resolve()
    assert config.tools.allow_hidden is False
    assert (config.limits.max_runs_per_user, config.limits.max_runs_per_channel) == (5, 20)


def test_the_contract_example_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, CONTRACT_EXAMPLE), env={})
    assert config.model == "claude-…"
    assert config.model_settings.system == "…" and config.model_settings.thinking_budget == 0
    assert (config.limits.max_turns, config.limits.token_budget, config.limits.max_tokens) == (8, 40000, 1024)
    assert config.tools.builtin == ("get_time", "read_file", "list_files", "write_file", "delete_file")
    assert config.tools.modules == () and config.tools.allow_hidden is False
    [server] = config.mcp_servers
    assert (server.name, server.transport, server.command, server.args) == (
        "tickets",
        "stdio",
        "python",
        ("-m", "tickets_server"),
    )
    assert server.env == {"TICKETS_TOKEN": "${TICKETS_TOKEN}"}  # the bot never resolves it
    assert (server.timeout_seconds, server.trust_annotations) == (60.0, False)
    assert config.policy.default is Tier.ASK
    assert tier_of(config.policy, "send_email") is Tier.DENY
    assert tier_of(config.policy, "delete_file") is Tier.ASK
    assert config.policy.decide_tool("tickets__close") == Ruling(Tier.ASK, 'policy.tools."tickets__*"')
    assert config.policy.decide("write_file", {"path": "drafts/a.md"}, Tier.ASK) == Ruling(
        Tier.ALLOW, 'policy.rules[1] (tool = "write_file", path = "drafts/**")'
    )
    assert tier_of(config.policy, "write_file", {"path": "a.md"}) is Tier.ASK
    assert config.approvals.approvers == () and config.approvals.expire_after_minutes == 1440
    assert config.resolved_servers({"TICKETS_TOKEN": "t0k"})[0].env == {"TICKETS_TOKEN": "t0k"}


def test_annotations_are_trusted_only_where_the_config_says_so(tmp_path: Path) -> None:
    text = (
        "[[mcp.servers]]\nname = 'plain'\ncommand = 'x'\n"
        "[[mcp.servers]]\nname = 'trusted'\ncommand = 'x'\ntrust_annotations = true\n"
        "[[mcp.servers]]\nname = 'said-no'\nurl = 'https://h/mcp'\ntrust_annotations = false\n"
    )
    servers = load_config(write(tmp_path, text), env={}).mcp_servers
    assert [s.trust_annotations for s in servers] == [False, True, False]


def test_a_server_pins_its_tools_only_where_the_config_says_so(tmp_path: Path) -> None:
    text = (
        "[[mcp.servers]]\nname = 'plain'\ncommand = 'x'\n"
        "[[mcp.servers]]\nname = 'pinned'\nurl = 'https://h/mcp'\npin_tools = true\n"
    )
    servers = load_config(write(tmp_path, text), env={}).mcp_servers
    assert [s.pin_tools for s in servers] == [False, True]


def test_harness_model_wins_over_the_model_name(tmp_path: Path) -> None:
    path = write(tmp_path, "[model]\nname = 'claude-from-file'\n")
    assert load_config(path, env={}).model == "claude-from-file"
    assert load_config(path, env={"HARNESS_MODEL": "claude-from-env"}).model == "claude-from-env"


def test_hidden_paths_can_be_allowed(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "[tools]\nallow_hidden = true\n"), env={}).tools.allow_hidden is True
    assert load_config(write(tmp_path, "[tools]\nallow_hidden = false\n"), env={}).tools.allow_hidden is False


def test_runs_per_user_and_per_channel_are_read(tmp_path: Path) -> None:
    path = write(tmp_path, "[limits]\nmax_runs_per_user = 1\nmax_runs_per_channel = 300\n")
    limits = load_config(path, env={}).limits
    assert (limits.max_runs_per_user, limits.max_runs_per_channel) == (1, 300)


def test_fractional_expiry_and_env_model(tmp_path: Path) -> None:
    path = write(tmp_path, "[approvals]\nexpire_after_minutes = 0.05\napprovers = ['U123ABC']\n")
    config = load_config(path, env={"HARNESS_MODEL": "claude-x"})
    assert config.approvals.expire_after_minutes == 0.05
    assert config.approvals.approvers == ("U123ABC",)
    assert config.model == "claude-x"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[limits]\nmax_turn = 3\n", "limits.max_turn"),
        ("[limit]\nmax_turns = 3\n", "limit"),
        ("[limits]\nmax_turns = 'eight'\n", "limits.max_turns"),
        ("[limits]\nmax_turns = 2.5\n", "limits.max_turns"),
        ("[limits]\ntoken_budget = true\n", "limits.token_budget"),
        ("[limits]\nmax_tokens = 0\n", "limits.max_tokens"),
        ("[policy]\ndefault = 'maybe'\n", "policy.default"),
        ("[policy.tools]\nwrite_file = 'Allow'\n", "policy.tools.write_file"),
        ("[policy.tools]\nwrite_file = 1\n", "policy.tools.write_file"),
        ("[policy]\nfallback = 'ask'\n", "policy.fallback"),
        ("[approvals]\napprovers = 'U123'\n", "approvals.approvers"),
        ("[approvals]\napprovers = ['alice']\n", "approvals.approvers[0]"),
        ("[approvals]\nexpire_after_minutes = '5'\n", "approvals.expire_after_minutes"),
        ("[approvals]\nexpire_after_minutes = -1\n", "approvals.expire_after_minutes"),
        ("limits = 3\n", "[limits]"),
        ("[limits]\nmax_runs_per_user = 0\n", "limits.max_runs_per_user"),
        ("[limits]\nmax_runs_per_user = 2.0\n", "limits.max_runs_per_user"),
        ("[limits]\nmax_runs_per_user = true\n", "limits.max_runs_per_user"),
        ("[limits]\nmax_runs_per_channel = -3\n", "limits.max_runs_per_channel"),
        ("[limits]\nmax_runs_per_channel = '20'\n", "limits.max_runs_per_channel"),
        ("[tools]\nallow_hidden = 'yes'\n", "tools.allow_hidden"),
        ("[tools]\nallow_hidden = 1\n", "tools.allow_hidden"),
        ("[tools]\nallow_hiden = true\n", "tools.allow_hiden"),
        ("tools = true\n", "[tools]"),
        ("[tools]\nbuiltin = ['send_email']\n", "tools.builtin[0]"),
        ("[tools]\nbuiltin = ['read_file', 'Read_File']\n", "tools.builtin[1]"),
        ("[tools]\nbuiltin = 'read_file'\n", "tools.builtin"),
        ("[tools]\nmodules = ['my-tools']\n", "tools.modules[0]"),
        ("[tools]\nmodules = ['ok.tools', 'ops..tools']\n", "tools.modules[1]"),
        ("[tools]\nmodules = ['1st']\n", "tools.modules[0]"),
        ("[tools]\nmodules = [3]\n", "tools.modules[0]"),
        ("[tools]\nmodules = 'ops'\n", "tools.modules"),
        ("[model]\nnmae = 'claude-x'\n", "model.nmae"),
        ("[model]\nname = ''\n", "model.name"),
        ("[model]\nsystem = '  '\n", "model.system"),
        ("[model]\nsystem = 'a'\nsystem_file = 'p.md'\n", "model.system_file"),
        ("[model]\nsystem_file = 'missing.md'\n", "model.system_file"),
        ("[model]\nthinking_budget = 1023\n[limits]\nmax_tokens = 4000\n", "model.thinking_budget"),
        ("[model]\nthinking_budget = -1\n", "model.thinking_budget"),
        ("[model]\nthinking_budget = 2048\n[limits]\nmax_tokens = 2048\n", "model.thinking_budget"),
        ("[model]\nthinking_budget = 1024\n", "limits.max_tokens"),  # the default 1024 leaves no room
        ("[model]\nthinking_budget = true\n", "model.thinking_budget"),
        ("[limits]\nmax_input_tokens = 10\n", "limits.max_input_tokens"),
        ("[mcp]\nserver = []\n", "mcp.server"),
        ("[mcp]\nservers = 3\n", "mcp.servers"),
        ("[[mcp.servers]]\nname = 'a'\ncommand = 'x'\nenv_vars = {}\n", "mcp.servers[0].env_vars"),
        ("[[mcp.servers]]\ncommand = 'x'\n", "mcp.servers[0].name"),
        ("[[mcp.servers]]\nname = 'Tickets'\ncommand = 'x'\n", "mcp.servers[0].name"),
        ("[[mcp.servers]]\nname = 'tickets_x'\ncommand = 'x'\n", "mcp.servers[0].name"),
        (f"[[mcp.servers]]\nname = '{'a' * 33}'\ncommand = 'x'\n", "mcp.servers[0].name"),
        ("[[mcp.servers]]\nname = ''\ncommand = 'x'\n", "mcp.servers[0].name"),
        (
            "[[mcp.servers]]\nname = 'a'\ncommand = 'x'\n[[mcp.servers]]\nname = 'a'\nurl = 'http://h/'\n",
            "mcp.servers[1].name",
        ),
        ("[[mcp.servers]]\nname = 'a'\ncommand = 'x'\nurl = 'https://h/mcp'\n", "mcp.servers[0] (a)"),
        ("[[mcp.servers]]\nname = 'a'\n", "mcp.servers[0] (a)"),
        ("[[mcp.servers]]\nname = 'a'\ncommand = 'x'\nheaders = { A = 'b' }\n", "mcp.servers[0].headers"),
        ("[[mcp.servers]]\nname = 'a'\nurl = 'https://h/mcp'\nargs = ['x']\n", "mcp.servers[0].args"),
        ("[[mcp.servers]]\nname = 'a'\nurl = 'https://h/mcp'\nenv = { A = 'b' }\n", "mcp.servers[0].env"),
        ("[[mcp.servers]]\nname = 'a'\nurl = 'ftp://h/mcp'\n", "mcp.servers[0].url"),
        ("[[mcp.servers]]\nname = 'a'\ncommand = 'x'\nargs = [1]\n", "mcp.servers[0].args"),
        ("[[mcp.servers]]\nname = 'a'\ncommand = 'x'\nenv = { A = 1 }\n", "mcp.servers[0].env"),
        ("[[mcp.servers]]\nname = 'a'\ncommand = 'x'\nenv = { A = '${1X}' }\n", "mcp.servers[0].env.A"),
        ("[[mcp.servers]]\nname = 'a'\ncommand = 'x'\nenv = { A = '${X' }\n", "mcp.servers[0].env.A"),
        ("[[mcp.servers]]\nname = 'a'\ncommand = 'x'\nenv = { A = '${}' }\n", "mcp.servers[0].env.A"),
        ("[[mcp.servers]]\nname = 'a'\ncommand = 'x'\nenv = { A = '${A-B}' }\n", "mcp.servers[0].env.A"),
        (
            "[[mcp.servers]]\nname = 'a'\nurl = 'https://h/'\nheaders = { Auth = 'Bearer ${T' }\n",
            "mcp.servers[0].headers.Auth",
        ),
        (
            "[[mcp.servers]]\nname = 'a'\ncommand = 'x'\ntimeout_seconds = 0\n",
            "mcp.servers[0].timeout_seconds",
        ),
        (
            "[[mcp.servers]]\nname = 'a'\ncommand = 'x'\ntrust_annotations = 'yes'\n",
            "mcp.servers[0].trust_annotations",
        ),
        (
            "[[mcp.servers]]\nname = 'a'\ncommand = 'x'\ntrust_annotations = 1\n",
            "mcp.servers[0].trust_annotations",
        ),
        (
            "[[mcp.servers]]\nname = 'a'\ncommand = 'x'\npin_tools = 'yes'\n",
            "mcp.servers[0].pin_tools",
        ),
        (
            "[[mcp.servers]]\nname = 'a'\ncommand = 'x'\npin_tools = 1\n",
            "mcp.servers[0].pin_tools",
        ),
        (
            "[[mcp.servers]]\nname = 'a'\ncommand = 'x'\ntrust_annotation = true\n",
            "mcp.servers[0].trust_annotation",
        ),
        ("[[policy.rules]]\ntool = 'x'\ntier = 'maybe'\n", "policy.rules[1].tier"),
        (
            "[[policy.rules]]\ntool = 'x'\ntier = 'allow'\n[[policy.rules]]\ntool = 'y'\ntier = 'no'\n",
            "policy.rules[2].tier",
        ),
        ("[[policy.rules]]\ntool = 'x'\ntier = 'allow'\nargs_ = {}\n", "policy.rules[1].args_"),
        ("[[policy.rules]]\ntier = 'allow'\n", "policy.rules[1].tool"),
        ("[[policy.rules]]\ntool = 'x'\n", "policy.rules[1].tier"),
        ("[[policy.rules]]\ntool = ''\ntier = 'allow'\n", "policy.rules[1].tool"),
        ("[[policy.rules]]\ntool = 3\ntier = 'allow'\n", "policy.rules[1].tool"),
        ("[[policy.rules]]\ntool = 'x'\ntier = 'allow'\nargs = 'path'\n", "policy.rules[1].args"),
        ("[[policy.rules]]\ntool = 'x'\ntier = 'allow'\nargs = { path = 3 }\n", "policy.rules[1].args.path"),
        ("[policy]\nrules = 3\n", "policy.rules"),
        ("[policy]\ntools = 3\n", "[policy.tools]"),
    ],
)
def test_a_bad_key_fails_with_one_line_naming_it(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), env={})
    message = str(caught.value)
    assert key in message and "\n" not in message


def test_unreadable_config_files_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[limits\n"), env={})


def test_a_missing_workspace_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="HARNESS_WORKSPACE"):
        load_config(env={"HARNESS_WORKSPACE": str(tmp_path / "nope")})


# --- [tools] ---------------------------------------------------------------------------------


def test_the_config_and_the_tools_agree_on_the_built_in_names() -> None:
    assert BUILTIN_TOOL_NAMES == BUILTIN_NAMES


def test_tools_builtin_keeps_only_the_named_built_ins(tmp_path: Path) -> None:
    path = write(
        tmp_path, "[tools]\nbuiltin = ['read_file', 'get_time', 'read_file']\nmodules = ['ops.tools']\n"
    )
    tools = load_config(path, env={}).tools
    assert tools.builtin == ("read_file", "get_time")
    assert tools.modules == ("ops.tools",)  # importing is the catalog's job, not the loader's
    assert load_config(write(tmp_path, "[tools]\nbuiltin = []\n"), env={}).tools.builtin == ()


# --- [model] ---------------------------------------------------------------------------------


def test_thinking_budget_fits_under_max_tokens(tmp_path: Path) -> None:
    path = write(tmp_path, "[model]\nthinking_budget = 1024\n[limits]\nmax_tokens = 1025\n")
    assert load_config(path, env={}).model_settings.thinking_budget == 1024
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, "[model]\nthinking_budget = 4096\n[limits]\nmax_tokens = 4096\n"), env={})
    assert "model.thinking_budget" in str(caught.value) and "limits.max_tokens" in str(caught.value)


def test_system_file_is_read_relative_to_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_dir, elsewhere = tmp_path / "etc", tmp_path / "elsewhere"
    (config_dir / "prompts").mkdir(parents=True)
    elsewhere.mkdir()
    (config_dir / "prompts" / "system.md").write_text("You are the ops bot.\n", encoding="utf-8")
    (elsewhere / "prompts").mkdir()
    (elsewhere / "prompts" / "system.md").write_text("the wrong prompt", encoding="utf-8")
    (config_dir / "harness.toml").write_text("[model]\nsystem_file = 'prompts/system.md'\n", encoding="utf-8")
    monkeypatch.chdir(elsewhere)

    by_absolute = load_config(config_dir / "harness.toml", env={})
    by_relative = load_config("../etc/harness.toml", env={})
    by_env = load_config(env={"HARNESS_CONFIG": "../etc/harness.toml"})
    for config in (by_absolute, by_relative, by_env):
        assert config.model_settings.system == "You are the ops bot."


def test_system_file_may_be_absolute_and_must_not_be_empty(tmp_path: Path) -> None:
    prompt = tmp_path / "sub" / "p.md"
    prompt.parent.mkdir()
    prompt.write_text("Be brief.", encoding="utf-8")
    path = write(tmp_path, f"[model]\nsystem_file = '{prompt}'\n")
    assert load_config(path, env={}).model_settings.system == "Be brief."
    prompt.write_text("  \n", encoding="utf-8")
    with pytest.raises(ConfigError, match="model.system_file"):
        load_config(path, env={})


# --- [[mcp.servers]] -----------------------------------------------------------------------------

SERVERS = """
[[mcp.servers]]
name = "tickets"
command = "python"
args = ["-m", "tickets_server"]
env = { TICKETS_TOKEN = "${TICKETS_TOKEN}", MIXED = "${USER_NAME}:${TICKETS_TOKEN}", PLAIN = "$HOME" }
cwd = "/srv/tickets"

[[mcp.servers]]
name = "docs-2"
url = "https://bob:pw-in-url@mcp.example.com/mcp?key=in-query#frag"
headers = { Authorization = "Bearer ${DOCS_TOKEN}" }
timeout_seconds = 5
"""
SECRET = "sk-live-7d1f9c2e"
ENVIRON = {"TICKETS_TOKEN": SECRET, "USER_NAME": "ops", "DOCS_TOKEN": SECRET + "-docs"}


def test_servers_resolve_their_variables_from_the_environment(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, SERVERS), env={})
    tickets, docs = config.resolved_servers(ENVIRON)
    assert tickets.env == {"TICKETS_TOKEN": SECRET, "MIXED": f"ops:{SECRET}", "PLAIN": "$HOME"}
    assert tickets.config.transport == "stdio" and tickets.config.cwd == "/srv/tickets"
    assert docs.headers == {"Authorization": f"Bearer {SECRET}-docs"}
    assert docs.config.transport == "http" and docs.config.timeout_seconds == 5.0


def test_the_bot_parses_servers_without_their_variables(tmp_path: Path) -> None:
    """Only a process that starts servers resolves them: loading with an empty environment is fine."""
    config = load_config(write(tmp_path, SERVERS), env={})
    assert [s.name for s in config.mcp_servers] == ["tickets", "docs-2"]
    assert config.mcp_servers[0].env["TICKETS_TOKEN"] == "${TICKETS_TOKEN}"


@pytest.mark.parametrize(
    ("missing", "key"),
    [
        ("TICKETS_TOKEN", "mcp.servers[tickets].env.TICKETS_TOKEN"),
        ("USER_NAME", "mcp.servers[tickets].env.MIXED"),
        ("DOCS_TOKEN", "mcp.servers[docs-2].headers.Authorization"),
    ],
)
def test_a_missing_variable_names_itself_and_the_key(tmp_path: Path, missing: str, key: str) -> None:
    config = load_config(write(tmp_path, SERVERS), env={})
    environ = {k: v for k, v in ENVIRON.items() if k != missing}
    with pytest.raises(ConfigError) as caught:
        config.resolved_servers(environ)
    message = str(caught.value)
    assert key in message and "${" + missing + "}" in message and "\n" not in message
    assert SECRET not in message


def test_resolved_servers_default_to_the_process_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(write(tmp_path, SERVERS), env={})
    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    assert config.resolved_servers()[0].env["TICKETS_TOKEN"] == SECRET
    monkeypatch.delenv("DOCS_TOKEN")
    with pytest.raises(ConfigError, match="DOCS_TOKEN"):
        config.resolved_servers()


def test_no_repr_of_a_config_or_its_resolved_servers_shows_a_secret(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, SERVERS), env={})
    resolved = config.resolved_servers(ENVIRON)
    assert resolved[0].env["TICKETS_TOKEN"] == SECRET  # the secret is there to be hidden
    shown = [
        repr(config),
        str(config),
        repr(resolved),
        str(resolved),
        *map(repr, resolved),
        *map(str, resolved),
    ]
    for text in shown:
        assert SECRET not in text
    assert "tickets" in repr(resolved[0])


def test_a_server_is_described_without_what_a_url_may_hide(tmp_path: Path) -> None:
    tickets, docs = load_config(write(tmp_path, SERVERS), env={}).mcp_servers
    assert tickets.describe() == "tickets (stdio: python)"
    assert docs.describe() == "docs-2 (https://mcp.example.com/mcp)"
