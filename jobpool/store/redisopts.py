"""Which query options a Redis URL may carry: those redis-py takes, read from its own signatures.

redis-py turns every `?name=value` of a URL into a keyword argument of the connection pool, which passes what
it does not take itself to each connection it makes. A misspelt name (`socket_timout`) is only refused there,
as a TypeError at the first connection, so jobpool checks the names when it reads its settings
(jobpool/store/redisurl.py). The names are read here, at import, from the `__init__` parameters of the classes
the URL's scheme leads to (following `**kwargs` up to the base classes they are passed on to), so a redis-py
upgrade that adds or drops an option is followed without a list to keep.

A URL gives every value as text. redis-py converts the options in `URL_QUERY_ARGUMENT_PARSERS` and passes the
others on as the text they are, so only options whose parameter takes text (its default is text or None, and
its annotation, if any, admits nothing but plain values) are offered: `decode_responses=no` would otherwise
arrive as the true string "no".
"""

from __future__ import annotations

import inspect
import re
import typing
from typing import Any

import redis
from redis.connection import (
    URL_QUERY_ARGUMENT_PARSERS,
    Connection,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.sentinel import SentinelManagedConnection

#: Said by the URL itself (its host, port or socket path), never as an option.
_IN_THE_URL = frozenset({"host", "port", "path", "unix_socket_path"})
#: Set by jobpool for its own reading of replies (jobpool/api.py `connect`): a URL may not change them.
SET_BY_JOBPOOL = frozenset({"encoding", "encoding_errors", "decode_responses"})
#: A query option whose name starts so goes to the sentinels (redis+sentinel://), not to the data nodes.
SENTINEL_PREFIX = "sentinel_"

_PLAIN_TYPES = (str, int, float, bool, type(None))
_PLAIN_NAMES = frozenset({"str", "int", "float", "bool", "None", "NoneType", "Optional", "Union"})
_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The keyword parameters `cls(...)` takes: its `__init__`'s, and while that takes `**kwargs`, those of
    the base classes up its MRO (redis-py's connection classes pass what they do not take to their base)."""
    found: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters
        for name, param in list(params.items())[1:]:  # past `self`
            if param.kind in _KEYWORD_KINDS:
                found.setdefault(name, param)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            break
    return found


def _plain_annotation(annotation: Any) -> bool:
    if annotation is inspect.Parameter.empty:
        return True
    if isinstance(annotation, str):  # a postponed annotation: its words
        return set(re.findall(r"[A-Za-z_]\w*", annotation)) <= _PLAIN_NAMES
    return all(arg in _PLAIN_TYPES for arg in (typing.get_args(annotation) or (annotation,)))


def _from_text(param: inspect.Parameter) -> bool:
    """Whether a URL can give this parameter a value: redis-py converts it, or it takes text as it is."""
    if param.name in URL_QUERY_ARGUMENT_PARSERS:
        return True
    return (param.default is None or isinstance(param.default, str)) and _plain_annotation(param.annotation)


def _options(*classes: type) -> frozenset[str]:
    names = set()
    for cls in classes:
        names |= {name for name, param in _parameters(cls).items() if _from_text(param)}
    return frozenset(names - _IN_THE_URL - SET_BY_JOBPOOL)


#: scheme -> the options its connections take: the pool's own and its connection class's.
BY_SCHEME: dict[str, frozenset[str]] = {
    "redis": _options(ConnectionPool, Connection),
    "rediss": _options(ConnectionPool, SSLConnection),
    "unix": _options(ConnectionPool, UnixDomainSocketConnection),
    # The data nodes: `Sentinel.master_for` makes a SentinelConnectionPool (a ConnectionPool) of
    # SentinelManagedConnections; each sentinel is asked through a `redis.Redis(host, port, **options)`.
    "redis+sentinel": _options(ConnectionPool, SentinelManagedConnection)
    | {SENTINEL_PREFIX + name for name in _options(redis.Redis)},
}


def unknown(scheme: str, name: str) -> str | None:
    """None when the URL of `scheme` may carry option `name`; else why not, in a few words."""
    if name in BY_SCHEME[scheme]:
        return None
    if name in SET_BY_JOBPOOL or name.removeprefix(SENTINEL_PREFIX) in SET_BY_JOBPOOL:
        return f"sets option {name!r}, which jobpool sets itself"
    if name in _IN_THE_URL:
        return f"gives {name!r} as an option: it belongs in the URL itself"
    close = _close_match(name, BY_SCHEME[scheme])
    return f"has an unknown option {name!r}" + (f" (did you mean {close!r}?)" if close else "")


def _close_match(name: str, names: frozenset[str]) -> str | None:
    import difflib

    found = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.8)
    return found[0] if found else None


def is_credential(name: str) -> bool:
    """Whether an option's value is a secret (password, sentinel_password, ssl_password...)."""
    return "password" in name.lower()


def is_username(name: str) -> bool:
    return "username" in name.lower()
