"""Every stored format a run relies on, at every version this release reads: samples written by the
previous release's own code (commit 99a4bc2, in `formats/`) load; a newer version raises
`NewerRecord`, naming what it found and what this release reads; a malformed or older one is still
refused as before (`StateError`, never `NewerRecord`).

A release that adds a version to a readers' table must add a sample of it here: the first test
fails until every version in every table has one.
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path
from typing import Any

import pytest
import redis

from harness.state import STATE_VERSIONS, Decision, NewerRecord, RunState, StateError, Status, Verdict
from store import RunRecord, RunStatus, Store, new_run_id, pack, unpack
from store.decisions import APPROVALS_VERSIONS, DECISION_VERSIONS, decision_of, stored_decision
from store.grants import GRANT_VERSIONS, Grant
from store.keys import Keys
from store.records import PACKINGS, RECORD_VERSIONS
from store.threads import HISTORY_VERSIONS, history_of

SAMPLES = Path(__file__).parent / "formats"

# Each stored format: the versions this release reads, and the sample file of a version.
TABLES = {
    "run-record": RECORD_VERSIONS,
    "run-state": STATE_VERSIONS,
    "thread-history": HISTORY_VERSIONS,
    "decision": DECISION_VERSIONS,
    "grant": GRANT_VERSIONS,
    "park-approvals": APPROVALS_VERSIONS,
}
PACKED = {1: "z1", 2: "z2"}  # a run record's packings besides plain JSON (0), by version


def sample(name: str, version: int, suffix: str = "json") -> bytes:
    return (SAMPLES / f"{name}-v{version}.{suffix}").read_bytes()


def test_every_version_this_release_reads_has_a_sample() -> None:
    missing = [
        f"{name}-v{version}.json"
        for name, versions in TABLES.items()
        for version in versions
        if not (SAMPLES / f"{name}-v{version}.json").exists()
    ]
    missing += [
        f"run-record-v{v}.{PACKED[p]}" for v in RECORD_VERSIONS for p in PACKINGS - {0} if p not in PACKED
    ]
    assert missing == []


@pytest.mark.parametrize("version", sorted(RECORD_VERSIONS))
@pytest.mark.parametrize("packing", sorted(PACKINGS))
def test_a_run_record_of_every_version_and_packing_loads(version: int, packing: int) -> None:
    plain = RunRecord.from_json(sample("run-record", version))
    stored = sample("run-record", version, PACKED[packing]) if packing else sample("run-record", version)
    if packing:
        assert stored.startswith(f"z{packing}:".encode())
    record = RunRecord.from_json(unpack(stored))
    if packing == 1:  # the z1 sample is the same record with a long task (z1 packs only big ones)
        record.task = plain.task
    assert record == plain
    assert record.status is RunStatus.AWAITING_APPROVAL and record.profile == "ops"
    state = record.run_state()
    assert [c.id for c in state.awaiting] == ["toolu_01B"]
    assert record.outbox[0]["call"] == "toolu_01C" and record.call_tool("toolu_01B").own_tier == "ask"


@pytest.mark.parametrize("version", sorted(STATE_VERSIONS))
def test_a_run_state_of_every_version_loads(version: int) -> None:
    state = RunState.loads(sample("run-state", version))
    assert state.status is Status.AWAITING_APPROVAL and state.turns == 1
    decided = state.pending[2].decision
    assert decided is not None and decided.approvers == ("UANN", "UBEN")
    if version >= 2:  # a call whose server asked a person: its second question still open
        asking = state.pending[3].asking
        assert asking is not None and asking.server == "rooms" and asking.rounds == 2
        question = asking.next_question
        assert question is not None and question.mode == "url" and question.domain == "auth.example.com"
        assert state.waiting_for_input == (state.pending[3],)
        assert RunState.loads(state.dumps()) == state


@pytest.mark.parametrize("version", sorted(HISTORY_VERSIONS))
def test_a_thread_history_of_every_version_loads(version: int, store: Store, conn: redis.Redis) -> None:
    messages = history_of(sample("thread-history", version).decode())
    assert messages[-1] == {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}
    conn.hset(Keys.history("T1", "C1", "1.2"), mapping={"data": sample("thread-history", version), "seq": 3})
    assert store.threads.load_history("T1", "C1", "1.2") == (messages, 3)


@pytest.mark.parametrize("version", sorted(DECISION_VERSIONS))
def test_a_decision_of_every_version_loads(version: int) -> None:
    raw = sample("decision", version)
    assert "version" not in json.loads(raw)  # the previous release wrote none: it reads as 1
    decision = decision_of(raw)
    assert decision.verdict is Verdict.APPROVED and decision.grant_dir == "notes/"
    assert decision_of(stored_decision(decision)) == decision  # this release writes its version


@pytest.mark.parametrize("version", sorted(APPROVALS_VERSIONS))
def test_a_park_of_every_version_loads(version: int, store: Store, conn: redis.Redis) -> None:
    run_id = new_run_id()
    conn.hset(Keys.approvals(run_id, 1), mapping=json.loads(sample("park-approvals", version)))
    decisions = store.parks.decisions(run_id, 1)
    assert decisions["toolu_01B"] is None
    decided = decisions["toolu_01C"]
    assert decided is not None and decided.by == "UANN"
    assert store.parks.votes(run_id, 1) == {"toolu_01C": ("UANN", "UBEN")}


@pytest.mark.parametrize("version", sorted(GRANT_VERSIONS))
def test_a_grant_of_every_version_loads(version: int, store: Store, conn: redis.Redis) -> None:
    stored = json.loads(sample("grant", version))
    assert "version" not in stored  # the previous release wrote none: it reads as 1
    stored["until"] = 4102444800.0  # 2100: still in force
    key = Keys.grant("T1", "C1", "1700000000.000100", "write_file", "0" * 24)
    conn.set(key, json.dumps(stored))
    grant = store.grants.grant("T1", "C1", "1700000000.000100", "write_file", "0" * 24)
    assert grant is not None and grant.directory == "notes/" and grant.left == 2
    assert Grant.from_json(grant.to_json()) == grant and grant.to_json()["version"] == 1


# --- newer: left alone, never called malformed ---------------------------------------------------


def newer_json(name: str, bump: int = 1) -> dict[str, Any]:
    """The sample of the newest version of `name`, claiming the version after it."""
    data = json.loads(sample(name, max(TABLES[name])))
    data["version"] = max(TABLES[name]) + bump
    return data


def expect_newer(what: str, found: int, known: frozenset[int]) -> Any:
    listed = ", ".join(str(v) for v in sorted(known))
    newer = rf"has format version {found}, newer than this release reads \(versions? {listed}\)"
    pattern = rf"stored {re.escape(what)} {newer}"
    return pytest.raises(NewerRecord, match=pattern)


def test_a_newer_run_record_is_newer_not_malformed() -> None:
    found = max(RECORD_VERSIONS) + 1
    with expect_newer("run record", found, RECORD_VERSIONS) as caught:
        RunRecord.from_json(json.dumps(newer_json("run-record")))
    assert (caught.value.what, caught.value.found, caught.value.known) == ("run record", found, (2,))
    assert "a newer release wrote it" in str(caught.value)


def test_a_record_holding_a_newer_state_is_newer() -> None:
    record = json.loads(sample("run-record", max(RECORD_VERSIONS)))
    record["state"]["version"] = max(STATE_VERSIONS) + 1
    record["state"]["shape"] = "whatever the newer release keeps"
    with expect_newer("run state", max(STATE_VERSIONS) + 1, STATE_VERSIONS):
        RunRecord.from_json(json.dumps(record))
    with expect_newer("run state", max(STATE_VERSIONS) + 1, STATE_VERSIONS):
        RunState.from_json(record["state"])


def test_a_newer_packing_is_newer() -> None:
    with expect_newer("record's packing", 3, PACKINGS):
        unpack(b"z3:" + zlib.compress(b"{}"))


def test_a_newer_thread_history_is_newer(store: Store, conn: redis.Redis) -> None:
    data = pack(json.dumps(newer_json("thread-history")))
    conn.hset(Keys.history("T1", "C1", "1.2"), mapping={"data": data, "seq": 1})
    with expect_newer("thread history", max(HISTORY_VERSIONS) + 1, HISTORY_VERSIONS):
        store.threads.load_history("T1", "C1", "1.2")


def test_a_newer_decision_or_park_is_newer(store: Store, conn: redis.Redis) -> None:
    with expect_newer("decision", max(DECISION_VERSIONS) + 1, DECISION_VERSIONS):
        decision_of(json.dumps(newer_json("decision")))
    run_id = new_run_id()
    park = json.loads(sample("park-approvals", max(APPROVALS_VERSIONS)))
    conn.hset(Keys.approvals(run_id, 1), mapping={**park, "~version": max(APPROVALS_VERSIONS) + 1})
    with expect_newer("park's approvals", max(APPROVALS_VERSIONS) + 1, APPROVALS_VERSIONS):
        store.parks.decisions(run_id, 1)


def test_a_newer_grant_reads_as_no_grant(store: Store, conn: redis.Redis) -> None:
    stored = {**newer_json("grant"), "until": 4102444800.0}
    conn.set(Keys.grant("T1", "C1", "1700000000.000100", "write_file", "0" * 24), json.dumps(stored))
    with expect_newer("grant", max(GRANT_VERSIONS) + 1, GRANT_VERSIONS):
        Grant.from_json(stored)
    assert store.grants.grant("T1", "C1", "1700000000.000100", "write_file", "0" * 24) is None


# --- malformed or older: refused as before ------------------------------------------------------


@pytest.mark.parametrize(
    "stored",
    [
        b"not json",
        b"[]",
        b'{"version": 1}',  # older than this release reads
        b'{"version": "3"}',  # not a number
        b'{"version": true}',
        b'{"run_id": "x"}',  # no version at all
        b'{"version": 2, "run_id": "x"}',  # the right version, missing fields
        b"z1:not zlib",
    ],
)
def test_a_malformed_or_older_run_record_is_still_refused(stored: bytes) -> None:
    with pytest.raises(StateError, match="refusing") as caught:
        RunRecord.from_json(unpack(stored))
    assert not isinstance(caught.value, NewerRecord)


def test_a_malformed_state_or_history_or_decision_is_still_refused() -> None:
    for read, stored in (
        (RunState.loads, '{"version": 0, "messages": []}'),
        (RunState.loads, '{"version": 1, "messages": []}'),
        (history_of, '{"version": 0, "messages": []}'),
        (history_of, '{"messages": []}'),
        (decision_of, '{"verdict": "maybe"}'),
        (decision_of, '{"version": 0, "verdict": "approved"}'),
    ):
        with pytest.raises(StateError, match="refusing") as caught:
            read(stored)
        assert not isinstance(caught.value, NewerRecord), stored


def test_a_park_whose_version_is_not_a_number_is_refused_not_newer(store: Store, conn: redis.Redis) -> None:
    run_id = new_run_id()
    conn.hset(Keys.approvals(run_id, 1), mapping={"toolu_1": "", "~version": "x"})
    with pytest.raises(StateError) as caught:
        store.parks.decisions(run_id, 1)
    assert not isinstance(caught.value, NewerRecord)


def test_a_newer_park_records_no_decision(store: Store, conn: redis.Redis) -> None:
    """The decide script itself refuses a park a newer release wrote: nothing changes in it."""
    run_id = new_run_id()
    key = Keys.approvals(run_id, 1)
    conn.hset(key, mapping={"toolu_1": "", "~version": max(APPROVALS_VERSIONS) + 1})
    before = conn.hgetall(key)
    with expect_newer("park's approvals", max(APPROVALS_VERSIONS) + 1, APPROVALS_VERSIONS):
        store.parks.decide(run_id, 1, "toolu_1", Decision(Verdict.APPROVED, by="UANN"))
    assert conn.hgetall(key) == before and conn.xlen(Keys.audit()) == 0
