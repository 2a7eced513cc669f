"""`JobSpec.init`: containers run with an init process unless a spec says otherwise; the field is checked
like the others and kept in the stored spec."""

from __future__ import annotations

import json

import pytest

from jobpool import InvalidSpec, Pool
from jobpool.cli.format import job_details
from jobpool.spec import JobSpec, build_spec

BASE = {"image": "busybox", "command": ["sh", "-c", "sleep 30"]}


def test_init_is_on_by_default_and_the_default_is_not_written() -> None:
    """A default spec's JSON is what the previous release wrote and reads (it refuses unknown fields)."""
    spec = build_spec(BASE)
    assert spec.init is True
    assert "init" not in json.loads(spec.to_json())
    assert JobSpec.from_json(spec.to_json()).init is True


def test_init_off_round_trips_and_is_another_spec() -> None:
    spec = build_spec({**BASE, "init": False})
    assert json.loads(spec.to_json())["init"] is False
    assert JobSpec.from_json(spec.to_json()) == spec
    assert spec.coalesce_key() != build_spec(BASE).coalesce_key(), "with and without init are not one job"


def test_a_spec_stored_before_the_field_existed_reads_back_with_init() -> None:
    stored = json.loads(build_spec(BASE).to_json())
    stored.pop("init", None)
    assert JobSpec.from_json(json.dumps(stored)).init is True


@pytest.mark.parametrize("bad", [None, 1, 0, "true", "false", [], {}])
def test_init_must_be_a_bool(bad: object) -> None:
    with pytest.raises(InvalidSpec, match="init must be true or false"):
        build_spec({**BASE, "init": bad})


def test_show_and_json_say_whether_a_job_has_init(pool: Pool) -> None:
    job = pool.get(pool.enqueue("busybox", ["true"], init=False).id)
    assert job.to_dict()["spec"]["init"] is False
    assert "no (the command runs as PID 1)" in job_details(job, 0)
