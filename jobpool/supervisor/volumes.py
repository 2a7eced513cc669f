"""Checkpoint volumes left behind: removed once their job has ended or is gone.

A worker removes its job's checkpoint volume when the job ends. A job that ended without its worker (the
supervisor judged the orphan), or whose removal failed, leaves the volume on its daemon; and a row pruned
past retention (jobpool/retention.py) can leave nothing that names it. So now and then the supervisor lists
this pool's volumes on its own daemon (by the labels the worker put on them) and removes those whose job
has ended or has no row.

Removal is never forced: Docker refuses to remove a volume that any container still uses, which keeps the
checkpoint of a job that is somehow still running, whatever its row says.
"""

from __future__ import annotations

import logging
from typing import Any

from ..api import Pool
from ..contract import LABEL_JOB, LABEL_POOL, TERMINAL
from ..registry import call_redis

log = logging.getLogger("jobpool.supervisor")

#: How often a supervisor looks for leftover volumes (one daemon call; the sweeps between make none).
EVERY_SECS = 300.0
_ENDED = frozenset(s.value for s in TERMINAL)


def remove_leftover_checkpoints(pool: Pool, client: Any) -> list[str]:
    """Remove this pool's checkpoint volumes on `client`'s daemon whose job has ended or has no row;
    returns the names removed. Daemon errors propagate (the caller logs them); a volume in use is kept."""
    import docker  # here: a subprocess-only supervisor never loads the SDK

    found = client.api.volumes(filters={"label": f"{LABEL_POOL}={pool.keys.pool}"}).get("Volumes") or []
    named = [(v["Name"], (v.get("Labels") or {}).get(LABEL_JOB, "")) for v in found]
    named = [(name, job_id) for name, job_id in named if job_id]
    if not named:
        return []
    pipe = pool.client.pipeline(transaction=False)
    for _, job_id in named:
        pipe.hget(pool.keys.job(job_id), "state")
    states = call_redis(pipe.execute, what="reading the states of checkpointed jobs")
    removed = []
    for (name, job_id), state in zip(named, states, strict=True):
        if state is not None and state not in _ENDED:
            continue
        try:
            client.api.remove_volume(name)
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as exc:  # in use (409), or the daemon refused: kept, asked again later
            log.info("checkpoint volume %s of job %s kept: %s", name, job_id, exc)
            continue
        removed.append(name)
    if removed:
        log.info("removed %d checkpoint volumes of ended jobs", len(removed))
    return removed
