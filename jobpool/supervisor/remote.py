"""Evidence about containers on a Docker daemon the supervisor cannot ask: that daemon's inventory, published
by a worker on it (jobpool/fleet/inventory.py, jobpool/workers/inventory.py; docs/architecture.md, "Many
hosts").

A fresh inventory answers as the daemon would have: present (running), exited with its code (and, when the
publisher inspected it, what ended it: jobpool/exits.py), or absent when the inventory is complete and lists
no container of that attempt. Anything else keeps the slot:

- an inventory older than `JOBPOOL_INVENTORY_STALE_SECS`, expired or never published is `Unknown`, with a
  reason naming the daemon and the inventory's age (no worker on it publishes: all dead, or Redis out of
  their reach), unless an operator declared the daemon gone for good (jobpool/fleet/gone.py): then `Absent`
  (a declaration stands only while the daemon stays silent: its next publication lifts it);
- a created, never started container is `Unknown`: only its own daemon can remove it, which its publisher
  does once the attempt's lease is gone; the next inventory then lists nothing;
- an incomplete inventory (too many containers) proves nothing by what it leaves out.

**The boot rule.** A daemon's identity ends with its host's kernel boot id (jobpool/fleet/daemonid.py), so
after a reboot the same daemon (the same identity volume) publishes under a new identity. When the attempt's
own inventory is stale and a fresh inventory of the same daemon uuid under another boot id was *first*
published after the old boot's *last* publication (both Redis's clock), the old boot is over and its
containers went with it: `Absent` if the new boot's inventory does not list the attempt's container, its end
if it lists it ended (the daemon keeps the old boot's containers, ended; the publisher reads a reboot's end as
`host_rebooted`, jobpool/exits.py). A clone of the data root on another host booted while the old one was
still publishing does not qualify (its first publication is earlier than the old one's last), so a live host
is never judged by its clone; what is left is a host silent from before its clone first published: see "Many
hosts".

Every `Present` or `Absent` answer carries the inventory it came from (daemon, `at`): reconcile_apply.lua
applies the verdict only while that inventory is still the current one and still fresh.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..exits import Ending
from ..fleet.daemonid import is_identity, uuid_of
from ..fleet.inventory import CREATED, EXITED, FIELDS, RUNNING, Entry, Inventory, parse
from .probes import Absent, Present, Probe, Unknown


class InventoryReads(Protocol):
    """What reading the inventories needs of a pool's store (jobpool/store/sweepio.py)."""

    def inventory_index(self) -> tuple[dict[str, int], dict[str, str]]: ...

    def inventory_fields(self, daemons: Sequence[str], fields: Sequence[str]) -> dict[str, list[Any]]: ...


@dataclass(frozen=True)
class Inventories:
    """The inventories one sweep read: by daemon identity, and each known daemon's last publication."""

    now_ms: int
    by_daemon: dict[str, Inventory] = field(default_factory=dict)
    last_at: dict[str, int] = field(default_factory=dict)
    #: Daemons an operator declared gone for good (jobpool/fleet/gone.py): identity -> the declaration.
    gone: dict[str, str] = field(default_factory=dict)


def read(store: InventoryReads, daemons: Iterable[str], now_ms: int) -> Inventories:
    """The inventories of `daemons` and, for the boot rule, of every other boot of the same daemon uuids
    (two round trips; the index is one entry per daemon boot published within a week)."""
    wanted = sorted({d for d in daemons if is_identity(d)})
    if not wanted:
        return Inventories(now_ms)
    last_at, gone = store.inventory_index()
    uuids = {uuid_of(d) for d in wanted}
    names = sorted(set(wanted) | {d for d in last_at if uuid_of(d) in uuids})
    found: dict[str, Inventory] = {}
    for name, values in store.inventory_fields(names, FIELDS).items():
        inv = parse(dict(zip(FIELDS, values, strict=True)))
        if inv is not None and inv.daemon_id == name:
            found[name] = inv
    return Inventories(now_ms, found, last_at, gone)


def _age(secs: float) -> str:
    return f"{secs:.1f}s"


def judge(attempt: int, job_id: str, recorded: str, invs: Inventories, stale_secs: float,
          lease_secs: float | None = None) -> Probe:
    """What the inventory of the daemon an attempt was recorded on says of that attempt's container.

    "Not listed" is absence only in an inventory younger than a lease (`lease_secs`): a launcher starts its
    container only after a fenced heartbeat that renews the lease, so a container created after an older
    listing may be running under a lease that has lapsed since (its worker died), and be listed nowhere
    yet."""
    if not is_identity(recorded):
        why = "no daemon identity recorded for the attempt" if not recorded else (
            f"attempt recorded before daemon identities, with docker ID {recorded}, which daemons can share")
        return Unknown(f"{why}; no inventory can speak for it")
    inv = invs.by_daemon.get(recorded)
    if inv is not None and inv.age_secs(invs.now_ms) <= stale_secs:
        return _from_entries(inv, job_id, attempt, invs.now_ms,
                             stale_secs if lease_secs is None else min(stale_secs, lease_secs))
    rebooted = _rebooted(recorded, invs, stale_secs, job_id, attempt)
    if rebooted is not None:
        return rebooted
    if recorded in invs.gone:
        return _declared_gone(recorded, invs, inv, job_id, attempt)
    if inv is not None:
        return Unknown(f"the inventory of daemon {recorded} is {_age(inv.age_secs(invs.now_ms))} old (stale "
                       f"after {stale_secs:g}s): no worker on that daemon publishes it (if its host is gone "
                       f"for good: jobpool forget-daemon {recorded})")
    if recorded in invs.last_at:
        age = max(0.0, (invs.now_ms - invs.last_at[recorded]) / 1000)
        return Unknown(f"the inventory of daemon {recorded} was last published {_age(age)} ago and has "
                       "expired: no worker on that daemon publishes it (if its host is gone for good: "
                       f"jobpool forget-daemon {recorded})")
    return Unknown(f"no inventory of daemon {recorded} was published (no worker on it publishes one, or "
                   "JOBPOOL_INVENTORY_SECS is 0 there)")


def _rank(entry: Entry) -> int:
    """Of several containers of one attempt, the most alive one decides."""
    return {RUNNING: 3, "unknown": 2, CREATED: 2, EXITED: 1}.get(entry.state, 2)


def _from_entries(inv: Inventory, job_id: str, attempt: int, now_ms: int, absent_within: float) -> Probe:
    where = f"in the inventory of daemon {inv.daemon_id} published {_age(inv.age_secs(now_ms))} ago"
    fence = (inv.daemon_id, inv.at_ms)
    mine = [e for e in inv.of(job_id) if e.attempt == attempt]
    if not mine:
        if not inv.complete:
            return Unknown(f"no container of attempt {attempt} {where}, but that inventory is incomplete")
        if inv.age_secs(now_ms) > absent_within:
            return Unknown(f"no container of attempt {attempt} {where}, older than a lease "
                           f"({absent_within:g}s): one started since could be running")
        return Absent(detail=f"no container labelled for attempt {attempt} {where}", inventory=fence)
    entry = max(mine, key=_rank)
    cid = entry.container_id[:12]
    if entry.state == RUNNING:
        return Present(running=True, container_id=entry.container_id,
                       detail=f"container {cid} running {where}", inventory=fence)
    if entry.state == EXITED and entry.exit_code is not None:
        return _exited(entry, entry.exit_code, where, fence)
    if entry.state == CREATED:
        return Unknown(f"container {cid} created, never started, {where}: only its daemon can remove it "
                       "(its publisher does once the attempt's lease is gone)")
    return Unknown(f"container {cid} {where} could not be judged there: {entry.reason or entry.state}")


def _exited(entry: Entry, code: int, where: str, fence: tuple[str, int] | None) -> Present:
    """An ended container as its publisher judged it (`code` is its exit code)."""
    ending = Ending(code, entry.cause, entry.reason, f"{entry.cause} {entry.reason}".strip()) \
        if entry.cause else None
    detail = f"container {entry.container_id[:12]} exited with {code} {where}"
    if ending is not None:
        detail += f" ({ending.evidence})"
    return Present(running=False, exit_code=code, container_id=entry.container_id, detail=detail,
                   ending=ending, inventory=fence)


def _rebooted(recorded: str, invs: Inventories, stale_secs: float, job_id: str, attempt: int) -> Probe | None:
    """When a later boot of the recorded daemon's host publishes (the boot rule above): `Absent` if its
    inventory, complete, does not list the attempt's container; the container's end if it lists it ended (a
    daemon keeps its containers across a reboot, ended); else None (or Unknown when it lists it not ended:
    a "new boot" that still runs the old boot's container is no reboot, e.g. a worker whose /proc shows
    another boot id than the daemon's kernel, under a sandboxed runtime)."""
    last = invs.last_at.get(recorded)
    if last is None:
        return None  # when the old boot was last heard of is not known: nothing can be after it
    for name, inv in sorted(invs.by_daemon.items()):
        if name == recorded or uuid_of(name) != uuid_of(recorded):
            continue
        if inv.age_secs(invs.now_ms) <= stale_secs and inv.first_at_ms > last:
            listed = [e for e in inv.of(job_id) if e.attempt == attempt]
            if listed and all(e.state == EXITED and e.exit_code is not None for e in listed):
                # The daemon of the new boot keeps the old boot's containers, ended: their end is what the
                # new boot's publisher judged (a reboot's end is `host_rebooted`: jobpool/exits.py).
                return _from_entries(inv, job_id, attempt, invs.now_ms, stale_secs)
            if listed:
                return Unknown(f"daemon {recorded} looks rebooted (now {name}), yet {name}'s inventory "
                               f"lists attempt {attempt}'s container not ended: no reboot is believed")
            if not inv.complete:
                return Unknown(f"daemon {recorded} looks rebooted (now {name}), but {name}'s inventory is "
                               "incomplete: it cannot say the attempt's container is gone")
            return Absent(detail=(f"the host of daemon {recorded} booted again: the same daemon publishes as "
                                  f"{name} since {_age((invs.now_ms - inv.first_at_ms) / 1000)} ago, after "
                                  f"the old boot's last inventory {_age((invs.now_ms - last) / 1000)} ago; "
                                  "the containers of the old boot are gone"),
                          inventory=(inv.daemon_id, inv.at_ms))
    return None


def _declared_gone(recorded: str, invs: Inventories, inv: Inventory | None, job_id: str,
                   attempt: int) -> Probe:
    """An attempt on a daemon the operator declared gone for good (jobpool/fleet/gone.py): its end, if the
    last inventory the daemon published lists its container ended (an ended container never runs again), else
    absent. Not fenced on an inventory (that last one is stale by now), only on the row: the row's lease,
    which a worker of a daemon that comes back renews, is the compare-and-set (reconcile_apply.lua)."""
    declared = f"daemon {recorded} was declared gone for good by the operator ({invs.gone[recorded][:300]})"
    ended = [e for e in (inv.of(job_id) if inv is not None else []) if e.attempt == attempt]
    if ended and all(e.state == EXITED and e.exit_code is not None for e in ended):
        return _exited(ended[0], ended[0].exit_code or 0, f"in its last inventory; {declared}", None)
    return Absent(detail=f"{declared}: none of its containers runs any more")


def judge_all(rows: Mapping[str, tuple[int, str]], invs: Inventories, stale_secs: float,
              lease_secs: float | None = None) -> dict[str, Probe]:
    """`judge` for each job id -> (attempt, recorded daemon identity)."""
    return {job_id: judge(attempt, job_id, daemon, invs, stale_secs, lease_secs)
            for job_id, (attempt, daemon) in rows.items()}


def max_age_ms(probe: Probe, recorded: str, stale_secs: float, lease_secs: float) -> int:
    """The oldest the inventory a verdict came from may be when it is applied (reconcile_apply.lua): a lease
    for an absence read from the attempt's own daemon's inventory (see `judge`), else the stale limit."""
    fence = getattr(probe, "inventory", None)
    own = fence is not None and fence[0] == recorded
    secs = min(stale_secs, lease_secs) if isinstance(probe, Absent) and own else stale_secs
    return int(secs * 1000)
