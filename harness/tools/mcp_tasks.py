"""The hub's side of MCP Tasks: a call a server answers with a task, and the questions asked of it.

Two flavours, by the protocol of the session (`harness.tools.tasks` has the shapes they share):

- 2026-07-28, the `io.modelcontextprotocol/tasks` extension. Every request declares it (the SDK
  puts a `ClientExtension`'s identifier in each request's client capabilities), and the server
  decides per call: `tools/call` may answer `resultType: "task"` with the task's fields flat. The
  extension's `ResultClaim` makes the SDK parse that shape; the call asks for it unresolved
  (`allow_claimed`), since the run parks on the task and nobody waits for it in the hub.
  `tasks/get` answers the task with its `result` (completed), `error` (failed) or `inputRequests`.
- 2025-11-25, the tasks of the core protocol. A tool listed with `execution.taskSupport:
  "required"` is called with `task: {ttl}` and answers `CreateTaskResult {task}`; `tasks/get`
  answers the task alone, and a completed task's result is fetched with `tasks/result`. (A tool
  whose support is "optional" is called plainly.)

Both cancel with `tasks/cancel`. Over streamable HTTP every `tasks/*` request carries the task id
in its `Mcp-Name` header (the extension's routing rule), which the SDK sets from the request
model's `name_param`. A status message is the server's text: it is cut to `MESSAGE_MAX` and only
ever logged through `%r`.

This client does not answer a task's own questions (`tasks/update`) yet: a task that asks for
input is cancelled, and the call is answered `is_error` saying so.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    Request,
    RequestParams,
    Result,
    TaskMetadata,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter, ValidationError

from harness import texts
from harness.tools.base import ToolResult
from harness.tools.mcp_bounds import convert_result
from harness.tools.mcp_listing import SEPARATOR
from harness.tools.mcp_log import describe
from harness.tools.tasks import (
    CANCELLED,
    COMPLETED,
    FAILED,
    INPUT_REQUIRED,
    MESSAGE_MAX,
    UNREACHABLE,
    WORKING,
    BadTask,
    TaskHandle,
    TaskPoll,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from concurrent.futures import Future

log = logging.getLogger("harness.mcp")

T = TypeVar("T")

EXTENSION = "io.modelcontextprotocol/tasks"
STATUSES = frozenset({WORKING, INPUT_REQUIRED, COMPLETED, FAILED, CANCELLED})
REQUEST_SECONDS = 30.0  # the most one tasks/* request may take (less when the server's timeout is)
_GRACE_SECONDS = 5.0  # past a request's own bound, before the caller's thread stops waiting for it
# A 2025-11-25 task is asked to be kept this long past the call's timeout: its result is fetched
# after its last poll, which may come as late as the deadline.
_TTL_MARGIN_SECONDS = 300.0


# --- the wire --------------------------------------------------------------------------------


class CreatedTask(Result):
    """A call answered with a task (2026-07-28: `resultType: "task"` and the task's fields flat;
    a 2025-11-25 `CreateTaskResult`'s `task` is read into it too). Lenient: what is missing or odd
    is refused by `handle_of`, not by the parse."""

    result_type: Literal["task"] = "task"
    task_id: str = ""
    status: str = WORKING
    status_message: str | None = None
    poll_interval_ms: float | None = None  # `pollIntervalMs` (2026-07-28), `pollInterval` (2025-11-25)


class TaskParams(RequestParams):
    task_id: str


class GetTask(Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "taskId"  # the SDK puts it in the `Mcp-Name` header (HTTP)


class CancelTask(Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param = "taskId"


class TaskPayload(Request[TaskParams, Literal["tasks/result"]]):
    """2025-11-25 only: a completed task's result."""

    method: Literal["tasks/result"] = "tasks/result"
    params: TaskParams
    name_param = "taskId"


_ANY: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


async def _never_resolved(task: CreatedTask, context: ClaimContext) -> CallToolResult:
    raise RuntimeError("the hub parks a run on a task; it never waits for one")


class TasksExtension(ClientExtension):
    """Declares `io.modelcontextprotocol/tasks` on every request, and claims `resultType: "task"`."""

    identifier = EXTENSION

    def claims(self) -> tuple[ResultClaim[Any], ...]:
        return (ResultClaim(result_type="task", model=CreatedTask, resolve=_never_resolved),)


def modern(protocol: str | None) -> bool:
    """Whether a session of `protocol` has tasks as the 2026-07-28 extension (else 2025-11-25's)."""
    return protocol in MODERN_PROTOCOL_VERSIONS


async def call_as_task(
    client: Any, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None, timeout: float
) -> CreatedTask | CallToolResult:
    """Call a 2025-11-25 task-only tool with `task: {ttl}`: its task, or a plain result from a server
    that ran it at once.

    Sent below `ClientSession.send_request`: `mcp` 2.3 checks a 2025-11-25 `tools/call` answer
    against `CallToolResult` alone, so the `CreateTaskResult` it asked for would be refused before
    any result type is consulted. The request is stamped as the session stamps its own.
    """
    session = client.session
    ttl = int((timeout + _TTL_MARGIN_SECONDS) * 1000)
    params = CallToolRequestParams.model_validate(
        {"name": tool, "arguments": arguments, "task": TaskMetadata(ttl=ttl), "_meta": meta}
    )
    data = CallToolRequest(params=params).model_dump(by_alias=True, mode="json", exclude_none=True)
    opts: dict[str, Any] = {}
    session._stamp(data, opts)  # noqa: SLF001 - see above
    raw = await session._dispatcher.send_raw_request(data["method"], data.get("params"), opts)  # noqa: SLF001
    task = raw.get("task") if isinstance(raw, dict) else None
    if not isinstance(task, dict):
        return CallToolResult.model_validate(raw, by_name=False)
    return CreatedTask(
        task_id=_text(task.get("taskId")) or "",
        status=str(task.get("status", WORKING)),
        status_message=_text(task.get("statusMessage")),
        poll_interval_ms=_number(task.get("pollInterval")),
    )


# --- a call answered with a task -------------------------------------------------------------


@dataclass(frozen=True)
class TaskCall:
    """The call a task answers: its server and tool, when it started (wall clock), its server's
    `timeout_seconds`, the hub that alone reaches its stdio server ("" for HTTP), and whether the
    tool has side effects."""

    server: str
    tool: str
    since: float
    timeout: float
    holder: str
    side_effects: bool


def task_answer(result: CreatedTask, call: TaskCall, protocol: str) -> ToolResult:
    """The call's answer: a result that waits on the task (`ToolResult.task`), or `is_error` for a
    task this client cannot follow. `protocol`: the session's."""
    server, qualified = call.server, f"{call.server}{SEPARATOR}{call.tool}"
    try:
        if result.status not in STATUSES:
            raise BadTask("its status is none of the task statuses")
        interval = result.poll_interval_ms
        handle = TaskHandle(
            server=server,
            task_id=result.task_id,
            status=result.status,
            message=(result.status_message or "")[:MESSAGE_MAX],
            poll_seconds=interval / 1000 if interval is not None else None,
            since=call.since,
            deadline=call.since + call.timeout,
            holder=call.holder,
            side_effects=call.side_effects,
            tool=call.tool,
            protocol=protocol,
        )
    except BadTask as exc:
        log.warning(
            "MCP server %s answered %s with a task it cannot be asked about: %s", server, qualified, exc
        )
        return ToolResult(texts.MCP_TASK_BAD.format(server=server, name=qualified, why=exc), True)
    log.info("MCP server %s runs %s as task %r", server, qualified, handle.task_id)
    return ToolResult(texts.MCP_TASK_WAITING.format(server=server, name=qualified), task=handle)


# --- asking about a task ---------------------------------------------------------------------


class TaskSessions(Protocol):
    """What asking about a task needs of the hub (`McpHub`)."""

    holder: str

    def submit(self, coro: Any) -> Future[Any]: ...

    async def task_session(self, name: str) -> tuple[Any, float, str]: ...


def poll_on(hub: TaskSessions, handle: TaskHandle) -> TaskPoll:
    """`McpHub.poll_task`: where the task stands now; a server not askable now is `UNREACHABLE`."""
    return _on_hub(hub, handle, poll, lambda why: TaskPoll(UNREACHABLE, why))


def cancel_on(hub: TaskSessions, handle: TaskHandle) -> bool:
    """`McpHub.cancel_task`: ask the server to cancel the task; True once it acked."""
    return _on_hub(hub, handle, cancel, lambda why: False)


def _on_hub(
    hub: TaskSessions,
    handle: TaskHandle,
    act: Callable[[Any, TaskHandle], Awaitable[T]],
    otherwise: Callable[[str], T],
) -> T:
    """Run `act` with the server's session on the hub's loop, within `REQUEST_SECONDS`; `otherwise`
    why it could not be asked."""
    if handle.holder and handle.holder != hub.holder:
        return otherwise("its stdio server runs in another worker's hub")

    async def asked() -> T:
        client, seconds, why = await hub.task_session(handle.server)
        if client is None:
            return otherwise(why)
        try:
            return await asyncio.wait_for(act(client, handle), seconds)
        except TimeoutError:
            return otherwise(f"it did not answer within {seconds:g} s")
        except Exception as exc:  # noqa: BLE001 - whatever the session does, the caller hears why
            return otherwise(f"the request failed ({describe(exc)})")

    future = hub.submit(asked())
    try:
        return future.result(2 * REQUEST_SECONDS + _GRACE_SECONDS)  # the session, then the request
    except FutureTimeout:
        future.cancel()
        return otherwise(f"it did not answer within {REQUEST_SECONDS:g} s")


async def poll(client: Any, handle: TaskHandle) -> TaskPoll:
    """One `tasks/get` of `handle`'s task, read as a `TaskPoll` (on the hub's loop)."""
    session = client.session
    if not _same_flavour(handle, session):  # the server restarted, and speaks the other one now
        return _gone(handle)
    try:
        found = await session.send_request(GetTask(params=TaskParams(task_id=handle.task_id)), _ANY)
    except MCPError as exc:
        if _unknown(exc):
            return _gone(handle)
        return TaskPoll(UNREACHABLE, f"tasks/get failed: {_cut(exc.error.message)}")
    except (ValidationError, ValueError) as exc:
        return TaskPoll(UNREACHABLE, f"its answer to tasks/get was not a task ({type(exc).__name__})")
    status = found.get("status")
    message = _text(found.get("statusMessage")) or ""
    interval = _number(found.get("pollIntervalMs" if modern(session.protocol_version) else "pollInterval"))
    seconds = interval / 1000 if interval is not None else None
    if status == WORKING:
        return TaskPoll(WORKING, message[:MESSAGE_MAX], seconds)
    if status not in STATUSES:
        return TaskPoll(UNREACHABLE, "its answer to tasks/get had no task status")
    result = await _ended(client, handle, str(status), message, found)
    return TaskPoll(str(status), message[:MESSAGE_MAX], seconds, result)


async def cancel(client: Any, handle: TaskHandle) -> bool:
    """One `tasks/cancel` of `handle`'s task: whether the server acked it (on the hub's loop)."""
    if not _same_flavour(handle, client.session):
        return False
    try:
        await client.session.send_request(CancelTask(params=TaskParams(task_id=handle.task_id)), _ANY)
    except Exception as exc:  # noqa: BLE001 - refused, unknown or unreachable: not acked
        log.info(
            "MCP server %s did not ack tasks/cancel of %r: %s", handle.server, handle.task_id, describe(exc)
        )
        return False
    log.info("MCP server %s acked tasks/cancel of %r", handle.server, handle.task_id)
    return True


async def _ended(
    client: Any, handle: TaskHandle, status: str, message: str, found: dict[str, Any]
) -> ToolResult:
    """The call's answer once its task is no longer working."""
    server, name = handle.server, f"{handle.server}{SEPARATOR}{handle.tool}"
    if status == INPUT_REQUIRED:
        acked = await cancel(client, handle)
        log.info(
            "MCP server %s: task %r of %s asked for input; cancelled (acked: %s)",
            server,
            handle.task_id,
            name,
            acked,
        )
        return ToolResult(texts.MCP_TASK_ASKS_INPUT.format(server=server, name=name), True)
    if status == CANCELLED:
        why = _cut(message) or "no reason given"
        return ToolResult(texts.MCP_TASK_CANCELLED.format(server=server, name=name, message=why), True)
    payload: Any = found.get("result") if status == COMPLETED else None
    error = found.get("error")
    if not modern(client.session.protocol_version):
        try:  # 2025-11-25: the result (or the error) of a task that ended comes from tasks/result
            payload = await client.session.send_request(
                TaskPayload(params=TaskParams(task_id=handle.task_id)), _ANY
            )
        except MCPError as exc:
            payload, error = None, {"message": exc.error.message}
    if status == FAILED and not isinstance(payload, dict):
        said = error.get("message") if isinstance(error, dict) else None
        why = _cut(_text(said) or message) or "no reason given"
        return ToolResult(texts.MCP_TASK_FAILED.format(server=server, name=name, error=why), True)
    try:
        converted = convert_result(CallToolResult.model_validate(payload, by_name=False))
    except ValidationError:
        why = "it ended without a tool result"
        return ToolResult(texts.MCP_TASK_FAILED.format(server=server, name=name, error=why), True)
    if status == FAILED:  # a 2025-11-25 task whose tool answered isError
        return ToolResult(converted.content, True)
    return converted


def _same_flavour(handle: TaskHandle, session: Any) -> bool:
    """Whether `session` has tasks of the flavour `handle`'s was made on (a handle that does not
    say is asked about anyway)."""
    return not handle.protocol or modern(handle.protocol) == modern(session.protocol_version)


def _gone(handle: TaskHandle) -> TaskPoll:
    name = f"{handle.server}{SEPARATOR}{handle.tool}"
    result = ToolResult(texts.MCP_TASK_GONE.format(server=handle.server, name=name), True)
    return TaskPoll(FAILED, "the server no longer knows the task", None, result)


def _unknown(exc: MCPError) -> bool:
    """Whether the server's error says it does not know the task (-32602, or words to that effect)."""
    said = (exc.error.message or "").lower()
    return exc.error.code == INVALID_PARAMS or ("task" in said and ("not found" in said or "unknown" in said))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else None


def _cut(text: str | None) -> str:
    return (text or "")[:MESSAGE_MAX]
