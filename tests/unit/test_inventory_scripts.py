"""Per-daemon inventories: scripts/inventory_lead.lua and publish_inventory.lua, and the publisher's round
(jobpool/workers/inventory.py) over a stand-in for the Docker daemon's list, on fakeredis[lua] and a real
redis-server.

One publisher per daemon: the workers on it elect one through its lead key; only the holder writes; the
inventory is written whole, stamped with the server's time, kept bounded, and parsed back as written.
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

import pytest

from jobpool import errors
from jobpool.api import Pool
from jobpool.config import Settings
from jobpool.contract import INVENTORY_MAX_BYTES
from jobpool.fleet import strays
from jobpool.fleet.inventory import FIELDS, FORGET_MS, Entry, earlier_boots, encode, parse
from jobpool.store.redisurl import connect
from jobpool.store.replies import DaemonBoots, Lead
from jobpool.supervisor.probes import Absent, Present, Probe, Unknown
from jobpool.workers.inventory import InventoryPublisher, entry_of
from tests.support.polling import eventually
from tests.support.pool_helpers import Backend

D1 = "jpd1:" + "a" * 32 + "@boot-1"


def lead(pool: Pool, boot: str, daemon: str = D1, ms: int = 60_000) -> list[Any]:
    k = pool.keys
    return pool.store.run("inventory_lead", [k.inventory_lead(daemon)], [daemon, boot, ms])


def publish(pool: Pool, boot: str, containers: str = "[]", daemon: str = D1, complete: str = "1",
            ttl_ms: int = 600_000) -> list[Any]:
    k = pool.keys
    return pool.store.run("publish_inventory", [k.inventory(daemon), k.inventory_lead(daemon),
                                                k.inventories, k.gone_daemons, k.returned_daemons],
                          [daemon, boot, daemon.split("@")[1], 15_000, ttl_ms, complete, containers,
                           FORGET_MS, pool.now_ms()])


def read(pool: Pool, daemon: str = D1) -> Any:
    fields = cast("list[str | None]", pool.store.client.hmget(pool.keys.inventory(daemon), FIELDS))
    return parse(dict(zip(FIELDS, fields, strict=True)))


def test_one_publisher_per_daemon_and_only_it_writes(backend: Backend) -> None:
    pool = backend.pool()
    assert lead(pool, "boot-a")[1:] == [1, "boot-a"]
    assert lead(pool, "boot-b")[1:] == [0, "boot-a"], "a second worker on the daemon follows"
    assert lead(pool, "boot-a")[1:] == [1, "boot-a"], "the holder renews"
    with pytest.raises(errors.NotOwner):
        publish(pool, "boot-b")
    assert not pool.store.client.exists(pool.keys.inventory(D1)), "a follower's refused write wrote nothing"
    # Another daemon has its own lead.
    other = "jpd1:" + "b" * 32 + "@boot-1"
    assert lead(pool, "boot-b", daemon=other)[1:] == [1, "boot-b"]


def test_the_lead_lapses_with_its_holder(backend: Backend) -> None:
    pool = backend.pool()
    assert lead(pool, "boot-a", ms=100)[1] == 1
    deadline = time.monotonic() + 5
    while lead(pool, "boot-b", ms=100)[1] != 1:
        assert time.monotonic() < deadline, "the lead never lapsed"
        time.sleep(0.02)
    with pytest.raises(errors.NotOwner):
        publish(pool, "boot-a")


def test_a_follower_reads_the_lead_and_runs_no_script_until_it_is_free(redis_url: str) -> None:
    """`Store.inventory_lead` (what a worker's publisher calls every period) reads the holder first: a
    follower learns it from a GET, and only a free lead or the asker's own runs the script, which takes or
    renews it. Counted on a real redis-server (INFO commandstats)."""
    pool = Pool(connect(redis_url), Settings(redis_url=redis_url))
    client, store = pool.store.client, pool.store

    def scripts() -> int:
        stats = cast("dict[str, dict[str, Any]]", client.info("commandstats"))
        return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))

    assert store.inventory_lead(D1, "boot-a", 60_000) == Lead(held=True, holder="boot-a")
    client.config_resetstat()
    for _ in range(3):
        got = store.inventory_lead(D1, "boot-b", 60_000)
        assert (got.held, got.holder) == (False, "boot-a")
        assert got.lapse_ms is not None and 50_000 < got.lapse_ms <= 60_000, "how long the lead has left"
    assert scripts() == 0
    client.pexpire(pool.keys.inventory_lead(D1), 10_000)
    assert store.inventory_lead(D1, "boot-a", 60_000).held is True  # its holder's call renews it: the script
    assert scripts() == 1 and client.pttl(pool.keys.inventory_lead(D1)) > 50_000
    client.delete(pool.keys.inventory_lead(D1))  # its holder gone: the lead lapsed
    assert store.inventory_lead(D1, "boot-b", 60_000) == Lead(held=True, holder="boot-b")
    assert scripts() == 2


def test_an_inventory_is_written_whole_with_the_servers_time(backend: Backend) -> None:
    pool = backend.pool()
    lead(pool, "boot-a")
    entries = [Entry("j1", 1, "running", container_id="c1"), Entry("j2", 3, "exited", 137, "c2", "oom",
                                                                      "oom_killed")]
    text, _complete = encode(entries)
    at = int(publish(pool, "boot-a", text)[1])
    secs, micros = pool.store.client.time()
    assert abs(secs * 1000 + micros // 1000 - at) < 5000
    inv = read(pool)
    assert (inv.daemon_id, inv.kernel_boot_id, inv.at_ms, inv.first_at_ms, inv.complete, inv.publisher) == (
        D1, "boot-1", at, at, True, "boot-a")
    assert inv.of("j2") == [entries[1]] and inv.of("j1") == [entries[0]] and inv.of("j3") == []
    assert 0 < pool.store.client.pttl(pool.keys.inventory(D1)) <= 600_000
    assert 0 < pool.store.client.pttl(pool.keys.inventory_lead(D1)) <= 15_000, "publishing renews the lead"
    assert pool.store.client.zscore(pool.keys.inventories, D1) == at
    # A later publication keeps first_at and replaces the containers.
    time.sleep(0.01)
    at2 = int(publish(pool, "boot-a", "[]")[1])
    inv = read(pool)
    assert (inv.at_ms, inv.first_at_ms, inv.entries) == (at2, at, {})


def test_an_inventory_over_its_bound_is_refused_and_the_publisher_cuts_it(backend: Backend) -> None:
    pool = backend.pool()
    lead(pool, "boot-a")
    big = json.dumps([["j" * 100, 1, "running", None, "c", "", ""]] * (INVENTORY_MAX_BYTES // 100))
    assert len(big) > INVENTORY_MAX_BYTES
    with pytest.raises(errors.InvalidArgument):
        publish(pool, "boot-a", big)
    assert not pool.store.client.exists(pool.keys.inventory(D1))
    entries = [Entry(f"job-{i:06d}", 1, "running", container_id="c" * 64) for i in range(20_000)]
    text, complete = encode(entries)
    assert not complete and len(text) <= INVENTORY_MAX_BYTES
    publish(pool, "boot-a", text, complete="0")
    inv = read(pool)
    assert not inv.complete and 0 < len(inv.entries) < 20_000


def test_bad_arguments_write_nothing(backend: Backend) -> None:
    pool = backend.pool()
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument):
        lead(pool, "")
    with pytest.raises(errors.InvalidArgument):
        lead(pool, "boot-a", ms=0)
    assert backend.keyspace() == before
    lead(pool, "boot-a")
    before = backend.keyspace()
    for bad in ({"complete": "yes"}, {"containers": "{}"}, {"ttl_ms": 0}):
        with pytest.raises(errors.InvalidArgument):
            publish(pool, "boot-a", **bad)
    assert backend.keyspace() == before


def test_unreadable_entries_make_an_inventory_incomplete() -> None:
    fields = {"daemon_id": D1, "at": "5", "complete": "1",
              "containers": json.dumps([["j", 1, "running", None, "c", "", ""], ["j", "x"], 7])}
    inv = parse(fields)
    assert inv is not None and not inv.complete and list(inv.entries) == ["j"]
    assert parse({"daemon_id": D1, "at": "", "containers": "[]"}) is None
    assert parse({"daemon_id": "", "at": "5", "containers": "[]"}) is None


def test_an_inventory_makes_entries_of_the_jobs_asked_for_and_reads_the_rest_to_say_if_complete() -> None:
    """A supervisor asks for a few jobs of an inventory that lists hundreds: only theirs are made into
    entries; an unreadable item still makes the whole inventory incomplete (what it leaves out proves
    nothing)."""
    good = [["j1", 1, "running", None, "c1", "", ""], ["j2", 2, "exited", 3, "c2", "oom", "oom_killed"]]
    bad = [["j3", "x"], ["j1", 2, "bogus", None, "c", "", ""], 7, ["j4", 1, ["running"], None, "c", "", ""]]
    inv = parse({"daemon_id": D1, "at": "5", "complete": "1", "containers": json.dumps(good + bad)})
    assert inv is not None
    assert inv.of("j1") == [Entry("j1", 1, "running", container_id="c1")], "its unreadable item left out"
    assert inv.of("j3") == [] and inv.of("j4") == [] and inv.of("nowhere") == []
    assert not inv.complete
    assert dict(inv.entries) == {"j1": [Entry("j1", 1, "running", container_id="c1")],
                                 "j2": [Entry("j2", 2, "exited", 3, "c2", "oom", "oom_killed")]}
    whole = parse({"daemon_id": D1, "at": "5", "complete": "1", "containers": json.dumps(good)})
    assert whole is not None and whole.complete and len(whole.entries) == 2
    cut = parse({"daemon_id": D1, "at": "5", "complete": "0", "containers": json.dumps(good)})
    assert cut is not None and not cut.complete, "its publisher left some out"


def test_an_earlier_boot_is_over_only_when_silent_since_before_the_new_one_first_published() -> None:
    me, old, older = D1.replace("boot-1", "boot-3"), D1, D1.replace("boot-1", "boot-0")
    clone, other = D1.replace("boot-1", "clone"), "jpd1:" + "b" * 32 + "@boot-1"
    index = {me: 10_000, old: 4_000, older: 1_000, clone: 9_900, other: 2_000}
    # Stale after 2 s; `me` first published at 5,000, now is 10,000.
    assert earlier_boots(me, index, 5_000, 10_000, 2_000) == [older, old]
    assert earlier_boots(me, index, 5_000, 5_500, 2_000) == [older], "the old boot not yet silent long enough"
    assert earlier_boots(me, index, 3_000, 10_000, 2_000) == [older], "published after me first did: a clone"
    assert earlier_boots(me, {me: 10_000}, 5_000, 10_000, 2_000) == []


def test_every_worker_learns_the_earlier_boots_of_its_daemon_once(backend: Backend) -> None:
    pool = backend.pool()
    old, new = D1, D1.replace("boot-1", "boot-2")
    assert lead(pool, "w-old", old)[1] and publish(pool, "w-old", daemon=old)
    pool.store.client.zadd(pool.keys.inventories, {old: pool.now_ms() - 60_000})  # silent for a minute
    told: list[str] = []
    publisher = InventoryPublisher(pool.store, "w-new", prober=FakeDaemon(new, [], {}))  # type: ignore[arg-type]
    publisher.on_earlier_boot = told.append
    publisher._lead(new)
    assert told == [], "this boot has not published yet"
    assert lead(pool, "w-new", new)[1] and publish(pool, "w-new", daemon=new)
    publisher._boots_at = -1e9  # the next look is due
    publisher._lead(new)
    publisher._boots_at = -1e9
    publisher._lead(new)
    assert told == [old]
    # A look reads only the daemons silent since before this one first published, not the live fleet's.
    first = publisher._first_ms[new]
    assert lead(pool, "w-other", D2)[1] and publish(pool, "w-other", daemon=D2)
    def index(before: int | None) -> set[str]:  # the look's reads, as a follower of `new` sends them
        boots = pool.store.inventory_lead(new, "w-follower", 60_000, look_boots=True,
                                          boots_before=before).boots
        assert isinstance(boots, DaemonBoots)
        return set(boots.index)
    assert index(first) == {old}
    assert {old, new, D2} <= index(None)
    # It publishes again after all: a clone of the data root, not an earlier boot. Taken back.
    back: list[str] = []
    publisher.on_earlier_boot_back = back.append
    assert lead(pool, "w-old", old)[1] and publish(pool, "w-old", daemon=old)
    publisher._boots_at = -1e9
    publisher._lead(new)
    assert back == [old] and publisher.earlier == set()


def test_a_follower_looks_for_earlier_boots_with_its_lead_read(backend: Backend) -> None:
    # The look's reads go with the lead's (one round trip a period for a follower): what it finds is what a
    # look alone finds, and a look that meets a bad index entry is that look's failure alone.
    pool = backend.pool()
    old, new = D1, D1.replace("boot-1", "boot-2")
    assert lead(pool, "w-old", old)[1] and publish(pool, "w-old", daemon=old)
    pool.store.client.zadd(pool.keys.inventories, {old: pool.now_ms() - 60_000})
    assert lead(pool, "w-new", new)[1] and publish(pool, "w-new", daemon=new)
    got = pool.store.inventory_lead(new, "w-follower", 60_000, look_boots=True)
    assert (got.held, got.holder) == (False, "w-new")
    assert isinstance(got.boots, DaemonBoots) and got.boots.first is not None
    assert old in got.boots.index and new in got.boots.index, "every daemon's last publication, unbounded"
    assert got.boots.first == pool.store.client.hget(pool.keys.inventory(new), "first_at")
    assert pool.store.inventory_lead(new, "w-follower", 60_000).boots is None, "not asked: not read"
    pool.store.client.set(pool.keys.inventory(new), "not a hash")
    bad = pool.store.inventory_lead(new, "w-follower", 60_000, look_boots=True)
    assert bad.holder == "w-new" and isinstance(bad.boots, Exception)


def test_a_follower_asks_which_server_answers_at_its_first_period_then_once_a_lease(backend: Backend) -> None:
    # jobpool/redistrust.py: a server that changed is found at the first look after the change, and its
    # lease is held from there. So a follower need not look every period, only once before any change: at
    # its first period, then once a lease (it looks again when it holds the lead, before any removal).
    pool = backend.pool(lease_secs=30)
    assert lead(pool, "w-holder", D1)[1]
    publisher = InventoryPublisher(pool.store, "w-follower", prober=FakeDaemon(D1, [], {}))  # type: ignore[arg-type]
    looks: list[str] = []
    settling = publisher.trust.settling

    def counted() -> str:
        looks.append("settling")
        return settling()
    publisher.trust.settling = counted  # type: ignore[method-assign]
    for _ in range(3):
        assert publisher.tick() == "follower of w-holder"
        publisher._following = None  # each period reads the lead (test_a_follower_reads_the_lead_...)
    assert looks == ["settling"]
    publisher._trust_seen_at -= 30  # a lease later
    assert publisher.tick() == "follower of w-holder" and looks == ["settling"] * 2


def test_a_follower_reads_the_lead_again_only_once_it_could_have_lapsed(backend: Backend) -> None:
    # A lead lasts three of its holder's periods and is renewed every one, so a follower that read how long
    # it has left sends nothing until then, and takes it at its first period past a lapse.
    pool = backend.pool()
    assert lead(pool, "w-holder", ms=3_000)[1] == 1
    publisher = InventoryPublisher(pool.store, "w-follower", prober=FakeDaemon(D1, [], {}))  # type: ignore[arg-type]
    reads: list[tuple[float, Lead]] = []  # (when it was asked, monotonic; what it read)
    inventory_lead = pool.store.inventory_lead

    def counted(*args: Any, **kwargs: Any) -> Lead:
        asked = time.monotonic()
        reads.append((asked, inventory_lead(*args, **kwargs)))
        return reads[-1][1]
    pool.store.inventory_lead = counted  # type: ignore[method-assign]
    assert publisher.tick() == "follower of w-holder"
    first_at, first = reads[0]
    assert len(reads) == 1 and first.lapse_ms is not None and first.lapse_ms <= 3_000
    for _ in range(3):
        assert publisher.tick() == "follower of w-holder"
    assert len(reads) == 1, "the lead cannot have lapsed yet: nothing asked"
    # The holder is gone (it renews no more): a period past the lapse takes the lead.
    eventually(lambda: publisher.tick().startswith("published"), timeout=10, message="the follower took it")
    later = [at for at, _ in reads[1:]]
    # (Counted from just before the read was sent, a moment before `first_at`.)
    assert min(later) >= first_at + first.lapse_ms / 1000 - 0.05, "nothing asked before it could have lapsed"
    # Once at the lapse it could read; again a few ms on if the server's lapse came a little after that.
    assert len(later) <= 2, [got for _, got in reads]
    assert pool.store.client.get(pool.keys.inventory_lead(D1)) == "w-follower"
    # A holder reads its lead every period (it renews it), and a follower of another daemon identity (its
    # daemon restarted under a new one) reads at once.
    held = len(reads)
    publisher.tick()
    assert len(reads) == held + 1
    other = D1.replace("boot-1", "boot-9")
    assert lead(pool, "w-holder", daemon=other)[1] == 1
    publisher.prober.daemon = other  # type: ignore[attr-defined]
    assert publisher.tick() == "follower of w-holder" and len(reads) == held + 2


def test_a_lead_without_expiry_is_read_again_a_lead_later(backend: Backend) -> None:
    # Only a hand-made key has none: the follower reads it again after the lead's length, not never.
    pool = backend.pool()
    pool.store.client.set(pool.keys.inventory_lead(D1), "w-by-hand")
    got = pool.store.inventory_lead(D1, "w-follower", 15_000)
    assert (got.held, got.holder, got.lapse_ms) == (False, "w-by-hand", None)
    publisher = InventoryPublisher(pool.store, "w-follower", prober=FakeDaemon(D1, [], {}))  # type: ignore[arg-type]
    started = time.monotonic()
    assert publisher.tick() == "follower of w-by-hand"
    following = publisher._following
    assert following is not None
    lead_secs = publisher.lead_ms / 1000
    assert started + lead_secs - 1 <= following[2] <= time.monotonic() + lead_secs


class FakeDaemon:
    """Stands in for the Docker daemon's answers (the prober's list and judgement) and for its client's stops
    and removals (what jobpool/supervisor/stopper.py asks of `client().api`); the scripts and the publisher's
    round are what is under test."""

    #: Where the publisher's stray stopper would connect (jobpool/workers/strays.py): nowhere.
    docker_host = "unix:///nonexistent/jobpool-fake-daemon.sock"

    def __init__(self, daemon: str, listed: list[dict[str, Any]], judged: dict[str, Probe]) -> None:
        self.daemon, self.listed, self.judged = daemon, listed, judged
        self.identity_problem = ""
        self.list_calls = 0
        self.removed: list[str] = []
        self.stopped: list[str] = []

    def daemon_id(self) -> str:
        return self.daemon

    def list_pool(self, pool: str) -> list[dict[str, Any]]:
        self.list_calls += 1
        return self.listed

    def judge(self, summary: dict[str, Any]) -> Probe:
        return self.judged[summary["Id"]]

    def client(self) -> FakeDaemon:
        return self

    @property
    def api(self) -> FakeDaemon:
        return self

    def remove_container(self, cid: str, v: bool = False, force: bool = False) -> None:
        self.removed.append(cid)

    def stop(self, cid: str, timeout: int) -> None:
        self.stopped.append(cid)

    def close(self) -> None:
        pass

    def failed(self, exc: BaseException) -> str:
        return str(exc)


def summary(cid: str, job: str, attempt: int, boot: str = "boot-w") -> dict[str, Any]:
    return {"Id": cid, "Labels": {"jobpool.pool": "default", "jobpool.job_id": job,
                                  "jobpool.attempt": str(attempt), "jobpool.boot_id": boot}}


def test_workers_on_one_daemon_list_it_once_per_period(backend: Backend) -> None:
    pool = backend.pool(inventory_secs=5)
    listed = [summary("c1", "j1", 1), summary("c2", "j2", 2), summary("c3", "j3", 1)]
    judged: dict[str, Probe] = {"c1": Present(True, container_id="c1"),
                                "c2": Present(False, 3, container_id="c2"),
                                "c3": Unknown("container c3 in unexpected state 'weird'")}
    daemons = [FakeDaemon(D1, listed, judged) for _ in range(3)]
    publishers = [InventoryPublisher(pool.store, f"boot-{i}", d) for i, d in enumerate(daemons)]  # type: ignore[arg-type]
    outcomes = [p.tick() for p in publishers]
    assert outcomes[0].startswith("published 3") and all(o.startswith("follower") for o in outcomes[1:])
    assert [d.list_calls for d in daemons] == [1, 0, 0]
    inv = read(pool)
    assert inv.complete and inv.publisher == "boot-0"
    assert inv.of("j1") == [Entry("j1", 1, "running", container_id="c1")]
    assert inv.of("j2") == [Entry("j2", 2, "exited", 3, "c2", "", "")]
    assert inv.of("j3")[0].state == "unknown" and "weird" in inv.of("j3")[0].reason


def settled_pool(backend: Backend) -> Pool:
    """A pool with a short lease on a Redis that has been up longer than it: Redis's state is evidence to act
    on (jobpool/redistrust.py; fakeredis has no INFO, so no restart to see)."""
    pool = backend.pool(inventory_secs=5, lease_secs=0.2, heartbeat_secs=0.1)
    if backend.name != "fakeredis":
        eventually(lambda: int(pool.store.client.info("server")["uptime_in_seconds"]) >= 1, timeout=5,
                   message="redis-server has been up a second")
    return pool


def settled(publisher: InventoryPublisher) -> InventoryPublisher:
    """A publisher once its own start has settled (it waits a lease from its start: jobpool/redistrust.py)."""
    eventually(lambda: publisher.trust.settling() == "", timeout=5, message="the publisher's start settled")
    return publisher


def test_the_holder_removes_what_only_it_can(backend: Backend) -> None:
    """A created container whose attempt's lease is gone, and an ended one whose job moved on; never one
    whose launcher holds its lease, nor an ended one whose exit is still to be recorded."""
    pool = settled_pool(backend)
    k = pool.keys
    for job, attempt, state in (("held", 1, "running"), ("lapsed", 1, "running"), ("pending", 1, "running"),
                                ("moved", 1, "queued")):
        pool.store.client.hset(k.job(job), mapping={"id": job, "state": state, "attempt": attempt})
    pool.store.client.set(k.lease("held"), "boot-w:1")
    listed = [summary(f"c-{job}", job, 1) for job in ("held", "lapsed", "pending", "moved")]
    judged: dict[str, Probe] = {
        "c-held": Absent(never_started=True, container_id="c-held"),
        "c-lapsed": Absent(never_started=True, container_id="c-lapsed"),
        "c-pending": Present(False, 0, container_id="c-pending"),
        "c-moved": Present(False, 1, container_id="c-moved")}
    daemon = FakeDaemon(D1, listed, judged)
    publisher = settled(InventoryPublisher(pool.store, "boot-0", daemon))  # type: ignore[arg-type]
    assert publisher.tick().startswith("published")
    assert sorted(daemon.removed) == ["c-lapsed", "c-moved"]


def test_entries_say_what_was_judged() -> None:
    assert entry_of("j", 2, Absent(never_started=True, container_id="c")).state == "created"
    assert entry_of("j", 2, Absent()).state == "unknown", "a listed container is never written as absent"


D2 = "jpd1:" + "b" * 32 + "@boot-1"


def stray_daemon(pool: Pool) -> tuple[FakeDaemon, InventoryPublisher]:
    """Running containers of one daemon, each a case of jobpool/fleet/strays.py's rule, and their rows."""
    k = pool.keys
    rows: dict[str, dict[Any, Any]] = {  # hashes as written by hand
        "own": {"state": "running", "attempt": 2, "daemon_id": D1, "container_id": "c-own",
                "owner_boot": "b1"},
        "unrecorded": {"state": "running", "attempt": 1, "daemon_id": D1, "owner_boot": "b1"},
        "unclaimed": {"state": "running", "attempt": 1},
        "adopted": {"state": "running", "attempt": 1, "daemon_id": D1, "container_id": "c-adopted",
                    "owner_boot": "b-adopter"},
        "superseded": {"state": "running", "attempt": 3, "daemon_id": D1, "owner_boot": "b1"},
        "elsewhere": {"state": "running", "attempt": 1, "daemon_id": D2, "container_id": "c-on-d2",
                      "owner_boot": "b9"},
        "elsewhere_unrecorded": {"state": "running", "attempt": 1, "daemon_id": D2, "owner_boot": "b9"},
        "identity_drift": {"state": "running", "attempt": 1, "daemon_id": D2,
                           "container_id": "c-identity_drift", "owner_boot": "b1"},
        "other_container": {"state": "running", "attempt": 1, "daemon_id": D1, "container_id": "c-x",
                            "owner_boot": "b1"},
        "other_owner": {"state": "running", "attempt": 1, "daemon_id": D1, "owner_boot": "b7"},
        "ended": {"state": "succeeded", "attempt": 1},
    }
    for job, row in rows.items():
        pool.store.client.hset(k.job(job), mapping={"id": job, **row})
    attempts = {"own": 2, "superseded": 2}
    listed = [summary(f"c-{job}", job, attempts.get(job, 1), boot="b1") for job in [*rows, "gone"]]
    listed.append(summary("c-foreign", "foreign", 1, boot="another-pools-boot"))  # same name, other Redis
    judged: dict[str, Probe] = {s["Id"]: Present(True, container_id=s["Id"]) for s in listed}
    daemon = FakeDaemon(D1, listed, judged)
    publisher = InventoryPublisher(pool.store, "boot-0", daemon)  # type: ignore[arg-type]
    publisher.new_prober = lambda: daemon  # type: ignore[method-assign,assignment,return-value]
    pool.store.client.zadd(k.boots, {"b1": 1})  # the containers' launcher is one of this pool's boots
    return daemon, publisher


STRAYS = ["c-elsewhere", "c-ended", "c-gone", "c-other_container", "c-superseded"]


def test_the_holder_stops_and_publishes_the_strays_of_its_daemon(backend: Backend) -> None:
    """A running container its row does not account for (another attempt or container; an ended job; no row
    though its launcher is one of this pool's boots) is stopped, recorded in its job's history and published
    until gone. Not: one its row names (even under another daemon identity), one not recorded yet (by its
    launcher, by another owner whose launch here Docker refused by name, or on another daemon until it is),
    one whose claim was lost, one adopted, one of another pool of the same name (a launcher unknown here)."""
    pool = settled_pool(backend)
    daemon, publisher = stray_daemon(pool)
    settled(publisher)
    assert publisher.tick().startswith("published")
    raw = cast(str, pool.store.client.hget(pool.keys.inventory(D1), "strays"))
    published = {x.container_id: x for x in strays.decode(raw, D1)}
    assert sorted(published) == STRAYS
    assert "runs as container c-on-d2 on daemon " + D2 in published["c-elsewhere"].reason
    assert "not its job's current attempt (3)" in published["c-superseded"].reason
    assert "no row" in published["c-gone"].reason
    eventually(lambda: sorted(daemon.stopped) == STRAYS, timeout=5, message="every stray was stopped")
    lines = cast(str, pool.store.client.hget(pool.keys.job("elsewhere"), "history")).split("\n")
    history = [json.loads(line) for line in lines]
    assert history[-1][3] == "stray_stopped" and "c-elsewhere"[:12] in history[-1][4]
    assert pool.store.client.hget(pool.keys.job("own"), "history") is None
    assert pool.status().strays and len(pool.status().strays) == len(STRAYS)
    # Gone once stopped: the next listing shows them ended, and the inventory no stray.
    daemon.judged.update({cid: Present(False, 0, container_id=cid) for cid in STRAYS})
    assert publisher.tick().startswith("published")
    assert strays.decode(cast(str, pool.store.client.hget(pool.keys.inventory(D1), "strays")), D1) == []
    assert pool.status().strays == ()
    publisher.strays.close()


def test_no_stray_is_judged_while_redis_settles(backend: Backend) -> None:
    """For a lease after this process reached Redis again, nothing is stopped on Redis's word."""
    pool = backend.pool(inventory_secs=5)  # a lease of 30 s
    daemon, publisher = stray_daemon(pool)
    publisher.trust.lost()
    assert publisher.tick().startswith("published")
    published = cast("str | None", pool.store.client.hget(pool.keys.inventory(D1), "strays"))
    assert strays.decode(published, D1) == []
    assert daemon.stopped == [] and daemon.removed == []
    publisher.strays.close()
