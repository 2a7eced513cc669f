"""Evidence: what one sweep knows about the running rows, read with no lock held (there are none).

The first step of a sweep (docs/architecture.md, 'Evidence and verdicts'): every running row's owner,
attempt and lease in one round trip, whole rows only where a decision needs more, the owners' boot records,
RQ's dispatch facts for unclaimed rows, and the probes (one container list per daemon, /proc for subprocess
rows). The result is a `Snapshot`; `verdicts.py` judges it and `apply.py` applies the verdicts,
compare-and-set on this very evidence.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from rq.registry import StartedJobRegistry

from ..api import Pool
from ..contract import RQ_QUEUE_PREFIX
from ..fleet.daemonid import is_identity
from ..redistrust import RedisTrust
from ..registry import wrap_redis_error
from . import remote
from .probes import ContainerProber, Probe, Unknown, probe_process
from .verdicts import EXECUTOR_SUBPROCESS, DispatchFacts, ProbeKind, RowSnapshot, is_stale, probe_needed

log = logging.getLogger("jobpool.supervisor")

_READ_CHUNK = 1000
#: What the first read pass takes of every running row: enough to judge a row whose owner holds its lease.
#: (Its state needs no reading: the scripts keep `running` and the state field in step, and drop the lease
#: when a row leaves running; every other row is read whole, state included, in the second pass.)
_BRIEF = ("owner_boot", "attempt", "claimed_at")


def _chunks(ids: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(ids), _READ_CHUNK):
        yield ids[start:start + _READ_CHUNK]


def run_pipeline(pipe: Any, raise_on_error: bool = True) -> list[Any]:
    """Run a pipeline of sweep reads; with `raise_on_error` False, an error reply of one command is left in
    its place (a key of the wrong type is that row's problem, not the sweep's)."""
    try:
        return list(pipe.execute(raise_on_error=raise_on_error))
    except redis.RedisError as exc:
        raise wrap_redis_error(exc, "sweep read") from None


@dataclass
class Snapshot:
    """One sweep's evidence: the server's time, the rows, whether each owner holds its lease, RQ's facts."""

    now_ms: int
    rows: list[RowSnapshot]
    lease: dict[str, bool]
    dispatch: dict[str, DispatchFacts]
    #: Running ids with no readable row (missing, or not a hash): id -> what is wrong.
    ghosts: dict[str, str] = field(default_factory=dict)
    #: Whether each ghost's lease key still has a TTL (a worker may still hold it).
    ghost_leases: dict[str, bool] = field(default_factory=dict)


class Evidence:
    """Reads the evidence of one pool. Keeps what is learnt between sweeps: whether the server has SORT_RO,
    and when this reader last lost and found Redis again."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.settings = pool.settings
        self._started_key = StartedJobRegistry.key_template.format(pool.keys.rq_queue_name)
        self._sort_ro = True  # until the server says it has no SORT_RO (Redis < 7)
        #: When this reader last lost and found Redis again, and which server answers (jobpool/redistrust.py).
        self.trust = RedisTrust(pool.client, self.settings.lease_secs)
        #: Unclaimed (id, attempt)s RQ holds as taken (intermediate list, started registry): since when this
        #: supervisor has seen them so. A delivery stuck there (its worker died, or Redis rolled back under
        #: it) is only cleared by RQ's maintenance, minutes later; past the claim grace the sweep dispatches
        #: it again.
        self._taken_since: dict[tuple[str, int], float] = {}

    def read(self, job_ids: Iterable[str] | None = None, evict_stale: bool = False) -> Snapshot:
        """All running rows (or just `job_ids`) and their leases; RQ facts for the unclaimed ones; owners'
        boot records for the orphans whose row lacks an executor or daemon id.

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
        unclaimed = {r.id: (r.affinity_queue, r.attempt) for r in rows_out if not r.claimed}
        dispatch = self._dispatch_facts(unclaimed, now_ms)
        return Snapshot(now_ms, rows_out, {r.id: leases[r.id] for r in rows_out}, dispatch, ghosts,
                        self._live_leases(list(ghosts)))

    def probe(self, snap: Snapshot, prober: ContainerProber,
              untrusted: Callable[[], Mapping[str, str]] | None = None) -> dict[str, Probe]:
        """The probes the rows of `snap` need: one container list for all container rows (and the ghosts with
        no lease, by label, any attempt), /proc for subprocess rows. A row recorded on a daemon identity that
        `untrusted` names (identity -> why: two daemons may share it, jobpool/fleet/daemonmark.py; asked only
        when some row needs a container probe) is unknown, judged neither from this supervisor's daemon nor
        from an inventory."""
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
        doubts = untrusted() if untrusted is not None and containers else {}
        for job_id in [j for j, d in daemons.items() if d in doubts]:
            del containers[job_id]
            daemon = daemons.pop(job_id)
            out[job_id] = Unknown(f"daemon {daemon} may not be one daemon: {doubts[daemon]}")
        elsewhere, problem = self._elsewhere(daemons, prober)
        if elsewhere:  # on a daemon this supervisor cannot ask: judged from that daemon's inventory
            invs = remote.read(self.pool, (daemons[j] for j in elsewhere), snap.now_ms)
            judged = remote.judge_all({j: (containers.pop(j), daemons.pop(j)) for j in elsewhere}, invs,
                                      self.settings.inventory_stale_secs, self.settings.lease_secs)
            out.update({j: Unknown(f"{problem}; and its daemon's inventory: {p.reason}")
                        if problem and isinstance(p, Unknown) else p for j, p in judged.items()})
        wanted: dict[str, int | None] = {**containers}
        if self.settings.executor != EXECUTOR_SUBPROCESS:  # a ghost is probed by label, any attempt
            wanted.update({job_id: None for job_id in snap.ghosts if not snap.ghost_leases.get(job_id)})
        out.update(prober.probe(self.pool.keys.pool, wanted, daemons))
        return out

    def _elsewhere(self, daemons: Mapping[str, str], prober: ContainerProber) -> tuple[list[str], str]:
        """The rows recorded on a daemon (an identity) other than the prober's, or on any when the prober's
        own cannot be identified (then also why): with inventories on, they are judged from their daemon's
        inventory. A row with no identity stays with the prober, whose answer names both."""
        if not self.settings.inventory_secs or not daemons:
            return [], ""
        problem = ""
        try:
            ours = prober.daemon_id()
            problem = prober.identity_problem
        except Exception as exc:  # noqa: BLE001 - no daemon here (DOCKER_HOST pointing nowhere): all elsewhere
            ours, problem = "", prober.failed(exc)
        return [job_id for job_id, daemon in daemons.items()
                if is_identity(daemon) and (not ours or daemon != ours)], problem

    # ---- whether a lapsed lease is evidence (docs/architecture.md, 'Rules the verdicts encode, and why')

    def redis_lost(self) -> None:
        """Note that a read found Redis unreachable: once it answers again, leases need a lease to settle."""
        self.trust.lost()

    def redis_recovering(self) -> str:
        """Why leases cannot be trusted to have lapsed on their own just now, or '' (jobpool/redistrust.py:
        the one rule every actor that stops or removes work on Redis's word applies)."""
        return self.trust.settling()

    # ---- the reads ----------------------------------------------------------------------------------------

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

    def _brief_of(self, ids: Sequence[str]) -> list[tuple[str | None, ...]]:
        """The SORT reply's shape for given ids (an operator's one-job call)."""
        if not ids:
            return []
        pipe = self.pool.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(self.pool.keys.job(job_id), _BRIEF)
        pipe.mget([self.pool.keys.lease(job_id) for job_id in ids])
        *rows, leases = run_pipeline(pipe, raise_on_error=False)
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
            for job_id, values in zip(chunk, run_pipeline(pipe, raise_on_error=False), strict=True):
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
        replies = run_pipeline(pipe, raise_on_error=False)
        return {job_id: isinstance(ttl, int) and ttl > 0 for job_id, ttl in zip(ids, replies, strict=True)}

    def _boot_facts(self, rows: Sequence[Mapping[str, str | None]]) -> dict[str, dict[str, str | None]]:
        owners = sorted({str(r["owner_boot"]) for r in rows})
        if not owners:
            return {}
        pipe = self.pool.client.pipeline(transaction=False)
        for boot in owners:
            pipe.hmget(self.pool.keys.boot(boot), ["executor", "daemon_id"])
        replies = run_pipeline(pipe, raise_on_error=False)
        return {boot: {"executor": v[0], "daemon_id": v[1]} for boot, v in zip(owners, replies, strict=True)
                if isinstance(v, list)}

    def _dispatch_facts(self, routes: Mapping[str, tuple[str, int]], now_ms: int) -> dict[str, DispatchFacts]:
        """Whether RQ still holds each unclaimed id (`routes`: id -> the RQ list its row was pushed on, ''
        for the pool's; a daemon's own queue for a checkpoint affinity, and the row's attempt): that queue,
        its intermediate list (taken by a worker that has not started it), or its started registry with an
        unexpired entry. How long it has been seen taken is counted per attempt: a dispatch made again (a new
        attempt) gets a claim grace of its own, though an older delivery's entry may linger in the
        intermediate list (RQ clears it only minutes later) and keep the id "taken" throughout; counted per
        id, every sweep would dispatch it again before any worker could claim it."""
        if not routes:
            return {}
        k = self.pool.keys
        queue_of = {job_id: q or k.rq_queue for job_id, (q, _) in routes.items()}
        started_keys = sorted({self._started_key, *(StartedJobRegistry.key_template.format(
            q[len(RQ_QUEUE_PREFIX):]) for q in queue_of.values() if q != k.rq_queue)})
        pipe = self.pool.client.pipeline(transaction=False)
        for job_id, q in queue_of.items():
            pipe.lpos(q, job_id)
            pipe.lpos(q + ":intermediate", job_id)
        for key in started_keys:
            pipe.zrange(key, 0, -1, withscores=True)
        replies = run_pipeline(pipe)
        positions, registries = replies[:2 * len(queue_of)], replies[2 * len(queue_of):]
        live = {str(entry).split(":", 1)[0] for started in registries for entry, expires in started
                if expires * 1000 >= now_ms}
        facts = {}
        for i, job_id in enumerate(queue_of):
            f = DispatchFacts(positions[2 * i] is not None, positions[2 * i + 1] is not None, job_id in live)
            if f.taken:
                since = self._taken_since.setdefault((job_id, routes[job_id][1]), time.monotonic())
                f = dataclasses.replace(f, taken_secs=time.monotonic() - since)
            facts[job_id] = f
        # Forget what is no longer taken and unclaimed (claimed, ended, back on the queue, a later attempt).
        keep = {(job_id, routes[job_id][1]) for job_id, f in facts.items() if f.taken}
        self._taken_since = {k: v for k, v in self._taken_since.items() if k in keep}
        return facts
