"""Which Redis an operator's command reads (`runtime.local_redis`): its own setting, else the one
`make run` started here, else the default; said in one line that never shows a password."""

from __future__ import annotations

import stat
from pathlib import Path

from runtime import local_redis

URL = "redis://:s3cret-pass@127.0.0.1:41234/0"


def test_make_runs_redis_is_announced_to_its_user_alone_and_withdrawn(tmp_path: Path) -> None:
    path = local_redis.announce(URL, tmp_path)
    assert path == tmp_path / ".harness-redis" and path.read_text().strip() == URL
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    local_redis.withdraw(path)
    assert not path.exists()


def test_an_operator_command_reads_its_own_setting_then_make_runs_then_the_default(tmp_path: Path) -> None:
    env, said = local_redis.operator_env({"REDIS_URL": "redis://10.0.0.9:6379/2"}, tmp_path)
    assert env["REDIS_URL"] == "redis://10.0.0.9:6379/2" and "(from REDIS_URL)" in said

    env, said = local_redis.operator_env({}, tmp_path)
    assert env["REDIS_URL"] == "redis://localhost:6379/0" and "the default" in said

    local_redis.announce(URL, tmp_path)
    env, said = local_redis.operator_env({"REDIS_URL": "  "}, tmp_path)
    assert env["REDIS_URL"] == URL and "make run's own" in said
    assert "s3cret-pass" not in said and "127.0.0.1:41234" in said
