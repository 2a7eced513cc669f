"""`Assembler` (jobpool/fastinit.py) makes the JobSpec of `build_spec` and the Job of `Pool.enqueue` without
their dataclass `__init__`: what it makes must be what `__init__` makes from the same values, in every way a
caller can tell (equality, repr, frozen fields, the stored JSON; neither is hashable: a spec holds dicts)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jobpool.fastinit import Assembler
from jobpool.models import Job
from jobpool.spec import JobSpec, build_spec
from jobpool.status import Worker
from tests.support.pool_helpers import Backend

SPECS = [
    {"image": "busybox", "command": ["true"]},
    {"image": "img", "command": ["sh", "-c", "x"], "env": {"B": "2", "A": "1"}, "workdir": "/w",
     "user": "1000", "network": "jobs", "cpus": 1.5, "memory": "512m", "labels": {"team": "data"},
     "mounts": ["/data/in:/in:ro"], "init": False},
]


def same(made: Any, by_init: Any) -> None:
    assert made == by_init and repr(made) == repr(by_init)
    assert type(made) is type(by_init)
    assert vars(made).keys() >= {f.name for f in dataclasses.fields(by_init)}, "every field is set"
    name = dataclasses.fields(made)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, name, "changed")


@pytest.mark.parametrize("fields", SPECS, ids=["minimal", "every-field"])
def test_a_built_spec_is_what_init_makes(fields: dict[str, Any]) -> None:
    spec = build_spec(fields, ["/data"])
    by_init = JobSpec(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(JobSpec)})
    same(spec, by_init)
    assert spec.to_json() == by_init.to_json()
    assert JobSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize("fields", SPECS, ids=["minimal", "every-field"])
@pytest.mark.parametrize("slots", [0, 1], ids=["queued", "promoted"])
def test_an_enqueued_job_is_what_init_makes_and_what_its_row_says(backend: Backend, fields: dict[str, Any],
                                                                  slots: int) -> None:
    pool = backend.pool(max_concurrent_jobs=slots, bind_roots=("/data",))
    job = pool.enqueue(**fields, coalesce_key="same inputs")
    by_init = Job(**{f.name: getattr(job, f.name) for f in dataclasses.fields(Job)})
    same(job, by_init)
    assert job == pool.get(job.id), "the row read back"


class _Plain:
    pass


@dataclasses.dataclass
class _NotFrozen:
    a: int


@dataclasses.dataclass(frozen=True)
class _PostInit:
    a: int

    def __post_init__(self) -> None:
        pass


@dataclasses.dataclass(frozen=True, slots=True)
class _Slots:
    a: int


@pytest.mark.parametrize("cls", [_Plain, _NotFrozen, _PostInit, _Slots])
def test_a_class_init_does_more_for_is_refused(cls: type) -> None:
    with pytest.raises(TypeError):
        Assembler(cls)


@pytest.mark.parametrize(("record", "live_restore"), [
    ({}, None),
    ({"host": "h", "pid": "12", "pidns": "pid:[1]", "kernel_boot_id": "k", "daemon_id": "d",
      "executor": "docker", "started_at": "1700000000000", "draining": "True", "cannot_claim": "disk",
      "stuck": "x", "live_restore": "swarm"}, False),
    ({"pid": "junk", "started_at": "", "live_restore": "1"}, True),
], ids=["empty", "every-field", "junk"])
def test_a_status_worker_is_what_init_makes(record: dict[str, str], live_restore: bool | None) -> None:
    made = Worker.from_record("boot", record, 1_700_000_001_000.0, 1_700_000_002_500, ("a", "b"), 3)
    by_init = Worker(**{f.name: getattr(made, f.name) for f in dataclasses.fields(Worker)})
    same(made, by_init)
    assert (made.heartbeat_age_ms, made.running, made.jobs) == (1_500, 3, ("a", "b"))
    assert made.live_restore is live_restore and made.swarm == (record.get("live_restore") == "swarm")
    assert made.pid == (12 if record.get("pid") == "12" else None)
