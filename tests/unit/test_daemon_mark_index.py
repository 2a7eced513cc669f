"""The daemon marks' index per identity (scripts/daemon_mark.lua, daemon_mark_index.lua, daemon_unmark.lua;
jobpool/fleet/markrecords.py `read_peers`, `index_unindexed`): a process comparing marks reads only the
records of its own identity, every live one of them, none expired; records of an earlier release are
indexed for it. On fakeredis[lua] and a real redis-server."""

from __future__ import annotations

import pytest

from jobpool import errors
from jobpool.api import Pool
from jobpool.fleet import daemonmark, markrecords
from tests.support.polling import eventually

ID = "jpd1:" + "a" * 32 + "@boot-1"
OTHER = "jpd1:" + "b" * 32 + "@boot-1"


def mark(pool: Pool, pid: str, daemon: str = ID, ttl_ms: int = 60_000, scan_ms: int = 0,
         collision: str = "") -> bool:
    """Register `pid` as the Marker does; returns whether it took the turn to index unindexed records."""
    fields = {name: "" for name in markrecords.FIELDS}
    fields.update(daemon_id=daemon, mark=daemonmark.volume_name(pid), collision=collision)
    return pool.store.daemon_mark(pid, ttl_ms, 10 * ttl_ms, list(fields.items()), scan_ms).scan


def now_ms(pool: Pool) -> int:
    secs, micros = pool.store.client.time()
    return int(secs) * 1000 + int(micros) // 1000


def mark_as_before(pool: Pool, pid: str, daemon: str = ID, ttl_ms: int = 60_000) -> None:
    """What daemon_mark.lua of the release before the index (commit 0a18036) left: the record with `at`
    and the pool-wide index, nothing in the identity's index."""
    c, k = pool.store.client, pool.keys
    at = now_ms(pool)
    c.hset(k.daemon_mark(pid), mapping={"at": at, "daemon_id": daemon, "mark": daemonmark.volume_name(pid),
                                        "role": "worker", "verified": "", "collision": ""})
    c.pexpire(k.daemon_mark(pid), ttl_ms)
    c.zadd(k.daemon_marks, {pid: at})


def test_each_identity_reads_its_own_processes(pool: Pool) -> None:
    mark(pool, "p1")
    mark(pool, "p2")
    mark(pool, "p3", OTHER)
    assert set(markrecords.read_peers(pool.store, ID)) == {"p1", "p2"}
    assert set(markrecords.read_peers(pool.store, OTHER)) == {"p3"}
    assert set(markrecords.read_peers(pool.store)) == {"p1", "p2", "p3"}, "the pool-wide index as before"
    c, k = pool.store.client, pool.keys
    # Scored by when the record expires; the index expires with its last record.
    first = c.zscore(k.daemon_marks_of(ID), "p1")
    assert first is not None and 0 < c.pttl(k.daemon_marks_of(ID)) <= 60_000
    eventually(lambda: now_ms(pool) > first - 60_000 + 2, timeout=5, interval=0.002)
    mark(pool, "p1")  # refreshed: its score moves with its record's expiry
    again = c.zscore(k.daemon_marks_of(ID), "p1")
    assert again is not None and again > first
    # Moved to another identity: read there, and left out here though its old entry lingers until its score.
    mark(pool, "p2", OTHER)
    assert set(markrecords.read_peers(pool.store, ID)) == {"p1"}
    assert set(markrecords.read_peers(pool.store, OTHER)) == {"p2", "p3"}
    assert pool.store.daemon_unmark("p3", OTHER)
    assert c.zscore(k.daemon_marks_of(OTHER), "p3") is None and c.zscore(k.daemon_marks, "p3") is None
    assert set(markrecords.read_peers(pool.store, OTHER)) == {"p2"}


def test_a_dead_process_leaves_its_identitys_index(pool: Pool) -> None:
    c, k = pool.store.client, pool.keys
    mark(pool, "dead", ttl_ms=300)
    mark(pool, "live")
    eventually(lambda: not c.exists(k.daemon_mark("dead")), timeout=10, message="the record expired")
    assert set(markrecords.read_peers(pool.store, ID)) == {"live"}, "an expired record is not a peer"
    mark(pool, "live")  # the next write trims it
    assert c.zrange(k.daemon_marks_of(ID), 0, -1) == ["live"]
    # Every process of an identity dead: the index goes with the last record.
    mark(pool, "alone", OTHER, ttl_ms=300)
    eventually(lambda: not c.exists(k.daemon_marks_of(OTHER)), timeout=10, message="the index expired")


def test_a_record_must_name_the_index_it_enters(pool: Pool) -> None:
    c, k = pool.store.client, pool.keys
    with pytest.raises(errors.InvalidArgument):
        mark(pool, "p1", daemon="")
    fields: list[object] = ["p1", 60_000, 600_000, 0, "daemon_id", ID]
    with pytest.raises(errors.InvalidArgument):
        pool.store.run("daemon_mark", [k.daemon_mark("p1"), k.daemon_marks, k.daemon_marks_of(OTHER),
                                       k.daemon_marks_scan, k.daemon_mark_v("p1")], fields)
    own = [k.daemon_mark("p1"), k.daemon_marks, k.daemon_marks_of(ID), k.daemon_marks_scan,
           k.daemon_mark_v("p1")]
    with pytest.raises(errors.InvalidArgument, match="collision"):  # each script its own kind of record
        pool.store.run("daemon_mark", own, [*fields, "collision", "shared"])
    with pytest.raises(errors.InvalidArgument, match="collision"):
        pool.store.run("daemon_collision", [*own, k.shared_daemons], fields)
    with pytest.raises(errors.InvalidArgument):
        pool.store.run("daemon_mark_index", [k.daemon_mark("p1"), k.daemon_marks_of(OTHER)], ["p1", ID])
    assert not c.exists(k.daemon_mark("p1"), k.daemon_marks, k.daemon_marks_of(ID), k.daemon_marks_of(OTHER),
                        k.shared_daemons, k.daemon_mark_v("p1"))


def test_a_collision_is_found_through_the_index(pool: Pool) -> None:
    """Two processes on one identity, on two daemons (neither's mark on the other's): each reads the other
    from the index and, once the mark is missing long enough, concludes a collision that stands."""
    mark(pool, "a")
    mark(pool, "b")
    mark(pool, "elsewhere", OTHER)
    peers = markrecords.read_peers(pool.store, ID)
    assert set(peers) == {"a", "b"}
    j = daemonmark.judge("a", "worker on host h1", ID, {daemonmark.volume_name("a")}, peers, {"b": 0.0}, 10.0,
                         5.0, True)
    assert j.collision and "host h1" in j.collision and j.collided
    mark(pool, "a", collision=j.collision)
    assert markrecords.read_standing(pool.store, ID)[ID].line == j.collision
    assert markrecords.read_peers(pool.store, ID)["a"].collision == j.collision


def test_records_of_the_earlier_release_are_indexed_for_it(pool: Pool) -> None:
    """A pool upgraded process by process: an old process's record (no index entry) is entered in its
    identity's index by the process holding the turn, so the new ones compare against it; the new ones stay
    in the pool-wide index the old ones read."""
    c, k = pool.store.client, pool.keys
    mark_as_before(pool, "old")
    mark_as_before(pool, "old-elsewhere", OTHER)
    assert mark(pool, "new", scan_ms=60_000), "the turn taken"
    assert not mark(pool, "new2", scan_ms=60_000), "one holder at a time"
    assert not mark(pool, "new3"), "a caller that asks for no turn takes none"
    assert set(markrecords.read_peers(pool.store, ID)) == {"new", "new2", "new3"}
    assert markrecords.index_unindexed(pool.store) == 2
    assert set(markrecords.read_peers(pool.store, ID)) == {"new", "new2", "new3", "old"}
    assert set(markrecords.read_peers(pool.store, OTHER)) == {"old-elsewhere"}
    score = c.zscore(k.daemon_marks_of(ID), "old")
    assert score is not None and score <= now_ms(pool) + 60_000, "scored by its record's expiry"
    assert set(c.zrange(k.daemon_marks, 0, -1)) >= {"new", "new2", "new3", "old"}, "what old processes read"
    # Indexed only as read: a record that moved to another identity since, or that now indexes itself, is
    # left alone.
    c.hset(k.daemon_mark("old-elsewhere"), "daemon_id", ID)
    assert pool.store.daemon_mark_index([("old-elsewhere", OTHER)]) == 0
    assert pool.store.daemon_mark_index([("new", ID)]) == 0
    assert pool.store.daemon_mark_index([("gone", ID)]) == 0
    c.delete(k.daemon_marks_scan)
    assert mark(pool, "new2", scan_ms=60_000), "free again: taken"
