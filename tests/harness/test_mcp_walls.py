"""A stdio MCP server that turns hostile reaches nothing: the walls of issue 30, tried as an attacker.

A real hostile server (`tests/fakes/hostile_mcp_server.py`, its `breach` tool) run by a real hub
tries each attack that worked when a server saw the filesystem read-write and shared the network:
read the checkout's `.env`, the config, the audit, the user's credentials; write the config, the
virtual environment (a `.pth` runs in every Python started from it), the workspace, `.git/hooks`,
anything outside its own directories; connect to Redis, the bot and any other loopback port, over
TCP or a Unix socket. Each attempt must fail, and the server must still work where it is allowed.

The process's working directory is a checkout-like directory outside `/tmp` (whose whole tree a
server never sees anyway), so the walls are tried where a worker really runs.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.config import Config, load_config
from harness.tools import ToolContext
from harness.tools.catalog import Catalog
from harness.tools.mcp import McpHub
from tests.mcp_support import hostile_table, out, require_bwrap

PLANTED = "# planted by a hostile MCP server"


@pytest.fixture
def checkout(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The worker's working directory, as a deployment has it: outside /tmp, with secrets beside code."""
    require_bwrap()
    root = Path.home() / ".cache" / "slack-harness-tests" / uuid.uuid4().hex
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    (root / ".env").write_text("SLACK_BOT_TOKEN=xoxb-from-dotenv\n")
    (root / ".env.production").write_text("REDIS_URL=redis://:pw-from-dotenv@10.0.0.5/0\n")
    (root / "workspace").mkdir()
    (root / "workspace" / "README.md").write_text("# the workspace\n")
    (root / "etc").mkdir()
    (root / "etc" / "harness.toml").write_text("")
    (root / "etc" / "prompt.md").write_text("the system prompt\n")
    (root / "audit").mkdir()
    (root / "audit" / "2026-12-05.jsonl").write_text('{"who": "UALICE"}\n')
    (root / "creds").mkdir()
    (root / "creds" / "db-password").write_text("pw-from-a-file-variable\n")
    home = root / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("aws_secret_access_key = AKIA\n")
    (home / ".netrc").write_text("machine api.example.com password pw-from-netrc\n")
    (home / ".rediscli_history").write_text("AUTH pw-from-history\n")
    (home / "notes.txt").write_text("not a secret\n")
    monkeypatch.chdir(root)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HARNESS_CONFIG", str(root / "etc" / "harness.toml"))
    monkeypatch.setenv("HARNESS_AUDIT_DIR", str(root / "audit"))
    monkeypatch.setenv("DB_PASSWORD_FILE", str(root / "creds" / "db-password"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def hub_for(checkout: Path, toml: str) -> tuple[McpHub, Catalog]:
    config_file = checkout / "etc" / "harness.toml"
    config_file.write_text(toml + '[policy]\ndefault = "allow"\n')
    config: Config = load_config(config_file, env={"HARNESS_WORKSPACE": str(checkout / "workspace")})
    hub = McpHub(config.resolved_servers({})).start()
    return hub, Catalog.from_config(config, host=hub)


def breach(catalog: Catalog, checkout: Path, **targets: list[str]) -> dict[str, Any]:
    args = {k: targets.get(k, []) for k in ("reads", "lists", "writes", "connects", "unix", "proxied")}
    result = catalog.registry().run("evil__breach", args, ToolContext(workspace=checkout / "workspace"))
    assert not result.is_error, result.content
    return json.loads(str(result.content))


@pytest.fixture
def evil(checkout: Path, tmp_path: Path) -> Iterator[tuple[Catalog, Path]]:
    """The hostile server with a writable directory of its own (where it reports), no network."""
    report = out(tmp_path, "report.jsonl")
    hub, catalog = hub_for(checkout, hostile_table("evil", report))
    try:
        assert not hub.listing().away, hub.listing().away
        yield catalog, report
    finally:
        hub.close()


def test_a_stdio_server_cannot_read_the_config_the_audit_the_dotenv_or_the_users_credentials(
    evil: tuple[Catalog, Path], checkout: Path
) -> None:
    catalog, _ = evil
    home = checkout / "home"
    secrets = [
        checkout / ".env",
        checkout / ".env.production",
        checkout / "etc" / "harness.toml",
        checkout / "audit" / "2026-12-05.jsonl",
        checkout / "creds" / "db-password",
        home / ".ssh" / "id_ed25519",
        home / ".aws" / "credentials",
        home / ".netrc",
        home / ".rediscli_history",
    ]
    seen = breach(catalog, checkout, reads=[str(p) for p in secrets], lists=[str(checkout), str(home)])
    for path in secrets:
        assert seen["reads"][str(path)].startswith("error"), (path, seen["reads"][str(path)])
    # Not there at all, not even as a name: the checkout and the home show everything else.
    listed_checkout = seen["lists"][str(checkout)].removeprefix("listed: ").split(",")
    assert ".env" not in listed_checkout and ".env.production" not in listed_checkout
    assert {"workspace", ".git", "etc"} <= set(listed_checkout)
    listed_home = seen["lists"][str(home)].removeprefix("listed: ").split(",")
    assert "notes.txt" in listed_home
    assert not {".ssh", ".aws", ".netrc", ".rediscli_history"} & set(listed_home)
    # What is not secret stays readable: the workspace, the system prompt beside the config.
    seen = breach(
        catalog,
        checkout,
        reads=[str(checkout / "workspace" / "README.md"), str(checkout / "etc" / "prompt.md")],
    )
    assert all(v.startswith("read: ") for v in seen["reads"].values()), seen["reads"]


def test_a_dotenv_made_after_the_server_started_is_not_in_its_view_either(
    evil: tuple[Catalog, Path], checkout: Path
) -> None:
    catalog, _ = evil
    late = checkout / ".env.local"
    late.write_text("ANTHROPIC_API_KEY=sk-ant-late\n")
    replaced = checkout / "etc" / "harness.toml.new"
    replaced.write_text("[policy]\ndefault = 'allow'\n")
    replaced.rename(checkout / "etc" / "harness.toml")  # as an editor saves: a new file, renamed over
    seen = breach(catalog, checkout, reads=[str(late), str(checkout / "etc" / "harness.toml")])
    assert all(v.startswith("error") for v in seen["reads"].values()), seen["reads"]


def test_a_stdio_server_writes_nowhere_but_its_cwd_its_writable_and_its_own_temporary_directory(
    evil: tuple[Catalog, Path], checkout: Path, tmp_path: Path
) -> None:
    catalog, report = evil
    site = (
        Path(sys.prefix)
        / "lib"
        / f"python{sys.version_info.major}.{sys.version_info.minor}"
        / "site-packages"
    )
    pth = site / f"zz-hostile-{uuid.uuid4().hex}.pth"  # a comment line if it were ever written
    attempts = [
        checkout / "etc" / "harness.toml",
        checkout / "etc" / "prompt.md",
        pth,
        checkout / "workspace" / "README.md",
        checkout / "workspace" / "new.md",
        checkout / ".git" / "hooks" / "pre-commit",
        checkout / "planted.py",
        Path(__file__).resolve().parents[1] / "fakes" / "hostile_mcp_server.py",
        Path("/etc") / f"cron-{uuid.uuid4().hex}",
        Path.home() / "notes.txt",
    ]
    try:
        seen = breach(
            catalog,
            checkout,
            writes=[
                *(str(p) for p in attempts),
                str(report.parent / "mine.txt"),
                "in-cwd.txt",
                "/tmp/scratch.txt",
                str(tmp_path / "outside.txt"),
            ],
        )
    finally:
        pth.unlink(missing_ok=True)
    for path in attempts:
        assert seen["writes"][str(path)].startswith("error"), (path, seen["writes"][str(path)])
        assert not (path.read_text().endswith(PLANTED + "\n") if path.is_file() else False)
    assert not (checkout / "workspace" / "new.md").exists() and not (checkout / "planted.py").exists()
    # Its own places: the writable directory, its cwd (its own directory), its temporary directory.
    assert seen["writes"][str(report.parent / "mine.txt")] == "wrote"
    assert seen["writes"]["in-cwd.txt"] == "wrote" and seen["writes"]["/tmp/scratch.txt"] == "wrote"
    own = Path(os.environ["HARNESS_STATE_DIR"]) / "mcp" / "evil"
    assert seen["cwd"] == str(own) and (own / "in-cwd.txt").read_text().endswith(PLANTED + "\n")
    # Its /tmp is its own, not the machine's: what it writes there (even beside the directory it may
    # write) stays in its sandbox.
    assert not Path("/tmp/scratch.txt").exists() and not (tmp_path / "outside.txt").exists()


class Listener:
    """A TCP or Unix listener that records whether anything connected (the bot, Redis, a socket)."""

    def __init__(self, family: int, address: Any) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(8)
        self.address = self.sock.getsockname()
        self.connected = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connected.set()
            conn.sendall(b"+PONG\r\n")
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_a_stdio_server_without_network_reaches_no_loopback_port_and_no_unix_socket(
    evil: tuple[Catalog, Path], checkout: Path, redis_url: str
) -> None:
    catalog, _ = evil
    bot = Listener(socket.AF_INET, ("127.0.0.1", 0))
    v6 = Listener(socket.AF_INET6, ("::1", 0)) if socket.has_ipv6 else None
    (checkout / "run").mkdir()
    unix = Listener(socket.AF_UNIX, str(checkout / "run" / "redis.sock"))
    redis_port = redis_url.rsplit(":", 1)[1].split("/")[0]
    try:
        targets = [f"127.0.0.1:{bot.address[1]}", f"127.0.0.1:{redis_port}", f"localhost:{redis_port}"]
        if v6 is not None:
            targets.append(f"[::1]:{v6.address[1]}")
        seen = breach(catalog, checkout, connects=targets, unix=[str(checkout / "run" / "redis.sock")])
        for target in targets:
            assert seen["connects"][target].startswith("error"), (target, seen["connects"][target])
        # A read-only mount does not stop a connect to a Unix socket: no Unix socket is made at all.
        assert seen["unix"][str(checkout / "run" / "redis.sock")] == "error: no socket: Permission denied"
        assert not bot.connected.is_set() and not unix.connected.is_set()
        assert v6 is None or not v6.connected.is_set()
    finally:
        bot.close()
        unix.close()
        if v6 is not None:
            v6.close()


@pytest.mark.parametrize(
    "where",
    ["config", "checkout", "venv", "audit", "credentials"],
)
def test_a_writable_that_would_open_a_wall_keeps_the_server_from_starting_with_one_whole_line(
    where: str, checkout: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = {
        "config": checkout / "etc",
        "checkout": checkout,
        "venv": Path(sys.prefix),
        "audit": checkout / "audit" / "sub",
        "credentials": checkout / "home" / ".ssh",
    }[where]
    directory.mkdir(exist_ok=True)
    report = out(tmp_path, "report.jsonl")
    table = (
        hostile_table("evil", report)
        + f"writable = [{json.dumps(str(report.parent))}, {json.dumps(str(directory))}]\n"
    )
    table = table.replace(f"writable = [{json.dumps(str(report.parent))}]\n", "", 1)
    with caplog.at_level(logging.WARNING, logger="harness.mcp"):
        hub, catalog = hub_for(checkout, table)
        try:
            away = hub.listing().away
            result = catalog.registry().run("evil__breach", {}, ToolContext(workspace=checkout / "workspace"))
        finally:
            hub.close()
    assert "evil" in away
    assert result.is_error
    lines = [r.getMessage() for r in caplog.records if "MCP server evil" in r.getMessage()]
    assert lines, caplog.text
    # The line says why and how to fix it, whole: nothing cuts the fix off.
    assert str(directory) in lines[0] and (
        "give it a directory of its own" in lines[0] or "another directory" in lines[0]
    )
    assert not report.exists()  # the server never ran


@pytest.mark.parametrize("network", [True, ["api.example.com"]])
def test_a_server_with_network_reaches_only_public_addresses_through_the_proxy(
    network: bool | list[str], checkout: Path, tmp_path: Path, redis_url: str
) -> None:
    """`network = true` is outbound to public addresses only: never the host's loopback (Redis, the
    bot), private ranges or cloud metadata, whether asked directly or through the proxy. Every
    destination here is refused before any connection is tried: no packet leaves for it."""
    report = out(tmp_path, "report.jsonl")
    hub, catalog = hub_for(checkout, hostile_table("evil", report) + f"network = {json.dumps(network)}\n")
    bot = Listener(socket.AF_INET, ("127.0.0.1", 0))
    redis_port = redis_url.rsplit(":", 1)[1].split("/")[0]
    try:
        assert not hub.listing().away, hub.listing().away
        direct = [f"127.0.0.1:{bot.address[1]}", f"127.0.0.1:{redis_port}"]
        proxied = [
            f"127.0.0.1:{bot.address[1]}",
            f"127.0.0.1:{redis_port}",
            f"localhost:{redis_port}",
            "10.0.0.1:6379",
            "192.168.1.1:80",
            "169.254.169.254:80",
            "[::1]:6379",
            "2130706433:6379",
        ]
        seen = breach(catalog, checkout, connects=direct, proxied=proxied)
        for target in direct:
            assert seen["connects"][target].startswith("error"), (target, seen["connects"][target])
        for target in proxied:
            assert seen["proxied"][target].startswith("answered: HTTP/1.1 403"), (
                target,
                seen["proxied"][target],
            )
        assert not bot.connected.is_set()
    finally:
        bot.close()
        hub.close()


NOBODY_PROBE = """
import json, os, socket, sys
out = {}
ROOT = %r
for path in (ROOT + "/.env", ROOT + "/etc/harness.toml"):
    try:
        out[path] = open(path).read()
    except OSError as exc:
        out[path] = f"error: {exc.strerror}"
try:
    open(ROOT + "/planted.txt", "a").write("planted")
    out["write"] = "wrote"
except OSError as exc:
    out["write"] = f"error: {exc.strerror}"
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3).close()
    out["connect"] = "connected"
except OSError as exc:
    out["connect"] = f"error: {exc.strerror}"
print(json.dumps(out))
"""
AS_NOBODY = """
import json, subprocess, sys
from harness.tools.sandbox import Sandbox, Server
confined = Sandbox().confine(Server(name="probe", command=sys.executable, args=tuple(sys.argv[1:])))
done = subprocess.run([confined.command, *confined.args], env=dict(confined.env), cwd=confined.cwd,
                      capture_output=True, text=True, timeout=60)
print(done.stdout or done.stderr)
"""


def test_the_walls_hold_for_a_worker_that_is_not_root(redis_url: str) -> None:
    """As user nobody, bubblewrap makes its namespaces through a user namespace, not root's powers:
    the same walls, tried on files nobody may read and write outside the sandbox."""
    require_bwrap()
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv: the test runs the worker's side as user nobody")
    root = Path("/srv") / f"harness-walls-{uuid.uuid4().hex}"
    try:
        (root / "etc").mkdir(parents=True)
        (root / "etc" / "harness.toml").write_text("[policy]\n")
        (root / ".env").write_text("SLACK_BOT_TOKEN=xoxb-nobody\n")
        (root / "probe.py").write_text(NOBODY_PROBE % str(root))
        (root / "state").mkdir()
        shutil.chown(root, "nobody")
        shutil.chown(root / "state", "nobody")
        # The system's Python with this venv's packages: the venv's own interpreter may lie under a
        # home that user nobody cannot enter (the sandbox runs it as nobody too).
        python = shutil.which("python3.11", path="/usr/bin:/usr/local/bin") or sys.executable
        site = [p for p in sys.path if p.endswith("site-packages")]
        runs = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", "import pydantic"],
            capture_output=True,
            env={"PYTHONPATH": os.pathsep.join(site)},
        )
        if runs.returncode != 0:
            pytest.skip(f"user nobody cannot run {python} with this venv's packages: {runs.stderr[-200:]!r}")
        redis_port = redis_url.rsplit(":", 1)[1].split("/")[0]
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), *site]),
            "HARNESS_CONFIG": str(root / "etc" / "harness.toml"),
            "HARNESS_STATE_DIR": str(root / "state"),
            "HOME": str(root / "state"),
        }
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", AS_NOBODY]
            + [str(root / "probe.py"), redis_port],
            capture_output=True,
            text=True,
            env=env,
            cwd=root,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen[str(root / ".env")].startswith("error"), seen
        assert seen[str(root / "etc" / "harness.toml")].startswith("error"), seen
        assert seen["write"].startswith("error") and not (root / "planted.txt").exists()
        assert seen["connect"].startswith("error"), seen
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_program_under_tmp_reads_its_neighbours_as_a_checkout_there_would(tmp_path: Path) -> None:
    """A command that lives under /tmp (a checkout CI cloned there, its venv, its node_modules) keeps
    the directory it stands in readable: a program reads its neighbours, not only its own file."""
    require_bwrap()
    from harness.tools.sandbox import Sandbox, Server

    package = tmp_path / "checkout"
    (package / "bin").mkdir(parents=True)
    (package / "lib").mkdir()
    (package / "lib" / "data.txt").write_text("a neighbour's data\n")
    tool = package / "bin" / "tool"
    tool.write_text('#!/bin/sh\ncat "$(dirname "$0")/../lib/data.txt"\n')
    tool.chmod(0o755)
    sandbox = Sandbox(state_dir=str(tmp_path / "state"))
    try:
        confined = sandbox.confine(Server(name="neighbours", command=str(tool)))
        done = subprocess.run(
            [confined.command, *confined.args],
            env=dict(confined.env),
            cwd=confined.cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        sandbox.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout == "a neighbour's data\n"
