"""Daemon marks (jobpool/fleet/daemonmark.py): the comparison that tells two daemons sharing one identity
apart, as a pure function, and its scripts (daemon_mark.lua, daemon_unmark.lua, give_back.lua) on
fakeredis[lua] and a real redis-server."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping

import pytest

from jobpool import errors, procid
from jobpool.api import Pool
from jobpool.fleet import daemonmark, markrecords
from jobpool.fleet.daemonmark import judge
from jobpool.fleet.markrecords import Peer

ID = "jpd1:" + "a" * 32 + "@boot-1"
OTHER = "jpd1:" + "b" * 32 + "@boot-1"
ME = "me"
WHERE = "worker pid 1 on host h1 at DOCKER_HOST unix:///a.sock"


def peer(pid: str, daemon: str = ID, verified: tuple[str, ...] = (ME,), collision: str = "") -> Peer:
    return Peer(pid, "worker", "h2", "2", f"unix:///{pid}.sock", daemon, daemonmark.volume_name(pid),
                frozenset(verified), collision)


def run(peers: Mapping[str, Peer], marks: set[str], missing: Mapping[str, float] | None = None,
        now: float = 100.0, registered: bool = True, standing: str = "",
        gone: frozenset[str] = frozenset()) -> daemonmark.Judgement:
    everyone = {ME: Peer(ME, daemon_id=ID, mark=daemonmark.volume_name(ME)), **peers}
    return judge(ME, WHERE, ID, marks | {daemonmark.volume_name(ME)}, everyone, missing or {}, now, 1.0,
                 registered, standing, gone)


def test_alone_on_an_identity_is_trusted_once_registered() -> None:
    assert run({}, set()).why == ""
    assert "not registered" in run({}, set(), registered=False).why


def test_peers_on_other_daemons_are_not_compared() -> None:
    j = run({"x": peer("x", OTHER, verified=())}, set())
    assert j.why == "" and not j.collided and j.verified == frozenset()


def test_a_peer_on_this_daemon_must_see_my_mark_too() -> None:
    mark = {daemonmark.volume_name("x")}
    assert run({"x": peer("x")}, mark).why == ""
    j = run({"x": peer("x", verified=())}, mark)
    assert "has not seen this one's mark yet" in j.why and not j.collided
    assert j.verified == frozenset({"x"})


def test_a_missing_mark_is_a_collision_only_once_confirmed() -> None:
    j = run({"x": peer("x")}, set(), now=100.0)
    assert "is not on this daemon (yet)" in j.why and not j.collided and j.missing == {"x": 100.0}
    j = run({"x": peer("x")}, set(), missing=j.missing, now=100.5)
    assert not j.collided
    j = run({"x": peer("x")}, set(), missing=j.missing, now=101.0)
    assert j.collided and j.collision == j.why
    assert "unix:///a.sock" in j.why and "unix:///x.sock" in j.why and "h1" in j.why and "h2" in j.why
    # Found again (its owner made it again after a prune): forgotten.
    j = run({"x": peer("x")}, {daemonmark.volume_name("x")}, missing=j.missing, now=102.0)
    assert j.why == "" and j.missing == {}


def test_a_peers_report_refuses_here_too() -> None:
    report = f"daemon identity {ID} is shared by two docker daemons: ..."
    j = run({"x": peer("x", collision=report)}, {daemonmark.volume_name("x")})
    assert j.why == report and j.collided and j.collision == ""


def test_a_standing_collision_refuses_with_no_peer_left() -> None:
    """The clone's processes all died (or never ran again): the remembered collision still holds."""
    report = f"daemon identity {ID} is shared by two docker daemons: ..."
    j = run({}, set(), standing=report)
    assert j.why == report and j.collided and j.collision == ""
    assert run({}, set()).why == "", "nothing remembered: trusted"


def test_a_dead_peer_is_not_waited_for_but_its_report_counts() -> None:
    j = run({"x": peer("x", verified=())}, set(), missing={"x": 0.0}, gone=frozenset({"x"}))
    assert j.why == "" and j.missing == {} and not j.collided, "a dead peer's missing mark: not awaited"
    report = f"daemon identity {ID} is shared by two docker daemons: ..."
    j = run({"x": peer("x", collision=report)}, set(), gone=frozenset({"x"}))
    assert j.why == report and j.collided, "a dead peer's report is no less a collision"


def test_collisions_by_identity() -> None:
    peers = {"a": peer("a", collision="shared a"), "b": peer("b", collision="shared b"),
             "c": peer("c", OTHER)}
    assert markrecords.collisions(peers) == {ID: "shared a"}
    assert markrecords.collisions(peers, {ID: "standing", OTHER: "standing too"}) == {
        ID: "standing", OTHER: "standing too"}


def mark(pool: Pool, pid: str, ttl_ms: int = 60_000, **fields: str) -> list[object]:
    """Register `pid` (scripts/daemon_mark.lua, daemon_collision.lua); the reply as the scripts give it."""
    marked = pool.store.daemon_mark(pid, ttl_ms, 10 * ttl_ms,
                                    [(name, fields.get(name, "")) for name in markrecords.FIELDS])
    return [0, marked.at, int(marked.recorded)]


def test_a_record_is_written_whole_with_a_ttl_and_read_back(pool: Pool) -> None:
    mark(pool, "p1", daemon_id=ID, mark="m1", verified="p2 p3", collision="")
    mark(pool, "p2", daemon_id=ID, mark="m2", collision="shared")
    assert 0 < pool.store.client.pttl(pool.keys.daemon_mark("p1")) <= 60_000
    peers = markrecords.read_peers(pool.store)
    assert peers["p1"].verified == frozenset({"p2", "p3"}) and peers["p1"].mark == "m1"
    assert markrecords.read_collisions(pool.store) == {ID: "shared"}
    mark(pool, "p1", daemon_id=ID, mark="m1")  # written whole: the old `verified` goes
    assert markrecords.read_peers(pool.store)["p1"].verified == frozenset()
    k = pool.keys
    keys = [k.daemon_mark("p2"), k.daemon_marks, k.daemon_mark_v("p2")]
    assert pool.store.run("daemon_unmark", keys, ["p2"])[1] == 1
    assert set(markrecords.read_peers(pool.store)) == {"p1"}
    assert pool.store.client.zscore(k.daemon_marks, "p2") is None


def test_the_pool_index_is_trimmed_once_a_turn(pool: Pool) -> None:
    # Entries of `daemon_marks` older than the forget time go at the scan turn's holder's write (one process a
    # turn), at the write of a caller that takes no turn, and at a process's first write; not at every write.
    c, k = pool.store.client, pool.keys
    fields = [(name, ID if name == "daemon_id" else "") for name in markrecords.FIELDS]

    def write(pid: str, scan_ms: int = 60_000) -> bool:
        return pool.store.daemon_mark(pid, 60_000, 600_000, fields, scan_ms=scan_ms).scan

    c.zadd(k.daemon_marks, {"long-gone": 1})
    assert write("p1")  # took the turn
    assert c.zscore(k.daemon_marks, "long-gone") is None
    c.zadd(k.daemon_marks, {"long-gone": 1})
    assert not write("p1"), "the turn is held"
    assert c.zscore(k.daemon_marks, "long-gone") == 1, "no trim"
    write("p2")  # a first write: trims
    assert c.zscore(k.daemon_marks, "long-gone") is None
    c.zadd(k.daemon_marks, {"long-gone": 1})
    write("p2")
    assert c.zscore(k.daemon_marks, "long-gone") == 1
    write("p2", scan_ms=0)  # takes no turn: trims
    assert c.zscore(k.daemon_marks, "long-gone") is None
    # The turn's key edited by hand (no turn is ever taken again): the next process's first write trims.
    c.delete(k.daemon_marks_scan)
    c.hset(k.daemon_marks_scan, "x", "1")
    c.zadd(k.daemon_marks, {"long-gone": 1})
    assert not write("p3") and c.zscore(k.daemon_marks, "long-gone") is None
    assert set(c.zrange(k.daemon_marks, 0, -1)) == {"p1", "p2", "p3"}


def test_a_job_taken_while_refused_is_given_back_at_the_head(pool: Pool) -> None:
    k = pool.keys
    queue, taken = k.rq_queue, k.rq_queue + ":intermediate"
    seen = taken + ":first_seen:first"  # RQ's maintenance noted it in the intermediate list meanwhile
    pool.store.client.rpush(queue, "second")
    pool.store.client.rpush(taken, "first")
    pool.store.client.set(seen, "1700000000", ex=86400)
    assert pool.store.give_back(queue, taken, seen, "first") is True
    assert pool.store.client.lrange(queue, 0, -1) == ["first", "second"]
    assert not pool.store.client.exists(taken)
    assert not pool.store.client.exists(seen), "a later delivery is not failed early by RQ's maintenance"
    assert pool.store.give_back(queue, taken, seen, "first") is False, "not taken: nothing done"
    assert pool.store.client.lrange(queue, 0, -1) == ["first", "second"]


def test_a_peer_seen_dead_from_here_is_gone_and_nothing_else_is() -> None:
    child = subprocess.Popen(["sleep", "30"])
    ident = procid.identity_of(child.pid)
    assert not Peer("x", process=json.dumps(ident)).gone(), "alive"
    child.kill()
    child.wait()
    assert Peer("x", process=json.dumps(ident)).gone()
    assert not Peer("x", process=json.dumps({**ident, "boot_id": "another-kernel"})).gone(), "cannot tell"
    assert not Peer("x").gone() and not Peer("x", process="garbage").gone()


def test_a_reported_collision_is_remembered_until_cleared(pool: Pool) -> None:
    assert mark(pool, "p1", daemon_id=ID, mark="m1")[2] == 0
    assert markrecords.read_standing(pool.store) == {}
    assert mark(pool, "p2", daemon_id=ID, mark="m2", collision="shared, first")[2] == 1
    assert mark(pool, "p1", daemon_id=ID, mark="m1", collision="shared, second")[2] == 0, "the first kept"
    standing = markrecords.read_standing(pool.store)
    assert set(standing) == {ID} and standing[ID].line == "shared, first" and standing[ID].by == "p2"
    assert standing[ID].at > 0 and markrecords.read_standing(pool.store, ID) == standing
    # Both processes gone (their records with them): the collision stands.
    k = pool.keys
    for pid in ("p1", "p2"):
        pool.store.run("daemon_unmark", [k.daemon_mark(pid), k.daemon_marks, k.daemon_mark_v(pid)], [pid])
    assert markrecords.read_peers(pool.store) == {}
    assert markrecords.read_collisions(pool.store) == {ID: "shared, first"}
    assert [e["reason"] for e in pool.events() if e["reason"].startswith("daemon_collision")] == [
        "daemon_collision"]


def test_clearing_a_collision(pool: Pool) -> None:
    mark(pool, "p1", daemon_id=ID, mark="m1", collision="shared")
    mark(pool, "p2", daemon_id=OTHER, mark="m2", collision="shared other")
    mark(pool, "p3", daemon_id=ID, mark="m3")
    before = {k: v for k, v in pool.store.client.hgetall(pool.keys.shared_daemons).items()}
    for bad in ("", "nonsense", ID + " ", 7, None, "jpd1:" + "a" * 31 + "@boot-1"):
        with pytest.raises(errors.InvalidArgument, match="not a daemon identity"):
            markrecords.forget_collision(pool, bad)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidArgument, match="note"):
        markrecords.forget_collision(pool, ID, note="x" * 1001)
    none_here = "jpd1:" + "c" * 32 + "@boot-1"
    with pytest.raises(errors.InvalidArgument, match="no collision stands"):
        markrecords.forget_collision(pool, none_here)
    assert pool.store.client.hgetall(pool.keys.shared_daemons) == before, "written on a refusal"
    assert pool.forget_collision(ID, note="clone re-identified") > 0
    assert set(markrecords.read_standing(pool.store)) == {OTHER}
    peers = markrecords.read_peers(pool.store)
    assert peers["p1"].collision == "" and peers["p2"].collision == "shared other", "only that identity's"
    assert markrecords.read_collisions(pool.store) == {OTHER: "shared other"}
    cleared = [e for e in pool.events() if e["reason"] == "daemon_collision_cleared"]
    assert len(cleared) == 1 and ID in cleared[0]["evidence"]
    assert "clone re-identified" in cleared[0]["evidence"]
    with pytest.raises(errors.InvalidArgument, match="no collision stands"):
        markrecords.forget_collision(pool, ID)
    # Still there: the next report records it again.
    mark(pool, "p1", daemon_id=ID, mark="m1", collision="shared again")
    assert markrecords.read_standing(pool.store)[ID].line == "shared again"
