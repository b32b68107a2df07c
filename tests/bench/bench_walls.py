"""What the walls around a stdio MCP server cost: its start, and a warm call.

The real test server (`tests/fakes/mcp_server.py`, no call log) is started three ways, side by
side, in rounds whose order rotates so drift hits every row alike:

- bare: `mcp.Client` over stdio with no sandbox at all (the floor; never how the product runs it);
- walls: `Sandbox.confine` as the hub does it, `network = false`;
- walls + network: the same with `network = true` (the init forks, the egress proxy's door opens).

Start is from entering the client (spawn) to the session's `initialize` answered and the first
`tools/list` back; a warm call is `call_tool(get_ticket)` on an open session, after a warm-up.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.tools.sandbox import Sandbox, Server
from tests.bench.common import machine

SERVER = Path(__file__).resolve().parents[1] / "fakes" / "mcp_server.py"
ROUNDS, CALLS = 12, 300
KINDS = ("bare", "walls", "walls + network")


def _params(kind: str, sandbox: Sandbox) -> Any:
    from mcp import StdioServerParameters

    if kind == "bare":
        return StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio"], env={})
    server = Server("bench", sys.executable, (str(SERVER), "stdio"), network=kind != "walls")
    confined = sandbox.confine(server)
    return StdioServerParameters(
        command=confined.command, args=list(confined.args), env=dict(confined.env), cwd=confined.cwd
    )


async def _one(kind: str, sandbox: Sandbox, calls: int) -> tuple[float, list[float]]:
    from mcp import Client

    started = time.perf_counter()
    async with Client(_params(kind, sandbox)) as client:
        await client.list_tools()
        start = time.perf_counter() - started
        samples = []
        for i in range(calls + 20):
            began = time.perf_counter()
            await client.call_tool("get_ticket", {"id": "T-1"})
            if i >= 20:  # the first calls warm the server's own paths
                samples.append(time.perf_counter() - began)
    return start, samples


def run() -> str:
    with tempfile.TemporaryDirectory() as state:
        sandbox = Sandbox(state_dir=state)
        starts: dict[str, list[float]] = {k: [] for k in KINDS}
        calls: dict[str, list[float]] = {k: [] for k in KINDS}
        try:
            for r in range(ROUNDS):
                order = KINDS[r % 3 :] + KINDS[: r % 3]
                for kind in order:
                    start, samples = asyncio.run(_one(kind, sandbox, CALLS if r < 3 else 0))
                    starts[kind].append(start)
                    calls[kind].extend(samples)
        finally:
            sandbox.close()
    rows = ["| server | start, median (ms) | start vs bare | warm call, median (µs) | call vs bare |"]
    rows.append("| --- | --- | --- | --- | --- |")
    base_start = statistics.median(starts["bare"])
    base_call = statistics.median(calls["bare"])
    for kind in KINDS:
        start, call = statistics.median(starts[kind]), statistics.median(calls[kind])
        rows.append(
            f"| {kind} | {start * 1000:.0f} | {start / base_start:.2f}x | {call * 1e6:.0f} | "
            f"{call / base_call:.2f}x |"
        )
    return (
        "## Walls around a stdio MCP server\n\n"
        f"`python -m tests.bench walls` on {machine()}: {ROUNDS} starts and {3 * CALLS} warm calls of "
        "each, interleaved.\n\n" + "\n".join(rows)
    )


if __name__ == "__main__":
    print(run())
