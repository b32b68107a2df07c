"""The values a person typed into a server's form (`harness.tools.inputs`), kept apart from the run.

A run's record is saved at every step, read by operator commands and replayed; the values of a
form belong to the one call that asked for them. So the bot keeps them here under a reference of
their own (a random id, in the answer recorded in the park), the worker reads them just before the
call goes again, and drops them once it went. They live no longer than the park they answer
(plus a day for a resume that waited), and appear in no log, audit entry, trace or record.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from store.base import StorePart, as_text
from store.keys import DAY, Keys

VALUES_MAX_BYTES = 64 * 1024  # one form's values; Slack's modal fields are far smaller


class InputStore(StorePart):
    """Form values by run and reference."""

    def keep(self, run_id: str, values: dict[str, Any], ttl: int) -> str:
        """Keep `values` for `ttl` seconds (and a day more); their reference. On a replica before
        the answer that names them is recorded (`replicas`): a failover keeps what it names."""
        ref = secrets.token_hex(8)
        data = json.dumps(values, ensure_ascii=False, separators=(",", ":"))
        if len(data.encode()) > VALUES_MAX_BYTES:
            raise ValueError(f"the answers take more than {VALUES_MAX_BYTES} bytes")
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(Keys.input_values(run_id, ref), data, ex=ttl + DAY)
            waited = self.replicas.waits(pipe)
            answers = pipe.execute(raise_on_error=False)
        if isinstance(answers[0], Exception):
            raise answers[0]
        if waited:
            self.replicas.check(answers[-1], "decision")
        return ref

    def values(self, run_id: str, ref: str) -> dict[str, Any]:
        """The values kept under `ref`; empty when gone (expired, or already sent)."""
        raw = self.redis.get(Keys.input_values(run_id, ref))
        if raw is None:
            return {}
        try:
            found = json.loads(as_text(raw))
        except ValueError:
            return {}
        return found if isinstance(found, dict) else {}

    def drop(self, run_id: str, refs: list[str]) -> None:
        """The values went to their server (or never will): gone."""
        if refs:
            self.redis.delete(*(Keys.input_values(run_id, ref) for ref in refs))
