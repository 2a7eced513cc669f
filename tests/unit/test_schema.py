"""The pool's layout version (jobpool/store/schema.py, scripts/set_schema.lua, jobpool/migrate.py): recorded
by the script that makes a pool, read as version 1 for a pool of jobpool 0.1.0 (none recorded), recorded by an
explicit, idempotent `migrate`, and a pool newer than this release refused before any state change, with
nothing written, at once by a process that starts and within `RECHECK_SECS` by one that runs."""

from __future__ import annotations

import pytest

from jobpool import PoolTooNew
from jobpool.contract import SCHEMA_VERSION
from jobpool.migrate import STEPS, migrate
from jobpool.store import schema
from tests.support.pool_helpers import Backend, enqueue


def test_a_new_pool_records_the_version_that_made_it(backend: Backend) -> None:
    pool = backend.pool()
    enqueue(pool, "true")
    assert pool.store.recorded_schema() == str(SCHEMA_VERSION)
    assert pool.store.check_schema() == SCHEMA_VERSION


def test_a_pool_of_the_first_release_is_read_as_it_is_and_migrated_only_when_asked(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool, "true")
    pool.store.client.hdel(pool.keys.config, schema.FIELD)  # what jobpool 0.1.0 made: no version recorded
    assert pool.store.check_schema() == schema.UNRECORDED
    assert pool.get(job.id).id == job.id
    assert pool.store.recorded_schema() is None, "read as it is, not written"
    before = backend.keyspace()
    dry = migrate(pool.store, dry_run=True)
    assert (dry.before, dry.recorded, dry.after, dry.dry_run) == (1, False, SCHEMA_VERSION, True)
    assert backend.keyspace() == before, "a dry run changes nothing"
    done = migrate(pool.store)
    assert (done.before, done.recorded, done.after) == (1, False, SCHEMA_VERSION)
    assert "recorded" in done.line()
    assert pool.store.recorded_schema() == str(SCHEMA_VERSION)
    again = migrate(pool.store)
    assert (again.before, again.recorded, again.steps) == (SCHEMA_VERSION, True, ())
    assert "nothing to do" in again.line()


def test_a_pool_newer_than_this_release_is_refused_with_nothing_written(backend: Backend) -> None:
    pool = backend.pool()
    enqueue(pool, "true")
    pool.store.client.hset(pool.keys.config, schema.FIELD, SCHEMA_VERSION + 1)  # a later release migrated it
    fresh = backend.pool()  # a process that starts now: its first state change reads the version
    before = backend.keyspace()
    with pytest.raises(PoolTooNew, match=f"layout version {SCHEMA_VERSION + 1}, newer than this jobpool"):
        enqueue(fresh, "true")
    with pytest.raises(PoolTooNew):
        fresh.store.check_schema()
    with pytest.raises(PoolTooNew):
        migrate(fresh.store)
    with pytest.raises(PoolTooNew):
        fresh.store.set_schema(SCHEMA_VERSION)  # never taken back
    assert backend.keyspace() == before


def test_a_running_process_finds_the_pool_migrated_under_it_within_the_recheck(
        backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = backend.pool()
    enqueue(pool, "true")
    pool.store.client.hset(pool.keys.config, schema.FIELD, SCHEMA_VERSION + 1)
    enqueue(pool, "true")  # read less than RECHECK_SECS ago: not read again yet
    monkeypatch.setattr(schema, "RECHECK_SECS", 0.0)
    before = backend.keyspace()
    with pytest.raises(PoolTooNew):
        enqueue(pool, "true")
    assert backend.keyspace() == before


def test_a_version_that_is_no_number_is_refused_and_the_steps_cover_every_version() -> None:
    with pytest.raises(PoolTooNew, match="cannot read"):
        schema.stored_version("v2")
    assert schema.stored_version(None) == schema.stored_version("") == schema.UNRECORDED
    assert len(STEPS) == SCHEMA_VERSION - schema.UNRECORDED
