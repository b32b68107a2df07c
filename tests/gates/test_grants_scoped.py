"""Grants that fit, below the Slack surface: which directory a call offers, which calls lie inside
it, `grant_uses` parsed strictly, and uses spent atomically on a real Redis (racing callers)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harness.config import ConfigError, load_config
from harness.policy import PathArgs, call_paths, grant_directory, inside_directory
from store import Grant, Store, grant_slot
from store.keys import Keys

WRITE = PathArgs(("path",), ("content",))  # the built-in write_file's
COPY = PathArgs(("src_path", "dst_path"))


@pytest.mark.parametrize(
    ("call_input", "path_args", "directory"),
    [
        ({"path": "docs/a.txt", "content": "x"}, WRITE, "docs/"),
        ({"path": "docs/a.txt", "content": "see a/b and /etc/x"}, WRITE, "docs/"),  # text, not a path
        ({"path": "./docs//sub/a.txt"}, WRITE, "docs/sub/"),
        ({"path": "docs\\a.txt"}, WRITE, "docs/"),
        ({"path": "a.txt"}, WRITE, None),  # the workspace's root: no narrower than the thread
        ({"path": "/etc/passwd"}, WRITE, None),
        ({"path": "../outside/x"}, WRITE, None),
        ({"path": "docs/../../x/y"}, WRITE, None),
        ({"content": "no path"}, WRITE, None),
        ({"path": 3}, WRITE, None),
        ({"src_path": "docs/a", "dst_path": "other/b"}, COPY, None),  # one grant would not cover both
        ({"src_path": "docs/a", "dst_path": "docs/b"}, COPY, "docs/"),
        ({"src_path": "docs/x/a", "dst_path": "docs/y/b"}, COPY, "docs/"),  # the deepest holding both
        ({"file_path": "src/app/main.py"}, WRITE, None),  # a name alone makes nothing a path ...
        ({"path": "docs/a", "file_path": "src/app/main.py"}, WRITE, None),  # ... nor holds it inside
        ({"path": "docs/a.txt"}, None, None),  # the tool's path arguments not known
        ("not a dict", WRITE, None),
    ],
)
def test_the_directory_a_card_offers(
    call_input: Any, path_args: PathArgs | None, directory: str | None
) -> None:
    assert grant_directory(call_input, path_args) == directory


@pytest.mark.parametrize(
    ("call_input", "inside"),
    [
        ({"path": "docs/b.txt"}, True),
        ({"path": "docs/deep/er/b.txt"}, True),
        ({"path": "./docs/b.txt"}, True),
        ({"path": "docs/../secret"}, False),  # normalises to `secret`
        ({"path": "docs/sub/../../secret"}, False),
        ({"path": "/docs/b.txt"}, False),  # absolute paths never match
        ({"path": "../docs/b.txt"}, False),
        ({"path": "docsx/b.txt"}, False),
        ({"path": "docs"}, False),
        ({"path": "docs/b.txt", "target_file": "etc/x"}, False),  # a path no argument holds
        ({"content": "docs/b.txt"}, False),  # no path at all: nothing to hold inside
    ],
)
def test_which_calls_lie_inside_a_directory(call_input: Any, inside: bool) -> None:
    assert inside_directory(call_input, "docs/", WRITE) is inside


def test_names_alone_make_nothing_a_path() -> None:
    call = {"path": "docs/a", "dir": "docs/b", "out_file": "docs/c"}
    assert call_paths(call, PathArgs()) == ([], True)  # paths, in arguments not known to hold them
    assert call_paths(call, PathArgs(("path", "dir", "out_file"))) == (["docs/a", "docs/b", "docs/c"], False)


def test_grant_uses_is_parsed_strictly(tmp_path: Path) -> None:
    path = tmp_path / "h.toml"
    path.write_text("[approvals]\ngrant_minutes = 30\ngrant_uses = 5\n", encoding="utf-8")
    assert load_config(path, env={}).approvals.grant_uses == 5
    for bad in ("-1", "1.5", "true", "'5'"):
        path.write_text(f"[approvals]\ngrant_uses = {bad}\n", encoding="utf-8")
        with pytest.raises(ConfigError) as info:
            load_config(path, env={})
        assert "approvals.grant_uses" in str(info.value) and "\n" not in str(info.value)


def _grant(store: Store, directory: str, uses: int) -> Grant:
    key = Keys.grant("T1", "C1", "1.2", "write_file", grant_slot(directory))
    grant = Grant(key, "write_file", "UANN", "UALICE", time.time() + 60, "r", directory=directory, uses=uses)
    store.redis.set(key, json.dumps(grant.to_json()), ex=60)
    return grant


def test_a_scoped_grant_is_found_only_for_calls_inside_it(store: Store) -> None:
    _grant(store, "docs/", 0)
    found = store.grants.covering("T1", "C1", "1.2", "write_file", {"path": "docs/sub/a.txt"}, WRITE)
    assert [g.directory for g in found] == ["docs/"]
    for outside in ("docs/../secret", "/docs/a", "other/a.txt", "a.txt"):
        assert store.grants.covering("T1", "C1", "1.2", "write_file", {"path": outside}, WRITE) == []
    assert store.grants.covering("T1", "C1", "1.2", "delete_file", {"path": "docs/a.txt"}, WRITE) == []


def test_uses_are_spent_once_per_call_and_then_run_out(store: Store) -> None:
    grant = _grant(store, "docs/", 2)
    first = store.grants.take(grant, "r:c1")
    assert first is not None and first.left == 1
    again = store.grants.take(grant, "r:c1")  # the same call again (a lost reply): nothing more spent
    assert again is not None and again.left == 1
    second = store.grants.take(grant, "r:c2")
    assert second is not None and second.left == 0
    assert store.grants.take(grant, "r:c3") is None
    assert store.grants.covering("T1", "C1", "1.2", "write_file", {"path": "docs/a.txt"}, WRITE) == []
    assert 0 < store.redis.ttl(grant.key) <= 60  # spending keeps the grant's expiry


def test_two_runs_racing_on_the_last_use_exactly_one_spends_it(redis_url: str) -> None:
    import redis

    for attempt in range(30):
        setup = Store(redis.Redis.from_url(redis_url))
        grant = _grant(setup, f"race{attempt}/", 1)
        barrier = threading.Barrier(2)
        won: list[str] = []

        def run(
            name: str, grant: Grant = grant, barrier: threading.Barrier = barrier, won: list[str] = won
        ) -> None:
            store = Store(redis.Redis.from_url(redis_url))  # a connection each, as two workers have
            barrier.wait()
            if store.grants.take(grant, f"{name}:call") is not None:
                won.append(name)

        racers = [threading.Thread(target=run, args=(f"run{i}",)) for i in range(2)]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join()
        assert len(won) == 1, (attempt, won)


def test_the_audit_line_of_a_call_a_scoped_grant_let_run_names_its_directory_and_uses_left() -> None:
    from ops.audit import audit_line

    entry = {
        "at": time.time(),
        "verdict": "approved",
        "by": "UANN",
        "tool": "write_file",
        "grant": "used",
        "grant_dir": "docs/",
        "grant_uses": 5,
        "grant_left": 2,
    }
    line = audit_line(entry)
    assert "grant=used" in line and "docs/" in line and "grant_left=2/5" in line
