"""What a watcher makes of a refused heartbeat (jobpool/workers/watch.py `_after_refusal`), on fakeredis[lua]
and a real server: "adopted elsewhere" only on proof, the attempt claimed back when Redis rolled the row back
to unclaimed, everything else stopped.

The row states are written the way the scripts leave them (a rollback is the row as promote left it); the
handle is a plain record of what the watcher launched, since only its ids are read here.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from jobpool import Pool, errors
from jobpool.store.replies import Requests
from jobpool.workers.attempt import Attempt
from jobpool.workers.runtime import Runtime
from jobpool.workers.watch import ADOPTED, LOST, _after_refusal
from tests.support.attempts import claim
from tests.support.pool_helpers import Backend, enqueue

OURS, THEIRS = "boot-ours", "boot-theirs"


def launched(container_id: str = "c-ours", identity: dict[str, Any] | None = None) -> SimpleNamespace:
    return SimpleNamespace(container_id=container_id, daemon_id="d1", identity=identity)


def running(backend: Backend, handle: SimpleNamespace) -> tuple[Pool, Runtime, Attempt]:
    pool = backend.pool()
    job = enqueue(pool)
    ours = claim(pool, job.id, OURS)
    ours.set_container(handle.container_id, handle.daemon_id, handle.identity)
    return pool, Runtime(pool.store, OURS), ours


def taken_by(pool: Pool, job_id: str, boot: str, container_id: str, live: bool,
             identity: str = "") -> None:
    pool.store.client.hset(pool.keys.job(job_id), mapping={"owner_boot": boot, "container_id": container_id,
                                                     "identity": identity})
    if live:
        pool.store.client.hset(pool.keys.boot(boot), mapping={"role": "worker"})


def test_rolled_back_to_unclaimed_is_claimed_back_for_our_container(backend: Backend) -> None:
    handle = launched()
    pool, rt, ours = running(backend, handle)
    # Redis came back from before our claim: the row as promote left it, no lease.
    pool.store.client.hset(pool.keys.job(ours.job_id),
                     mapping={"owner_boot": "", "container_id": "", "claimed_at": ""})
    pool.store.client.delete(pool.keys.lease(ours.job_id))
    assert _after_refusal(rt, ours, handle) == Requests(False, False)
    row = pool.get(ours.job_id)
    assert (row.owner_boot, row.container_id, row.attempt) == (OURS, "c-ours", ours.attempt)
    assert pool.store.client.get(pool.keys.lease(ours.job_id)) == f"{OURS}:{ours.attempt}"
    with pytest.raises(errors.NotOwner):  # the delivery Redis brought back is refused
        Attempt(pool.store, ours.job_id, THEIRS, ours.attempt).claim()


def test_unclaimed_row_naming_another_container_is_lost(backend: Backend) -> None:
    handle = launched()
    pool, rt, ours = running(backend, handle)
    taken_by(pool, ours.job_id, "", "c-other", live=False)
    assert _after_refusal(rt, ours, handle) == LOST
    assert pool.get(ours.job_id).owner_boot == ""  # nothing written


@pytest.mark.parametrize(("container", "live", "fate"), [
    ("c-ours", True, ADOPTED),    # a live worker re-attached to our very container
    ("c-ours", False, LOST),      # its boot record is gone: no proof anyone watches it
    ("c-other", True, LOST),      # the attempt was re-issued and the other worker launched its own
    ("", True, LOST),             # ...or has not recorded one yet
])
def test_another_owner_is_an_adoption_only_with_proof(backend: Backend, container: str, live: bool,
                                                      fate: str) -> None:
    handle = launched()
    pool, rt, ours = running(backend, handle)
    taken_by(pool, ours.job_id, THEIRS, container, live)
    assert _after_refusal(rt, ours, handle) == fate


def test_a_later_attempt_or_a_finished_row_is_lost(backend: Backend) -> None:
    handle = launched()
    pool, rt, ours = running(backend, handle)
    pool.store.client.hset(pool.keys.job(ours.job_id),
                           mapping={"attempt": ours.attempt + 1, "owner_boot": ""})
    assert _after_refusal(rt, ours, handle) == LOST
    pool.store.client.hset(pool.keys.job(ours.job_id), mapping={"attempt": ours.attempt, "state": "failed"})
    assert _after_refusal(rt, ours, handle) == LOST
    pool.store.client.delete(pool.keys.job(ours.job_id))
    assert _after_refusal(rt, ours, handle) == LOST


def test_a_process_is_proven_by_its_recorded_identity(backend: Backend) -> None:
    ident = {"executor": "subprocess", "pid": 4242, "start_time": 77, "pidns": "p", "kernel_boot_id": "k"}
    handle = launched("", ident)
    pool, rt, ours = running(backend, handle)
    taken_by(pool, ours.job_id, THEIRS, "", True, json.dumps(ident, sort_keys=True))
    assert _after_refusal(rt, ours, handle) == ADOPTED
    taken_by(pool, ours.job_id, THEIRS, "", True, json.dumps({**ident, "start_time": 78}))
    assert _after_refusal(rt, ours, handle) == LOST
