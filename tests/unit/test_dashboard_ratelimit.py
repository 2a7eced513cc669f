"""The dashboard's login limiter (jobpool/dashboard/ratelimit.py) on a clock the test moves: a client has
LOGIN_BURST tries, then one every LOGIN_REFILL_SECS; all clients together GLOBAL_BURST, then one every
GLOBAL_REFILL_SECS; an IPv6 client's /64 is one client; the table of clients stays bounded."""

from __future__ import annotations

import pytest

from jobpool.dashboard.ratelimit import (
    GLOBAL_BURST,
    GLOBAL_REFILL_SECS,
    LOGIN_BURST,
    LOGIN_REFILL_SECS,
    Buckets,
    LoginLimiter,
    client_key,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def spend(limiter: LoginLimiter, client: str, n: int) -> None:
    for _ in range(n):
        assert limiter.refused(client) is None
        limiter.tried(client)


def test_a_client_gets_its_burst_then_one_try_per_refill() -> None:
    clock = Clock()
    limiter = LoginLimiter(clock)
    spend(limiter, "10.0.0.1", LOGIN_BURST)
    refused = limiter.refused("10.0.0.1")
    assert refused is not None
    why, wait = refused
    assert why == "too many login attempts from this address" and wait == LOGIN_REFILL_SECS
    assert limiter.refused("10.0.0.2") is None  # another client is not held back
    clock.now += LOGIN_REFILL_SECS - 1
    assert limiter.refused("10.0.0.1") == (why, 1)
    clock.now += 1
    spend(limiter, "10.0.0.1", 1)
    assert limiter.refused("10.0.0.1") is not None


def test_all_clients_together_get_the_global_burst() -> None:
    clock = Clock()
    limiter = LoginLimiter(clock)
    for n in range(GLOBAL_BURST):
        spend(limiter, f"10.1.0.{n}", 1)
    refused = limiter.refused("10.2.0.1")
    assert refused is not None and refused[0] == "too many login attempts to this dashboard"
    clock.now += GLOBAL_REFILL_SECS
    assert limiter.refused("10.2.0.1") is None


@pytest.mark.parametrize(("a", "b", "same"), [
    ("2001:db8:1:2::1", "2001:db8:1:2:ffff::9", True),
    ("2001:db8:1:2::1", "2001:db8:1:3::1", False),
    ("::ffff:10.0.0.1", "10.0.0.1", True),
    ("10.0.0.1", "10.0.0.2", False),
])
def test_an_ipv6_clients_slash_64_is_one_client(a: str, b: str, same: bool) -> None:
    assert (client_key(a) == client_key(b)) is same


def test_the_table_of_clients_stays_bounded() -> None:
    clock = Clock()
    buckets = Buckets(burst=1, refill_secs=10, max_keys=3, clock=clock)
    for key in ("a", "b", "c"):
        buckets.take(key)
    assert buckets.wait("a") == 10
    clock.now += 10  # "b" and "c" were taken as "a" was: all full again, all forgotten for the next
    buckets.take("d")
    assert len(buckets) == 1
    for key in ("e", "f", "g"):
        buckets.take(key)
    assert len(buckets) == 3 and buckets.wait("d") == 0  # the oldest went: a forgotten client starts full
    assert buckets.wait("g") == 10
