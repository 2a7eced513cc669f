"""A spec's stored JSON holds every field, and reads back equal (it is written by hand, not by asdict)."""

from __future__ import annotations

import dataclasses
import json

import hypothesis.strategies as st
import pytest
from hypothesis import given

from jobpool.errors import InvalidSpec
from jobpool.spec import MAX_SPEC_BYTES, JobSpec, build_spec


def test_every_field_is_stored_and_round_trips() -> None:
    spec = build_spec({"image": "img", "command": ["sh", "-c", "x"], "env": {"A": "1"}, "workdir": "/w",
                       "user": "1000", "network": "jobs", "cpus": 1.5, "memory": "512m",
                       "labels": {"team": "data"}, "mounts": [], "init": False, "checkpoint": False,
                       "priority": -3, "slots": 2, "uses": {"gpu": 2, "dataset:a": 1}, "group": "tenant-a",
                       "timeout": 7200, "retries": 2, "retry_delay": 30, "retry_on": [3, 1]})
    stored = json.loads(spec.to_json())
    assert set(stored) == {f.name for f in dataclasses.fields(JobSpec)}
    assert JobSpec.from_json(spec.to_json()) == spec
    assert spec.to_json() == json.dumps(stored, separators=(",", ":"), sort_keys=True)


_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=8)
_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)


@given(command=st.lists(_text, min_size=1, max_size=4), env=st.dictionaries(_names, _text, max_size=5),
       labels=st.dictionaries(_text.filter(lambda k: k and not k.startswith("jobpool.")), _text, max_size=5),
       cpus=st.none() | st.integers(1, 64) | st.floats(0.01, 1024), init=st.booleans(),
       checkpoint=st.booleans(), user=st.none() | _text.filter(bool),
       memory=st.none() | st.sampled_from(["1", "512m", "2G"]))
def test_the_json_is_canonical_whatever_the_order_of_env_and_labels(command: list[str], env: dict[str, str],
                                                                   labels: dict[str, str], cpus: float | None,
                                                                   init: bool, checkpoint: bool,
                                                                   user: str | None,
                                                                   memory: str | None) -> None:
    """The stored JSON (and so a coalesce key) is `json.dumps` with sorted keys of every field, `init` and
    `checkpoint` only when off, the order and limits only when set: `JobSpec._json` writes the keys in that
    order itself, and sorts env and
    labels, whatever order the caller's mappings had."""
    spec = build_spec({"image": "img", "command": command, "env": env, "labels": labels, "cpus": cpus,
                       "init": init, "checkpoint": checkpoint, "user": user, "memory": memory})
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(JobSpec)}
    fields.update(command=list(spec.command), env=dict(reversed(env.items())),
                  labels=dict(reversed(labels.items())), mounts=list(spec.mounts))
    for switch, on in (("init", init), ("checkpoint", checkpoint)):
        if on:
            del fields[switch]
    # Order and limits, time limit and retries: only when not the default.
    for default in ("priority", "slots", "uses", "group", "timeout", "retries", "retry_delay", "retry_on"):
        del fields[default]
    assert spec.to_json() == json.dumps(fields, separators=(",", ":"), sort_keys=True)


def test_the_size_limit_counts_the_stored_bytes_of_any_text() -> None:
    """The limit compares the JSON's length in characters: every character is one byte because the encoder
    escapes all that is not ASCII. Multi-byte text just over the limit in stored bytes is refused."""
    spec = build_spec({"image": "img", "command": ["é€😀"]})
    assert spec.to_json().isascii() and len(spec.to_json()) == len(spec.to_json().encode())
    base = len(build_spec({"image": "img", "command": [""], "env": {"A": ""}}).to_json())
    per_char = len(json.dumps("€")) - 2  # \u20ac: six stored bytes per character
    fits = (MAX_SPEC_BYTES - base) // per_char
    assert build_spec({"image": "img", "command": [""], "env": {"A": "€" * fits}})
    with pytest.raises(InvalidSpec, match="larger than"):
        build_spec({"image": "img", "command": [""], "env": {"A": "€" * (fits + 1)}})
