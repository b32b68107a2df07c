"""Redis Sentinel settings, and the writes behind a promise waiting for a replica (`WAIT`).

Real nodes throughout: a master, its replica and three sentinels (`tests.sentinel_support`), and a
plain redis-server for a master with no replica. The failover itself, under load and through the
bot and a worker, is tests/e2e/test_failover.py.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from harness.state import Decision, Verdict
from observe import metrics
from runtime.connection import RedisSettingsError, RedisTarget
from store import Store, new_run_id
from store.keys import Keys
from tests.sentinel_support import MASTER_NAME, PASSWORD, SentinelGroup
from tests.stack import ROOT, RedisServer, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    group = SentinelGroup().start()
    try:
        yield group
    finally:
        group.stop()


def waits_sent(client: redis.Redis) -> int:
    """How many WAIT commands the server has answered (`INFO commandstats`)."""
    return int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


# --- settings ----------------------------------------------------------------------------------------


def test_sentinels_are_read_with_the_password_and_database_of_redis_url() -> None:
    target = RedisTarget.from_env(
        {"REDIS_SENTINELS": " 10.0.0.1:26379, [::1]:26380 ", "REDIS_URL": "redis://:pw@ignored:1/3"}
    )
    assert target.sentinels == (("10.0.0.1", 26379), ("::1", 26380)) and target.master == "mymaster"
    assert "pw" not in target.describe() and "REDIS_SENTINELS" in target.describe()
    plain = RedisTarget.from_env({"REDIS_URL": "redis://:secret@db:6379/2"})
    assert not plain.uses_sentinel and plain.describe() == "REDIS_URL"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"REDIS_SENTINELS": "host-without-port"}, "REDIS_SENTINELS"),
        ({"REDIS_SENTINELS": "a:1,,b:2"}, "REDIS_SENTINELS"),
        ({"REDIS_SENTINELS": "a:99999"}, "REDIS_SENTINELS"),
        ({"REDIS_SENTINELS": "a:1", "REDIS_URL": "unix:///tmp/redis.sock"}, "unix://"),
        ({"REDIS_URL": "http://not-redis"}, "REDIS_URL"),
        ({"HARNESS_REPLICA_WAIT_MS": "soon"}, "HARNESS_REPLICA_WAIT_MS"),
        ({"HARNESS_REPLICA_WAIT_MS": "0"}, "HARNESS_REPLICA_WAIT_MS"),
    ],
)
def test_a_redis_setting_that_cannot_be_used_is_refused_naming_it(env: dict[str, str], named: str) -> None:
    with pytest.raises(RedisSettingsError, match=named):
        RedisTarget.from_env(env)


@pytest.mark.parametrize("module", ["bot", "workers"])
def test_the_processes_stop_at_start_with_one_line_on_bad_sentinels(module: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARNESS_", "REDIS_", "SLACK_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        SLACK_BOT_TOKEN="xoxb-x",
        SLACK_SIGNING_SECRET="s",
        SLACK_API_URL="http://127.0.0.1:9/api/",  # never reached: the Redis settings are read first
        HARNESS_CONFIG=str(tmp_path / "none.toml"),
        REDIS_SENTINELS="sentinel-one",
        REDIS_URL="redis://:hunter2@x:1/0",
    )
    (tmp_path / "none.toml").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", module], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "REDIS_SENTINELS" in lines[0] and "hunter2" not in done.stderr


# --- a client of the master, through the sentinels ---------------------------------------------------


def test_the_master_is_found_through_the_sentinels_with_redis_urls_password_and_database(
    group: SentinelGroup,
) -> None:
    client = RedisTarget.from_env(group.env(db=5)).connect()
    client.set("harness:test:where", "here")
    direct = redis.Redis.from_url(group.url(db=5))
    assert direct.get("harness:test:where") == b"here"
    assert redis.Redis.from_url(group.url(db=0)).get("harness:test:where") is None  # database 5, not 0
    wrong = RedisTarget.from_env({**group.env(), "REDIS_URL": "redis://:not-the-password@x:1/0"}).connect()
    with pytest.raises(redis.AuthenticationError):
        wrong.ping()


# --- the writes behind a promise ---------------------------------------------------------------------


def test_a_promised_write_waits_for_the_replica_and_other_writes_do_not(group: SentinelGroup) -> None:
    store = Store(RedisTarget.from_env(group.env(db=6)).connect())
    master = redis.Redis.from_url(group.url(db=6))
    replica_port = next(n.port for n in group.nodes if n.port != group.master_port())
    replica = redis.Redis(port=replica_port, password=PASSWORD, db=6)
    store.runs.request_stop(new_run_id(), "UANN")  # Redis learns the script (a NOSCRIPT, then the write)
    before = waits_sent(master)
    run_id = new_run_id()
    assert store.runs.request_stop(run_id, "UANN") is None  # a Stop: promised
    assert waits_sent(master) == before + 1
    assert replica.get(f"harness:stop:{run_id}") == b"UANN"  # there when the answer came
    store.redis.set("harness:test:plain", "1")  # not a promise: no wait
    store.runs.stop_requested(run_id)
    assert waits_sent(master) == before + 1


def test_a_live_message_opened_is_on_the_replica_before_its_stream_grows(group: SentinelGroup) -> None:
    """Seen: a master SIGKILLed right after an Approve lost the record of the answer's stream; the
    next driver did not find it to delete, and the thread showed the answer twice."""
    store = Store(RedisTarget.from_env(group.env(db=6)).connect())
    master = redis.Redis.from_url(group.url(db=6))
    replica_port = next(n.port for n in group.nodes if n.port != group.master_port())
    replica = redis.Redis(port=replica_port, password=PASSWORD, db=6)
    run_id = new_run_id()
    before = waits_sent(master)
    store.live.opening(run_id)  # before chat.startStream: the stream is looked for if its ts is lost
    assert waits_sent(master) == before + 1
    assert replica.exists(f"harness:live-opening:{run_id}")  # there when it returned
    store.live.opened(run_id, "1700000000.000100")
    assert waits_sent(master) == before + 2
    assert replica.smembers(f"harness:live:{run_id}") == {b"1700000000.000100"}  # there when it returned
    assert not replica.exists(f"harness:live-opening:{run_id}")  # in the same promised write


def test_a_replica_that_does_not_answer_delays_a_promise_boundedly_and_is_counted(
    group: SentinelGroup, caplog: pytest.LogCaptureFixture
) -> None:
    store = metrics.counting_store(
        RedisTarget.from_env({**group.env(db=7), "HARNESS_REPLICA_WAIT_MS": "300"}).connect()
    )
    replica = next(n for n in group.nodes if n.port != group.master_port())
    run_id = new_run_id()
    store.redis.hset(Keys.approvals(run_id, 1), "c1", "")
    os.kill(replica.proc.pid, signal.SIGSTOP)  # connected, but acknowledging nothing
    try:
        with caplog.at_level(logging.WARNING, logger="store.replicas"):
            result = store.parks.decide(run_id, 1, "c1", Decision(Verdict.APPROVED, by="UANN"))
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    assert result.outcome.value == "recorded"  # the decision stands, on the master
    assert any("decision write is on the Redis master only" in r.getMessage() for r in caplog.records)
    figures = store.redis.hgetall("harness:metrics:counters")
    assert figures.get(b"c|harness_replica_wait_shortfalls|decision") == b"1"
    wait_until(lambda: group.replicas_in_sync() == 1)


def test_a_master_with_no_replica_is_never_asked_to_wait(redis_server: RedisServer) -> None:
    url = redis_server.url.rsplit("/", 1)[0] + "/8"
    store = Store(RedisTarget.from_env({"REDIS_URL": url}).connect())
    before = waits_sent(store.redis)
    for _ in range(3):
        store.runs.request_stop(new_run_id(), "UANN")
    assert waits_sent(store.redis) == before


def test_a_client_goes_on_with_the_new_master_after_a_failover_without_a_restart(
    tmp_path: Path,
) -> None:
    group = SentinelGroup().start()
    try:
        client = RedisTarget.from_env(group.env()).connect()
        client.set("harness:test:before", "1")
        old = group.kill_master()
        wait_until(lambda: group.master_port() != old, timeout=30)

        def written() -> bool:  # the same client, never rebuilt: it asks the sentinels again
            try:
                return bool(client.set("harness:test:after", "2"))
            except redis.ConnectionError:  # the sentinels may still disagree for a moment
                return False

        wait_until(written, timeout=30)
        assert redis.Redis.from_url(group.url()).get("harness:test:after") == b"2"
        assert client.connection_pool.get_master_address()[1] == group.master_port()  # type: ignore[attr-defined]
        assert MASTER_NAME in repr(client.connection_pool)
    finally:
        group.stop()


@pytest.mark.parametrize(
    ("env", "warned"),
    [
        ({"REDIS_URL": "redis://redis.internal:6379/0"}, "redis.internal"),
        ({"REDIS_URL": "rediss://10.0.0.5:6380/1"}, "10.0.0.5"),
        ({"REDIS_URL": "redis://:s3cret@redis.internal:6379/0"}, None),
        ({"REDIS_URL": "redis://user:s3cret@redis.internal:6379/0"}, None),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0"}, None),
        ({"REDIS_URL": "redis://localhost:6379/0"}, None),
        ({"REDIS_URL": "redis://[::1]:6379/0"}, None),
        ({"REDIS_URL": "unix:///run/redis.sock"}, None),
        ({"REDIS_SENTINELS": "10.0.0.7:26379,127.0.0.1:26379", "REDIS_URL": "redis:///0"}, "10.0.0.7"),
        ({"REDIS_SENTINELS": "10.0.0.7:26379", "REDIS_URL": "redis://:pw@/0"}, None),
    ],
)
def test_a_password_less_redis_that_other_hosts_share_is_named_in_one_line_at_start(
    env: dict[str, str], warned: str | None
) -> None:
    line = RedisTarget.from_env(env).open_warning()
    if warned is None:
        assert line is None
    else:
        assert line is not None and warned in line and "no password" in line and "\n" not in line
        assert "requirepass" in line  # and how to fix it
