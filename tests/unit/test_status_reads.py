"""What `status` (and the metrics' scrape) reads costs what the fleet's workers and daemons are, never what
runs (jobpool/status/read.py `read_status`): where the running jobs are comes from the scripts' placement
(scripts/_lib.lua `place_running`), and rows only of a daemon found stale. A pool whose jobs started before
the placement reads their rows instead, and says the same.
"""

from __future__ import annotations

from typing import Any, cast

import redis

from jobpool.api import Pool
from jobpool.cli.format import status_report
from jobpool.config import Settings
from jobpool.fleet import markrecords
from jobpool.status import WORKER_JOBS, read_status
from jobpool.store.redisurl import connect
from jobpool.workers.attempt import Attempt
from jobpool.workers.boot import Boot
from tests.support.inventories import publish
from tests.support.pool_helpers import Backend

D1 = "jpd1:" + "c" * 32 + "@boot-1"
D2 = "jpd1:" + "d" * 32 + "@boot-1"
STALE = 30.0


def live_boot(pool: Pool, boot: str) -> None:
    """A worker's boot record and its place in the boots index, as its heartbeat writes them."""
    pool.store.client.hset(pool.keys.boot(boot), mapping={"host": "h", "pid": "1", "executor": "docker",
                                                         "daemon_id": D1, "role": "worker"})
    pool.store.client.zadd(pool.keys.boots, {boot: pool.now_ms()})


def publish_at(pool: Pool, daemon: str, at_ms: int | None = None) -> None:
    """`daemon`'s inventory, fresh (or as of `at_ms`): what its workers publish."""
    publish(pool, daemon, [])
    if at_ms is not None:
        pool.store.client.hset(pool.keys.inventory(daemon), "at", at_ms)


def run_on(pool: Pool, n: int, boots: list[str], daemon: str) -> list[str]:
    """`n` more jobs running, claimed in turn by `boots`, each launched on `daemon`."""
    pool.set_slots(int(cast(str, pool.store.client.zcard(pool.keys.running))) + n)
    ids = []
    for i in range(n):
        job = pool.enqueue(image="img", command=["sleep", "60"])
        att = Attempt(pool.store, job.id, boots[i % len(boots)], pool.get(job.id).attempt)
        att.claim("docker", daemon)
        att.set_container("cid-" + job.id, daemon)
        ids.append(job.id)
    return ids


def commands(client: redis.Redis) -> int:
    stats = cast("dict[str, dict[str, Any]]", client.info("commandstats"))
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def mark(pool: Pool, process: str, daemon: str, collision: str = "") -> None:
    """A process's record of its mark on `daemon` (jobpool/fleet/daemonmark.py), reporting `collision`."""
    fields = dict.fromkeys(markrecords.FIELDS, "")
    fields.update(role="worker", host="h", daemon_id=daemon, mark="m-" + process, collision=collision)
    pool.store.daemon_mark(process, 60_000, 600_000, list(fields.items()))


def test_a_status_and_a_scrape_send_as_many_commands_with_40_running_as_with_4(redis_url: str) -> None:
    """Three workers on a daemon that publishes: the commands of a status read (and of the metrics' read,
    without detail) are the same whatever runs, and whatever processes marked their daemons; each worker's
    jobs and count are right."""
    pool = Pool(connect(redis_url), Settings(redis_url=redis_url, inventory_stale_secs=STALE))
    boots = ["w1", "w2", "w3"]
    for b in boots:
        live_boot(pool, b)
    publish_at(pool, D1)
    sent: dict[int, tuple[int, int]] = {}
    for total in (4, 40):
        run_on(pool, total - int(cast(str, pool.store.client.zcard(pool.keys.running))), boots, D1)
        for i in range(total):
            mark(pool, f"p{i}", D1)
        before = commands(pool.store.client)
        report = read_status(pool.store)
        middle = commands(pool.store.client)
        read_status(pool.store, detail=False)
        sent[total] = (middle - before, commands(pool.store.client) - middle)
        assert report.workers is not None and report.daemons is not None
        assert sum(w.running for w in report.workers.boots) == total
        assert all(len(w.jobs) == min(w.running, WORKER_JOBS) for w in report.workers.boots)
        assert report.daemons.stale == (), "a daemon that publishes holds nothing on stale evidence"
    assert sent[4] == sent[40], f"commands per read grew with what runs, or with the marks: {sent}"
    assert sent[4][1] < sent[4][0], "the metrics read less than status"


def test_a_reported_collision_makes_status_unhealthy_until_cleared(backend: Backend) -> None:
    """A process's report that two daemons share its identity stands from the step that writes it: `status`
    names it (from the standing collisions: one read), after the process is gone too, until cleared."""
    pool = backend.pool()
    mark(pool, "p1", D1)
    assert pool.status().shared_daemons == {}
    mark(pool, "p2", D1, collision="two daemons share it: here and there")
    report = pool.status()
    assert report.shared_daemons == {D1: "two daemons share it: here and there"}
    assert any("two daemons share it" in r for r in report.health.reasons)
    k = pool.keys
    pool.store.run("daemon_unmark", [k.daemon_mark("p2"), k.daemon_marks, k.daemon_mark_v("p2")], ["p2"])
    assert pool.status().shared_daemons == {D1: "two daemons share it: here and there"}, "it stands"
    markrecords.forget_collision(pool, D1)
    assert pool.status().shared_daemons == {}


def test_a_pool_from_before_the_placement_reads_its_rows_and_reports_the_same(backend: Backend) -> None:
    """Workers with jobs, a daemon gone silent whose workers died (its rows without leases), one whose
    workers live, a job promoted to wait for the silent one: the report read from the placement is the
    report read from the rows, as a pool whose jobs started before the placement (no `placed_kept`, nothing
    placed) reads it."""
    pool = backend.pool(max_concurrent_jobs=1, inventory_stale_secs=STALE)
    for b in ("w1", "w2"):
        live_boot(pool, b)
    publish_at(pool, D2)
    run_on(pool, 3, ["w1", "w2"], D2)
    dead = run_on(pool, 2, ["gone-boot"], D1)
    pool.store.client.delete(*[pool.keys.lease(j) for j in dead])
    handed = run_on(pool, 1, ["gone-boot"], D1)[0]
    assert Attempt(pool.store, handed, "gone-boot", pool.get(handed).attempt).finish("interrupted", 143) == \
        "queued"
    pool.promote()
    assert pool.get(handed).state.value == "running" and pool.get(handed).affinity == D1
    publish_at(pool, D1, at_ms=pool.now_ms() - int(STALE * 1000) - 5000)

    def seen(report: Any) -> dict[str, Any]:
        doc = report.to_dict()
        for b in doc["workers"]["boots"]:
            b.pop("heartbeat_age_ms")
        doc.pop("now")
        doc["last_sweep"] = None
        return cast("dict[str, Any]", doc)

    placed = pool.status()
    assert placed.daemons is not None
    (stale,) = placed.daemons.stale
    assert (stale.daemon_id, sorted(stale.jobs)) == (D1, sorted([*dead, handed]))
    assert {w.id: w.running for w in placed.workers.boots} == {"w1": 2, "w2": 1}  # type: ignore[union-attr]

    c = pool.store.client
    c.hdel(pool.keys.config, "placed_kept")
    c.delete(pool.keys.running_by, pool.keys.running_daemons, pool.keys.running_on)
    assert seen(pool.status()) == seen(placed)


def test_a_worker_names_its_first_jobs_and_says_how_many_more(backend: Backend) -> None:
    """A worker that owns more jobs than the report names (it adopted them): the report names the first
    WORKER_JOBS, in the order it took them, counts them all, and `jobpool status` says how many more."""
    pool = backend.pool(inventory_stale_secs=STALE)
    live_boot(pool, "w1")
    ids = run_on(pool, WORKER_JOBS + 2, ["w1"], D1)
    report = pool.status()
    assert report.workers is not None
    (w1,) = report.workers.boots
    assert (w1.jobs, w1.running) == (tuple(ids[:WORKER_JOBS]), WORKER_JOBS + 2)
    assert report.to_dict()["workers"]["boots"][0]["running"] == WORKER_JOBS + 2
    line = next(x for x in status_report(report).splitlines() if "w1" in x)
    assert line.endswith(f"running {', '.join(ids[:WORKER_JOBS])} and 2 more")


def test_a_boot_record_that_is_not_a_hash_fails_only_itself(redis_url: str) -> None:
    """A boot record that cannot be read as a hash (a key edited by hand) is a record gone, counted stale;
    the others are read."""
    pool = Pool(connect(redis_url), Settings(redis_url=redis_url, inventory_stale_secs=STALE))
    for b in ("w1", "w2", "w3"):
        live_boot(pool, b)
    pool.store.client.delete(pool.keys.boot("w2"))
    pool.store.client.set(pool.keys.boot("w2"), "junk")
    report = read_status(pool.store)
    assert report.workers is not None
    assert sorted(w.id for w in report.workers.boots) == ["w1", "w3"] and report.workers.stale == 1
    assert {w.host for w in report.workers.boots} == {"h"}


def boot_reads(pool: Pool) -> tuple[int, int]:
    """The MGETs and HGETALLs of one status read (the HGETALLs of the pool's own keys among them)."""
    client = pool.store.client
    client.config_resetstat()
    read_status(pool.store)
    stats = cast("dict[str, dict[str, Any]]", client.info("commandstats"))
    mgets, hgetalls = (int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("mget", "hgetall"))
    return mgets, hgetalls


def test_a_status_read_takes_the_beaten_records_from_their_twins_in_one_mget(redis_url: str) -> None:
    """A worker's beat writes its record as a hash and as a JSON twin with the same TTL (store/workerio.py
    `beat_boot`); a status read takes the twins of every boot in one MGET and reads no hash, and reports each
    worker as its hash says. A clean stop removes both."""
    pool = Pool(connect(redis_url), Settings(redis_url=redis_url, inventory_stale_secs=STALE))
    boots = [Boot(pool.store, "docker", D1) for _ in range(3)]
    for i, boot in enumerate(boots):
        boot.fields["cannot_claim"] = "disk full" if i == 1 else ""
        boot.fields["draining"] = 1 if i == 2 else 0
        boot.beat()
    client = pool.store.client
    for boot in boots:
        ttls = client.pttl(pool.keys.boot(boot.id)), client.pttl(pool.keys.boot_json(boot.id))
        assert all(0 < t <= boot.ttl_ms for t in ttls), ttls
    mgets, hgetalls = boot_reads(pool)
    more = [Boot(pool.store, "docker", D1) for _ in range(3)]
    for boot in more:
        boot.beat()
    assert mgets == 1 and boot_reads(pool) == (1, hgetalls)  # no boot read from its hash
    for boot in more:
        boot.stop()
    report = read_status(pool.store)
    assert report.workers is not None and report.workers.live == 3 and report.workers.draining == 1
    by_id = {w.id: w for w in report.workers.boots}
    for boot in boots:
        record = cast("dict[str, str]", client.hgetall(pool.keys.boot(boot.id)))
        shown = by_id[boot.id]
        assert (shown.host, shown.pid, shown.daemon_id, shown.cannot_claim, shown.draining) == (
            record["host"], int(record["pid"]), record["daemon_id"], record["cannot_claim"],
            record["draining"] == "1")
    boots[0].stop()
    assert not client.exists(pool.keys.boot(boots[0].id), pool.keys.boot_json(boots[0].id))
    report = read_status(pool.store)
    assert report.workers is not None and {w.id for w in report.workers.boots} == {b.id for b in boots[1:]}


def test_a_boot_with_no_readable_twin_is_read_from_its_hash(redis_url: str) -> None:
    """A worker of an earlier release writes no twin, and a twin edited by hand may be anything: those
    boots, and only those, are read from their hashes (a second round trip), the others from their twins;
    a twin that is JSON but not one record (here two) misleads no other boot's record."""
    pool = Pool(connect(redis_url), Settings(redis_url=redis_url, inventory_stale_secs=STALE))
    client = pool.store.client
    beaten = [Boot(pool.store, "docker", D1) for _ in range(3)]
    for boot in beaten:
        boot.beat()
    _, hgetalls = boot_reads(pool)
    live_boot(pool, "older")  # a hash and no twin
    client.set(pool.keys.boot_json(beaten[1].id), '{"host":"x"},{"host":"y"}')
    assert boot_reads(pool) == (1, hgetalls + 2)
    report = read_status(pool.store)
    assert report.workers is not None and report.workers.live == 4 and report.workers.stale == 0
    assert {w.id: w.host for w in report.workers.boots} == {
        **{b.id: str(b.fields["host"]) for b in beaten}, "older": "h"}
    hosts = {**{b.id: str(b.fields["host"]) for b in beaten}, "older": "h"}
    for edited in ("not json", "[" * 100_000, "{}", '{"role":"x"}'):  # the last two name no boot
        client.set(pool.keys.boot_json(beaten[1].id), edited)
        assert boot_reads(pool) == (1, hgetalls + 2), edited[:20]
        report = read_status(pool.store)
        assert report.workers is not None and report.workers.stale == 0
        assert {w.id: w.host for w in report.workers.boots} == hosts, edited[:20]


def test_twins_edited_to_shift_the_others_mislead_no_boot(redis_url: str) -> None:
    """Two twins edited so that, joined, they still parse to as many records (the first holds a record and
    the start of another, the third its end): every record must name its own boot, so the untouched boot
    between them is shown from its own twin, and the two edited ones from their hashes."""
    pool = Pool(connect(redis_url), Settings(redis_url=redis_url, inventory_stale_secs=STALE))
    client = pool.store.client
    boots = [Boot(pool.store, "docker", D1) for _ in range(3)]
    for i, boot in enumerate(boots):
        boot.fields["host"] = f"host-{i}"
        boot.beat()
    order = [b for b, _ in pool.store.status_head(10)[2]]  # the twins' order in the status read
    client.set(pool.keys.boot_json(order[0]), '{"host":"evil"},{"host":"evil2"},{"x":[0')
    client.set(pool.keys.boot_json(order[2]), "0]}")  # joined: three JSON objects for three twins
    report = read_status(pool.store)
    assert report.workers is not None and report.workers.live == 3
    assert {w.id: w.host for w in report.workers.boots} == {b.id: str(b.fields["host"]) for b in boots}
