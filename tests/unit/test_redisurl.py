"""JOBPOOL_REDIS_URL's schemes (jobpool/store/redisurl.py): redis-py's own, and redis+sentinel:// parsed here,
with one clear refusal for a malformed URL and its password never shown."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from redis.backoff import NoBackoff
from redis.connection import AbstractConnection
from redis.retry import Retry
from redis.sentinel import SentinelConnectionPool

from jobpool import ConfigError, Settings
from jobpool.config import STATE_FILE
from jobpool.status import safe_url
from jobpool.store import redisopts
from jobpool.store.redisurl import SentinelURL, check, client, parse_sentinel, safe
from jobpool.up.state import refusal


@pytest.mark.parametrize(("url", "parsed"), [
    ("redis+sentinel://127.0.0.1:26379/jp", SentinelURL((("127.0.0.1", 26379),), "jp")),
    ("redis+sentinel://a:1,b:2,c:3/svc/4", SentinelURL((("a", 1), ("b", 2), ("c", 3)), "svc", 4)),
    ("redis+sentinel://:p%40ss@a:1/svc", SentinelURL((("a", 1),), "svc", 0, "p@ss")),
    ("redis+sentinel://[::1]:26379/svc", SentinelURL((("::1", 26379),), "svc")),
])
def test_sentinel_urls_are_parsed(url: str, parsed: SentinelURL) -> None:
    assert parse_sentinel(url) == parsed
    check(url)


@pytest.mark.parametrize("url", [
    "redis+sentinel://a:1", "redis+sentinel://a:1/", "redis+sentinel://a/svc", "redis+sentinel://a:0/svc",
    "redis+sentinel://a:1,/svc", "redis+sentinel://a:99999/svc", "redis+sentinel://a:1/svc/x",
    "redis+sentinel://a:1/svc/1/2", "redis+sentinel://user@a:1/svc", "redis+sentinel://a:1/svc?x=1",
    "redis+sentinel:///svc", "sentinel://a:1/svc", "redis://a:notaport/0", "", "http://a/",
])
def test_malformed_urls_are_refused_by_name_in_one_line(url: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message is checked through Settings below
        check(url)
    with pytest.raises(ConfigError) as refused:
        Settings(redis_url=url)
    message = str(refused.value)
    assert message.startswith("JOBPOOL_REDIS_URL: ") and "\n" not in message


def test_a_password_is_never_shown() -> None:
    for url in ("redis+sentinel://:hunter2secret@a:1,b:2/svc", "redis://u:hunter2secret@h:1/0",
                "redis://:hunter2secret@h:1/0", "rediss://:hunter2secret@h:1/0"):
        assert "hunter2secret" not in safe(url) and "hunter2secret" not in safe_url(url)
        assert "***@" in safe(url)
    with pytest.raises(ConfigError) as refused:
        Settings(redis_url="redis+sentinel://:hunter2secret@a:1/svc/notadb")
    assert "hunter2secret" not in str(refused.value)
    assert safe("redis://h:1/0") == "redis://h:1/0"
    assert safe("redis+sentinel://a:1,b:2/svc") == "redis+sentinel://a:1,b:2/svc"


def test_wait_settings_are_bounded() -> None:
    assert Settings(redis_wait_replicas=2, redis_wait_timeout_secs=0.5).redis_wait_replicas == 2
    bads: list[dict[str, Any]] = [{"redis_wait_replicas": 17}, {"redis_wait_replicas": -1},
                                  {"redis_wait_timeout_secs": 0}]
    for bad in bads:
        with pytest.raises(ConfigError):
            Settings(**bad)


def made(redis_client: redis.Redis) -> AbstractConnection:
    """A connection of `redis_client`'s pool, made and not connected."""
    return cast(AbstractConnection, redis_client.connection_pool.make_connection())


def sentinels_of(redis_client: redis.Redis) -> list[redis.Redis]:
    pool = cast(SentinelConnectionPool, redis_client.connection_pool)
    found: list[redis.Redis] = pool.sentinel_manager.sentinels
    return found


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "redis+sentinel://127.0.0.1:1/mymaster/0"])
def test_no_command_is_sent_again_by_redis_py(url: str) -> None:
    """A lost reply may have been applied: jobpool's clients are made without redis-py's retries, whatever
    the installed redis-py's default is (its connections are made, not connected)."""
    assert made(client(url)).retry._retries == 0
    assert made(client(url, retry=Retry(NoBackoff(), 2))).retry._retries == 2


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "redis+sentinel://127.0.0.1:1/mymaster/0"])
def test_connections_share_the_client_info_made_once(url: str) -> None:
    """redis-py 8 builds its name and version for CLIENT SETINFO per connection, reading the installed
    packages' metadata each time; jobpool's clients pass the one made at import (redis-py's own values)."""
    pytest.importorskip("redis.driver_info")
    first, second = (made(client(url)) for _ in range(2))
    assert first.driver_info is second.driver_info
    assert first.driver_info is not None
    assert first.driver_info.lib_version == metadata.version("redis")
    assert first.driver_info.formatted_name == "redis-py"


SECRET = "Hunter2-secret"

#: Every form a credential takes in a URL jobpool accepts, with what must stay readable beside it.
CREDENTIAL_FORMS = [
    (f"redis://alice:{SECRET}@h:7/3", ["redis://", "h:7/3"]),
    (f"redis://:{SECRET}@h:7/3", ["h:7/3"]),
    (f"rediss://:{SECRET}@h:7/3?ssl_cert_reqs=none", ["rediss://", "h:7/3", "ssl_cert_reqs=none"]),
    (f"redis://h:7/3?password={SECRET}&socket_timeout=4", ["h:7/3", "socket_timeout=4", "password="]),
    (f"redis://h:7/3?username=alice&password={SECRET}", ["h:7/3", "username=", "password="]),
    (f"unix:///run/r.sock?password={SECRET}&db=2", ["unix:///run/r.sock", "db=2"]),
    (f"unix://alice:{SECRET}@/run/r.sock?db=2", ["/run/r.sock", "db=2"]),
    (f"redis+sentinel://:{SECRET}@a:1,b:2/svc/4", ["redis+sentinel://", "a:1,b:2/svc/4"]),
    (f"redis+sentinel://alice:{SECRET}@a:1/svc?sentinel_password={SECRET}&socket_timeout=2",
     ["a:1/svc", "sentinel_password=", "socket_timeout=2"]),
    (f"redis+sentinel://a:1/svc?sentinel_username=sam&sentinel_password={SECRET}", ["a:1/svc"]),
    (f"rediss://h:7/0?ssl_password={SECRET}", ["h:7/0", "ssl_password="]),
]

#: Credentials that no client reads (refused by `check`) but that must not be shown by the refusal either.
REFUSED_CREDENTIAL_FORMS = [
    f"redis://h:7/3?password={SECRET}&password={SECRET}",  # repeated
    f"redis://h:7/3?pass%77ord={SECRET}&password=other",  # a percent-encoded key, then repeated
    f"redis://h:7/3?Password={SECRET}",  # mixed case: not redis-py's option, still a password
    f"redis://h:7/3?PASSWORD={SECRET}&db=1",
    f"redis://h:7/3?pasword={SECRET}",  # misspelt
    f"unix://alice:{SECRET}@/run/r.sock?password={SECRET}",  # given twice
    f"redis+sentinel://a:1/svc?Sentinel_Password={SECRET}",
    f"redis+sentinel://a:1/svc?sentinel_password={SECRET}&sentinel_password={SECRET}",
    f"redis://h:7/3?{SECRET}",  # an option without '='
    f"redis://:{SECRET}/x@h:7/3",  # unescaped '/' in the password
    f"redis://:{SECRET[:5]}?{SECRET[5:]}@h:7/3",  # unescaped '?'
    f"redis://:{SECRET[:5]}#{SECRET[5:]}@h:7/3",  # unescaped '#'
    f"redis+sentinel://:{SECRET}/x@a:1/svc",
    f"redis://alice:{SECRET}@h:notaport/0",
    f"redis://:{SECRET}@h:7/abc",
]


@pytest.mark.parametrize(("url", "readable"), CREDENTIAL_FORMS)
def test_every_credential_form_is_hidden_and_the_rest_stays_readable(url: str, readable: list[str]) -> None:
    check(url)  # a URL redis-py (or jobpool's Sentinel form) takes
    for shown in (safe(url), safe_url(url)):
        assert SECRET not in shown and "***" in shown
        for part in readable:
            assert part in shown, (part, shown)


@pytest.mark.parametrize("url", REFUSED_CREDENTIAL_FORMS)
def test_a_refused_url_is_named_without_its_credentials(url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings(redis_url=url)
    message = str(refused.value)
    assert SECRET not in message and SECRET[:5] not in message and SECRET[5:] not in message, message
    assert message.startswith("JOBPOOL_REDIS_URL: ") and "\n" not in message
    assert url.partition("://")[0] + "://" in message and "***" in message


def test_a_user_name_is_hidden_only_beside_a_password() -> None:
    assert safe("redis://h/0?username=alice&client_name=w1") == "redis://h/0?username=alice&client_name=w1"
    assert safe(f"redis://h/0?username=alice&password={SECRET}") == "redis://h/0?username=***&password=***"
    assert safe(f"redis://h/0?username=alice&pass%77ord={SECRET}") == "redis://h/0?username=***&pass%77ord=***"


@pytest.mark.parametrize(("url", "said"), [
    ("redis://h:7/abc", "database in its path"),  # redis-py: database 0
    ("redis://h:7/1/5", "database in its path"),  # redis-py: database 15
    ("redis://h:7/-1", "database in its path"),
    ("redis://h:7/ 1", "database in its path"),  # redis-py: database 1
    ("redis://h:7/%201", "database in its path"),
    ("redis://h:7/0/", "database in its path"),
    ("redis://h:7/0?db=abc", "database (db=)"),
    ("redis://h:7/0?db=-2", "database (db=)"),
    ("unix:///run/r.sock?db=%201", "database (db=)"),
    ("redis://h:7/1?db=2", "names two databases"),  # redis-py: database 2
    ("redis+sentinel://a:1/svc/x", "database in its path"),
    ("redis+sentinel://a:1/svc/1?db=2", "names two databases"),
    ("redis+sentinel://a:1/svc?db=x", "database (db=)"),
])
def test_a_bad_database_is_one_clear_refusal(url: str, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings(redis_url=f"{url}{'&' if '?' in url else '?'}password={SECRET}")
    message = str(refused.value)
    assert said in message and SECRET not in message and "\n" not in message, message


@pytest.mark.parametrize(("url", "db"), [
    ("redis://h:7", 0), ("redis://h:7/", 0), ("redis://h:7/12", 12), ("redis://h:7/3?db=3", 3),
    ("redis://h:7?db=5", 5), ("unix:///run/r.sock?db=4", 4), ("redis+sentinel://a:1/svc?db=6", 6),
])
def test_a_database_said_once_is_the_one_used(url: str, db: int) -> None:
    Settings(redis_url=url)
    assert made(client(url)).db == db


@pytest.mark.parametrize(("url", "said"), [
    ("redis://h:7/0?socket_timout=5", "unknown option 'socket_timout' (did you mean 'socket_timeout'?)"),
    ("redis://h:7/0?Socket_Timeout=5", "unknown option 'Socket_Timeout'"),
    ("unix:///run/r.sock?socket_keepalive=yes", "unknown option 'socket_keepalive'"),  # TCP only
    ("redis://h:7/0?ssl_ca_certs=/ca.pem", "unknown option 'ssl_ca_certs'"),  # rediss:// only
    ("redis://h:7/0?single_connection_client=yes", "unknown option"),
    ("redis://h:7/0?retry=3", "unknown option 'retry'"),  # an object, not text
    ("redis://h:7/0?decode_responses=no", "jobpool sets itself"),
    ("redis://h:7/0?encoding=latin-1", "jobpool sets itself"),
    ("redis://h:7/0?host=other", "belongs in the URL itself"),
    ("redis://h:7/0?socket_timeout=soon", "bad value"),
    ("redis://h:7/0?socket_timeout=1&socket_timeout=2", "gives option 'socket_timeout' twice"),
    ("redis+sentinel://a:1/svc?socket_timout=1", "unknown option 'socket_timout'"),
    ("redis+sentinel://a:1/svc?sentinel_socket_timout=1", "unknown option 'sentinel_socket_timout'"),
    ("redis+sentinel://a:1/svc?sentinel_socket_timeout=x", "bad value"),
    ("redis+sentinel://a:1/svc?sentinel_decode_responses=yes", "jobpool sets itself"),
])
def test_an_option_redis_py_does_not_take_is_refused_at_start(url: str, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings(redis_url=url)
    assert said in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


@pytest.mark.parametrize("url", [
    "redis://h:7/0?socket_timeout=2.5&socket_connect_timeout=1&health_check_interval=10&client_name=w",
    "redis://h:7/0?socket_keepalive=yes&max_connections=20&retry_on_timeout=no&protocol=2&username=u",
    "rediss://h:7/0?ssl_cert_reqs=none&ssl_ca_certs=/ca.pem&ssl_check_hostname=no",
    "unix:///run/r.sock?db=1&socket_timeout=3",
    "redis+sentinel://a:1/svc?socket_timeout=3&sentinel_socket_timeout=0.5&sentinel_password=p",
])
def test_options_redis_py_takes_are_accepted_and_reach_its_connections(url: str) -> None:
    Settings(redis_url=url)
    connection = made(client(url))  # made, not connected: redis-py takes every option
    if "socket_timeout=" in url.partition("sentinel_")[0]:
        assert connection.socket_timeout == float(url.partition("socket_timeout=")[2].partition("&")[0])


def test_a_misspelt_option_is_what_redis_py_fails_on_only_at_the_first_connection() -> None:
    """Why the names are checked at start: redis-py takes the URL and fails when a connection is made."""
    pool = redis.ConnectionPool.from_url("redis://h:7/0?socket_timout=5")
    with pytest.raises(TypeError):
        pool.make_connection()


def test_the_options_are_read_from_redis_py_signatures() -> None:
    """A parameter a later redis-py adds to its connections is taken with no list to update here; one that
    cannot come from text (an object) is not."""
    class NewerConnection(redis.connection.Connection):
        def __init__(self, tcp_user_timeout: float | None = None, tracer: object = None,
                     **kwargs: object) -> None:
            super().__init__(**kwargs)  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in redis-py 8.1

    names = redisopts._options(redis.ConnectionPool, NewerConnection)
    assert "tcp_user_timeout" in names and "tracer" not in names
    by_scheme = redisopts.BY_SCHEME
    assert by_scheme["redis"] == redisopts._options(redis.ConnectionPool, redis.connection.Connection)
    assert {"socket_timeout", "password", "username", "db", "client_name"} <= by_scheme["redis"]
    assert "ssl_ca_certs" in by_scheme["rediss"] and "ssl_ca_certs" not in by_scheme["redis"]
    assert {"sentinel_password", "sentinel_username"} <= by_scheme["redis+sentinel"]


def test_sentinel_options_go_to_the_sentinels_and_the_others_to_the_data_nodes() -> None:
    url = f"redis+sentinel://alice:{SECRET}@a:1/svc/2?socket_timeout=3&sentinel_password=s-pw"
    made = client(url)
    sentinel = sentinels_of(made)[0].connection_pool.connection_kwargs
    assert sentinel["password"] == "s-pw" and sentinel["socket_timeout"] == 2.0  # jobpool's default
    data = made.connection_pool.connection_kwargs
    assert (data["username"], data["password"], data["db"]) == ("alice", SECRET, 2)
    assert data["socket_timeout"] == 3.0
    quick = client("redis+sentinel://a:1/svc?sentinel_socket_timeout=0.5")
    assert sentinels_of(quick)[0].connection_pool.connection_kwargs[
        "socket_timeout"] == 0.5


def test_the_refusal_of_a_second_up_hides_the_password_in_the_state_file(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text(json.dumps({"redis_url": f"unix:///r.sock?password={SECRET}"}))
    line = refusal(tmp_path, [])
    assert SECRET not in line and "unix:///r.sock?password=***" in line
