"""`same_daemon`, the one comparison behind every "may this daemon's listing speak for that attempt"."""

from __future__ import annotations

import pytest

from jobpool.fleet.daemonid import (
    IdentityUnavailable,
    effective_docker_host,
    establish,
    is_identity,
    same_daemon,
)

OURS = "jpd1:aaaa@boot-1"


@pytest.mark.parametrize(("recorded", "ours", "same", "named"), [
    pytest.param(OURS, OURS, True, "", id="same daemon, same boot"),
    pytest.param("jpd1:bbbb@boot-1", OURS, False, "recorded on daemon jpd1:bbbb@boot-1", id="other daemon"),
    pytest.param("jpd1:aaaa@boot-0", OURS, False, "recorded on daemon jpd1:aaaa@boot-0",
                 id="same data root, other kernel (a cloned VM, or before a reboot)"),
    pytest.param("LVIU:3F7J:AAAA", OURS, False, "docker ID LVIU:3F7J:AAAA", id="recorded before identities"),
    pytest.param("", OURS, False, "no daemon identity recorded", id="nothing recorded"),
    pytest.param(OURS, "", False, "could not establish", id="ours unknown"),
    pytest.param("", "", False, "could not establish", id="both unknown"),
])
def test_only_two_equal_identities_are_the_same_daemon(recorded: str, ours: str, same: bool,
                                                       named: str) -> None:
    ok, why = same_daemon(recorded, ours)
    assert ok is same
    if same:
        assert why == ""
    else:
        assert named in why and (ours in why if ours else True)


def test_a_docker_id_is_not_an_identity() -> None:
    assert is_identity(OURS)
    assert not is_identity("LVIU:3F7J:AAAA") and not is_identity("jpd1:no-boot") and not is_identity("")


def test_the_daemon_address_follows_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert effective_docker_host(None) == "unix:///var/run/docker.sock"
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.1:2375")
    assert effective_docker_host(None) == "tcp://10.0.0.1:2375"
    assert effective_docker_host("unix:///x.sock") == "unix:///x.sock"


@pytest.mark.parametrize("host", ["tcp://127.0.0.1:2375", "ssh://user@host", "http://127.0.0.1:2375"])
def test_a_daemon_off_the_local_socket_has_no_identity(host: str) -> None:
    """Its kernel boot id cannot be read from here: nothing is claimed, every probe of it is unknown."""
    with pytest.raises(IdentityUnavailable, match="not on a local unix socket"):
        establish(object(), host)  # refused before the daemon is asked anything
