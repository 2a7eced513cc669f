"""The inventory publisher: a thread of the worker's main process that publishes its Docker daemon's
inventory (jobpool/fleet/inventory.py) every `JOBPOOL_INVENTORY_SECS` (docs/architecture.md, "Many hosts").

A supervisor can ask only its own daemon; what it knows of any other daemon comes from here. The workers on
one daemon elect one publisher through Redis (scripts/inventory_lead.lua: the first to ask holds the lead,
renewed with each publication; it lapses with its holder), so a daemon is listed once per period, however
many workers it has. The holder lists the pool's containers in one call and judges each as a supervisor on
that daemon would (supervisor/probes.py `ContainerProber.judge`: an exit that its infrastructure may have
caused is inspected, OOMKilled and a restart of the daemon seen by this publisher included; an ended
container's judgement is kept, since it cannot change).

The holder also does on its daemon the clean-ups a supervisor does on its own one, which a supervisor on
another host cannot: it removes (never forced) a created, never started container whose attempt's lease is
gone, so that "never started" stays true (a launcher that stalls past its lease then finds nothing to start),
an ended container whose job has moved on from that attempt (its exit is recorded, or it never will be), and
now and then the checkpoint volumes of ended jobs (jobpool/supervisor/volumes.py; a job that checkpointed
here and ended on another daemon leaves its volume here).

Every worker (holder or not) also looks, now and then, for earlier boots of its own daemon that are over
(jobpool/fleet/inventory.py, `earlier_boots`) and tells its worker, which then listens on their queues too.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from .. import daemoncommands
from ..contract import LABEL_ATTEMPT, LABEL_BOOT, LABEL_JOB
from ..errors import JobpoolError, RedisUnavailable
from ..exits import OWN
from ..fleet.inventory import CREATED, EXITED, FORGET_MS, RUNNING, UNKNOWN, Entry, earlier_boots, encode
from ..fleet.strays import encode as encode_strays
from ..procid import kernel_boot_id
from ..redistrust import RedisTrust
from ..store.calls import Store
from ..store.replies import DaemonBoots, Lead
from ..supervisor import volumes
from ..supervisor.probes import Absent, ContainerProber, Present, Probe, Unknown
from ..supervisor.stopper import ContainerStopper
from .strays import StrayKeeper, runs

#: How often at most a worker looks for earlier boots of its daemon (three reads, sent with its lead's: a
#: follower's every two or three periods, `InventoryPublisher._lead`).
EARLIER_BOOTS_EVERY_SECS = 5.0

log = logging.getLogger("jobpool.worker")


def entry_of(job_id: str, attempt: int, probe: Probe) -> Entry:
    """How one judged container is written in the inventory."""
    if isinstance(probe, Present) and probe.running:
        return Entry(job_id, attempt, RUNNING, container_id=probe.container_id)
    if isinstance(probe, Present):
        end = probe.ending
        return Entry(job_id, attempt, EXITED, probe.exit_code, probe.container_id,
                     end.cause if end is not None else OWN, end.reason if end is not None else "")
    if isinstance(probe, Absent) and probe.never_started:
        return Entry(job_id, attempt, CREATED, container_id=probe.container_id)
    reason = probe.reason if isinstance(probe, Unknown) else probe.detail
    return Entry(job_id, attempt, UNKNOWN, container_id="", reason=reason[:300])


class InventoryPublisher:
    """Publishes one daemon's inventory for the pool; one per worker process, one holder per daemon."""

    def __init__(self, store: Store, boot_id: str, prober: ContainerProber | None = None,
                 stopper: ContainerStopper | None = None) -> None:
        self.store = store
        self.settings = store.settings
        self.boot_id = boot_id
        self.prober = prober or ContainerProber(None, timeout=self.settings.probe_timeout_secs)
        #: What this publisher does to its daemon's containers, over the prober's client.
        self.stopper = stopper or ContainerStopper(self.prober)
        self.period = self.settings.inventory_secs
        self.lead_ms = int(max(3 * self.period, 1.0) * 1000)
        # Kept well past the stale limit, so a stale inventory still says how old it is.
        self.ttl_ms = int(max(10 * self.settings.inventory_stale_secs, 600) * 1000)
        self._ended: dict[str, Probe] = {}
        #: Container id -> (job id, attempt, launching boot), from the last listing.
        self._labels: dict[str, tuple[str, int, str]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_problem = ""
        self.published = 0
        #: Why this process's daemon is not trusted to be the only one with its identity ('' when it is:
        #: jobpool/fleet/daemonmark.py): while it is not, nothing is published, cleaned up or stopped.
        self.refusal: Callable[[], str] | None = None
        #: Told the daemon's identity once it is established (the worker then listens on its queue too).
        self.on_daemon: Callable[[str], None] | None = None
        #: Told each earlier boot of this daemon found over (the worker then listens on its queue too).
        self.on_earlier_boot: Callable[[str], None] | None = None
        #: Told of one that publishes again (a clone, not an earlier boot): the worker stops reading it.
        self.on_earlier_boot_back: Callable[[str], None] | None = None
        self.earlier: set[str] = set()
        self._boots_at = -math.inf
        #: When a follower last asked which server answers (`trust`): at its first period, then once a lease.
        self._trust_seen_at = -math.inf
        #: For a follower: the daemon and holder it last read, and until when (monotonic) that lead cannot
        #: lapse (`_lead`); its periods before then send nothing to Redis.
        self._following: tuple[str, str, float] | None = None
        #: When each daemon this publisher looked for earlier boots of first published (ms, Redis's clock).
        self._first_ms: dict[str, int] = {}
        self._volumes_at = -math.inf
        #: The rule every clean-up and stop below waits on after Redis restarted or failed over
        #: (jobpool/redistrust.py).
        self.trust = RedisTrust(store, self.settings.lease_secs, fresh=True)
        self.strays = StrayKeeper(store, boot_id, lambda: self.new_prober(), self.trust)  # noqa: PLW0108 - looked up at each call

    def new_prober(self) -> ContainerProber:
        """Another client of this publisher's daemon (the stray stopper's: jobpool/workers/strays.py)."""
        return ContainerProber(self.prober.docker_host, timeout=self.settings.probe_timeout_secs)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="jobpool-inventory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.settings.probe_timeout_secs + 1)
        self.strays.close()
        self.prober.close()

    def _run(self) -> None:
        while True:
            try:
                outcome = self.tick()
            except Exception as exc:  # noqa: BLE001 - Redis or the daemon away: the inventory ages, stays safe
                if isinstance(exc, (RedisUnavailable, redis.RedisError)):
                    self.trust.lost()
                outcome = f"not published: {type(exc).__name__}: {exc}"
            if outcome != self._last_problem and not outcome.startswith(("published", "follower")):
                log.warning("inventory of this worker's docker daemon %s", outcome)
            self._last_problem = "" if outcome.startswith(("published", "follower")) else outcome
            if self._stop.wait(self.period):
                return

    def tick(self) -> str:
        """One period: take or renew the lead; the holder lists, cleans up and publishes."""
        try:
            daemon = self.prober.daemon_id()
        except Exception as exc:  # noqa: BLE001 - the daemon does not answer: nothing to say about it
            return f"not published: {self.prober.failed(exc)}"
        if not daemon:
            return f"not published: {self.prober.identity_problem}"
        refused = self.refusal() if self.refusal is not None else ""
        if refused:
            return f"not published: {refused}"
        if self.on_daemon is not None:
            self.on_daemon(daemon)
        following = self._following
        if following is not None and following[0] == daemon and time.monotonic() < following[2]:
            return f"follower of {following[1]}"
        lead = self._lead(daemon)
        if not lead.held:
            if time.monotonic() - self._trust_seen_at >= self.settings.lease_secs:
                # Which server answers, seen now and then: a follower may hold the lead next, and a server
                # that changed since is then found at its first look as holder, a lease held from there
                # (jobpool/redistrust.py). The first period looks at once, so a change is never its first.
                self._trust_seen_at = time.monotonic()
                self.trust.settling()
            return f"follower of {lead.holder}"
        try:
            # Redis's time before the listing: the inventory is dated by it, so a container created while
            # this listing was taken and published is never read as absent from an inventory younger
            # than a lease (jobpool/supervisor/remote.py).
            listed_at = self.store.now_ms()
            entries = self.entries(self.prober.list_pool(self.store.keys.pool))
        except Exception as exc:  # noqa: BLE001
            return f"not published: {self.prober.failed(exc)}"
        containers, complete = encode(entries)
        launched_by = {cid: labels[2] for cid, labels in self._labels.items()}
        found = self.strays.find(entries, daemon, listed_at, launched_by, lambda cid: runs(self.prober, cid))
        try:
            self.store.publish_inventory(daemon, self.boot_id, kernel_boot_id(), self.lead_ms,
                                         self.ttl_ms, complete, containers, FORGET_MS, listed_at,
                                         encode_strays(found))
        except JobpoolError as exc:
            if isinstance(exc, RedisUnavailable):
                self.trust.lost()
            return f"not published: {exc}"
        self.published += 1
        self.clean_up(entries)
        self.remove_checkpoints()
        self.run_commands(daemon)
        return f"published {len(entries)} containers"

    def _lead(self, daemon: str) -> Lead:
        """The daemon's lead taken, renewed or read, with the look for earlier boots in the same round trip
        when its turn has come (`take_earlier_boots`).

        A follower reads it again only once it could have lapsed (`Lead.lapse_ms`, from the time before this
        read was sent, so no period after a lapse is skipped): a lead is renewed every period and lasts three,
        so a follower reads it every two or three periods instead of every one, and takes a lapsed lead within
        a period of its lapse, as before (an idle fleet's Redis load is mostly such round trips:
        BENCHMARKS.md, "Scale"). Its looks for earlier boots and at which server answers go with those
        reads."""
        sent_at = time.monotonic()
        boots_due = self.on_earlier_boot is not None and sent_at - self._boots_at >= EARLIER_BOOTS_EVERY_SECS
        if boots_due:
            self._boots_at = sent_at
        self._following = None
        try:
            lead = self.store.inventory_lead(daemon, self.boot_id, self.lead_ms, look_boots=boots_due,
                                             boots_before=self._first_ms.get(daemon))
        except RedisUnavailable:
            self.trust.lost()
            raise
        if not lead.held:
            left_ms = self.lead_ms if lead.lapse_ms is None else min(lead.lapse_ms, self.lead_ms)
            self._following = (daemon, lead.holder, sent_at + left_ms / 1000.0)
        if lead.boots is not None:
            self.take_earlier_boots(daemon, lead.boots)
        return lead

    def take_earlier_boots(self, daemon: str, boots: DaemonBoots | Exception) -> None:
        """What a look for earlier boots of this daemon found (see the module; read with the lead, every
        `EARLIER_BOOTS_EVERY_SECS`): each new one is told (`on_earlier_boot`), and one that publishes again
        after all (a clone of the data root, not an earlier boot) is taken back (`on_earlier_boot_back`). A
        read that failed is logged, and the look is tried again at its next turn."""
        if self.on_earlier_boot is None:
            return
        try:
            if isinstance(boots, Exception):
                raise boots
            if not boots.first:
                return  # this boot has not published yet: nothing can be said to precede it
            # Only the daemons silent since before this one's first publication (as last read) were read: an
            # earlier boot is one of them, and the fleet's publishing daemons are not read every look.
            self._first_ms[daemon] = int(boots.first)
            found = set(earlier_boots(daemon, boots.index, int(boots.first), boots.now_ms,
                                      int(self.settings.inventory_stale_secs * 1000)))
            for identity in sorted(found - self.earlier):
                self.on_earlier_boot(identity)
                self.earlier.add(identity)
            for identity in sorted(self.earlier - found):
                if self.on_earlier_boot_back is not None:
                    self.on_earlier_boot_back(identity)
                self.earlier.discard(identity)
        except Exception as exc:  # noqa: BLE001 - a bad index entry: asked again later
            log.info("could not look for earlier boots of this docker daemon (asked again later): %s", exc)

    def remove_checkpoints(self) -> None:
        """Now and then (volumes.EVERY_SECS), the checkpoint volumes of ended jobs on this daemon; not while
        Redis's word settles (jobpool/redistrust.py)."""
        if time.monotonic() - self._volumes_at < volumes.EVERY_SECS or self.trust.settling():
            return
        self._volumes_at = time.monotonic()
        try:
            volumes.remove_leftover_checkpoints(self.store, self.prober.client())
        except Exception as exc:  # noqa: BLE001 - the daemon or Redis away: asked again later
            log.info("could not look for leftover checkpoint volumes (asked again later): %s", exc)

    def run_commands(self, daemon: str) -> None:
        """The commands routed to this daemon (jobpool/daemoncommands.py), done by the lead's holder."""
        try:
            todo = daemoncommands.take(self.store, daemon, self.boot_id)
        except JobpoolError as exc:
            log.info("commands routed to this daemon not taken: %s", exc)
            return
        for cmd in todo:
            daemoncommands.execute(self.store, self.stopper, daemon, cmd, f"worker:{self.boot_id}")

    def entries(self, listed: Sequence[dict[str, Any]]) -> list[Entry]:
        out = []
        seen = set()
        for summary in listed:
            labels = summary.get("Labels") or {}
            cid = str(summary.get("Id", ""))
            try:
                attempt = int(labels.get(LABEL_ATTEMPT, ""))
            except ValueError:
                continue  # not a container jobpool launched
            job_id = str(labels.get(LABEL_JOB, ""))
            if not job_id:
                continue
            seen.add(cid)
            probe = self._ended.get(cid) or self.prober.judge(summary)
            if isinstance(probe, Present) and not probe.running:
                self._ended[cid] = probe
            out.append(entry_of(job_id, attempt, probe))
            self._labels[cid] = (job_id, attempt, str(labels.get(LABEL_BOOT, "")))
        self._ended = {c: p for c, p in self._ended.items() if c in seen}
        self._labels = {c: v for c, v in self._labels.items() if c in seen}
        return out

    def clean_up(self, entries: Sequence[Entry]) -> None:
        """Remove what no one else on another host can: a created container whose attempt's lease is gone,
        and an ended one whose job has moved on from its attempt (never forced: a container started
        meanwhile refuses)."""
        todo = [e for e in entries if e.state in (CREATED, EXITED) and e.container_id]
        if not todo:
            return
        replies = self.store.rows_and_leases([e.job_id for e in todo])
        if self.trust.settling():
            return  # what was read may be what a restart or a failover is about to contradict
        for e, (row, lease) in zip(todo, replies, strict=True):
            if isinstance(row, Exception) or isinstance(lease, Exception):
                continue
            state, attempt = row
            moved_on = state != "running" or attempt != str(e.attempt)
            if e.state == EXITED and not moved_on:
                continue  # its exit is still to be recorded, by its worker or a supervisor
            if e.state == CREATED and not moved_on:
                boot = self._labels.get(e.container_id, ("", 0, ""))[2]
                if not boot or lease == f"{boot}:{e.attempt}":
                    continue  # its launcher holds the lease: it may still start it
            if self.stopper.remove(e.container_id):
                log.info("job %s attempt %d: removed its %s container %s on this daemon", e.job_id,
                         e.attempt, e.state, e.container_id[:12])
