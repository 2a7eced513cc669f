"""bench/scale.py's readings of Redis can be trusted: SLOWLOG entries are read in order, a script's own
commands are told from the clients' (and put inside its time, not beside it), scripts are named by the SHA the
store sends, keys are reduced to their kind, and the lean client's commands are what Redis's protocol says.
Hand-made SLOWLOG replies, as redis-server 7 answers `SLOWLOG GET -1`: no server needed."""

from __future__ import annotations

import hiredis
import redis

from bench import scale_redis as sr
from bench.scale_job import owner
from bench.scale_sim import encode
from jobpool.store.runner import SCRIPT_NAMES, Scripts

CLIENT = b"127.0.0.1:50000"


def raw(entry_id: int, usec: int, *args: str, addr: bytes = CLIENT, name: bytes = b"") -> list[object]:
    return [entry_id, 1796282321, usec, [a.encode() for a in args], addr, name]


def test_script_names_are_the_shas_the_store_sends() -> None:
    scripts = Scripts(redis.Redis(), 1)  # register_script computes each SHA locally: nothing is sent
    names = sr.script_names()
    for name in SCRIPT_NAMES:
        assert names[scripts._scripts[name].sha] == name


def test_entries_are_read_oldest_first_and_lua_and_the_bench_left_out() -> None:
    reply = [raw(12, 6, "EVALSHA", "abc", "1", "jobpool:{p}:job:1"),
             raw(11, 1, "HSET", "jobpool:{p}:job:1", "a", "1", addr=b"?:0"),
             raw(10, 2, "INFO", "commandstats", name=sr.ADMIN_NAME.encode()),
             raw(9, 3, "LMOVE", "rq:queue:x", "rq:queue:x:intermediate", "LEFT", "RIGHT")]
    entries = sr.parse_slowlog(reply)
    assert [e.command for e in entries] == ["LMOVE", "INFO", "HSET", "EVALSHA"]
    top = sr.top_level(entries)
    assert [e.command for e in top] == ["LMOVE", "EVALSHA"]
    assert sum(e.usec for e in top) == 9  # the script's HSET is inside its 6 us, not beside it
    assert top[1].first_key() == "jobpool:{p}:job:1"
    assert top[0].first_key() == "rq:queue:x"


def test_a_scripts_own_commands_are_those_logged_just_before_it() -> None:
    sha = next(iter(sr.script_names()))
    name = sr.script_names()[sha]
    reply = [raw(1, 2, "HGET", "k", "f"),  # a client's, before the script ran: not the script's
             raw(2, 3, "HGET", "k", "f", addr=b"?:0"),
             raw(3, 4, "ZADD", "z", "1", "m", addr=b"?:0"),
             raw(4, 20, "EVALSHA", sha, "1", "k"),
             raw(5, 9, "EVALSHA", sha, "0")]
    split = sr.script_split(sr.parse_slowlog(reply), sr.script_names())
    assert split == {name: (2, 29, 7, 2)}
    prof = sr.profile(sr.top_level(sr.parse_slowlog(reply)), sr.script_names())
    assert prof == {f"script {name}": (2, 29), "HGET": (1, 2)}


def test_keys_are_reduced_to_their_kind() -> None:
    assert sr.key_kind("jobpool:{fleet}:job:0123456789abcdef0123456789abcdef") == "job:*"
    assert sr.key_kind("jobpool:{fleet}:lease:0123456789abcdef01") == "lease:*"
    assert sr.key_kind("rq:job:83c82f3b-191d-4270-9418-7fd43a1b2c3d") == "rq:job:*"
    assert sr.key_kind("jobpool:{fleet}:running") == "running"
    e = sr.parse_slowlog([raw(1, 1, "HMGET", "jobpool:{fleet}:job:0123456789abcdef0123", "state")])[0]
    assert sr.label_key(e, {}) == "HMGET job:*"


def test_whose_work_a_command_is() -> None:
    entries = sr.parse_slowlog([raw(1, 1, "EVALSHA", "abc", "1", "jobpool:{p}:job:1"),
                                raw(2, 1, "HSET", "rq:worker:w", "last_heartbeat", "x"),
                                raw(3, 1, "MULTI"),
                                raw(4, 1, "HGETALL", "jobpool:{p}:job:1")])
    assert [owner(e, {}) for e in entries] == [
        "jobpool's scripts", "RQ's keys (and transactions)", "RQ's keys (and transactions)", "the rest"]


def test_commandstats_deltas_leave_out_what_did_not_run_and_the_readings() -> None:
    before = {"get": (10, 100), "info": (3, 30), "set": (5, 50)}
    after = {"get": (12, 130), "info": (4, 41), "set": (5, 50), "hset": (1, 2)}
    delta = sr.stats_delta(before, after)
    assert delta == {"get": (2, 30), "hset": (1, 2)}
    assert sr.calls_of(delta) == 3


def test_the_lean_clients_commands_are_resp() -> None:
    reader = hiredis.Reader()
    reader.feed(encode("BLMOVE", "rq:queue:a", b"rq:queue:a:intermediate", "LEFT", "RIGHT", 1))
    assert reader.gets() == [b"BLMOVE", b"rq:queue:a", b"rq:queue:a:intermediate", b"LEFT", b"RIGHT", b"1"]


def test_a_preempted_command_is_capped_at_ten_times_the_median_of_its_kind() -> None:
    reply = [raw(i, 1, "MULTI") for i in range(1, 4)] + [raw(4, 2000, "MULTI"), raw(5, 300, "SORT_RO", "r")]
    prof = sr.profile(sr.parse_slowlog(reply), {})
    assert prof == {"SORT_RO": (1, 300), "MULTI": (4, 3 + sr.CAP_FLOOR_US)}
