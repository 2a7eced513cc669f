"""The RQ half of a job: the RQ job hash that jobpool pre-saves at enqueue and promote makes visible.

Every RQ job of a pool calls the same function with no arguments (it reads its job id and attempt from
RQ's current job), so the serialized payload is the same for every job: it is built once per pool, with
RQ's own `Job.create` and `to_dict`, and only the per-job fields are filled in at enqueue.
"""

from __future__ import annotations

from datetime import datetime, timezone

from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.serializers import JSONSerializer

#: The RQ job function, by dotted path (JSON-serialized, never pickled).
ENTRY_POINT = "jobpool.workers.entry.run_job"


def rq_hash_template(queue_name: str) -> dict[str, bytes | str | int]:
    """RQ's job hash fields for a jobpool job, less the per-job ones (created_at, description)."""
    job = RQJob.create(
        func=ENTRY_POINT, id="template", origin=queue_name, timeout=-1, result_ttl=-1, failure_ttl=-1,
        status=JobStatus.CREATED, serializer=JSONSerializer, description="",
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
