"""A comparing process's period in one script (scripts/daemon_mark_round.lua; jobpool/fleet/daemonmark.py
`Marker._refresh_and_read`): its record refreshed, then its identity's processes' records and the standing
collision read after it, in one call a period; a process new to the index since the last round read apart,
once. What it reads is what the separate reads (`read_peers`, `read_standing`) read. On fakeredis[lua] and a
real redis-server; the commands a round sends are counted on a real one (SLOWLOG)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from jobpool import errors
from jobpool.api import Pool
from jobpool.config import Settings
from jobpool.fleet import daemonmark, markrecords
from jobpool.store.redisurl import connect
from tests.support.polling import eventually
from tests.support.pool_helpers import Backend

ID = "jpd1:" + "c" * 32 + "@boot-1"
OTHER = "jpd1:" + "d" * 32 + "@boot-1"
#: Lua's own client in SLOWLOG: the commands a script ran, inside its own entry's time.
LUA_CLIENT = "?:0"


def marker(pool: Pool, pid: str, daemon: str = ID) -> daemonmark.Marker:
    """A Marker of process `pid` on `daemon`, as a round leaves it once its daemon's identity is known (the
    Docker side of the round, listing and making marks, is tests/integration/test_shared_identity.py's)."""
    m = daemonmark.Marker(pool.store, "worker", pid, docker_host="unix:///nowhere.sock")
    m.daemon_id = daemon
    return m


def compared(pool: Pool, m: daemonmark.Marker) -> tuple[dict[str, markrecords.Peer], str]:
    peers, standing, _, _ = m._refresh_and_read(m.daemon_id)
    return peers, standing


def test_a_round_reads_what_the_separate_reads_read(backend: Backend) -> None:
    pool = backend.pool()
    ms = {pid: marker(pool, pid) for pid in ("p1", "p2", "p3")}
    elsewhere = marker(pool, "q1", OTHER)
    compared(pool, elsewhere)
    for m in ms.values():
        compared(pool, m)
    for _ in range(2):  # the first round of p1 read p2 and p3 apart (new to it); this one in the script
        peers, standing = compared(pool, ms["p1"])
        assert peers == {i: p for i, p in markrecords.read_peers(pool.store, ID).items() if i != "p1"}
        assert set(peers) == {"p2", "p3"} and standing == ""
        assert ms["p1"]._peer_ids == ("p2", "p3")
    # A process gone from the index (stopped: its record removed) is no longer read; a new one is.
    ms["p2"].daemon_id = ID
    pool.store.daemon_unmark("p2", ID)
    compared(pool, marker(pool, "p4"))
    peers, _ = compared(pool, ms["p1"])
    assert set(peers) == {"p3", "p4"}
    assert ms["p1"]._peer_ids == ("p3", "p4")


def test_a_standing_collision_is_read_with_the_round(backend: Backend) -> None:
    pool = backend.pool()
    m = marker(pool, "p1")
    compared(pool, m)
    line = f"daemon identity {ID} is shared by two docker daemons: ..."
    fields = {name: "" for name in markrecords.FIELDS}
    fields.update(daemon_id=ID, mark=daemonmark.volume_name("p9"), collision=line)
    assert pool.store.daemon_mark("p9", 60_000, 600_000, list(fields.items())).recorded
    pool.store.daemon_unmark("p9", ID)  # its reporter gone: the collision stands
    peers, standing = compared(pool, m)
    assert peers == {} and standing == line
    assert markrecords.read_standing(pool.store, ID)[ID].line == standing


def test_a_record_edited_to_another_type_reads_as_none(backend: Backend) -> None:
    pool = backend.pool()
    m, other = marker(pool, "p1"), marker(pool, "p2")
    compared(pool, other)
    compared(pool, m)
    compared(pool, m)
    assert m._peer_ids == ("p2",)
    c = pool.store.client
    c.delete(pool.keys.daemon_mark("p2"))
    c.set(pool.keys.daemon_mark("p2"), "junk")
    # The record's digest is read from its own key (one MGET for every peer): a record edited alone reads as
    # its writer last wrote it, until its writer writes it again (each period).
    peers, _ = compared(pool, m)
    assert set(peers) == {"p2"}
    c.delete(pool.keys.daemon_mark_v("p2"))
    c.hset(pool.keys.daemon_mark_v("p2"), "junk", "1")  # its digest's key edited too: read whole
    peers, _ = compared(pool, m)
    assert peers == {}, "no record to compare with, and no error"
    compared(pool, other)  # its writer writes both again
    peers, _ = compared(pool, m)
    assert set(peers) == {"p2"} and c.type(pool.keys.daemon_mark_v("p2")) == "string"


def test_a_records_digest_key_lives_and_goes_with_it(backend: Backend) -> None:
    # Every writer of a record keeps its `v` in daemon_mark_v:<id> (what a round reads of its peers, in one
    # MGET): written with the record, for as long, removed when a record without `v` replaces it, and when
    # its process unmarks.
    pool = backend.pool()
    c, k = pool.store.client, pool.keys
    m = marker(pool, "p1")
    compared(pool, m)
    digest = c.get(k.daemon_mark_v("p1"))
    assert digest is not None and digest == c.hget(k.daemon_mark("p1"), "v")
    assert abs(c.pttl(k.daemon_mark_v("p1")) - c.pttl(k.daemon_mark("p1"))) < 1_000
    fields = {name: "" for name in markrecords.FIELDS}
    fields.update(daemon_id=ID, mark=daemonmark.volume_name("p1"))
    pool.store.daemon_mark("p1", 60_000, 600_000, list(fields.items()))  # its `v` empty: no digest
    assert not c.exists(k.daemon_mark_v("p1")) and c.exists(k.daemon_mark("p1"))
    compared(pool, m)
    assert c.exists(k.daemon_mark_v("p1"))
    pool.store.daemon_unmark("p1", ID)
    assert not c.exists(k.daemon_mark_v("p1"), k.daemon_mark("p1"))


def top_level(admin: redis.Redis) -> list[str]:
    """The commands clients sent since the last reset (not a script's own), by name, oldest first."""
    entries: list[dict[str, Any]] = list(reversed(admin.slowlog_get(10_000)))
    out = []
    for e in entries:
        cmd = e["command"]
        text = cmd.decode() if isinstance(cmd, bytes) else str(cmd)
        addr = e.get("client_address", b"")
        addr = addr.decode() if isinstance(addr, bytes) else str(addr)
        if addr != LUA_CLIENT:
            out.append(text.split()[0].upper())
    return out


def scripts_own(admin: redis.Redis) -> list[str]:
    """The commands scripts ran since the last reset, by name, oldest first."""
    entries: list[dict[str, Any]] = list(reversed(admin.slowlog_get(10_000)))
    out = []
    for e in entries:
        addr = e.get("client_address", b"")
        if (addr.decode() if isinstance(addr, bytes) else str(addr)) == LUA_CLIENT:
            cmd = e["command"]
            out.append((cmd.decode() if isinstance(cmd, bytes) else str(cmd)).split()[0].upper())
    return out


def test_a_round_in_a_steady_fleet_is_one_script(redis_url: str) -> None:
    """Ten processes on one identity: a round sends one EVALSHA, not the index's read, ten records' reads
    and the standing collision's read around a script (four round trips); one more read when a process is
    new to the index. In it, an unchanged record is refreshed in place and an index with no lapsed entry is
    not trimmed."""
    pool = Pool(connect(redis_url), Settings(redis_url=redis_url))
    ms = [marker(pool, f"p{i}") for i in range(10)]
    for m in ms:
        compared(pool, m)
    compared(pool, ms[0])
    admin = redis.Redis.from_url(redis_url)
    admin.config_set("slowlog-max-len", 10_000)
    admin.slowlog_reset()
    admin.config_set("slowlog-log-slower-than", 0)
    try:
        peers, _ = compared(pool, ms[0])
        own = scripts_own(admin)
        steady = [c for c in top_level(admin) if c not in ("SLOWLOG", "CONFIG")]
        admin.slowlog_reset()
        compared(pool, marker(pool, "p10"))
        admin.slowlog_reset()
        compared(pool, ms[0])
        joined = [c for c in top_level(admin) if c not in ("SLOWLOG", "CONFIG")]
    finally:
        admin.config_set("slowlog-log-slower-than", 10_000)
    assert len(peers) == 9
    assert steady == ["EVALSHA"], steady
    assert own == ["TIME", "HMGET", "HSET", "PEXPIRE", "SET", "SET", "ZADD", "ZADD", "ZRANGE", "PEXPIREAT",
                   "HGET", "MGET"], own
    assert joined == ["EVALSHA", "HGETALL"], joined


def test_an_unchanged_record_is_not_read_again_and_a_changed_one_is(backend: Backend) -> None:
    pool = backend.pool()
    me, other = marker(pool, "p1"), marker(pool, "p2")
    compared(pool, other)
    compared(pool, me)
    peers, _ = compared(pool, me)
    assert peers["p2"].verified == frozenset()
    fields = me._fields()
    known = [("p2", me._peer_records["p2"]["v"])]
    got = pool.store.daemon_mark_round("p1", me.ttl_ms, 10 * me.ttl_ms, fields, 0, known)
    assert got.unchanged == {"p2"} and got.records == {}, "as last read: one short read, not the record"
    # The peer's verdict changes (it saw p1's mark): its record says so, and the next round reads it.
    other._verified = frozenset({"p1"})
    other._register()
    peers, _ = compared(pool, me)
    assert peers["p2"].verified == frozenset({"p1"})
    got = pool.store.daemon_mark_round("p1", me.ttl_ms, 10 * me.ttl_ms, fields, 0, known)
    assert got.unchanged == frozenset() and got.records["p2"]["verified"] == "p1"
    # A record of a writer that says no `v` (an earlier release) is read whole every round.
    pool.store.client.hdel(pool.keys.daemon_mark("p2"), "v")
    got = pool.store.daemon_mark_round("p1", me.ttl_ms, 10 * me.ttl_ms, fields, 0, [("p2", "")])
    assert got.unchanged == frozenset() and got.records["p2"]["verified"] == "p1"


def test_an_unchanged_record_is_refreshed_in_place_and_any_other_written_whole(backend: Backend) -> None:
    """A steady process's record holds every field it writes each period: only its `at` and its keys' lives
    are written then (scripts/_lib.lua `write_mark`). A record that differs in any field (one edited by hand
    with its `v` kept: a new peer would read the edit), or lost `indexed`, or is of another type, is written
    whole, as it always was."""
    pool = backend.pool()
    c, k = pool.store.client, pool.keys
    me = marker(pool, "p1")
    compared(pool, me)
    rec = k.daemon_mark("p1")
    whole = c.hgetall(rec)
    c.hset(rec, "at", "1")  # only `at` differs: refreshed in place, both lives renewed
    c.pexpire(rec, 1_000)
    c.pexpire(k.daemon_mark_v("p1"), 1_000)
    compared(pool, me)
    after = c.hgetall(rec)
    assert int(after["at"]) >= int(whole["at"])
    assert c.pttl(rec) > 1_000 and c.pttl(k.daemon_mark_v("p1")) > 1_000, "both lives renewed"
    assert after | {"at": ""} == whole | {"at": ""}
    c.hset(rec, "junk", "x")  # a field the writer does not write is not compared: the refresh leaves it
    compared(pool, me)
    assert c.hget(rec, "junk") == "x"
    for edit in (lambda: c.hset(rec, "daemon_id", "jpd1:edited"), lambda: c.hset(rec, "mark", "edited"),
                 lambda: c.hset(rec, "pid", "edited"), lambda: c.hdel(rec, "verified"),
                 lambda: c.hdel(rec, "indexed"), lambda: c.hset(rec, "v", "other"),
                 lambda: (c.delete(rec), c.set(rec, "junk"))):
        edit()
        compared(pool, me)
        assert c.hgetall(rec) | {"at": ""} == whole | {"at": ""}, "written whole again"
    # A new verdict changes the digest: the record is written whole with it.
    me._verified = frozenset({"p2"})
    compared(pool, me)
    assert c.hget(rec, "verified") == "p2" and c.hget(rec, "v") != whole["v"]
    assert c.get(k.daemon_mark_v("p1")) == c.hget(rec, "v")


def test_the_identity_index_drops_lapsed_entries_and_lives_as_long_as_its_last(backend: Backend) -> None:
    """A round reads its identity's index in the call that finds whether an entry is past its score; one
    that is goes, and the index expires with its last entry whichever process wrote it."""
    pool = backend.pool()
    c, k = pool.store.client, pool.keys
    me, other = marker(pool, "p1"), marker(pool, "p2")
    compared(pool, me)
    index = k.daemon_marks_of(ID)
    c.zadd(index, {"lapsed": now_ms(pool) - 1})
    c.zadd(index, {"later": now_ms(pool) + 10 * me.ttl_ms})
    compared(pool, other)
    assert c.zscore(index, "lapsed") is None and other._peer_ids == ("p1", "later")
    assert c.pttl(index) > 9 * me.ttl_ms, "expires with its last entry"
    c.zrem(index, "later")
    compared(pool, me)
    assert 0 < c.pttl(index) <= me.ttl_ms and me._peer_ids == ("p2",)


def test_a_report_cleared_by_an_operator_is_read_again(backend: Backend) -> None:
    """forget_collision.lua edits the records that report the collision: their `v` goes with the report, so
    a peer that had read the report reads the record again, cleared."""
    pool = backend.pool()
    me = marker(pool, "p1")
    reporter = marker(pool, "p2")
    compared(pool, reporter)
    reporter._collision = f"daemon identity {ID} is shared by two docker daemons: ..."
    reporter._register()  # through daemon_collision.lua: the report stands in shared_daemons too
    compared(pool, me)
    peers, standing = compared(pool, me)
    assert peers["p2"].collision and standing
    assert markrecords.forget_collision(pool, ID) > 0
    peers, standing = compared(pool, me)
    assert peers["p2"].collision == "" and standing == ""


def test_a_peer_whose_read_failed_is_read_again_and_the_rounds_go_on(backend: Backend) -> None:
    """A process new to the index is read apart; should that read fail (here its key holds another type, as
    a transient error would also leave it), it is left out of that round and read whole by the next round's
    script, and the rounds go on reading what they must (a standing collision recorded since)."""
    pool = backend.pool()
    me = marker(pool, "p1")
    compared(pool, me)
    c, k = pool.store.client, pool.keys
    c.set(k.daemon_mark("pJ"), "junk")
    c.zadd(k.daemon_marks_of(ID), {"pJ": now_ms(pool) + 600_000})
    for _ in range(3):
        peers, standing = compared(pool, me)
        assert peers == {} and standing == ""
    assert me._peer_ids == ("pJ",)
    # The key made right again: read at the next round.
    c.delete(k.daemon_mark("pJ"))
    other = marker(pool, "pJ")
    compared(pool, other)
    peers, _ = compared(pool, me)
    assert set(peers) == {"pJ"}
    # A collision recorded meanwhile by a process since gone is read, as at any round.
    line = f"daemon identity {ID} is shared by two docker daemons: ..."
    fields = {name: "" for name in markrecords.FIELDS}
    fields.update(daemon_id=ID, mark=daemonmark.volume_name("p9"), collision=line)
    pool.store.daemon_mark("p9", 60_000, 600_000, list(fields.items()))
    pool.store.daemon_unmark("p9", ID)
    assert compared(pool, me)[1] == line


def now_ms(pool: Pool) -> int:
    secs, micros = pool.store.client.time()
    return int(secs) * 1000 + int(micros) // 1000


def test_a_reporting_process_reads_before_it_writes(backend: Backend) -> None:
    """A process that reports a collision reads the standing one before writing its record again: a report
    an operator cleared in between is not recorded again by a write of the verdict before it (the round
    judges first, and records it again only if the marks still differ)."""
    pool = backend.pool()
    reporter = marker(pool, "p2")
    compared(pool, reporter)
    reporter._collision = f"daemon identity {ID} is shared by two docker daemons: ..."
    reporter._register()
    assert markrecords.read_standing(pool.store, ID)
    assert markrecords.forget_collision(pool, ID) > 0
    _, standing, refreshed, registered = reporter._refresh_and_read(ID)
    assert (standing, refreshed, registered) == ("", False, True)
    assert markrecords.read_standing(pool.store, ID) == {}, "not recorded again by the read"


def test_a_standing_collision_that_cannot_be_read_fails_the_round(backend: Backend) -> None:
    pool = backend.pool()
    me = marker(pool, "p1")
    compared(pool, me)
    pool.store.client.set(pool.keys.shared_daemons, "junk")
    with pytest.raises(errors.JobpoolError):
        compared(pool, me)


def test_a_new_identity_starts_with_no_verdict_of_the_old(backend: Backend) -> None:
    """The daemon answers with another identity (its identity volume made anew): the old identity's report
    and verdict are not written under the new one."""
    pool = backend.pool()
    me = marker(pool, "p1")
    me._collision = f"daemon identity {ID} is shared by two docker daemons: ..."
    me._verified, me._collided = frozenset({"p2"}), True
    me._why = ""
    me._new_identity(OTHER)
    assert (me.daemon_id, me._collision, me._verified, me._collided) == (OTHER, "", frozenset(), False)
    assert "new identity" in me.refusal(), "not trusted until compared under the new identity"
    _, _, refreshed, _ = me._refresh_and_read(OTHER)
    assert refreshed and markrecords.read_standing(pool.store) == {}


def test_an_index_longer_than_one_call_reads_is_read_apart(backend: Backend) -> None:
    """The script returns at most a bounded number of the identity's processes (scripts never read a whole
    collection); an index that holds more is read whole apart, none missed."""
    pool = backend.pool()
    me = marker(pool, "p0")
    compared(pool, me)
    c, k = pool.store.client, pool.keys
    # Scored to expire before every record's entry, so they are the index's first 1,000.
    until = now_ms(pool) + 20_000
    c.zadd(k.daemon_marks_of(ID), {f"x{i}": until for i in range(1000)})
    fields = {name: "" for name in markrecords.FIELDS}
    fields.update(daemon_id=ID, mark=daemonmark.volume_name("late"))
    pool.store.daemon_mark("zz-late", 60_000, 600_000, list(fields.items()))  # sorts after the 1,000
    peers, _ = compared(pool, me)
    assert "zz-late" in peers and len(peers) == 1, "the x* entries have no record: not peers"
    assert me._peer_ids == (), "read apart: nothing named to the script next round"


def test_rounds_failing_past_the_records_life_end_the_trust(backend: Backend) -> None:
    """A round that fails keeps the last verdict, but not for longer than the process's record lives: its
    peers may no longer see it then. Here the rounds fail for real (its DOCKER_HOST answers nothing)."""
    pool = backend.pool()
    me = marker(pool, "p1")
    me._compared, me._why = True, ""  # as a round that succeeded leaves it, trusted
    me._fresh_until = time.monotonic() + me.ttl_ms / 1000
    me.round()
    assert me.refusal() == "", "one failed round: the last verdict stands"
    me._fresh_until = time.monotonic() - 1  # the last success began longer ago than the record lives
    me.round()
    assert "not compared for" in me.refusal()


def test_trust_ends_with_the_records_life_though_no_round_ends(backend: Backend) -> None:
    """A round hung on a dead connection fails no round: the trust still ends once the record the last
    round wrote may have expired, without the round thread."""
    pool = backend.pool()
    me = marker(pool, "p1")
    me._compared, me._why = True, ""
    me._fresh_until = time.monotonic() + 0.3
    assert me.refusal() == ""
    eventually(lambda: me.refusal() != "", timeout=5)
    assert "as long as its record lives" in me.refusal()


def test_the_digest_is_one_text_per_record() -> None:
    """Two records whose fields joined as `name=value` lines read the same differ in `v`."""
    base = {name: "" for name in markrecords.FIELDS if name != "v"}
    one = {**base, "host": "x\npid=", "pid": ""}
    two = {**base, "host": "x", "pid": "\npid="}
    assert markrecords.digest(one) != markrecords.digest(two)
    assert markrecords.digest(one) == markrecords.digest(dict(one))


def test_a_reporting_process_whose_record_was_lost_is_judged_unregistered(backend: Backend) -> None:
    """A process reporting a collision reads before it writes: should its record be gone (a Redis that
    restarted empty), it is judged not registered for that round, as a process that has just started is,
    not trusted on the strength of a read its peers could not have answered."""
    pool = backend.pool()
    reporter = marker(pool, "p2")
    compared(pool, reporter)
    reporter._collision = f"daemon identity {ID} is shared by two docker daemons: ..."
    reporter._register()
    pool.store.client.flushdb()
    peers, standing, refreshed, registered = reporter._refresh_and_read(ID)
    assert (peers, standing, refreshed, registered) == ({}, "", False, False)
    verdict = daemonmark.judge("p2", "here", ID, set(), peers, {}, 0.0, 10.0, registered)
    assert "not registered" in verdict.why
