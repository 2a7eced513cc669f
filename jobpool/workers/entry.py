"""The RQ job functions, called by dotted path in the work horse (JSON-serialized, never pickled).

`run_job` takes no arguments: its job id is the RQ job's id and its attempt was written into the RQ job's
meta by the promote script, in the same step that made it visible.
"""

from __future__ import annotations

import logging

from rq import get_current_job

from ..contract import ENV_ATTEMPT, ENV_JOB_ID, ENV_POOL, RQ_META_ATTEMPT
from ..errors import CorruptRow, JobpoolError
from ..fleet.daemonid import same_daemon
from .attempt import Attempt
from .executors import Launch, make_executor
from .executors.base import DOCKER, HostFault
from .runtime import Runtime, current
from .watch import _retrying, launch_and_watch, quietly_refused, watch

log = logging.getLogger("jobpool.worker")


def run_job() -> str:
    """Claim -> launch -> watch -> finish one attempt of the current RQ job."""
    rt = current()
    rq_job = get_current_job()
    if rq_job is None:
        raise RuntimeError("run_job must run as an RQ job")
    job_id = rq_job.id
    attempt_no = int((rq_job.meta or {}).get(RQ_META_ATTEMPT, 0))
    attempt = Attempt(rt.store, job_id, rt.boot_id, attempt_no)
    try:
        daemon = daemon_identity(rt)  # raises when unknown: never claim what could not be found again
    except Exception as exc:
        # Nothing was claimed (the sweep dispatches the job again past the claim grace), but this worker
        # would take the next job only to drop it the same way: it holds until its daemon answers
        # (workers/hostcheck.py).
        if rt.host_check is not None:
            rt.host_check.note.write(HostFault(DOCKER, f"its identity could not be established: {exc}"))
        raise
    try:
        # A claim whose reply was lost is sent again by the same `attempt`, and succeeds again: giving up
        # would leave the row claimed with nothing launched.
        spec, _ = _retrying(lambda: attempt.claim(rt.store.settings.executor, daemon),
                            what=f"job {job_id} attempt {attempt_no}: claim")
    except CorruptRow as exc:
        log.error("job %s attempt %s: not run: %s", job_id, attempt_no, exc)
        return "bad-spec"
    except JobpoolError as exc:
        if quietly_refused(exc):
            log.info("job %s attempt %s: not claimed (%s)", job_id, attempt_no, exc)
            return "not-claimed"
        raise
    executor = rt.executor()
    try:
        env = {ENV_JOB_ID: job_id, ENV_ATTEMPT: str(attempt_no), ENV_POOL: rt.store.keys.pool}
        launch = Launch(rt.store.keys.pool, job_id, attempt_no, rt.boot_id, spec, env)
        launch_and_watch(rt, attempt, executor, lambda fence: executor.launch(launch, fence))
    finally:
        executor.close()
    return "done"


def daemon_identity(rt: Runtime) -> str:
    """The identity of this worker's Docker daemon (jobpool/fleet/daemonid.py), established once per boot; ''
    for the subprocess executor. Raises when it cannot be established: a Docker attempt is claimed only with
    the identity of the daemon it will run on, or the supervisor could never find it again."""
    if rt.store.settings.executor != "docker" or rt.daemon_id:
        return rt.daemon_id
    executor = make_executor(rt.store.settings, "", rt.api_version)
    try:
        rt.daemon_id = executor.daemon_id()  # type: ignore[attr-defined]
    except Exception as exc:
        log.warning("docker daemon identity not established (%s); not claiming", exc)
        raise
    finally:
        executor.close()
    return rt.daemon_id


def adopt_job(job_id: str, old_owner: str, attempt_no: int) -> str:
    """Re-attach to a live container whose worker is gone (asked for by the supervisor), then watch it
    to its real exit code. The takeover is a compare-and-set, refused while the old owner's lease lives,
    and only a worker on the daemon the attempt was recorded on may take it (its container is there)."""
    rt = current()
    row = rt.store.job(job_id)
    ok, why = same_daemon(row.daemon_id, daemon_identity(rt))
    if not ok:
        log.info("job %s: not adopted here: %s", job_id, why)
        return "not-adopted"
    executor = rt.executor()
    try:
        handle = executor.attach(rt.store.keys.pool, job_id, int(attempt_no), row.container_id)
        if handle is None:
            log.info("job %s: nothing to adopt", job_id)
            return "not-adopted"
        try:
            evidence = f"container {handle.container_id[:12]} running on daemon {rt.daemon_id}"
            attempt, _, _, requests = _retrying(  # a lost reply: sent again, the same adoption answers
                lambda: Attempt.adopt(rt.store, job_id, old_owner, int(attempt_no), rt.boot_id,
                                      evidence=evidence, daemon_id=rt.daemon_id), what="adopt")
        except JobpoolError as exc:
            if quietly_refused(exc):
                log.info("job %s: not adopted (%s)", job_id, exc)
                return "not-adopted"
            raise
        log.info("job %s attempt %s: adopted from boot %s", job_id, attempt_no, old_owner)
        _retrying(lambda: attempt.set_container(handle.container_id, handle.daemon_id, handle.identity),
                  what="set_container")
        watch(rt, attempt, handle, executor, requests)
    finally:
        executor.close()
    return "adopted"
