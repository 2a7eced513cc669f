"""The compose file's promises: the drain ends before the SIGKILL, Redis persists, workers reach Docker."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from jobpool.store.redispolicy import NOEVICTION, ROW_LISTPACK_SETTING, ROW_LISTPACK_VALUE

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def _seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", str(text))
    assert m, f"not a compose duration: {text!r}"
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]


def test_worker_stop_grace_exceeds_drain_timeout() -> None:
    worker = _compose()["services"]["worker"]
    drain = float(worker["environment"]["JOBPOOL_DRAIN_TIMEOUT_SECS"])
    assert _seconds(worker["stop_grace_period"]) > drain
    assert worker["init"] is True
    assert worker.get("stop_signal", "SIGTERM") == "SIGTERM"
    assert worker["deploy"]["replicas"] >= 1


def test_redis_has_aof_a_volume_and_a_healthcheck() -> None:
    redis = _compose()["services"]["redis"]
    command = redis["command"]
    assert "--appendonly" in command and command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == NOEVICTION
    flag = f"--{ROW_LISTPACK_SETTING}"
    assert flag in command and command[command.index(flag) + 1] == str(ROW_LISTPACK_VALUE)
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert "redis-cli" in redis["healthcheck"]["test"] and "ping" in redis["healthcheck"]["test"]


def test_worker_and_supervisor_reach_docker_and_are_configured_by_env() -> None:
    services = _compose()["services"]
    for name in ("worker", "supervisor"):
        svc = services[name]
        assert "${JOBPOOL_DOCKER_SOCKET:-/var/run/docker.sock}:/var/run/docker.sock" in svc["volumes"]
        assert all(k.startswith("JOBPOOL_") for k in svc["environment"])
        assert svc["environment"]["JOBPOOL_REDIS_URL"].startswith("redis://redis:")
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["supervisor"]["deploy"]["replicas"] == 1


def test_images_are_variables_whose_defaults_are_a_real_hosts() -> None:
    """tests/integration/test_compose_fleet.py runs the file with images made on the machine and a private
    daemon's socket; a user who sets nothing gets redis:7, jobpool:latest and /var/run/docker.sock."""
    services = _compose()["services"]
    assert services["redis"]["image"] == "${JOBPOOL_REDIS_IMAGE:-redis:7}"
    for name in ("worker", "supervisor"):
        assert services[name]["image"] == "${JOBPOOL_IMAGE:-jobpool:latest}"
        assert services[name]["build"] == "."


def test_every_compose_setting_is_a_valid_jobpool_setting() -> None:
    from jobpool import Settings

    env = _compose()["services"]["worker"]["environment"]
    s = Settings.from_env(env)
    assert s.drain_timeout_secs == int(env["JOBPOOL_DRAIN_TIMEOUT_SECS"])


def _stack() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-stack.yml").read_text())
    return loaded


def test_the_stack_file_runs_a_worker_on_every_node_and_redis_and_the_supervisor_once() -> None:
    services = _stack()["services"]
    worker, supervisor, redis = services["worker"], services["supervisor"], services["redis"]
    assert worker["deploy"]["mode"] == "global"
    # Each node's own daemon: its local socket, unless JOBPOOL_DOCKER_SOCKET names another path (the Swarm of
    # one machine in tests/integration/test_swarm_stack.py gives each node's socket a path of its own).
    socket = "${JOBPOOL_DOCKER_SOCKET:-/var/run/docker.sock}:/var/run/docker.sock"
    assert socket in worker["volumes"] and socket in supervisor["volumes"]
    env = worker["environment"]
    assert _seconds(worker["stop_grace_period"]) > float(env["JOBPOOL_DRAIN_TIMEOUT_SECS"])
    assert float(env["JOBPOOL_INVENTORY_STALE_SECS"]) >= 2 * float(env["JOBPOOL_INVENTORY_SECS"])
    for svc in (supervisor, redis):
        assert svc["deploy"]["replicas"] == 1
        assert "node.role == manager" in svc["deploy"]["placement"]["constraints"]
    assert "build" not in worker and "build" not in supervisor, "a stack is deployed from a pulled image"
    command = redis["command"]
    assert command[command.index("--maxmemory-policy") + 1] == NOEVICTION
    assert command[command.index(f"--{ROW_LISTPACK_SETTING}") + 1] == str(ROW_LISTPACK_VALUE)
    assert _compose()["x-jobpool-env"].items() <= _stack()["x-jobpool-env"].items(), "the same settings"
