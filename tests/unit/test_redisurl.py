"""JOBPOOL_REDIS_URL's schemes (jobpool/redisurl.py): redis-py's own, and redis+sentinel:// parsed here, with
one clear refusal for a malformed URL and its password never shown."""

from __future__ import annotations

from importlib import metadata

import pytest
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobpool import ConfigError, Settings
from jobpool.redisurl import SentinelURL, check, client, parse_sentinel, safe
from jobpool.status import safe_url


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
    "redis+sentinel://a:1/svc/1/2", "redis+sentinel://user:pw@a:1/svc", "redis+sentinel://a:1/svc?x=1",
    "redis+sentinel:///svc", "sentinel://a:1/svc", "redis://a:notaport/0", "", "http://a/",
])
def test_malformed_urls_are_refused_by_name_in_one_line(url: str) -> None:
    with pytest.raises(ValueError):
        check(url)
    with pytest.raises(ConfigError) as refused:
        Settings(redis_url=url)
    message = str(refused.value)
    assert message.startswith("JOBPOOL_REDIS_URL: ") and "\n" not in message


def test_a_password_is_never_shown() -> None:
    for url in ("redis+sentinel://:hunter2secret@a:1,b:2/svc", "redis://u:hunter2secret@h:1/0",
                "redis://:hunter2secret@h:1/0", "rediss://:hunter2secret@h:1/0"):
        assert "hunter2secret" not in safe(url) and "hunter2secret" not in safe_url(url)
        assert ":***@" in safe(url)
    with pytest.raises(ConfigError) as refused:
        Settings(redis_url="redis+sentinel://:hunter2secret@a:1/svc/notadb")
    assert "hunter2secret" not in str(refused.value)
    assert safe("redis://h:1/0") == "redis://h:1/0"
    assert safe("redis+sentinel://a:1,b:2/svc") == "redis+sentinel://a:1,b:2/svc"


def test_wait_settings_are_bounded() -> None:
    assert Settings(redis_wait_replicas=2, redis_wait_timeout_secs=0.5).redis_wait_replicas == 2
    for bad in ({"redis_wait_replicas": 17}, {"redis_wait_replicas": -1}, {"redis_wait_timeout_secs": 0}):
        with pytest.raises(ConfigError):
            Settings(**bad)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "redis+sentinel://127.0.0.1:1/mymaster/0"])
def test_no_command_is_sent_again_by_redis_py(url: str) -> None:
    """A lost reply may have been applied: jobpool's clients are made without redis-py's retries, whatever
    the installed redis-py's default is (its connections are made, not connected)."""
    assert client(url).connection_pool.make_connection().retry._retries == 0
    given = client(url, retry=Retry(NoBackoff(), 2))
    assert given.connection_pool.make_connection().retry._retries == 2


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "redis+sentinel://127.0.0.1:1/mymaster/0"])
def test_connections_share_the_client_info_made_once(url: str) -> None:
    """redis-py 8 builds its name and version for CLIENT SETINFO per connection, reading the installed
    packages' metadata each time; jobpool's clients pass the one made at import (redis-py's own values)."""
    pytest.importorskip("redis.driver_info")
    first, second = (client(url).connection_pool.make_connection() for _ in range(2))
    assert first.driver_info is second.driver_info
    assert first.driver_info.lib_version == metadata.version("redis")
    assert first.driver_info.formatted_name == "redis-py"
