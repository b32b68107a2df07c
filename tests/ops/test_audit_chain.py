"""The decisions' audit as a hash chain: written by the store's own scripts (decisions, votes,
grants used) on a real Redis, checked and exported by real `python -m workers audit …` processes,
appended to HARNESS_AUDIT_DIR's daily files before Redis may trim, and never lost to a kill."""

from __future__ import annotations

import csv
import io
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from harness.state import Decision, Verdict
from ops import audit_files
from ops.audit_chain import link_hash
from store import Store
from store.keys import Keys
from tests.stack import ROOT, wait_until
from tests.store.test_store import parked

pytestmark = pytest.mark.e2e  # `python -m workers audit` as a process, in every test


def cli(redis_url: str, *args: str, audit_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m workers audit ARGS` as an operator runs it."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "REDIS_URL": redis_url}
    if audit_dir is not None:
        env["HARNESS_AUDIT_DIR"] = str(audit_dir)
    return subprocess.run(
        [sys.executable, "-m", "workers", "audit", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def decisions(store: Store) -> int:
    """Entries written by real decisions on a parked run (approved, declined, a quorum's vote, an
    expiry a late click met) and a call a grant let run; how many."""
    run = parked(store, ["toolu_1", "toolu_2", "toolu_3"], expires_in=60)
    audit = {"tool": "write_file", "input_sha256": "ab" * 32, "fingerprint": "0123456789abcdef"}
    store.parks.decide(run.run_id, run.park_id, "toolu_1", Decision(Verdict.APPROVED, by="UANN"), audit)
    store.parks.decide(
        run.run_id, run.park_id, "toolu_2", Decision(Verdict.APPROVED, by="UBEN"), audit, required=2
    )
    store.parks.decide(run.run_id, run.park_id, "toolu_2", Decision(Verdict.DECLINED, by="UCAT"), audit)
    late = time.time() + 61
    store.parks.decide(
        run.run_id, run.park_id, "toolu_3", Decision(Verdict.APPROVED, by="UDAN"), audit, now=late
    )
    store.audit.append({"run_id": run.run_id, "call_id": "toolu_4", "verdict": "approved", "grant": "used"})
    return 5


def rewrite(conn: redis.Redis, change: Any) -> None:
    """Rebuild the audit stream as someone with Redis access would to edit it (a stream entry
    cannot be changed in place): `change` gets the entries [(id, fields)] and returns new ones,
    re-added under ascending ids."""
    rows = [(i.decode(), f) for i, f in conn.xrange(Keys.audit())]
    changed = change(rows)
    conn.delete(Keys.audit())
    for (stream_id, _), (_, fields) in zip(rows, changed, strict=False):
        conn.xadd(Keys.audit(), fields, id=stream_id)


def test_verify_passes_on_a_chain_written_by_real_decisions(store: Store, redis_url: str) -> None:
    written = decisions(store)
    done = cli(redis_url, "verify")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == f"{written} entries, chain intact"
    links = list(store.audit.all_links())
    assert [link.seq for link in links] == list(range(1, written + 1))
    assert links[0].prev == "" and all(b.prev == a.hash for a, b in zip(links, links[1:], strict=False))
    assert store.audit.head() == (written, links[-1].hash)


def test_concurrent_appends_from_many_processes_extend_one_chain(store: Store, redis_url: str) -> None:
    clients = [Store(redis.Redis.from_url(redis_url)) for _ in range(8)]
    barrier = threading.Barrier(len(clients))

    def append(part: Store, n: int) -> None:
        barrier.wait()
        for i in range(25):
            part.audit.append({"verdict": "approved", "by": f"U{n}", "call_id": f"toolu_{n}_{i}"})

    threads = [threading.Thread(target=append, args=(c, n)) for n, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [link.seq for link in store.audit.all_links()] == list(range(1, 201))
    done = cli(redis_url, "verify")
    assert (done.returncode, done.stdout.strip()) == (0, "200 entries, chain intact")


def test_verify_names_an_edited_entry(store: Store, conn: redis.Redis, redis_url: str) -> None:
    decisions(store)

    def edit(rows: list[Any]) -> list[Any]:
        fields = dict(rows[2][1])
        fields[b"entry"] = fields[b"entry"].replace(b'"UCAT"', b'"UEVE"')
        return [*rows[:2], (rows[2][0], fields), *rows[3:]]

    rewrite(conn, edit)
    done = cli(redis_url, "verify")
    assert done.returncode == 1
    assert "entry #3 " in done.stdout and "was changed" in done.stdout, done.stdout


def test_verify_names_a_removed_entry(store: Store, conn: redis.Redis, redis_url: str) -> None:
    decisions(store)
    rewrite(conn, lambda rows: rows[:1] + rows[2:])
    done = cli(redis_url, "verify")
    assert done.returncode == 1
    assert "entry #2 was removed" in done.stdout, done.stdout


def test_verify_names_the_newest_entry_removed(store: Store, conn: redis.Redis, redis_url: str) -> None:
    written = decisions(store)
    rewrite(conn, lambda rows: rows[:-1])
    done = cli(redis_url, "verify")
    assert done.returncode == 1
    assert f"entry #{written} was removed" in done.stdout, done.stdout


def test_verify_names_a_reordered_entry(store: Store, conn: redis.Redis, redis_url: str) -> None:
    decisions(store)
    rewrite(conn, lambda rows: [rows[0], rows[2], rows[1], *rows[3:]])
    done = cli(redis_url, "verify")
    assert done.returncode == 1
    assert "entry #2 " in done.stdout and "reordered" in done.stdout, done.stdout


def recompute(conn: redis.Redis, rows: list[Any], who: bytes) -> list[Any]:
    """The chain rebuilt by someone who knows the formula, with one entry's decider changed."""
    out, prev = [], ""
    for stream_id, fields in rows:
        entry = fields[b"entry"].replace(b'"UCAT"', who)
        seq = int(fields[b"seq"])
        digest = link_hash(prev, seq, entry)
        out.append((stream_id, {b"entry": entry, b"seq": str(seq), b"prev": prev, b"hash": digest}))
        prev = digest
    conn.set(Keys.audit_head(), f"{len(out)} {prev}")
    return out


def test_the_files_catch_a_chain_recomputed_in_redis(
    store: Store, conn: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    decisions(store)
    assert audit_files.mirror(store, tmp_path, "t") == 5
    rewrite(conn, lambda rows: recompute(conn, rows, b'"UEVE"'))
    alone = cli(redis_url, "verify")  # Redis alone cannot tell: the chain is whole again
    assert (alone.returncode, alone.stdout.strip()) == (0, "5 entries, chain intact")
    anchored = cli(redis_url, "verify", audit_dir=tmp_path)
    assert anchored.returncode == 1
    assert "entry #3 " in anchored.stdout and "changed in Redis" in anchored.stdout, anchored.stdout


def test_export_writes_every_entry_since_a_date_as_jsonl_and_csv(store: Store, redis_url: str) -> None:
    day = 24 * 3600
    start = time.time() - 3 * day
    for n in range(3):
        store.audit.append(
            {
                "verdict": "approved",
                "by": f"U{n}",
                "tool": "write_file",
                "fingerprint": "0123456789abcdef",
                "input_sha256": "cd" * 32,
                "input_preview": "=HYPERLINK(1)" if n == 2 else "{}",
            },
            now=start + n * day,
        )
    since = time.strftime("%Y-%m-%d", time.gmtime(start + day))
    jsonl = cli(redis_url, "export", "--since", since)
    assert jsonl.returncode == 0, jsonl.stderr
    rows = [json.loads(line) for line in jsonl.stdout.splitlines()]
    assert [r["by"] for r in rows] == ["U1", "U2"]
    assert rows[0]["fingerprint"] == "0123456789abcdef" and rows[0]["input_sha256"] == "cd" * 32
    assert rows[0]["seq"] == 2 and rows[0]["time"].startswith(since) and len(rows[0]["hash"]) == 40
    table = cli(redis_url, "export", "--since", since, "--format", "csv")
    assert table.returncode == 0, table.stderr
    read = list(csv.DictReader(io.StringIO(table.stdout)))
    shown = [(r["by"], r["verdict"], r["seq"]) for r in read]
    assert shown == [("U1", "approved", "2"), ("U2", "approved", "3")]
    assert read[1]["input_preview"] == "'=HYPERLINK(1)"  # never a formula to a spreadsheet
    assert json.loads(read[0]["entry"])["fingerprint"] == "0123456789abcdef"
    everything = cli(redis_url, "export")
    assert len(everything.stdout.splitlines()) == 3
    assert cli(redis_url, "export", "--since", "last tuesday").returncode == 2


def lines_of(directory: Path) -> list[dict[str, Any]]:
    """Every line of the daily files, parsed."""
    paths = audit_files.files(directory)
    return [json.loads(line) for path in paths for line in path.read_text().splitlines()]


def test_with_audit_dir_nothing_is_trimmed_before_its_daily_file_holds_it(
    store: Store, conn: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    for n in range(30):
        store.audit.append({"verdict": "approved", "by": f"U{n}"})
    assert store.audit.trim(mirrored=True, most=10) == 0  # the files hold nothing yet
    assert conn.xlen(Keys.audit()) == 30
    assert audit_files.mirror(store, tmp_path, "t") == 30
    [daily] = audit_files.files(tmp_path)
    assert daily.name == time.strftime("audit-%Y-%m-%d.jsonl", time.gmtime())
    assert [line["seq"] for line in lines_of(tmp_path)] == list(range(1, 31))
    for n in range(30, 50):
        store.audit.append({"verdict": "approved", "by": f"U{n}"})
    store.audit.trim(mirrored=True, most=5)  # the 20 newest are not in the files: they stay
    assert [link.seq for link in store.audit.all_links()] == list(range(31, 51))
    assert store.audit.trim(mirrored=False, most=5) == 0  # a worker without the files obeys the cursor too
    audit_files.mirror(store, tmp_path, "t")
    store.audit.trim(mirrored=True, most=5)
    assert [link.seq for link in store.audit.all_links()] == list(range(46, 51))
    assert [line["seq"] for line in lines_of(tmp_path)] == list(range(1, 51))
    anchored = cli(redis_url, "verify", audit_dir=tmp_path)
    assert (anchored.returncode, anchored.stdout.strip()) == (0, "50 entries, chain intact")
    alone = cli(redis_url, "verify")
    assert alone.returncode == 0
    assert alone.stdout.strip() == "5 entries, chain intact (from entry #46: the older ones were trimmed)"
    exported = cli(redis_url, "export", audit_dir=tmp_path)
    assert [json.loads(line)["by"] for line in exported.stdout.splitlines()] == [f"U{n}" for n in range(50)]


def test_without_audit_dir_redis_trims_by_count(store: Store, redis_url: str) -> None:
    for n in range(12):
        store.audit.append({"verdict": "declined", "by": f"U{n}"})
    assert store.audit.trim(mirrored=False, most=4) == 8
    assert [link.seq for link in store.audit.all_links()] == [9, 10, 11, 12]
    assert cli(redis_url, "verify").returncode == 0


_MIRROR_THEN_HANG = """
import signal, sys, redis
from pathlib import Path
from ops import audit_files
from store import Store

def step(name):
    if name == sys.argv[3]:
        print(name, flush=True)
        signal.pause()  # held at this step until the test, having read its name, SIGKILLs it

store = Store(redis.Redis.from_url(sys.argv[1]))
audit_files.mirror(store, Path(sys.argv[2]), "doomed", step=step, lease=1.0)
"""


@pytest.mark.parametrize("step", ["written", "synced", "cut"])
def test_a_mirror_killed_at_any_step_loses_no_entry_and_writes_none_twice(
    step: str, store: Store, redis_url: str, tmp_path: Path
) -> None:
    for n in range(7):
        store.audit.append({"verdict": "approved", "by": f"U{n}"})
    hang_at = "written" if step == "cut" else step
    proc = subprocess.Popen(
        [sys.executable, "-c", _MIRROR_THEN_HANG, redis_url, str(tmp_path), hang_at],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == hang_at
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    [daily] = audit_files.files(tmp_path)
    if step == "cut":  # killed inside the write: half a line
        daily.write_bytes(daily.read_bytes()[:-25])
    assert store.audit.mirrored() is None  # the cursor never moved: Redis keeps every entry
    assert store.audit.trim(mirrored=True, most=1) == 0
    store.audit.append({"verdict": "approved", "by": "U7"})
    wait_until(lambda: audit_files.mirror(store, tmp_path, "heir") > 0)  # once the dead one's lease ends
    assert [line["seq"] for line in lines_of(tmp_path)] == list(range(1, 9))
    assert store.audit.mirrored() == list(store.audit.all_links())[-1].id
    done = cli(redis_url, "verify", audit_dir=tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, "8 entries, chain intact")
