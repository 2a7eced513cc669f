"""Live logs with real processes: a worker on the test dockerd (and one running local processes) sends what a
job prints to Redis as it runs, and `jobpool logs -f`, another process that reaches only Redis, prints it as
it comes and ends when the job ends: whole, in order, across the worker's death and another's adoption, and
bounded when a job prints as fast as it can (what was skipped is said, the worker keeps its lease, Redis
holds about the cap).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import docker

from jobpool import AsyncPool, JobState, Pool
from jobpool.contract import LIVE_LOG_CAP_BYTES, LIVE_LOG_IDLE_SECS, LIVE_LOG_RATE_BYTES
from jobpool.livelogs import pieces
from jobpool.supervisor import Supervisor
from tests.support.constants import IMAGE, SUB
from tests.support.job_containers import started
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess

#: Prints `started`, then `tick 1` .. `tick N` every 0.2 s, then `finished`.
TICKS = ('echo started; i=0; while [ $i -lt {n} ]; do i=$((i+1)); echo "tick $i"; sleep 0.2; done; '
         'echo finished')


def expected(n: int) -> list[str]:
    return ["started", *(f"tick {i}" for i in range(1, n + 1)), "finished"]


def follow(spawn: Callable[..., JobpoolProcess], job_id: str) -> JobpoolProcess:
    """`jobpool logs -f JOB` in a process of its own, its output in its log file."""
    return spawn("jobpool.cli", ("logs", "-f", job_id))


def printed(follower: JobpoolProcess) -> list[str]:
    return follower.log().splitlines()


def ended(follower: JobpoolProcess) -> list[str]:
    """What the follower printed, once it ended by itself (the job ended), with exit code 0."""
    assert follower.wait(60) == 0, follower.log()
    return printed(follower)


def test_a_running_jobs_output_is_followed_from_another_process_until_it_ends(
        pool: Pool, pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    job = pool.enqueue(IMAGE, ["sh", "-c", TICKS.format(n=25)])
    follower = follow(spawn, job.id)  # before it runs: it waits for the first line
    spawn()
    eventually(lambda: "tick 1" in printed(follower), timeout=60, message="the first lines, live")
    assert pool.get(job.id).state is JobState.RUNNING  # printed while the job runs on

    async def so_far() -> str:
        async with AsyncPool.from_env(env=pool_env) as apool:
            return await apool.logs(job.id)
    # Read without following, too, by Pool and by AsyncPool: what it printed so far.
    assert pool.logs(job.id).startswith("started\ntick 1\n")
    assert asyncio.run(so_far()).startswith("started\ntick 1\n")
    assert ended(follower) == expected(25)
    assert pool.get(job.id).state is JobState.SUCCEEDED
    assert pool.logs(job.id).splitlines() == expected(25)  # then the row's tail: the same


def test_a_job_on_local_processes_is_followed_the_same_and_by_asyncio(
        sub_pool: Pool, pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess]) -> None:
    job = sub_pool.enqueue("ignored", ["sh", "-c", TICKS.format(n=15)])
    follower = follow(spawn, job.id)
    followed: list[str] = []

    async def follow_async() -> None:
        async with AsyncPool.from_env(env=pool_env) as apool:
            async for line in apool.follow_logs(job.id):
                followed.append(line)
    reader = threading.Thread(target=asyncio.run, args=(follow_async(),))
    reader.start()
    spawn(**SUB)
    eventually(lambda: "tick 1" in printed(follower) and "tick 1" in followed, timeout=60,
               message="the first lines, live, in both")
    assert sub_pool.get(job.id).state is JobState.RUNNING
    assert ended(follower) == expected(15)
    reader.join(60)
    assert not reader.is_alive() and followed == expected(15)


def test_the_log_goes_on_across_the_workers_death_and_an_adoption(
        pool: Pool, spawn: Callable[..., JobpoolProcess], dclient: docker.DockerClient,
        sup: Supervisor) -> None:
    job = pool.enqueue(IMAGE, ["sh", "-c", TICKS.format(n=60)])
    follower = follow(spawn, job.id)
    worker = spawn()
    eventually(lambda: started(dclient, job.id) and "tick 5" in printed(follower), timeout=60,
               message="the job printing, followed")
    first_owner = pool.get(job.id).owner_boot
    worker.kill_with_children()  # its container prints on: nobody sends it for a while
    eventually(lambda: not pool.store.client.exists(pool.keys.lease(job.id)), timeout=10,
               message="the dead worker's lease lapsed")
    assert sup.sweep().verdicts == {"adopt": 1}
    spawn()
    eventually(lambda: pool.get(job.id).owner_boot not in ("", first_owner), timeout=30, message="adopted")
    # Every line once, in order: the adopter went on from where the dead worker's last append ended.
    assert ended(follower) == expected(60)
    assert "adopted" in [e["reason"] for e in pool.events(job.id)]


def test_a_log_nobody_reads_is_sent_every_ten_seconds_and_read_whole_at_the_end(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    job = pool.enqueue(IMAGE, ["sh", "-c", TICKS.format(n=60)])  # about 12 s
    spawn()
    assert pool.wait(job.id, timeout=120).state is JobState.SUCCEEDED
    appends = pieces(pool.store.log_after(job.id, 0, 1000))
    # One read after LIVE_LOG_IDLE_SECS, one at the end: far fewer appends than seconds it ran.
    assert 1 <= len(appends) <= 2 + int(12 / LIVE_LOG_IDLE_SECS), [(p.start, p.end) for p in appends]
    assert "".join(p.text for p in appends).splitlines() == expected(60)


FLOOD = ("echo before; sleep 2; timeout 5 yes 'a line printed as fast as the job can, again and again'; "
         "echo after; sleep 2; echo end")


def test_a_job_printing_as_fast_as_it_can_is_bounded_and_says_what_was_skipped(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    job = pool.enqueue(IMAGE, ["sh", "-c", FLOOD])
    follower = follow(spawn, job.id)
    # A lease of 3 s (the tests' is 1 s): a heartbeat held behind the log's reads for seconds still lapses
    # it; a loaded host's scheduling hiccup does not.
    spawn(JOBPOOL_LEASE_SECS="3")
    eventually(lambda: "before" in printed(follower), timeout=60, message="the job started")
    lease, log_key = pool.keys.lease(job.id), pool.keys.job_log(job.id)
    held, lapsed = 0, []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the flood: the worker keeps its lease, Redis about the cap
        if not pool.store.client.exists(lease):
            lapsed.append(time.monotonic())
        held = max(held, sum(len(p.text.encode()) for p in pieces(pool.store.log_after(job.id, 0, 10_000))))
        time.sleep(0.05)
    assert not lapsed, "the worker's lease lapsed while its job flooded its output"
    assert 0 < held <= LIVE_LOG_CAP_BYTES + LIVE_LOG_RATE_BYTES + 1024
    lines = ended(follower)
    # The job's own last lines: `yes`, stopped by `timeout`, may leave half a line before "after".
    assert (lines[0], lines[-2][-5:], lines[-1]) == ("before", "after", "end"), lines[:3] + lines[-3:]
    skipped = [line for line in lines if line.startswith("[jobpool: live log: ")]
    assert skipped and all("skipped" in line for line in skipped), skipped[:3]
    # What reached Redis came at most about one read's worth a second: far less than the job printed.
    assert pieces(pool.store.log_after(job.id, 0, 10_000))[-1].end < 10 * (LIVE_LOG_RATE_BYTES + 1024)
    assert pool.get(job.id).state is JobState.SUCCEEDED
    assert pool.store.client.ttl(log_key) > 0  # lingers after the end, then goes


def test_a_line_longer_than_a_read_is_said_skipped_and_the_log_goes_on(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    """Docker cuts a line into 16 KiB pieces, all stamped with the line's first time, and takes its `tail`
    before `since`: a 6 MB line is more pieces of one stamp than a read takes. The live log says that lines
    were skipped, and goes on with the lines after it while the job still runs."""
    job = pool.enqueue(IMAGE, ["sh", "-c", "echo before; sleep 2; head -c 6000000 /dev/zero | tr '\\0' x; "
                                           "echo; echo after; sleep 3; echo end"])
    follower = follow(spawn, job.id)
    spawn()
    eventually(lambda: "after" in printed(follower), timeout=60, message="the lines after the long one")
    assert pool.get(job.id).state is JobState.RUNNING
    lines = ended(follower)
    assert (lines[0], lines[-2:]) == ("before", ["after", "end"]), lines[:2] + lines[-3:]
    assert any(line.startswith("[jobpool: live log: ") and "skipped" in line for line in lines), [
        line[:80] for line in lines]

