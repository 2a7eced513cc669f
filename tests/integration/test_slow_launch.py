"""A launch slower than the lease: the worker keeps its lease through the launch, and starts nothing that
is no longer its own.

The lease used to be renewed only once watching began, after create and start. A create that outlasted the
lease (a daemon hiccup, a large image on vfs) let the sweep judge the attempt "created, never started" and
free the slot, and then the worker's start ran it anyway. Now the lease is renewed all through the launch,
a fenced heartbeat stands between create and start (refused: the created container is removed, never
started), and a start that finds its container gone (removed by the supervisor) runs nothing and writes
nothing.

The slow create is real: a proxy (tests/support/proxies.py) in front of the private dockerd holds the reply of
`POST /containers/create` (the daemon has created the container, the worker waits) while a real supervisor
sweeps on the daemon's own socket. The daemon is sampled throughout.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, cast

import docker
import pytest

from jobpool import JobState, Pool
from tests.support.constants import IMAGE
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.proxies import DockerLaunchHold

LIVE = ("running", "paused", "restarting")


class Sampler:
    """Samples the job's containers on the daemon and its row in Redis, every few ms, in a thread."""

    def __init__(self, dclient: docker.DockerClient, pool: Pool, job_id: str) -> None:
        self.dclient, self.pool, self.job_id = dclient, pool, job_id
        self.max_live = 0
        self.live_attempts: set[str] = set()
        self.rows: list[tuple[str, int, str, bool]] = []  # (state, attempt, owner, holds a slot)
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def containers(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.dclient.api.containers(
            all=True, filters={"label": f"jobpool.job_id={self.job_id}"})
        return found

    def _run(self) -> None:
        while not self._stop.wait(0.03):
            try:
                live = [c for c in self.containers() if c["State"] in LIVE]
                self.max_live = max(self.max_live, len(live))
                self.live_attempts |= {c["Labels"]["jobpool.attempt"] for c in live}
                key = self.pool.keys.job(self.job_id)
                row = cast("list[str | None]",
                           self.pool.store.client.hmget(key, "state", "attempt", "owner_boot"))
                slot = self.pool.store.client.zscore(self.pool.keys.running, self.job_id) is not None
                self.rows.append((row[0] or "", int(row[1] or 0), row[2] or "", slot))
            except Exception as exc:  # noqa: BLE001 - reported by stop(), never lost in the thread
                self.errors.append(exc)
                return

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        assert not self.errors, self.errors

    def mark(self) -> int:
        return len(self.rows)


def sweeps_after(pool: Pool, after_ms: int, n: int) -> bool:
    """Whether the supervisor finished `n` sweeps that began after `after_ms` (Redis time): it wrote each
    one's report to `last_sweep`; seen values are remembered across calls."""
    raw = pool.store.client.get(pool.keys.last_sweep)
    if raw:
        at = int(json.loads(raw)["at"])
        if at > after_ms:
            sweeps_after.seen.add(at)  # type: ignore[attr-defined]
    return len(sweeps_after.seen) >= n  # type: ignore[attr-defined]


def redis_ms(pool: Pool) -> int:
    secs, micros = pool.store.client.time()
    return int(secs) * 1000 + int(micros) // 1000


def hold_create(pool: Pool, proxy: DockerLaunchHold, dclient: docker.DockerClient, job_id: str) -> None:
    """Wait until the worker's launch is held: the container exists, created, and its launcher waits."""
    eventually(proxy.held.is_set, timeout=30, message="the worker's launch reached the daemon and is held")
    eventually(lambda: [c.status for c in dclient.containers.list(
        all=True, filters={"label": f"jobpool.job_id={job_id}"})] == ["created"], timeout=10,
        message="the daemon created the container")


def test_the_lease_is_kept_through_a_create_slower_than_the_lease(
        pool: Pool, spawn: Callable[..., JobpoolProcess], proxy: DockerLaunchHold,
        dclient: docker.DockerClient) -> None:
    sweeps_after.seen = set()  # type: ignore[attr-defined]
    proxy.hold()
    job = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 1; exit 0"])
    spawn(module="jobpool.cli", args=("supervisor",))  # on the daemon's own socket
    worker = spawn(DOCKER_HOST=proxy.host)
    with Sampler(dclient, pool, job.id) as sampler:
        hold_create(pool, proxy, dclient, job.id)
        held_from = sampler.mark()
        # Held until the lease would have lapsed three times over and the supervisor swept after that.
        lapse = redis_ms(pool) + 3 * int(pool.settings.lease_secs * 1000)
        eventually(lambda: sweeps_after(pool, lapse, 2), timeout=30, message="two sweeps past the lease")
        held = sampler.rows[held_from:]
        proxy.release()
        done = pool.wait(job.id, timeout=60)
    assert held and held[0][2], "sampled through the hold, the row claimed"
    assert set(held) == {("running", 1, held[0][2], True)}, "the slot was kept by its owner all through"
    assert (done.state, done.attempt, done.recovery_attempts) == (JobState.SUCCEEDED, 1, 0), \
        worker.log()[-3000:]
    assert sampler.max_live == 1 and sampler.live_attempts == {"1"}
    assert not [e for e in pool.events(job.id) if e["reason"].startswith("orphan_reconciled")]


def test_a_launch_whose_row_was_lost_during_create_never_starts(
        pool: Pool, spawn: Callable[..., JobpoolProcess], proxy: DockerLaunchHold,
        dclient: docker.DockerClient) -> None:
    """The fence between create and start: the operator evicted the attempt while its create hung, so the
    worker removes the created container instead of starting it."""
    proxy.hold()
    job = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 30"])
    worker = spawn(DOCKER_HOST=proxy.host)
    with Sampler(dclient, pool, job.id) as sampler:
        hold_create(pool, proxy, dclient, job.id)
        pool.evict(job.id, 1, reason="evicted", evidence="test: launch in flight")
        proxy.release()
        eventually(lambda: not sampler.containers(), timeout=20,
                   message="the created container was removed, never started")
        eventually(lambda: "not ours" in worker.log() or "no longer ours" in worker.log(), timeout=10,
                   message="the worker said why it did not start it")
    assert sampler.max_live == 0, "the evicted attempt never ran"
    done = pool.get(job.id)
    assert (done.state, done.error_reason) == (JobState.FAILED, "evicted")


@pytest.mark.parametrize("removed", ["while-create-is-held", "before-start"])
def test_a_start_that_finds_its_container_gone_runs_nothing_and_writes_nothing(
        pool: Pool, spawn: Callable[..., JobpoolProcess], proxy: DockerLaunchHold,
        dclient: docker.DockerClient, removed: str) -> None:
    """The supervisor removes a never-started container before its verdict; the worker's late start then
    finds nothing (a 404 on the SDK's read-back after the create, or on the start). Nothing runs, so the
    worker leaves the row to the supervisor's verdict, which ends the attempt from what it sees (no
    container) and runs the job again."""
    proxy.hold("create" if removed == "while-create-is-held" else "start")
    job = pool.enqueue(IMAGE, ["sh", "-c", "echo started; exit 0"])
    worker = spawn(DOCKER_HOST=proxy.host)
    with Sampler(dclient, pool, job.id) as sampler:
        hold_create(pool, proxy, dclient, job.id)
        for c in dclient.containers.list(all=True, filters={"label": f"jobpool.job_id={job.id}"}):
            c.remove(force=True)  # what the supervisor does with a created container whose lease lapsed
        proxy.release()
        eventually(lambda: "nothing runs" in worker.log(), timeout=20,
                   message="the worker saw its start fail")
        row = pool.get(job.id)
        assert (row.state, row.attempt, row.error_reason) == (JobState.RUNNING, 1, ""), "nothing written"
        spawn(module="jobpool.cli", args=("supervisor",))
        done = pool.wait(job.id, timeout=60)
    assert (done.state, done.attempt) == (JobState.SUCCEEDED, 2), worker.log()[-3000:]
    assert sampler.live_attempts <= {"2"} and sampler.max_live <= 1
    reasons = [e["reason"] for e in pool.events(job.id)]
    assert not [r for r in reasons if r.startswith("launch_failed")], reasons


def test_a_daemon_error_on_create_does_not_fail_the_job_for_good(
        pool: Pool, spawn: Callable[..., JobpoolProcess], proxy: DockerLaunchHold) -> None:
    """A daemon shutting down answers a create with a server error ("database not open"). That says nothing
    about the job, and maybe not even that nothing was created: the outcome is unknown, the slot is kept,
    and the sweep recovers the attempt from ground truth. It used to fail the job on the spot."""
    proxy.refuse(1, "write /var/lib/docker/containers: database not open")
    job = pool.enqueue(IMAGE, ["sh", "-c", "echo ran"])
    spawn(module="jobpool.cli", args=("supervisor",))
    spawn(DOCKER_HOST=proxy.host)
    done = pool.wait(job.id, timeout=60)
    assert proxy.refused == 1, "the fault was injected"
    assert (done.state, done.attempt) == (JobState.SUCCEEDED, 2), (done.error_reason, pool.events(job.id))
    assert done.recovery_attempts == 1, "recovered by the sweep (absent: nothing was created)"


def test_a_start_that_returns_after_the_row_was_lost_is_stopped_at_once(
        pool: Pool, spawn: Callable[..., JobpoolProcess], proxy: DockerLaunchHold,
        dclient: docker.DockerClient) -> None:
    """The start is held after the fence passed, and meanwhile the row stops being this attempt's (here an
    eviction; in bench/soak.py, a Redis rollback that took back the claim, after which the slot went to
    another job). Docker starts the container when the start is let through, and nothing can recall it: the
    worker must stop it at once, not a heartbeat later. The worker's heartbeat is long (20 s) so that
    "later" cannot pass for "at once" (and its lease renewal does not run during the hold)."""
    proxy.hold("start")
    job = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 60"])
    worker = spawn(DOCKER_HOST=proxy.host, JOBPOOL_HEARTBEAT_SECS="20", JOBPOOL_LEASE_SECS="60")
    with Sampler(dclient, pool, job.id) as sampler:
        hold_create(pool, proxy, dclient, job.id)
        pool.evict(job.id, 1, reason="evicted", evidence="test: start in flight")
        held_since = redis_ms(pool)
        # Held past the re-fence threshold (watch.START_REFENCE_SECS), told by Redis's clock.
        eventually(lambda: redis_ms(pool) - held_since > 1500, timeout=10, message="1.5 s held")
        proxy.release()
        eventually(lambda: sampler.max_live == 1, timeout=10, message="the held start ran the container")
        eventually(lambda: not [c for c in sampler.containers() if c["State"] in LIVE], timeout=10,
                   message="the container stopped well before the worker's next heartbeat")
    assert "no longer ours" in worker.log(), worker.log()[-3000:]
    done = pool.get(job.id)
    assert (done.state, done.error_reason) == (JobState.FAILED, "evicted"), "nothing written over the verdict"
