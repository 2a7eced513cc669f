"""The strays the soak met, and what they excuse (docs/architecture.md, "Strays").

A Redis that forgets acknowledged writes (the soak's rollbacks: `redis_rollback`, and
`claim_lost_worker_killed` in bench/soak_edges.py) can forget a claim whose container runs on; once the
attempt is claimed again, that container is a stray, beside the one its row accounts for, until it ends or
the workers on its daemon stop it. Losing an unreplicated write is documented; the promise there is a bound,
not a zero: the settling lease, an inventory period and the stop grace after Redis came back. So at the end,
an instant of the sampler (bench/soak_fleet.py) that broke a zero within that bound after a rollback is
counted as a stray instant instead, if a job it involves lost a transition in that rollback, had a
container published as a stray, or has two containers of one attempt (a claim made twice: only a forgotten
claim allows it); any other stays a broken zero. That holds for each zero the sampler judges:
the slot limit (by weights), the named limits, and a job's two containers. `StrayWatch` follows the
containers the daemons' workers publish as strays (a stray that ends on its own first is never published).
"""

from __future__ import annotations

import threading
from typing import Any, cast

import redis

from jobpool.fleet.strays import decode
from jobpool.store.keys import PoolKeys


class StrayWatch(threading.Thread):
    """Reads every daemon's published strays every 0.2 s: the 12-character prefix of each container ever
    published as a stray -> its job."""

    def __init__(self, url: str, keys: PoolKeys) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=2)
        self.keys = keys
        self.halt = threading.Event()
        self.seen: dict[str, str] = {}

    def run(self) -> None:
        while not self.halt.wait(0.2):
            try:
                daemons = cast("list[str]", self.client.zrange(self.keys.inventories, 0, -1))
                pipe = self.client.pipeline(transaction=False)
                for d in daemons:
                    pipe.hget(self.keys.inventory(d), "strays")
                for d, raw in zip(daemons, pipe.execute(), strict=True):
                    for stray in decode(raw, d):
                        self.seen.setdefault(stray.container_id[:12], stray.job_id)
            except redis.RedisError:
                continue  # Redis restarting on purpose: read again next time

    def stop(self) -> None:
        self.halt.set()
        self.join(5)
        self.client.close()


def excuse_strays(figures: Any, strays: dict[str, str], slots: int, bound_secs: float) -> None:
    """Judge the sampler's findings again: one within `bound_secs` after a Redis rollback came back
    (`figures.rollbacks`) is a stray instant, not an instant over the slot limit or a named one or a job's two
    containers, when a job it involves had a transition that rollback took back or a container of it was
    published as a stray (`strays`: 12-character container id -> job); any other stays a broken zero. A stray
    holds its job's weight and named units as it holds a slot, so the same bound covers all three."""
    backs = sorted((r["at"], {e.get("job") for e in r.get("lost", ())}) for r in figures.rollbacks)
    stray_jobs = set(strays.values())
    over, named, doubles, excused, longest = 0, 0, set(), 0, 0.0
    for finding in figures.findings:
        at = finding["at"]
        jobs = {x[0] for x in finding["live"]}
        # Two containers of one job with one attempt number: that attempt was claimed twice, which only a
        # claim Redis forgot allows (claims are fenced on the attempt). The rollback took it back, even if
        # the event log never read it (written and taken back between two reads) and the stray ended
        # before its daemon's workers published it.
        attempts = [(x[0], x[1]) for x in finding["live"]]
        reclaimed = {job for job, att in attempts if attempts.count((job, att)) > 1}
        last = [(at - b, lost) for b, lost in backs if b <= at]
        if last and last[-1][0] <= bound_secs and jobs & (last[-1][1] | stray_jobs | reclaimed):
            excused += 1
            longest = max(longest, last[-1][0])
            continue
        if finding.get("weight", len(finding["live"])) > slots:
            over += 1
        if finding.get("named"):
            named += 1
        doubles |= set(finding["doubles"])
    figures.over_limit_instants, figures.over_named_limit_instants = over, named
    figures.double_container_jobs = doubles
    figures.stray_instants, figures.stray_secs_max = excused, longest
