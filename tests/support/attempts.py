"""Claiming a promoted job as a worker boot would, with no process behind it: the one claim helper of the
unit and the integration tests."""

from __future__ import annotations

from jobpool.api import Pool
from jobpool.workers.attempt import Attempt
from tests.support.servers import daemon_identity


def claim(pool: Pool, job_id: str, boot: str = "boot-a", docker_host: str | None = None) -> Attempt:
    """Claim the current attempt of a promoted job as `boot`.

    With `docker_host` (integration tests pass their test daemon's), the claim records the docker executor and
    that daemon's identity, as a worker on it records them before it launches anything: the supervisor then
    judges the row by what that daemon says. Without, nothing is recorded (the unit tests' fakeredis rows).
    """
    attempt = Attempt(pool.store, job_id, boot, pool.get(job_id).attempt)
    if docker_host:
        attempt.claim("docker", daemon_identity(docker_host))
    else:
        attempt.claim()
    return attempt
