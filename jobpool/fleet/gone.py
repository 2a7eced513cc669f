"""Docker daemons gone for good: an operator's word, the one evidence that frees the slots of jobs recorded
on a daemon nobody can ask any more (docs/architecture.md, "Many hosts").

A daemon whose workers all died keeps its jobs, unknown, for as long as its inventory is stale: the host may
come back, and its containers may still be running. When the operator knows it will not (the host was
destroyed, its disks wiped, the VM deleted), `forget_daemon` records that in the pool's `gone_daemons` hash
(scripts/forget_daemon.lua); from then on a sweep judges the attempts recorded on that daemon absent (so they
run again within the recovery budget, and a persisted cancel or pause ends them) with the declaration as
evidence. It is refused while the daemon still publishes its inventory, and for an id that is neither in the
`inventories` index (published within a week) nor recorded on a running row (a typo): a daemon that holds a
slot stays forgettable however long ago it went silent.

A daemon that comes back after all publishes its inventory again, which lifts the declaration in the same
script (scripts/publish_inventory.lua): it is evidently not gone, and its attempts are judged from its own
inventory again (unknown while that is stale, never absent on the old word). `unforget_daemon` withdraws a
declaration by hand. Either way a `status` report names the daemon for a week (`StatusReport.daemons`): what
was run elsewhere meanwhile may have run twice, so declare only what is truly gone.

The public functions take a pool (`Pool`, or anything with its `store`: `store.calls.HasStore`); the sweep
reads the declarations from its store (`declared`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .. import errors
from .daemonid import IDENTITY, NOTE_MAX_CHARS
from .inventory import FORGET_MS

if TYPE_CHECKING:
    from ..store.calls import HasStore, Store

#: A daemon's recorded running rows are read in batches of this many ids (`running` is bounded by the slots).
_ROWS_BATCH = 500
#: At most this many of them go to forget_daemon.lua, which needs one still running on the daemon.
_ROWS_PASSED = 100


def forget_daemon(pool: HasStore, daemon_id: str, actor: str = "operator", note: str = "") -> int:
    """Declare `daemon_id` (an identity, as `jobpool show JOB` prints a job's `daemon_id`) gone for good;
    returns when it was recorded (ms, Redis's clock). Raises `InvalidArgument` for anything but the identity
    of a daemon that published an inventory within the last week or that a running job is recorded on, and
    `Conflict` while one of its workers holds its inventory lead or its inventory is fresh. Writes nothing on
    either."""
    _check(daemon_id, actor, note)
    store = pool.store
    stale_ms = int(store.settings.inventory_stale_secs * 1000)
    rows = recorded_on(store, daemon_id)[:_ROWS_PASSED]
    try:
        at = store.forget_daemon(daemon_id, stale_ms, actor, note, rows)
    except errors.Conflict:
        stale = store.settings.inventory_stale_secs
        raise errors.Conflict(f"daemon {daemon_id} is not gone: a worker on it publishes its inventory (it "
                              "holds the daemon's inventory lead, or published within "
                              f"{stale:g}s, JOBPOOL_INVENTORY_STALE_SECS)") from None
    except errors.InvalidArgument:
        raise errors.InvalidArgument(f"no daemon {daemon_id} published an inventory in this pool within the "
                                     "last week, and no running job is recorded on it: check the id "
                                     "(`jobpool show JOB`, daemon_id)") from None
    return at


def unforget_daemon(pool: HasStore, daemon_id: str, actor: str = "operator", note: str = "") -> int:
    """Withdraw the declaration that `daemon_id` is gone for good (scripts/unforget_daemon.lua); returns when
    (ms, Redis's clock). Its attempts are judged from its own inventory again; what was judged absent on the
    declaration meanwhile stays as it was. Raises `InvalidArgument` for anything but a daemon declared gone,
    writing nothing."""
    _check(daemon_id, actor, note)
    try:
        return pool.store.unforget_daemon(daemon_id, actor, note, FORGET_MS)
    except errors.InvalidArgument:
        raise errors.InvalidArgument(f"daemon {daemon_id} is not declared gone in this pool (`jobpool status "
                                     "--json` lists the declarations under daemons.gone)") from None


def _check(daemon_id: Any, actor: Any, note: Any) -> None:
    if not isinstance(daemon_id, str) or not IDENTITY.fullmatch(daemon_id):
        raise errors.InvalidArgument(f"not a daemon identity: {daemon_id!r} (as `jobpool show JOB` prints a "
                                     "job's daemon_id, jpd1:<uuid>@<boot id>)")
    for name, text in (("actor", actor), ("note", note)):
        if not isinstance(text, str) or len(text) > NOTE_MAX_CHARS:
            raise errors.InvalidArgument(f"{name} must be text of at most {NOTE_MAX_CHARS} characters")


def recorded_on(store: Store, daemon_id: str) -> list[str]:
    """The running jobs whose rows record `daemon_id`, or wait promoted for it (a checkpoint affinity to it)
    (O(slots): `running` holds at most the slot limit)."""
    running = store.running_ids()
    found: list[str] = []
    for start in range(0, len(running), _ROWS_BATCH):
        batch = running[start:start + _ROWS_BATCH]
        daemons = store.daemons_of(batch)
        found += [job_id for job_id, d in zip(batch, daemons, strict=True)
                  if isinstance(d, list) and daemon_id in d]
    return found


def gone_daemons(pool: HasStore) -> dict[str, dict[str, Any]]:
    """The daemons declared gone: identity -> {at, actor, note} (an unreadable entry reads as {})."""
    return declared(pool.store)


def declared(store: Store) -> dict[str, dict[str, Any]]:
    """`gone_daemons`, read from a pool's store."""
    out: dict[str, dict[str, Any]] = {}
    for daemon, text in store.gone_daemon_records().items():
        try:
            doc = json.loads(text)
        except ValueError:
            doc = {}
        out[str(daemon)] = doc if isinstance(doc, dict) else {}
    return out
