"""Whether this process's Docker daemon is the only one with its identity: marks, compared through Redis.

A daemon's identity (jobpool/fleet/daemonid.py) is `jpd1:<uuid>@<kernel boot id>`, the uuid kept in a volume
on the daemon. Two daemons share it when one's data root is a copy of the other's and both run on one kernel
(several dockerd on a host, Docker-in-Docker, a backup restored onto a second daemon): then one daemon's
listing would speak for the other's containers. Nothing the daemons say tells them apart, so each process that
uses a daemon (a worker, a supervisor's loop) **marks** it with something only that daemon holds: a volume
`jobpool-daemon-mark-<process id>`, made before the process registers in Redis (`daemon_mark:<id>`,
scripts/daemon_mark.lua, with its identity, host, DOCKER_HOST and mark; the script enters it in its identity's
index, `daemon_marks_of:<identity>`, scored by when the record expires). Every period each process lists the
marks on its own daemon and reads who else claims its identity, from that index alone (`judge`): a period
costs Redis what the processes of one identity hold, not the fleet's.

- a live peer's mark is on my daemon, and my mark is on the peer's (the peer says so in its record,
  `verified`): one daemon, trusted;
- a live peer's mark is missing from my daemon, and still missing `CONFIRM_PERIODS` periods later (its owner
  makes its own mark again each period, should a prune have removed it): two daemons share the identity, a
  **collision**, which my record says (`collision`, naming both processes' hosts and sockets) for every peer
  and for `status` to read;
- anything else (I am not registered yet, a peer has not yet seen my mark): not trusted, with the reason.

A collision is **remembered**: the script that writes a record reporting one (scripts/daemon_collision.lua)
also records it in the pool's `shared_daemons` hash (identity -> the line, when, by whom), and it stands
there until an operator clears it (jobpool/fleet/markrecords.py `forget_collision`, `jobpool
forget-collision`) once one of the daemons has an identity of its own. The death of the processes on either
side ends nothing: a clone's containers run on when every jobpool process there died, and the other side's
listing still cannot speak for them. While a collision stands on its identity (or a peer's record, dead or
alive, reports one), a process's daemon is not trusted.

While its daemon is not trusted, a worker takes no job and publishes no inventory (jobpool/workers/), and a
supervisor judges no row recorded on that identity (jobpool/supervisor/evidence.py); every supervisor judges
no row on an identity with a standing or reported collision (markrecords.py `read_collisions`). A process
removes its record and then its mark as it stops; marks whose process has had no record for `GONE_SECS` are
removed by any process on the daemon.

A process of an earlier release (before the per-identity indexes) writes its record and the pool-wide index
only, and reads every record. So that a pool upgraded process by process keeps every comparison both ways,
each period one process (the turn daemon_mark.lua gives) enters the records without `indexed` in their
identity's index (markrecords.py `index_unindexed`, scripts/daemon_mark_index.lua): such a process is read by
the others within a period of its registering. See docs/architecture.md ("The daemon's identity").
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import procid
from ..contract import LABEL_POOL
from ..errors import JobpoolError
from . import daemonid
from .markrecords import (
    FIELDS,
    Peer,
    Standing,
    clear_command,
    describe,
    digest,
    index_unindexed,
    read_peers,
    read_standing,
)

if TYPE_CHECKING:
    from ..store.calls import Store
    from ..store.replies import Marked

log = logging.getLogger("jobpool.daemonmark")

VOLUME_PREFIX = "jobpool-daemon-mark-"
LABEL_ROLE = "jobpool.role"
ROLE_MARK = "daemon-mark"
LABEL_OWNER = "jobpool.mark_of"
LABEL_AT = "jobpool.marked_at"
#: A mark is compared every period: the process's heartbeat, but no oftener than this.
MIN_PERIOD_SECS = 0.5
#: A peer's mark must be missing this many periods before it is a collision: its owner, which makes its own
#: mark again each period, has had a period to do so (a `docker volume prune` removes unused volumes).
CONFIRM_PERIODS = 2
#: A mark whose process has had no record for this long is removed (a process registers right after it
#: marks, so a live one's record is there unless Redis lost it; it marks again each period then).
GONE_SECS = 600.0
#: How often a process looks for marks of processes long gone on its daemon.
SWEEP_GONE_EVERY_SECS = 60.0
def volume_name(process_id: str) -> str:
    return VOLUME_PREFIX + process_id


@dataclass(frozen=True)
class Judgement:
    """One comparison's outcome. `why` is '' when the identity is trusted."""

    why: str
    #: This process's own conclusion that two daemons share its identity ('' if none).
    collision: str
    #: The peers (same identity) whose marks are on this daemon.
    verified: frozenset[str]
    #: Peer id -> when its mark was first found missing (monotonic seconds), for those missing now.
    missing: dict[str, float] = field(default_factory=dict)
    #: A collision on this identity, concluded here, reported by a peer or standing: it lasts until an
    #: operator clears it (`forget_collision`).
    collided: bool = False


def judge(me: str, where: str, ours: str, marks_here: set[str], peers: Mapping[str, Peer],
          missing_since: Mapping[str, float], now: float, confirm_secs: float, registered: bool,
          standing: str = "", gone: frozenset[str] = frozenset()) -> Judgement:
    """Compare the marks on this daemon with the processes claiming its identity `ours` (see the module).

    `registered`: this process's record was written before `peers` was read, so every peer that registers
    after that read sees it (two processes starting at once cannot both miss each other). `standing`: the
    remembered collision on `ours` ('' if none). `gone`: the peers seen dead from here, not waited for (their
    marks neither missed nor awaited); a collision one of them reported still counts."""
    reports = {i: p.collision for i, p in peers.items() if i != me and p.daemon_id == ours and p.collision}
    same = {i: p for i, p in peers.items() if i != me and p.daemon_id == ours and p.mark and i not in gone}
    verified = frozenset(i for i, p in same.items() if p.mark in marks_here)
    missing = {i: missing_since.get(i, now) for i in same if i not in verified}
    confirmed = sorted(i for i, since in missing.items() if now - since >= confirm_secs)
    collision = ""
    if confirmed:
        other = same[confirmed[0]]
        collision = (f"daemon identity {ours} is shared by two docker daemons: {where}, and {other.where()}, "
                     f"whose mark {other.mark} is not on this one (a data root copied onto a second daemon "
                     "on one kernel); no claims and no listing or inventory of that identity are trusted, "
                     "whatever becomes of either side's processes, until one of them has an identity of its "
                     f"own (remove volume {daemonid.VOLUME} there while no job runs on it, restart its "
                     f"jobpool processes) and an operator clears this report: {clear_command(ours)}")
    reported = next((reports[i] for i in sorted(reports)), "")
    unseen = sorted(i for i, p in same.items() if me not in p.verified)
    why = collision or standing or reported
    if not why and not registered:
        why = "this process is not registered with its daemon's mark yet"
    if not why and missing:
        first = same[sorted(missing)[0]]
        why = f"the mark of {first.where()}, which claims this daemon's identity, is not on this daemon (yet)"
    if not why and unseen:
        why = (f"{same[unseen[0]].where()}, which claims this daemon's identity, has not seen this one's "
               "mark yet")
    return Judgement(why, collision, verified, missing, bool(collision or standing or reported))


class Marker:
    """One process's mark on its Docker daemon and its comparison with the fleet's (see the module).

    `refusal()` is what the process's other threads read: '' while its daemon's identity is trusted.
    `start()` marks and registers before anything else, then compares once; a thread compares every period
    until `stop()`, which removes the record and the mark."""

    def __init__(self, store: Store, role: str, process_id: str, docker_host: str | None = None,
                 consequence: str = "") -> None:
        self.store = store
        self.role = role
        self.id = process_id
        self.mark = volume_name(process_id)
        self.docker_host = daemonid.effective_docker_host(docker_host)
        self._given_host = docker_host
        self.consequence = consequence
        settings = store.settings
        self.period = max(settings.heartbeat_secs, MIN_PERIOD_SECS)
        self.ttl_ms = int(max(settings.lease_secs, 4 * self.period) * 1000)
        self.timeout = settings.probe_timeout_secs
        self.host = socket.gethostname()
        self.where = describe(role, os.getpid(), self.host, self.docker_host)
        self._process = json.dumps(procid.identity_of(os.getpid()))
        self.daemon_id = ""
        self.marked = False
        self._why = "this process has not compared its daemon's marks yet"
        self._collision = ""
        self._collided = False
        self._verified: frozenset[str] = frozenset()
        self._missing: dict[str, float] = {}
        self._client: Any = None
        self._gone_at = -float("inf")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The processes found in this identity's index at the last round: their records are read with the
        #: refresh of this one's (`_refresh_and_read`).
        self._peer_ids: tuple[str, ...] = ()
        #: Their records as last read (the round reads one again only when its `v` changed).
        self._peer_records: dict[str, dict[str, str]] = {}
        self._logged = ""
        #: Whether a round has succeeded yet (until then, not trusted).
        self._compared = False
        #: Until when this process's record, written by the last round that succeeded, surely lives
        #: (monotonic): trusted no longer without another (`refusal`).
        self._fresh_until = -float("inf")

    # ---- what the other threads read ----------------------------------------------------------------

    def refusal(self) -> str:
        """Why this process's daemon is not trusted now ('' when it is). Past its record's life since the
        last round that refreshed it began (`_fresh_until`), not trusted whatever the round thread is doing
        (a round hung on a dead connection fails no round): its peers may no longer see it."""
        if not self._why and time.monotonic() > self._fresh_until:
            return (f"its daemon's marks not compared for as long as its record lives "
                    f"({self.ttl_ms / 1000:g}s)")
        return self._why

    def collided(self) -> bool:
        """Whether two daemons share this process's daemon identity (concluded here or reported by a peer)."""
        return self._collided

    # ---- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Mark, register, compare once (so a process with no peer is trusted at once), then every period."""
        self.round()
        self._thread = threading.Thread(target=self._run, name="jobpool-daemon-mark", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.round()

    def stop(self) -> None:
        """Remove the record, then the mark (so no peer reads a live record whose mark is gone)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 1)
        try:
            self.store.daemon_unmark(self.id, self.daemon_id)
        except JobpoolError as exc:
            log.warning("could not remove this process's daemon mark record: %s", exc)
        if self.marked:
            try:
                self._docker().api.remove_volume(self.mark)
            except Exception as exc:  # noqa: BLE001 - left for a later process's sweep of gone marks
                if "no such volume" not in str(exc).lower():
                    log.warning("could not remove this process's mark %s from its daemon: %s", self.mark, exc)
        self._close()

    # ---- one comparison -----------------------------------------------------------------------------

    def round(self) -> None:
        """One period: list the marks on this daemon (making this process's own if missing), register, read
        the peers and judge. A round that fails (the daemon or Redis away) keeps the last verdict: what the
        marks said has not changed, and nothing can be claimed or judged without them anyway (a launch meets
        the daemon's fault: jobpool/workers/hostcheck.py). Until a first round succeeds, not trusted; nor
        once none has for as long as this process's record lives (its peers may no longer see it, and a
        daemon that took its identity since would go unseen), whatever fails them."""
        try:
            why = self._round()
        except Exception as exc:  # noqa: BLE001 - Redis or the daemon away: the last verdict stands
            if not isinstance(exc, JobpoolError):
                self._close()  # the daemon's: a new client next period
            if self._compared:
                log.debug("%s: daemon marks not compared this period: %s", self.where, exc)
                why = self.refusal()  # the last verdict, or past the record's life the deadline's (said once)
                if not why:
                    return
            else:
                text = " ".join(str(exc).split())[:300]
                why = f"its daemon's marks could not be compared ({type(exc).__name__}: {text})"
                self._why, self._collided = why, False
        else:
            self._compared = True
        self._say(why)

    def _round(self) -> str:
        began = time.monotonic()  # the record this round writes lives at least ttl from here
        client = self._docker()
        try:
            ours = daemonid.establish(client, self._given_host)
        except daemonid.IdentityUnavailable as exc:
            self._why, self._collided = f"its daemon's identity cannot be established: {exc}", False
            return self._why
        listed = client.api.volumes(filters={"label": f"{LABEL_ROLE}={ROLE_MARK}"}).get("Volumes") or []
        here = {str(v.get("Name", "")) for v in listed}
        if self.mark not in here:
            if self.marked:
                log.warning("%s: its mark %s was removed from its daemon (a volume prune?); made again",
                            self.where, self.mark)
            client.api.create_volume(self.mark, labels={
                LABEL_ROLE: ROLE_MARK, LABEL_POOL: self.store.keys.pool, LABEL_OWNER: self.id,
                LABEL_AT: str(int(time.time()))})
            here.add(self.mark)
        self.marked = True
        if ours != self.daemon_id:
            self._new_identity(ours)
        peers, standing, refreshed, registered = self._refresh_and_read(ours)
        # Seen dead from here: not waited for. A collision stands whatever becomes of the processes.
        gone = frozenset(i for i, p in peers.items() if i != self.id and p.daemon_id == ours and p.gone())
        j = judge(self.id, self.where, ours, here, peers, self._missing, time.monotonic(),
                  CONFIRM_PERIODS * self.period, registered, standing, gone)
        written = (self._verified, self._collision)
        self._missing, self._verified, self._collision = j.missing, j.verified, j.collision
        self._collided = j.collided
        if j.why:
            self._why = j.why  # refused at once, whether or not the write below goes through
        if not refreshed or (j.verified, j.collision) != written:
            self._register()  # the new verdict said now, not a period later: a peer waits on `verified`
        self._why = j.why
        self._fresh_until = began + self.ttl_ms / 1000
        if time.monotonic() - self._gone_at >= SWEEP_GONE_EVERY_SECS:
            self._gone_at = time.monotonic()
            self._remove_gone(client, listed, peers)
        return j.why

    def _new_identity(self, ours: str) -> None:
        """This process's daemon answers with another identity (its identity volume made anew, as the fix of
        a shared identity asks): nothing judged of the old one carries over, or the old verdict and report
        would be written under the new identity at its first round (a collision recorded on an identity
        nobody shares)."""
        self.daemon_id, self._missing, self._peer_ids, self._peer_records = ours, {}, (), {}
        self._verified, self._collision, self._collided = frozenset(), "", False
        self._why = f"its daemon answers with a new identity {ours}, not compared yet"

    def _refresh_and_read(self, ours: str) -> tuple[dict[str, Peer], str, bool, bool]:
        """The records of the other processes claiming `ours` and the standing collision on it; whether this
        process's record was refreshed before they were read; and whether it was there when they were read
        (`judge`'s `registered`: every peer registering after the read sees it). With no collision reported
        here, one
        script (scripts/daemon_mark_round.lua) writes the record as the last verdict left it, then reads the
        processes found last period (one whose read failed is read whole next period, as one new to the
        index, which is read in one more round trip). A process reporting a collision reads only, and
        writes after judging (the round's caller), through daemon_collision.lua, which records the report:
        written first, a report an operator has just cleared would be recorded again."""
        if self._collision:
            remembered = read_standing(self.store, ours).get(ours)
            everyone = read_peers(self.store, ours)  # its own record too: lost with a Redis that restarted?
            peers = {i: p for i, p in everyone.items() if i != self.id}
            return peers, remembered.line if remembered else "", False, self.id in everyone
        known = self._peer_records
        got = self.store.daemon_mark_round(self.id, self.ttl_ms, 10 * self.ttl_ms, self._fields(),
                                           int(self.period * 1000),
                                           [(i, known.get(i, {}).get("v", "")) for i in self._peer_ids])
        self._after_mark(got.marked)
        if not got.complete:  # more processes claim this identity than one call reads: all read apart
            peers = {i: p for i, p in read_peers(self.store, ours).items() if i != self.id}
            self._peer_ids, self._peer_records = (), {}
            return peers, Standing.parse(got.standing).line if got.standing else "", True, True
        records: dict[str, Any] = {i: known[i] for i in got.unchanged if i in known}
        records.update(got.records)
        new = [i for i in got.ids if i not in records and i != self.id]
        if new:
            records.update(zip(new, self.store.daemon_mark_records(new), strict=True))
        self._peer_ids = tuple(i for i in got.ids if i != self.id)
        self._peer_records = {i: r for i, r in records.items() if i in self._peer_ids and isinstance(r, dict)}
        peers = {i: Peer.from_record(i, r) for i, r in self._peer_records.items()
                 if r.get("daemon_id") == ours}
        standing = Standing.parse(got.standing).line if got.standing else ""
        return peers, standing, True, True

    def _fields(self) -> list[tuple[str, str]]:
        values = {"role": self.role, "host": self.host, "pid": str(os.getpid()),
                  "docker_host": self.docker_host, "daemon_id": self.daemon_id, "mark": self.mark,
                  "verified": " ".join(sorted(self._verified)), "collision": self._collision,
                  "process": self._process}
        values["v"] = digest(values)
        return [(name, values[name]) for name in FIELDS]

    def _register(self) -> None:
        self._after_mark(self.store.daemon_mark(self.id, self.ttl_ms, 10 * self.ttl_ms, self._fields(),
                                                int(self.period * 1000)))

    def _after_mark(self, marked: Marked) -> None:
        if marked.scan:
            try:
                index_unindexed(self.store)
            except JobpoolError as exc:  # the next holder of the turn does it
                log.info("could not index the daemon marks of earlier releases: %s", exc)

    def _remove_gone(self, client: Any, listed: list[dict[str, Any]], peers: Mapping[str, Peer]) -> None:
        """Marks of this pool on this daemon whose process has had no record for GONE_SECS (never a live
        one's: a live process has a record, and marks again each period should it lose its mark)."""
        now = time.time()
        for v in listed:
            labels = v.get("Labels") or {}
            owner = str(labels.get(LABEL_OWNER, ""))
            try:
                at = float(labels.get(LABEL_AT, ""))
            except ValueError:
                continue
            if labels.get(LABEL_POOL) != self.store.keys.pool or not owner or owner == self.id:
                continue
            if owner in peers or now - at < GONE_SECS:
                continue
            if self.store.daemon_mark_exists(owner):
                continue  # registered since the read above
            try:
                client.api.remove_volume(str(v.get("Name")))
                log.info("removed the daemon mark of process %s, gone", owner)
            except Exception as exc:  # noqa: BLE001 - tried again later
                log.info("could not remove the daemon mark of process %s: %s", owner, exc)

    def _say(self, why: str) -> None:
        """One line when the verdict changes: a collision as an error naming both, the rest as info."""
        if why == self._logged:
            return
        previous, self._logged = self._logged, why
        if why and self._collided:
            log.error("%s: %s%s", self.where, why, f"; {self.consequence}" if self.consequence else "")
        elif why:
            log.info("%s: daemon not trusted yet: %s", self.where, why)
        elif previous:
            log.info("%s: daemon %s trusted: every process claiming its identity has its mark on it",
                     self.where, self.daemon_id)

    def _docker(self) -> Any:
        if self._client is None:
            import docker  # here: a subprocess-only deployment never loads the SDK

            self._client = docker.DockerClient(base_url=self.docker_host, timeout=self.timeout)
        return self._client

    def _close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None
