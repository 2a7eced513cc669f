"""JOBPOOL_REDIS_URL: which Redis a process talks to, and the one place a client for it is made.

Besides redis-py's own schemes (redis://, rediss://, unix://) jobpool takes a Redis watched by Sentinel:

    redis+sentinel://[:password@]host:port[,host:port...]/service_name[/db]

redis-py has no URL for that, so it is parsed here and the client is `redis.sentinel.Sentinel(...)
.master_for(service_name)`: every connection asks the sentinels where the primary is now, and a connection
to a primary that was demoted meets READONLY at its first write, which redis-py turns into a
ConnectionError after dropping the connection (so the next one asks the sentinels again). The password is
the data nodes' (`requirepass` of the primary and replicas); the sentinels are asked without one, as they
are usually run. The Python API, the CLI, workers (RQ's connection too) and the supervisor all come here
(docs/architecture.md, "Redis high availability").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import redis
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.retry import Retry
from redis.sentinel import Sentinel

try:  # redis-py 8 and later: a connection's client name and version for CLIENT SETINFO
    from redis.driver_info import DriverInfo

    #: Made once per process: redis-py otherwise looks its own version up in the installed packages' metadata
    #: for every connection it makes (a scan of sys.path, a millisecond), and a work horse makes its own.
    _DRIVER_INFO: Any = DriverInfo()
except ImportError:  # earlier releases read the version once, at import
    _DRIVER_INFO = None

SENTINEL_SCHEME = "redis+sentinel://"
SCHEMES = ("redis://", "rediss://", "unix://", SENTINEL_SCHEME)
#: How long a sentinel may take to answer "where is the primary": one that does not answer is skipped.
SENTINEL_TIMEOUT_SECS = 2.0


@dataclass(frozen=True)
class SentinelURL:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    password: str | None = None


def parse_sentinel(url: str) -> SentinelURL:
    """The parts of a redis+sentinel:// URL; ValueError (saying what is wrong) for a malformed one."""
    if not url.startswith(SENTINEL_SCHEME):
        raise ValueError(f"not a {SENTINEL_SCHEME} URL")
    rest = url[len(SENTINEL_SCHEME):]
    if "?" in rest or "#" in rest:
        raise ValueError("takes no query or fragment")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        if user or not colon:
            raise ValueError("the credentials must be ':password@' (no user name)")
        password = unquote(secret)
    sentinels = tuple(_host_port(part) for part in hosts.split(","))
    parts = path.split("/") if path else []
    if not parts or not parts[0] or len(parts) > 2:
        raise ValueError("the path must be /service_name or /service_name/db")
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise ValueError(f"the database {parts[1]!r} is not a number")
        db = int(parts[1])
    return SentinelURL(sentinels, unquote(parts[0]), db, password)


def _host_port(text: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # an IPv6 address
    return host, int(port)


def check(url: Any) -> None:
    """ValueError, saying why, for a URL no client could be made from (checked before anything connects)."""
    if not isinstance(url, str) or not url.startswith(SCHEMES):
        raise ValueError("is not a redis://, rediss://, unix:// or redis+sentinel:// URL")
    if url.startswith(SENTINEL_SCHEME):
        parse_sentinel(url)
    else:
        parse_url(url)


def client(url: str, **kwargs: Any) -> redis.Redis:
    """A client of the Redis `url` names (for Sentinel: of its current primary); `kwargs` go to every
    connection (decode_responses, timeouts).

    No command is sent again by redis-py after a dropped connection (`retry`, unless given): a script whose
    reply was lost may have been applied, and only its caller knows how to find out (registry.Scripts.run,
    the fenced retries of jobpool/workers/watch.py). redis-py's default has changed between releases, so it
    is set here rather than left to the installed version."""
    kwargs.setdefault("retry", Retry(NoBackoff(), 0))
    if _DRIVER_INFO is not None:
        kwargs.setdefault("driver_info", _DRIVER_INFO)
    if not url.startswith(SENTINEL_SCHEME):
        return redis.Redis.from_url(url, **kwargs)
    parsed = parse_sentinel(url)
    sentinel = Sentinel(list(parsed.sentinels),
                        sentinel_kwargs={"socket_timeout": SENTINEL_TIMEOUT_SECS,
                                         "socket_connect_timeout": SENTINEL_TIMEOUT_SECS})
    return sentinel.master_for(parsed.service, redis_class=redis.Redis, db=parsed.db,
                               password=parsed.password, **kwargs)


def safe(url: str) -> str:
    """The URL with any password replaced, fit to print (every scheme, a list of sentinels too)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "<not a URL>"
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.partition(":")[0]
    return f"{scheme}://{user}:***@{hosts}{slash}{path}"


def is_sentinel(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEME)
