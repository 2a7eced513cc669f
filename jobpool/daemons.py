"""Docker daemons gone for good: an operator's word, the one evidence that frees the slots of jobs recorded
on a daemon nobody can ask any more (docs/architecture.md, "Many hosts").

A daemon whose workers all died keeps its jobs, unknown, for as long as its inventory is stale: the host may
come back, and its containers may still be running. When the operator knows it will not (the host was
destroyed, its disks wiped, the VM deleted), `forget_daemon` records that in the pool's `gone_daemons` hash
(scripts/forget_daemon.lua); from then on a sweep judges the attempts recorded on that daemon absent (so they
run again within the recovery budget, and a persisted cancel or pause ends them) with the declaration as
evidence. It is refused while the daemon still publishes its inventory. A daemon that comes back after all is
judged from its own inventory again, but what was run elsewhere meanwhile was run twice: declare only what is
truly gone.
"""

from __future__ import annotations

import json
from typing import Any

from . import errors
from .api import Pool
from .daemonid import IDENTITY
from .registry import call_redis


def forget_daemon(pool: Pool, daemon_id: str, actor: str = "operator", note: str = "") -> int:
    """Declare `daemon_id` (an identity, as `jobpool show JOB` prints a job's `daemon_id`) gone for good;
    returns when it was recorded (ms, Redis's clock). Raises `InvalidArgument` for anything but the identity
    of a daemon that published an inventory within the last week, and `Conflict` while one of its workers
    holds its inventory lead or its inventory is fresh. Writes nothing on either."""
    if not isinstance(daemon_id, str) or not IDENTITY.fullmatch(daemon_id):
        raise errors.InvalidArgument(f"not a daemon identity: {daemon_id!r} (as `jobpool show JOB` prints a "
                                     "job's daemon_id, jpd1:<uuid>@<boot id>)")
    for name, text in (("actor", actor), ("note", note)):
        if not isinstance(text, str) or len(text) > 1000:
            raise errors.InvalidArgument(f"{name} must be text of at most 1000 characters")
    k = pool.keys
    stale_ms = int(pool.settings.inventory_stale_secs * 1000)
    try:
        reply = pool.run("forget_daemon", [k.gone_daemons, k.inventory(daemon_id), k.commands(daemon_id),
                                           k.inventory_lead(daemon_id), k.inventories],
                         [daemon_id, stale_ms, actor, note])
    except errors.Conflict:
        stale = pool.settings.inventory_stale_secs
        raise errors.Conflict(f"daemon {daemon_id} is not gone: a worker on it publishes its inventory (it "
                              "holds the daemon's inventory lead, or published within "
                              f"{stale:g}s, JOBPOOL_INVENTORY_STALE_SECS)") from None
    except errors.InvalidArgument:
        raise errors.InvalidArgument(f"no daemon {daemon_id} published an inventory in this pool within the "
                                     "last week: check the id (`jobpool show JOB`, daemon_id)") from None
    return int(reply[1])


def gone_daemons(pool: Pool) -> dict[str, dict[str, Any]]:
    """The daemons declared gone: identity -> {at, actor, note} (an unreadable entry reads as {})."""
    out: dict[str, dict[str, Any]] = {}
    raw = call_redis(lambda: pool.client.hgetall(pool.keys.gone_daemons), what="reading the gone daemons")
    for daemon, text in raw.items():
        try:
            doc = json.loads(text)
        except ValueError:
            doc = {}
        out[str(daemon)] = doc if isinstance(doc, dict) else {}
    return out
