"""JOBPOOL_REDIS_URL: which Redis a process talks to, the one place a client for it is made, and the one way a
URL is printed.

Besides redis-py's own schemes (redis://, rediss://, unix://) jobpool takes a Redis watched by Sentinel:

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db][?option=value&...]

redis-py has no URL for that, so it is parsed here and the client is `redis.sentinel.Sentinel(...)
.master_for(service_name)`: every connection asks the sentinels where the primary is now, and a connection
to a primary that was demoted meets READONLY at its first write, which redis-py turns into a
ConnectionError after dropping the connection (so the next one asks the sentinels again). The credentials
are the data nodes' (`requirepass` or an ACL user of the primary and replicas); the sentinels are asked
without any unless the query gives `sentinel_password` (and `sentinel_username`): every `sentinel_*` option
goes to the sentinels, the others to the data nodes. The Python API, the CLI, workers (RQ's connection too)
and the supervisor all come here (docs/architecture.md, "Redis high availability").

A URL is checked whole before anything connects (`check`): every query option is one redis-py takes
(jobpool/store/redisopts.py), given once; the database is one number, said once. redis-py itself would read
`/abc` as database 0, `/1/5` as 15, and fail on a misspelt option only at the first connection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, unquote_plus, urlencode, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.retry import Retry
from redis.sentinel import Sentinel

from . import redisopts

if TYPE_CHECKING:
    import redis.asyncio

try:  # redis-py 8 and later: a connection's client name and version for CLIENT SETINFO
    from redis.driver_info import DriverInfo

    #: Made once per process: redis-py otherwise looks its own version up in the installed packages' metadata
    #: for every connection it makes (a scan of sys.path, a millisecond), and a work horse makes its own.
    _DRIVER_INFO: Any = DriverInfo()
except ImportError:  # earlier releases read the version once, at import
    _DRIVER_INFO = None

SENTINEL_SCHEME = "redis+sentinel://"
SCHEMES = ("redis://", "rediss://", "unix://", SENTINEL_SCHEME)
#: How long a sentinel may take to answer "where is the primary": one that does not answer is skipped
#: (`sentinel_socket_timeout` and `sentinel_socket_connect_timeout` in the URL change it).
SENTINEL_TIMEOUT_SECS = 2.0
#: What a hidden credential is shown as.
HIDDEN = "***"
#: The highest TCP port.
MAX_PORT = 65535
_DB = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class SentinelURL:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    password: str | None = None
    username: str | None = None
    #: The other query options, as redis-py converts them: for the data nodes' connections...
    options: dict[str, Any] = field(default_factory=dict)
    #: ...and, given as `sentinel_<name>`, for the sentinels' (without the prefix).
    sentinel_options: dict[str, Any] = field(default_factory=dict)


def parse_sentinel(url: str) -> SentinelURL:
    """The parts of a redis+sentinel:// URL; ValueError (saying what is wrong) for a malformed one."""
    if not url.startswith(SENTINEL_SCHEME):
        raise ValueError(f"not a {SENTINEL_SCHEME} URL")
    rest = url[len(SENTINEL_SCHEME):]
    if "#" in rest:
        raise ValueError("takes no fragment ('#')")
    head, _, query = rest.partition("?")
    netloc, _, path = head.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        if not colon:
            raise ValueError("the credentials must be 'user:password@' or ':password@'")
        username, password = unquote(user) or None, unquote(secret)
    sentinels = tuple(_host_port(part) for part in hosts.split(","))
    parts = path.split("/") if path else []
    if not parts or not parts[0] or parts[2:]:
        raise ValueError("the path must be /service_name or /service_name/db")
    pairs = _query_pairs("redis+sentinel", query)
    db = _one_db(_path_db(parts[1]) if parts[1:] else None, pairs)
    options = _converted([(k, v) for k, v in pairs
                          if k != "db" and not k.startswith(redisopts.SENTINEL_PREFIX)])
    to_sentinels = _converted([(k.removeprefix(redisopts.SENTINEL_PREFIX), v) for k, v in pairs
                               if k.startswith(redisopts.SENTINEL_PREFIX)])
    username = _once("username", username, options.pop("username", None))
    password = _once("password", password, options.pop("password", None))
    return SentinelURL(sentinels, unquote(parts[0]), db, password, username, options, to_sentinels)


def _host_port(text: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) <= MAX_PORT:
        raise ValueError(f"names a sentinel that is not host:port (port 1 to {MAX_PORT})")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # an IPv6 address
    return host, int(port)


def _query_pairs(scheme: str, query: str) -> list[tuple[str, str]]:
    """The query's (name, value) pairs, decoded as redis-py decodes them (jobpool/store/redisopts.py says
    which names it takes); ValueError for an unknown, repeated or valueless option.

    No message here quotes a part of the URL other than an option's name: it follows the URL as `safe`
    shows it, and a password holding an unescaped '/', '?' or '@' is split by any parser into parts that
    look like a host, a path or a query."""
    names: set[str] = set()
    for segment in query.split("&"):
        if not segment:
            continue
        if "=" not in segment:
            raise ValueError("has an option without '=' (not shown: it may be a secret)")
        name = unquote_plus(segment.partition("=")[0])
        why = redisopts.unknown(scheme, name)
        if why:
            raise ValueError(why)
        if name in names:
            raise ValueError(f"gives option {name!r} twice")
        names.add(name)
    return parse_qsl(query, keep_blank_values=True)


def _converted(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """The options as redis-py converts a URL's (numbers, yes/no...): ValueError naming a bad one."""
    if not pairs:
        return {}
    found = _parsed("redis://x/?" + urlencode(pairs))
    found.pop("host")
    return found


def _parsed(url: str) -> dict[str, Any]:
    """redis-py's reading of a URL, whose ValueErrors name only the option with a bad value."""
    try:
        parsed: dict[str, Any] = parse_url(url)
        return parsed
    except ValueError as exc:
        raise ValueError(f"has a bad value: {exc}") from None


def _path_db(text: str) -> int:
    if not _DB.fullmatch(text):
        raise ValueError("has a database in its path that is not a number (0, 1, 2...)")
    return int(text)


def _one_db(in_path: int | None, pairs: list[tuple[str, str]]) -> int:
    """The database the URL names, in its path or as `db=` (not both, unless they agree): 0 when neither."""
    given = [value for name, value in pairs if name == "db"]
    if not given:
        return in_path or 0
    if not _DB.fullmatch(given[0]):
        raise ValueError("has a database (db=) that is not a number (0, 1, 2...)")
    in_query = int(given[0])
    if in_path is not None and in_path != in_query:
        raise ValueError(f"names two databases: /{in_path} in its path and db={in_query} in its query")
    return in_query


def _once(name: str, in_userinfo: str | None, in_query: str | None) -> str | None:
    if in_userinfo is not None and in_query is not None:
        raise ValueError(f"gives the {name} twice, before '@' and as {name}= (not shown)")
    return in_query if in_query is not None else in_userinfo


def _check_redis_py_url(url: str) -> None:
    """A redis://, rediss:// or unix:// URL: what redis-py would misread silently or fail on only later."""
    scheme = url.partition("://")[0]
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (read for its ValueError, which would quote what may be a password)
    except ValueError:
        raise ValueError("has a host or port that cannot be read "
                         f"(a port is a number, 1 to {MAX_PORT})") from None
    pairs = _query_pairs(scheme, parts.query)
    in_path = None
    if scheme != "unix" and parts.path not in ("", "/"):  # a unix:// path is the socket's
        in_path = _path_db(unquote(parts.path[1:]))
    _one_db(in_path, pairs)
    given = dict(pairs)
    _once("username", parts.username or None, given.get("username"))
    _once("password", parts.password or None, given.get("password"))
    _parsed(url)


def check(url: Any) -> None:
    """ValueError, saying why, for a URL no client could be made from, or one redis-py would read as
    something else than it says (checked before anything connects)."""
    if not isinstance(url, str) or not url.startswith(SCHEMES):
        raise ValueError("is not a redis://, rediss://, unix:// or redis+sentinel:// URL")
    if url.startswith(SENTINEL_SCHEME):
        parse_sentinel(url)
    else:
        _check_redis_py_url(url)


def client(url: str, **kwargs: Any) -> redis.Redis:
    """A client of the Redis `url` names (for Sentinel: of its current primary); `kwargs` go to every
    connection (decode_responses, timeouts); the URL's options win over them, as with redis-py's URLs.

    No command is sent again by redis-py after a dropped connection (`retry`, unless given): a script whose
    reply was lost may have been applied, and only its caller knows how to find out (runner.Scripts.run,
    the fenced retries of jobpool/workers/watch.py). redis-py's default has changed between releases, so it
    is set here rather than left to the installed version."""
    found: redis.Redis = _client(url, kwargs, redis.Redis, Sentinel, Retry(NoBackoff(), 0))
    return found


def async_client(url: str, **kwargs: Any) -> redis.asyncio.Redis:
    """`client`, on redis.asyncio (jobpool/aio.py): the same URLs, Sentinel included, and no command sent
    again after a dropped connection."""
    import redis.asyncio  # only the asyncio API pays for the import
    from redis.asyncio.retry import Retry as AsyncRetry
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel

    found: redis.asyncio.Redis = _client(url, kwargs, redis.asyncio.Redis, AsyncSentinel,
                                         AsyncRetry(NoBackoff(), 0))
    return found


def _client(url: str, kwargs: dict[str, Any], redis_class: Any, sentinel_class: Any, retry: Any) -> Any:
    """`client`'s making of one, for redis-py's client classes of either kind (blocking or asyncio)."""
    kwargs.setdefault("retry", retry)
    if _DRIVER_INFO is not None:
        kwargs.setdefault("driver_info", _DRIVER_INFO)
    if not url.startswith(SENTINEL_SCHEME):
        return redis_class.from_url(url, **kwargs)
    parsed = parse_sentinel(url)
    sentinel = sentinel_class(list(parsed.sentinels),
                              sentinel_kwargs={"socket_timeout": SENTINEL_TIMEOUT_SECS,
                                               "socket_connect_timeout": SENTINEL_TIMEOUT_SECS,
                                               **parsed.sentinel_options})
    return sentinel.master_for(parsed.service, redis_class=redis_class,
                               **{**kwargs, **parsed.options, "db": parsed.db, "username": parsed.username,
                                  "password": parsed.password})


#: How jobpool's own clients talk: replies decoded as text (a log tail that is not UTF-8 is replaced).
_OWN_OPTIONS: dict[str, Any] = {"decode_responses": True, "encoding_errors": "replace",
                                "socket_connect_timeout": 5, "health_check_interval": 30}


def connect_async(url: str) -> redis.asyncio.Redis:
    """`connect`, on redis.asyncio."""
    return async_client(url, **_OWN_OPTIONS)


def connect(url: str) -> redis.Redis:
    """A client for jobpool's own keys: replies decoded as text (a log tail that is not UTF-8 is replaced)."""
    return client(url, **_OWN_OPTIONS)


def safe(url: Any) -> str:
    """The URL fit to print, whatever it holds (a malformed one too): every credential hidden, the rest as
    written. Hidden are what comes before '@' (user name and password), the value of every query option
    whose name says password (`password`, `sentinel_password`, `ssl_password`, in any case or spelling of
    the name's letters as percent-escapes), a user name when a password is given too, the value of any
    option redis-py does not take (a misspelt `pasword=` is still a password), an option without '=', and a
    fragment. Every printer of a Redis URL (status, the dashboard, error messages) shows it through here."""
    if not isinstance(url, str):
        return "<not a URL>"
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "<not a URL>"
    at = _userinfo_end(rest)
    userinfo, rest = (rest[:at], rest[at + 1:]) if at >= 0 else ("", rest)
    rest, hash_, fragment = rest.partition("#")
    head, question, query = rest.partition("?")
    shown = f"{scheme}://" + (f"{HIDDEN}@" if at >= 0 else "") + head
    if question:
        shown += "?" + _safe_query(scheme, query, paired=at >= 0 and ":" in userinfo)
    return shown + (f"#{HIDDEN}" if hash_ and fragment else hash_)


def _userinfo_end(rest: str) -> int:
    """Where the credentials end (their '@'), or -1. A password may hold '?' or '#' (unescaped, then misread
    by any URL parser): an '@' before the query's first '&' is taken as theirs, so that more is hidden,
    never less."""
    end = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, end)
    if at < 0 and "@" in rest[end:]:
        stop = rest.find("&", end)
        at = rest.rfind("@", 0, stop if stop >= 0 else len(rest))
    return at


def _safe_query(scheme: str, query: str, paired: bool) -> str:
    known = redisopts.BY_SCHEME.get(scheme, frozenset())
    segments = query.split("&")
    names = [unquote_plus(s.partition("=")[0]) for s in segments]
    paired = paired or any(redisopts.is_credential(n) for n in names)
    out: list[str] = []
    for segment, name in zip(segments, names, strict=True):
        raw_name, eq, value = segment.partition("=")
        if not segment:
            out.append(segment)
        elif not eq:
            out.append(HIDDEN)
        elif (name not in known or redisopts.is_credential(name)
              or (paired and redisopts.is_username(name))) and value:
            out.append(f"{raw_name}={HIDDEN}")
        else:
            out.append(segment)
    return "&".join(out)


def is_sentinel(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEME)
