"""A run's live messages still streaming or unsettled (`workers.live`): the ts of each, in one set
per run, so that a driver after one that died finds them, stops them and removes those no saved
step owes a settlement (`workers.driver.Driver.drop_orphans`)."""

from __future__ import annotations

from store.base import StorePart, as_text
from store.keys import DAY, Keys


class LiveStore(StorePart):
    """The open live messages of each run (a set that lives a day past its last opening)."""

    def opened(self, run_id: str, ts: str) -> None:
        """A live message of `run_id` opened: recorded before anything can owe its settlement, and
        on a replica before the stream grows (`replicas`): a failover that lost the record would
        leave the message to stand beside the answer a driver after it streams again."""
        key = Keys.live(run_id)
        with self.redis.pipeline(transaction=False) as pipe:  # one connection: WAIT counts its writes
            pipe.sadd(key, ts)
            pipe.expire(key, DAY)
            waited = self.replicas.waits(pipe)
            answers = pipe.execute(raise_on_error=False)
        for answer in answers[:2]:
            if isinstance(answer, Exception):
                raise answer
        if waited:
            self.replicas.check(answers[-1], "live")

    def closed(self, run_id: str, ts: str) -> None:
        """The live message `ts` is settled, deleted or handed to the run's park: no longer open."""
        self.redis.srem(Keys.live(run_id), ts)

    def open(self, run_id: str) -> list[str]:
        """The ts of every live message of `run_id` still open."""
        return [as_text(ts) for ts in self.redis.smembers(Keys.live(run_id))]
