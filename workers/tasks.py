"""A run parked while a tool's server works on a call as a task (`harness.tools.tasks`).

The loop stops a turn at a call its server answered with a task (`AwaitingTask`); here the run
parks on it as on an approval, with one decision slot that the task's end fills: the poller
(`workers.task_polls`, in the watchdog of a worker whose hub reaches the task) records it once the
task ended, with its result kept beside the park, and the park's expiry, set to the server's
`timeout_seconds` after the call, answers it as timed out. No worker waits meanwhile. The result
then answers the call on whichever worker resumes the run; a Stop has the poller cancel the task.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from harness import texts
from harness.state import PendingCall, RunState, Verdict, record_task_result
from harness.tools import ToolResult
from harness.tools.tasks import stopped, timed_out
from messages import server_tasks
from messages.blocks import Message
from runtime.queue import RUN_JOB_TIMEOUT
from store import ParkView, RunStatus, TaskEntry
from workers import outbox, thread_status
from workers.driver import Driver
from workers.phases import Parked
from workers.services import Services

log = logging.getLogger(__name__)

# The fingerprint a task's decision binds to: the poller's, never a click's (a click on its park's
# call names the call's own fingerprint, and is refused as stale).
TASK_ENDED = "task-ended"


def park(svc: Services, driver: Driver, state: RunState, call: PendingCall) -> Parked:
    """Park on `call`'s task: its note, its first poll scheduled before the park, and the park,
    which expires when the task's time is up."""
    handle = call.tasking
    assert handle is not None  # the loop parks only on a call with a task
    record = driver.record
    park_id = record.park_id + 1
    ttl = max(60, int(handle.deadline - handle.since)) + 3600  # the park outlives its expiry an hour
    entry = TaskEntry(call.id, call.name, handle)
    svc.store.tasks.schedule(record.run_id, park_id, entry, handle.since + handle.next_poll_in(), ttl)
    driver.amend(expires_at=handle.deadline, extensions=0, call_tools={})
    driver.seal_for_park((call,))
    driver.owe(server_tasks.task_note(tool=call.name, handle=handle), role=outbox.CARD, call=call.id)
    driver.park(state, (call,), ttl, handle.deadline, fingerprints={call.id: TASK_ENDED})
    svc.store.parks.unindex(driver.record)  # it waits on no person: not in the Home tab's counts
    driver.deliver()
    driver.hand_parked_live()
    driver.show(thread_status.Phase.WAITING)
    log.info("run %s: parked on a task of MCP server %s", record.run_id, handle.server)
    return Parked()


def resume(svc: Services, driver: Driver, state: RunState, view: ParkView) -> RunState | None:
    """The task ended (or its time is up): its result answers the call, the note says how it
    ended, and the run is saved running, to go on. None: the decisions are not the task's."""
    record, decisions = driver.record, view.decisions
    waiting = state.waiting_on_task
    if len(waiting) != 1 or set(decisions) != {waiting[0].id}:
        return None
    call = waiting[0]
    handle, decision = call.tasking, decisions[call.id]
    assert handle is not None and decision is not None  # `_parked` resumes when all are in
    entry = svc.store.tasks.entry(record.run_id, record.park_id)
    result, outcome = _answer(call, entry, decision.verdict)
    if call.id in record.cards:
        settled = server_tasks.task_settled(
            tool=call.name, handle=handle, outcome=outcome, by=None, at=datetime.now(UTC)
        )
        driver.owe_update(record.cards[call.id], settled)
    state = record_task_result(state, call.id, result)
    driver.beside_next_save(svc.store.threads.resumed(driver.record, RUN_JOB_TIMEOUT))
    driver.save(status=RunStatus.RUNNING, state=state.to_json(), expires_at=None, call_tools={})
    svc.store.tasks.unpark(record.run_id, record.park_id)
    if outcome != "timeout":  # a task past its time keeps its entry: its poller cancels it
        svc.store.tasks.forget(record.run_id, record.park_id)
    log.info("run %s: the task of %s is over (%s)", record.run_id, handle.server, outcome)
    return state


def _answer(call: PendingCall, entry: TaskEntry | None, verdict: Verdict) -> tuple[ToolResult, str]:
    """The result that answers `call`, and how its task ended for the note. A result the poller
    kept answers, even when the park's time ran out as it was recorded."""
    handle = call.tasking
    assert handle is not None
    if entry is not None and entry.result is not None and entry.call_id == call.id:
        return entry.result, "error" if entry.result.is_error else "finished"
    if verdict is Verdict.EXPIRED:
        return timed_out(handle, call.name), "timeout"
    lost = texts.MCP_TASK_RESULT_LOST.format(server=handle.server, name=call.name)
    return ToolResult(lost, True), "error"


def stop(svc: Services, driver: Driver, state: RunState) -> RunState:
    """The run stops while a task works: its poller is woken to cancel it, and the call is
    answered as stopped (it did start)."""
    for call in state.waiting_on_task:
        assert call.tasking is not None
        svc.store.tasks.poke(driver.run_id, driver.record.park_id, call.tasking.holder)
        svc.store.tasks.unpark(driver.run_id, driver.record.park_id)
        state = record_task_result(state, call.id, stopped(call.tasking, call.name))
    return state


def stopped_note(call: PendingCall, by: str, at: datetime) -> Message:
    """The note of `call`'s task once the run was stopped by `by`."""
    assert call.tasking is not None
    return server_tasks.task_settled(tool=call.name, handle=call.tasking, outcome="stopped", by=by, at=at)
