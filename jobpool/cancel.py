"""What a cancel asked by a person (`jobpool cancel`, the dashboard's cancel) does beyond `Pool.cancel`: a
running job whose worker is gone has nobody to act on the persisted request, so its container is stopped by
label here (jobpool/supervisor/orphans.py `stop_orphan`, which never signals a pid: docs/architecture.md,
"Rules the verdicts encode, and why").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .models import Job, JobState

if TYPE_CHECKING:
    from .store.calls import Store
    from .supervisor.orphans import OrphanStop


def orphaned(store: Store, job: Job) -> bool:
    """Whether `job`, as a cancel left it, runs with a persisted cancel under a worker boot that is gone."""
    return (job.state is JobState.RUNNING and job.cancel_requested and bool(job.owner_boot)
            and not store.boot_is_live(job.owner_boot))


def stop_if_orphaned(store: Store, job: Job) -> OrphanStop | None:
    """Stop the container of `job` (as `Pool.cancel` returned it) when its worker is gone; None when there
    was nothing to do. Raises ImportError in a build without the supervisor, and only when there was
    something to do: the supervisor is imported only then."""
    if not orphaned(store, job):
        return None
    from .supervisor import stop_orphan

    return stop_orphan(store, job)
