"""Real processes for end-to-end tests: a private redis-server, `python -m bot`, `python -m workers`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from runtime.queue import make_queue
from tests.fakes.messages_api import FakeMessagesAPI
from tests.fakes.signing import action_body, event_body, signed_headers
from tests.fakes.slack_api import FakeSlackAPI

ROOT = Path(__file__).resolve().parents[1]
SIGNING_SECRET = "test-signing-secret"
BOT_TOKEN = "xoxb-test"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listens_on(root: int, port: int) -> bool | None:
    """Whether `root` (or a descendant) holds the socket listening on loopback `port`: True, False
    when another process does, None when nobody listens there yet.

    A port picked free is only free when picked: in a parallel run another test's server may take
    it first, and a check that something answers there would then pass for the wrong process.
    """
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    if not inodes:
        return None
    for pid in (root, *descendants(root)):
        try:
            held = {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in held for inode in inodes):
            return True
    return False


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02) -> Any:
    """Poll `predicate` until it returns something truthy; fail with a clear message on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {predicate}")
        time.sleep(interval)


def _running(pid: int) -> bool:
    """Whether `pid` is a process that still runs (a zombie holds no socket and runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class RedisServer:
    """A throwaway redis-server on a free loopback port, data in a temp dir."""

    def __init__(self, *, appendonly: bool = False) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="harness-redis-")
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        assert binary, "redis-server must be on PATH for the tests"
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", ""]
        args += (
            ["--appendonly", "yes", "--appendfsync", "everysec"]
            if self.appendonly
            else ["--appendonly", "no"]
        )
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        wait_until(lambda: _pings(client), timeout=30)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@dataclass
class Process:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill_group(self) -> None:
        """SIGKILL the process and every descendant (a machine dying, as far as it knows).

        RQ's work horse calls setsid(), so a process-group kill would miss it: walk /proc instead.
        """
        # Frozen first, so it forks no replacement for a child killed before it (gunicorn's master
        # respawned a worker between the list and its own kill, which kept the port).
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGSTOP)
        pids = [*descendants(self.proc.pid), self.proc.pid]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)
        # Until every one is gone: a gunicorn worker dying a moment late once answered the next
        # bot's health check on the shared port, and the mention after it was refused.
        wait_until(lambda: not any(_running(pid) for pid in pids), timeout=10)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        code = self.proc.wait(5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # leave no forked child behind
        return code


def descendants(root: int) -> list[int]:
    """Every live descendant of `root`, deepest first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []

    def walk(pid: int) -> None:
        for child in children.get(pid, []):
            walk(child)
            found.append(child)

    walk(root)
    return found


@dataclass
class Stack:
    """Bot and worker processes wired to loopback Slack, model and Redis."""

    redis_url: str
    slack: FakeSlackAPI
    model: FakeMessagesAPI
    workdir: Path
    config: str = ""
    port: int = field(default_factory=free_port)
    extra_env: dict[str, str] = field(default_factory=dict)
    processes: list[Process] = field(default_factory=list)
    workspace: Path = field(init=False)

    def __post_init__(self) -> None:
        self.workspace = self.workdir / "workspace"
        self.workspace.mkdir(parents=True, exist_ok=True)
        (self.workspace / "README.md").write_text("# My project\n\nSecond line.\n")
        (self.workdir / "harness.toml").write_text(self.config)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "HARNESS_", "SLACK_"))}
        env.update(
            PYTHONPATH=str(ROOT),
            REDIS_URL=self.redis_url,
            SLACK_BOT_TOKEN=BOT_TOKEN,
            SLACK_SIGNING_SECRET=SIGNING_SECRET,
            SLACK_API_URL=self.slack.base_url,
            ANTHROPIC_BASE_URL=self.model.base_url,
            ANTHROPIC_API_KEY="sk-test",
            HARNESS_CONFIG=str(self.workdir / "harness.toml"),
            HARNESS_WORKSPACE=str(self.workspace),
            HARNESS_STATE_DIR=str(self.workdir / "state"),
            PORT=str(self.port),
            # Stream writes paced at 50 ms, not Slack's 300: a run's live message settles sooner.
            # The tests of pacing itself (tests/workers/test_live.py, tests/e2e/test_live.py) and
            # the benchmarks keep 300.
            HARNESS_STREAM_PACE_MS="50",
        )
        env.update(self.extra_env)
        env.update(extra)
        return env

    def spawn(self, name: str, *args: str, root: Path = ROOT, **extra: str) -> Process:
        """Start `python ARGS` from `root` (another checkout's: give its PYTHONPATH in `extra` too)."""
        log = self.workdir / f"{name}-{len(self.processes)}.log"
        handle = log.open("wb")
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=root,
            env=self.env(**extra),
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a test can kill it with its children
        )
        process = Process(name, proc, log)
        self.processes.append(process)
        return process

    def start_bot(self, root: Path = ROOT, **extra: str) -> Process:
        bot = self.spawn("bot", "-m", "bot", root=root, **extra)
        wait_until(lambda: self.healthz() == 200 or bot.proc.poll() is not None, timeout=30)
        assert bot.proc.poll() is None, bot.output()
        return bot

    def start_worker(self, root: Path = ROOT, **extra: str) -> Process:
        worker = self.spawn("worker", "-m", "workers", root=root, **extra)
        client = redis.Redis.from_url(self.redis_url)
        before = len(client.smembers("rq:workers"))
        wait_until(lambda: len(client.smembers("rq:workers")) > before or worker.proc.poll() is not None, 30)
        assert worker.proc.poll() is None, worker.output()
        return worker

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    def settled(self, timeout: float = 30.0) -> None:
        """Wait until nothing more can happen without a new event: the condition that shows a
        "never" (no extra model request, no second run) is final, instead of a fixed window.

        Settled means: no job queued or scheduled (retries), no run marked active (so the
        watchdog has nothing to hand out), and no run holding a lease (so no job is driving one).
        RQ's started registry is not asked: a SIGKILLed worker's job stays there for minutes.
        """
        client = redis.Redis.from_url(self.redis_url)

        def quiet() -> bool:
            queue = make_queue(client)
            busy = (
                queue.count
                + queue.scheduled_job_registry.count
                + client.zcard("harness:active")
                + len(client.keys("harness:lease:*"))
            )
            return busy == 0

        wait_until(quiet, timeout=timeout)

    # --- HTTP as Slack sends it ------------------------------------------------------------

    def healthz(self) -> int:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0

    def post(self, body: str, content_type: str, *, headers: dict[str, str] | None = None) -> tuple[int, str]:
        all_headers = {"Content-Type": content_type, **(headers or signed_headers(SIGNING_SECRET, body))}
        request = urllib.request.Request(f"{self.url}/slack/events", data=body.encode(), headers=all_headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode(errors="replace")

    def mention(
        self,
        text: str,
        *,
        channel: str = "C1",
        user: str = "UALICE",
        ts: str | None = None,
        thread_ts: str | None = None,
        event_id: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, str, str]:
        """Deliver an app_mention; returns (status, ts of the mention, event_id)."""
        ts = ts or self.slack.add_message(channel, f"<@UBOT> {text}", user=user, thread_ts=thread_ts)
        event = {"type": "app_mention", "user": user, "text": f"<@UBOT> {text}", "ts": ts, "channel": channel}
        if thread_ts:
            event["thread_ts"] = thread_ts
        event_id = event_id or f"Ev{time.time_ns()}"
        body = event_body(event, event_id=event_id)
        status, _ = self.post(body, "application/json", headers=headers and {**headers})
        return status, ts, event_id

    def click(
        self, message: dict[str, Any], action_id: str, *, user: str = "UALICE", team: str = "T1"
    ) -> int:
        """Click the button `action_id` of a posted message as `user` of workspace `team`."""
        block, button = next(
            (b, e)
            for b in message["blocks"]
            if b["type"] == "actions"
            for e in b["elements"]
            if e.get("action_id") == action_id
        )
        value = button.get("value", "")
        status, _ = self.click_value(
            message, action_id, value, user=user, team=team, block_id=block.get("block_id")
        )
        return status

    def click_value(
        self,
        message: dict[str, Any],
        action_id: str,
        value: str,
        *,
        user: str = "UALICE",
        team: str = "T1",
        block_id: str | None = "approval",
        kind: str = "button",
    ) -> tuple[int, str]:
        """Click `action_id` on `message` as if its button carried `value` (a forged or stale one);
        `kind` is the element's type (`feedback_buttons` for the thumbs under an answer).

        Returns the HTTP status and body of the answer.
        """
        payload = {
            **interaction("block_actions", user, team),
            "container": {"type": "message", "message_ts": message["ts"], "channel_id": message["channel"]},
            "channel": {"id": message["channel"], "name": "general"},
            "message": {"ts": message["ts"], "thread_ts": message.get("thread_ts"), "text": message["text"]},
            "response_url": self.slack.response_url(),
            "actions": [
                {
                    "type": kind,
                    "action_id": action_id,
                    "block_id": block_id or "approval",
                    "value": value,
                    "action_ts": str(time.time()),
                }
            ],
        }
        return self.post(action_body(payload), "application/x-www-form-urlencoded")

    def submit_values(
        self, view: dict[str, Any], values: dict[str, str | None], *, user: str = "UALICE"
    ) -> tuple[int, str]:
        """Submit a modal whose `plain_text_input`s (action_id "value") hold `values` by block_id.

        Returns the HTTP status and body of the answer (`response_action: errors` lives there).
        """
        state = {
            block: {"value": {"type": "plain_text_input", "value": value}} for block, value in values.items()
        }
        payload = {
            **interaction("view_submission", user),
            "view": {**view, "id": "V1", "state": {"values": state}},
        }
        return self.post(action_body(payload), "application/x-www-form-urlencoded")

    def submit_view(self, view: dict[str, Any], reason: str, *, user: str = "UALICE") -> int:
        payload = {
            **interaction("view_submission", user),
            "view": {
                **view,
                "id": "V1",
                "state": {"values": {"reason": {"reason": {"type": "plain_text_input", "value": reason}}}},
            },
        }
        status, _ = self.post(action_body(payload), "application/x-www-form-urlencoded")
        return status


def interaction(kind: str, user: str, team: str = "T1") -> dict[str, Any]:
    """The fields every interactivity payload Slack sends carries."""
    return {
        "type": kind,
        "team": {"id": team, "domain": "test"},
        "user": {"id": user, "username": user.lower(), "team_id": team},
        "api_app_id": "A1",
        "token": "fake-verification-token",
        "trigger_id": f"trigger-{time.time_ns()}",
    }


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)[:4000]


# --- what end-to-end modules share ----------------------------------------------------------------


def running_stack(
    redis_server: RedisServer,
    workdir: Path,
    config: str,
    db: int,
    *,
    responder: Callable[[dict[str, Any]], Any] | None = None,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """A bot and a worker on Redis database `db` of their own, so two stacks' workers never take
    each other's jobs (a module fixture yields from it). `responder`: the model stand-in's;
    `extra_env`: more environment for both processes."""
    url = redis_server.url.rsplit("/", 1)[0] + f"/{db}"
    redis.Redis.from_url(url).flushdb()
    with FakeSlackAPI(bot_token=BOT_TOKEN) as slack, FakeMessagesAPI() as model:
        model.responder = responder
        stack = Stack(url, slack, model, workdir, config=config, extra_env=dict(extra_env or {}))
        try:
            stack.start_bot()
            stack.start_worker()
            yield stack
        finally:
            stack.stop()


def thread(stack: Stack, channel: str, ts: str) -> list[dict[str, Any]]:
    """The replies in the thread of `ts` (the mention itself left out)."""
    return [m for m in stack.slack.messages(channel, ts) if m["ts"] != ts]


def wait_post(
    stack: Stack, channel: str, ts: str, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20
) -> dict[str, Any]:
    """The first reply in the thread that `predicate` accepts, once there is one."""
    return wait_until(lambda: next((m for m in thread(stack, channel, ts) if predicate(m)), None), timeout)


def has_actions(message: dict[str, Any]) -> bool:
    """Whether the message asks someone to decide something (the Working message's Stop aside)."""
    return any(b["type"] == "actions" and b.get("block_id") != "working" for b in message.get("blocks") or [])
