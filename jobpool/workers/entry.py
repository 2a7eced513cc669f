"""The RQ job functions, called by dotted path in the work horse (JSON-serialized, never pickled).

`run_job` takes no arguments: its job id is the RQ job's id and its attempt was written into the RQ job's
meta by the promote script, in the same step that made it visible.
"""

from __future__ import annotations

import logging

from rq import get_current_job

from ..attempt import Attempt
from ..errors import CorruptRow, JobpoolError
from .executors import Launch, make_executor
from .runtime import current
from .watch import launch_and_watch, quietly_refused, watch

log = logging.getLogger("jobpool.worker")


def run_job() -> str:
    """Claim -> launch -> watch -> finish one attempt of the current RQ job."""
    rt = current()
    rq_job = get_current_job()
    if rq_job is None:
        raise RuntimeError("run_job must run as an RQ job")
    job_id = rq_job.id
    attempt_no = int((rq_job.meta or {}).get("jobpool_attempt", 0))
    attempt = Attempt(rt.pool, job_id, rt.boot_id, attempt_no)
    try:
        spec, _ = attempt.claim(rt.pool.settings.executor, rt.daemon_id)
    except CorruptRow as exc:
        log.error("job %s attempt %s: not run: %s", job_id, attempt_no, exc)
        return "bad-spec"
    except JobpoolError as exc:
        if quietly_refused(exc):
            log.info("job %s attempt %s: not claimed (%s)", job_id, attempt_no, exc)
            return "not-claimed"
        raise
    executor = make_executor(rt.pool.settings, rt.daemon_id, rt.api_version)
    try:
        env = {"JOBPOOL_JOB_ID": job_id, "JOBPOOL_ATTEMPT": str(attempt_no), "JOBPOOL_POOL": rt.pool.keys.pool}
        launch = Launch(rt.pool.keys.pool, job_id, attempt_no, rt.boot_id, spec, env)
        launch_and_watch(rt, attempt, executor, lambda: executor.launch(launch))
    finally:
        executor.close()
    return "done"


def adopt_job(job_id: str, old_owner: str, attempt_no: int) -> str:
    """Re-attach to a live container whose worker is gone (asked for by the supervisor), then watch it
    to its real exit code. The takeover is a compare-and-set, refused while the old owner's lease lives."""
    rt = current()
    executor = make_executor(rt.pool.settings, rt.daemon_id, rt.api_version)
    try:
        row = rt.pool.get(job_id)
        handle = executor.attach(rt.pool.keys.pool, job_id, int(attempt_no), row.container_id)
        if handle is None:
            log.info("job %s: nothing to adopt", job_id)
            return "not-adopted"
        try:
            attempt, _, _, requests = Attempt.adopt(rt.pool, job_id, old_owner, int(attempt_no), rt.boot_id,
                                                    evidence=f"container {handle.container_id[:12]} running")
        except JobpoolError as exc:
            if quietly_refused(exc):
                log.info("job %s: not adopted (%s)", job_id, exc)
                return "not-adopted"
            raise
        log.info("job %s attempt %s: adopted from boot %s", job_id, attempt_no, old_owner)
        attempt.set_container(handle.container_id, handle.daemon_id, handle.identity)
        watch(rt, attempt, handle, executor, requests)
    finally:
        executor.close()
    return "adopted"
