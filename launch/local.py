"""`python -m launch`: the web process, one worker and, if needed, a private Redis on this machine.

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
the playground must answer before the bot starts. That removes about 15 of the ~570 lines of
`launch/` (the spawn loop, the bot's wait, the call to `supervise`) and adds about 28: a printer keeping these
prefixes and LOG_FORMAT=json, a thread that stops it when Redis or the playground dies, another
for the bot's readiness line, its exit codes (130, 143) mapped to 0. It would also break promises
tests/launch/test_local.py and this module keep: it SIGTERMs every process group at once, not web, then
worker, then Redis, each child alone until the grace ends; its 5 s kill wait is a module constant;
it ignores SIGHUP and a second Ctrl-C. So this stays, with no new dependency.

For tests, ``HARNESS_DEV_WEB_CMD`` / ``HARNESS_DEV_WORKER_CMD`` (shell-split strings) replace the
child commands, ``HARNESS_DEV_REDIS_PROBE`` (``host:port``) replaces localhost:6379 as the Redis
probed, and ``HARNESS_DEV_STOP_TIMEOUT`` (seconds) replaces the 10 s grace before SIGKILL.

This module decides and starts; the rest has a module each: the Redis (`launch.redis_server`),
the children and how they are stopped (`launch.children`), and the choice between Slack and the
playground with the playground's settings (`launch.modes`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from launch.children import (
    STOP_TIMEOUT,
    Child,
    DevError,
    PrefixedOutput,
    spawn,
    stop_children,
    stop_signals,
    supervise,
)
from launch.modes import (
    BOT_START_TIMEOUT,
    PLAYGROUND_PORT,
    check_settings,
    playground_envs,
    wait_until_healthy,
    wants_playground,
)
from launch.redis_server import (
    DEFAULT_DATA_DIR,
    MISSING_PLAYGROUND_REDIS,
    MISSING_REDIS_SERVER,
    carried_over,
    find_redis,
    given_redis_problem,
    lock_data_dir,
    names_redis,
    parse_probe,
    redis_database,
    start_private_redis,
    where_is,
)
from playground import bind_problem
from runtime import local_redis
from runtime.connection import DEFAULT_REDIS_URL, RedisSettingsError, RedisTarget, redact

DEFAULT_WORKSPACE = Path("workspace")


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
    """Command-line options of `python -m launch`."""
    parser = argparse.ArgumentParser(prog="python -m launch", description=__doc__.splitlines()[0])
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
                cleanup.callback(local_redis.withdraw, local_redis.announce(url))  # for `workers status`
            elif url is None:
                cleanup.enter_context(lock_data_dir(data_dir))
                proc, url = start_private_redis(data_dir, output=output)
                redis.append(Child("redis", proc))
                where = f"at {redact(url)} (password-protected), data in {data_dir}/"
                output.say("dev", f"started redis (pid {proc.pid}) {where}")
                cleanup.callback(local_redis.withdraw, local_redis.announce(url))  # for `workers status`
            elif settings.playground:
                named = "" if env.get("REDIS_SENTINELS", "").strip() else " (REDIS_URL)"
                output.say(
                    "dev",
                    f"using Redis at {where_is(url, env)}{named}, database {redis_database(url)}: "
                    f"{carried_over(url, env)}; unset REDIS_URL for a fresh Redis of the playground's own",
                )
            elif names_redis(env):
                output.say("dev", f"using Redis at {where_is(url, env)}")
            else:  # found answering on localhost:6379: somebody else's, maybe another bot's
                output.say(
                    "dev",
                    f"joining the Redis already answering at {where_is(url, env)} (not started by make run): "
                    "its queue and runs are shared with whatever else uses it; set REDIS_URL to choose one",
                )
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
