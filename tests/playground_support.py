"""The playground as its users start it (`make run` with no Slack settings) and a client of its page API."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import redis

from harness.config import load_config
from launch.modes import PLAYGROUND_CONFIG
from playground.bot_client import Bot
from playground.profiles import describe
from playground.server import Playground, Server
from playground.slack import CHANNELS, PEOPLE, Workspace
from store.keys import Keys
from store.records import RunRecord, unpack
from tests.stack import free_port, wait_until

ROOT = Path(__file__).resolve().parents[1]
ALICE, BOB, CAROL = "U01ALICE", "U02BOB", "U03CAROL"
Json = dict[str, Any]


class Running:
    """A started playground: its process, its output line by line, and its page's address."""

    def __init__(self, cmd: Sequence[str], env: dict[str, str], cwd: Path, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/"
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout: float = 60) -> None:
        """Until it says the page is worth opening (the bot listens behind it) and the worker listens."""

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the playground exited ({self.proc.returncode}):\n{self.output()}")
            text = self.output()
            return f"the playground is ready: open {self.url}" in text and "Listening on" in text

        wait_until(ready, timeout=timeout, interval=0.1)

    def stop(self) -> int:
        """Ctrl-C, as a user stops it; then whatever it started and left is killed."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            code = self.proc.wait(30)
        finally:
            for pid in {int(p) for p in re.findall(r"\(pid (\d+)\)", self.output())}:
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            self._reader.join(5)
        return code


def playground_env(redis_url: str, workspace: Path, port: int, **extra: str) -> dict[str, str]:
    """A user's environment with no Slack and no Anthropic settings at all."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLACK_", "ANTHROPIC_", "REDIS_", "HARNESS_", "PLAYGROUND_"))
    }
    env.update(
        REDIS_URL=redis_url,
        HARNESS_WORKSPACE=str(workspace),
        PORT=str(port),
        HARNESS_DEV_STOP_TIMEOUT="5",
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


@contextmanager
def playground(
    redis_url: str, workspace: Path, *, make: bool = False, cwd: Path = ROOT, **extra: str
) -> Iterator[Running]:
    """`make run` (or the `python -m launch.local` it runs) with no Slack settings, until the block ends."""
    port = free_port()
    cmd = ["make", "--no-print-directory", "run"] if make else [sys.executable, "-m", "launch.local"]
    running = Running(cmd, playground_env(redis_url, workspace, port, **extra), cwd, port)
    try:
        running.wait_ready()
        yield running
    except BaseException:
        print(f"--- what the playground printed (last lines) ---\n{running.output()[-8000:]}")
        raise
    finally:
        running.stop()


class Page:
    """What the page's JavaScript does, over HTTP: read the state, mention the bot, click, submit."""

    def __init__(self, url: str) -> None:
        self.url = url

    def request(
        self, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        sent = {"Content-Type": "application/json", "X-Playground": "1", **(headers or {})}
        req = urllib.request.Request(self.url + path.lstrip("/"), data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(req, timeout=30) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def state(self) -> Json:
        status, body = self.request("GET", "play/state")
        assert status == 200, body
        return body  # type: ignore[no-any-return]

    def post(self, path: str, body: Json) -> Json:
        status, answer = self.request("POST", path, body)
        assert status == 200 and answer.get("ok") is not False, (status, answer)
        return answer  # type: ignore[no-any-return]

    def mention(self, user: str, text: str, thread_ts: str | None = None) -> str:
        return str(self.post("play/mention", {"user": user, "text": text, "thread_ts": thread_ts})["ts"])

    def thread(self, ts: str, state: Json | None = None) -> list[Json]:
        state = state or self.state()
        return [m for m in state["messages"] if m["ts"] == ts or m["thread_ts"] == ts]

    def wait(self, predicate: Callable[[Json], Any], timeout: float = 60) -> Any:
        """Until `predicate(state)` is truthy; its value."""
        return wait_until(lambda: predicate(self.state()), timeout=timeout, interval=0.05)

    def wait_text(self, ts: str, needle: str, timeout: float = 60) -> Json:
        """The first message of thread `ts` whose text holds `needle`, once there is one."""
        return self.wait(
            lambda s: next((m for m in self.thread(ts, s) if needle in m["text"]), None), timeout
        )

    def button(self, message: Json, action_id: str) -> tuple[str, str]:
        """The block_id and value of the button `action_id` in `message`."""
        for block in message.get("blocks") or []:
            for element in block.get("elements") or []:
                if element.get("action_id") == action_id:
                    return block["block_id"], element.get("value", "")
        raise AssertionError(f"no {action_id} button in {message['text']!r}")

    def click(self, user: str, message: Json, action_id: str) -> Json:
        block_id, value = self.button(message, action_id)
        return self.post(
            "play/action",
            {
                "user": user,
                "action_id": action_id,
                "block_id": block_id,
                "value": value,
                "message_ts": message["ts"],
            },
        )


@contextmanager
def stand_in(token: str, **workspace_options: Any) -> Iterator[Server]:
    """The playground's server alone, in this process: its Slack, its page and its demo model,
    with no bot behind it (the bot's address refuses connections); at `server.playground.base_url`."""
    workspace = Workspace(token=token, **workspace_options)
    bot = Bot(f"http://127.0.0.1:{free_port()}/slack/events", "secret")
    profiles = describe(load_config(PLAYGROUND_CONFIG, env={}), CHANNELS, PEOPLE)
    play = Playground(workspace, bot, "", True, "demo", profiles=profiles)
    server = Server(("127.0.0.1", 0), play)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    play.base_url = f"http://127.0.0.1:{server.server_address[1]}/"
    workspace.upload_base = play.base_url + "upload/"
    try:
        yield server
    finally:
        server.stopping = True
        play.deliveries.stop()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def runs_started_by(redis_url: str, ts: str) -> list[RunRecord]:
    """The records of the runs in the thread of the mention `ts`."""
    client = redis.Redis.from_url(redis_url)
    try:
        values = [client.get(key) for key in client.scan_iter(Keys.all_runs())]
        records = [RunRecord.from_json(unpack(v)) for v in values if v is not None]
        return [r for r in records if r.thread_ts == ts]
    finally:
        client.close()
