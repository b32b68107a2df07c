"""Reading `HARNESS_CONFIG` again without a restart (SIGHUP): the bot and the workers do it alike.

A reload reads the file as a start would and prepares what the process needs from it (the bot: its
`approvers_from` callables imported; a worker: its catalog, so tool modules are imported and
`${VAR}`s resolved). Any
error is one log line naming it, and the running config stays; success is one line too. Nothing
parked is touched: a run's settings are read from the config in force whenever they are needed,
as its channel's profile now (`Services.settings_of`), so a resumed run follows the new file.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from types import FrameType
from typing import TypeVar

from harness.config import Config, ConfigError, load_config

log = logging.getLogger(__name__)

T = TypeVar("T")


class LiveConfig:
    """The process's config now, swapped whole by a reload: every read sees the old config or the
    new one, never a mix. In HTTP mode a web worker's never changes (gunicorn's master swaps it,
    then forks new workers); in Socket Mode a swap may land between two reads of one request."""

    def __init__(self, config: Config) -> None:
        self._config = config

    @property
    def current(self) -> Config:
        return self._config

    def swap(self, config: Config) -> None:
        self._config = config  # one reference assignment: readers see the old or the new, whole


def reload(
    prepare: Callable[[Config], T], install: Callable[[T], object], env: Mapping[str, str] | None = None
) -> bool:
    """Read `HARNESS_CONFIG` again, `prepare` what the process needs from it and `install` that;
    whether the new config is in force. Either way one log line says so (after `install`, so that
    whoever reads the line finds the new config in place); on any error nothing is installed."""
    env = os.environ if env is None else env
    where = env.get("HARNESS_CONFIG") or "built-in defaults"
    try:
        config = load_config(env=env)
        prepared = prepare(config)
    except ConfigError as exc:
        log.error("config reload refused, the running config is kept: %s", exc)
        return False
    except Exception as exc:  # a reload must never take a serving process down
        log.error("config reload failed, the running config is kept: %s: %s", type(exc).__name__, exc)
        return False
    install(prepared)
    log.info("config reloaded from %s: %d profiles", where, len(config.profiles))
    return True


def servers_kept(running: Config, new: Config) -> None:
    """One line when `[[mcp.servers]]` changed: a worker's servers run from its start to its end."""
    before = {s.name: s for s in running.mcp_servers}
    after = {s.name: s for s in new.mcp_servers}
    if before == after:
        return
    changes = [f"added {n}" for n in after if n not in before]
    changes += [f"removed {n}" for n in before if n not in after]
    changes += [f"changed {n}" for n in after if n in before and after[n] != before[n]]
    log.warning(
        "mcp.servers changed (%s): the running servers are kept until the worker restarts",
        ", ".join(changes),
    )


class Hangup:
    """Runs `reload` on a thread of its own after each SIGHUP (several at once make one reload).

    The signal handler only wakes the thread: a reload imports modules and logs, which must not
    run inside a handler that interrupted the main thread anywhere. A process forked from this
    one (a work horse, RQ's scheduler) inherits the handler but not the thread: there it does
    nothing, unless the child installs its own.
    """

    def __init__(self, reload: Callable[[], object]) -> None:
        self._reload = reload
        self._wanted = threading.Event()
        self._pid = os.getpid()

    def install(self) -> Hangup:
        threading.Thread(target=self._serve, name="config-reload", daemon=True).start()
        signal.signal(signal.SIGHUP, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() == self._pid:
            self._wanted.set()

    def _serve(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            try:
                self._reload()
            except Exception:  # the thread must outlive any one reload
                log.exception("config reload failed; the running config is kept")
