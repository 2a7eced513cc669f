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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rq.registry import StartedJobRegistry

from ..contract import RQ_QUEUE_PREFIX
from ..fleet.daemonid import is_identity
from ..redistrust import RedisTrust
from ..store.calls import Store
from . import remote
from .probes import ContainerProber, Probe, Unknown, probe_process
from .verdicts import EXECUTOR_SUBPROCESS, Brief, DispatchFacts, ProbeKind, RowSnapshot, probe_needed

log = logging.getLogger("jobpool.supervisor")

#: What the first read pass takes of every running row: enough to judge a row whose owner holds its lease.
#: (Its state needs no reading: the scripts keep `running` and the state field in step, and drop the lease
#: when a row leaves running; every other row is read whole, state included, in the second pass.)
_BRIEF = ("owner_boot", "attempt", "claimed_at")


@dataclass
class Snapshot:
    """One sweep's evidence: the server's time, the rows to judge, whether each owner holds its lease, RQ's
    facts; and the rows kept on their lease alone (`held`)."""

    now_ms: int
    #: The rows a verdict needs more than a held lease to judge (lease gone, never claimed, past the stale
    #: limit), each with `lease` saying whether its owner's lease is held.
    rows: list[RowSnapshot]
    lease: dict[str, bool]
    dispatch: dict[str, DispatchFacts]
    #: Running ids with no readable row (missing, or not a hash): id -> what is wrong.
    ghosts: dict[str, str] = field(default_factory=dict)
    #: Whether each ghost's lease key still has a TTL (a worker may still hold it).
    ghost_leases: dict[str, bool] = field(default_factory=dict)
    #: The rows whose owner holds its lease and that are not past the stale limit, as the first pass read
    #: them. Their verdict is `keep` whatever else is true of them (verdicts.decide), so nothing more is read
    #: or made for them: the common case of a large fleet costs one comparison a row.
    held: list[Brief] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Every running row read (ghosts aside)."""
        return len(self.rows) + len(self.held)


class Evidence:
    """Reads the evidence of one pool. Keeps what is learnt between sweeps: whether the server has SORT_RO,
    and when this reader last lost and found Redis again."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.settings = store.settings
        self._started_key = StartedJobRegistry.key_template.format(store.keys.rq_queue_name)
        #: When this reader last lost and found Redis again, and which server answers (jobpool/redistrust.py).
        self.trust = RedisTrust(store, self.settings.lease_secs)
        #: Unclaimed (id, attempt)s RQ holds as taken (intermediate list, started registry): since when this
        #: supervisor has seen them so. A delivery stuck there (its worker died, or Redis rolled back under
        #: it) is only cleared by RQ's maintenance, minutes later; past the claim grace the sweep dispatches
        #: it again.
        self._taken_since: dict[tuple[str, int], float] = {}

    def read(self, job_ids: Iterable[str] | None = None, evict_stale: bool = False) -> Snapshot:
        """All running rows (or just `job_ids`) and their leases; RQ facts for the unclaimed ones; owners'
        boot records for the orphans whose row lacks an executor or daemon id.

        Two passes keep a healthy pool cheap: every row's owner, attempt and times with its lease first, then
        the whole row only where a decision needs more (lease gone, never claimed, or an eviction to do). A
        row whose owner holds its lease and that is not past the stale limit is `held` after the first pass:
        one comparison, no object made.
        """
        store = self.store
        now_ms, found = store.running_brief(_BRIEF, job_ids is None)
        if job_ids is not None:
            found = store.brief_of(list(dict.fromkeys(job_ids)), _BRIEF)
        stale_secs, executor = self.settings.job_stale_seconds, self.settings.executor
        held: list[Brief] = []
        brief: dict[str, tuple[str | None, str | None]] = {}  # the others: id -> (owner, attempt) as read
        snaps: dict[str, RowSnapshot] = {}
        leases: dict[str, bool] = {}
        need = []
        for brief_row in found:
            job_id, owner, attempt, claimed_at, lease = brief_row
            holds = bool(owner) and lease == f"{owner}:{attempt}"
            if holds:
                # verdicts.is_stale, inline (this loop runs once a row): an unreadable time is not stale.
                try:
                    stale = bool(claimed_at) and (now_ms - int(claimed_at)) / 1000.0 > stale_secs
                except ValueError:
                    stale = False
                if not stale:
                    held.append(brief_row)  # verdicts.decide: keep, the lease is held
                    continue
            brief[job_id] = (owner, attempt)
            leases[job_id] = holds
            snap = RowSnapshot.brief(job_id, owner, attempt, claimed_at, executor)
            if not holds or evict_stale:
                need.append(job_id)
            else:
                snaps[job_id] = snap  # a stale live job: warned about from these fields alone
        full, ghosts = self._full_rows(need)
        boots = self._boot_facts([r for r in full.values() if r.get("owner_boot") and not leases[str(r["id"])]
                                  and not (r.get("executor") and r.get("daemon_id"))])
        for job_id, row in full.items():
            if (row.get("owner_boot"), row.get("attempt")) != brief[job_id]:
                continue  # claimed, adopted or re-dispatched between the passes: judged next sweep
            boot = boots.get(row.get("owner_boot") or "")
            snaps[job_id] = RowSnapshot.from_row(row, executor, boot)
        rows_out = [snaps[job_id] for job_id in brief if job_id in snaps]
        unclaimed = {r.id: (r.affinity_queue, r.attempt) for r in rows_out if not r.claimed}
        dispatch = self._dispatch_facts(unclaimed, now_ms)
        return Snapshot(now_ms, rows_out, {r.id: leases[r.id] for r in rows_out}, dispatch, ghosts,
                        store.live_leases(list(ghosts)), held)

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
            invs = remote.read(self.store, (daemons[j] for j in elsewhere), snap.now_ms)
            judged = remote.judge_all({j: (containers.pop(j), daemons.pop(j)) for j in elsewhere}, invs,
                                      self.settings.inventory_stale_secs, self.settings.lease_secs)
            out.update({j: Unknown(f"{problem}; and its daemon's inventory: {p.reason}")
                        if problem and isinstance(p, Unknown) else p for j, p in judged.items()})
        wanted: dict[str, int | None] = {**containers}
        if self.settings.executor != EXECUTOR_SUBPROCESS:  # a ghost is probed by label, any attempt
            wanted.update({job_id: None for job_id in snap.ghosts if not snap.ghost_leases.get(job_id)})
        out.update(prober.probe(self.store.keys.pool, wanted, daemons))
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

    def _full_rows(self, ids: Sequence[str]) -> tuple[dict[str, dict[str, str | None]], dict[str, str]]:
        """The whole rows of `ids` still running, and the ghosts among them: ids whose key is missing or
        not a hash (judged by `decide_ghost`). A row that cannot be read otherwise is skipped and logged:
        one bad row must not stop the sweep of the others."""
        out: dict[str, dict[str, str | None]] = {}
        ghosts: dict[str, str] = {}
        for job_id, values in self.store.row_fields(ids, RowSnapshot.FIELDS):
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

    def _boot_facts(self, rows: Sequence[Mapping[str, str | None]]) -> dict[str, dict[str, str | None]]:
        owners = sorted({str(r["owner_boot"]) for r in rows})
        return {boot: {"executor": v[0], "daemon_id": v[1]}
                for boot, v in self.store.boot_fields(owners, ["executor", "daemon_id"]).items()}

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
        k = self.store.keys
        queue_of = {job_id: q or k.rq_queue for job_id, (q, _) in routes.items()}
        started_keys = sorted({self._started_key, *(StartedJobRegistry.key_template.format(
            q[len(RQ_QUEUE_PREFIX):]) for q in queue_of.values() if q != k.rq_queue)})
        held, registries = self.store.rq_holds(queue_of, started_keys)
        live = {str(entry).split(":", 1)[0] for started in registries for entry, expires in started
                if expires * 1000 >= now_ms}
        facts = {}
        for job_id, (queued, taken) in held.items():
            f = DispatchFacts(queued, taken, job_id in live)
            if f.taken:
                since = self._taken_since.setdefault((job_id, routes[job_id][1]), time.monotonic())
                f = dataclasses.replace(f, taken_secs=time.monotonic() - since)
            facts[job_id] = f
        # Forget what is no longer taken and unclaimed (claimed, ended, back on the queue, a later attempt).
        keep = {(job_id, routes[job_id][1]) for job_id, f in facts.items() if f.taken}
        self._taken_since = {k: v for k, v in self._taken_since.items() if k in keep}
        return facts
