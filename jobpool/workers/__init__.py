"""The RQ workers: one boot per process start; each job claimed, launched, watched and finished fenced.

`run_worker` is what `jobpool worker` runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config import Settings
from ..errors import JobpoolError
from ..fleet.daemonmark import Marker
from ..store.calls import Store
from .boot import Boot, live_restore_of
from .cleanup import Cleaner
from .executors import make_executor
from .hostcheck import HostCheck, for_settings
from .inventory import InventoryPublisher
from .rqworker import JobpoolWorker
from .runtime import Runtime, install

if TYPE_CHECKING:
    from .executors.docker import DockerExecutor

log = logging.getLogger("jobpool.worker")


class WorkerDied(JobpoolError):
    """The worker's work loop ended on an error rather than on a stop request (see its log)."""


def run_worker(settings: Settings, burst: bool = False) -> int:
    """Run one worker until it is stopped (or, with `burst`, until the queue is empty). Returns how many
    jobs it left running at a drain deadline; raises `WorkerDied` when the work loop ended on an error, and
    `EvictingRedis` (jobpool/store/redispolicy.py) before anything is written on a Redis that may evict job
    rows."""
    store = Store.from_settings(settings)
    store.check_policy()
    store.check_schema()  # PoolTooNew: a pool this release does not know is not written to
    daemon_id, api_version, live_restore = establish_daemon(settings)
    boot = Boot(store, settings.executor, daemon_id)
    boot.set_live_restore(live_restore)
    marker = mark_daemon(store, boot)
    runtime = Runtime(store=store, boot_id=boot.id, daemon_id=daemon_id, api_version=api_version,
                      cleaner=finished_container_remover(settings, daemon_id, api_version))
    runtime.host_check = host_check(settings, boot, api_version,
                                    None if daemon_id else identify(runtime, boot))
    runtime.prepare()
    install(runtime)
    boot.start()
    runtime.host_check.start()
    publisher = None
    if settings.executor == "docker" and settings.inventory_secs:
        publisher = InventoryPublisher(store, boot.id)
        if marker is not None:
            publisher.refusal = marker.refusal
        publisher.start()
    worker = JobpoolWorker(runtime, boot)
    boot.stuck = worker.stuck
    if marker is not None:
        worker.claim_refusal = marker.refusal
        worker.claim_refused_for_good = marker.collided
    if publisher is not None and not daemon_id:  # the daemon did not answer at boot: its queue comes later
        publisher.on_daemon = worker.listen_on_daemon
    if publisher is not None:
        publisher.on_earlier_boot = worker.listen_on_earlier_boot
        publisher.on_earlier_boot_back = worker.forget_earlier_boot
    log.info("worker %s: boot %s, pool %s, executor %s", worker.name, boot.id, settings.pool,
             settings.executor)
    try:
        worker.work(burst=burst, logging_level="INFO", with_scheduler=False)
        if not worker.ended_normally(burst):
            raise WorkerDied(f"worker {worker.name}: its work loop ended on an error (logged above)")
    finally:
        noun = "job" if worker.left_running == 1 else "jobs"
        log.info("worker %s: exiting; %d %s left running", worker.name, worker.left_running, noun)
        runtime.host_check.stop()
        if runtime.cleaner is not None:
            runtime.cleaner.stop()
        if publisher is not None:
            publisher.stop()
        if marker is not None:
            marker.stop()
        boot.stop()
    return worker.left_running


def establish_daemon(settings: Settings) -> tuple[str, str | None, str]:
    """The Docker daemon's identity, API version and live-restore setting (`live_restore_of`) at boot; ''
    and None for what is not known (the subprocess executor, or a daemon not answering yet: the host check
    establishes it later, `identify`)."""
    daemon_id, api_version, live_restore = "", None, ""
    if settings.executor != "docker":
        return daemon_id, api_version, live_restore
    try:
        executor = make_executor(settings)
        daemon_id = executor.daemon_id()  # type: ignore[attr-defined]
        api_version = executor.api_version  # type: ignore[attr-defined]
        live_restore = live_restore_of(executor.client.api)  # type: ignore[attr-defined]
        executor.close()
    except Exception as exc:  # noqa: BLE001 - a worker may start before the daemon answers
        log.warning("docker daemon not answering yet (%s); jobs wait for it", exc)
    if live_restore == "0":
        log.warning("the docker daemon runs without live-restore: restarting it stops the jobs running on it "
                    "(README.md, \"The container contract\")")
    return daemon_id, api_version, live_restore


def identify(runtime: Runtime, boot: Boot) -> Callable[[], object]:
    """Establish the identity of the Docker daemon that did not answer at boot, into `runtime` (the horses
    forked from then on inherit it) and the boot record; run by the host check's thread, which holds claims
    until it has."""
    def establish() -> object:
        executor = make_executor(runtime.store.settings)
        try:
            runtime.api_version = executor.api_version  # type: ignore[attr-defined]
            runtime.daemon_id = executor.daemon_id()  # type: ignore[attr-defined]
            boot.set_live_restore(live_restore_of(executor.client.api))  # type: ignore[attr-defined]
        finally:
            executor.close()
        boot.fields["daemon_id"] = runtime.daemon_id
        return runtime.daemon_id

    return establish


def host_check(settings: Settings, boot: Boot, api_version: str | None,
               identify: Callable[[], object] | None = None) -> HostCheck:
    """The check of this worker's host (workers/hostcheck.py), publishing to its boot record; its Docker ping
    and its re-read of the daemon's live-restore setting share a client of their own, made at its first use
    (only its thread uses it)."""
    made: list[object] = []

    def client() -> Any:
        if not made:
            import docker

            made.append(docker.from_env(version=api_version or "auto", timeout=PING_TIMEOUT_SECS))
        return made[0]

    def ping() -> object:
        return client().ping()

    read_at = [time.monotonic()]  # just read at boot (`establish_daemon`)

    def recheck() -> None:
        """Re-read live-restore every `LIVE_RESTORE_RECHECK_SECS`: dockerd takes the setting on a reload
        (SIGHUP) without a restart, and a daemon restarted with another daemon.json changes it too."""
        if time.monotonic() - read_at[0] < LIVE_RESTORE_RECHECK_SECS:
            return
        read_at[0] = time.monotonic()
        boot.set_live_restore(live_restore_of(client().api))

    docker_host = settings.executor == "docker"
    return for_settings(settings, boot.id, ping if docker_host else None, boot.set_cannot_claim, identify,
                        recheck if docker_host else None)


#: How long the host check's ping waits for the Docker daemon.
PING_TIMEOUT_SECS = 5
#: How often the host check re-reads whether the Docker daemon runs with live-restore (`host_check`).
LIVE_RESTORE_RECHECK_SECS = 60.0


def mark_daemon(store: Store, boot: Boot) -> Marker | None:
    """The worker's mark on its Docker daemon, made and registered before anything else of this boot is
    (jobpool/fleet/daemonmark.py): no claim and no inventory until every process claiming the daemon's
    identity has its mark on this very daemon. None for the subprocess executor."""
    if store.settings.executor != "docker":
        return None
    marker = Marker(store, "worker", boot.id,
                    consequence="this worker takes no job while it lasts (a job it runs stays watched) and "
                    "publishes no inventory of that identity")
    marker.start()
    return marker


def finished_container_remover(settings: Settings, daemon_id: str, api_version: str | None) -> Cleaner | None:
    """The main process's remover of the containers its horses finished (workers/cleanup.py), with a Docker
    client of its own (only its thread uses it); None for the subprocess executor."""
    if settings.executor != "docker":
        return None
    from .executors.docker import DockerExecutor

    made: list[DockerExecutor] = []  # built at the first removal: the daemon may not answer at boot

    def remove(container_id: str, pool: str, job_id: str) -> None:
        if not made:
            made.append(DockerExecutor(daemon_id=daemon_id, api_version=api_version,
                                       checkpoint_root=settings.checkpoint_root))
        remove_finished(made[0], container_id, pool, job_id)

    return Cleaner(remove)


def remove_finished(executor: DockerExecutor, container_id: str, pool: str, job_id: str) -> None:
    """Remove a finished attempt's container and, when its job ended (`job_id` given), the job's checkpoint
    once the container is gone (one removed under way by someone else counts: executors/docker.py)."""
    from .executors.docker import remove_container

    if remove_container(executor.client.api, container_id) and job_id:
        executor.remove_checkpoint(pool, job_id)


__all__ = ["run_worker", "JobpoolWorker", "WorkerDied"]
