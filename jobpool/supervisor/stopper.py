"""Stopping and removing what a job left: containers on one Docker daemon, over the same client as the
evidence about them (jobpool/supervisor/probes.py, jobpool/supervisor/daemon.py), and a subprocess job's
cgroup the probes found empty.

Nothing here judges whether a container may be stopped or removed: its callers decide that from the evidence
(the supervisor's verdicts, an operator's cancel, a worker's stray rule or clean-up).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..contract import LABEL_ATTEMPT, LABEL_JOB, LABEL_POOL
from .daemon import DaemonClient
from .probes import Absent, Probe

log = logging.getLogger("jobpool.supervisor")


def remove_empty_cgroups(probes: Iterable[Probe]) -> None:
    """Remove the job cgroups the probes found empty (`Absent.empty_cgroup`): a subprocess job's, whose
    worker died before it could remove it, and which nothing else would. A cgroup a process entered since
    refuses and stays (jobpool/jobcgroup.py `JobCgroup.remove`)."""
    for probe in probes:
        if isinstance(probe, Absent) and probe.empty_cgroup is not None:
            try:
                probe.empty_cgroup.remove()
            except OSError as exc:
                log.warning("the empty cgroup %s was not removed: %s", probe.empty_cgroup.path, exc)


class ContainerStopper:
    """Stops and removes containers on the daemon of `daemon`."""

    def __init__(self, daemon: DaemonClient) -> None:
        self.daemon = daemon

    def stop_by_label(self, pool: str, job_id: str, attempt: int | None, grace_secs: float) -> list[str]:
        """Stop the running containers of a job (of one attempt, if given); returns their ids.

        Raises the SDK's exception when the daemon cannot be asked: a caller must not act as if stopped.
        """
        client = self.daemon.client()
        labels = [f"{LABEL_POOL}={pool}", f"{LABEL_JOB}={job_id}"]
        if attempt is not None:
            labels.append(f"{LABEL_ATTEMPT}={attempt}")
        stopped = []
        try:
            for summary in client.api.containers(all=False, filters={"label": labels}):
                cid = str(summary["Id"])
                client.api.stop(cid, timeout=max(0, round(grace_secs)))  # the SDK adds it to its timeout
                stopped.append(cid)
        except Exception:
            self.daemon.close()
            raise
        return stopped

    def stop(self, container_id: str, grace_secs: float) -> None:
        """Stop one container: its stop signal, then killed after `grace_secs` (Docker's stop). Raises the
        SDK's exception when the daemon cannot be asked."""
        self.daemon.client().api.stop(container_id, timeout=max(0, round(grace_secs)))

    def remove(self, container_id: str) -> bool:
        """Remove a container that is not running: an ended one whose result has been recorded, or a created
        one that must never start. True once it is gone (or was already); False otherwise (a running
        container is never removed)."""
        import docker

        try:
            self.daemon.client().api.remove_container(container_id, v=False, force=False)
            return True
        except docker.errors.NotFound:
            return True
        except Exception:  # noqa: BLE001 - a leftover container is harmless; the next attempt has its own
            return False
