"""The spec's two switches, `JobSpec.init` (containers run with an init process) and `JobSpec.checkpoint`
(the job keeps a checkpoint across attempts): on unless a spec says otherwise, checked like the other fields,
kept in the stored spec, and written there only when off (a spec with the defaults reads as the previous
release wrote it)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobpool import InvalidSpec, Pool
from jobpool.cli.format import job_details
from jobpool.spec import JobSpec, build_spec

BASE = {"image": "busybox", "command": ["sh", "-c", "sleep 30"]}
SWITCHES = ["init", "checkpoint"]


@pytest.mark.parametrize("name", SWITCHES)
def test_on_by_default_and_the_default_is_not_written(name: str) -> None:
    """A default spec's JSON is what the previous release wrote and reads (it refuses unknown fields)."""
    spec = build_spec(BASE)
    assert getattr(spec, name) is True
    assert name not in json.loads(spec.to_json())
    assert getattr(JobSpec.from_json(spec.to_json()), name) is True


@pytest.mark.parametrize("name", SWITCHES)
def test_off_round_trips_and_is_another_spec(name: str) -> None:
    spec = build_spec({**BASE, name: False})
    assert json.loads(spec.to_json())[name] is False
    assert JobSpec.from_json(spec.to_json()) == spec
    assert spec.coalesce_key() != build_spec(BASE).coalesce_key(), f"with and without {name}: not one job"


def test_both_off_is_canonical_json() -> None:
    text = build_spec({**BASE, "init": False, "checkpoint": False}).to_json()
    assert text == json.dumps(json.loads(text), separators=(",", ":"), sort_keys=True)


@pytest.mark.parametrize("name", SWITCHES)
def test_a_spec_stored_before_the_field_existed_reads_back_with_it_on(name: str) -> None:
    stored = json.loads(build_spec(BASE).to_json())
    stored.pop(name, None)
    assert getattr(JobSpec.from_json(json.dumps(stored)), name) is True


@pytest.mark.parametrize("bad", [None, 1, 0, "true", "false", [], {}])
@pytest.mark.parametrize("name", SWITCHES)
def test_must_be_a_bool(name: str, bad: object) -> None:
    with pytest.raises(InvalidSpec, match=f"{name} must be true or false"):
        build_spec({**BASE, name: bad})


@pytest.mark.parametrize(("name", "says"), [("init", "no (the command runs as PID 1)"),
                                        ("checkpoint", "no (no JOBPOOL_CHECKPOINT_DIR, no affinity)")])
def test_show_and_json_say_when_a_switch_is_off(pool: Pool, name: str, says: str) -> None:
    switch: dict[str, Any] = {name: False}
    job = pool.get(pool.enqueue("busybox", ["true"], **switch).id)
    assert job.to_dict()["spec"][name] is False
    assert says in job_details(job, 0)
    on = pool.get(pool.enqueue("busybox", ["true"]).id)
    assert on.to_dict()["spec"][name] is True and says not in job_details(on, 0)
