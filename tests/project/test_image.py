"""The image and the compose file: what they promise, read from them; then built and started with
Debian's podman where this machine can (it needs the base image, from a registry or podman's store).
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from typing import Any

import pytest
import yaml

from tests.stack import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()
BASE = "python:3.12-slim"


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_the_image_holds_every_package_the_project_ships() -> None:
    """A floor added to pyproject.toml but not copied into the image would fail only in production."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {
        line.split()[1]
        for line in DOCKERFILE.splitlines()
        if line.startswith("COPY ") and "--from" not in line
    }
    assert shipped <= copied, shipped - copied


def test_the_image_runs_as_a_user_with_bubblewrap_and_either_process_by_its_command() -> None:
    final = DOCKERFILE[DOCKERFILE.rindex("\nFROM ") :]
    assert "bubblewrap" in final  # stdio MCP servers start only inside its walls
    user = next(line.split()[1] for line in final.splitlines() if line.startswith("USER "))
    assert user not in {"root", "0"}
    assert 'ENTRYPOINT ["tini", "--", "python", "-m"]' in final and 'CMD ["bot"]' in final


def test_compose_brings_up_bot_worker_and_redis_with_a_replica_a_sentinel_and_kept_data() -> None:
    found = compose()
    services = found["services"]
    assert {"bot", "worker", "redis", "redis-replica", "sentinel"} <= set(services)
    assert services["bot"]["command"] == ["bot"] and services["worker"]["command"] == ["workers"]
    for name in ("bot", "redis", "redis-replica", "sentinel"):
        assert "test" in services[name]["healthcheck"], name
    assert "redis-data:/data" in services["redis"]["volumes"] and "redis-data" in found["volumes"]
    for name in ("bot", "worker"):
        env = services[name]["environment"]
        assert (
            env["REDIS_SENTINELS"] == "sentinel:26379" and "@/0" in env["REDIS_URL"]
        )  # the master by Sentinel
        assert services[name]["depends_on"]["sentinel"]["condition"] == "service_healthy"
    assert "seccomp=unconfined" in services["worker"]["security_opt"]  # bubblewrap's namespaces
    assert services["worker"]["stop_grace_period"]  # a worker leaves after its step, not killed mid-run
    for name in ("redis", "redis-replica", "sentinel"):
        assert "REDIS_PASSWORD" in str(services[name])  # no Redis without its password


def _podman(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.e2e
def test_the_image_builds_and_both_processes_start_in_it() -> None:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed here (apt install podman), so the image is not built")
    if _podman("image", "exists", BASE).returncode != 0:
        pulled = _podman("pull", BASE, timeout=120)
        if pulled.returncode != 0:
            why = (pulled.stderr.strip().splitlines() or ["no reason given"])[-1]
            pytest.skip(f"podman cannot get the base image {BASE} here, so the image is not built: {why}")
    built = _podman("build", "--tag", "slack-harness:test", str(ROOT))
    assert built.returncode == 0, built.stderr[-2000:]
    for process in ("bot", "workers"):
        ran = _podman("run", "--rm", "slack-harness:test", process, "--version", timeout=60)
        assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr
    whoami = _podman("run", "--rm", "--entrypoint", "id", "slack-harness:test", "-u", timeout=60)
    assert whoami.stdout.strip() == "10001"
