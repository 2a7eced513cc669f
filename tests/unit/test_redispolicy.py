"""The verdict on each `maxmemory-policy` Redis has, and on a CONFIG GET that did not answer
(jobpool/store/redispolicy.py). The processes that act on them are tested in
tests/integration/test_redis_policy.py.
"""

from __future__ import annotations

import pytest
import redis

from jobpool import errors
from jobpool.store.redispolicy import FIX, SETTING, Verdict, from_reply, judge

#: Every policy Redis 6.2 and 7 accept, and what jobpool makes of it.
POLICIES = {
    "noeviction": Verdict.OK,
    "allkeys-lru": Verdict.REFUSE, "allkeys-lfu": Verdict.REFUSE, "allkeys-random": Verdict.REFUSE,
    "volatile-lru": Verdict.WARN, "volatile-lfu": Verdict.WARN, "volatile-random": Verdict.WARN,
    "volatile-ttl": Verdict.WARN,
}


@pytest.mark.parametrize(("policy", "verdict"), POLICIES.items())
def test_each_policy_has_its_verdict_and_a_line_that_names_it(policy: str, verdict: Verdict) -> None:
    check = judge(policy)
    assert (check.policy, check.verdict) == (policy, verdict)
    if verdict is Verdict.OK:
        assert check.message == ""
    else:
        assert "\n" not in check.message and policy in check.message
        assert SETTING in check.message and FIX in check.message
    assert ("job rows" in check.message) is (verdict is Verdict.REFUSE)
    assert ("leases" in check.message) is policy.startswith("volatile-")


def test_an_unknown_policy_is_judged_by_its_family() -> None:
    assert judge("allkeys-someday").verdict is Verdict.REFUSE
    assert judge("volatile-someday").verdict is Verdict.WARN
    assert judge("something-else").verdict is Verdict.WARN


@pytest.mark.parametrize("reply", [
    redis.exceptions.NoPermissionError("this user has no permissions to run the 'config|get' command"),
    redis.ResponseError("unknown command 'CONFIG', with args beginning with: 'GET'"),
    {},
])
def test_a_policy_redis_will_not_tell_is_unchecked_not_refused(reply: object) -> None:
    check = from_reply(reply)
    assert (check.policy, check.verdict) == (None, Verdict.UNCHECKED)
    assert "could not be checked" in check.message and SETTING in check.message


def test_bytes_and_text_replies_read_alike() -> None:
    assert from_reply({SETTING.encode(): b"allkeys-lru"}) == from_reply({SETTING: "allkeys-lru"})


def test_an_unreachable_redis_is_redis_unavailable() -> None:
    with pytest.raises(errors.RedisUnavailable):
        from_reply(redis.ConnectionError("Connection refused"))
