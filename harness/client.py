"""The Anthropic client the harness uses: the SDK's own retries, with `Retry-After` bounded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic

DEFAULT_TIMEOUT_SECONDS = 120.0
DEFAULT_MAX_RETRIES = 2
DEFAULT_RETRY_AFTER_CAP_SECONDS = 20.0


class RetryAfterCap:
    """Shortens a server's `retry-after` so a worker never sleeps unboundedly inside the SDK.

    The SDK honours `retry-after` however long it is (up to ~50 days); past the cap we would
    rather fail over to our own Retry button than hold a worker. A response hook of the client's
    HTTP client, which sees every attempt's answer before the SDK reads it: an SDK middleware did
    the same but cost ~70 µs of CPU on every request (a copy of the options and a request object
    per attempt), about 3% of a tool turn of the bare loop (tests/bench/bench_overhead.py).
    """

    def __init__(self, cap_seconds: float) -> None:
        self.cap_seconds = cap_seconds

    def __call__(self, response: Any) -> None:
        headers = response.headers
        for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
            raw = headers.get(name)
            if raw is None:
                continue
            try:
                seconds = float(raw) / scale
            except ValueError:
                seconds = self.cap_seconds + 1  # an HTTP date: treat as long
            if seconds > self.cap_seconds:
                headers[name] = f"{self.cap_seconds * scale:g}"


def make_client(
    *,
    max_retries: int = DEFAULT_MAX_RETRIES,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    retry_after_cap: float = DEFAULT_RETRY_AFTER_CAP_SECONDS,
    base_url: str | None = None,
    api_key: str | None = None,
) -> anthropic.Anthropic:
    """An `anthropic.Anthropic`; unless given, the SDK reads `ANTHROPIC_API_KEY`/`_BASE_URL` itself.

    Its HTTP client is the SDK's default one (`DefaultHttpxClient`: the SDK's timeouts, limits and
    redirects) with the `retry-after` cap as a response hook.
    """
    http_client = anthropic.DefaultHttpxClient(event_hooks={"response": [RetryAfterCap(retry_after_cap)]})
    return anthropic.Anthropic(
        base_url=base_url,
        api_key=api_key,
        max_retries=max_retries,
        timeout=timeout,
        http_client=http_client,
    )


def warm_up() -> None:
    """Build the SDK's response models now (~25 ms), not inside the first request of every job.

    A worker calls it before forking, so every work horse inherits them ready.
    """
    anthropic.types.Message.model_validate(
        {
            "id": "msg_warm",
            "type": "message",
            "role": "assistant",
            "model": "warm",
            "content": [
                {"type": "text", "text": "warm"},
                {"type": "tool_use", "id": "toolu_warm", "name": "warm", "input": {}},
            ],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
    )


def streamed_reply(
    client: anthropic.Anthropic, request: dict[str, Any], on_text: Callable[[str], None]
) -> Any:
    """The reply to `request`, streamed (`messages.stream`): `on_text` gets each piece of its text as
    the model writes it, and the message returned is the one `messages.create` would have given.

    The SDK retries the opening request as `create` does; a stream cut off midway raises, and the
    reply counts as not received (the step is made again).
    """
    with client.messages.stream(**request) as stream:
        for event in stream:
            if event.type == "text" and event.text:
                on_text(event.text)
        return stream.get_final_message()
