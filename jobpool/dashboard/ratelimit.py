"""How often the dashboard lets anyone try a token: token buckets, one per client address and one for all
(jobpool/dashboard/auth.py asks them before it looks at a guess).

In-process and in memory, like the sessions: one dashboard process, one set of buckets, a restart starts them
full again. A bucket holds `burst` tries and gains one back every `refill_secs`.
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    tries: float
    at: float


class Buckets:
    """One token bucket per key, each holding `burst` tries and gaining one every `refill_secs`. At most
    `max_keys` keys are kept: a full bucket is the same as no bucket, so those go first, then the oldest."""

    def __init__(self, burst: int, refill_secs: float, max_keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.refill_secs = refill_secs
        self.max_keys = max_keys
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def _level(self, bucket: _Bucket, now: float) -> float:
        return min(float(self.burst), bucket.tries + (now - bucket.at) / self.refill_secs)

    def wait(self, key: str) -> float:
        """Seconds until `key` may try again (0: it may now)."""
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                return 0.0
            level = self._level(bucket, self.clock())
            return 0.0 if level >= 1 else (1 - level) * self.refill_secs

    def take(self, key: str) -> None:
        """Spend one try of `key` (asked only when `wait(key)` said 0)."""
        with self._lock:
            now = self.clock()
            bucket = self._buckets.get(key)
            if bucket is None:
                self._make_room(now)
                bucket = self._buckets[key] = _Bucket(float(self.burst), now)
            bucket.tries = max(self._level(bucket, now) - 1, 0.0)
            bucket.at = now

    def __len__(self) -> int:
        return len(self._buckets)

    def _make_room(self, now: float) -> None:
        if len(self._buckets) < self.max_keys:
            return
        for key in [k for k, b in self._buckets.items() if self._level(b, now) >= self.burst]:
            del self._buckets[key]
        while len(self._buckets) >= self.max_keys:
            del self._buckets[next(iter(self._buckets))]  # the oldest key (dicts keep insertion order)


#: Tries one client address may make at once, then one every LOGIN_REFILL_SECS.
LOGIN_BURST = 5
LOGIN_REFILL_SECS = 10.0
#: The same for all clients together: many addresses guessing at once are slowed too.
GLOBAL_BURST = 30
GLOBAL_REFILL_SECS = 2.0
#: The key of the bucket shared by all clients.
EVERYONE = "*"


def client_key(address: str) -> str:
    """Whose bucket a client address spends: an IPv6 client's whole /64 (one host is given a /64 and can pick
    any address in it), any other address as it is."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class LoginLimiter:
    """Login tries, per client (`client_key`) and for all clients. `refused(client)` says how long a client
    must wait, before its guess is looked at; `tried(client)` spends one try of the client and of everyone."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_client = Buckets(LOGIN_BURST, LOGIN_REFILL_SECS, clock=clock)
        self.everyone = Buckets(GLOBAL_BURST, GLOBAL_REFILL_SECS, max_keys=1, clock=clock)

    def refused(self, client: str) -> tuple[str, int] | None:
        """None, or why `client` may not try now and the whole seconds it must wait."""
        own = self.per_client.wait(client_key(client))
        if own > 0:
            return "too many login attempts from this address", math.ceil(own)
        shared = self.everyone.wait(EVERYONE)
        if shared > 0:
            return "too many login attempts to this dashboard", math.ceil(shared)
        return None

    def tried(self, client: str) -> None:
        self.per_client.take(client_key(client))
        self.everyone.take(EVERYONE)
