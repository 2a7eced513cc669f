"""Which Docker daemon a container lives on: an identity two daemons share only as copies on one kernel.

"No container labelled for this attempt on the daemon I asked" frees a slot only if the daemon asked is
the very daemon the attempt was launched on. Docker's own ID (`docker info` "ID") cannot tell: Docker 20.10
derives it from `/etc/docker/key.json`, so two daemons that read the same file (several daemons on one
host, VMs cloned from one image) report the same ID. A supervisor that trusted it would read "not on my
daemon" as "gone" while the container runs on the other one, and hand its slot to a second writer.

The identity jobpool records instead is `jpd1:<uuid>@<kernel boot id>`:

- `<uuid>` is made by jobpool and kept **on the daemon**, as the label `jobpool.daemon_uuid` of a volume named
  `jobpool-daemon-identity`. Volumes live in the daemon's data root, so two daemons (each with its own data
  root) have two volumes, however their key files compare. The first process to ask creates it; a racing
  second create of the same name returns the same volume, and everyone reads the label back from the daemon.
- `<kernel boot id>` is the boot id of the kernel the daemon runs on. It separates VMs cloned from one image
  *after* the volume was made (they share the data root's copy, not the kernel), and it changes when the
  host reboots, which is also when every container of the old boot is gone.

Two daemons on one kernel whose data roots are copies (several dockerd on a host, Docker-in-Docker built with
its data, a restored backup) do share the identity. That is checked, not assumed away:
jobpool/fleet/daemonmark.py marks each process's daemon and compares the marks through Redis; once two daemons
are found to share an identity, no claim is made and no row on it is judged until an operator clears the
report (`jobpool forget-collision`), whatever becomes of either side's processes.

The boot id is read from `/proc` of the process that asks, so it is the daemon's only when the daemon is
reached through a local unix socket (the one-host set-up and the compose file's mounted `docker.sock`; a
container sees its host's boot id). For any other DOCKER_HOST (tcp://, ssh://) the identity cannot be
established: workers then refuse to claim (a job is never launched without a recorded identity), and a
supervisor answers "unknown" for every row, which keeps slots. Removing the volume (`docker volume prune`
on Docker < 23) gives the daemon a new identity: rows recorded before are then "unknown" until their worker
or an operator ends them: the safe direction.

`same_daemon` is the one comparison every caller goes through (probes, adoption, cancel of an orphan,
eviction). See docs/architecture.md ("The daemon's identity").
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Any

from ..procid import kernel_boot_id

PREFIX = "jpd1:"
VOLUME = "jobpool-daemon-identity"
LABEL_UUID = "jobpool.daemon_uuid"
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
#: The most characters of an operator's actor or note kept with a declaration about a daemon.
NOTE_MAX_CHARS = 1000


class IdentityUnavailable(Exception):
    """The daemon's identity cannot be established; `str()` says why."""


#: An identity as `establish` makes it, exactly: the prefix, the identity volume's uuid (hex), '@', the
#: host's kernel boot id. What an operator types for one (jobpool/fleet/gone.py) must match it whole.
IDENTITY = re.compile(re.escape(PREFIX) + r"[0-9a-f]{32}@[0-9A-Za-z-]{1,64}")


def is_identity(value: str) -> bool:
    return value.startswith(PREFIX) and "@" in value


def uuid_of(daemon_id: str) -> str:
    """The daemon part of an identity (`jpd1:<uuid>`), the same across its host's reboots."""
    return daemon_id.split("@", 1)[0]


def effective_docker_host(docker_host: str | None) -> str:
    """The daemon address a docker SDK client built from the environment talks to."""
    return docker_host or os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST


def establish(client: Any, docker_host: str | None = None) -> str:
    """The identity of the daemon `client` talks to (at `docker_host`, or DOCKER_HOST / the default socket).

    Raises `IdentityUnavailable` when it cannot be established; an SDK error asking the daemon propagates."""
    host = effective_docker_host(docker_host)
    if not host.startswith("unix://"):
        raise IdentityUnavailable(f"daemon at {host} is not on a local unix socket, so its kernel boot id "
                                  "cannot be read from here")
    daemon_uuid = _volume_uuid(client)
    return f"{PREFIX}{daemon_uuid}@{kernel_boot_id()}"


def _volume_uuid(client: Any) -> str:
    import docker.errors

    api = client.api
    try:
        labels = api.inspect_volume(VOLUME).get("Labels") or {}
    except docker.errors.NotFound:
        # Create is idempotent by name: a racing creator gets the same volume, and both read its label back.
        api.create_volume(VOLUME, labels={LABEL_UUID: uuid.uuid4().hex, "jobpool.role": "daemon-identity"})
        labels = api.inspect_volume(VOLUME).get("Labels") or {}
    value = str(labels.get(LABEL_UUID, ""))
    if not value:
        raise IdentityUnavailable(f"volume {VOLUME} on the daemon has no {LABEL_UUID} label")
    return value


def same_daemon(recorded: str, ours: str) -> tuple[bool, str]:
    """Whether evidence from the daemon identified as `ours` may speak for an attempt recorded on `recorded`.

    Returns (True, "") only for two equal, well-formed identities; otherwise False and a reason naming both.
    A row recorded before jobpool had daemon identities holds Docker's ID (or nothing): that ID is not
    unique, so such a row is never judged absent or exited from a daemon listing; it stays "unknown" until its
    worker finishes it or an operator acts."""
    if not ours:
        return False, ("this process could not establish its docker daemon's identity "
                       f"(recorded {recorded or '?'})")
    if not recorded:
        return False, f"no daemon identity recorded for the attempt (this process is on {ours})"
    if not is_identity(recorded):
        return False, (f"attempt recorded before daemon identities, with docker ID {recorded}, which two "
                       f"daemons can share; cannot prove where it runs (this process is on {ours})")
    if recorded != ours:
        return False, f"attempt recorded on daemon {recorded}, this process is on daemon {ours}"
    return True, ""
