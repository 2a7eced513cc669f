"""claim.lua sent again after a lost reply: the same claim call succeeds again, any other claim is refused.

A worker whose claim reply was lost (a connection reset after Redis ran the script) cannot tell whether it
owns the row, so it sends the claim again with the same `Attempt` (the same claim token). That must succeed
again, renewing the lease and writing no second 'claimed' event; a claim by anyone else, and a new claim by
the same boot (a duplicate delivery, which might launch a second copy), is still refused.
Runs on fakeredis[lua] and on the real redis-server (tests/unit/conftest.py).
"""

from __future__ import annotations

import pytest

from jobpool import Pool, errors
from jobpool.workers.attempt import Attempt
from tests.support.pool_helpers import Backend, enqueue, events_of, lease, row


def claims(pool: Pool, job_id: str) -> int:
    return [e["reason"] for e in events_of(pool, job_id)].count("claimed")


def test_the_same_claim_sent_again_succeeds_and_renews_the_lease(backend: Backend) -> None:
    pool = backend.pool(lease_secs=30, heartbeat_secs=5)
    job = enqueue(pool, "run", env={"K": "v"})
    att = Attempt(pool.store, job.id, "boot-a", 1)
    first = att.claim("subprocess", "")
    claimed_at = row(pool, job.id)["claimed_at"]
    pool.store.client.pexpire(pool.keys.lease(job.id), 50)  # most of the lease spent while the reply was lost
    pool.store.client.hset(pool.keys.job(job.id), "heartbeat_at", "1")

    again = att.claim("subprocess", "")

    assert again == first and again[0].command == ("run",)
    assert lease(pool, job.id) == "boot-a:1" and pool.store.client.pttl(pool.keys.lease(job.id)) > 1000
    got = row(pool, job.id)
    assert got["owner_boot"] == "boot-a" and got["claimed_at"] == claimed_at
    assert int(got["heartbeat_at"]) >= int(claimed_at)
    assert claims(pool, job.id) == 1


def test_the_same_claim_sent_again_after_the_lease_expired_takes_it_again(backend: Backend) -> None:
    """The row is still this attempt's and no one else's: nothing moved on, so the claim still holds."""
    pool = backend.pool()
    job = enqueue(pool)
    att = Attempt(pool.store, job.id, "boot-a", 1)
    att.claim()
    pool.store.client.delete(pool.keys.lease(job.id))
    att.claim()
    assert lease(pool, job.id) == "boot-a:1" and claims(pool, job.id) == 1


def test_the_same_claim_sent_again_reads_the_requests_made_since(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    att = Attempt(pool.store, job.id, "boot-a", 1)
    att.claim()
    pool.cancel(job.id)
    _, requests = att.claim()
    assert requests.cancel and not requests.pause


@pytest.mark.parametrize("who", ["same_boot_new_claim", "other_boot_same_token", "no_token"])
def test_any_other_claim_of_an_owned_attempt_is_refused_and_writes_nothing(backend: Backend,
                                                                          who: str) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    att = Attempt(pool.store, job.id, "boot-a", 1)
    att.claim()
    before = backend.keyspace()
    keys = [pool.keys.job(job.id), pool.keys.lease(job.id)]
    with pytest.raises(errors.NotOwner):  # noqa: PT012 - one call, chosen by the parameter
        if who == "same_boot_new_claim":  # a duplicate delivery to the same boot: a new Attempt, a new token
            Attempt(pool.store, job.id, "boot-a", 1).claim()
        elif who == "other_boot_same_token":
            pool.store.run("claim", keys, [job.id, "boot-b", 1, 30000, "", "", att._claim_token])
        else:  # a caller that sends no token is never taken for a retry
            pool.store.run("claim", keys, [job.id, "boot-a", 1, 30000, "", ""])
    assert backend.keyspace() == before


def test_the_same_claim_sent_again_after_the_row_moved_on_is_refused(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    att = Attempt(pool.store, job.id, "boot-a", 1)
    att.claim()
    att.finish("interrupted", 75)  # handed back, and promoted again at once as attempt 2
    assert pool.get(job.id).attempt == 2
    with pytest.raises(errors.Conflict):
        att.claim()
    Attempt(pool.store, job.id, "boot-b", 2).claim()
    with pytest.raises(errors.Conflict):
        att.claim()
    assert claims(pool, job.id) == 2


def test_a_claim_without_a_token_still_takes_a_promoted_row(backend: Backend) -> None:
    """Callers of the script that predate the token (six arguments) keep working for a first claim."""
    pool = backend.pool()
    job = enqueue(pool)
    reply = pool.store.run("claim", [pool.keys.job(job.id), pool.keys.lease(job.id)],
                           [job.id, "boot-a", 1, 30000, "", ""])
    assert reply[0] == 0 and lease(pool, job.id) == "boot-a:1"
