"""`WorkerCalls`: a worker's writes of one attempt, each a script fenced on (boot, attempt): claim, adopt,
heartbeat, its time limit's mark, its live log, what it launched, how it ended, and a delivery given back
(docs/architecture.md, "Workers"). A write a worker may no longer make (its job evicted, reconciled, adopted)
is refused by the script as `Conflict`, and nothing changes.
"""

from __future__ import annotations

import json
from typing import Any

from ..contract import LIVE_LOG_CAP_BYTES
from .replies import Adopted, Claimed, Moved, Requests
from .runner import call_redis
from .scriptcalls import CANDIDATES_ON_RELEASE, ScriptCalls, moved, requests_of


class WorkerCalls(ScriptCalls):
    """A worker's fenced writes (a part of `store.calls.Store`)."""

    def _attempt_keys(self, job_id: str) -> list[str]:
        return [self.keys.job(job_id), self.keys.lease(job_id)]

    def claim(self, job_id: str, boot_id: str, attempt: int, lease_ms: int, executor: str, daemon_id: str,
              token: str) -> Claimed:
        reply = self.run("claim", self._attempt_keys(job_id),
                         [job_id, boot_id, attempt, lease_ms, executor, daemon_id, token])
        return Claimed(spec_json=reply[1], requests=requests_of(reply[2], reply[3]))

    def adopt(self, job_id: str, old_owner: str, attempt: int, boot_id: str, lease_ms: int, evidence: str,
              daemon_id: str) -> Adopted:
        reply = self.run("adopt", self._attempt_keys(job_id),
                         [job_id, old_owner, attempt, boot_id, lease_ms, evidence, daemon_id])
        return Adopted(spec_json=reply[1], container_id=reply[2], requests=requests_of(reply[3], reply[4]))

    def heartbeat(self, job_id: str, boot_id: str, attempt: int, lease_ms: int) -> Requests:
        reply = self.run("heartbeat", [*self._attempt_keys(job_id), self.keys.log_watch(job_id)],
                         [boot_id, attempt, lease_ms])
        return Requests(reply[1] == "1", reply[2] == "1", reply[3] == 1)

    def time_out(self, job_id: str, boot_id: str, attempt: int, evidence: str) -> bool:
        """Mark the attempt as stopped for its time limit before its watcher stops it (scripts/time_out.lua):
        its exit then fails it as `timeout`, or retries it. False when it was marked already."""
        reply = self.run("time_out", [self.keys.job(job_id)], [boot_id, attempt, evidence])
        return bool(reply[1] == "marked")

    def append_log(self, job_id: str, boot_id: str, attempt: int, text: str, position: str,
                   linger_ms: int = 0) -> int:
        """Append what the attempt printed to the job's live log (scripts/log_append.lua), up to `position`
        in its output; returns the log's length in bytes. `linger_ms` > 0 on the attempt's last append."""
        reply = self.run("log_append", [self.keys.job(job_id), self.keys.job_log(job_id)],
                         [boot_id, attempt, text, position, LIVE_LOG_CAP_BYTES, linger_ms])
        return int(reply[1])

    def set_container(self, job_id: str, boot_id: str, attempt: int, container_id: str, daemon_id: str,
                      identity: dict[str, Any] | None, lease_ms: int, daemon_queue: str) -> Requests:
        """Record what was launched (renewing the lease, reading the requests back); `daemon_queue` is the
        daemon's own RQ list for a handback with its checkpoint ('' for none)."""
        reply = self.run("set_container", self._attempt_keys(job_id),
                         [boot_id, attempt, container_id, daemon_id,
                          json.dumps(identity, sort_keys=True) if identity else "", lease_ms, daemon_queue])
        return requests_of(reply[1], reply[2])

    def finish(self, job_id: str, boot_id: str, attempt: int, kind: str, exit_code: int | None, reason: str,
               log_tail: bytes | str, recovery_budget: int, evidence: str) -> Moved:
        """Report how an attempt ended (scripts/finish.lua, `kind`), releasing its slot; `log_tail` as the row
        stores it (jobpool/logtail.py)."""
        return moved(self.run(
            "finish", [*self._attempt_keys(job_id), *self.candidates(CANDIDATES_ON_RELEASE)],
            [job_id, boot_id, attempt, kind, "" if exit_code is None else exit_code, reason, log_tail,
             recovery_budget, evidence]))

    def forget_rq_failure(self, job_id: str, failed_registry_key: str) -> bool:
        """RQ's failure record of a delivery of `job_id` deleted if the job has no row (scripts/
        forget_rq_failure.lua); True when there was one to delete."""
        k = self.keys
        keys = [k.job(job_id), k.rq_job(job_id), k.rq_results(job_id), failed_registry_key]
        return bool(int(self.run("forget_rq_failure", keys, [job_id])[1]))

    def deliveries_due(self, started_registry_key: str, until: float) -> list[str]:
        """The entries of RQ's started registry `started_registry_key` (RQ's own key) due by `until`, a Unix
        time: the deliveries RQ's maintenance takes out as abandoned, if no worker renews them before."""
        return [str(m) for m in call_redis(self.client.zrangebyscore, started_registry_key, 0, until)]

    def deliveries_gone(self, started_registry_key: str, entries: list[str]) -> list[str]:
        """Those of `entries` no longer in RQ's started registry `started_registry_key`."""
        if not entries:
            return []
        scores = call_redis(self.client.zmscore, started_registry_key, entries)
        return [entry for entry, score in zip(entries, scores, strict=True) if score is None]

    def give_back(self, queue_key: str, intermediate_key: str, first_seen_key: str, rq_job_id: str) -> bool:
        """Put a job a worker just took back at the head of its RQ queue, RQ's first-seen note of it in the
        intermediate list removed; False when it was not taken."""
        return bool(int(self.run("give_back", [queue_key, intermediate_key, first_seen_key], [rq_job_id])[1]))
