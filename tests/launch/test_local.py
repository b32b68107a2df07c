"""`python -m launch.local`, the Procfile and the Slack app manifest."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from launch.modes import check_settings, playground_envs, wants_playground
from launch.redis_server import find_redis, redis_answers, start_private_redis
from messages import texts
from tests.sentinel_support import PASSWORD as SENTINEL_PASSWORD
from tests.sentinel_support import SentinelGroup
from tests.stack import RedisServer

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {"SLACK_BOT_TOKEN": "xoxb-test", "SLACK_SIGNING_SECRET": "secret", "ANTHROPIC_API_KEY": "sk-test"}
# A fake child: writes its environment as JSON to the file named by its argument (if any), says it
# is up (with the Redis it was given, less any password, and its pid), says bye on SIGTERM.
FAKE_CHILD = (
    "import json, os, signal, sys, time\n"
    "from urllib.parse import urlsplit\n"
    "signal.signal(signal.SIGTERM, lambda *_: (print('bye', flush=True), sys.exit(0)))\n"
    "if len(sys.argv) > 1:\n"
    "    with open(sys.argv[1] + '.part', 'w') as f: json.dump(dict(os.environ), f)\n"
    "    os.replace(sys.argv[1] + '.part', sys.argv[1])\n"
    "url = urlsplit(os.environ['REDIS_URL'])\n"
    "print('up', url._replace(netloc=f'{url.hostname}:{url.port}').geturl(), os.getpid(), flush=True)\n"
    "time.sleep(60)\n"
)
STUBBORN_CHILD = (
    "import os, signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('up', os.environ['REDIS_URL'], os.getpid(), flush=True)\n"
    "time.sleep(60)\n"
)


def python_cmd(code: str, *args: str) -> str:
    """A shell-split string running `code` in this interpreter, with `args` in its sys.argv[1:]."""
    return shlex.join([sys.executable, "-c", code, *args])


def child_env(tmp_path: Path, name: str) -> dict[str, str]:
    """The environment the fake child `name` (web or worker) of the `dev_env` fixture was started with."""
    return json.loads((tmp_path / f"{name}.env.json").read_text())  # type: ignore[no-any-return]


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its parent counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def redis_ping(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        return sock.recv(64)


def eventually(condition: Callable[[], object], timeout: float = 10.0) -> object:
    """Poll `condition` until it is truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout} s")


class Dev:
    """A running `python -m launch.local`, its output collected line by line."""

    def __init__(self, env: dict[str, str], *args: str, cwd: Path = ROOT) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "launch.local", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.stderr = ""
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()

    def line(self, pattern: str, timeout: float = 10.0) -> re.Match[str]:
        """The first output line matching `pattern` (waiting for it)."""

        def find() -> re.Match[str] | None:
            return next((m for line in list(self.lines) if (m := re.match(pattern, line))), None)

        try:
            return eventually(find, timeout)  # type: ignore[return-value]
        except AssertionError:
            raise AssertionError(f"no line matching {pattern!r} in:\n" + "\n".join(self.lines)) from None

    def index(self, pattern: str) -> int:
        return next(i for i, line in enumerate(self.lines) if re.match(pattern, line))

    def output(self) -> str:
        """Everything it printed so far, stdout and stderr."""
        return "\n".join(self.lines) + "\n" + self.stderr

    def finish(self, timeout: float = 60.0) -> int:
        """Exit status, once the process has exited and its output is read."""
        code = self.proc.wait(timeout)
        for reader in self._readers:
            reader.join(5)
        return code


@pytest.fixture
def dev_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment with the settings, fake children (see `child_env`), and no Redis on the probed port."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLACK_", "ANTHROPIC_", "REDIS_", "HARNESS_"))
    }
    env.update(SETTINGS)
    env["PYTHONPATH"] = str(ROOT)  # `launch.local` runs in tmp_path
    env["HARNESS_DEV_REDIS_PROBE"] = f"127.0.0.1:{unused_port()}"
    env["HARNESS_DEV_WEB_CMD"] = python_cmd(FAKE_CHILD, str(tmp_path / "web.env.json"))
    env["HARNESS_DEV_WORKER_CMD"] = python_cmd(FAKE_CHILD, str(tmp_path / "worker.env.json"))
    yield env


@pytest.fixture
def given_redis() -> Iterator[RedisServer]:
    """A Redis to give as REDIS_URL (so that none is started): `launch.local` refuses one not answering."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def run_dev(tmp_path: Path) -> Iterator[Callable[..., Dev]]:
    """Starts `launch.local` in tmp_path; afterwards kills what is left of it and of the pids it reported."""
    started: list[Dev] = []

    def start(env: dict[str, str], *args: str) -> Dev:
        started.append(Dev(env, *args, cwd=tmp_path))
        return started[-1]

    yield start
    for dev in started:
        if dev.proc.poll() is None:
            dev.proc.kill()
            dev.proc.wait()
        for line in dev.lines:
            if m := re.search(r"\(pid (\d+)\)", line):
                pid = int(m.group(1))
                if pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.e2e
def test_missing_settings_print_one_line_each_and_start_nothing(
    dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev]
) -> None:
    """Some Slack settings but not all (none at all is the playground): a mistake, named line by line."""
    marker = tmp_path / "started"
    for name in SETTINGS:
        del dev_env[name]
    dev_env["SLACK_APP_TOKEN"] = "xapp-test"  # Socket Mode meant, but the bot token and the key forgotten
    dev_env["HARNESS_DEV_WEB_CMD"] = python_cmd(f"open({str(marker)!r}, 'w')")
    dev = run_dev(dev_env, "--data-dir", str(tmp_path / "data"))

    assert dev.finish() == 2
    lines = dev.stderr.splitlines()
    assert [line.split()[0] for line in lines] == ["SLACK_BOT_TOKEN", "ANTHROPIC_API_KEY"]
    assert "https://api.slack.com/apps" in lines[0] and "OAuth & Permissions" in lines[0]
    assert "https://console.anthropic.com/settings/keys" in lines[1]
    assert "Basic Information" in check_settings({"SLACK_BOT_TOKEN": "xoxb-1", "ANTHROPIC_API_KEY": "k"})[0]
    assert dev.lines == []
    assert not marker.exists() and not (tmp_path / "data").exists() and not (tmp_path / "workspace").exists()


def test_no_slack_setting_at_all_means_the_playground_with_its_own_slack_and_model() -> None:
    assert wants_playground({}) and wants_playground({"SLACK_BOT_TOKEN": "  ", "ANTHROPIC_API_KEY": "k"})
    assert not wants_playground({"SLACK_SIGNING_SECRET": "s"})
    assert check_settings({}) == []
    envs, page = playground_envs({"PORT": "4321"})
    assert page == "http://127.0.0.1:4321/"
    web, worker, play = envs["web"], envs["worker"], envs["playground"]
    assert web["SLACK_BOT_TOKEN"] == worker["SLACK_BOT_TOKEN"] == play["SLACK_BOT_TOKEN"]
    assert web["SLACK_BOT_TOKEN"].startswith("xoxb-") and len(web["SLACK_SIGNING_SECRET"]) >= 32
    assert worker["SLACK_API_URL"] == page + "api/" and worker["ANTHROPIC_BASE_URL"] == page + "model"
    assert play["PORT"] == "4321" and web["PORT"] != "4321" and web["HOST"] == "127.0.0.1"
    assert play["PLAYGROUND_BOT_URL"] == f"http://127.0.0.1:{web['PORT']}/slack/events"
    assert worker["HARNESS_CONFIG"].endswith("playground/config.toml")
    # what the playground's config starts its own MCP server (`rooms`) with: this Python, this project
    assert worker["PLAYGROUND_PYTHON_BIN"] == os.path.dirname(sys.executable)
    assert worker["PLAYGROUND_ROOT"] == str(ROOT)
    again, _ = playground_envs({})
    assert again["web"]["SLACK_SIGNING_SECRET"] != web["SLACK_SIGNING_SECRET"]  # fresh per start

    with_key, _ = playground_envs({"ANTHROPIC_API_KEY": "sk-real", "HARNESS_CONFIG": "mine.toml"})
    assert (
        "ANTHROPIC_BASE_URL" not in with_key["worker"]
        and "PLAYGROUND_DEMO_MODEL" not in with_key["playground"]
    )
    assert (
        with_key["worker"]["ANTHROPIC_API_KEY"] == "sk-real"
        and with_key["worker"]["HARNESS_CONFIG"] == "mine.toml"
    )
    assert "ANTHROPIC_API_KEY" not in with_key["playground"]  # the page's process needs no key


def test_playground_model_demo_forces_the_demo_model_and_keeps_the_key_from_every_child() -> None:
    real = {"ANTHROPIC_API_KEY": "sk-real", "ANTHROPIC_AUTH_TOKEN": "tok-real", "PLAYGROUND_MODEL": "demo"}
    assert check_settings(real) == []
    envs, page = playground_envs({**real, "PLAYGROUND_DEMO_MODEL": "0"})
    for name, env in envs.items():
        assert "sk-real" not in env.values() and "tok-real" not in env.values(), name
    assert envs["worker"]["ANTHROPIC_BASE_URL"] == envs["web"]["ANTHROPIC_BASE_URL"] == page + "model"
    assert envs["worker"]["ANTHROPIC_API_KEY"] == "playground-demo-model"
    assert envs["playground"]["PLAYGROUND_DEMO_MODEL"] == "1"
    assert envs["playground"]["PLAYGROUND_MODEL"] == "demo"  # the page says why it is the demo

    stale, _ = playground_envs({"ANTHROPIC_API_KEY": "sk-real", "PLAYGROUND_DEMO_MODEL": "1"})
    assert "PLAYGROUND_DEMO_MODEL" not in stale["playground"]  # Claude's answers are not called the demo's


@pytest.mark.parametrize("value", ["claude", "Demo", "1"])
def test_a_playground_model_other_than_demo_is_one_line_naming_it(value: str) -> None:
    (line,) = check_settings({"ANTHROPIC_API_KEY": "sk-real", "PLAYGROUND_MODEL": value})
    assert line.startswith(f"PLAYGROUND_MODEL={value}: the only value is demo")
    assert (
        check_settings(
            {
                "SLACK_BOT_TOKEN": "x",
                "SLACK_SIGNING_SECRET": "s",
                "ANTHROPIC_API_KEY": "k",
                "PLAYGROUND_MODEL": value,
            }
        )
        == []
    )  # not the playground: not read


@pytest.mark.e2e
def test_a_playground_port_already_taken_is_one_line_naming_port_and_nothing_keeps_running(
    dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev]
) -> None:
    for name in SETTINGS:
        del dev_env[name]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        dev_env["PORT"] = str(taken.getsockname()[1])
        dev = run_dev(dev_env, "--data-dir", str(tmp_path / "data"))
        assert dev.finish(timeout=30) == 1
    said = f"cannot listen on 127.0.0.1:{dev_env['PORT']}: the port is taken by pid {os.getpid()}"
    assert said in dev.output() and "choose another port with PORT" in dev.output()
    assert "started web" not in dev.output()  # the bot would only have failed its token check
    assert "playground exited" in dev.stderr and "Traceback" not in dev.output()


def test_an_app_token_replaces_the_signing_secret() -> None:
    env = {**SETTINGS, "SLACK_APP_TOKEN": "xapp-test"}
    del env["SLACK_SIGNING_SECRET"]
    assert check_settings(env) == []
    assert [line.split()[0] for line in check_settings({"SLACK_APP_TOKEN": "xapp-test"})] == [
        "SLACK_BOT_TOKEN",
        "ANTHROPIC_API_KEY",
    ]


@pytest.mark.e2e
def test_a_needed_redis_server_missing_from_path_exits_2(
    dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev]
) -> None:
    dev_env["PATH"] = str(tmp_path)  # no redis-server there
    dev = run_dev(dev_env, "--data-dir", str(tmp_path / "data"))

    assert dev.finish() == 2
    assert len(dev.stderr.splitlines()) == 1 and "redis-server" in dev.stderr and "REDIS_URL" in dev.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.e2e
def test_private_redis_serves_the_children_and_ctrl_c_stops_everything_in_order(
    dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev]
) -> None:
    data_dir = tmp_path / "redis-data"
    dev = run_dev(dev_env, "--data-dir", str(data_dir))

    started = dev.line(r"dev  \| started redis \(pid (\d+)\) at redis://:\*\*\*@127\.0\.0\.1:(\d+)/0")
    redis_pid, port = int(started.group(1)), int(started.group(2))
    web_pid = int(dev.line(rf"web  \| up redis://127\.0\.0\.1:{port}/0 (\d+)$").group(1))
    worker_pid = int(dev.line(rf"worker \| up redis://127\.0\.0\.1:{port}/0 (\d+)$").group(1))
    assert redis.Redis.from_url(child_env(tmp_path, "web")["REDIS_URL"]).ping()
    assert (data_dir / "appendonlydir").is_dir()

    dev.proc.send_signal(signal.SIGINT)

    assert dev.finish(timeout=60) == 0
    assert not port_open(port)
    assert not any(pid_alive(pid) for pid in (redis_pid, web_pid, worker_pid))
    redis_told = dev.index(r"redis \| .*(SIGTERM|shutdown)")
    assert dev.index(r"web  \| bye") < redis_told and dev.index(r"worker \| bye") < redis_told


@pytest.mark.e2e
def test_the_operators_commands_run_beside_make_run_read_its_own_redis_and_say_so(
    dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev]
) -> None:
    """Seen: `workers status` with no REDIS_URL read another Redis and said "Parked: 0" while a card
    waited. `make run` tells where its own Redis is (to its user alone), for as long as it runs."""
    dev = run_dev(dev_env, "--data-dir", str(tmp_path / "redis-data"))
    dev.line(r"worker \| up ")
    url = child_env(tmp_path, "web")["REDIS_URL"]
    announced = tmp_path / ".harness-redis"
    assert announced.read_text().strip() == url and stat.S_IMODE(announced.stat().st_mode) == 0o600
    env = {k: v for k, v in dev_env.items() if not k.startswith("REDIS_")}
    done = subprocess.run(
        [sys.executable, "-m", "workers", "status"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    port = urlsplit(url).port
    assert done.returncode == 0, done.stderr
    first = done.stderr.splitlines()[0]
    assert f"127.0.0.1:{port}" in first and "make run's own" in first and urlsplit(url).password not in first
    dev.proc.send_signal(signal.SIGINT)
    assert dev.finish(timeout=60) == 0
    assert not announced.exists()  # its Redis is gone: nothing points at it


@pytest.mark.e2e
def test_joining_a_redis_that_was_already_answering_says_its_queue_is_shared(
    dev_env: dict[str, str], run_dev: Callable[..., Dev], given_redis: RedisServer
) -> None:
    port = urlsplit(given_redis.url).port
    dev_env["HARNESS_DEV_REDIS_PROBE"] = f"127.0.0.1:{port}"  # stands in for localhost:6379
    dev = run_dev(dev_env)
    said = dev.line(
        r"dev  \| joining the Redis already answering at (\S+) \(not started by make run\)"
    ).string
    assert f"127.0.0.1:{port}" in said and "shared" in said and "set REDIS_URL" in said
    dev.line(r"worker \| up ")
    dev.proc.send_signal(signal.SIGINT)
    assert dev.finish(timeout=60) == 0


@pytest.mark.e2e
def test_a_child_that_exits_stops_the_others_and_exits_1_naming_it(
    dev_env: dict[str, str], run_dev: Callable[..., Dev], given_redis: RedisServer
) -> None:
    dev_env["REDIS_URL"] = given_redis.url  # given, so no Redis is started
    dev_env["HARNESS_DEV_WEB_CMD"] = python_cmd("print('leaving', flush=True)")
    dev = run_dev(dev_env)

    worker_pid = int(dev.line(rf"worker \| up {re.escape(given_redis.url)} (\d+)$").group(1))

    assert dev.finish() == 1
    assert re.search(r"\bweb\b.*exited unexpectedly", dev.stderr)
    assert not pid_alive(worker_pid)


@pytest.mark.e2e
def test_sigterm_stops_too_and_a_child_ignoring_it_is_killed_after_the_grace_period(
    dev_env: dict[str, str], run_dev: Callable[..., Dev], given_redis: RedisServer
) -> None:
    dev_env["REDIS_URL"] = given_redis.url
    dev_env["HARNESS_DEV_WORKER_CMD"] = python_cmd(STUBBORN_CHILD)
    dev_env["HARNESS_DEV_STOP_TIMEOUT"] = "1"
    dev = run_dev(dev_env)
    worker_pid = int(dev.line(r"worker \| up \S+ (\d+)$").group(1))
    dev.line(r"web  \| up ")

    dev.proc.send_signal(signal.SIGTERM)

    assert dev.finish(timeout=60) == 0
    assert not pid_alive(worker_pid)


def test_procfile_runs_web_and_worker() -> None:
    lines = (ROOT / "Procfile").read_text().splitlines()
    assert "web: python -m bot" in lines and "worker: python -m workers" in lines


BOT_SCOPES = [
    "app_mentions:read",
    "assistant:write",
    "channels:history",
    "chat:write",
    "files:write",
    "groups:history",
    "im:history",
    "reactions:write",
    "usergroups:read",
]
BOT_EVENTS = [
    "agent_session_stopped",
    "app_home_opened",
    "app_mention",
    "assistant_thread_started",
    "message.im",
]


def test_manifest_asks_for_exactly_what_the_bot_needs() -> None:
    yaml = pytest.importorskip("yaml")
    manifest = yaml.safe_load((ROOT / "manifest.yml").read_text())

    assert manifest["_metadata"] == {"major_version": 1, "minor_version": 1}
    assert manifest["features"]["bot_user"] == {"display_name": "harness", "always_online": True}
    assert sorted(manifest["oauth_config"]["scopes"]["bot"]) == BOT_SCOPES
    assert "user" not in manifest["oauth_config"]["scopes"]
    settings = manifest["settings"]
    assert settings["event_subscriptions"] == {
        "request_url": "https://YOUR-HOST/slack/events",
        "bot_events": BOT_EVENTS,
    }
    assert manifest["features"]["app_home"] == {
        "home_tab_enabled": True,
        "messages_tab_enabled": True,  # people write to the bot there
        "messages_tab_read_only_enabled": False,
    }
    assert len(manifest["display_information"]["description"]) <= 140  # Slack's limit
    assert settings["interactivity"] == {"is_enabled": True, "request_url": "https://YOUR-HOST/slack/events"}
    assert settings["socket_mode_enabled"] is False
    assert settings["org_deploy_enabled"] is False
    assert settings["token_rotation_enabled"] is False


def test_manifest_lists_exactly_the_scopes_and_events_without_yaml() -> None:
    """The same promise read line by line, for when PyYAML is not installed."""
    text = (ROOT / "manifest.yml").read_text()

    def items_under(key: str) -> list[str]:
        block = re.search(rf"^(\s*){re.escape(key)}:\n((?:\1\s+- .*\n)+)", text, re.MULTILINE)
        assert block, f"no list under {key}"
        return [line.strip()[2:].split("#")[0].strip() for line in block.group(2).splitlines()]

    assert items_under("bot") == BOT_SCOPES
    assert items_under("bot_events") == BOT_EVENTS
    assert text.count("request_url: https://YOUR-HOST/slack/events") == 2
    assert re.search(r"^\s*socket_mode_enabled: false$", text, re.MULTILINE)


def test_the_assistant_pane_suggests_in_the_manifest_what_the_bot_suggests_in_a_new_thread() -> None:
    yaml = pytest.importorskip("yaml")
    view = yaml.safe_load((ROOT / "manifest.yml").read_text())["features"]["assistant_view"]
    assert set(view) == {"assistant_description", "suggested_prompts"} and view["assistant_description"]
    prompts = [(p["title"], p["message"]) for p in view["suggested_prompts"]]
    assert prompts == list(texts.SUGGESTED_PROMPTS) and 1 <= len(prompts) <= 4  # Slack shows four


def test_redis_url_wins_then_an_unprotected_answering_redis_then_a_private_one() -> None:
    assert (
        find_redis({"REDIS_URL": "redis://example:1/2"}, ("127.0.0.1", unused_port()))
        == "redis://example:1/2"
    )
    assert find_redis({}, ("127.0.0.1", unused_port())) is None
    machines_own = RedisServer().start()  # no password: the machine's own Redis, used as is
    try:
        assert find_redis({}, ("127.0.0.1", machines_own.port)) == f"redis://127.0.0.1:{machines_own.port}/0"
    finally:
        machines_own.stop()


def test_the_private_redis_has_a_fresh_password_that_the_readiness_probe_uses(tmp_path: Path) -> None:
    urls = []
    for _ in range(2):
        proc, url = start_private_redis(tmp_path / "data")
        try:
            parts = urlsplit(url)
            assert url == f"redis://:{parts.password}@127.0.0.1:{parts.port}/0"
            assert parts.port and parts.password and len(parts.password) >= 32
            assert redis_answers("127.0.0.1", parts.port, parts.password)
            assert not redis_answers("127.0.0.1", parts.port)  # -NOAUTH is no answer
            assert not redis_answers("127.0.0.1", parts.port, parts.password + "x")
            assert find_redis({}, ("127.0.0.1", parts.port)) is None  # not mistaken for the machine's own
            urls.append(url)
        finally:
            proc.terminate()
            proc.wait(10)
    assert urlsplit(urls[0]).password != urlsplit(urls[1]).password


@pytest.mark.e2e
def test_the_private_redis_refuses_strangers_and_its_password_shows_nowhere(
    dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev]
) -> None:
    # redis-server rewrites its /proc/PID/cmdline once started, so a wrapper records the arguments it
    # was started with (which `ps` shows until then) before it execs the real one.
    (tmp_path / "bin").mkdir()
    wrapper = tmp_path / "bin" / "redis-server"
    argv_file = tmp_path / "redis-argv"
    real = shutil.which("redis-server")
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {shlex.quote(str(argv_file))}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    dev_env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{dev_env['PATH']}"
    dev = run_dev(dev_env, "--data-dir", str(tmp_path / "redis-data"))
    redis_pid = int(dev.line(r"dev  \| started redis \(pid (\d+)\)").group(1))
    dev.line(r"web  \| up ")
    dev.line(r"worker \| up ")
    url = child_env(tmp_path, "web")["REDIS_URL"]
    password, port = urlsplit(url).password, urlsplit(url).port
    assert password and port

    assert redis_ping(port).startswith(b"-NOAUTH")
    assert redis.Redis.from_url(url).ping()
    assert child_env(tmp_path, "worker")["REDIS_URL"] == url
    assert f"{port}\n" in argv_file.read_text() and password not in argv_file.read_text()
    for part in ("cmdline", "environ"):
        assert password.encode() not in Path(f"/proc/{redis_pid}/{part}").read_bytes()

    dev.proc.send_signal(signal.SIGINT)
    assert dev.finish() == 0
    assert "redis://:***@127.0.0.1" in dev.output()
    assert password not in dev.output()
    assert not any(
        password in path.read_text(errors="replace")
        for path in (tmp_path / "redis-data").rglob("*")
        if path.is_file()
    )


@pytest.mark.e2e
def test_the_bot_gets_a_workspace_folder_of_its_own_next_to_the_redis_data(
    dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev]
) -> None:
    dev = run_dev(dev_env)  # in tmp_path, with the defaults: ./.redis-data and ./workspace
    dev.line(r"web  \| up ")
    dev.line(r"worker \| up ")

    workspace = tmp_path / "workspace"
    assert workspace.is_dir() and (tmp_path / ".redis-data").is_dir()
    assert workspace.stat().st_mode & 0o077 == 0
    for name in ("web", "worker"):
        assert child_env(tmp_path, name)["HARNESS_WORKSPACE"] == str(workspace.resolve())
    assert sum(str(workspace.resolve()) in line for line in dev.lines if line.startswith("dev  |")) == 1
    dev.proc.send_signal(signal.SIGINT)
    assert dev.finish() == 0


@pytest.mark.e2e
def test_the_workspace_option_and_a_set_harness_workspace(
    dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev], given_redis: RedisServer
) -> None:
    dev_env["REDIS_URL"] = given_redis.url  # given, so no Redis is started
    elsewhere = tmp_path / "else" / "where"
    dev = run_dev(dev_env, "--workspace", str(elsewhere))
    assert dev.line(rf"dev  \| using Redis at {re.escape(given_redis.url)}$")
    dev.line(r"worker \| up ")
    assert elsewhere.is_dir()
    assert child_env(tmp_path, "worker")["HARNESS_WORKSPACE"] == str(elsewhere.resolve())
    dev.proc.send_signal(signal.SIGINT)
    assert dev.finish() == 0

    (tmp_path / "worker.env.json").unlink()
    dev_env["HARNESS_WORKSPACE"] = "given/as/is"  # passed through unchanged, not created
    dev = run_dev(dev_env, "--workspace", str(tmp_path / "ignored"))
    dev.line(r"worker \| up ")
    assert child_env(tmp_path, "worker")["HARNESS_WORKSPACE"] == "given/as/is"
    assert dev.line(r"dev  \| .*given/as/is \(HARNESS_WORKSPACE\)")
    assert not (tmp_path / "ignored").exists() and not (tmp_path / "given").exists()
    dev.proc.send_signal(signal.SIGINT)
    assert dev.finish() == 0


PASSWORD = "hunter2-not-to-be-printed"


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
@pytest.mark.e2e
def test_a_redis_url_that_does_not_answer_stops_within_seconds_in_one_line_naming_it(
    host: str, dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev]
) -> None:
    """Issue 23: before, the bot served /healthz 503 for a minute (~500 lines), then `make run`
    blamed the web process. Now nothing starts, and one line names REDIS_URL without its password."""
    port = unused_port()
    dev_env["REDIS_URL"] = f"redis://:{PASSWORD}@{host}:{port}/0"
    started = time.monotonic()
    dev = run_dev(dev_env, "--data-dir", str(tmp_path / "data"))

    assert dev.finish(timeout=60) == 2
    assert time.monotonic() - started < 10
    lines = dev.stderr.splitlines()
    assert len(lines) == 1, dev.stderr
    assert lines[0].startswith(f"REDIS_URL=redis://:***@{host}:{port}/0 does not answer (")
    assert "start that Redis or correct REDIS_URL" in lines[0]
    assert PASSWORD not in dev.output()
    assert dev.lines == []  # neither web nor worker started, so no /healthz 503 lines either
    assert not (tmp_path / "web.env.json").exists() and not (tmp_path / "worker.env.json").exists()
    assert not (tmp_path / "data").exists() and not (tmp_path / "workspace").exists()


@pytest.mark.e2e
def test_a_redis_url_with_a_wrong_password_is_refused_the_same_way(
    dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev]
) -> None:
    proc, url = start_private_redis(tmp_path / "data")  # answers, but only to its own password
    try:
        port = urlsplit(url).port
        dev_env["REDIS_URL"] = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
        dev = run_dev(dev_env)
        assert dev.finish(timeout=60) == 2
        lines = dev.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"REDIS_URL=redis://:***@127.0.0.1:{port}/0 "), lines
        assert PASSWORD not in dev.output() and dev.lines == []
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("process", ["bot", "workers"])
@pytest.mark.e2e
def test_the_bot_and_the_worker_alone_exit_2_in_one_line_naming_redis_when_it_does_not_answer(
    process: str, tmp_path: Path
) -> None:
    """What `make run` starts checks Redis itself too: a bot that served /healthz 503 instead would
    look up and healthy-but-for-Redis to a supervisor restarting it."""
    from tests.fakes.messages_api import FakeMessagesAPI
    from tests.fakes.slack_api import FakeSlackAPI
    from tests.stack import Stack

    url = f"redis://:{PASSWORD}@127.0.0.1:{unused_port()}/0"
    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        env = Stack(url, slack, model, tmp_path).env(PORT=str(unused_port()))
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", process], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
        )
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 20
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach Redis at REDIS_URL ("), done.stderr
    assert PASSWORD not in done.stdout + done.stderr and "503" not in done.stdout + done.stderr


@pytest.mark.e2e
def test_make_run_brings_up_a_working_bot_with_a_private_redis(
    tmp_path: Path, run_dev: Callable[..., Dev]
) -> None:
    """The README's run command for real: dev runner, private Redis, web and worker, a full run.

    Its file tool reads the bot's own workspace, not the folder `make run` was started in, and the
    password of the private Redis shows nowhere in what the real bot and worker print.
    """
    from tests.fakes.messages_api import FakeMessagesAPI, reply, text, tool_use
    from tests.fakes.slack_api import FakeSlackAPI
    from tests.stack import Stack, free_port, wait_until

    with FakeSlackAPI(bot_token="xoxb-test") as slack, FakeMessagesAPI() as model:
        stack = Stack("redis://unused", slack, model, tmp_path)  # ./workspace/README.md: "# My project"
        (tmp_path / "README.md").write_text("# the repository\n")
        env = stack.env(HARNESS_DEV_REDIS_PROBE=f"127.0.0.1:{free_port()}", HARNESS_DEV_STOP_TIMEOUT="5")
        del env["REDIS_URL"], env["HARNESS_WORKSPACE"]
        model.script(reply(tool_use("read_file", {"path": "README.md"})), reply(text("hello from make run")))
        dev = run_dev(env, "--data-dir", str(tmp_path / "redis-data"))
        try:
            web_pid = int(dev.line(r"dev  \| started web \(pid (\d+)\)", 30).group(1))
            environ = Path(f"/proc/{web_pid}/environ").read_bytes().split(b"\0")
            url = next(v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"REDIS_URL="))
            wait_until(lambda: stack.healthz() == 200 or dev.proc.poll() is not None, timeout=60)
            assert dev.proc.poll() is None
            _, ts, _ = stack.mention("say hello", channel="C1")
            wait_until(lambda: any("hello from make run" in m["text"] for m in slack.messages("C1", ts)), 60)
        finally:
            dev.proc.send_signal(signal.SIGINT)
            code = dev.finish(timeout=30)
        assert code == 0, dev.output()[-2000:]
        assert (tmp_path / "redis-data").is_dir()
        password = urlsplit(url).password
        assert password and password not in dev.output()
        sent = json.dumps(model.requests)
        assert "# My project" in sent and "# the repository" not in sent


def test_the_socket_mode_manifest_is_the_http_one_with_socket_mode_on_and_no_urls() -> None:
    yaml = pytest.importorskip("yaml")
    http = yaml.safe_load((ROOT / "manifest.yml").read_text())
    socket_mode = yaml.safe_load((ROOT / "manifest.socket.yml").read_text())

    assert socket_mode["settings"]["socket_mode_enabled"] is True
    assert "request_url" not in socket_mode["settings"]["event_subscriptions"]
    assert "request_url" not in socket_mode["settings"]["interactivity"]
    del (
        http["settings"]["event_subscriptions"]["request_url"],
        http["settings"]["interactivity"]["request_url"],
    )
    http["settings"]["socket_mode_enabled"] = True
    assert socket_mode == http


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "example.org"])
@pytest.mark.e2e
def test_the_playground_refuses_an_address_other_than_loopback_in_one_line_and_starts_nothing(
    host: str, dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev]
) -> None:
    """HOST=0.0.0.0 (as the README suggests for the bot) would let anyone on the network post and
    click Approve as any demo user: refused before Redis, workspace or any child is started."""
    for name in SETTINGS:
        del dev_env[name]  # no Slack settings: the playground
    marker = tmp_path / "started"
    dev_env["HARNESS_DEV_WEB_CMD"] = python_cmd(f"open({str(marker)!r}, 'w')")
    dev_env["HOST"] = host
    dev = run_dev(dev_env, "--data-dir", str(tmp_path / "data"))

    assert dev.finish() == 2
    lines = dev.stderr.splitlines()
    assert len(lines) == 1 and f"HOST={host}" in lines[0] and "loopback" in lines[0], dev.stderr
    assert "Approve" in lines[0]  # says why, not only what
    assert dev.lines == []
    assert not marker.exists() and not (tmp_path / "data").exists() and not (tmp_path / "workspace").exists()


def test_the_playground_accepts_every_loopback_address_and_the_bot_keeps_any_host() -> None:
    from playground import bind_problem

    for host in ("", "127.0.0.1", "127.0.0.2", "localhost", "::1"):
        assert bind_problem(host) is None, host
    for host in ("0.0.0.0", "::", "10.0.0.1", "::ffff:10.0.0.1", "localhost.example.org", "127.0.0.1 "):
        assert bind_problem(host), host
    assert check_settings({**SETTINGS, "HOST": "0.0.0.0"}) == []  # a Slack bot may listen everywhere
    envs, page = playground_envs({"HOST": "::1", "PORT": "4321"})
    assert page == "http://[::1]:4321/" and envs["playground"]["HOST"] == "::1"


def playground_alone_env(host: str, port: int) -> dict[str, str]:
    """What `python -m playground` needs to start on its own (the bot behind it is never asked)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "ANTHROPIC_", "HARNESS_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        PLAYGROUND_BOT_URL="http://127.0.0.1:1/slack/events",
        SLACK_SIGNING_SECRET="s" * 32,
        SLACK_BOT_TOKEN="xoxb-playground-test",
        HOST=host,
        PORT=str(port),
    )
    return env


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
@pytest.mark.e2e
def test_python_m_playground_alone_refuses_an_address_other_than_loopback(host: str, tmp_path: Path) -> None:
    port = unused_port()
    env = playground_alone_env(host, port)
    command = [sys.executable, "-m", "playground"]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=20)

    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1 and "loopback" in proc.stderr and f"HOST={host}" in proc.stderr
    assert not port_open(port)


@pytest.mark.parametrize("host", ["localhost", "::1"])
@pytest.mark.e2e
def test_python_m_playground_alone_listens_on_the_loopback_address_given(host: str, tmp_path: Path) -> None:
    import urllib.request

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        try:
            probe.bind((host, 0))
        except OSError:
            pytest.skip(f"this machine cannot bind {host}")
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "playground"],
        cwd=tmp_path,
        env=playground_alone_env(host, port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://{'[::1]' if host == '::1' else host}:{port}/healthz"

    def answers() -> bool:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                return answer.status == 200
        except OSError:
            return False

    try:
        eventually(answers, timeout=20)
    finally:
        proc.terminate()
        proc.wait(10)


def playground_dev_env(dev_env: dict[str, str]) -> dict[str, str]:
    """`dev_env` with no Slack setting (so the playground, with fake bot and worker) on a free port."""
    env = {k: v for k, v in dev_env.items() if k not in SETTINGS}
    env.update(PORT=str(unused_port()), HARNESS_DEV_STOP_TIMEOUT="5")
    return env


@pytest.mark.e2e
def test_the_playground_never_takes_the_redis_on_localhost_and_its_own_keeps_nothing_across_starts(
    dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev]
) -> None:
    """Issue 23: runs an earlier start left in a machine's Redis blocked the next ones (the
    playground's Slack forgets their threads, so nobody could decide them)."""
    machines_own = RedisServer().start()  # unprotected, answering where `make run` probes
    try:
        env = playground_dev_env(dev_env)
        env["HARNESS_DEV_REDIS_PROBE"] = f"127.0.0.1:{machines_own.port}"
        urls = []
        for start in range(2):
            (tmp_path / "web.env.json").unlink(missing_ok=True)
            dev = run_dev(env, "--data-dir", str(tmp_path / "redis-data"))
            line = dev.line(
                r"dev  \| started redis \(pid \d+\) at (redis://\S+) \(password-protected\), (.*)", 30
            )
            assert "the playground's own" in line.group(2) and "keeps nothing" in line.group(2)
            dev.line(r"web  \| up ", 30)
            url = child_env(tmp_path, "web")["REDIS_URL"]
            assert urlsplit(url).port != machines_own.port and urlsplit(url).password
            client = redis.Redis.from_url(url)
            assert client.dbsize() == 0, f"start {start} found what an earlier one left"
            client.set("harness:run:left-by-this-start", "1")
            client.close()
            urls.append(url)
            dev.proc.send_signal(signal.SIGINT)
            assert dev.finish(30) == 0, dev.output()[-3000:]
        assert urls[0] != urls[1]
        assert redis.Redis(port=machines_own.port).dbsize() == 0  # the machine's Redis was never written
        assert not (tmp_path / "redis-data").exists()  # and the playground's own wrote nowhere
    finally:
        machines_own.stop()


@pytest.mark.e2e
def test_a_redis_url_given_to_the_playground_is_named_on_start_with_the_runs_it_carries_over(
    dev_env: dict[str, str], run_dev: Callable[..., Dev], given_redis: RedisServer
) -> None:
    from store.keys import Keys

    url = given_redis.url.rsplit("/", 1)[0] + "/3"
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.zadd(Keys.active(), {"run-a": 1, "run-b": 2})
    client.zadd(Keys.expiries(), {"run-c:1": 1, "run-c:2": 2, "run-d:1": 3})  # two runs, three parks
    client.close()
    env = {**playground_dev_env(dev_env), "REDIS_URL": url}
    dev = run_dev(env)

    line = dev.line(r"dev  \| using Redis at .*", 30).group(0)
    assert f"{url} (REDIS_URL), database 3" in line
    assert "2 runs queued or running, 2 waiting for approval" in line and "unset REDIS_URL" in line
    dev.proc.send_signal(signal.SIGINT)
    assert dev.finish(30) == 0


@pytest.mark.e2e
def test_the_playground_without_redis_server_on_path_says_it_starts_its_own(
    dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev]
) -> None:
    env = playground_dev_env(dev_env)
    env["PATH"] = str(tmp_path)  # no redis-server there
    dev = run_dev(env)

    assert dev.finish() == 2
    assert dev.stderr.splitlines() == [
        "redis-server is not on PATH: the playground starts a Redis of its own; install Redis "
        "(apt install redis-server / brew install redis) or set REDIS_URL"
    ]


@pytest.mark.e2e
def test_make_run_with_sentinels_starts_no_redis_and_hands_them_to_the_bot_and_the_worker(
    dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev]
) -> None:
    """Issue 23: `make run` takes Redis Sentinel as the bot and the workers do."""
    group = SentinelGroup().start()
    try:
        dev_env.update(group.env(db=4))
        dev = run_dev(dev_env, "--data-dir", str(tmp_path / "data"))
        line = dev.line(r"dev  \| using Redis at .*", 30).group(0)
        assert "REDIS_SENTINELS" in line and "mymaster" in line and SENTINEL_PASSWORD not in line
        dev.line(r"worker \| up ")
        seen = json.loads((tmp_path / "worker.env.json").read_text())
        assert seen["REDIS_SENTINELS"] == group.addresses and seen["REDIS_SENTINEL_MASTER"] == "mymaster"
        assert not (tmp_path / "data").exists()  # no Redis of its own was started
        dev.proc.send_signal(signal.SIGINT)
        assert dev.finish() == 0
    finally:
        group.stop()


@pytest.mark.parametrize(
    ("sentinels", "named"),
    [("127.0.0.1:{port}", "does not answer"), ("not-an-address", "REDIS_SENTINELS must be host:port")],
)
@pytest.mark.e2e
def test_sentinels_that_do_not_answer_or_cannot_be_read_stop_make_run_in_one_line(
    dev_env: dict[str, str], tmp_path: Path, run_dev: Callable[..., Dev], sentinels: str, named: str
) -> None:
    dev_env["REDIS_SENTINELS"] = sentinels.format(port=unused_port())
    dev_env["REDIS_URL"] = f"redis://:{PASSWORD}@x:1/0"
    dev = run_dev(dev_env, "--data-dir", str(tmp_path / "data"))
    assert dev.finish(timeout=60) == 2
    lines = dev.stderr.splitlines()
    assert len(lines) == 1 and named in lines[0], dev.stderr
    assert PASSWORD not in dev.output() and dev.lines == []
