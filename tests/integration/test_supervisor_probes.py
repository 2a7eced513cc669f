"""The container probe's failure modes: every way of not knowing is `Unknown`, never `Absent`."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import docker
import pytest

from jobpool.supervisor import ContainerProber, Unknown, probe_containers
from tests.support.constants import IMAGE


@pytest.fixture
def silent_daemon(tmp_path: Path) -> Iterator[str]:
    """A unix socket that accepts connections and never answers: a hung daemon."""
    path = tmp_path / "hung.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"unix://{path}"
    stop.set()
    t.join(5)
    for conn in held:
        conn.close()
    server.close()


def test_hung_daemon_times_out_as_unknown(silent_daemon: str) -> None:
    started = time.monotonic()
    result = probe_containers("p", {"a": 1, "b": 2}, docker_host=silent_daemon, timeout=0.5)
    assert time.monotonic() - started < 5
    assert set(result) == {"a", "b"} and all(isinstance(r, Unknown) for r in result.values())
    reason = cast(Unknown, result["a"]).reason
    assert "could not be asked" in reason and "timed out" in reason.lower()


def test_no_daemon_at_all_is_unknown(tmp_path: Path) -> None:
    result = probe_containers("p", {"a": 1}, docker_host=f"unix://{tmp_path}/nothing.sock", timeout=1)
    assert isinstance(result["a"], Unknown) and "could not be asked" in result["a"].reason


def test_nothing_to_probe_asks_nothing(tmp_path: Path) -> None:
    prober = ContainerProber(f"unix://{tmp_path}/nothing.sock", timeout=1)
    assert prober.probe("p", {}) == {} and prober.api_calls == 0
    prober.close()


def test_probe_on_a_real_daemon_reports_present_exited_and_absent(docker_host: str) -> None:
    with contextlib.closing(docker.DockerClient(base_url=docker_host, timeout=30)) as client:
        def run(job: str, attempt: int, cmd: list[str]) -> docker.models.containers.Container:
            labels = {"jobpool.pool": "p", "jobpool.job_id": job, "jobpool.attempt": str(attempt)}
            return client.containers.run(IMAGE, cmd, detach=True, network_mode="none",
                                         labels=labels)

        run("live", 1, ["sleep", "300"])
        ended = run("ended", 2, ["sh", "-c", "exit 9"])
        run("old", 1, ["sleep", "300"])  # attempt 1; the row is at attempt 2
        ended.wait(timeout=30)
        result = probe_containers("p", {"live": 1, "ended": 2, "old": 2, "none": 1}, docker_host=docker_host)
        assert result["live"].running is True  # type: ignore[union-attr]
        assert (result["ended"].running, result["ended"].exit_code) == (False, 9)  # type: ignore[union-attr]
        assert type(result["old"]).__name__ == "Absent" and type(result["none"]).__name__ == "Absent"
        other = probe_containers("other-pool", {"live": 1}, docker_host=docker_host)
        assert type(other["live"]).__name__ == "Absent"  # another pool's label is not this pool's evidence
