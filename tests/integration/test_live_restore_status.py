"""`jobpool status` warns of a Docker daemon running without live-restore (README.md, "The container
contract"): real workers on real private dockerd processes, one started without `--live-restore` and the
session's, started with it (tests/support/servers.py, DockerDaemon). Each worker reads its daemon's
`GET /info` `LiveRestoreEnabled` as it establishes the daemon and records it in its boot record
(workers/boot.py); the report's `Worker.live_restore`, its warning (jobpool/status/health.py), the CLI's text
and the dashboard's overview show it."""

from __future__ import annotations

from collections.abc import Callable

from starlette.testclient import TestClient

from jobpool import Pool
from jobpool.cli.format import status_report
from jobpool.dashboard import create_app
from jobpool.status import Worker
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.servers import DockerDaemon


def booted(pool: Pool, *workers: JobpoolProcess) -> tuple[Worker, ...] | None:
    """The status report's entries of these worker processes once each has a record saying whether its daemon
    runs with live-restore (None until then)."""
    report = pool.status()
    found = {w.pid: w for w in report.workers.boots} if report.workers else {}
    shown = tuple(found.get(p.pid) for p in workers)
    if any(w is None or w.live_restore is None for w in shown):
        return None
    return shown  # type: ignore[return-value]


def live_restore_warnings(pool: Pool) -> list[str]:
    return [w for w in pool.status().health.warnings if "live-restore" in w]


def test_workers_on_a_daemon_without_live_restore_are_one_warning_naming_them(
        pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    with DockerDaemon(live_restore=False) as daemon:
        daemon.start()
        first, second = spawn(DOCKER_HOST=daemon.host), spawn(DOCKER_HOST=daemon.host)
        boots = eventually(lambda: booted(pool, first, second), timeout=30,
                           message="both workers recorded their daemon's live-restore setting")
        assert [w.live_restore for w in boots] == [False, False]
        assert boots[0].daemon_id and boots[0].daemon_id == boots[1].daemon_id

        report = pool.status()
        (warning,) = live_restore_warnings(pool)  # one per daemon, not one per worker
        assert warning.startswith("1 Docker daemon(s) run without live-restore")
        assert boots[0].daemon_id in warning and boots[0].host in warning
        assert boots[0].id in warning and boots[1].id in warning
        assert not any("live-restore" in r for r in report.health.reasons), "a warning, not unhealthy"
        assert report.to_dict()["workers"]["boots"][0]["live_restore"] is False

        text = status_report(report)
        assert "NO LIVE-RESTORE" in text and warning in text
        with TestClient(create_app(pool), base_url="http://localhost:8765") as client:
            page = client.get("/").text
        assert "no live-restore" in page and "run without live-restore" in page
        first.stop()
        second.stop()


def test_a_worker_on_a_daemon_with_live_restore_is_no_warning(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    worker = spawn(DOCKER_HOST=docker_host)  # the session's dockerd runs with --live-restore
    (boot,) = eventually(lambda: booted(pool, worker), timeout=30,
                         message="the worker recorded its daemon's live-restore setting")
    assert boot.live_restore is True
    assert live_restore_warnings(pool) == []
    assert "NO LIVE-RESTORE" not in status_report(pool.status())
