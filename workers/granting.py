"""Grants in a run: which standing grant of the thread covers a call, spending one of its uses,
deciding the park's other calls a grant given on one card covers, and its notice with Revoke.

The grants themselves (their keys, scope and uses, taken atomically) are `store.grants`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from harness.policy import no_grant
from harness.state import Decision, GrantUse, PendingCall, RunState, Verdict, record_decisions
from messages import cards
from store import BadId, Grant, RunRecord, grant_slot
from workers.services import Services


def spread_grants(
    svc: Services, record: RunRecord, calls: dict[str, PendingCall], decisions: dict[str, Decision | None]
) -> dict[str, Decision | None]:
    """A grant given on one card covers the park's other calls in its scope: decide them (each
    spending a use), say so once."""
    out = dict(decisions)
    for call_id, decision in decisions.items():
        if decision is None or decision.grant is not GrantUse.GIVEN or call_id not in calls:
            continue
        grant = announce_grant(svc, record, calls[call_id].name, decision.grant_dir or "")
        for other_id, other in decisions.items():
            sibling = calls.get(other_id)
            if grant is None or other is not None or sibling is None or sibling.name != grant.tool:
                continue
            used = use_grant(svc, record, sibling, [grant])
            if used is None:
                continue
            result = svc.store.parks.decide(
                record.run_id,
                record.park_id,
                other_id,
                used[1],
                audit=record.audit_fields(sibling),
                fingerprint=sibling.fingerprint,
            )
            out[other_id] = result.decision
    return out


def announce_grant(svc: Services, record: RunRecord, tool: str, directory: str) -> Grant | None:
    """The thread's standing grant of `tool` (under `directory`); the first to see it posts the
    notice with Revoke."""
    try:
        grant = svc.store.grants.grant(
            record.team, record.channel, record.thread_ts, tool, grant_slot(directory)
        )
    except BadId:
        return None
    if grant is None or grant.requester != record.requester:
        return None
    key = f"grant-{tool}-{grant.slot}"[:128]
    if svc.store.parks.first_card_update(record.run_id, record.park_id, key):
        note = cards.grant_notice(
            tool=tool,
            by=grant.by,
            requester=grant.requester,
            until=datetime.fromtimestamp(grant.until, UTC),
            value=f"{record.run_id}:{tool}" + (f":{grant.slot}" if grant.slot else ""),
            directory=grant.directory,
            uses=grant.uses,
        )
        svc.post(record.channel, record.thread_ts, note.text, note.blocks, tag=(record.run_id, key))
    return grant


def apply_grants(
    svc: Services, record: RunRecord, state: RunState, calls: tuple[PendingCall, ...]
) -> tuple[RunState, tuple[PendingCall, ...]]:
    """Calls that a standing grant of this thread covers are approved by it; the rest still wait.

    A grant covers `ask` calls of its tool (under its directory, if scoped) in runs of its requester
    only, while it has uses left; `deny` never reaches here.
    """
    granted: dict[str, Decision] = {}
    for call in calls:
        used = use_grant(svc, record, call, grants_for(svc, record, call))
        if used is None:
            continue
        grant, granted[call.id] = used
        svc.store.audit.append(
            {
                "run_id": record.run_id,
                "call_id": call.id,
                **record.audit_fields(call),
                **granted[call.id].to_json(),
                "grant_until": grant.until,
            }
        )
    if not granted:
        return state, calls
    state = record_decisions(state, granted)
    return state, tuple(c for c in calls if c.id not in granted)


def grants_for(svc: Services, record: RunRecord, call: PendingCall) -> list[Grant]:
    """The thread's standing grants of the call's tool whose scope holds it, given for this requester."""
    try:
        found = svc.store.grants.covering(
            record.team, record.channel, record.thread_ts, call.name, call.input, call.path_args
        )
    except BadId:
        return []
    return [g for g in found if g.requester == record.requester]


def use_grant(
    svc: Services, record: RunRecord, call: PendingCall, grants: list[Grant]
) -> tuple[Grant, Decision] | None:
    """The first of `grants` that covers `call` and still has a use to spend on it, and the decision
    that says so; None when none does (the call asks). No grant covers a call that always asks,
    whenever the grant was given (`always_asks`: its tier was just decided), nor one past a counting
    rule's limit (a grant would lift the limit), nor one whose tool has an `approvers_from` callable
    now: only a click can ask it."""
    if no_grant(call.why) or svc.settings_of(record).approvals.approvers_from_for(call.name):
        return None
    for grant in grants:
        if grant.tool != call.name or not grant.covers(call.input, call.path_args):
            continue
        spent = svc.store.grants.take(grant, f"{record.run_id}:{call.id}")
        if spent is None:
            continue
        decision = Decision(
            Verdict.APPROVED,
            by=spent.by,
            grant=GrantUse.USED,
            grant_dir=spent.directory or None,
            grant_uses=spent.uses,
            grant_left=spent.left,
        )
        return spent, decision
    return None
