"""Judging a container on a daemon the supervisor cannot ask, from that daemon's inventory
(jobpool/supervisor/remote.py), and applying the verdict fenced on that inventory (reconcile_apply.lua), on
fakeredis[lua] and a real redis-server.

Fresh: present, exited (its code, what ended it), absent. Stale, expired, never published, incomplete, a
created container: unknown, naming the daemon and the inventory's age. A later boot of the same daemon first
published after the old boot's last inventory: absent (the boot rule); a clone that published meanwhile:
unknown. The slot-freeing rules are the sweep's own (verdicts.py); the inventory only answers the probe.
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

import pytest

from jobpool import errors, forget_daemon, gone_daemons, unforget_daemon
from jobpool.api import Pool
from jobpool.fleet.inventory import FORGET_MS, Entry
from jobpool.status import Daemons, StatusReport
from jobpool.supervisor import remote
from jobpool.supervisor.adoption import Adoptions
from jobpool.supervisor.apply import Applier
from jobpool.supervisor.evidence import Evidence
from jobpool.supervisor.probes import Absent, ContainerProber, Present, Unknown
from jobpool.supervisor.verdicts import Kind, decide
from tests.support.attempts import claim
from tests.support.inventories import orphan_on, publish
from tests.support.pool_helpers import Backend, row, state_of

UUID = "jpd1:" + "c" * 32
D1 = UUID + "@boot-1"
D2 = UUID + "@boot-2"  # the same daemon after its host rebooted
NOWHERE = "unix:///nonexistent/jobpool-test.sock"  # a supervisor attached to no daemon
STALE = 30.0


def judged(pool: Pool, job_id: str, attempt: int, recorded: str = D1) -> Any:
    secs, micros = pool.store.client.time()
    invs = remote.read(pool.store, [recorded], secs * 1000 + micros // 1000)
    return remote.judge(attempt, job_id, recorded, invs, STALE)


def test_a_fresh_inventory_answers_as_the_daemon_would(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=4)
    run, done, oom, gone = (orphan_on(pool, D1) for _ in range(4))
    publish(pool, D1, [Entry(run[0], run[1], "running", container_id="c1"),
                       Entry(run[0], run[1] - 1 if run[1] > 1 else 99, "exited", 0, "old"),
                       Entry(done[0], done[1], "exited", 3, "c2"),
                       Entry(oom[0], oom[1], "exited", 137, "c3", "oom", "oom_killed"),
                       Entry(gone[0], gone[1] + 1, "running", container_id="c4")])  # another attempt
    p = judged(pool, *run)
    assert isinstance(p, Present) and p.running and p.inventory is not None and D1 in p.detail
    p = judged(pool, *done)
    assert isinstance(p, Present) and (p.running, p.exit_code, p.ending) == (False, 3, None)
    p = judged(pool, *oom)
    assert isinstance(p, Present) and p.ending is not None and p.ending.reason == "oom_killed"
    p = judged(pool, *gone)
    assert isinstance(p, Absent) and not p.never_started and f"attempt {gone[1]}" in p.detail


def test_what_an_inventory_cannot_prove_is_unknown(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=3)
    created, unlisted, unread = (orphan_on(pool, D1) for _ in range(3))
    # Never published.
    p = judged(pool, *created)
    assert isinstance(p, Unknown) and f"no inventory of daemon {D1}" in p.reason
    publish(pool, D1, [Entry(created[0], created[1], "created", container_id="c1"),
                       Entry(unread[0], unread[1], "unknown", reason="state 'weird'")], complete=False)
    p = judged(pool, *created)
    assert isinstance(p, Unknown) and "never started" in p.reason
    p = judged(pool, *unlisted)
    assert isinstance(p, Unknown) and "incomplete" in p.reason
    p = judged(pool, *unread)
    assert isinstance(p, Unknown) and "weird" in p.reason
    # No identity recorded, or Docker's ID only: no inventory speaks for it.
    assert isinstance(judged(pool, *unlisted, recorded=""), Unknown)
    assert "docker ID" in judged(pool, *unlisted, recorded="ABCD:EFGH").reason


def test_a_stale_or_expired_inventory_is_unknown_naming_its_daemon_and_age(backend: Backend) -> None:
    pool = backend.pool()
    job = orphan_on(pool, D1)
    at = publish(pool, D1, [])
    invs = remote.read(pool.store, [D1], at + int(STALE * 1000) + 5000)
    p = remote.judge(job[1], job[0], D1, invs, STALE)
    assert isinstance(p, Unknown) and f"inventory of daemon {D1} is 35.0s old (stale after 30s)" in p.reason
    # expired; the index still says when it was last heard of
    pool.store.client.delete(pool.keys.inventory(D1))
    p = remote.judge(job[1], job[0], D1, remote.read(pool.store, [D1], at + 100_000), STALE)
    assert isinstance(p, Unknown) and "last published 100.0s ago and has expired" in p.reason


def test_not_listed_is_absence_only_in_an_inventory_younger_than_a_lease(backend: Backend) -> None:
    """A container created after the listing starts only after a fenced heartbeat renews its lease; once that
    lease has lapsed too, an older listing says nothing of it."""
    pool = backend.pool()
    job_id, attempt = orphan_on(pool, D1)
    at = publish(pool, D1, [])
    young = remote.judge(attempt, job_id, D1, remote.read(pool.store, [D1], at + 900), STALE, lease_secs=1.0)
    assert isinstance(young, Absent)
    old = remote.judge(attempt, job_id, D1, remote.read(pool.store, [D1], at + 1100), STALE, lease_secs=1.0)
    assert isinstance(old, Unknown) and "older than a lease (1s)" in old.reason
    assert remote.max_age_ms(young, D1, STALE, 1.0) == 1000
    assert remote.max_age_ms(young, "jpd1:other@boot", STALE, 1.0) == 30_000, "the boot rule: stale limit"


def test_a_later_boot_of_the_same_daemon_proves_the_old_boots_containers_gone(backend: Backend) -> None:
    pool = backend.pool()
    job_id, attempt = orphan_on(pool, D1)
    old_at = publish(pool, D1, [Entry(job_id, attempt, "running", container_id="c1")])
    time.sleep(0.01)
    new_at = publish(pool, D2, [])  # the host rebooted: its workers publish under the new boot id
    assert new_at > old_at
    invs = remote.read(pool.store, [D1], new_at + int(STALE * 1000) - 1000 + (new_at - old_at))
    # Until the old inventory is stale the old boot's own word stands.
    invs_fresh = remote.read(pool.store, [D1], new_at)
    assert isinstance(remote.judge(attempt, job_id, D1, invs_fresh, STALE), Present)
    later = old_at + int(STALE * 1000) + 1
    invs = remote.read(pool.store, [D1], later)
    p = remote.judge(attempt, job_id, D1, invs, STALE)
    assert isinstance(p, Absent) and "booted again" in p.detail and p.inventory == (D2, new_at)


@pytest.mark.parametrize("case", ["lists it", "incomplete"])
def test_a_later_boot_that_still_lists_the_container_or_cannot_say_proves_nothing(backend: Backend,
                                                                                   case: str) -> None:
    # A "new boot" whose inventory lists the old boot's container is no reboot (a worker whose /proc shows
    # another boot id than the daemon's kernel, under a sandboxed runtime); an incomplete one cannot say.
    pool = backend.pool()
    job_id, attempt = orphan_on(pool, D1)
    old_at = publish(pool, D1, [Entry(job_id, attempt, "running", container_id="c1")])
    time.sleep(0.01)
    if case == "lists it":
        publish(pool, D2, [Entry(job_id, attempt, "running", container_id="c1")])
    else:
        publish(pool, D2, [], complete=False)
    invs = remote.read(pool.store, [D1], old_at + int(STALE * 1000) + 1)
    p = remote.judge(attempt, job_id, D1, invs, STALE)
    assert isinstance(p, Unknown) and "looks rebooted" in p.reason, p


def test_an_inventory_is_dated_by_when_its_listing_began(backend: Backend) -> None:
    # A container created while the listing was taken and published may be missing from it: the inventory
    # must not look younger than the listing (the lease rule for "not listed" counts from it).
    pool = backend.pool()
    k = pool.keys
    pool.store.run("inventory_lead", [k.inventory_lead(D1)], [D1, "pub", 60_000])
    listed = pool.now_ms() - 5_000

    def send(at: int) -> list[Any]:
        return pool.store.run("publish_inventory", [k.inventory(D1), k.inventory_lead(D1), k.inventories,
                                                    k.gone_daemons, k.returned_daemons],
                              [D1, "pub", "boot-1", 60_000, 600_000, "1", "[]", FORGET_MS, at])

    assert int(send(listed)[1]) == listed
    assert int(cast(str, pool.store.client.hget(k.inventory(D1), "at"))) == listed
    for bad in (pool.now_ms() + 60_000, pool.now_ms() - 120_000):  # from the future; older than the lead
        with pytest.raises(errors.InvalidArgument):
            send(bad)


def test_a_clone_that_published_while_the_original_did_proves_nothing(backend: Backend) -> None:
    pool = backend.pool()
    job_id, attempt = orphan_on(pool, D1)
    clone_first = publish(pool, D2, [])  # a clone of the data root, booted and publishing first
    time.sleep(0.01)
    old_at = publish(pool, D1, [Entry(job_id, attempt, "running", container_id="c1")])
    time.sleep(0.01)
    publish(pool, D2, [])  # still publishing; its first_at stays
    assert clone_first < old_at
    invs = remote.read(pool.store, [D1], old_at + int(STALE * 1000) + 1)
    invs.by_daemon[D2] = invs.by_daemon[D2].__class__(**{**invs.by_daemon[D2].__dict__,
                                                        "at_ms": old_at + int(STALE * 1000)})
    p = remote.judge(attempt, job_id, D1, invs, STALE)
    assert isinstance(p, Unknown) and "stale" in p.reason


def applier(pool: Pool) -> Applier:
    return Applier(pool.store, ContainerProber(NOWHERE, timeout=1), Adoptions(pool.store), "supervisor:test")


@pytest.mark.parametrize("republished", [False, True])
def test_a_verdict_is_applied_only_on_the_inventory_it_was_judged_from(backend: Backend,
                                                                      republished: bool) -> None:
    pool = backend.pool(max_concurrent_jobs=2, recovery_budget=0)
    job_id, attempt = orphan_on(pool, D1)
    publish(pool, D1, [Entry(job_id, attempt, "exited", 3, "c1")])
    snap = Evidence(pool.store).read([job_id])
    probe = judged(pool, job_id, attempt)
    verdict = decide(snap.rows[0], False, probe, None, snap.now_ms, pool.settings)
    assert verdict.kind is Kind.EXITED
    if republished:  # a newer inventory came between the evidence and the apply: judged again next sweep
        time.sleep(0.01)
        publish(pool, D1, [Entry(job_id, attempt, "exited", 3, "c1")])
    outcome = applier(pool).reconcile_apply(snap.rows[0], verdict, probe)
    if republished:
        assert outcome == "conflict" and state_of(pool, job_id) == "running"
    else:
        assert outcome == "failed" and row(pool, job_id)["exit_code"] == "3"


def test_a_stale_inventory_by_the_servers_clock_is_refused_at_apply(backend: Backend) -> None:
    pool = backend.pool(recovery_budget=1)
    job_id, attempt = orphan_on(pool, D1)
    publish(pool, D1, [])
    probe = judged(pool, job_id, attempt)
    assert isinstance(probe, Absent)
    snap = Evidence(pool.store).read([job_id])
    verdict = decide(snap.rows[0], False, probe, None, snap.now_ms, pool.settings)
    short = pool.settings.replace(inventory_secs=0.1, inventory_stale_secs=0.2)
    stale_applier = applier(Pool(pool.store.client, short))
    time.sleep(0.3)
    assert stale_applier.reconcile_apply(snap.rows[0], verdict, probe) == "conflict"
    assert applier(pool).reconcile_apply(snap.rows[0], verdict, probe) == "queued"
    assert row(pool, job_id)["recovery_attempts"] == "1"


def test_a_supervisor_attached_to_no_daemon_sweeps_from_inventories(backend: Backend) -> None:
    """The sweep end to end: rows on a daemon it cannot ask are judged from that daemon's inventory."""
    from jobpool.supervisor import Supervisor

    # A short lease: "absent" waits one lease after redis-server started (the session's started moments ago).
    pool = backend.pool(max_concurrent_jobs=3, recovery_budget=1, lease_secs=0.2, heartbeat_secs=0.1)
    running, exited, gone = (orphan_on(pool, D1) for _ in range(3))

    def fresh() -> None:
        """The daemon's inventory published again: judged and applied only while at most one lease (0.2 s)
        old, which a loaded host can pass between a publication and a sweep."""
        publish(pool, D1, [Entry(running[0], running[1], "running", container_id="c1"),
                           Entry(exited[0], exited[1], "exited", 0, "c2")])

    sup = Supervisor(pool.store, ContainerProber(NOWHERE, timeout=1))
    try:
        fresh()
        report = sup.sweep(job_ids=[running[0], exited[0], gone[0]], dry_run=True)
        kinds = {d.job_id: d.verdict.kind for d in report.decisions}
        assert kinds == {running[0]: Kind.ADOPT, exited[0]: Kind.EXITED, gone[0]: Kind.ABSENT}
        pool.store.client.hset(pool.keys.config, "max_concurrent_jobs", 3)
        fresh()
        sup.sweep(job_ids=[exited[0], gone[0]])
        assert state_of(pool, exited[0]) == "succeeded"
        # Absent with budget left: queued again (and promoted again at once into the freed slot).
        again = pool.get(gone[0])
        assert row(pool, gone[0])["recovery_attempts"] == "1" and not again.owner_boot
        assert again.state.value == "queued" or again.attempt == gone[1] + 1
    finally:
        sup.close()


# ---- daemons declared gone for good (jobpool/fleet/gone.py) --------------------------------------------


def test_a_daemon_declared_gone_frees_its_jobs_and_only_once_it_stopped_publishing(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2, recovery_budget=1)
    job_id, attempt = orphan_on(pool, D1)
    publish(pool, D1, [Entry(job_id, attempt, "running", container_id="c1")])
    before = backend.keyspace()
    with pytest.raises(errors.Conflict, match="not gone"):
        forget_daemon(pool, D1, note="ticket 1")  # its workers still speak for it
    assert backend.keyspace() == before
    pool.store.client.hset(pool.keys.inventory(D1), "at", pool.now_ms() - int(STALE * 1000) - 1000)
    assert isinstance(judged(pool, job_id, attempt), Unknown), "stale: kept"
    with pytest.raises(errors.Conflict, match="lead"):
        forget_daemon(pool, D1)  # its publisher's lead has not lapsed yet: it may be about to publish
    assert not pool.store.client.exists(pool.keys.gone_daemons)
    pool.store.client.delete(pool.keys.inventory_lead(D1))  # the lead lapsed with its holder
    forget_daemon(pool, D1, actor="ops", note="ticket 1")
    assert gone_daemons(pool)[D1]["actor"] == "ops" and gone_daemons(pool)[D1]["note"] == "ticket 1"
    p = judged(pool, job_id, attempt)
    assert isinstance(p, Absent) and "declared gone" in p.detail and "ticket 1" in p.detail
    snap = Evidence(pool.store).read([job_id])
    verdict = decide(snap.rows[0], False, p, None, snap.now_ms, pool.settings)
    assert applier(pool).reconcile_apply(snap.rows[0], verdict, p) == "queued"
    assert row(pool, job_id)["recovery_attempts"] == "1"
    # A daemon that comes back after all is judged from its own word again.
    job2, attempt2 = orphan_on(pool, D1)
    publish(pool, D1, [Entry(job2, attempt2, "running", container_id="c2")])
    assert isinstance(judged(pool, job2, attempt2), Present)


def test_a_daemon_declared_gone_keeps_the_ends_its_last_inventory_recorded(backend: Backend) -> None:
    pool = backend.pool(recovery_budget=1)
    job_id, attempt = orphan_on(pool, D1)
    publish(pool, D1, [Entry(job_id, attempt, "exited", 3, "c1")])
    pool.store.client.hset(pool.keys.inventory(D1), "at", pool.now_ms() - int(STALE * 1000) - 1000)
    pool.store.client.delete(pool.keys.inventory_lead(D1))
    forget_daemon(pool, D1)
    p = judged(pool, job_id, attempt)
    assert isinstance(p, Present) and p.exit_code == 3 and p.inventory is None and "declared gone" in p.detail
    snap = Evidence(pool.store).read([job_id])
    verdict = decide(snap.rows[0], False, p, None, snap.now_ms, pool.settings)
    assert applier(pool).reconcile_apply(snap.rows[0], verdict, p) == "failed", "its own exit, not run again"


def test_a_daemon_that_never_published_cannot_be_declared_gone(backend: Backend) -> None:
    pool = backend.pool()
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument, match="published an inventory"):
        forget_daemon(pool, D1)
    assert backend.keyspace() == before


@pytest.mark.parametrize("bad", ["", "jpd1:abc", "docker-id-ABCD", "jpd1:a@b c", "jpd1:" + "a" * 300 + "@b",
                                 None, 7])
def test_forgetting_anything_but_a_daemon_identity_is_refused_and_writes_nothing(backend: Backend,
                                                                                 bad: Any) -> None:
    pool = backend.pool()
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument):
        forget_daemon(pool, bad)
    with pytest.raises(errors.InvalidArgument):
        forget_daemon(pool, D1, note="x" * 1001)
    assert backend.keyspace() == before



def gone_now(pool: Pool, daemon: str = D1) -> None:
    """The daemon's inventory stale, its lead lapsed: what forget_daemon waits for."""
    pool.store.client.hset(pool.keys.inventory(daemon), "at", pool.now_ms() - int(STALE * 1000) - 1000)
    pool.store.client.delete(pool.keys.inventory_lead(daemon))


def returned(pool: Pool) -> list[dict[str, Any]]:
    returned = cast("list[str]", pool.store.client.zrange(pool.keys.returned_daemons, 0, -1))
    return [json.loads(r) for r in returned]


def daemons_of(report: StatusReport) -> Daemons:
    assert report.daemons is not None, "a pool's status reports its daemons"
    return report.daemons


def pool_events(pool: Pool) -> list[dict[str, str]]:
    entries = cast("list[tuple[str, dict[str, str]]]", pool.store.client.xrange(pool.keys.events))
    return [fields for _, fields in entries]


def test_a_daemon_declared_gone_that_publishes_again_is_not_gone(backend: Backend) -> None:
    """A daemon declared gone while its workers were hung comes back and publishes. Its
    declaration is lifted in that very publication, so when its inventory is stale again later (an ordinary
    worker crash) its jobs are unknown, never absent on the old word."""
    pool = backend.pool(max_concurrent_jobs=2, recovery_budget=1)
    publish(pool, D1, [])
    gone_now(pool)
    forget_daemon(pool, D1, actor="ops", note="ticket 7")
    assert [e["reason"] for e in pool_events(pool)][-1] == "daemon_forgotten"
    at = publish(pool, D1, [], boot="pub-back")  # it was only hung: its worker publishes again
    assert gone_daemons(pool) == {}, "the declaration is lifted by the publication itself"
    (record,) = returned(pool)
    assert (record["daemon"], record["how"], record["by"], record["at"], record["forgotten_by"],
            record["forgotten_note"]) == (D1, "published", "pub-back", at, "ops", "ticket 7")
    back = pool_events(pool)[-1]
    assert (back["reason"], back["actor"]) == ("daemon_back", "pub-back") and D1 in back["evidence"]
    # It runs a job, and its worker dies: the inventory goes stale. Unknown, not absent.
    job_id, attempt = orphan_on(pool, D1)
    publish(pool, D1, [Entry(job_id, attempt, "running", container_id="c1")], boot="pub-back")
    gone_now(pool)
    p = judged(pool, job_id, attempt)
    assert isinstance(p, Unknown) and "stale" in p.reason, p
    # Publishing again with no declaration standing records nothing more.
    publish(pool, D1, [])
    assert len(returned(pool)) == 1
    assert [e["reason"] for e in pool_events(pool)].count("daemon_back") == 1


def test_a_declaration_is_withdrawn_by_hand_and_only_one_that_stands(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2, recovery_budget=1)
    job_id, attempt = orphan_on(pool, D1)
    publish(pool, D1, [Entry(job_id, attempt, "running", container_id="c1")])
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument, match="not declared gone"):
        unforget_daemon(pool, D1)
    for bad in ("", "jpd1:abc", None):
        with pytest.raises(errors.InvalidArgument):
            unforget_daemon(pool, bad)  # type: ignore[arg-type]
    assert backend.keyspace() == before, "a refused withdrawal writes nothing"
    gone_now(pool)
    forget_daemon(pool, D1)
    assert isinstance(judged(pool, job_id, attempt), Absent)
    unforget_daemon(pool, D1, actor="ops", note="it was only a network partition")
    assert gone_daemons(pool) == {}
    assert isinstance(judged(pool, job_id, attempt), Unknown), "judged from its own (stale) inventory again"
    (record,) = returned(pool)
    assert (record["how"], record["by"], record["note"]) == ("withdrawn", "ops",
                                                             "it was only a network partition")
    event = pool_events(pool)[-1]
    assert event["reason"] == "daemon_unforgotten" and "network partition" in event["evidence"]
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument, match="not declared gone"):
        unforget_daemon(pool, D1)  # withdrawn already
    assert backend.keyspace() == before


def test_records_of_lifted_declarations_are_kept_a_week(backend: Backend) -> None:
    pool = backend.pool()
    old = json.dumps({"daemon": D2, "how": "published", "at": 1})
    pool.store.client.zadd(pool.keys.returned_daemons, {old: pool.now_ms() - FORGET_MS - 1000})
    publish(pool, D1, [])
    gone_now(pool)
    forget_daemon(pool, D1)
    publish(pool, D1, [])
    assert [r["daemon"] for r in returned(pool)] == [D1], "the record older than a week trimmed"


def test_a_daemon_silent_for_over_a_week_stays_forgettable_while_a_running_row_names_it(
        backend: Backend) -> None:
    """A host destroyed and not forgotten within a week has aged out of the `inventories`
    index, yet its job holds a slot for ever: the typo check accepts an id a running row names."""
    pool = backend.pool(max_concurrent_jobs=2, recovery_budget=1)
    job_id, attempt = orphan_on(pool, D1)
    assert pool.store.client.zscore(pool.keys.inventories, D1) is None, \
        "never in the index (or aged out of it)"
    other = UUID[:-4] + "dddd@boot-1"
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument, match="no running job is recorded on it"):
        forget_daemon(pool, other)  # named by no row: a typo
    assert backend.keyspace() == before
    forget_daemon(pool, D1, note="destroyed last month")
    p = judged(pool, job_id, attempt)
    assert isinstance(p, Absent) and "destroyed last month" in p.detail
    snap = Evidence(pool.store).read([job_id])
    verdict = decide(snap.rows[0], False, p, None, snap.now_ms, pool.settings)
    assert applier(pool).reconcile_apply(snap.rows[0], verdict, p) == "queued", "its slot freed"


def test_a_slot_waiting_on_an_affinity_to_a_daemon_silent_for_a_week_is_named_and_forgettable(
        backend: Backend) -> None:
    """A job handed back from a host that was then destroyed waits promoted on that daemon's queue (its
    checkpoint affinity), holding a slot: `status` names the daemon, and `forget-daemon` takes it, however
    long ago it last published; the sweep then releases the affinity."""
    pool = backend.pool(max_concurrent_jobs=2)
    job_id = pool.enqueue("img", ["true"]).id
    att = claim(pool, job_id)
    att.set_container("cid-" + job_id, D1)
    assert att.finish("interrupted", 143) == "queued", "a drain's handback: its checkpoint is on D1"
    assert row(pool, job_id)["affinity_queue"] == pool.keys.daemon_queue(D1)
    assert pool.store.client.zscore(pool.keys.running, job_id) is not None, "promoted onto D1's queue at once"
    assert pool.get(job_id).owner_boot == ""
    assert pool.store.client.zscore(pool.keys.inventories, D1) is None, \
        "never in the index (or aged out of it)"
    (held,) = daemons_of(pool.status()).stale
    assert (held.daemon_id, held.jobs) == (D1, (job_id,))
    forget_daemon(pool, D1, note="the host of its checkpoints was destroyed")
    assert daemons_of(pool.status()).stale == () and daemons_of(pool.status()).gone == (D1,)


def test_only_a_running_row_makes_an_unpublished_daemon_forgettable(backend: Backend) -> None:
    """A row that names the daemon but no longer runs (finished, or a stale read of the caller's) does not."""
    pool = backend.pool(max_concurrent_jobs=2)
    job_id, _attempt = orphan_on(pool, D1)
    # as if it ended between the caller's read and the script
    pool.store.client.zrem(pool.keys.running, job_id)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument, match="check the id"):
        forget_daemon(pool, D1)
    assert backend.keyspace() == before



def test_status_names_the_daemons_holding_slots_on_stale_evidence_and_those_back(backend: Backend) -> None:
    """`status` (StatusReport.daemons, and a warning with the command) says which daemons hold slots on
    stale or missing inventories and since when; a declared one is no longer held; one back is named."""
    pool = backend.pool(max_concurrent_jobs=3, inventory_stale_secs=STALE)
    job_id, attempt = orphan_on(pool, D1)
    live, _ = orphan_on(pool, D1)
    # its worker lives: held on its lease, not stale
    pool.store.client.set(pool.keys.lease(live), "someone:1")
    at = publish(pool, D1, [Entry(job_id, attempt, "running", container_id="c1")])
    assert daemons_of(pool.status()).stale == (), "a fresh inventory: the sweep judges from it"
    gone_now(pool)
    last = int(cast(str, pool.store.client.hget(pool.keys.inventory(D1), "at")))
    report = pool.status()
    (held,) = daemons_of(report).stale
    assert (held.daemon_id, held.jobs, held.since_ms, held.last_published_ms) == (D1, (job_id,), last, last)
    assert any(f"jobpool forget-daemon {D1}" in w and job_id in w for w in report.health.warnings)
    assert report.to_dict()["daemons"]["stale"][0]["command"] == f"jobpool forget-daemon {D1}"
    # A week on: its inventory expired and it aged out of the index. Still named, since its jobs' last beat.
    pool.store.client.delete(pool.keys.inventory(D1))
    pool.store.client.zrem(pool.keys.inventories, D1)
    pool.store.client.hset(pool.keys.job(job_id), "heartbeat_at", at - 5)
    (held,) = daemons_of(pool.status()).stale
    assert (held.since_ms, held.last_published_ms) == (at - 5, None)
    forget_daemon(pool, D1)
    report = pool.status()
    assert (daemons_of(report).stale, daemons_of(report).gone) == ((), (D1,))
    publish(pool, D1, [])
    report = pool.status()
    (back,) = daemons_of(report).returned
    assert (back.daemon_id, back.how, daemons_of(report).gone) == (D1, "published", ())
    assert any(f"daemon {D1} declared gone" in w and "came back" in w for w in report.health.warnings)


# ---- commands routed to a daemon (jobpool/daemoncommands.py) ----------------------------------------------


class Stopper:
    """Stands in for the daemon's answer to a stop by label (the scripts and the routing are under test)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.asked = fail, []  # type: ignore[var-annotated]

    def stop_by_label(self, pool: str, job_id: str, attempt: int, grace: float) -> list[str]:
        self.asked.append((job_id, attempt))
        if self.fail:
            raise OSError("daemon away")
        return ["c" * 64]


def test_a_stop_routed_to_a_daemon_is_taken_once_by_its_lead_and_recorded(backend: Backend) -> None:
    from jobpool import daemoncommands, errors

    pool = backend.pool(max_concurrent_jobs=2)
    job_id, attempt = orphan_on(pool, D1)
    first = daemoncommands.StopCommand(job_id, attempt, actor="operator:x")
    assert daemoncommands.route_stop(pool.store, D1, first) == 1
    with pytest.raises(errors.Conflict):  # not that attempt: nothing queued
        daemoncommands.route_stop(pool.store, D1, daemoncommands.StopCommand(job_id, attempt + 1))
    pool.store.run("inventory_lead", [pool.keys.inventory_lead(D1)], [D1, "pub", 60_000])
    with pytest.raises(errors.NotOwner):
        daemoncommands.take(pool.store, D1, "another-boot")
    taken = daemoncommands.take(pool.store, D1, "pub")
    assert taken == [daemoncommands.StopCommand(job_id, attempt, actor="operator:x")]
    assert daemoncommands.take(pool.store, D1, "pub") == [], "taken once"
    stopper = Stopper()
    assert daemoncommands.execute(pool.store, stopper, D1, taken[0], "worker:pub") == "remote_stopped"
    assert stopper.asked == [(job_id, attempt)]
    reasons = [e["reason"] for e in pool.events(job_id)]
    assert reasons[-2:] == ["stop_routed", "remote_stopped"]
    assert state_of(pool, job_id) == "running", "a stop alone changes no state: the exit does"
    failed = daemoncommands.execute(pool.store, Stopper(fail=True), D1, taken[0], "worker:pub")
    assert failed == "remote_stop_failed"


def test_a_routed_eviction_fails_the_job_once_stopped(backend: Backend) -> None:
    from jobpool import daemoncommands

    pool = backend.pool(max_concurrent_jobs=2)
    job_id, attempt = orphan_on(pool, D1)
    cmd = daemoncommands.StopCommand(job_id, attempt, evict=True, reason="stale_evicted", actor="operator:x")
    daemoncommands.route_stop(pool.store, D1, cmd)
    assert daemoncommands.execute(pool.store, Stopper(), D1, cmd, "worker:pub") == "remote_stopped"
    assert row(pool, job_id)["state"] == "failed" and row(pool, job_id)["error_reason"] == "stale_evicted"
    # A stop that failed evicts nothing.
    other, att = orphan_on(pool, D1)
    cmd = daemoncommands.StopCommand(other, att, evict=True, reason="stale_evicted")
    done = daemoncommands.execute(pool.store, Stopper(fail=True), D1, cmd, "worker:pub")
    assert done == "remote_stop_failed"
    assert state_of(pool, other) == "running"
    # The same attempt now recorded on another daemon (a Redis rollback lost the first claim, and the attempt
    # ran again elsewhere): a stop on the first daemon proves nothing there, so nothing is evicted.
    moved, att = orphan_on(pool, D2)
    cmd = daemoncommands.StopCommand(moved, att, evict=True, reason="stale_evicted")
    assert daemoncommands.execute(pool.store, Stopper(), D1, cmd, "worker:pub") == "remote_stopped"
    assert state_of(pool, moved) == "running"


def test_a_command_cannot_be_routed_to_no_identity(backend: Backend) -> None:
    from jobpool import daemoncommands, errors

    pool = backend.pool()
    job_id, attempt = orphan_on(pool, D1)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument):
        daemoncommands.route_stop(pool.store, "ABCD:EF", daemoncommands.StopCommand(job_id, attempt))
    assert backend.keyspace() == before
