"""The sweep: reconcile every running row against ground truth, then promote (ADR-152, DESIGN.md section 5).

One sweep reads all running rows and their leases in a few pipelined round trips, then takes the evidence the
rows need (one container list per daemon, /proc for subprocess rows, RQ's lists for unclaimed rows) with no
lock held (there are none), then applies each verdict with `reconcile_apply`, compare-and-set on the evidence
it was based on. A row that moved on meanwhile (its worker heartbeat, finished, or another supervisor got
there first) answers `Conflict` and is left alone, which is what makes two supervisors at once safe.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from rq import Queue
from rq.connections import parse_connection
from rq.exceptions import DuplicateJobError
from rq.job import Job as RQJob
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from .. import errors
from ..api import CANDIDATES_ON_RELEASE, Pool
from ..config import Settings
from ..keys import worker_name
from ..registry import wrap_redis_error
from .probes import Absent, ContainerProber, Probe, Unknown, probe_process
from .report import Decision, SweepReport
from .verdicts import (
    APPLIED_KINDS,
    EXECUTOR_SUBPROCESS,
    DispatchFacts,
    Kind,
    ProbeKind,
    RowSnapshot,
    Verdict,
    decide,
    decide_ghost,
    expected_state,
    hold_while_recovering,
    is_stale,
    probe_needed,
)

log = logging.getLogger("jobpool.supervisor")

#: The RQ function a live worker runs to re-attach to an orphaned running container (jobpool.workers).
ADOPT_ENTRY_POINT = "jobpool.workers.entry.adopt_job"
#: An adoption request still waiting for a worker: do not ask again. A "started" one is pending only while
#: the worker running it lives (a SIGKILLed adopter leaves "started" behind for good).
ADOPT_WAITING = frozenset({"queued", "deferred", "scheduled", "created"})
#: How long the pointer to the latest adoption request of a job is kept.
ADOPT_REQUEST_TTL_SECS = 86400
_READ_CHUNK = 1000
#: What the first read pass takes of every running row: enough to judge a row whose owner holds its lease.
#: (Its state needs no reading: the scripts keep `running` and the state field in step, and drop the lease
#: when a row leaves running; every other row is read whole, state included, in the second pass.)
_BRIEF = ("owner_boot", "attempt", "claimed_at")


def _chunks(ids: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(ids), _READ_CHUNK):
        yield ids[start:start + _READ_CHUNK]


def adopt_rq_job_id(job_id: str, attempt: int) -> str:
    """A fresh RQ job id for one adoption request. Never reused: RQ's registries still name an earlier
    request (a dead adopter's stays in the started registry until RQ cleans it up, which would fail a new
    request that had the same id)."""
    return f"jobpool-adopt-{job_id}-{attempt}-{uuid.uuid4().hex[:12]}"


@dataclass
class _Snapshot:
    now_ms: int
    rows: list[RowSnapshot]
    lease: dict[str, bool]
    dispatch: dict[str, DispatchFacts]
    #: Running ids with no readable row (missing, or not a hash): id -> what is wrong.
    ghosts: dict[str, str] = field(default_factory=dict)
    #: Whether each ghost's lease key still has a TTL (a worker may still hold it).
    ghost_leases: dict[str, bool] = field(default_factory=dict)


def _actor() -> str:
    return f"supervisor:{socket.gethostname()}:{os.getpid()}"


class Supervisor:
    """Sweeps one pool. Holds what is worth keeping between sweeps: the Docker client and an RQ connection."""

    def __init__(self, pool: Pool, prober: ContainerProber | None = None, actor: str | None = None) -> None:
        self.pool = pool
        self.settings: Settings = pool.settings
        self.prober = prober or ContainerProber(os.environ.get("DOCKER_HOST") or None,
                                                timeout=pool.settings.probe_timeout_secs)
        self.actor = actor or _actor()
        self._rq_client: redis.Redis | None = None
        self._started_key = StartedJobRegistry.key_template.format(pool.keys.rq_queue_name)
        self._sort_ro = True  # until the server says it has no SORT_RO (Redis < 7)
        self._redis_lost = False
        self._redis_back_at: float | None = None

    def close(self) -> None:
        self.prober.close()
        if self._rq_client is not None:
            self._rq_client.close()
            self._rq_client = None

    # ---- evidence -----------------------------------------------------------------------------------

    def _read(self, job_ids: Iterable[str] | None, evict_stale: bool = False) -> _Snapshot:
        """All running rows and their leases; RQ facts for the unclaimed ones; owners' boot records for the
        orphans whose row lacks an executor or daemon id.

        Two passes keep a healthy pool cheap: every row's owner, attempt and times with its lease first, then
        the whole row only where a decision needs more (lease gone, never claimed, or an eviction to do).
        """
        replies = self._read_running(job_ids is None)
        secs, micros = replies[0]
        now_ms = int(secs) * 1000 + int(micros) // 1000
        found = replies[1] if job_ids is None else self._brief_of(list(job_ids))
        brief: dict[str, dict[str, str | None]] = {}
        leases: dict[str, bool] = {}
        for member, owner, attempt, claimed_at, lease in found:
            job_id = str(member)
            brief[job_id] = {"owner_boot": owner, "attempt": attempt, "claimed_at": claimed_at}
            leases[job_id] = bool(owner) and lease == f"{owner}:{attempt}"
        snaps: dict[str, RowSnapshot] = {}
        need = []
        for job_id, b in brief.items():
            snap = RowSnapshot.brief(job_id, b["owner_boot"], b["attempt"], b["claimed_at"],
                                     self.settings.executor)
            if not leases[job_id] or (evict_stale and is_stale(snap, now_ms, self.settings)):
                need.append(job_id)
            else:
                snaps[job_id] = snap
        full, ghosts = self._full_rows(need)
        boots = self._boot_facts([r for r in full.values() if r.get("owner_boot") and not leases[str(r["id"])]
                                  and not (r.get("executor") and r.get("daemon_id"))])
        for job_id, row in full.items():
            b = brief[job_id]
            if (row.get("owner_boot"), row.get("attempt")) != (b["owner_boot"], b["attempt"]):
                continue  # claimed, adopted or re-dispatched between the passes: judged next sweep
            boot = boots.get(row.get("owner_boot") or "")
            snaps[job_id] = RowSnapshot.from_row(row, self.settings.executor, boot)
        rows_out = [snaps[job_id] for job_id in brief if job_id in snaps]
        dispatch = self._dispatch_facts([r.id for r in rows_out if not r.claimed], now_ms)
        return _Snapshot(now_ms, rows_out, {r.id: leases[r.id] for r in rows_out}, dispatch, ghosts,
                         self._live_leases(list(ghosts)))

    def _read_running(self, all_rows: bool) -> list[Any]:
        """The server's time and, with `all_rows`, every running row's brief fields and lease, as tuples.

        One command reads them all: SORT_RO ... BY nosort GET reads each member's hash fields and lease (the
        patterns carry the pool's hash tag, so they stay in the key's cluster slot). SORT_RO, not SORT: SORT
        counts as a write (it can STORE), so a replica or a server at its memory limit refuses it, and the
        sweep must read there too. Redis 6.2 has no SORT_RO; there plain SORT is used."""
        k = self.pool.keys
        get = ["#", *(f"{k.job('*')}->{f}" for f in _BRIEF), k.lease("*")]
        pipe = self.pool.client.pipeline(transaction=False)
        pipe.time()
        if all_rows:
            # By hand: redis-py's `sort_ro()` (8.1) sends a plain SORT.
            args = [k.running, "BY", "nosort", *(a for g in get for a in ("GET", g))]
            pipe.execute_command("SORT_RO" if self._sort_ro else "SORT", *args)
        try:
            replies = list(pipe.execute())
        except redis.ResponseError as exc:
            if self._sort_ro and "unknown command" in str(exc).lower():
                self._sort_ro = False
                return self._read_running(all_rows)
            raise wrap_redis_error(exc, "sweep read") from None
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, "sweep read") from None
        if all_rows:
            flat, width = replies[1], len(get)
            replies[1] = [tuple(flat[i:i + width]) for i in range(0, len(flat), width)]
        return replies

    def _redis_recovering(self) -> str:
        """Why leases cannot be trusted to have lapsed on their own just now, or ''.

        A lease also lapses while Redis is away (restarted, or out of this supervisor's reach), and a worker
        then holds a result it could not write (an exit code it retries until Redis answers). For one lease
        after Redis is back, a lapsed lease is no proof that its worker is gone."""
        lease = self.settings.lease_secs
        if self._redis_lost:
            self._redis_lost, self._redis_back_at = False, time.monotonic()
        if self._redis_back_at is not None and time.monotonic() - self._redis_back_at < lease:
            return f"this supervisor reached redis again {time.monotonic() - self._redis_back_at:.1f}s ago"
        try:
            uptime = int(self.pool.client.info("server").get("uptime_in_seconds", lease + 1))
        except (redis.RedisError, ValueError, TypeError):
            return ""
        if uptime < lease:
            return f"redis-server started {uptime}s ago"
        return ""

    def _brief_of(self, ids: Sequence[str]) -> list[tuple[str | None, ...]]:
        """The SORT reply's shape for given ids (an operator's one-job call)."""
        if not ids:
            return []
        pipe = self.pool.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(self.pool.keys.job(job_id), _BRIEF)
        pipe.mget([self.pool.keys.lease(job_id) for job_id in ids])
        *rows, leases = self._exec(pipe, raise_on_error=False)
        if isinstance(leases, Exception):
            leases = [None] * len(ids)
        return [(job_id, *(row if isinstance(row, list) else [None] * len(_BRIEF)), lease)
                for job_id, row, lease in zip(ids, rows, leases, strict=True)]

    def _full_rows(self, ids: Sequence[str]) -> tuple[dict[str, dict[str, str | None]], dict[str, str]]:
        """The whole rows of `ids` still running, and the ghosts among them: ids whose key is missing or
        not a hash (judged by `decide_ghost`). A row that cannot be read otherwise is skipped and logged:
        one bad row must not stop the sweep of the others."""
        out: dict[str, dict[str, str | None]] = {}
        ghosts: dict[str, str] = {}
        for chunk in _chunks(ids):
            pipe = self.pool.client.pipeline(transaction=False)
            for job_id in chunk:
                pipe.hmget(self.pool.keys.job(job_id), RowSnapshot.FIELDS)
            for job_id, values in zip(chunk, self._exec(pipe, raise_on_error=False), strict=True):
                if isinstance(values, Exception):
                    if str(values).startswith("WRONGTYPE"):
                        ghosts[job_id] = "its row key is not a hash"
                    else:
                        log.error("job %s: its row could not be read (%s); not judged", job_id, values)
                    continue
                row = dict(zip(RowSnapshot.FIELDS, values, strict=True))
                if all(v is None for v in values):
                    ghosts[job_id] = "its row is missing"
                elif row.get("id") != job_id:
                    log.error("job %s: its row names job %r; not judged", job_id, row.get("id"))
                elif row.get("state") == "running":
                    out[job_id] = row
        return out, ghosts

    def _live_leases(self, ids: Sequence[str]) -> dict[str, bool]:
        """Whether each id's lease key still has a TTL (any value: a ghost has no owner to compare with)."""
        if not ids:
            return {}
        pipe = self.pool.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.pttl(self.pool.keys.lease(job_id))
        replies = self._exec(pipe, raise_on_error=False)
        return {job_id: isinstance(ttl, int) and ttl > 0 for job_id, ttl in zip(ids, replies, strict=True)}

    def _exec(self, pipe: Any, raise_on_error: bool = True) -> list[Any]:
        """Run a pipeline; with `raise_on_error` False, an error reply of one command is left in its place
        (a key of the wrong type is that row's problem, not the sweep's)."""
        try:
            return list(pipe.execute(raise_on_error=raise_on_error))
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, "sweep read") from None

    def _boot_facts(self, rows: Sequence[Mapping[str, str | None]]) -> dict[str, dict[str, str | None]]:
        owners = sorted({str(r["owner_boot"]) for r in rows})
        if not owners:
            return {}
        pipe = self.pool.client.pipeline(transaction=False)
        for boot in owners:
            pipe.hmget(self.pool.keys.boot(boot), ["executor", "daemon_id"])
        replies = self._exec(pipe, raise_on_error=False)
        return {boot: {"executor": v[0], "daemon_id": v[1]} for boot, v in zip(owners, replies, strict=True)
                if isinstance(v, list)}

    def _dispatch_facts(self, ids: Sequence[str], now_ms: int) -> dict[str, DispatchFacts]:
        """Whether RQ still holds each unclaimed id: its queue, its intermediate list (taken by a worker
        that has not started it), or its started registry with an unexpired entry."""
        if not ids:
            return {}
        k = self.pool.keys
        pipe = self.pool.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.lpos(k.rq_queue, job_id)
            pipe.lpos(k.rq_intermediate, job_id)
        pipe.zrange(self._started_key, 0, -1, withscores=True)
        *positions, started = self._exec(pipe)
        live = {str(entry).split(":", 1)[0] for entry, expires in started if expires * 1000 >= now_ms}
        return {job_id: DispatchFacts(positions[2 * i] is not None, positions[2 * i + 1] is not None,
                                      job_id in live) for i, job_id in enumerate(ids)}

    def _probe(self, snap: _Snapshot) -> dict[str, Probe]:
        containers: dict[str, int] = {}
        daemons: dict[str, str] = {}
        out: dict[str, Probe] = {}
        for row in snap.rows:
            need = probe_needed(row, snap.lease[row.id])
            if need is ProbeKind.CONTAINER:
                containers[row.id] = row.attempt
                daemons[row.id] = row.daemon_id
            elif need is ProbeKind.PROCESS:
                out[row.id] = probe_process(row.identity)
        wanted: dict[str, int | None] = {**containers}
        if self.settings.executor != EXECUTOR_SUBPROCESS:  # a ghost is probed by label, any attempt
            wanted.update({job_id: None for job_id in snap.ghosts if not snap.ghost_leases.get(job_id)})
        out.update(self.prober.probe(self.pool.keys.pool, wanted, daemons))
        return out

    # ---- the sweep ----------------------------------------------------------------------------------

    def sweep(self, evict_stale: bool = False, dry_run: bool = False,
              job_ids: Iterable[str] | None = None) -> SweepReport:
        """Reconcile every running row (or just `job_ids`), then promote; returns what was decided."""
        started = time.perf_counter()
        try:
            snap = self._read(job_ids, evict_stale)
        except errors.RedisUnavailable:
            self._redis_lost = True
            raise
        recovering = self._redis_recovering()
        t_read = time.perf_counter()
        probes = self._probe(snap)
        t_probe = time.perf_counter()
        report = SweepReport(self.pool.keys.pool, at_ms=snap.now_ms, rows=len(snap.rows), dry_run=dry_run)
        decided = [(row, probes.get(row.id)) for row in snap.rows]
        verdicts = [decide(row, snap.lease[row.id], probe, snap.dispatch.get(row.id), snap.now_ms,
                           self.settings, evict_stale=evict_stale) for row, probe in decided]
        verdicts = [hold_while_recovering(v, recovering) for v in verdicts]
        pending: set[str] = set()
        if not dry_run:
            pending = self._pending_adoptions([row for (row, _), v in zip(decided, verdicts, strict=True)
                                               if v.kind is Kind.ADOPT])
        for (row, probe), verdict in zip(decided, verdicts, strict=True):
            decision = Decision(row.id, row.attempt, row.owner_boot, verdict,
                                expected_state(row, verdict, self.settings))
            report.record(decision, isinstance(probe, Unknown))
            if dry_run:
                decision.outcome = "not applied (dry run)"
                continue
            decision.outcome = self._apply(row, verdict, probe, pending)
            if decision.outcome == "conflict":
                report.conflicts += 1
        self._judge_ghosts(snap, probes, report, evict_stale, dry_run)
        t_apply = time.perf_counter()
        if not dry_run:
            report.promoted = self.pool.promote()
        done = time.perf_counter()
        report.duration_ms = (done - started) * 1000
        report.phases_ms = {"read": (t_read - started) * 1000, "probe": (t_probe - t_read) * 1000,
                            "apply": (t_apply - t_probe) * 1000, "promote": (done - t_apply) * 1000}
        if not dry_run and job_ids is None:
            self._write_last_sweep(report)
        log.info("%s", report.line())
        return report

    def _judge_ghosts(self, snap: _Snapshot, probes: Mapping[str, Probe], report: SweepReport,
                      evict_stale: bool, dry_run: bool) -> None:
        for job_id, why in snap.ghosts.items():
            probe = probes.get(job_id)
            verdict = decide_ghost(why, snap.ghost_leases.get(job_id, False), probe, self.settings.executor,
                                   evict_stale=evict_stale)
            row = RowSnapshot(id=job_id, attempt=0)
            decision = Decision(job_id, 0, "", verdict, expected_state(row, verdict, self.settings))
            report.record(decision, isinstance(probe, Unknown))
            if dry_run:
                decision.outcome = "not applied (dry run)"
            elif verdict.kind is Kind.DROP:
                decision.outcome = self._drop_ghost(job_id, verdict)
                report.conflicts += decision.outcome == "conflict"
            else:
                log.warning("running id %s has no readable row: %s", job_id, verdict.evidence)
                decision.outcome = "kept"

    def _drop_ghost(self, job_id: str, verdict: Verdict) -> str:
        k = self.pool.keys
        try:
            reply = self.pool.run("drop_ghost", [k.job(job_id), k.lease(job_id),
                                                 *self.pool.candidates(CANDIDATES_ON_RELEASE)],
                                  [job_id, verdict.evidence, self.actor])
        except errors.Conflict:
            return "conflict"
        except errors.RedisUnavailable:
            raise
        except errors.JobpoolError as exc:
            log.error("running id %s: dropping it failed: %s", job_id, exc)
            return f"error: {exc}"
        if not reply[1]:
            return "conflict"  # it left `running` meanwhile
        log.warning("running id %s had no readable row and no work left: dropped, slot freed (%s)", job_id,
                    verdict.evidence)
        return "dropped"

    def _write_last_sweep(self, report: SweepReport) -> None:
        try:
            self.pool.client.set(self.pool.keys.last_sweep, json.dumps(report.summary(), sort_keys=True))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise errors.RedisUnavailable(f"redis unreachable: {exc}") from None

    def _apply(self, row: RowSnapshot, verdict: Verdict, probe: Probe | None, pending: set[str]) -> str:
        try:
            if verdict.kind in APPLIED_KINDS:
                return self._reconcile_apply(row, verdict, probe)
            if verdict.kind is Kind.ADOPT:
                if verdict.stale:
                    log.warning("job %s (attempt %d) kept, adoption asked: running past the stale limit (%s)",
                                row.id, row.attempt, verdict.evidence)
                if row.id in pending:
                    return "adoption pending"
                return self.request_adoption(row)
            if verdict.kind is Kind.WARN:
                log.warning("job %s (attempt %d) kept: %s: %s", row.id, row.attempt, verdict.reason,
                            verdict.evidence)
                return "kept"
            if verdict.kind is Kind.EVICT:
                return self._evict(row, verdict)
            return "kept"
        except errors.RedisUnavailable:
            raise
        except errors.JobpoolError as exc:
            log.error("job %s: applying %s failed: %s", row.id, verdict.kind, exc)
            return f"error: {exc}"

    def _reconcile_apply(self, row: RowSnapshot, verdict: Verdict, probe: Probe | None) -> str:
        never_started = isinstance(probe, Absent) and probe.never_started and bool(probe.container_id)
        if never_started and not self.prober.remove(probe.container_id):  # type: ignore[union-attr]
            # A launcher that stalled between create and start may still start it: "never started" holds
            # only once the container can no longer be started, so it goes first. Not forced: Docker orders
            # the remove and a start in flight, and a container started meanwhile refuses a plain remove;
            # then the slot stays and the next sweep finds its lease renewed.
            log.warning("job %s attempt %d kept: its created container %s could not be removed (started "
                        "meanwhile?)", row.id, row.attempt, probe.container_id[:12])  # type: ignore[union-attr]
            return "kept"
        k = self.pool.keys
        keys = [k.job(row.id), k.lease(row.id), k.rq_job(row.id),
                *self.pool.candidates(CANDIDATES_ON_RELEASE)]
        args = [row.id, row.attempt, row.owner_boot, row.container_id, verdict.kind.value, verdict.reason,
                "" if verdict.exit_code is None else verdict.exit_code, self.settings.recovery_budget,
                verdict.evidence, self.actor]
        try:
            reply = self.pool.run("reconcile_apply", keys, args)
        except errors.Conflict:
            log.debug("job %s moved on since its evidence was taken; %s not applied", row.id, verdict.kind)
            return "conflict"
        except errors.NotFound:
            return "conflict"
        state = str(reply[1])
        log.info("job %s attempt %d: %s -> %s (%s)", row.id, row.attempt, verdict.kind, state,
                 verdict.evidence)
        # The exit code is on the row now; the ended container is the supervisor's to clean up, as its
        # dead watcher would have.
        if verdict.kind is Kind.EXITED and verdict.container_id:
            self.prober.remove(verdict.container_id)
        return state

    # ---- adoption -----------------------------------------------------------------------------------

    def _rq(self) -> redis.Redis:
        """RQ needs a client that does not decode replies; built the way RQ rebuilds connections."""
        if self._rq_client is None:
            cls, conn_cls, kwargs = parse_connection(self.pool.client)
            kwargs = {**kwargs, "decode_responses": False}
            self._rq_client = cls(connection_pool=redis.ConnectionPool(connection_class=conn_cls, **kwargs))
        return self._rq_client

    def _pending_adoptions(self, rows: Sequence[RowSnapshot]) -> set[str]:
        """Ids of the rows whose latest adoption request still waits for a worker, or is being run by a
        worker that lives (two round trips, plus one for the boots of "started" ones)."""
        if not rows:
            return set()
        conn = self._rq()
        pipe = conn.pipeline(transaction=False)
        for row in rows:
            pipe.get(self.pool.keys.adoption(row.id))
        requests = {row.id: r.decode() for row, r in zip(rows, self._exec(pipe), strict=True) if r}
        if not requests:
            return set()
        pipe = conn.pipeline(transaction=False)
        for rq_id in requests.values():
            pipe.hmget(RQJob.key_for(rq_id), ["status", "worker_name"])
        found = {job_id: [v.decode() if v else "" for v in reply]
                 for job_id, reply in zip(requests, self._exec(pipe), strict=True)}
        pending = {job_id for job_id, (status, _) in found.items() if status in ADOPT_WAITING}
        started = {job_id: worker for job_id, (status, worker) in found.items() if status == "started"}
        live = self._live_workers(set(started.values()))
        return pending | {job_id for job_id, worker in started.items() if worker in live}

    def _live_workers(self, names: set[str]) -> set[str]:
        """Which of these RQ worker names belong to a jobpool worker whose boot record lives. RQ's own worker
        key outlives a SIGKILLed worker by its worker_ttl (minutes); the boot record by one lease."""
        if not names:
            return set()
        boots = [str(b) for b in self.pool.client.zrange(self.pool.keys.boots, 0, -1)]
        by_name = {worker_name(self.pool.keys.pool, b): b for b in boots}
        mine = {n: by_name[n] for n in names if n in by_name}
        if not mine:
            return set()
        pipe = self.pool.client.pipeline(transaction=False)
        for boot in mine.values():
            pipe.exists(self.pool.keys.boot(boot))
        return {n for n, alive in zip(mine, self._exec(pipe), strict=True) if alive}

    def request_adoption(self, row: RowSnapshot) -> str:
        """Ask a live worker to re-attach to this orphan's running container, unless a request is pending.

        The supervisor never writes ownership: the worker's `adopt` is a compare-and-set refused while the
        old owner's lease exists. Each request is a new RQ job; `adoption(job)` names the latest, and the
        WATCH on it makes two supervisors asking at once enqueue one request.
        """
        if row.id in self._pending_adoptions([row]):
            return "adoption pending"
        rq_id = adopt_rq_job_id(row.id, row.attempt)
        conn = self._rq()
        pointer = self.pool.keys.adoption(row.id)
        try:
            with conn.pipeline() as pipe:
                pipe.watch(pointer)  # type: ignore[no-untyped-call]  # redis-py leaves watch() unannotated
                before = pipe.get(pointer)
                pipe.multi()
                pipe.set(pointer, rq_id, ex=ADOPT_REQUEST_TTL_SECS)
                pipe.execute()
            if before is not None and before.decode() != rq_id:
                # A request that ended or whose worker died: drop its hash so it cannot be run late.
                conn.delete(RQJob.key_for(before.decode()))
            Queue(self.pool.keys.rq_queue_name, connection=conn, serializer=JSONSerializer).enqueue_call(
                func=ADOPT_ENTRY_POINT, args=[row.id, row.owner_boot, row.attempt], job_id=rq_id,
                timeout=-1, result_ttl=600, failure_ttl=600, unique=True,
                description=f"jobpool adopt {row.id} attempt {row.attempt} from {row.owner_boot}",
            )
        except (redis.WatchError, DuplicateJobError):
            return "adoption pending"  # another supervisor asked in the same moment
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise errors.RedisUnavailable(f"redis unreachable: {exc}") from None
        log.info("job %s attempt %d: owner %s gone, container running: adoption requested (%s)",
                 row.id, row.attempt, row.owner_boot, rq_id)
        return "adoption requested"

    # ---- operator overrides -------------------------------------------------------------------------

    def _evict(self, row: RowSnapshot, verdict: Verdict) -> str:
        """Stop a stale live job by container label, then fail it `stale_evicted` (operator only)."""
        if row.executor == EXECUTOR_SUBPROCESS:
            log.error("job %s: evicting a subprocess job; jobpool never signals a pid it did not start in "
                      "this boot: its owner %s must stop it, or, if that worker is gone, stop the process "
                      "by hand "
                      "(recorded identity %s)", row.id, row.owner_boot, row.identity or "none")
        else:
            ok, why = self.prober.same_daemon(row.daemon_id)
            if not ok:
                # Stopping "by label" here would stop nothing on the daemon where it runs; evicting anyway
                # would hand its slot on while it still writes.
                log.error("job %s: not evicted: its container cannot be stopped from here: %s", row.id, why)
                return f"error: not evicted: {why}"
            try:
                stopped = self.prober.stop_by_label(self.pool.keys.pool, row.id, row.attempt,
                                                    self.settings.stop_grace_secs)
            except Exception as exc:  # noqa: BLE001 - not stopped means not evicted: the slot stays
                log.error("job %s: not evicted: its container could not be stopped: %s", row.id, exc)
                return f"error: container not stopped: {exc}"
            log.warning("job %s: stopped %d container(s) by label to evict it: %s", row.id, len(stopped),
                        ", ".join(c[:12] for c in stopped) or "none running")
        try:
            job = self.pool.evict(row.id, row.attempt, reason=verdict.reason, evidence=verdict.evidence,
                                  actor=self.actor)
        except errors.Conflict:
            return "conflict"
        except errors.InvalidState as exc:
            return f"ended meanwhile as {exc.state}"
        return job.state.value


# ---- the public entry points --------------------------------------------------------------------------
