"""Containers and checkpoint volumes left behind: removed once their attempt or job is over.

A worker removes an attempt's container once its exit is recorded, and the job's checkpoint volume when the
job ends (its main process does, after the horse: workers/cleanup.py). A worker that died before that, a
removal that failed (its daemon away), a job that ended without its worker (the supervisor judged the
orphan) leave them on the daemon; and a row pruned past retention (jobpool/retention.py) can leave nothing
that names them. So now and then the supervisor lists this pool's ended containers and its volumes on its own
daemon (by the labels the worker put on them) and removes:

- an exited (or dead) container whose attempt is over: its row is gone, has moved to a later attempt, or is
  no longer running this attempt. Its exit was recorded or judged then; a row still running the attempt
  keeps its container, whose exit the worker or the supervisor has yet to record;
- then a volume whose job has ended or has no row (a container removed just before no longer holds it).

Removal is never forced: Docker refuses to remove a running container, and a volume that any container still
uses, which keeps the work and the checkpoint of a job that is somehow still running, whatever its row says.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from ..contract import LABEL_ATTEMPT, LABEL_JOB, LABEL_POOL, TERMINAL
from ..store.keys import PoolKeys

log = logging.getLogger("jobpool.supervisor")

#: How often a supervisor looks for leftovers (two daemon calls; the sweeps between make none).
EVERY_SECS = 300.0
_ENDED = frozenset(s.value for s in TERMINAL)


class RowStates(Protocol):
    """What finding leftovers needs of a pool's store (jobpool/store/sweepio.py): its name, and the states
    of the rows the leftovers name."""

    @property
    def keys(self) -> PoolKeys: ...

    def states_and_attempts(self, ids: Sequence[str]) -> list[list[Any]]: ...

    def states(self, ids: Sequence[str]) -> list[str | None]: ...


def remove_leftovers(store: RowStates, client: Any) -> tuple[list[str], list[str]]:
    """Ended attempts' containers, then ended jobs' checkpoint volumes (see above); what went of each."""
    return remove_leftover_containers(store, client), remove_leftover_checkpoints(store, client)


def _attempt_over(row: list[str | None], attempt: str) -> bool:
    """Whether the row (state, attempt) says this attempt is over: no row, an ended job (never judged again),
    a later attempt, or this attempt no longer running."""
    state, current = row
    if state is None or state in _ENDED:
        return True
    try:
        later = int(current or 0) > int(attempt)
    except ValueError:
        return False  # a label that is not ours to read: keep the container
    return later or (current == attempt and state != "running")


def remove_leftover_containers(store: RowStates, client: Any) -> list[str]:
    """Remove this pool's exited containers on `client`'s daemon whose attempt is over; returns their ids.
    Daemon errors listing them propagate (the caller logs them); a container that refuses removal is kept."""
    import docker  # here: a subprocess-only supervisor never loads the SDK

    found = client.api.containers(all=True, filters={"label": f"{LABEL_POOL}={store.keys.pool}",
                                                     "status": ["exited", "dead"]})
    labelled = [(c["Id"], c.get("Labels") or {}) for c in found]
    named = [(cid, labels[LABEL_JOB], labels[LABEL_ATTEMPT]) for cid, labels in labelled
             if labels.get(LABEL_JOB) and labels.get(LABEL_ATTEMPT)]
    if not named:
        return []
    rows = store.states_and_attempts([job_id for _, job_id, _ in named])
    removed = []
    for (cid, job_id, attempt), row in zip(named, rows, strict=True):
        if not _attempt_over(row, attempt):
            continue
        try:
            client.api.remove_container(cid, force=False)
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as exc:  # started again, or the daemon refused: asked again later
            log.info("container %s of job %s attempt %s kept: %s", cid[:12], job_id, attempt, exc)
            continue
        removed.append(cid)
    if removed:
        log.info("removed %d containers of ended attempts", len(removed))
    return removed


def remove_leftover_checkpoints(store: RowStates, client: Any) -> list[str]:
    """Remove this pool's checkpoint volumes on `client`'s daemon whose job has ended or has no row;
    returns the names removed. Daemon errors propagate (the caller logs them); a volume in use is kept."""
    import docker  # here: a subprocess-only supervisor never loads the SDK

    found = client.api.volumes(filters={"label": f"{LABEL_POOL}={store.keys.pool}"}).get("Volumes") or []
    named = [(v["Name"], (v.get("Labels") or {}).get(LABEL_JOB, "")) for v in found]
    named = [(name, job_id) for name, job_id in named if job_id]
    if not named:
        return []
    states = store.states([job_id for _, job_id in named])
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
