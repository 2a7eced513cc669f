"""JOBPOOL_DASHBOARD_TOKEN is refused when it is easy to guess, not only when it is short (config.py's
`_check_token`): words, repeats and sequences count for what they are. The message names the variable and
never the value."""

from __future__ import annotations

import secrets

import pytest

from jobpool import ConfigError, Settings
from jobpool.config import MIN_TOKEN_BITS, token_bits

WEAK = [
    "correct horse battery",  # three common words: long enough, still guessable
    "correcthorsebattery1",
    "t" * 20,
    "12345678901234567890",
    "passwordpassword1234",
    "qwertyuiopasdfghjkl;",
    "Password!2024-Password!2024",
]
STRONG = [
    secrets.token_hex(24),  # what the README says to use: `openssl rand -hex 24`
    secrets.token_urlsafe(32),
    "9f2c41d7e08b5a63c1f7d29e4ab08c35",
    "dashboard-token-for-tests-0123456789",  # tests/integration/test_dashboard.py's
    "browser-test-token-0123456789abcdef",  # tests/integration/test_dashboard_browser.py's
    secrets.token_hex(200),  # longer than the estimate reads
]


@pytest.mark.parametrize("token", WEAK)
def test_a_guessable_token_is_refused_without_being_shown(token: str) -> None:
    with pytest.raises(ConfigError, match=r"JOBPOOL_DASHBOARD_TOKEN: too easy to guess") as caught:
        Settings.from_env({"JOBPOOL_DASHBOARD_TOKEN": token})
    assert token not in str(caught.value)
    assert token_bits(token) < MIN_TOKEN_BITS


# Ids that do not change from one collection to the next: pytest-xdist's workers must collect the same tests.
STRONG_IDS = ["token_hex(24)", "token_urlsafe(32)", "hex-32", "test_dashboard", "test_dashboard_browser",
              "token_hex(200)"]


@pytest.mark.parametrize("token", STRONG, ids=STRONG_IDS)
def test_a_random_token_is_taken(token: str) -> None:
    assert Settings.from_env({"JOBPOOL_DASHBOARD_TOKEN": token}).dashboard_token == token


@pytest.mark.parametrize("token", ["short-one", " " + secrets.token_hex(24), secrets.token_hex(12) + "\n"],
                         ids=["short", "leading-space", "trailing-newline"])
def test_a_short_or_malformed_token_is_still_refused(token: str) -> None:
    with pytest.raises(ConfigError, match="JOBPOOL_DASHBOARD_TOKEN") as caught:
        Settings.from_env({"JOBPOOL_DASHBOARD_TOKEN": token})
    assert token.strip() not in str(caught.value)


def test_no_token_means_read_only() -> None:
    assert Settings.from_env({}).dashboard_token == ""
