"""Socket Mode that acks every envelope within Slack's 3 s, whatever it holds.

Bolt's own adapter (`slack_bolt/adapter/socket_mode/builtin`) acks an envelope only when Bolt
answers it 200: an event with no listener (404), a payload Bolt chokes on, a listener that raised
or one still running stays unacked, and Slack delivers it again and again. Here every envelope is
acked exactly once:

- Bolt answered 200: acked with Bolt's answer as the payload (a modal's `response_action`, say);
- Bolt answered anything else, raised, or the input gate refused the payload: acked empty, logged;
- no answer `ack_within` seconds after the envelope arrived: acked empty then, and logged; the
  listener still finishes its work, its late answer is dropped.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slack_bolt import App, BoltRequest, BoltResponse
from slack_sdk.socket_mode.builtin import SocketModeClient
from slack_sdk.socket_mode.response import SocketModeResponse

from bot.web import payload_problem
from runtime.reload import Hangup

log = logging.getLogger(__name__)

ACK_WITHIN = 2.0  # seconds; Slack waits 3 s for an ack, and the ack itself takes a moment to travel


class _Client(SocketModeClient):
    """The SDK's own client (standard library only), telling us of each message before it is queued."""

    def __init__(self, *args: Any, on_arrival: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_arrival = on_arrival

    def enqueue_message(self, message: str) -> None:
        self._on_arrival(message)  # before any worker can see it: its clock starts first
        super().enqueue_message(message)


class SocketModeRunner:
    """The Bolt `app` on a Socket Mode connection, every envelope acked once and in time."""

    def __init__(
        self, app: App, app_token: str, *, ack_within: float = ACK_WITHIN, concurrency: int = 10
    ) -> None:
        self.app = app
        self.ack_within = ack_within
        self._lock = threading.Lock()
        self._waiting: dict[str, threading.Timer] = {}  # envelope id -> its deadline, until acked
        self.client = _Client(
            app_token=app_token,
            logger=logging.getLogger("slack_sdk.socket_mode"),
            web_client=app.client,  # on SLACK_API_URL: apps.connections.open is a Web API call
            concurrency=concurrency,
            receive_buffer_size=64 * 1024,
            on_arrival=self._arrived,
        )
        self.client.message_listeners.append(self._handle)

    def connect(self) -> None:
        """Open the connection (SlackApiError if Slack refuses the app token); messages flow from here."""
        self.client.connect()

    def close(self) -> None:
        self.client.close()

    def _arrived(self, raw: str) -> None:
        envelope_id = _envelope_id(raw)
        if envelope_id is None:
            return  # hello, disconnect: nothing to ack
        late = Answer(empty_because=f"no answer within {self.ack_within:g} s")
        deadline = threading.Timer(self.ack_within, self._ack, (envelope_id, late))
        deadline.daemon = True
        with self._lock:
            if envelope_id in self._waiting:
                return  # the same envelope again while the first is in flight: one ack for both
            self._waiting[envelope_id] = deadline
        deadline.start()

    def _handle(self, client: Any, message: dict[str, Any], raw: str | None) -> None:
        envelope_id = message.get("envelope_id")
        if isinstance(envelope_id, str):
            self._ack(envelope_id, answer(self.app, message))

    def _ack(self, envelope_id: str, reply: Answer) -> None:
        with self._lock:
            deadline = self._waiting.pop(envelope_id, None)
        if deadline is None:
            log.info("envelope %s answered after its ack; the answer is dropped", envelope_id)
            return
        deadline.cancel()
        if reply.empty_because:
            level = logging.INFO if reply.routine else logging.WARNING
            log.log(level, "envelope %s acked empty: %s", envelope_id, reply.empty_because)
        try:
            response = SocketModeResponse(envelope_id=envelope_id, payload=reply.payload)
            self.client.send_socket_mode_response(response)
        except Exception as exc:  # the connection went away: Slack delivers the envelope again
            log.warning("could not ack envelope %s: %s", envelope_id, exc)


@dataclass(frozen=True)
class Answer:
    """What an envelope is acked with: Bolt's answer, or nothing and why."""

    payload: dict[str, Any] | None = None
    empty_because: str | None = None
    routine: bool = False  # an event this app has no listener for: logged at INFO, not WARNING


def answer(app: App, envelope: dict[str, Any]) -> Answer:
    """Run `envelope` through the input gate and Bolt; never raises."""
    payload = envelope.get("payload")
    problem = payload_problem(payload)
    if problem or not isinstance(payload, dict):
        return Answer(empty_because=f"{envelope.get('type')} payload refused: {problem}")
    headers: dict[str, str | Sequence[str]] = {}
    if envelope.get("retry_attempt") is not None:
        headers["x-slack-retry-num"] = str(envelope["retry_attempt"])
    if envelope.get("retry_reason") is not None:
        headers["x-slack-retry-reason"] = str(envelope["retry_reason"])
    try:
        response = app.dispatch(BoltRequest(mode="socket_mode", body=payload, headers=headers or None))
    except Exception as exc:
        log.exception("Bolt failed on a %s envelope that passed the gate", envelope.get("type"))
        return Answer(empty_because=f"Bolt raised {type(exc).__name__}")
    if response.status != 200:
        return Answer(empty_because=f"Bolt answered {response.status}", routine=response.status == 404)
    return Answer(payload=_as_payload(response))


def _as_payload(response: BoltResponse) -> dict[str, Any] | None:
    """Bolt's answer as an ack payload, the way Bolt's own adapter sends it."""
    if not response.body:
        return None
    if response.headers.get("content-type", [""])[0].startswith("application/json"):
        body = json.loads(response.body)
        return body if isinstance(body, dict) else {"text": response.body}
    return {"text": response.body}


def _envelope_id(raw: str) -> str | None:
    try:
        message = json.loads(raw) if raw.startswith("{") else None
    except ValueError:
        return None
    envelope_id = message.get("envelope_id") if isinstance(message, dict) else None
    return envelope_id if isinstance(envelope_id, str) else None


def serve(app: App, app_token: str, *, on_reload: Callable[[], object] | None = None) -> None:
    """Run the app over Socket Mode until SIGTERM or SIGINT (SlackApiError if Slack refuses the
    token); each SIGHUP runs `on_reload` (on a thread of its own) while envelopes keep flowing."""
    runner = SocketModeRunner(app, app_token)
    try:
        runner.connect()
    except BaseException:
        runner.close()
        raise
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if on_reload is not None:
        Hangup(on_reload).install()
    log.info("Socket Mode: connected, acking every envelope within %.1f s", runner.ack_within)
    stop.wait()
    runner.close()
