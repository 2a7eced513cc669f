"""Bad input is refused before anything is written (InvalidSpec, NotFound, InvalidArgument: the keyspace is
compared before and after), and the read side (`list`, `stats`) follows the state indexes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest

from jobpool import errors
from jobpool.models import JobState
from tests.support.attempts import claim
from tests.support.pool_helpers import (
    Backend,
    enqueue,
    rq_list,
)

# ---- bad input writes nothing -------------------------------------------------------------------------


BAD_SPECS: dict[str, dict[str, Any]] = {
    "unknown field": {"privileged": True},
    "unknown field pid": {"pid_mode": "host"},
    "image empty": {"image": ""},
    "image not a string": {"image": 3},
    "image with NUL": {"image": "a\x00b"},
    "command a string": {"command": "echo hi"},
    "command bytes": {"command": b"echo"},
    "command empty": {"command": []},
    "command not a list": {"command": 5},
    "command arg not a string": {"command": ["echo", 1]},
    "command arg with NUL": {"command": ["echo", "a\x00"]},
    "command too many args": {"command": ["x"] * 1025},
    "command arg too long": {"command": ["x" * (64 * 1024 + 1)]},
    "env not a mapping": {"env": ["A=1"]},
    "env bad name": {"env": {"1A": "x"}},
    "env name with dash": {"env": {"A-B": "x"}},
    "env value not a string": {"env": {"A": 1}},
    "env NUL": {"env": {"A": "x\x00"}},
    "env too many": {"env": {f"V{i}": "" for i in range(513)}},
    "labels not a mapping": {"labels": "a=b"},
    "labels value not a string": {"labels": {"a": 1}},
    "labels reserved prefix": {"labels": {"jobpool.job_id": "x"}},
    "labels too many": {"labels": {f"l{i}": "" for i in range(513)}},
    "network host": {"network": "host"},
    "network container": {"network": "container:abc"},
    "network empty": {"network": ""},
    "cpus zero": {"cpus": 0},
    "cpus negative": {"cpus": -1},
    "cpus too many": {"cpus": 1025},
    "cpus bool": {"cpus": True},
    "cpus string": {"cpus": "2"},
    "memory bad unit": {"memory": "12x"},
    "memory zero": {"memory": "0"},
    "memory number": {"memory": 512},
    "workdir relative": {"workdir": "tmp"},
    "workdir empty": {"workdir": ""},
    "user empty": {"user": ""},
    "user not a string": {"user": 0},
    "mounts a string": {"mounts": "/data:/data"},
    "mounts bad shape": {"mounts": ["/data"]},
    "mounts bad mode": {"mounts": ["/srv/jobs/a:/data:rx"]},
    "mounts relative": {"mounts": ["srv/jobs:/data"]},
    "mounts outside roots": {"mounts": ["/etc:/data"]},
    "mounts escaping root": {"mounts": ["/srv/jobs/../../etc:/data"]},
    "mounts sibling prefix": {"mounts": ["/srv/jobsX:/data"]},
    "spec too large": {"command": ["x" * 60_000] * 5},
    "coalesce_key empty": {"coalesce_key": ""},
    "coalesce_key not a string": {"coalesce_key": 5},
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_invalid_spec_writes_nothing(backend: Backend, case: str) -> None:
    pool = backend.pool(bind_roots=("/srv/jobs",))
    enqueue(pool)  # some state, so "unchanged" means something
    before, size = backend.keyspace(), backend.raw.dbsize()
    fields: dict[str, Any] = {"image": "busybox", "command": ["true"], **BAD_SPECS[case]}
    with pytest.raises(errors.InvalidSpec):
        pool.enqueue(**fields)
    assert backend.raw.dbsize() == size and backend.keyspace() == before


def test_a_mount_under_a_bind_root_is_accepted(backend: Backend) -> None:
    pool = backend.pool(bind_roots=("/srv/jobs",))
    job = enqueue(pool, mounts=["/srv/jobs/a:/data:ro", "/srv/jobs:/all"])
    assert job.spec.mounts == ("/srv/jobs/a:/data:ro", "/srv/jobs:/all")


GARBAGE_IDS = ["0" * 32, "", None, 7, "a b", "a:b", "{x}", "x" * 129, "line\nbreak"]


@pytest.mark.parametrize(("call", "job_id"), [
    (call, job_id) for call in ("get", "cancel", "pause", "resume", "evict", "logs") for job_id in GARBAGE_IDS
    if not (job_id is None and call in ("pause", "resume"))  # None there means the whole queue
], ids=repr)
def test_unknown_or_garbage_id_is_not_found_and_writes_nothing(backend: Backend, call: str,
                                                               job_id: Any) -> None:
    pool = backend.pool()
    enqueue(pool)
    enqueue(pool)
    before = backend.keyspace()
    calls: dict[str, Callable[[Any], object]] = {
        "get": pool.get, "cancel": pool.cancel, "pause": pool.pause, "resume": pool.resume,
        "evict": lambda i: pool.evict(i, 1), "logs": pool.logs}
    fn = calls[call]
    with pytest.raises(errors.NotFound):
        fn(job_id)
    assert backend.keyspace() == before


@pytest.mark.parametrize("call", [
    lambda p: p.set_slots(-1), lambda p: p.set_slots(100_001), lambda p: p.set_slots(True),
    lambda p: p.set_slots(1.5), lambda p: p.set_slots("3"), lambda p: p.set_slots(None),
    lambda p: p.list(limit=0), lambda p: p.list(limit=-5), lambda p: p.list(limit=True),
    lambda p: p.list(limit="10"), lambda p: p.list(state="bogus"), lambda p: p.list(state="RUNNING"),
], ids=["slots-neg", "slots-big", "slots-bool", "slots-float", "slots-str", "slots-none", "limit-0",
        "limit-neg", "limit-bool", "limit-str", "state-bogus", "state-upper"])
def test_invalid_argument_writes_nothing(backend: Backend, call: Any) -> None:
    pool = backend.pool()
    enqueue(pool)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument):
        call(pool)
    assert backend.keyspace() == before


# ---- reading ------------------------------------------------------------------------------------------


def test_list_and_stats_follow_the_state_indexes(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2)
    jobs = [enqueue(pool, str(i)) for i in range(5)]
    claim(pool, jobs[0].id).finish("exit", 0)
    claim(pool, jobs[1].id).finish("exit", 1)
    pool.cancel(jobs[4].id)
    pool.pause(jobs[3].id)  # jobs[2] and jobs[3] were promoted when slots freed; 3 is unclaimed: paused
    assert [j.id for j in pool.list("running")] == [jobs[2].id]
    assert [j.id for j in pool.list("paused")] == [jobs[3].id]
    assert [j.id for j in pool.list("succeeded")] == [jobs[0].id]
    assert [j.id for j in pool.list("failed")] == [jobs[1].id]
    assert [j.id for j in pool.list("cancelled")] == [jobs[4].id]
    assert [j.id for j in pool.list()] == [j.id for j in jobs]
    assert [j.id for j in pool.list(limit=2)] == [jobs[3].id, jobs[4].id]
    stats = pool.stats()
    assert stats["counts"] == {"queued": 0, "waiting": 0, "running": 1, "paused": 1, "succeeded": 1,
                               "failed": 1, "cancelled": 1}
    assert stats["slots"] == {"used": 1, "max": 2} and not stats["queue_paused"]


def test_pools_are_isolated(backend: Backend) -> None:
    a = backend.pool(pool="alpha", max_concurrent_jobs=1)
    b = backend.pool(pool="beta", max_concurrent_jobs=1)
    ja, jb = enqueue(a, coalesce=True), enqueue(b, coalesce=True)
    assert ja.state is JobState.RUNNING and jb.state is JobState.RUNNING  # one slot each
    with pytest.raises(errors.NotFound):
        a.get(jb.id)
    assert rq_list(a) == [ja.id] and rq_list(b) == [jb.id]
    assert a.keys.rq_queue == "rq:queue:jobpool-alpha"
    for key in cast("list[bytes]", backend.raw.keys("*")):
        assert key.startswith((b"jobpool:{alpha}:", b"jobpool:{beta}:", b"rq:")), key
