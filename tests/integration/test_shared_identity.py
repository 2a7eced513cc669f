"""Two real dockerd on this kernel, the second started from a copy of the first's data root (a backup restored
onto a second daemon, Docker-in-Docker built with its data): both carry the same `jobpool-daemon-identity`
volume and the same kernel boot id, so their identities are equal and neither's listing may speak for the
other. Each process marks its own daemon (jobpool/fleet/daemonmark.py); a live process whose mark is missing
from a daemon that claims its identity is a collision: no claim on either daemon, no verdict on that identity,
and `status` says so, naming both daemons (docs/architecture.md, "The daemon's identity"). The collision is
remembered in Redis: it holds when every jobpool process on one side has died (its containers run on), until
an operator clears it with `jobpool forget-collision`.

And the other side: a normal fleet (two daemons with identities of their own, two workers on one daemon)
sees no collision and runs its jobs.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from typing import cast

import docker
import pytest

from jobpool import JobState, Pool
from jobpool.fleet import daemonmark, markrecords
from jobpool.status import StatusReport
from jobpool.supervisor import ContainerProber, Supervisor
from tests.support.bad_input import cli, one_line_error
from tests.support.constants import IMAGE
from tests.support.job_containers import Sampler, live_on
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.servers import DockerDaemon, daemon_identity

#: Inventories every 0.3 s, stale after 2 s: a collision and its consequences show within seconds.
FLEET = {"JOBPOOL_INVENTORY_SECS": "0.3", "JOBPOOL_INVENTORY_STALE_SECS": "2"}
NOWHERE = "unix:///nonexistent/jobpool-no-daemon.sock"
SHARED = "is shared by two docker daemons"


@pytest.fixture
def pool_env(pool_env: dict[str, str]) -> dict[str, str]:
    return {**pool_env, **FLEET}


@pytest.fixture(scope="module")
def clones() -> Iterator[tuple[DockerDaemon, DockerDaemon]]:
    """A private dockerd whose identity volume exists, and a second one started from a copy of its data root
    taken while it was stopped."""
    first = DockerDaemon()
    second = DockerDaemon(copy_of=first)
    try:
        first.start()
        first.import_busybox_image()
        daemon_identity(first.host)  # the identity volume, made before the copy
        first.stop()
        second.start()  # from the copy
        first.start()
        yield first, second
    finally:
        second.close()
        first.close()


@pytest.fixture
def two(clones: tuple[DockerDaemon, DockerDaemon]) -> tuple[str, str]:
    for d in clones:
        d.ensure_running()
        d.remove_containers()
        d.remove_volumes(prefix="jobpool-ckpt")
    return clones[0].host, clones[1].host


def sweeps(sup: JobpoolProcess) -> int:
    return sup.log().count("sweep pool=")


def named_both(text: str, d1: str, d2: str) -> bool:
    return any(SHARED in line and d1 in line and d2 in line for line in text.splitlines())


def test_two_daemons_with_one_copied_data_root_refuse_claims_and_judge_nothing(
        two: tuple[str, str], pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    d1, d2 = two
    identity = daemon_identity(d1)
    assert daemon_identity(d2) == identity, "precondition: the copy carries the identity volume, one kernel"
    pool.set_slots(2)
    with Sampler(two) as sampler:
        # A job runs on daemon 1 under a supervisor attached to it; its worker dies, the container runs on.
        s1 = spawn(module="jobpool.cli", args=("supervisor",), DOCKER_HOST=d1)
        w1 = spawn(DOCKER_HOST=d1)
        orphan = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 600"]).id
        eventually(lambda: live_on(d1, orphan), timeout=40, message="the job running on daemon 1")
        w1.kill_with_children()
        eventually(lambda: not pool.store.client.exists(pool.keys.lease(orphan)), timeout=10,
                   message="its lease lapsing")
        # The clone comes up: a worker, a supervisor attached to it, and one attached to no daemon (it knows
        # daemon 2 only from its inventory). On the old code the clone's list (no container of the job) or
        # its inventory made the orphan "absent", and it ran again on daemon 2 beside itself.
        w2 = spawn(DOCKER_HOST=d2)
        s2 = spawn(module="jobpool.cli", args=("supervisor",), DOCKER_HOST=d2)
        s0 = spawn(module="jobpool.cli", args=("supervisor",), DOCKER_HOST=NOWHERE)
        for proc in (w2, s1, s2):
            eventually(lambda p=proc: named_both(p.log(), d1, d2), timeout=30,
                       message=f"one line naming both daemons in {proc.log_path.name}")
        # A worker started on daemon 1 now learns of the collision before its first claim.
        w1b = spawn(DOCKER_HOST=d1)
        eventually(lambda: named_both(w1b.log(), d1, d2), timeout=30,
                   message="the new daemon 1 worker naming both daemons")
        status = cast(StatusReport, eventually(lambda: (r := pool.status()).shared_daemons and r, timeout=10,
                                               message="status naming the shared identity"))
        assert not status.healthy
        assert any(named_both(reason, d1, d2) for reason in status.health.reasons), status.health.reasons
        assert list(status.shared_daemons) == [identity]
        # A job enqueued now waits; sweeps and inventory periods go by, and nothing is claimed or judged.
        waiting = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 600"]).id
        marks = {p: sweeps(p) for p in (s0, s1, s2)}
        eventually(lambda: all(sweeps(p) >= n + 6 for p, n in marks.items()), timeout=40,
                   message="six more sweeps of each supervisor")
        assert pool.get(waiting).state in (JobState.QUEUED, JobState.RUNNING)
        assert pool.get(waiting).owner_boot in ("", None), "claimed by a worker whose daemon has a clone"
        assert not any(e["reason"] == "claimed" for e in pool.events(waiting))
        assert not live_on(d1, waiting) and not live_on(d2, waiting)
        # An operator's one-shot sweep from either daemon (no mark of its own) honours the report too.
        for host in (d1, d2):
            sup = Supervisor(pool.store, ContainerProber(host, timeout=5))
            try:
                verdict = sup.sweep(job_ids=[orphan], dry_run=True).decisions[0].verdict
            finally:
                sup.close()
            assert verdict.kind.value == "warn", verdict
            assert "may not be one daemon" in verdict.evidence + verdict.reason, verdict
    job = pool.get(orphan)
    assert (job.state, job.attempt) == (JobState.RUNNING, 1), "the orphan was judged, and run again"
    assert not [e for e in pool.events(orphan) if e["from"] == "running" and e["to"] != "running"]
    assert sampler.attempts.get(waiting, set()) == set(), "a container of the waiting job"
    assert sampler.attempts[orphan] == {"1"} and sampler.most_live[orphan] == 1
    assert f"job {orphan} (attempt 1) kept: probe_unknown" in s2.log()
    assert "may not be one daemon" in s2.log() and "may not be one daemon" in s0.log()
    # The identity's inventory is the first daemon 1 worker's (before the clone came up), none of theirs.
    publisher = cast("str | None", pool.store.client.hget(pool.keys.inventory(identity), "publisher")) or ""
    assert publisher and f"boot {publisher}" in w1.log()


def test_a_collision_holds_when_the_clones_processes_all_died_until_an_operator_clears_it(
        two: tuple[str, str], pool: Pool, pool_env: dict[str, str],
        spawn: Callable[..., JobpoolProcess]) -> None:
    """The mirror of the case above: the job runs on the clone, whose only jobpool process (a worker) is
    SIGKILLed once the collision was found. On the old code the collision ended with that process (seen dead
    at once on this kernel): daemon 1's processes were trusted again, its supervisor listed its own daemon,
    found no container of the job and ran it again on daemon 1 while it still ran on daemon 2."""
    d1, d2 = two
    identity = daemon_identity(d1)
    assert daemon_identity(d2) == identity, "precondition: the copy carries the identity volume, one kernel"
    pool.set_slots(2)
    with Sampler(two) as sampler:
        # A job runs on the clone, claimed by its only worker before daemon 1 has any jobpool process.
        w2 = spawn(DOCKER_HOST=d2)
        orphan = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 600"]).id
        eventually(lambda: live_on(d2, orphan), timeout=40, message="the job running on daemon 2")
        # Daemon 1's supervisor and worker come up: the collision is found on both sides.
        s1 = spawn(module="jobpool.cli", args=("supervisor",), DOCKER_HOST=d1)
        w1 = spawn(DOCKER_HOST=d1)
        for proc in (w2, w1, s1):
            eventually(lambda p=proc: named_both(p.log(), d1, d2), timeout=30,
                       message=f"one line naming both daemons in {proc.log_path.name}")
        # The clone's only jobpool process dies; its container runs on, and its lease lapses.
        w2.kill_with_children()
        eventually(lambda: not pool.store.client.exists(pool.keys.lease(orphan)), timeout=10,
                   message="its lease lapsing")
        waiting = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 600"]).id
        # Sweeps and inventory periods go by (its inventory stale after 2 s): nothing judged, nothing claimed.
        seen = sweeps(s1)
        eventually(lambda: sweeps(s1) >= seen + 12, timeout=40, message="twelve more sweeps")
        job = pool.get(orphan)
        assert (job.state, job.attempt) == (JobState.RUNNING, 1), "the orphan on the clone was judged"
        assert live_on(d2, orphan) and not live_on(d1, orphan)
        assert pool.get(waiting).owner_boot in ("", None), "claimed by a worker whose daemon has a clone"
        assert not live_on(d1, waiting) and not live_on(d2, waiting)
        assert f"job {orphan} (attempt 1) kept: probe_unknown" in s1.log()
        # An operator's one-shot sweep from daemon 1 (no mark of its own) honours it too.
        sup = Supervisor(pool.store, ContainerProber(d1, timeout=5))
        try:
            verdict = sup.sweep(job_ids=[orphan], dry_run=True).decisions[0].verdict
        finally:
            sup.close()
        assert verdict.kind.value == "warn" and "may not be one daemon" in verdict.evidence + verdict.reason
        status = pool.status()
        assert not status.healthy and list(status.shared_daemons) == [identity]
        assert any(named_both(r, d1, d2) and f"jobpool forget-collision {identity}" in r
                   for r in status.health.reasons), status.health.reasons
        # Nothing published of the identity since the collision: daemon 1's listing has no word on it.
        publisher = cast("str | None", pool.store.client.hget(pool.keys.inventory(identity),
                                                              "publisher")) or ""
        assert not publisher or f"boot {publisher}" in w2.log()
        # The operator fixes the clone (here: its container removed, as the clone goes away), then clears the
        # report. Bad input first: one line, exit 2, nothing written.
        for bad in ("nonsense", "jpd1:" + "0" * 32 + "@" + identity.split("@")[1]):
            assert one_line_error(cli("forget-collision", bad, env=pool_env), 2) is None
        assert pool.store.client.hexists(pool.keys.shared_daemons, identity)
        with contextlib.closing(docker.DockerClient(base_url=d2, timeout=10)) as client:
            for c in client.containers.list(all=True, filters={"label": f"jobpool.job_id={orphan}"}):
                c.remove(force=True)
        done = cli("forget-collision", identity, "--note", "clone removed", env=pool_env)
        assert done.returncode == 0 and "cleared" in done.stdout, done.stderr
        # Claims resume on daemon 1: the waiting job runs, and the orphan is judged (absent) and runs again.
        eventually(lambda: live_on(d1, waiting), timeout=40, message="the waiting job claimed on daemon 1")
        eventually(lambda: pool.get(orphan).attempt == 2, timeout=40, message="the orphan judged, run again")
        assert pool.status().shared_daemons == {}
        assert one_line_error(cli("forget-collision", identity, env=pool_env), 2) is None, "nothing stands"
    assert sampler.most_live[orphan] == 1, "the orphan ran twice at once"
    assert sampler.most_live[waiting] == 1
    for j in (orphan, waiting):
        pool.cancel(j)


def test_a_normal_fleet_sees_no_collision(
        docker_host: str, clones: tuple[DockerDaemon, DockerDaemon], pool: Pool,
        spawn: Callable[..., JobpoolProcess]) -> None:
    """Two daemons with identities of their own, two workers and a supervisor on one of them, a worker on the
    other: every mark is seen where it should be, every job runs, and nothing says "shared"."""
    other = clones[0]
    other.ensure_running()
    other.remove_containers()
    da, db = docker_host, other.host
    assert daemon_identity(da) != daemon_identity(db)
    pool.set_slots(3)
    procs = [spawn(DOCKER_HOST=da), spawn(DOCKER_HOST=da), spawn(DOCKER_HOST=db),
             spawn(module="jobpool.cli", args=("supervisor",), DOCKER_HOST=da)]
    jobs = [pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 600"]).id for _ in range(3)]
    eventually(lambda: all(live_on(da, j) or live_on(db, j) for j in jobs), timeout=60,
               message="three jobs running")
    assert sorted(live_on(da, j) for j in jobs) == [False, True, True], "two on daemon a, one on daemon b"
    pids = {str(q.pid) for q in procs}
    peers = {i: p for i, p in markrecords.read_peers(pool.store).items() if p.pid in pids}
    assert len(peers) == 4 and not markrecords.collisions(peers)
    on_a = [p for p in peers.values() if p.docker_host == da]
    assert all(set(q.id for q in on_a) - {p.id} <= p.verified for p in on_a), "each saw the others' marks"
    status = pool.status()
    assert status.shared_daemons == {} and not any(SHARED in r for r in status.health.reasons)
    assert not any(SHARED in p.log() for p in procs)
    for j in jobs:
        pool.cancel(j)


def test_marks_are_removed_by_their_process_and_once_long_gone(
        docker_host: str, pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    """A worker removes its own mark as it stops; a mark whose process has had no record for GONE_SECS is
    removed by a process on its daemon; a recent one, or one whose process has a record, is kept."""
    long_ago = str(int(time.time() - daemonmark.GONE_SECS - 60))
    marks = {"gone": long_ago, "recent": str(int(time.time())), "alive": long_ago}
    fields = {"daemon_id": "jpd1:" + "c" * 32 + "@elsewhere", "mark": daemonmark.volume_name("alive")}
    pool.store.daemon_mark("alive", 600_000, 6_000_000,
                           [(name, fields.get(name, "")) for name in markrecords.FIELDS])
    with contextlib.closing(docker.DockerClient(base_url=docker_host, timeout=10)) as client:
        for owner, at in marks.items():
            client.api.create_volume(daemonmark.volume_name(owner), labels={
                daemonmark.LABEL_ROLE: daemonmark.ROLE_MARK, "jobpool.pool": pool.keys.pool,
                daemonmark.LABEL_OWNER: owner, daemonmark.LABEL_AT: at})

        def names() -> set[str]:
            found = client.api.volumes(filters={"label": f"{daemonmark.LABEL_ROLE}={daemonmark.ROLE_MARK}"})
            return {v["Name"] for v in found.get("Volumes") or []}

        worker = spawn(DOCKER_HOST=docker_host)
        own = eventually(lambda: [n for n in names() if n.startswith(daemonmark.VOLUME_PREFIX)
                                  and n[len(daemonmark.VOLUME_PREFIX):] not in marks], timeout=20,
                         message="the worker's own mark")
        eventually(lambda: daemonmark.volume_name("gone") not in names(), timeout=20,
                   message="the long gone mark removed")
        assert {daemonmark.volume_name("recent"), daemonmark.volume_name("alive"), *own} <= names()
        # Up, its SIGTERM handler in place (a SIGTERM before RQ's work loop installs it ends the process
        # before its clean-up can run: a crash, whose mark a later process sweeps once it is long gone).
        eventually(lambda: worker.catches(signal.SIGTERM), timeout=20, message="the worker's SIGTERM handler")
        worker.stop()
        assert not set(own) & names(), "the worker's own mark outlived it"
        assert not any(p.mark in own for p in markrecords.read_peers(pool.store).values()), "its record too"
        for owner in ("recent", "alive"):
            client.api.remove_volume(daemonmark.volume_name(owner))
    pool.store.daemon_unmark("alive", fields["daemon_id"])
