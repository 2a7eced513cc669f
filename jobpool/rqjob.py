"""The RQ half of a job: the RQ job hash that a job's promotion writes and makes visible.

Every RQ job of a pool calls the same function with no arguments (it reads its job id and attempt from
RQ's current job), so the serialized payload is the same for every job of every pool: it is built once,
with RQ's own `Job.create` and `to_dict`, and generated into the scripts that promote as a Lua constant
(`lua_template`); scripts/_lib.lua's `rq_record` fills in the per-job fields itself.

RQ keeps what it records of a delivery (its job hash, a result stream, a registry entry) for as long as the
job's `result_ttl` says. jobpool needs that hash while the job may be delivered again (a job handed back or
paused is made visible again by promotion, which reuses it), and not once it has ended: `after_delivery`,
RQ's success callback, tells RQ then to delete it instead. What a job handed back left is removed with its
row (scripts/prune.lua).
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from rq.job import Callback, JobStatus
from rq.job import Job as RQJob
from rq.serializers import JSONSerializer

from .contract import TERMINAL
from .store.keys import DAEMON_QUEUE_SUFFIX, RQ_QUEUE_NAME_PREFIX
from .store.rqconnection import row_state

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
    is not a pool's) keeps RQ's record. A horse that recorded its job's end itself has set the TTL already
    (jobpool/workers/horses.py, `HorseWorker.handle_execution_ended`): nothing to read then."""
    if job.result_ttl == 0 or not job.origin.startswith(RQ_QUEUE_NAME_PREFIX):
        return
    try:
        for pool in _pools_of(job.origin.removeprefix(RQ_QUEUE_NAME_PREFIX)):
            state = row_state(connection, pool, job.id)
            if state is not None:
                break
    except (redis.RedisError, ValueError) as exc:
        log.info("job %s: RQ's record kept (%s)", job.id, exc)
        return
    if state is None or state in _TERMINAL:
        job.result_ttl = 0


def _pools_of(name: str) -> list[str]:
    """The pools whose queue `name` (a delivery's origin, without RQ_QUEUE_NAME_PREFIX) may be: a job with a
    checkpoint affinity is delivered on its daemon's own queue (store/keys.py, `daemon_queue_name`), the
    pool's queue name and a suffix; a pool's own name may end the same way, so that is asked second."""
    suffix = DAEMON_QUEUE_SUFFIX.search(name)
    return [name[:suffix.start()], name] if suffix else [name]


#: RQ's per-job fields, written by the promoting script itself (`rq_record`, scripts/_lib.lua): the creation
#: time (the row's, in RQ's format), a description naming the job and its image, and the origin (the RQ list
#: the delivery is pushed on, from its key).
PER_JOB_FIELDS = ("created_at", "description", "origin")


def rq_hash_template() -> dict[str, bytes | str | int]:
    """RQ's job hash fields that are the same for every jobpool job of every pool: RQ's own `Job.create`
    and `to_dict` (so they follow the installed RQ), less the per-job fields and the empty ones.

    An empty field is left out: RQ reads a missing field and an empty one alike (`Job.restore` takes
    either as unset), so writing them would only cost every enqueue (tests/unit/test_enqueue_many.py
    checks that RQ restores the hash as it restores its own)."""
    job = RQJob.create(
        func=ENTRY_POINT, id="template", origin="template", timeout=-1, result_ttl=-1, failure_ttl=-1,
        status=JobStatus.CREATED, serializer=JSONSerializer, description="",
        on_success=Callback(after_delivery),
        connection=_NoConnection(),  # type: ignore[arg-type]  # never used: the template is not saved
    )
    fields = job.to_dict(include_meta=False, include_result=False)
    return {k: (v.value if isinstance(v, JobStatus) else v) for k, v in fields.items()
            if k not in PER_JOB_FIELDS and v != ""}


def _lua_string(value: bytes | str | int) -> str:
    """A Lua string literal of any bytes (RQ's payload is zlib data): every byte as a decimal escape."""
    data = value if isinstance(value, bytes) else str(value).encode()
    return '"' + "".join(f"\\{b}" for b in data) + '"'


def lua_template() -> str:
    """The Lua block jobpool/store/luatext.py puts in the shared text before scripts/_lib.lua (kept in the
    scripts that reach it: those that promote, through `rq_record`): `RQ_JOB_FIELDS`, the flat field/value
    list of `rq_hash_template`, generated once when a script is loaded. `rq_record` adds the per-job fields
    (`PER_JOB_FIELDS`: the origin is its RQ queue key less `RQ_QUEUE_KEY_PREFIX`, from jobpool/contract.py),
    so no caller sends any of it."""
    flat = [_lua_string(x) for kv in sorted(rq_hash_template().items()) for x in kv]
    return ("-- Generated from jobpool/rqjob.py (rq_hash_template) when the script is loaded.\n"
            f"local RQ_JOB_FIELDS = {{{', '.join(flat)}}}\n")


class _NoConnection:
    """`Job.create` wants a connection object but the template is never saved through it."""
