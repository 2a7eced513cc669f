"""What a Docker daemon's refusal of a create or a start means for the attempt (jobpool/workers/executors/
docker.py asks): a refusal of the job's spec fails the job at once (`LaunchError`), the daemon's own fault
leaves the launch unknown (`LaunchUnknown`: the slot stays and the sweep decides). The daemon answers some
refusals of a spec with the same 5xx as its own faults, so the words of its error are read for the spec's
own values (`names_the_spec`).
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

import docker.errors

from .base import LaunchError, LaunchUnknown


def words_of(exc: docker.errors.APIError) -> str:
    return str(exc.explanation or exc)


def names_the_spec(words: str, spec: Any) -> bool:
    """Whether the daemon's error names a value of the job's own spec (its image, command, working
    directory, user, network, a mount's path): then it refuses the spec, not its own work. The daemon
    answers some refusals of a spec with a 5xx (a working directory that is a file: "Cannot mkdir: /bin/sh is
    not a directory"; an unknown user at start), the same status as its own faults ("database not open")."""
    values = [spec.image, spec.workdir, spec.user, spec.network, *(spec.command[:1] or [])]
    for m in spec.mounts:
        values += m.split(":")[:2]
    # Whole values only: `sh` (a command) is not read in "shim", nor `/run` (a mount) in "/run/containerd".
    return any(re.search(rf"(?<![\w./-]){re.escape(v)}(?![\w/-])", words) for v in values
               if v and len(v) > 1 and v not in ("none", "bridge", "host"))


def create_refused(exc: docker.errors.APIError, spec: Any) -> Exception:
    """What a create the daemon answered with an error means for the attempt."""
    if exc.status_code == HTTPStatus.CONFLICT:
        # The name is taken: a container of this very attempt exists already (launched before a Redis
        # rollback, or by a duplicate delivery). It may be running: not ours to remove or to fail.
        return LaunchUnknown(f"a container of this attempt exists already: {words_of(exc)}")
    if exc.is_server_error() and not names_the_spec(words_of(exc), spec):
        # The daemon failed, not the job (one shutting down answers "database not open"), and it may have
        # created the container before failing: unknown, the slot stays, the sweep decides.
        return LaunchUnknown(f"docker daemon error during create: {words_of(exc)}")
    return LaunchError(f"launch_failed: {words_of(exc)}")
