"""A spec's stored JSON holds every field, and reads back equal (it is written by hand, not by asdict)."""

from __future__ import annotations

import dataclasses
import json

from jobpool.spec import JobSpec, build_spec


def test_every_field_is_stored_and_round_trips() -> None:
    spec = build_spec({"image": "img", "command": ["sh", "-c", "x"], "env": {"A": "1"}, "workdir": "/w",
                       "user": "1000", "network": "jobs", "cpus": 1.5, "memory": "512m",
                       "labels": {"team": "data"}, "mounts": [], "init": False})
    stored = json.loads(spec.to_json())
    assert set(stored) == {f.name for f in dataclasses.fields(JobSpec)}
    assert JobSpec.from_json(spec.to_json()) == spec
    assert spec.to_json() == json.dumps(stored, separators=(",", ":"), sort_keys=True)
