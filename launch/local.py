"""`python -m launch.local`: the web process, one worker and, if needed, a private Redis on this machine.

`make run` calls this. With no Slack setting at all (none of ``SLACK_BOT_TOKEN``,
``SLACK_SIGNING_SECRET``, ``SLACK_APP_TOKEN``) it starts the playground too (`python -m playground`:
a page on http://127.0.0.1:$PORT/ with its own stand-in for Slack, and the offline demo model when
``ANTHROPIC_API_KEY`` is not set either or ``PLAYGROUND_MODEL=demo`` asks for it) and points the bot
and the worker at it, with a Redis of the playground's own unless ``REDIS_URL`` names one: a private
``redis-server`` that keeps nothing after the start (the playground's Slack keeps nothing either, so
runs of an earlier start would only block new ones and list approvals nobody can click); a given
``REDIS_URL`` is said on start with the runs it carries over. Otherwise it checks the settings first,
picks a Redis (``REDIS_URL``, which must answer a PING within 2 s, else one answering on
localhost:6379, else a private ``redis-server`` keeping its data in ``./.redis-data/``), each private
one with a fresh password per start, gives the bot a workspace
folder of its own (``HARNESS_WORKSPACE``, else ``./workspace/``, created), starts ``python -m bot``
and ``python -m workers`` with ``REDIS_URL`` and ``HARNESS_WORKSPACE`` set, and prefixes their
output per line. Ctrl-C or SIGTERM stops everything in order (web, worker, then Redis) and exits 0;
a child that dies on its own stops the others and exits 1.

Why not honcho, which reads the Procfile (weighed against honcho 2.0.0's `Manager`): it could
only take over web and worker, since Redis must be up first and reads its password from stdin and
the playground must answer before the bot starts. That removes about 15 of these ~570 lines (the
spawn loop, the bot's wait, the call to `supervise`) and adds about 28: a printer keeping these
prefixes and LOG_FORMAT=json, a thread that stops it when Redis or the playground dies, another
for the bot's readiness line, its exit codes (130, 143) mapped to 0. It would also break promises
tests/launch/test_dev.py and this module keep: it SIGTERMs every process group at once, not web, then
worker, then Redis, each child alone until the grace ends; its 5 s kill wait is a module constant;
it ignores SIGHUP and a second Ctrl-C. So this stays, with no new dependency.

For tests, ``HARNESS_DEV_WEB_CMD`` / ``HARNESS_DEV_WORKER_CMD`` (shell-split strings) replace the
child commands, ``HARNESS_DEV_REDIS_PROBE`` (``host:port``) replaces localhost:6379 as the Redis
probed, and ``HARNESS_DEV_STOP_TIMEOUT`` (seconds) replaces the 10 s grace before SIGKILL.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TextIO
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from observe import logs
from playground import bind_problem, url_host
from runtime.connection import DEFAULT_REDIS_URL, RedisSettingsError, RedisTarget
from store.base import as_text
from store.keys import Keys

DEFAULT_PROBE = ("localhost", 6379)
DEFAULT_DATA_DIR = Path(".redis-data")
DEFAULT_WORKSPACE = Path("workspace")
STOP_TIMEOUT = 10.0
REDIS_START_TIMEOUT = 10.0
REDIS_CHECK_TIMEOUT = 2.0
POLL_INTERVAL = 0.1
SLACK_SETTINGS = ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN")
PLAYGROUND_PORT = 3000
PLAYGROUND_CONFIG = Path(__file__).resolve().parents[1] / "playground" / "config.toml"
PLAYGROUND_START_TIMEOUT = 15.0
BOT_START_TIMEOUT = 60.0
PREFIXES = {
    "web": "web  | ",
    "worker": "worker | ",
    "redis": "redis | ",
    "dev": "dev  | ",
    "playground": "play | ",
}

SLACK_APPS = "https://api.slack.com/apps"
MISSING_BOT_TOKEN = (
    "SLACK_BOT_TOKEN is not set: export it with your bot token (xoxb-…) from the "
    f'"OAuth & Permissions" page of your app at {SLACK_APPS}'
)
MISSING_SIGNING_SECRET = (
    "SLACK_SIGNING_SECRET is not set: export it with the Signing Secret from "
    f'"Basic Information → App Credentials" of your app at {SLACK_APPS} '
    "(or set SLACK_APP_TOKEN to use Socket Mode instead)"
)
MISSING_API_KEY = (
    "ANTHROPIC_API_KEY is not set: export it with an API key from https://console.anthropic.com/settings/keys"
)
# The model API credentials the SDK reads: kept from the playground's page process always, and from
# every child when the demo model answers (the demo endpoint is the playground's, so a real key sent
# there would reach it).
MODEL_CREDENTIALS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
DEMO_MODEL_KEY = "playground-demo-model"  # the SDK insists on a key; the demo model reads none
BAD_PLAYGROUND_MODEL = (
    "PLAYGROUND_MODEL={value}: the only value is demo (the offline demo model, even with "
    "ANTHROPIC_API_KEY set); unset it to talk to the model ANTHROPIC_API_KEY opens"
)
UNREACHABLE_SENTINELS = (
    "{where} does not answer ({error}): start those sentinels or correct REDIS_SENTINELS and "
    "REDIS_SENTINEL_MASTER"
)
UNREACHABLE_REDIS_URL = (
    "REDIS_URL={url} does not answer ({error}): start that Redis or correct REDIS_URL "
    "(unset, `make run` uses the one on localhost:6379 or starts its own)"
)
MISSING_REDIS_SERVER = (
    "redis-server is not on PATH and no Redis answers on {probe}: install Redis "
    "(apt install redis-server / brew install redis) or set REDIS_URL"
)

MISSING_PLAYGROUND_REDIS = (
    "redis-server is not on PATH: the playground starts a Redis of its own; install Redis "
    "(apt install redis-server / brew install redis) or set REDIS_URL"
)


class DevError(Exception):
    """A problem that stops `launch.local` before or while starting, with a message for the user."""


@dataclass
class PrefixedOutput:
    """Copies each child's output to one stream, line by line, behind the child's prefix.

    With LOG_FORMAT=json (which the children inherit) every line is a JSON object instead, naming
    its `process`: a child's JSON line gains that field, any other line becomes the message of one.
    """

    stream: TextIO
    lock: threading.Lock = field(default_factory=threading.Lock)
    pumps: list[threading.Thread] = field(default_factory=list)
    json_lines: bool = field(default_factory=logs.json_mode)

    def say(self, name: str, line: str) -> None:
        """Write one line behind the prefix of `name` (or as a JSON object naming it)."""
        text = line.rstrip("\r\n")
        out = logs.as_json_line(name, text) if self.json_lines else PREFIXES.get(name, f"{name} | ") + text
        with self.lock:
            self.stream.write(out + "\n")
            self.stream.flush()

    def follow(self, name: str, pipe: IO[bytes]) -> None:
        """Copy `pipe` to the stream in a daemon thread until it closes."""

        def pump() -> None:
            with pipe:
                for raw in iter(pipe.readline, b""):
                    self.say(name, raw.decode("utf-8", errors="replace"))

        thread = threading.Thread(target=pump, name=f"dev-{name}-output", daemon=True)
        thread.start()
        self.pumps.append(thread)

    def drain(self, timeout: float = 2.0) -> None:
        """Wait (bounded) for the pumps to copy what the children wrote last."""
        deadline = time.monotonic() + timeout
        for thread in self.pumps:
            thread.join(max(0.0, deadline - time.monotonic()))


@dataclass
class Child:
    """One process started by `launch.local`."""

    name: str
    proc: subprocess.Popen[bytes]


def wants_playground(env: Mapping[str, str]) -> bool:
    """No Slack setting at all: the playground (a half-set Slack is a mistake to report instead)."""
    return not any(env.get(name, "").strip() for name in SLACK_SETTINGS)


def wants_demo_model(env: Mapping[str, str]) -> bool:
    """The playground's offline demo model: asked for (``PLAYGROUND_MODEL=demo``), or no key to use."""
    return env.get("PLAYGROUND_MODEL", "").strip() == "demo" or not env.get("ANTHROPIC_API_KEY", "").strip()


def check_settings(env: Mapping[str, str]) -> list[str]:
    """Return one line per missing setting, naming what to set and where to get it."""
    if wants_playground(env):
        # the playground brings its own Slack, and the demo model stands in for a key
        chosen = env.get("PLAYGROUND_MODEL", "").strip()
        return [BAD_PLAYGROUND_MODEL.format(value=chosen)] if chosen not in ("", "demo") else []
    missing = []
    if not env.get("SLACK_BOT_TOKEN", "").strip():
        missing.append(MISSING_BOT_TOKEN)
    if not env.get("SLACK_SIGNING_SECRET", "").strip() and not env.get("SLACK_APP_TOKEN", "").strip():
        missing.append(MISSING_SIGNING_SECRET)
    if not env.get("ANTHROPIC_API_KEY", "").strip():
        missing.append(MISSING_API_KEY)
    return missing


def redis_answers(host: str, port: int, password: str | None = None, timeout: float = 0.5) -> bool:
    """True when a Redis on host:port replies PONG to PING, after AUTH with `password` when one is given.

    Without a password, a protected server's -NOAUTH is not an answer.
    """
    request = resp_command("PING")
    if password is not None:
        request = resp_command("AUTH", password) + request
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock, sock.makefile("rb") as replies:
            sock.sendall(request)
            if password is not None and replies.readline() != b"+OK\r\n":
                return False
            return replies.readline().startswith(b"+PONG")
    except OSError:
        return False


def resp_command(*args: str) -> bytes:
    """One command in RESP, the protocol Redis speaks."""
    encoded = [arg.encode() for arg in args]
    return f"*{len(args)}\r\n".encode() + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in encoded)


def names_redis(env: Mapping[str, str]) -> bool:
    """Whether the settings name a Redis (`REDIS_URL`, or Redis Sentinel's `REDIS_SENTINELS`)."""
    return bool(env.get("REDIS_URL", "").strip() or env.get("REDIS_SENTINELS", "").strip())


def short_client(
    url: str, env: Mapping[str, str] | None = None, timeout: float = REDIS_CHECK_TIMEOUT
) -> redis.Redis:
    """A client of the Redis the children will use (`url`, or the master `env`'s sentinels name),
    with a short timeout and no retry: for the checks made before anything starts."""
    sentinels = {k: v for k, v in (env or {}).items() if k in ("REDIS_SENTINELS", "REDIS_SENTINEL_MASTER")}
    target = RedisTarget.from_env({**sentinels, "REDIS_URL": url})
    return target.connect(socket_timeout=timeout, connect_timeout=timeout, retry=Retry(NoBackoff(), 0))


def where_is(url: str, env: Mapping[str, str]) -> str:
    """Where the children's Redis is, for a line of `make run`'s: never its password."""
    if env.get("REDIS_SENTINELS", "").strip():
        return RedisTarget.from_env({**env, "REDIS_URL": url}).describe()
    return redact(url)


def given_redis_problem(
    url: str, timeout: float = REDIS_CHECK_TIMEOUT, env: Mapping[str, str] | None = None
) -> str | None:
    """One line naming REDIS_URL (its password redacted), or the sentinels of `env`, when that Redis
    does not answer PING, else None.

    Asked before anything starts, with the client the children use (so TLS, ACL users, Unix
    sockets and Sentinel count) but a short timeout and no retry: otherwise the bot serves 503 on
    /healthz and `make run` waits a minute for it, then blames the web process.
    """
    try:
        with short_client(url, env, timeout) as client:
            client.ping()
    except (redis.RedisError, OSError, ValueError) as error:
        reason = str(error) or type(error).__name__
        password = urlsplit(url).password
        if password:
            reason = reason.replace(password, "***")
        if env and env.get("REDIS_SENTINELS", "").strip():
            target = RedisTarget.from_env({**env, "REDIS_URL": url})
            return UNREACHABLE_SENTINELS.format(where=target.describe(), error=reason)
        return UNREACHABLE_REDIS_URL.format(url=redact(url), error=reason)
    return None


def parse_probe(value: str | None) -> tuple[str, int]:
    """Read `HARNESS_DEV_REDIS_PROBE` (``host:port``); localhost:6379 when unset."""
    if not value:
        return DEFAULT_PROBE
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise DevError(f"HARNESS_DEV_REDIS_PROBE must be host:port, not {value!r}")
    return host, int(port)


def find_redis(env: Mapping[str, str], probe: tuple[str, int] = DEFAULT_PROBE) -> str | None:
    """Return the Redis URL to use, or None when a private redis-server has to be started. With
    Redis Sentinel (`REDIS_SENTINELS`) the URL gives only the password and database."""
    if env.get("REDIS_URL", "").strip():
        return env["REDIS_URL"].strip()
    if env.get("REDIS_SENTINELS", "").strip():
        return DEFAULT_REDIS_URL
    host, port = probe
    if redis_answers(host, port):
        return f"redis://{host}:{port}/0"
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(
    name: str,
    cmd: Sequence[str],
    env: Mapping[str, str],
    output: PrefixedOutput | None,
    stdin: bytes | None = None,
) -> Child:
    """Start one child in its own process group, its output (stdout and stderr) behind its prefix.

    Its own process group, so that Ctrl-C in the terminal reaches only us and we stop the
    children in order, rather than all of them at once. `stdin`, when given, is written to the
    child's standard input, which is then closed.
    """
    proc = subprocess.Popen(
        list(cmd),
        env=dict(env),
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE if output else None,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    if output and proc.stdout is not None:
        output.follow(name, proc.stdout)
    if stdin is not None and proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError), proc.stdin:  # a child that died early: seen by the caller
            proc.stdin.write(stdin)
    return Child(name, proc)


def start_private_redis(
    data_dir: Path, *, output: PrefixedOutput | None = None, attempts: int = 3, keep: bool = True
) -> tuple[subprocess.Popen[bytes], str]:
    """Start redis-server on 127.0.0.1 and a free port, its data in `data_dir`; wait until it answers.

    With `keep` false it writes nothing to disk (no append-only file, no snapshot): whatever it
    holds ends with it.

    It gets a fresh random password, which it reads from its standard input (``redis-server -``)
    so that it never shows in its command line (``ps``). Returns the process and the
    ``redis://:PASSWORD@127.0.0.1:PORT/0`` URL for the children; print it only through `redact`.
    Retries on another port when the chosen one was taken in the meantime.
    """
    server = shutil.which("redis-server")
    if server is None:
        raise DevError(MISSING_REDIS_SERVER.format(probe="localhost:6379"))
    data_dir.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(32)  # URL-safe, so it needs no quoting in the URL or the config
    for _ in range(attempts):
        port = free_port()
        cmd = [server, "-", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data_dir.resolve())]
        cmd += ["--appendonly", "yes", "--appendfsync", "everysec"] if keep else ["--appendonly", "no"]
        cmd += ["--save", "", "--daemonize", "no"]
        child = spawn("redis", cmd, os.environ, output, stdin=f"requirepass {password}\n".encode())
        if _wait_until_answering(child.proc, port, password):
            return child.proc, f"redis://:{password}@127.0.0.1:{port}/0"
        stop_children([child], 2.0)
    raise DevError(f"redis-server did not start (tried {attempts} ports); see its output above")


def _wait_until_answering(proc: subprocess.Popen[bytes], port: int, password: str) -> bool:
    deadline = time.monotonic() + REDIS_START_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        if redis_answers("127.0.0.1", port, password):
            return True
        time.sleep(POLL_INTERVAL)
    return False


def stop_children(
    children: Sequence[Child], timeout: float, interrupted: threading.Event | None = None
) -> None:
    """SIGTERM the children in the order given, wait up to `timeout` s for all, then SIGKILL the rest.

    SIGTERM goes to the child alone: it is the graceful stop of gunicorn, rq and redis-server alike,
    while a work horse or gunicorn worker that got it directly would die mid-request. Whatever is
    left in a child's process group afterwards is SIGKILLed, so nothing outlives us.
    """
    for child in children:
        if child.proc.poll() is None:
            _signal(child.proc.pid, signal.SIGTERM, group=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(c.proc.poll() is None for c in children):
        if interrupted is not None and interrupted.is_set():
            break  # a second Ctrl-C: no more waiting
        time.sleep(POLL_INTERVAL)
    for child in children:
        _signal(child.proc.pid, signal.SIGKILL, group=True)
        child.proc.wait()


def _signal(pid: int, signum: int, *, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone already
        (os.killpg if group else os.kill)(pid, signum)


def lock_data_dir(data_dir: Path) -> IO[str]:
    """Hold a lock on `data_dir` so that two private Redis servers never write the same files."""
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = (data_dir / ".dev.lock").open("w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise DevError(
            f"another `python -m launch.local` keeps its Redis data in {data_dir}; stop it first"
        ) from None
    return handle


def prepare_workspace(env: Mapping[str, str], default: Path) -> tuple[str, str]:
    """The folder for the bot's file tools and where it came from: a set HARNESS_WORKSPACE as is,
    else `default`, created (private to this user) and made absolute.

    Never the current directory by default: there the model could read ``.env`` or ``.git/config``.
    """
    given = env.get("HARNESS_WORKSPACE", "")
    if given.strip():
        return given, "HARNESS_WORKSPACE"
    default.mkdir(mode=0o700, parents=True, exist_ok=True)
    return str(default.resolve()), "set HARNESS_WORKSPACE or --workspace to change it"


def carried_over(url: str, env: Mapping[str, str] | None = None) -> str:
    """What an earlier start left in the Redis at `url` (or the master `env`'s sentinels name):
    runs queued or running, runs waiting for approval, in words; or why it could not be read."""
    try:
        with short_client(url, env) as client:
            active = client.zcard(Keys.active())
            parked = {as_text(park).partition(":")[0] for park in client.zrange(Keys.expiries(), 0, -1)}
    except (redis.RedisError, OSError, ValueError) as error:
        return f"could not count the runs it holds ({type(error).__name__})"
    return (
        f"carried over from earlier starts: {active} run{'s' if active != 1 else ''} queued or running, "
        f"{len(parked)} waiting for approval"
    )


def redis_database(url: str) -> str:
    """The database number a Redis URL selects (0 when it names none)."""
    parts = urlsplit(url)
    path = parts.path.strip("/")
    for key, value in (pair.split("=", 1) for pair in parts.query.split("&") if "=" in pair):
        if key == "db":
            return value
    return path if path.isdigit() else "0"


def redact(url: str) -> str:
    """The URL without its password, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


def child_commands(env: Mapping[str, str]) -> dict[str, list[str]]:
    """The web and worker commands: `python -m bot` / `python -m workers`, or the test overrides."""
    commands = {
        "playground": [sys.executable, "-m", "playground"],
        "web": [sys.executable, "-m", "bot"],
        "worker": [sys.executable, "-m", "workers"],
    }
    for name, variable in (("web", "HARNESS_DEV_WEB_CMD"), ("worker", "HARNESS_DEV_WORKER_CMD")):
        if env.get(variable, "").strip():
            commands[name] = shlex.split(env[variable])
    return commands


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options of `python -m launch.local`."""
    parser = argparse.ArgumentParser(prog="python -m launch.local", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help="where a private redis-server keeps its data (default: ./.redis-data)",
    )
    parser.add_argument(
        "--workspace",
        type=Path,
        default=DEFAULT_WORKSPACE,
        help="the only folder the bot's file tools may touch, created if missing, unless HARNESS_WORKSPACE"
        " is set (default: ./workspace)",
    )
    return parser.parse_args(argv)


@dataclass
class Settings:
    """What `main` decided before starting anything."""

    env: dict[str, str]
    redis_url: str | None  # None: start a private redis-server
    stop_timeout: float
    playground: bool = False


def prepare(env: Mapping[str, str]) -> tuple[Settings | None, list[str]]:
    """Check settings and pick a Redis; returns the settings, or None and one line per problem."""
    problems = check_settings(env)
    try:
        probe = parse_probe(env.get("HARNESS_DEV_REDIS_PROBE"))
        stop_timeout = float(env.get("HARNESS_DEV_STOP_TIMEOUT") or STOP_TIMEOUT)
    except (DevError, ValueError) as error:
        return None, [*problems, str(error)]
    # The playground never takes a Redis found on the probe: that one keeps the runs of earlier
    # starts, whose threads the playground's Slack (in memory) has forgotten.
    try:
        RedisTarget.from_env({**env, "REDIS_URL": env.get("REDIS_URL", "").strip() or DEFAULT_REDIS_URL})
    except RedisSettingsError as error:
        return None, [*problems, str(error)]
    url = None if wants_playground(env) and not names_redis(env) else find_redis(env, probe)
    if url is None and shutil.which("redis-server") is None:
        missing = MISSING_PLAYGROUND_REDIS if wants_playground(env) else MISSING_REDIS_SERVER
        problems.append(missing.format(probe=f"{probe[0]}:{probe[1]}"))
    if url is not None and names_redis(env) and (unreachable := given_redis_problem(url, env=env)):
        problems.append(unreachable)  # found on the probe, it has just answered
    bind = bind_problem(env.get("HOST", ""), env.get("PORT") or PLAYGROUND_PORT)
    if wants_playground(env) and bind:
        problems.append(bind)  # the playground on every interface: anyone could click Approve
    if problems:
        return None, problems
    return Settings(dict(env), url, stop_timeout, wants_playground(env)), []


@contextlib.contextmanager
def stop_signals() -> Iterator[tuple[threading.Event, threading.Event]]:
    """Ctrl-C, SIGTERM or a closed terminal set the first event; a second one sets the other too.

    The previous handlers come back on exit.
    """
    stop, again = threading.Event(), threading.Event()

    def handle(signum: int, frame: object) -> None:
        if stop.is_set():
            again.set()
        stop.set()

    signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, handle) for signum in signums}
    try:
        yield stop, again
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def supervise(children: Sequence[Child], stop: threading.Event) -> Child | None:
    """Wait until `stop` is set (None) or a child exits on its own (that child)."""
    while not stop.is_set():
        for child in children:
            if child.proc.poll() is not None:
                return child
        stop.wait(POLL_INTERVAL)
    return None


def playground_envs(env: Mapping[str, str]) -> tuple[dict[str, dict[str, str]], str]:
    """The environment of each child in the playground, and the page's address.

    The playground listens on ``$PORT`` (3000) and the bot on a free port behind it; all three
    share a bot token and signing secret made for this start. Without ``ANTHROPIC_API_KEY``, or
    with ``PLAYGROUND_MODEL=demo``, the worker's SDK talks to the playground's offline demo model
    with a dummy key: the real key and token reach no child. The playground's own process never
    gets them (it shows the model's name, never a key). Without ``HARNESS_CONFIG`` the
    playground's own settings give the demo users their roles.
    """
    host = env.get("HOST") or "127.0.0.1"  # a loopback address: `prepare` refuses any other
    port = int(env.get("PORT") or PLAYGROUND_PORT)
    page = f"http://{url_host(host)}:{port}/"
    bot_port = free_port()
    common = dict(env)
    common.update(
        SLACK_BOT_TOKEN=f"xoxb-playground-{secrets.token_hex(16)}",
        SLACK_SIGNING_SECRET=secrets.token_hex(32),
        SLACK_API_URL=f"{page}api/",
    )
    common.setdefault("HARNESS_CONFIG", str(PLAYGROUND_CONFIG))
    if wants_demo_model(env):
        for name in MODEL_CREDENTIALS:
            common.pop(name, None)
        common.update(
            ANTHROPIC_API_KEY=DEMO_MODEL_KEY,
            ANTHROPIC_BASE_URL=f"{page}model",
            PLAYGROUND_DEMO_MODEL="1",
        )
    else:
        common.pop("PLAYGROUND_DEMO_MODEL", None)  # the page would call Claude's answers the demo's
    web = {**common, "PORT": str(bot_port), "HOST": "127.0.0.1"}
    playground = {
        **{k: v for k, v in common.items() if k not in MODEL_CREDENTIALS},
        "PORT": str(port),
        "HOST": host,
        "PLAYGROUND_BOT_URL": f"http://127.0.0.1:{bot_port}/slack/events",
    }
    return {"playground": playground, "web": web, "worker": common}, page


def wait_until_healthy(
    child: Child, url: str, stop: threading.Event, timeout: float = PLAYGROUND_START_TIMEOUT
) -> None:
    """Wait until `child` answers ``GET {url}healthz`` with 200: the playground before the bot starts
    (the bot checks its token against it), the bot before the page is worth opening.

    Asking over HTTP, not just connecting, so that another program on the same port is not taken
    for the child.
    """
    proc = child.proc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None and not stop.is_set():
        try:
            with urllib.request.urlopen(f"{url}healthz", timeout=1.0) as answer:
                if answer.status == 200:
                    return
        except (OSError, ValueError):
            pass
        stop.wait(POLL_INTERVAL)
    if proc.poll() is not None:
        raise DevError(f"{child.name} exited (code {proc.returncode}); see its output above")
    if not stop.is_set():
        raise DevError(
            f"{child.name} did not answer at {url}healthz within {timeout:g} s; see its output above"
        )


def run(
    settings: Settings,
    commands: Mapping[str, Sequence[str]],
    data_dir: Path,
    output: PrefixedOutput,
    workspace: Path = DEFAULT_WORKSPACE,
) -> int:
    """Start Redis if needed, then web and worker; supervise; stop them all in order; return the exit code."""
    env = dict(settings.env)
    redis: list[Child] = []
    children: list[Child] = []
    with stop_signals() as (stop, again), contextlib.ExitStack() as cleanup:
        try:
            env["HARNESS_WORKSPACE"], why = prepare_workspace(env, workspace)
            output.say("dev", f"the bot's file tools work in {env['HARNESS_WORKSPACE']} ({why})")
            url = settings.redis_url
            if url is None and settings.playground:
                # a scratch folder: redis-server needs a --dir, though it writes nothing there
                scratch = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="playground-redis-")))
                proc, url = start_private_redis(scratch, output=output, keep=False)
                redis.append(Child("redis", proc))
                where = f"at {redact(url)} (password-protected), the playground's own: it keeps nothing"
                output.say("dev", f"started redis (pid {proc.pid}) {where} after this start")
            elif url is None:
                cleanup.enter_context(lock_data_dir(data_dir))
                proc, url = start_private_redis(data_dir, output=output)
                redis.append(Child("redis", proc))
                where = f"at {redact(url)} (password-protected), data in {data_dir}/"
                output.say("dev", f"started redis (pid {proc.pid}) {where}")
            elif settings.playground:
                named = "" if env.get("REDIS_SENTINELS", "").strip() else " (REDIS_URL)"
                output.say(
                    "dev",
                    f"using Redis at {where_is(url, env)}{named}, database {redis_database(url)}: "
                    f"{carried_over(url, env)}; unset REDIS_URL for a fresh Redis of the playground's own",
                )
            else:
                output.say("dev", f"using Redis at {where_is(url, env)}")
            env["REDIS_URL"] = url
            env.setdefault("PYTHONUNBUFFERED", "1")  # so that the children's lines show up as they come
            env.setdefault("HOST", "127.0.0.1")  # a laptop's bot listens on loopback unless told otherwise
            envs = {"web": env, "worker": env}
            names = ["web", "worker"]
            if settings.playground:
                envs, page = playground_envs(env)
                names.insert(0, "playground")
            for name in names:
                if not stop.is_set():
                    children.append(spawn(name, commands[name], envs[name], output))
                    output.say(
                        "dev", f"started {name} (pid {children[-1].proc.pid}): {shlex.join(commands[name])}"
                    )
                if name == "playground" and not stop.is_set():
                    wait_until_healthy(children[-1], page, stop)
            if settings.playground and not stop.is_set():
                bot = f"http://127.0.0.1:{envs['web']['PORT']}/"
                wait_until_healthy(children[1], bot, stop, timeout=BOT_START_TIMEOUT)
                output.say("dev", f"the playground is ready: open {page} in a browser")
            died = supervise(children + redis, stop)
            if died is not None:
                output.say("dev", f"{died.name} exited (code {died.proc.returncode}); stopping the others")
        except (DevError, OSError) as error:
            print(f"launch.local: could not start: {error}", file=sys.stderr)
            return 1
        finally:
            stop_children(children, settings.stop_timeout, again)  # web first, then worker
            stop_children(redis, settings.stop_timeout, again)  # last: the others may still write to it
            output.drain()
    if died is not None:
        print(
            f"launch.local: the {died.name} process exited unexpectedly (exit code {died.proc.returncode}),"
            " so everything was stopped",
            file=sys.stderr,
        )
        return 1
    output.say("dev", "stopped")
    return 0


def main(argv: Sequence[str] | None = None, *, commands: Mapping[str, Sequence[str]] | None = None) -> int:
    """Run web, worker and maybe a private Redis until Ctrl-C (0) or until one of them dies (1).

    Exits 2, having started nothing, when a setting or redis-server is missing or REDIS_URL does
    not answer. `commands`
    replaces the web and worker commands (as do ``HARNESS_DEV_WEB_CMD`` / ``HARNESS_DEV_WORKER_CMD``).
    """
    args = parse_args(argv)
    settings, problems = prepare(os.environ)
    if settings is None:
        print("\n".join(problems), file=sys.stderr)
        return 2
    commands = {**child_commands(settings.env), **(commands or {})}
    return run(settings, commands, args.data_dir, PrefixedOutput(sys.stdout), args.workspace)


if __name__ == "__main__":
    raise SystemExit(main())
