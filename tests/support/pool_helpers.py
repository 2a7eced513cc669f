"""What the unit tests share: Redis backends (fakeredis[lua] or a real server, each seen through a text and a
bytes client) and short helpers over `Pool` and `Attempt`. The keyspace snapshot (tests/support/snapshot.py)
and the claim helper (tests/support/attempts.py) are shared with the integration tests.

Kept out of conftest.py so test modules can import these by name.
"""

from __future__ import annotations

from typing import Any, cast

import fakeredis
import redis

from jobpool.api import Pool
from jobpool.config import Settings
from jobpool.models import Job, JobState
from jobpool.workers.attempt import Attempt
from tests.support.attempts import claim
from tests.support.snapshot import Snapshot, keyspace


class Backend:
    """One Redis (fake or real) seen through a text client (what `Pool` uses) and a bytes client (`raw`)."""

    def __init__(self, name: str, client: redis.Redis, raw: redis.Redis) -> None:
        self.name, self.client, self.raw = name, client, raw

    def pool(self, **settings: Any) -> Pool:
        """A `Pool` on this backend; `settings` go to `Settings` (e.g. ``max_concurrent_jobs=3``)."""
        return Pool(self.client, Settings(**settings))

    def keyspace(self) -> Snapshot:
        return keyspace(self.raw)


def fake_backend() -> Backend:
    server = fakeredis.FakeServer()
    # encoding_errors="replace" as in jobpool.store.redisurl.connect: a log tail need not be UTF-8.
    client = fakeredis.FakeRedis(server=server, decode_responses=True, encoding_errors="replace")
    return Backend("fakeredis", client, fakeredis.FakeRedis(server=server))


def enqueue(pool: Pool, *command: str, **kw: Any) -> Job:
    return pool.enqueue(image="busybox", command=list(command) or ["true"], **kw)


# redis-py types every reply as bytes or str whatever the client; `Pool`'s client decodes (api.connect), so
# the reads below are cast to the text they are.


def row(pool: Pool, job_id: str) -> dict[str, str]:
    return cast("dict[str, str]", pool.store.client.hgetall(pool.keys.job(job_id)))


def state_of(pool: Pool, job_id: str) -> str:
    return pool.get(job_id).state.value


def index_of(pool: Pool, job_id: str) -> list[str]:
    """The names of every state index that holds `job_id` (exactly one, always)."""
    client = pool.store.client
    return [s.value for s in JobState if client.zscore(pool.keys.state_index(s.value), job_id) is not None]


def queued_ids(pool: Pool) -> list[str]:
    return cast("list[str]", pool.store.client.zrange(pool.keys.queued, 0, -1))


def running_ids(pool: Pool) -> set[str]:
    return set(cast("list[str]", pool.store.client.zrange(pool.keys.running, 0, -1)))


def rq_list(pool: Pool) -> list[str]:
    return cast("list[str]", pool.store.client.lrange(pool.keys.rq_queue, 0, -1))


def rq_hash(backend: Backend, pool: Pool, job_id: str) -> dict[bytes, bytes]:
    return cast("dict[bytes, bytes]", backend.raw.hgetall(pool.keys.rq_job(job_id)))


def events_of(pool: Pool, job_id: str | None = None) -> list[dict[str, str]]:
    return pool.events(job_id, count=100_000)


def last_event(pool: Pool, job_id: str) -> dict[str, str]:
    return events_of(pool, job_id)[-1]


def assert_event(ev: dict[str, str], job_id: str, frm: str, to: str, reason: str, **more: str) -> None:
    got = {k: ev[k] for k in ("job", "from", "to", "reason", *more)}
    assert got == {"job": job_id, "from": frm, "to": to, "reason": reason, **more}
    assert int(ev["at"]) > 0


def paused_pool(backend: Backend, n: int, slots: int = 1, **kw: Any) -> tuple[Pool, list[Job]]:
    """A pool with `n` queued jobs (promotion paused while enqueueing), unpaused again, nothing promoted."""
    pool = backend.pool(max_concurrent_jobs=slots, **kw)
    pool.pause(None, reason="setup")
    jobs = [enqueue(pool, "job", str(i)) for i in range(n)]
    backend.client.delete(pool.keys.paused)  # unpause without promoting
    return pool, jobs


def lease(pool: Pool, job_id: str) -> str | None:
    return cast("str | None", pool.store.client.get(pool.keys.lease(job_id)))


def reconcile(pool: Pool, job_id: str, verdict: str, reason: str = "orphan_reconciled_no_container",
              code: str = "", budget: int = 0, **expect: Any) -> list[Any]:
    """Apply a supervisor verdict with the row's current values as the evidence (unless overridden)."""
    r = row(pool, job_id)
    attempt = expect.get("attempt", r["attempt"])
    owner = expect.get("owner", r.get("owner_boot", ""))
    cid = expect.get("container_id", r.get("container_id", ""))
    keys = [pool.keys.job(job_id), pool.keys.lease(job_id), pool.keys.rq_job(job_id),
            *pool.store.candidates(4)]
    if verdict == "redispatch":  # promotes nothing: takes the RQ list the row routes to (reconcile_apply.lua)
        keys[3:] = [expect.get("route", r.get("affinity_queue") or pool.keys.rq_queue)]
    args = [job_id, attempt, owner, cid, verdict, reason, code, budget, "probe:absent", "supervisor"]
    return pool.store.run("reconcile_apply", keys, args)


def orphan(backend: Backend, pool: Pool, job_id: str, boot: str = "boot-a") -> Attempt:
    """Claim and launch a job, then let its lease vanish (its worker died)."""
    att = claim(pool, job_id, boot)
    att.set_container("cid-1", "daemon-1")
    backend.client.delete(pool.keys.lease(job_id))
    return att


def placement(pool: Pool) -> dict[str, Any]:
    """Where the running jobs are placed, as the scripts keep it (scripts/_lib.lua `place_running`): each
    owner's ids (sorted), each daemon's count and ids, and what each job was placed as."""
    c = pool.store.client
    by = cast("dict[str, str]", c.hgetall(pool.keys.running_by))
    members = cast("list[str]", c.zrange(pool.keys.running_on, 0, -1))
    on: dict[str, list[str]] = {}
    for m in members:
        daemon, job_id = m.split(" ")
        on.setdefault(daemon, []).append(job_id)
    counts = cast("dict[str, str]", c.hgetall(pool.keys.running_daemons))
    return {"owned": {k[2:]: sorted(v.split(" ")) for k, v in by.items() if k.startswith("b:")},
            "as": {k[2:]: v for k, v in by.items() if k.startswith("j:")},
            "counts": {d: int(n) for d, n in counts.items()},
            "on": {d: sorted(ids) for d, ids in on.items()},
            "other": sorted(k for k in by if not k.startswith(("b:", "j:")))}


def placement_recount(pool: Pool) -> dict[str, Any]:
    """The same, counted again from the rows of every job in `running`: a claimed row under its owner and the
    daemon its claim or launch recorded, an unclaimed one under its affinity (none for a value holding
    whitespace, as the scripts place it)."""
    c = pool.store.client
    ids = cast("list[str]", c.zrange(pool.keys.running, 0, -1))
    pipe = c.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(pool.keys.job(job_id), "state", "owner_boot", "daemon_id", "affinity")
    owned: dict[str, list[str]] = {}
    on: dict[str, list[str]] = {}
    placed_as: dict[str, str] = {}
    for job_id, (state, owner_boot, daemon_id, affinity) in zip(ids, pipe.execute(), strict=True):
        if state != "running":
            continue
        owner, daemon = ("" if any(ch.isspace() for ch in v) else v
                         for v in (owner_boot or "", (daemon_id if owner_boot else affinity) or ""))
        if owner:
            owned.setdefault(owner, []).append(job_id)
        if daemon:
            on.setdefault(daemon, []).append(job_id)
        if owner or daemon:
            placed_as[job_id] = f"{owner} {daemon}"
    return {"owned": {b: sorted(v) for b, v in owned.items()}, "as": placed_as,
            "counts": {d: len(v) for d, v in on.items()}, "on": {d: sorted(v) for d, v in on.items()},
            "other": []}
