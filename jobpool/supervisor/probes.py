"""Evidence about whether a job's work still exists: its labelled container, or its recorded process.

Every probe answers one of three things and never guesses between them:

- `Present`: the container (or process) exists; running, or exited with a known exit code;
- `Absent`: it does not exist where this probe can see (for a container: on the daemon asked);
- `Unknown`: the probe could not tell (daemon unreachable, timeout, SDK/API error, another pid namespace).

`Unknown` is never read as `Absent`: guessing "dead" on missing evidence can hand a slot to a second writer,
while guessing "alive" costs one sweep interval.

Containers are found by label (jobpool/contract.py: pool, job id, attempt), never by a recorded id:
a worker may die between launching a container and recording it. The whole pool is listed in one daemon call
per sweep, however many rows need evidence.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import jobcgroup, procid
from ..contract import EXIT_UNKNOWN, LABEL_ATTEMPT, LABEL_JOB, LABEL_POOL
from ..exits import Ending, ending, killed_by_removal, oom_event
from .daemon import DaemonClient

#: Container states whose process may still write (a paused container resumes where it was).
LIVE_STATES = frozenset({"running", "paused", "restarting"})
#: States whose process is gone for good; the exit code is the job's result.
ENDED_STATES = frozenset({"exited", "dead", "removing"})

_EXIT_STATUS = re.compile(r"^\s*Exited \((-?\d+)\)")
#: 128 + SIGKILL: how a process the kernel killed (the OOM killer does) exits.
EXIT_OOM_KILL = 128 + 9


@dataclass(frozen=True)
class Present:
    """The container (or process) exists. `exit_code` is set only when `running` is False; `ending`, for an
    ended container, says what ended it (jobpool/exits.py; None: its own process, as for an exit 0)."""

    running: bool
    exit_code: int | None = None
    container_id: str = ""
    detail: str = ""
    ending: Ending | None = None
    #: When read from a daemon's inventory (supervisor/remote.py): (its daemon identity, its `at`), the fence.
    inventory: tuple[str, int] | None = None


@dataclass(frozen=True)
class Absent:
    """Nothing of this (job, attempt) exists where the probe looked. `never_started`: a container was
    created but never started (its launcher died between create and start); it did no work."""

    detail: str = "no container"
    never_started: bool = False
    container_id: str = ""
    inventory: tuple[str, int] | None = None
    #: A subprocess job's cgroup found empty, its main process gone: left for the sweep to remove
    #: (supervisor/stopper.py `remove_empty_cgroups`), since nothing else would.
    empty_cgroup: jobcgroup.JobCgroup | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Unknown:
    """The probe could not tell; `reason` says why (it is logged, and keeps the slot)."""

    reason: str


Probe = Present | Absent | Unknown


def result_name(probe: Probe) -> str:
    """How a probe is counted (`jobpool_probe_results_total{result}`, jobpool/metrics.py): present (running),
    exited, absent or unknown."""
    if isinstance(probe, Present):
        return "present" if probe.running else "exited"
    return "absent" if isinstance(probe, Absent) else "unknown"


def parse_exit_code(status: str | None) -> int | None:
    """The exit code in a container list's Status ("Exited (137) 3 seconds ago"), or None."""
    m = _EXIT_STATUS.match(status or "")
    return int(m.group(1)) if m else None


def _summary_result(summary: Mapping[str, Any]) -> Probe | None:
    """Judge one container from a sparse list entry; None when its exit code needs an inspect."""
    cid = str(summary.get("Id", ""))
    state = str(summary.get("State", "")).lower()
    status = str(summary.get("Status", ""))
    if state in LIVE_STATES:
        return Present(running=True, container_id=cid, detail=f"container {cid[:12]} {state}")
    if state == "created":
        # A created container's inspect says ExitCode 0: reading that as success would be a lie.
        return Absent(detail=f"container {cid[:12]} created, never started", never_started=True,
                      container_id=cid)
    if state in ENDED_STATES:
        code = parse_exit_code(status)
        if code is None:
            return None
        return Present(running=False, exit_code=code, container_id=cid,
                       detail=f"container {cid[:12]} exited with {code}")
    return Unknown(f"container {cid[:12]} in unexpected state {state!r} ({status!r})")


def _rank(p: Probe) -> int:
    """When one attempt somehow has several containers, the most alive one decides."""
    if isinstance(p, Present):
        return 3 if p.running else 1
    if isinstance(p, Unknown):
        return 2
    return 0


class ContainerProber(DaemonClient):
    """Lists a pool's containers on one Docker daemon and judges each: evidence only (what is done to them is
    jobpool/supervisor/stopper.py's). Its client and the daemon's identity are `DaemonClient`'s."""

    def __init__(self, docker_host: str | None = None, timeout: float = 10.0) -> None:
        super().__init__(docker_host, timeout)
        self.list_calls = 0

    def probe(self, pool: str, job_attempts: Mapping[str, int | None],
              daemon_ids: Mapping[str, str] | None = None) -> dict[str, Probe]:
        """For each job id, what its container of that attempt is (None: of any attempt, the most alive
        one): one list call for the whole pool.

        `daemon_ids` (job id -> the daemon identity the worker recorded at claim): only a daemon whose
        identity equals the recorded one may answer for a row (`Present`, `Absent`); for any other row, and
        for a row with no identity, the answer is `Unknown` naming both identities, whatever this daemon
        lists. Ids missing from `daemon_ids` (a ghost: a running id whose row is unreadable) are answered
        from this daemon's listing; their verdicts (verdicts.decide_ghost) never free a slot on an
        unattended sweep.
        """
        if not job_attempts:
            return {}
        try:
            return self._probe(pool, job_attempts, daemon_ids or {})
        except Exception as exc:  # noqa: BLE001 - any failure to ask is "unknown", never "absent"
            reason = self.failed(exc)
            return {job_id: Unknown(reason) for job_id in job_attempts}

    def _probe(self, pool: str, job_attempts: Mapping[str, int | None],
               daemon_ids: Mapping[str, str]) -> dict[str, Probe]:
        ours = self.daemon_id()
        listed = self.list_pool(pool)
        found: dict[str, Probe] = {}
        for summary in listed:
            labels = summary.get("Labels") or {}
            job_id = str(labels.get(LABEL_JOB, ""))
            if job_id not in job_attempts:
                continue  # another job
            wanted = job_attempts[job_id]
            if wanted is not None and labels.get(LABEL_ATTEMPT) != str(wanted):
                continue  # an older attempt of this one: not this attempt's evidence
            result = self.judge(summary)
            if job_id not in found or _rank(result) > _rank(found[job_id]):
                found[job_id] = result
        out: dict[str, Probe] = {}
        for job_id in job_attempts:
            if job_id in daemon_ids:
                ok, why = self.same_daemon(daemon_ids[job_id])
                if not ok:
                    out[job_id] = Unknown(why)
                    continue
            if job_id in found:
                out[job_id] = found[job_id]
                continue
            attempt = job_attempts[job_id]
            which = "any attempt" if attempt is None else f"attempt {attempt}"
            out[job_id] = Absent(detail=f"no container labelled for {which} on daemon {ours or '?'}")
        return out

    def list_pool(self, pool: str) -> list[dict[str, Any]]:
        """The list entries of every container of the pool on this daemon (one call); SDK errors propagate."""
        self.list_calls += 1
        listed = self._connect().api.containers(all=True, filters={"label": f"{LABEL_POOL}={pool}"})
        self.outages.answered(time.time())
        return list(listed)

    def judge(self, summary: Mapping[str, Any]) -> Probe:
        """What one listed container is: from its list entry, inspected only when its exit needs it."""
        result = _summary_result(summary)
        if result is None or self._may_be_infrastructure(result, summary.get("Created")):
            result = self._inspect(self._connect(), str(summary.get("Id", "")))
        return result

    def _may_be_infrastructure(self, result: Probe, created: Any = None) -> bool:
        """Whether an ended container's exit code is one its infrastructure may have caused, so what ended it
        (OOMKilled, when: only in an inspect) is worth one more call: 137, the SIGKILL an OOM kill leaves
        when the job's own process is the one killed; EXIT_UNKNOWN, an exit a restart lost; any non-zero
        exit once this prober saw its daemon restart (one without live-restore stops its containers), and of
        a container created before this host's boot (`created`, the list's epoch seconds: a reboot may have
        ended it). Other exits are read from the list alone, one call per sweep: an OOM kill the job
        answered with an exit code of its own choosing is then read as that exit (a worker watching it reads
        OOMKilled)."""
        if not isinstance(result, Present) or result.running or not result.exit_code:
            return False
        booted = self.outages.booted_at
        before_boot = booted is not None and isinstance(created, (int, float)) and created < booted
        return result.exit_code in (EXIT_OOM_KILL, EXIT_UNKNOWN) or bool(self.outages.windows) or before_boot

    def _inspect(self, client: Any, container_id: str) -> Probe:
        """An ended container's exit code and what ended it (jobpool/exits.py), which its list entry does not
        say; also the exit code of one whose list Status did not give it (e.g. state "dead")."""
        import docker

        try:
            attrs = client.api.inspect_container(container_id)
            state = attrs.get("State") or {}
            if state.get("Running") or state.get("Paused") or state.get("Restarting"):
                return Present(running=True, container_id=container_id,
                               detail=f"container {container_id[:12]} running")
            code = state.get("ExitCode")
            if not isinstance(code, int) or state.get("Status") == "created":
                return Unknown(f"container {container_id[:12]} has no readable exit code "
                               f"(state {state.get('Status')!r})")
            if killed_by_removal(state):
                return Unknown(f"container {container_id[:12]} is being removed (docker rm -f): its exit "
                               f"{code} is the removal's kill, not the job's; absent once it is gone, a "
                               f"crash if the removal fails")
            # The exit is old news to a supervisor: no grace for a late oom event.
            end = ending(state, self.outages, lambda: client.info().get("LiveRestoreEnabled") is not False,
                         lambda: oom_event(client.api, container_id, state))
        except docker.errors.NotFound:
            return Absent(detail=f"container {container_id[:12]} removed while probing")
        except Exception as exc:  # noqa: BLE001 - unknown, for this container only
            return Unknown(self._failure_reason(exc))
        detail = f"container {container_id[:12]} exited with {code}"
        return Present(running=False, exit_code=code, container_id=container_id,
                       detail=f"{detail} ({end.evidence})" if end.evidence else detail,
                       ending=end if end.cause else None)

def probe_containers(pool_name: str, job_attempts: Mapping[str, int], docker_host: str | None = None,
                     timeout: float = 10.0, daemon_ids: Mapping[str, str] | None = None) -> dict[str, Probe]:
    """One-shot form of `ContainerProber.probe` (a fresh client, closed afterwards)."""
    prober = ContainerProber(docker_host, timeout)
    try:
        return prober.probe(pool_name, job_attempts, daemon_ids)
    finally:
        prober.close()


def parse_identity(identity: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A recorded process identity (JSON on the row), or None if there is none or it is unreadable."""
    if not identity:
        return None
    if isinstance(identity, Mapping):
        return dict(identity)
    try:
        value = json.loads(identity)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def probe_process(identity: str | Mapping[str, Any] | None) -> Probe:
    """Whether the very process a subprocess-executor row recorded is alive, by (pid, start time, pid
    namespace, kernel boot id): a recycled pid number is `Absent`, another namespace or kernel `Unknown`.
    When the row recorded the job's cgroup (jobpool/jobcgroup.py), a job whose main process is gone is still
    present while any process of that cgroup lives: its worker died before it could end them, and they may
    still write. Such a cgroup, once found empty, is named in the `Absent` (`empty_cgroup`), for the sweep to
    remove. A row that recorded none (a host where no cgroup could be made) is judged by its main process
    alone."""
    ident = parse_identity(identity)
    if ident is None:
        return Unknown("no readable process identity recorded")
    alive = procid.same_process_alive(ident)
    pid = ident.get("pid")
    if alive is True:
        return Present(running=True, detail=f"process {pid} alive (start time {ident.get('start_time')})")
    if alive is None:
        return Unknown(f"process {pid} is in another pid namespace or kernel than this supervisor; "
                       "cannot tell")
    if "cgroup" not in ident:
        return Absent(detail=f"process {pid} gone (pid free or now another process)")
    try:
        cgroup = jobcgroup.recorded(ident)
        if cgroup is None:
            return Unknown(f"process {pid} is gone, but its job's cgroup {ident.get('cgroup')} cannot be "
                           "seen from this supervisor (another cgroup namespace, or no cgroup2 hierarchy "
                           "here); cannot tell whether a process it started still lives")
        if cgroup.populated():
            return Present(running=True, detail=(
                f"process {pid} gone, but processes it started still live in its cgroup {cgroup.path} "
                f"(pids {' '.join(map(str, cgroup.pids()[:10]))}); its worker died before it could end them: "
                f"to end them, write 1 to {cgroup.directory / 'cgroup.kill'}"))
    except OSError as exc:  # the cgroup cannot be read (permissions, a file system error): one row's unknown
        return Unknown(f"process {pid} is gone, but its job's cgroup {ident.get('cgroup')} cannot be read: "
                       f"{exc}")
    return Absent(detail=f"process {pid} gone (pid free or now another process), and its cgroup is empty",
                  empty_cgroup=cgroup)
