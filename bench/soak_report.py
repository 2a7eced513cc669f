"""The soak's verdict at its end (bench/soak.py runs it): how every job ended, whether every event path was
legal, the prune events against the rows gone, the keyspace judged (with --keep), and findings.txt, which
holds what a broken zero needs to be traced: the jobs' events (read live, bench/soak_watch.py), their rows and
RQ's state, and what the Redis rollbacks took back."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bench.soak_order import finding_line
from bench.soak_time import fails_as, judge_time
from bench.soak_watch import TERMINAL, endings
from jobpool import Pool
from jobpool.errors import JobpoolError

if TYPE_CHECKING:
    from bench.soak import Run

#: Legal (from, to) pairs in the events stream, each with the reasons it may carry (None: any). The pairs of
#: the order before issue #26 take any reason ("running"->"running" are claims, adoptions, requests, and an
#: attempt marked for its time limit); those of time and dependencies (scripts/_lib.lua, "Time and
#: dependencies") only theirs: born waiting (`enqueued`), released (`wait_over`), cancelled while waiting (a
#: user's `cancel`, or `dependency_failed` by the release step or a resume), paused and resumed while still
#: held, a failure its spec retries (`retry`), and a person's `Pool.retry` of a failed or cancelled job.
LEGAL: dict[tuple[str, str], frozenset[str] | None] = {
    ("", "queued"): None, ("queued", "running"): None, ("queued", "paused"): None,
    ("queued", "cancelled"): None, ("running", "running"): None, ("running", "queued"): None,
    ("running", "paused"): None, ("running", "succeeded"): None, ("running", "failed"): None,
    ("running", "cancelled"): None, ("paused", "queued"): None, ("paused", "cancelled"): None,
    ("", "waiting"): frozenset({"enqueued"}),
    ("waiting", "queued"): frozenset({"wait_over"}),
    ("waiting", "cancelled"): frozenset({"cancel", "dependency_failed"}),
    ("waiting", "paused"): frozenset({"pause"}),
    ("paused", "waiting"): frozenset({"resume"}),
    ("running", "waiting"): frozenset({"retry"}),
    ("failed", "queued"): frozenset({"retried"}), ("failed", "waiting"): frozenset({"retried"}),
    ("cancelled", "queued"): frozenset({"retried"}), ("cancelled", "waiting"): frozenset({"retried"}),
}


def legal(frm: str, to: str, reason: str) -> bool:
    """Whether `frm`->`to` for `reason` is a transition the scripts make."""
    reasons = LEGAL.get((frm, to), frozenset())
    return reasons is None or reason in reasons


def check_transitions(events: list[dict[str, str]], job_ids: list[str]) -> int:
    """Every job's events form a legal path, each transition starting where the last one ended."""
    state: dict[str, str] = {}
    bad = 0
    wanted = set(job_ids)
    for e in events:
        job = e.get("job")
        if job not in wanted:
            continue
        frm, to, reason = e["from"], e["to"], e["reason"]
        if frm == to and ((reason == "stray_stopped" and state.get(job, "") == frm)
                          or (reason == "schedule_skipped" and frm == "")):
            # A note in the job's history, not a transition: a stray of it stopped (jobpool/fleet/strays.py);
            # a schedule's tick skipped while this job, its last, still waits or runs (scripts/enqueue.lua).
            continue
        if not legal(frm, to, reason) or state.get(job, "") != frm:
            bad += 1
            print(f"soak: illegal transition for {job}: {state.get(job, '')!r} then {frm!r}->{to!r} "
                  f"({reason})", file=sys.stderr)
        state[job] = to
    return bad


def tally(run: Run, root: Path) -> None:
    """Every job's end: lost (its row gone before it ended), stuck (not terminal), or its outcome (by its
    row, or by its last event once retention removed the row); the transitions check; the prune events
    against the rows gone; with --keep, the keyspace judged."""
    pool, figures, log = run.pool, run.figures, run.log
    judged = run.judged_ids()
    figures.jobs = len(judged)
    ended = endings(pool, log, judged)
    figures.lost, figures.stuck, figures.stuck_jobs = len(ended.lost), len(ended.stuck), ended.stuck
    figures.outcomes, figures.failure_reasons = ended.outcomes, ended.failure_reasons
    figures.pruned = ended.pruned
    figures.pruned_unaccounted = sum(abs(ended.pruned[s] - log.pruned[s]) for s in TERMINAL)
    if figures.pruned_unaccounted:
        print(f"soak: rows gone after their jobs ended {dict(ended.pruned)} against prune events "
              f"{dict(log.pruned)}", file=sys.stderr)
    figures.events_unseen = log.unseen
    figures.illegal_transitions = check_transitions(log.events, judged)
    figures.time = judge_time(log.events, run.built(), log.fired)
    figures.fired_unread = len(log.unread - set(judged))
    for line in figures.time.lines():
        print(f"soak: {line}", file=sys.stderr)
    if run.keyspace is not None:
        figures.keyspace = run.keyspace.judge()
        (root / "keyspace.txt").write_text("".join(c.line() + "\n" for c in run.keyspace.censuses))
    for job_id in figures.held_launches:  # each must end normally, run once (the sampler judges that)
        with contextlib.suppress(JobpoolError):
            job = pool.get(job_id)
            print(f"soak: held launch of {job_id}: {job.state.value} at attempt {job.attempt}",
                  file=sys.stderr)


def write_findings(run: Run, root: Path, slots: int) -> None:
    """For each instant that broke a zero, each job left stuck or lost, and each job that failed though not
    built to: what ran, every event of the jobs involved (from the live reader: a pruned job's too), their
    rows and what RQ holds of them, and the events the Redis rollbacks took back, in `findings.txt` under
    the soak's dir (its logs are there too); with --keep, the censuses when the keyspace was not flat."""
    figures, pool, log = run.figures, run.pool, run.log
    judged, built = run.judged_ids(), run.built()
    lost = [j for j in judged if log.last.get(j) not in TERMINAL]
    lost = [j for j in lost if not pool.store.client.exists(pool.keys.job(j))]
    # A job that failed otherwise than it was built to (bench/soak_time.py `Built.fails_as`: a plain job by
    # exit 3, one built to time out by `timeout`, one built to fail its retries by its exit code): not a
    # broken promise, but a fault charged to the job.
    charged = [j for j in judged
               if log.last.get(j) == "failed" and log.reason.get(j) not in fails_as(built, j)]
    censuses = []
    if figures.keyspace is not None and not figures.flat_holds() and run.keyspace is not None:
        censuses = [f"{c.line()} orphans={c.orphans}" for c in run.keyspace.censuses]
    leftovers = figures.docker_leftovers
    timed = figures.time.lines()
    if not (figures.findings or figures.stuck_jobs or lost or censuses or charged or leftovers or timed):
        return
    jobs = sorted({job for f in figures.findings for job, *_ in f["live"]}
                  | set(figures.stuck_jobs) | set(lost) | set(charged) | figures.time.involved)
    lines = [finding_line(f, slots) for f in figures.findings] + censuses + timed
    for job in jobs:
        tag = (" (stuck)" if job in figures.stuck_jobs else " (lost)" if job in lost
               else f" (failed: {log.reason[job]})" if job in charged else "")
        lines.append(f"job {job}{tag}: {rq_facts(pool, job)}")
        lines += [f"  {e['id']} {e['from']}->{e['to']} {e['reason']} "
                  f"{ {k: v for k, v in e.items() if k not in ('id', 'job', 'from', 'to', 'reason')} }"
                  for e in log.events if e.get("job") == job]
    lines += [f"left on a daemon: {what}" for what in leftovers]
    for rb in figures.rollbacks:
        lines.append(f"rollback at {rb['at']:.3f} to {rb['restored_to']}, took back:")
        lines += [f"  {e['id']} {e.get('job')} {e.get('from')}->{e.get('to')} {e.get('reason')}"
                  for e in rb["lost"]]
    (root / "findings.txt").write_text("\n".join(lines) + "\n")
    print(f"soak: findings written to {root / 'findings.txt'}", file=sys.stderr)


def rq_facts(pool: Pool, job_id: str) -> str:
    """The job's row, lease, and where RQ holds it (queue, intermediate list, started registry, its status),
    read raw: what the supervisor's evidence is made of."""
    c, k = pool.store.client, pool.keys
    started = f"rq:wip:{k.rq_queue_name}"
    try:
        entries: list[tuple[str, float]] = list(c.zrange(started, 0, -1, withscores=True))  # type: ignore[arg-type]
        return str({
            "row": c.hgetall(k.job(job_id)), "lease": c.get(k.lease(job_id)),
            "lease_pttl": c.pttl(k.lease(job_id)), "rq_queue_pos": c.lpos(k.rq_queue, job_id),
            "rq_intermediate_pos": c.lpos(k.rq_intermediate, job_id),
            "rq_started": [(m, sc) for m, sc in entries if m.startswith(job_id)],
            "rq_status": c.hget(f"rq:job:{job_id}", "status"), "redis_time": c.time()})
    except Exception as exc:  # noqa: BLE001 - a report: say what could not be read
        return f"(unreadable: {exc})"
