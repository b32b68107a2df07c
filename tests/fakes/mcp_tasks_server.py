"""A real MCP server that answers calls with tasks (the `io.modelcontextprotocol/tasks` extension
of MCP 2026-07-28), written with the `mcp` package's server API.

    python tests/fakes/mcp_tasks_server.py stdio
    python tests/fakes/mcp_tasks_server.py http PORT

Its task tools answer `tools/call` with `resultType: "task"` (only to a client whose request
declares the extension; to one that does not, they answer -32021) and serve `tasks/get` and
`tasks/cancel`. Nothing depends on time: a task moves on each `tasks/get` it is asked, by counting.

- `long_job(steps, poll_ms=0, note="")`: `working` ("step k of N", and `note` after it) for the
  first `steps - 1` polls, with `pollIntervalMs: poll_ms` when given, then `completed` with a text;
- `failing_job()`: `failed`, with a JSON-RPC error;
- `dropped_job()`: `cancelled` by the server, with a status message;
- `forgetful_job()`: its task is never kept: `tasks/get` answers -32602 (unknown task);
- `asking_job()`: `input_required`, with a form in `inputRequests`;
- `quick(text)`: a plain result, no task.

`tasks/cancel` marks the task cancelled. Every request it gets (`tools/call`, `tasks/get`,
`tasks/cancel`) is appended as one JSON line to the file named by `MCP_CALL_LOG`: the method, the
tool or task id, whether the request declared the extension, and over HTTP its `Mcp-Name` header.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolRequestParams, RequestParams

TASKS = "io.modelcontextprotocol/tasks"
TASK_TOOLS = {"long_job", "failing_job", "dropped_job", "forgetful_job", "asking_job"}
STAMP = "2026-07-28T10:00:00Z"

_ids = itertools.count(1)
_tasks: dict[str, dict[str, Any]] = {}  # task id -> {tool, args, polls, cancelled}


class TaskParams(RequestParams):
    task_id: str


def _log(entry: dict[str, Any]) -> None:
    path = os.environ.get("MCP_CALL_LOG")
    if path:
        with Path(path).open("a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")


def _declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    meta: dict[str, Any] = dict(ctx.meta or {})
    capabilities = meta.get("io.modelcontextprotocol/clientCapabilities") or {}
    return TASKS in (capabilities.get("extensions") or {})


def _header(ctx: ServerRequestContext[Any, Any]) -> str | None:
    request = ctx.request
    headers = getattr(request, "headers", None)
    return None if headers is None else headers.get("mcp-name")


def _task(task_id: str, status: str, message: str | None = None, **extra: Any) -> dict[str, Any]:
    found = {
        "taskId": task_id,
        "status": status,
        "createdAt": STAMP,
        "lastUpdatedAt": STAMP,
        "ttlMs": 600_000,
        **extra,
    }
    if message is not None:
        found["statusMessage"] = message
    return found


class Tasks(Extension):
    identifier = TASKS

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding(method="tasks/get", params_type=TaskParams, handler=self.get),
            MethodBinding(method="tasks/cancel", params_type=TaskParams, handler=self.cancel),
        ]

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        args = params.arguments or {}
        _log({"method": "tools/call", "tool": params.name, "args": args, "declared": _declared(ctx)})
        if params.name not in TASK_TOOLS:
            return await call_next(ctx)
        if not _declared(ctx):
            raise MCPError(code=-32021, message=f"{params.name} runs only as a task")
        task_id = f"{params.name}-{next(_ids)}"
        if params.name != "forgetful_job":
            _tasks[task_id] = {"tool": params.name, "args": args, "polls": 0, "cancelled": False}
        extra = {"pollIntervalMs": args["poll_ms"]} if args.get("poll_ms") else {}
        return {"resultType": "task", **_task(task_id, "working", "queued", **extra)}

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        _log(
            {"method": "tasks/get", "task": params.task_id, "declared": _declared(ctx), "name": _header(ctx)}
        )
        found = _tasks.get(params.task_id)
        if found is None:
            raise MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: Task not found")
        found["polls"] += 1
        task_id, tool, args = params.task_id, found["tool"], found["args"]
        if found["cancelled"]:
            return _task(task_id, "cancelled", "cancelled at the client's request")
        if tool == "long_job":
            steps, polls = int(args.get("steps", 1)), found["polls"]
            extra = {"pollIntervalMs": args["poll_ms"]} if args.get("poll_ms") else {}
            if polls < steps:
                return _task(task_id, "working", f"step {polls} of {steps}{args.get('note', '')}", **extra)
            result = {
                "content": [{"type": "text", "text": f"long job done in {steps} steps"}],
                "isError": False,
            }
            return _task(task_id, "completed", "done", result=result, **extra)
        if tool == "failing_job":
            error = {"code": -32603, "message": "the backend broke"}
            return _task(task_id, "failed", "Tool execution failed: the backend broke", error=error)
        if tool == "dropped_job":
            return _task(task_id, "cancelled", "the operator stopped it")
        form = {
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": "Which region?",
                "requestedSchema": {"type": "object", "properties": {"region": {"type": "string"}}},
            },
        }
        return _task(task_id, "input_required", "it needs a region", inputRequests={"region": form})

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        _log(
            {
                "method": "tasks/cancel",
                "task": params.task_id,
                "declared": _declared(ctx),
                "name": _header(ctx),
            }
        )
        found = _tasks.get(params.task_id)
        if found is None:
            raise MCPError(code=INVALID_PARAMS, message="Failed to cancel task: Task not found")
        found["cancelled"] = True
        return {}


server = MCPServer("jobs", extensions=[Tasks()])


@server.tool()
def long_job(steps: int, poll_ms: int = 0, note: str = "") -> str:
    """A long job: it runs as a task, `steps` polls long."""
    return "never called: the extension answers with a task"


@server.tool()
def failing_job() -> str:
    """A job whose task fails."""
    return "never called"


@server.tool()
def dropped_job() -> str:
    """A job the server cancels."""
    return "never called"


@server.tool()
def forgetful_job() -> str:
    """A job whose task the server forgets at once."""
    return "never called"


@server.tool()
def asking_job() -> str:
    """A job that asks for input while it runs."""
    return "never called"


@server.tool()
def quick(text: str) -> str:
    """Answers at once, no task."""
    return f"quick: {text}"


@server.custom_route("/pid", methods=["GET"])
async def pid(_request: Any) -> Any:
    """Which process holds the port (`tests.mcp_support.HttpDesk` asks)."""
    from starlette.responses import PlainTextResponse

    return PlainTextResponse(str(os.getpid()))


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        import uvicorn

        uvicorn.run(
            server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning"
        )
    elif sys.argv[1:] == ["stdio"]:
        server.run("stdio")
    else:
        raise SystemExit("usage: mcp_tasks_server.py stdio | http PORT")
