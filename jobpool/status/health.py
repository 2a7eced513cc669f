"""The health rules: the verdict on a status report (jobpool/status/report.py), healthy unless there is a
reason, with warnings worth knowing. One place, so the CLI, the dashboard and the metrics cannot disagree
about what "healthy" means.
"""

from __future__ import annotations

from ..fleet import markrecords
from ..store.redispolicy import Verdict
from .report import Daemons, Health, StatusReport, Worker, Workers, ago

#: The supervisor counts as dead when its last sweep is older than this many sweep intervals.
SWEEP_GRACE_INTERVALS = 3
#: How many workers, daemons or jobs one note names before it says '...' (and how many more).
_NAMED, _NAMED_WORKERS = 5, 3


def judge(report: StatusReport, sweep_interval_secs: float, warnings: tuple[str, ...] = ()) -> Health:
    """The health rules: unhealthy without a supervisor that swept lately, with fewer ready workers than
    slots (a slot no worker can take is a job that waits for nothing; a worker whose host fails its check is
    not ready, a warning naming why; one whose work loop is stuck on its horse holds work it cannot do, a
    reason of its own) or on a Redis
    that may evict job rows (a policy that may evict leases, or one that could not be read, is a warning).
    A Docker daemon without live-restore is a warning: its jobs run, but its restart would stop them."""
    reasons: list[str] = []
    notes = list(warnings)
    policy = report.redis_policy
    if policy is not None and policy.verdict is not Verdict.OK:
        (reasons if policy.verdict is Verdict.REFUSE else notes).append(policy.message)
    now, sweep = report.now_ms or 0, report.last_sweep
    if sweep is None:
        reasons.append("no live supervisor: no sweep has been recorded for this pool")
    elif now - sweep.at > SWEEP_GRACE_INTERVALS * sweep_interval_secs * 1000:
        reasons.append(f"no live supervisor: the last sweep was {ago(sweep.at, now)}, more than "
                       f"{SWEEP_GRACE_INTERVALS} x JOBPOOL_SWEEP_INTERVAL_SECS ({sweep_interval_secs:g} s)")
    if sweep is not None and sweep.overran:
        notes.append(f"the last sweep took {sweep.duration_ms or 0:.0f} ms, longer than its interval of "
                     f"{(sweep.interval_ms or 0) / 1000:g} s: slots of dead jobs are freed that much later "
                     "(`jobpool_sweep_overruns_total` counts them)")
    mx = report.slots.max if report.slots else 0
    ready = (report.workers.live - report.workers.draining) if report.workers else 0
    held = [w for w in report.workers.boots if w.cannot_claim] if report.workers else []
    # Stuck on its horse (workers/horses.py, `HorseWorker.stuck`), and not counted twice.
    stuck = [w for w in report.workers.boots if w.stuck and not w.cannot_claim] if report.workers else []
    ready -= sum(not w.draining for w in held + stuck)
    if ready < mx:
        whys = ([f"{len(held)} not claiming: its host fails its check"] if held else []) + (
            [f"{len(stuck)} stuck on its horse"] if stuck else [])
        why = f" ({'; '.join(whys)})" if whys else ""
        reasons.append(f"fewer live workers than slots: {ready} ready for {mx} slot{'s' * (mx != 1)}{why}")
    notes += [f"worker {w.id} on {w.host or '?'} is not claiming: {w.cannot_claim}" for w in held[:_NAMED]]
    if len(held) > _NAMED:
        notes.append(f"... and {len(held) - _NAMED} more workers not claiming")
    # A worker stuck on its horse holds work it cannot do (the job it was handed, or runs): unhealthy whatever
    # the other workers can take.
    reasons += [f"worker {w.id} on {w.host or '?'} cannot take work: {w.stuck}" for w in stuck[:_NAMED]]
    if report.strays:
        daemons = sorted({x.daemon_id for x in report.strays})
        reasons.append(f"{len(report.strays)} stray container(s) run outside any slot on daemon(s) "
                       f"{', '.join(daemons)}: their workers are stopping them (see `strays`)")
    # Each names both daemons' hosts and sockets; it stands until an operator clears it (daemonmark.py).
    reasons.extend(line if markrecords.clear_command(d) in line else
                   f"{line}; it stands until cleared, once one daemon has an identity of its own: "
                   f"{markrecords.clear_command(d)}" for d, line in report.shared_daemons.items())
    if report.unknown:
        notes.append(f"{report.unknown} running job(s) could not be probed (Docker unreachable?); "
                     "their slots are kept until the probe answers")
    if report.promotion and report.promotion.paused:
        notes.append("promotion is paused: queued jobs will not start until `jobpool resume`")
    notes += _daemon_notes(report.daemons, now)
    notes += _live_restore_notes(report.workers)
    return Health(tuple(reasons), tuple(notes))


def _live_restore_notes(workers: Workers | None) -> list[str]:
    """One warning naming the Docker daemons whose workers read them running without live-restore, once per
    daemon identity (many workers share one daemon): restarting such a daemon stops every job running on it,
    charged to each as a crash or, stopped cleanly, as its own exit (README.md, "The container contract")."""
    without: dict[str, list[Worker]] = {}
    swarm: dict[str, list[Worker]] = {}
    for w in workers.boots if workers else ():
        if w.live_restore is False:
            (swarm if w.swarm else without).setdefault(
                w.daemon_id or f"the daemon of host {w.host or '?'}", []).append(w)
    notes = []
    if without:
        notes.append(f"{len(without)} Docker daemon(s) run without live-restore, so restarting one stops the "
                     f"jobs running on it: {_named(without)}. Turn it on: \"live-restore\": true in "
                     "/etc/docker/daemon.json, then reload dockerd")
    if swarm:  # Swarm refuses live-restore: the advice above would keep the daemon from starting
        notes.append(f"{len(swarm)} Docker daemon(s) are Swarm nodes, which cannot run with live-restore, so "
                     f"restarting one stops its jobs and its worker: {_named(swarm)}. Drain the node first "
                     "(docker node update --availability drain NODE): its jobs are handed back or resume")
    return notes


def _named(daemons: dict[str, list[Worker]]) -> str:
    named = [f"{daemon} (host {', '.join(sorted({w.host or '?' for w in ws}))}: worker "
             f"{', '.join(w.id for w in ws[:_NAMED_WORKERS])}{' ...' if len(ws) > _NAMED_WORKERS else ''})"
             for daemon, ws in sorted(daemons.items())[:_NAMED]]
    more = f"; ... and {len(daemons) - _NAMED} more" if len(daemons) > _NAMED else ""
    return "; ".join(named) + more


def _daemon_notes(daemons: Daemons | None, now: int) -> list[str]:
    """Warnings: slots held on a daemon's stale evidence (and the command that frees them if its host is gone
    for good), and daemons back after a declaration (what ran on it may have run twice)."""
    notes = []
    for d in daemons.stale if daemons else ():
        last = (f"last published {ago(d.last_published_ms, now)}" if d.last_published_ms is not None
                else "not published within a week")
        notes.append(f"daemon {d.daemon_id} holds {len(d.jobs)} slot(s) on stale evidence since "
                     f"{ago(d.since_ms, now)} (its inventory {last}; jobs {', '.join(d.jobs[:_NAMED])}"
                     f"{' ...' if len(d.jobs) > _NAMED else ''}): "
                     f"if its host is gone for good, `{d.command}`")
    for r in daemons.returned if daemons else ():
        what = ("it came back, publishing again" if r.how == "published"
                else f"the declaration was withdrawn by {r.by or '?'}")
        notes.append(f"daemon {r.daemon_id} declared gone by {r.forgotten_by or '?'} "
                     f"{ago(r.forgotten_at, now)}: {what} {ago(r.at, now)}; jobs judged absent on the "
                     "declaration meanwhile may have run twice")
    return notes
