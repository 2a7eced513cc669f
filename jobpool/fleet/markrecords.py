"""The fleet's records of the processes that marked their Docker daemons, in Redis, and their reads: what
jobpool/fleet/daemonmark.py's comparison writes and reads each period, what `status` and the supervisors read
(`read_peers`, `read_collisions`, `read_standing`), and an operator's clear of a collision
(`forget_collision`). The rule that judges them and the process that marks its daemon are daemonmark.py's;
the scripts that write the records are scripts/daemon_mark*.lua, daemon_collision.lua, daemon_unmark.lua and
forget_collision.lua (docs/architecture.md, "The daemon's identity").

A record (`daemon_mark:<process id>`, hash + TTL) lives as long as its process refreshes it; its identity's
index (`daemon_marks_of:<identity>`) holds it by when it expires, and `shared_daemons` remembers a collision
until an operator clears it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import procid
from ..errors import InvalidArgument
from . import daemonid

if TYPE_CHECKING:
    from ..store.calls import HasStore, Store

#: The record's fields, as scripts/daemon_mark.lua writes them (with `at`, Redis's time). `v` is a digest of
#: the others (`digest`): a comparing process reads a peer's record again only when it changed
#: (scripts/daemon_mark_round.lua).
FIELDS = ("role", "host", "pid", "docker_host", "daemon_id", "mark", "verified", "collision", "process", "v")


def digest(values: Mapping[str, str]) -> str:
    """`v` of a record whose other fields are `values`: any change of them changes it."""
    text = json.dumps([values.get(name, "") for name in FIELDS if name != "v"])  # one text per record
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


@dataclass(frozen=True)
class Peer:
    """A live process that marked its daemon, as its record says."""

    id: str
    role: str = ""
    host: str = ""
    pid: str = ""
    docker_host: str = ""
    daemon_id: str = ""
    mark: str = ""
    verified: frozenset[str] = frozenset()
    collision: str = ""
    #: The process's identity (jobpool/procid.py, JSON): one seen dead from here is not waited for, though
    #: its record has not expired yet (a worker restarted after a crash need not wait for it); a collision it
    #: reported still counts (and stands in `shared_daemons` anyway).
    process: str = ""

    @classmethod
    def from_record(cls, process_id: str, rec: Mapping[str, str]) -> Peer:
        return cls(process_id, rec.get("role", ""), rec.get("host", ""), rec.get("pid", ""),
                   rec.get("docker_host", ""), rec.get("daemon_id", ""), rec.get("mark", ""),
                   frozenset(rec.get("verified", "").split()), rec.get("collision", ""),
                   rec.get("process", ""))

    def gone(self) -> bool:
        """Whether this process is seen dead from here (never guessed: another kernel or pid namespace, or
        no readable identity, is not gone)."""
        try:
            ident = json.loads(self.process)
        except ValueError:
            return False
        return isinstance(ident, dict) and procid.same_process_alive(ident) is False

    def where(self) -> str:
        return describe(self.role, self.pid, self.host, self.docker_host)


def describe(role: str, pid: Any, host: str, docker_host: str) -> str:
    return f"{role or 'process'} pid {pid} on host {host} at DOCKER_HOST {docker_host}"


def read_peers(store: Store, identity: str | None = None) -> dict[str, Peer]:
    """Every live process's record (one read of the index, one pipelined read of the records); with
    `identity`, those in that identity's index only (scripts/daemon_mark.lua), which holds every live record
    naming it: what a process comparing its marks needs, at a cost in its identity's processes, not the
    fleet's. A record there that names another identity now (its process moved) is left out."""
    ids = store.daemon_mark_ids() if identity is None else store.daemon_mark_ids_of(identity)
    if not ids:
        return {}
    replies = store.daemon_mark_records(ids)
    return {i: Peer.from_record(i, r) for i, r in zip(ids, replies, strict=True)
            if isinstance(r, dict) and r and (identity is None or r.get("daemon_id") == identity)}


def index_unindexed(store: Store) -> int:
    """Enter in their identity's index the live records that lack one: those of processes of an earlier
    release (before the per-identity indexes), which compare against every record but index none, so that a
    pool upgraded process by process keeps every comparison both ways. One process at a time does it, each
    period (the turn daemon_mark.lua gives): one read of the index and one small read per record."""
    ids = store.daemon_mark_ids()
    return store.daemon_mark_index(store.daemon_mark_unindexed(ids)) if ids else 0


def collisions(peers: Mapping[str, Peer], standing: Mapping[str, str] | None = None) -> dict[str, str]:
    """Daemon identity -> why two daemons share it: its standing report (`shared_daemons`), else a process's
    record reporting it (the first, by process id; a process seen dead counts too)."""
    out: dict[str, str] = dict(standing or {})
    for process_id in sorted(peers):
        p = peers[process_id]
        if p.collision and p.daemon_id and p.daemon_id not in out:
            out[p.daemon_id] = p.collision
    return out


def read_collisions(store: Store) -> dict[str, str]:
    """Every identity no row may be judged on because two daemons share it (standing or reported)."""
    return collisions(read_peers(store), {i: s.line for i, s in read_standing(store).items()})


@dataclass(frozen=True)
class Standing:
    """A collision remembered in `shared_daemons` until an operator clears it."""

    line: str
    #: When it was first recorded (ms, Redis's clock; 0 if unreadable) and by which process.
    at: int = 0
    by: str = ""

    @classmethod
    def parse(cls, text: str) -> Standing:
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return cls(f"two docker daemons share this identity (an unreadable report: {text[:200]!r})")
        at = doc.get("at")
        return cls(str(doc.get("line") or "two docker daemons share this identity"),
                   int(at) if isinstance(at, (int, float)) else 0, str(doc.get("by") or ""))


def read_standing(store: Store, identity: str | None = None) -> dict[str, Standing]:
    """The standing collisions (identity -> its report); only `identity`'s when given (one HGET)."""
    if identity is not None:
        text = store.standing_collision(identity)
        return {identity: Standing.parse(text)} if text else {}
    return {i: Standing.parse(t) for i, t in store.standing_collisions().items()}


def clear_command(identity: str) -> str:
    return f"jobpool forget-collision {identity}"


def forget_collision(pool: HasStore, identity: str, actor: str = "operator", note: str = "") -> int:
    """Clear the standing collision on `identity` (scripts/forget_collision.lua), once one of the two daemons
    that shared it has an identity of its own (its `jobpool-daemon-identity` volume removed while no job ran
    there, its jobpool processes restarted). Returns when (ms, Redis's clock). Raises `InvalidArgument` for
    anything but an identity with a standing collision, writing nothing. A collision still there is found
    and recorded again by the next process that compares the marks."""
    if not isinstance(identity, str) or not daemonid.IDENTITY.fullmatch(identity):
        raise InvalidArgument(f"not a daemon identity: {identity!r} (as `jobpool status` names a shared one, "
                              "jpd1:<uuid>@<boot id>)")
    for name, text in (("actor", actor), ("note", note)):
        if not isinstance(text, str) or len(text) > daemonid.NOTE_MAX_CHARS:
            raise InvalidArgument(f"{name} must be text of at most {daemonid.NOTE_MAX_CHARS} characters")
    store = pool.store
    try:
        return store.forget_collision(identity, actor, note, store.daemon_mark_ids()).at
    except InvalidArgument:
        raise InvalidArgument(f"no collision stands on daemon identity {identity} in this pool (`jobpool "
                              "status` names the shared identities)") from None
