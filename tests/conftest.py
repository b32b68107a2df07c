"""Shared fixtures: loopback stand-ins only; the real network is refused by construction."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from harness.client import make_client
from harness.config import Limits
from harness.loop import Agent
from harness.policy import Policy, Tier
from harness.tools import BUILTIN_TOOLS, ToolContext, ToolRegistry
from tests.fakes.messages_api import FakeMessagesAPI

# A test that starts the bot, a worker, `make run` (any `python -m` of ours) must be marked e2e.
pytest_plugins = ["tests.e2e_guard"]

# Timing is not what property tests check: on a loaded 2-core CI machine one example can take
# longer than hypothesis's default 200 ms deadline, which would fail a test for nothing.
settings.register_profile("harness", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("harness")

_real_connect = socket.socket.connect


def _loopback_only(sock: socket.socket, address: Any) -> Any:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0]
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ConnectionRefusedError(f"tests may only talk to loopback, not {host!r}")
    return _real_connect(sock, address)


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every socket of the test process may connect to loopback addresses only."""
    monkeypatch.setattr(socket.socket, "connect", _loopback_only)


@pytest.fixture(autouse=True)
def mcp_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Stdio servers started by this process keep their own directories here, not in ~/.local/state."""
    state = tmp_path_factory.mktemp("mcp-state")
    monkeypatch.setenv("HARNESS_STATE_DIR", str(state))
    return state


@pytest.fixture
def model() -> Iterator[FakeMessagesAPI]:
    """A scripted Messages API on loopback that rejects what the real one rejects."""
    with FakeMessagesAPI() as fake:
        yield fake


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace folder holding a README.md."""
    root = tmp_path / "workspace"
    root.mkdir()
    (root / "README.md").write_text("# My project\n\nSecond line.\n", encoding="utf-8")
    return root


def make_agent(
    model: FakeMessagesAPI,
    workspace: Path,
    *,
    policy: dict[str, str] | None = None,
    default: str = "ask",
    max_retries: int = 0,
    client: Any = None,
    tools: ToolRegistry | None = None,
    **limits: Any,
) -> Agent:
    """An agent on the real SDK client pointed at the stand-in."""
    tier_map = None if policy is None else {name: Tier(t) for name, t in policy.items()}
    return Agent(
        client=client or make_client(base_url=model.base_url, api_key="sk-test", max_retries=max_retries),
        tools=tools or ToolRegistry(BUILTIN_TOOLS, timeout_seconds=limits.pop("tool_timeout_seconds", 5.0)),
        context=ToolContext(workspace=workspace),
        policy=Policy() if tier_map is None else Policy(default=Tier(default), tools=tier_map),
        limits=Limits(**limits),
        model="claude-test",
    )


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Any]:
    """One private redis-server for the test session (never the machine's shared one)."""
    from tests.stack import RedisServer

    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def redis_url(redis_server: Any) -> str:
    """The private Redis, flushed before the test."""
    import redis

    redis.Redis.from_url(redis_server.url).flushdb()
    return str(redis_server.url)


@pytest.fixture
def conn(redis_url: str) -> Iterator[Any]:
    """A client of the private Redis, flushed before the test."""
    import redis

    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def store(conn: Any) -> Any:
    """The project's store on that Redis."""
    from store import Store

    return Store(conn)


def _fault_figures() -> dict[str, int]:
    """This process's tallies of faults injected (tests/e2e/test_faults.py counts them)."""
    import sys

    return dict(getattr(sys.modules.get("tests.e2e.test_faults"), "FIGURES", None) or {})


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In a pytest-xdist worker: hand this worker's fault tallies to the controller."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["fault_figures"] = _fault_figures()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """On the controller: add up what each xdist worker tallied."""
    totals = node.config.stash.setdefault(_FIGURES, {})
    for name, n in (getattr(node, "workeroutput", {}) or {}).get("fault_figures", {}).items():
        totals[name] = totals.get(name, 0) + n


_FIGURES = pytest.StashKey[dict[str, int]]()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The fault-injection tallies behind the README's figures table (summed over xdist workers)."""
    figures = terminalreporter.config.stash.get(_FIGURES, None) or _fault_figures()
    if figures:
        terminalreporter.section("faults injected and survived")
        for name, n in sorted(figures.items()):
            terminalreporter.write_line(f"{n:>6}  {name}")
