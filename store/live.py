"""A run's live messages still streaming or unsettled (`workers.live`): the ts of each, in one set
per run, so that a driver after one that died finds them, stops them and removes those no saved
step owes a settlement (`workers.driver.Driver.drop_orphans`).

A stream's ts is known only once `chat.startStream` answers, and a crash (or a Redis failover that
loses the write) can come between that answer and the write of its ts. So the opening is promised
first: a mark, on a replica before the stream starts, that stays until the ts is written down. A
driver that finds the mark looks for the stream in the thread instead (`Services.find_streams`).
"""

from __future__ import annotations

from collections.abc import Callable

from redis.client import Pipeline

from store.base import StorePart, as_text
from store.keys import DAY, Keys


class LiveStore(StorePart):
    """The open live messages of each run (a set that lives a day past its last opening)."""

    def opening(self, run_id: str) -> None:
        """A live message of `run_id` is about to open: marked (on a replica, when there is one)
        before `chat.startStream` is sent, so a stream whose ts is lost is still looked for."""
        self._promised(lambda pipe: pipe.set(Keys.live_opening(run_id), 1, ex=DAY), 1)

    def opened(self, run_id: str, ts: str) -> None:
        """A live message of `run_id` opened: recorded before anything can owe its settlement, and
        on a replica before the stream grows (`replicas`): a failover that lost the record would
        leave the message to stand beside the answer a driver after it streams again."""
        key = Keys.live(run_id)

        def write(pipe: Pipeline) -> object:
            pipe.sadd(key, ts)
            pipe.expire(key, DAY)
            return pipe.delete(Keys.live_opening(run_id))

        self._promised(write, 3)

    def unfound(self, run_id: str) -> bool:
        """Whether a live message of `run_id` may have opened without its ts written down."""
        return bool(self.redis.exists(Keys.live_opening(run_id)))

    def sought(self, run_id: str) -> None:
        """The thread was searched for the message `unfound` marked: the mark goes."""
        self.redis.delete(Keys.live_opening(run_id))

    def closed(self, run_id: str, ts: str) -> None:
        """The live message `ts` is settled, deleted or handed to the run's park: no longer open."""
        self.redis.srem(Keys.live(run_id), ts)

    def open(self, run_id: str) -> list[str]:
        """The ts of every live message of `run_id` still open."""
        return [as_text(ts) for ts in self.redis.smembers(Keys.live(run_id))]

    def _promised(self, write: Callable[[Pipeline], object], writes: int) -> None:
        """Send `write`'s `writes` commands and a WAIT for a replica (when the master has one) on one
        connection, since WAIT counts the writes of its own; an error in a write is raised."""
        with self.redis.pipeline(transaction=False) as pipe:
            write(pipe)
            waited = self.replicas.waits(pipe)
            answers = pipe.execute(raise_on_error=False)
        for answer in answers[:writes]:
            if isinstance(answer, Exception):
                raise answer
        if waited:
            self.replicas.check(answers[-1], "live")
