"""The soak's order and limits (docs/architecture.md, "Order and limits"): its job mix's priorities, weights,
named limits and fair-share groups, and the judge of each instant the sampler (bench/soak_fleet.py) lists.

The promise under test is the slot's, extended: a job holds its weight in slots and its amounts of the
named limits it uses from its promotion until the positive evidence that its work is gone, so at no instant
do the weights of the running containers exceed the slot limit, nor the units of any one name exceed its
limit, whatever the faults. The judge counts from what runs on the daemons, not from what Redis says: each
running job container counts its job's weight and amounts (a job with two containers counts twice, as both
may be writing). A pattern limit (`dataset:*`) is judged per name under it, as the scripts keep it.

A container's labels give only its job's id, so the soak records each job's order when it enqueues it
(`JobBook`). The record is made under the same lock the judge reads it under, with the enqueue inside it: a
job can be promoted and its container started before `Pool.enqueue` has returned, and the judge must never
meet a running job the book does not know yet (it would count it as a plain job and miss its weight).
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.soak_fleet import IMAGE, stamp
from jobpool import Pool

#: The named limits set before the first job is fed: an exact name, and a pattern giving each dataset a
#: limit of its own. `gpu` is 2 and some jobs take both units, so a name's units are summed, not counted.
LIMITS: dict[str, int] = {"gpu": 2, "dataset:*": 1}
DATASETS = ("sales", "stock", "users")
GROUPS = ("tenant-a", "tenant-b")
PRIORITIES = (-5, 5, 10)
#: The soak's JOBPOOL_RESERVE_AFTER_SECS: a job passed over this long gets the reservation, short enough that
#: reservations are taken and given back under the faults of a soak of minutes.
RESERVE_AFTER_SECS = "3"


@dataclass(frozen=True)
class Order:
    """One job's place and what it holds while it runs: `Pool.enqueue`'s priority, slots, uses and group."""

    priority: int = 0
    slots: int = 1
    uses: Mapping[str, int] = field(default_factory=dict)
    group: str | None = None

    def fields(self) -> dict[str, Any]:
        """`Pool.enqueue`'s keyword arguments for this order (none for a plain job)."""
        out: dict[str, Any] = {}
        if self.priority:
            out["priority"] = self.priority
        if self.slots != 1:
            out["slots"] = self.slots
        if self.uses:
            out["uses"] = dict(self.uses)
        if self.group is not None:
            out["group"] = self.group
        return out


PLAIN = Order()


def draw_order(rng: random.Random, slots: int) -> Order:
    """A job's order, drawn from the soak's own generator: about one job in six weighs 2 slots (never more
    than the pool's `slots`), one in five uses `gpu` (a third of those both units), three in ten one dataset,
    one in five has a priority other than 0, two in five belong to a group. Most jobs stay plain, so the
    fleet keeps its throughput and every fault kind still meets running jobs."""
    weight = 2 if slots >= 2 and rng.random() < 0.17 else 1
    uses: dict[str, int] = {}
    if rng.random() < 0.2:
        uses["gpu"] = 2 if rng.random() < 0.33 else 1
    if rng.random() < 0.3:
        uses[f"dataset:{rng.choice(DATASETS)}"] = 1
    priority = rng.choice(PRIORITIES) if rng.random() < 0.2 else 0
    group = rng.choice(GROUPS) if rng.random() < 0.4 else None
    return Order(priority, weight, uses, group)


def limit_of(name: str, limits: Mapping[str, int]) -> tuple[str, int] | None:
    """The limit that covers `name`, as the scripts choose it: its own, else the longest pattern over it;
    (its definition, its size), or None when none does."""
    if name in limits:
        return name, limits[name]
    over = [k for k in limits if k.endswith("*") and name.startswith(k[:-1])]
    if not over:
        return None
    best = max(over, key=len)
    return best, limits[best]


class JobBook:
    """Each job's order by id, as the soak enqueued it; read by the sampler's thread while the main loop
    feeds (the module's docstring says why the enqueue is made under the lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._orders: dict[str, Order] = {}

    def enqueue(self, pool: Pool, command: list[str], order: Order, **fields: Any) -> str:
        """`Pool.enqueue` of `command` at `order`, with `fields` (its time limit, retries, start time...)."""
        with self._lock:
            job_id = pool.enqueue(IMAGE, command, **order.fields(), **fields).id
            self._orders[job_id] = order
        return job_id

    def enqueue_many(self, pool: Pool, items: Sequence[Mapping[str, Any]],
                     orders: Sequence[Order]) -> list[str]:
        """`Pool.enqueue_many` of `items` (enqueue's arguments but the image), each at its order: one call,
        so a pipeline's `after_index` names its own earlier items."""
        with self._lock:
            jobs = pool.enqueue_many([{"image": IMAGE, **item, **order.fields()}
                                      for item, order in zip(items, orders, strict=True)])
            for job, order in zip(jobs, orders, strict=True):
                self._orders[job.id] = order
        return [job.id for job in jobs]

    def record(self, job_id: str, order: Order) -> None:
        with self._lock:
            self._orders[job_id] = order

    def orders(self, job_ids: Iterable[str]) -> dict[str, Order]:
        """The order of each of `job_ids`; a job the soak did not enqueue counts as plain."""
        with self._lock:
            return {j: self._orders.get(j, PLAIN) for j in job_ids}


@dataclass
class JobMix:
    """What the soak feeds: each job's order drawn from `rng` (seeded from the soak's seed) and recorded in
    `book` as it is enqueued."""

    rng: random.Random
    slots: int
    book: JobBook = field(default_factory=JobBook)

    def enqueue(self, pool: Pool, command: list[str], **fields: Any) -> str:
        return self.book.enqueue(pool, command, draw_order(self.rng, self.slots), **fields)

    def enqueue_many(self, pool: Pool, items: Sequence[Mapping[str, Any]]) -> list[str]:
        return self.book.enqueue_many(pool, items, [draw_order(self.rng, self.slots) for _ in items])


#: What the sampler lists: container id -> (daemon index, job id, attempt).
Live = Mapping[str, tuple[int, str, str]]


class Judge:
    """Judges one instant's running job containers (summed over the daemons) and counts into `figures`
    (bench/soak.py's Figures): `samples`; `over_limit_instants`, the weights summed over the slot limit;
    `over_named_limit_instants`, some name's units summed over its limit; `double_container_jobs`; the
    `peaks` each limit reached (the slots' and each definition's busiest name), which show the limits were
    met, not only never passed; and a finding for each instant that broke a zero."""

    def __init__(self, slots: int, limits: Mapping[str, int], book: JobBook, figures: Any) -> None:
        self.slots, self.limits, self.book, self.figures = slots, dict(limits), book, figures

    def __call__(self, live: Live) -> None:
        f = self.figures
        f.samples += 1
        jobs = [job for _, job, _ in live.values()]
        orders = self.book.orders(set(jobs))
        doubles = {j for j, n in Counter(jobs).items() if n > 1}
        weight = sum(orders[j].slots for j in jobs)
        used: Counter[str] = Counter()
        for j in jobs:
            used.update(orders[j].uses)
        over_names = []
        for name, units in sorted(used.items()):
            definition, size = limit_of(name, self.limits) or (name, 0)  # none: nothing may run on it
            f.peaks[definition] = max(f.peaks.get(definition, 0), units)
            if units > size:
                over_names.append(f"{name} {units}/{size}")
        f.peaks["slots"] = max(f.peaks.get("slots", 0), weight)
        over = weight > self.slots
        f.over_limit_instants += over
        f.over_named_limit_instants += bool(over_names)
        f.double_container_jobs |= doubles
        if over or over_names or doubles:
            kind = "double" if doubles else "over_limit" if over else "over_named_limit"
            finding = {"at": time.time(), "kind": kind, "doubles": sorted(doubles), "weight": weight,
                       "named": over_names,
                       "live": sorted((job, att, d + 1, cid[:12]) for cid, (d, job, att) in live.items())}
            f.findings.append(finding)
            print(f"soak: {finding_line(finding, self.slots)}", file=sys.stderr)


def finding_line(finding: dict[str, Any], slots: int) -> str:
    """One instant that broke a zero, for stderr and findings.txt: what held how many slots, which names
    were over their limits, which jobs ran twice."""
    what = ", ".join(f"{job}#{att}@d{d}:{cid}" for job, att, d, cid in finding["live"])
    weight = finding.get("weight", len(finding["live"]))
    named = ", ".join(finding.get("named", ())) or "-"
    return (f"{stamp(finding['at'])} {finding['kind']}: {len(finding['live'])} running holding {weight} "
            f"slots (limit {slots}), over a named limit: {named}, two of {finding['doubles'] or '-'}: {what}")


def mix_counts(orders: Iterable[Order]) -> Counter[str]:
    """How many jobs of the mix had each kind of order (a job may count under several)."""
    out: Counter[str] = Counter()
    for o in orders:
        out["weighted"] += o.slots > 1
        out["gpu"] += "gpu" in o.uses
        out["dataset"] += any(name.startswith("dataset:") for name in o.uses)
        out["priority"] += o.priority != 0
        out["grouped"] += o.group is not None
    return out
