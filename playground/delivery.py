"""Events reach the bot as Slack delivers them: sent again while the bot does not take them.

`make run` starts the page about two seconds before the bot answers, and a bot may restart. Slack
does not drop an event then: it sends it again up to three times, nearly immediately, after one
minute and after five, each time with the same `event_id` and ``X-Slack-Retry-Num`` (1, 2, 3) and
``X-Slack-Retry-Reason`` (``connection_failed``, ``http_timeout``, ``http_error``), unless the bot
answered ``X-Slack-No-Retry: 1``. So does the playground, for mentions and the Home tab's opening
(clicks and modals are not retried, by Slack either: the page says the bot did not take them).

"Nearly immediately" here: one second after the failure; or, when the bot did not listen at all
(it is starting), as soon as it answers ``GET /healthz``, at most a minute later. So a mention
typed while the bot starts is delivered the moment it can hear it, by Slack's first retry, rather
than a minute later by its second.

The page shows what is going on (`status`): the bot is starting (it has not answered yet), which
messages are kept for it and when the next retry goes, and which it never took after the last.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from playground.bot_client import CONNECTION_FAILED, HTTP_ERROR, Bot, BotUnreachable, Reply

log = logging.getLogger(__name__)

Json = dict[str, Any]
FIRST_RETRY_SECONDS = 1.0  # Slack: "nearly immediately"
RETRY_SCHEDULE = (FIRST_RETRY_SECONDS, 60.0, 300.0)  # Slack's: then after 1 minute, after 5 minutes
LISTEN_WAIT_SECONDS = 60.0  # the first retry after the bot did not listen waits this long for it
HEALTH_POLL_SECONDS = 0.1
GIVE_UP = "the bot never took it after Slack's {retries} retries; see the terminal"


@dataclass
class Kept:
    """An event the bot has not taken yet: what it was, and its next retry."""

    what: str
    retry: int  # the number of the next retry (X-Slack-Retry-Num)
    reason: str  # why the last attempt failed (X-Slack-Retry-Reason of the next one)
    at: float  # when the next retry goes at the latest (epoch seconds)


@dataclass
class Deliveries:
    """The events on their way to the bot, retried on Slack's schedule; `changed` wakes the page."""

    bot: Bot
    changed: Callable[[], None]
    schedule: tuple[float, ...] = RETRY_SCHEDULE
    listen_wait: float = LISTEN_WAIT_SECONDS
    answered: bool = False  # the bot answered once since the playground started
    _kept: dict[int, Kept] = field(default_factory=dict)
    _lost: list[Json] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _ids: int = 0

    def watch_start(self) -> None:
        """Ask the bot's ``/healthz`` until it first answers, so that the page can say it is starting."""

        def watch() -> None:
            while not self.answered and not self._stop.is_set():
                if self.bot.healthy():
                    self._heard()
                    return
                self._stop.wait(HEALTH_POLL_SECONDS)

        threading.Thread(target=watch, name="playground-bot-start", daemon=True).start()

    def stop(self) -> None:
        """Stop retrying (the playground is stopping)."""
        self._stop.set()

    def send(self, event: Json, what: str) -> Reply | None:
        """Send `event` now; the bot's reply, or None when it is kept and retried (the bot did not
        listen, timed out, or answered 5xx). A reply of 4xx is the caller's to report."""
        callback = self.bot.event_callback(event)
        try:
            reply = self.bot.post_event(callback)
        except BotUnreachable as exc:
            reason = exc.reason
        else:
            if reply.status < 300:
                self._heard()
                return reply
            if reply.status < 500 or reply.no_retry:
                return reply
            reason = HTTP_ERROR
        with self._lock:
            self._ids += 1
            key = self._ids
            self._kept[key] = Kept(what, 1, reason, time.time() + self.schedule[0])
        self.changed()
        log.info("the bot did not take %s (%s); retrying as Slack does", what, reason)
        threading.Thread(
            target=self._retry, args=(key, callback), name="playground-retry", daemon=True
        ).start()
        return None

    def status(self) -> Json:
        """What the page shows: whether the bot answered yet, the events kept, those it never took."""
        retries = len(self.schedule)
        with self._lock:
            return {
                "bot_answered": self.answered,
                "kept": [
                    {"what": k.what, "retry": k.retry, "of": retries, "reason": k.reason, "at": k.at}
                    for k in self._kept.values()
                ],
                "lost": [dict(item) for item in self._lost],
            }

    def _retry(self, key: int, callback: Json) -> None:
        reason = self._kept[key].reason
        for number, delay in enumerate(self.schedule, 1):
            until_listening = number == 1 and reason == CONNECTION_FAILED
            wait = self.listen_wait if until_listening else delay
            self._update(key, number, reason, time.time() + wait)
            if not self._pause(wait, until_listening=until_listening):
                return
            try:
                reply = self.bot.post_event(callback, retry=(number, reason))
            except BotUnreachable as exc:
                reason = exc.reason
                continue
            if reply.status < 300:
                self._heard()
                self._settle(key, None)
                return
            reason = HTTP_ERROR
            if reply.status < 500 or reply.no_retry:
                break
        self._settle(key, GIVE_UP.format(retries=len(self.schedule)))

    def _pause(self, delay: float, *, until_listening: bool) -> bool:
        """Wait `delay` s, or only until the bot answers ``/healthz`` when `until_listening`;
        False when the playground is stopping."""
        if not until_listening:
            return not self._stop.wait(delay)
        deadline = time.monotonic() + delay
        while not self._stop.is_set():
            if self.bot.healthy():
                return True
            if time.monotonic() >= deadline:
                return True
            self._stop.wait(min(HEALTH_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        return False

    def _update(self, key: int, number: int, reason: str, at: float) -> None:
        with self._lock:
            kept = self._kept[key]
            kept.retry, kept.reason, kept.at = number, reason, at
        self.changed()

    def _settle(self, key: int, lost: str | None) -> None:
        with self._lock:
            kept = self._kept.pop(key)
            if lost is not None:
                self._lost.append({"what": kept.what, "why": lost})
                log.warning("the bot never took %s: %s", kept.what, lost)
        self.changed()

    def _heard(self) -> None:
        with self._lock:
            news, self.answered = not self.answered, True
        if news:
            self.changed()
