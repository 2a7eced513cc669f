"""Daemons' inventories as a worker on another host publishes them (jobpool/fleet/inventory.py), and the rows
a supervisor judges from them, through the scripts: the helpers of the unit tests about "Many hosts"."""

from __future__ import annotations

from jobpool.api import Pool
from jobpool.fleet.inventory import FORGET_MS, Entry, encode
from tests.support.attempts import claim
from tests.support.pool_helpers import enqueue


def publish(pool: Pool, daemon: str, entries: list[Entry], boot: str = "pub", complete: bool = True) -> int:
    """Publish `daemon`'s inventory listing `entries` as the holder of its lead `boot`; returns its `at`."""
    k = pool.keys
    pool.store.client.delete(k.inventory_lead(daemon))
    pool.store.run("inventory_lead", [k.inventory_lead(daemon)], [daemon, boot, 60_000])
    text, _ = encode(entries)
    reply = pool.store.run("publish_inventory", [k.inventory(daemon), k.inventory_lead(daemon), k.inventories,
                                                 k.gone_daemons, k.returned_daemons],
                           [daemon, boot, daemon.split("@")[1], 60_000, 600_000, "1" if complete else "0",
                            text, FORGET_MS, pool.now_ms()])
    return int(reply[1])


def orphan_on(pool: Pool, daemon: str) -> tuple[str, int]:
    """A job claimed by a worker on `daemon` that then died (its lease gone): its id and attempt."""
    job = enqueue(pool, "sleep", "60")
    att = claim(pool, job.id)
    att.set_container("cid-" + job.id, daemon)
    pool.store.client.hset(pool.keys.job(job.id), "executor", "docker")
    pool.store.client.delete(pool.keys.lease(job.id))
    return job.id, att.attempt
