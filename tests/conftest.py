"""Shared fixtures: a real redis-server and a real dockerd, private to this test run.

Integration tests need the real servers, never stand-ins. On a developer's machine without them the
tests that need them are skipped with the reason; under CI (env CI set) a missing or broken server fails
loudly instead, because a green run that skipped the integration layer proves nothing.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import docker.transport.unixconn
import pytest
import redis
from hypothesis import settings

from tests.support.constants import IN_CI
from tests.support.servers import DockerDaemon, RedisServer, redis_server_binary

REDIS_FIXTURES = {"redis_server", "redis_url", "redis_server_factory"}
#: The modules that run jobpool's own image (tests/support/images.py): the run takes them last, and makes
#: the image's slow cached parts (debootstrap, the wheelhouse) in the background from its start.
IMAGE_MODULES = ("test_compose_fleet.py", "test_swarm_stack.py")
_WARMING = pytest.StashKey[subprocess.Popen[bytes]]()


def _connect_closing_on_error(self: docker.transport.unixconn.UnixHTTPConnection) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(self.timeout)
        sock.connect(self.unix_socket)
    except BaseException:
        sock.close()
        raise
    self.sock = sock


# docker 7.1.0 leaks the socket when connecting to a stopped daemon fails (docker/docker-py PR #3356, open).
# Under filterwarnings=error the ResourceWarning fails whichever test the garbage collector happens to run
# in, and "daemon unreachable" is a case we test on purpose, so the test process carries that PR's fix.
docker.transport.unixconn.UnixHTTPConnection.connect = _connect_closing_on_error


# The hypothesis tests (the state machine in tests/unit/test_state_machine.py; the spec's canonical JSON in
# tests/unit/test_spec_json.py) take their sizes from the profile. The state machine's length: a quick pass
# on a developer's machine (about 1,000 steps per backend, seconds); under CI 100 examples of up to 60 steps,
# about 5,800 steps per backend, above MACHINE_STEPS_CI (tests/support/constants.py).
# The CI profile extends hypothesis' own (derandomized, so a CI run is reproducible; no example database).
settings.register_profile("dev", max_examples=40, stateful_step_count=30)
settings.register_profile("ci", settings.get_profile("ci"), max_examples=100, stateful_step_count=60)
settings.load_profile("ci" if IN_CI else "dev")


def _unavailable(reason: str) -> None:
    """Skip on a developer's machine; fail under CI, where every service must be there."""
    if IN_CI:
        pytest.fail(f"{reason} (CI is set, so this fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


def _needs_image(item: pytest.Item) -> bool:
    return item.path.name in IMAGE_MODULES


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that need jobpool's image go last (a stable sort), so the background build of its cached
    parts (`pytest_collection_finish`) runs beside every other test. Without redis-server: skip the tests
    that need it, except under CI, where its fixtures fail them."""
    items.sort(key=_needs_image)
    if redis_server_binary() or IN_CI:
        return
    skip = pytest.mark.skip(reason="redis-server is not on PATH (apt-get install redis-server)")
    for item in items:
        if REDIS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    """On a machine that has never made the image's base (debootstrap takes minutes), start making it in a
    child process now, while the other tests run; the image tests wait on its file locks and take the result
    (or, if the child failed, make it themselves and fail with the real error)."""
    from tests.support import images  # imports docker; only a session that collects tests pays for it

    if not any(_needs_image(item) for item in session.items) or images.cache_is_warm():
        return
    log = Path(tempfile.gettempdir()) / "jobpool-test-image-cache.log"
    with open(log, "wb") as out:
        child = subprocess.Popen([sys.executable, "-m", "tests.support.images"], cwd=images.ROOT,
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    session.config.stash[_WARMING] = child


def pytest_unconfigure(config: pytest.Config) -> None:
    """A session that ends before the image tests ran (interrupted, -x) lets the child finish its item, so
    no half-made cache entry is left behind (each is made in a temporary directory and renamed)."""
    child = config.stash.get(_WARMING, None)
    if child is not None:
        try:
            child.wait(timeout=900)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _require_redis_server() -> None:
    if not redis_server_binary():
        _unavailable("redis-server is not on PATH (apt-get install redis-server)")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the whole run; `redis_url` empties it before each test."""
    _require_redis_server()
    with RedisServer() as server:
        server.start()
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The URL of an empty database on the shared server (restarted first if a test stopped it)."""
    if not redis_server.running:
        redis_server.start()
    with contextlib.closing(redis.Redis.from_url(redis_server.url)) as client:
        client.flushall()
    return redis_server.url


@pytest.fixture
def redis_server_factory() -> Iterator[Callable[[], RedisServer]]:
    """Makes private, not yet started servers for tests that kill, restart or reconfigure Redis (AOF);
    every server made is closed after the test."""
    _require_redis_server()
    made: list[RedisServer] = []

    def make() -> RedisServer:
        made.append(RedisServer())
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture(scope="session")
def docker_daemon() -> Iterator[DockerDaemon]:
    """One private dockerd for the whole run, with the busybox test image imported."""
    if shutil.which("dockerd") is None:
        _unavailable("dockerd is not on PATH (apt-get install docker.io)")
    daemon = DockerDaemon()
    try:
        daemon.start()
        daemon.import_busybox_image()
    except Exception as exc:  # noqa: BLE001 - any start failure becomes a skip (a failure under CI) with its reason
        daemon.close()
        _unavailable(f"dockerd could not start: {exc}")
    yield daemon
    daemon.close()


@pytest.fixture
def docker_host(docker_daemon: DockerDaemon, monkeypatch: pytest.MonkeyPatch) -> str:
    """DOCKER_HOST of a running daemon holding no containers and no `jobpool*` volumes from earlier tests."""
    docker_daemon.ensure_running()
    docker_daemon.remove_containers()
    docker_daemon.remove_volumes(prefix="jobpool")
    monkeypatch.setenv("DOCKER_HOST", docker_daemon.host)
    return docker_daemon.host
