"""The RQ half of a job: the RQ job hash that jobpool pre-saves at enqueue and promote makes visible.

Every RQ job of a pool calls the same function with no arguments (it reads its job id and attempt from
RQ's current job), so the serialized payload is the same for every job: it is built once per pool, with
RQ's own `Job.create` and `to_dict`, and only the per-job fields are filled in at enqueue.

RQ keeps what it records of a delivery (its job hash, a result stream, a registry entry) for as long as the
job's `result_ttl` says. jobpool needs that hash while the job may be delivered again (a job handed back or
paused is made visible again by promotion, which reuses it), and not once it has ended: `after_delivery`,
RQ's success callback, tells RQ then to delete it instead. What a job handed back left is removed with its
row (scripts/prune.lua).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import redis
from rq.job import Callback, JobStatus
from rq.job import Job as RQJob
from rq.serializers import JSONSerializer

from .contract import TERMINAL
from .keys import RQ_QUEUE_NAME_PREFIX, PoolKeys

log = logging.getLogger("jobpool")

#: The RQ job function, by dotted path (JSON-serialized, never pickled).
ENTRY_POINT = "jobpool.workers.entry.run_job"
_TERMINAL = frozenset(s.value for s in TERMINAL)


def after_delivery(job: RQJob, connection: redis.Redis, result: Any) -> None:
    """RQ's success callback, run in the work horse once `run_job` returned and before RQ records it: a job
    that has ended will never be delivered again, so RQ is told to delete its record (result TTL 0) rather
    than keep it for ever. A row that is gone is a job that ended and was pruned already (rows live from
    enqueue to prune), possibly while this horse was between its finish and this callback: the pruning that
    would have removed RQ's record has run, so it is deleted here too. Any doubt (Redis away, a queue that
    is not a pool's) keeps RQ's record."""
    if not job.origin.startswith(RQ_QUEUE_NAME_PREFIX):
        return
    try:
        keys = PoolKeys(job.origin.removeprefix(RQ_QUEUE_NAME_PREFIX))
        state = connection.hget(keys.job(job.id), "state")
    except (redis.RedisError, ValueError) as exc:
        log.info("job %s: RQ's record kept (%s)", job.id, exc)
        return
    if isinstance(state, bytes):
        state = state.decode(errors="replace")
    if state is None or state in _TERMINAL:
        job.result_ttl = 0


def rq_hash_template(queue_name: str) -> dict[str, bytes | str | int]:
    """RQ's job hash fields for a jobpool job, less the per-job ones (created_at, description)."""
    job = RQJob.create(
        func=ENTRY_POINT, id="template", origin=queue_name, timeout=-1, result_ttl=-1, failure_ttl=-1,
        status=JobStatus.CREATED, serializer=JSONSerializer, description="",
        on_success=Callback(after_delivery),
        connection=_NoConnection(),  # type: ignore[arg-type]  # never used: the template is not saved
    )
    fields = job.to_dict(include_meta=False, include_result=False)
    for per_job in ("created_at", "description"):
        fields.pop(per_job, None)
    return fields


def rq_hash_args(template: list[bytes | str | int], job_id: str, image: str) -> list[bytes | str | int]:
    """Field/value pairs for the enqueue script's ARGV; `template` is `rq_hash_template` flattened."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return ["created_at", now, "description", f"jobpool {job_id} ({image})", *template]


class _NoConnection:
    """`Job.create` wants a connection object but the template is never saved through it."""
