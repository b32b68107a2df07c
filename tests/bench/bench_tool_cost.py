"""What two big MCP servers' tool definitions cost a request: sent whole, deferred, or chosen.

Figures, not timings. The servers are the real ones from issue 33, installed outside the project
and run through the harness (stdio, behind its walls):

    pip install --target … excel-mcp-server        (or a venv: BENCH_EXCEL_MCP names its command)
    PUPPETEER_SKIP_DOWNLOAD=1 npm install --prefix /tmp/bigservers @wonderwhy-er/desktop-commander
                                                   (BENCH_DESKTOP_COMMANDER_DIR names the prefix)

Each scenario lists both servers through a hub, builds the request a run would send, and sends one
run (one call of `get_time`, then an answer) to the loopback Messages API with `count_tools` on, so
its `input_tokens` count the tool definitions at 4 characters a token as the API bills them (the
issue measured about 29k for the two servers). Beside it, the harness's own estimate (JSON
characters / 3, what `--list-tools` prints and `limits.defer_tools_over_tokens` compares).

    python -m tests.bench tool_cost
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from harness.config import load_config
from harness.loop import drive
from harness.state import new_run
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from harness.tools.tool_search import definition_tokens
from tests.bench.common import table
from tests.conftest import make_agent
from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use

EXCEL = os.environ.get("BENCH_EXCEL_MCP", "/tmp/excelvenv/bin/excel-mcp-server")
DESKTOP_DIR = Path(os.environ.get("BENCH_DESKTOP_COMMANDER_DIR", "/tmp/bigservers"))
DESKTOP = DESKTOP_DIR / "node_modules/@wonderwhy-er/desktop-commander/dist/index.js"
BUDGET = 40_000  # limits.token_budget's default

SCENARIOS = {
    "both sent whole (defer_loading = false)": ("defer_loading = false\n", "defer_loading = false\n"),
    "both deferred (defer_loading = true)": ("defer_loading = true\n", "defer_loading = true\n"),
    "defer_loading not set (over defer_tools_over_tokens 10000)": ("", ""),
    "chosen: include_tools, exclude_tools, sent whole": (
        'include_tools = ["describe_*", "read_range", "write_range", "list_*"]\ndefer_loading = false\n',
        'exclude_tools = ["*process*", "*session*", "*search*", "*config*", "give_*", "get_*", "write_pdf"]\n'
        "defer_loading = false\n",
    ),
}


def servers_toml(excel: str, desktop: str) -> str:
    return (
        f'[[mcp.servers]]\nname = "excel"\ncommand = {json.dumps(EXCEL)}\nargs = ["stdio"]\n{excel}'
        f'[[mcp.servers]]\nname = "desktop"\ncommand = {json.dumps(shutil.which("node") or "node")}\n'
        f"args = [{json.dumps(str(DESKTOP))}]\n"
        # Under /tmp its walls show it only what it is given: its package's directory as its cwd.
        f"cwd = {json.dumps(str(DESKTOP_DIR))}\n{desktop}"
    )


def measure(name: str, toml: str, folder: Path, model: FakeMessagesAPI) -> list[object]:
    config_path = folder / "harness.toml"
    config_path.write_text(toml)
    config = load_config(config_path, env={"HARNESS_WORKSPACE": str(folder)})
    with McpHub(config.resolved_servers({})) as hub:
        if hub.listing().away:
            raise RuntimeError(f"a server did not start: {dict(hub.listing().away)}")
        catalog = Catalog.from_config(config, host=hub)
        registry = catalog.registry()
        costs = {c.server: c for c in catalog.costs()}
        sent = [s for s in registry.schemas() if s.get("defer_loading") is not True]
        model.reset()
        model.count_tools = True
        model.script(reply(tool_use("get_time", {})), reply(text("It is late.")))
        agent = make_agent(model, folder, tools=registry, policy={}, default="allow")
        state, _ = drive(new_run("what time is it?"), agent, lambda _event: None)
        first = model.requests[0]
    per_request = state.usage.input // max(1, state.requests)
    shown = [f"{c.tools} ({'deferred' if c.deferred_why else 'sent'})" for c in costs.values()]
    return [
        name,
        " / ".join(shown),
        sum(c.tokens for c in costs.values()),
        sum(definition_tokens(s) for s in sent),
        len(json.dumps(first["tools"])) // 4,
        per_request,
        f"{per_request / BUDGET:.0%}",
    ]


def run() -> str:
    missing = [p for p in (EXCEL, str(DESKTOP)) if not Path(p).exists()]
    if missing:
        said = ", ".join(missing)
        return f"## Tool definitions per request\n\nSkipped: not installed: {said} (see the docstring)."
    rows = []
    with tempfile.TemporaryDirectory() as tmp, FakeMessagesAPI() as model:
        for name, (excel, desktop) in SCENARIOS.items():
            rows.append(measure(name, servers_toml(excel, desktop), Path(tmp), model))
    headers = [
        "scenario",
        "tools: excel / desktop",
        "both servers, estimate if all sent (chars/3)",
        "request's tools, estimate (chars/3)",
        "`tools` on the wire, billed or not (chars/4)",
        "input tokens a request (fake, chars/4)",
        "of token_budget 40000",
    ]
    return "\n".join(
        [
            "## Tool definitions per request: excel-mcp-server + desktop-commander",
            "",
            "`python -m tests.bench tool_cost` (one run: a call of get_time, then an answer; "
            "built-ins included)",
            "",
            table(headers, rows),
        ]
    )


if __name__ == "__main__":
    print(run())
