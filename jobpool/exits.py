"""How a Docker container ended: by its own process, by the kernel's OOM killer, or by its infrastructure.

One rule, applied by the worker that watched the container (jobpool/workers/executors/docker.py) and by the
supervisor that finds an orphan's container ended (jobpool/supervisor/probes.py); the scripts apply the
verdict (`verdict_for_exit` in scripts/_lib.lua). What Docker 20.10 records, found with real daemons
(tests/integration/test_daemon_faults.py):

- **OOM kill**: `State.OOMKilled` true (exit 137 when the job's own process was the victim). Precise: the
  job fails with `oom_killed` (contract.REASON_OOM_KILLED), which says what to change. The flag is set only
  when the daemon hears of the OOM kill before the exit; the two come from containerd on separate paths, and
  on a loaded host the exit can come first (seen in CI: exit 137, OOMKilled false). Docker never sets the flag
  afterwards, but it does log an `oom` event for the container. So an exit 137 without the flag is asked of
  the daemon's event log (`oom_event`): an `oom` event of this container since it started is an OOM kill.
- **Daemon restarted with live-restore** (SIGKILL or SIGTERM): the container runs on, and an exit while the
  daemon was away is kept by its shim and recorded with its real code and time. Nothing to judge.
- **Exit status lost across a restart**: a container whose exit the daemon was recording when it stopped
  (the soak's `exit_code_255`: a job that exited 0 just as dockerd was restarted), or whose shim died while
  the daemon was down (a host or containerd crash), is recorded by the restarted daemon as exit 255
  (containerd's "unknown exit status", contract.EXIT_UNKNOWN) with `Error` empty and `FinishedAt` the moment
  of that restart, not of the job's end.
- **Daemon without live-restore restarted**: it stops every container it finds running as it starts (the
  stop signal, then SIGKILL), so the exit is whatever the job does on SIGTERM (143, 137, 75...), with
  `FinishedAt` the moment of that restart.
- **Host rebooted**: every process of the old boot died with it, and the daemon started in the new boot
  records each container it finds still marked running as ended (exit 255 mostly), `FinishedAt` after the
  boot. A container that started before this host's boot (/proc/stat `btime`) and whose end was recorded
  after it (and before this observer's first answer from the daemon) was ended by the reboot, whatever its
  code: `host_rebooted`, recovered as a crash. One whose end was recorded before the boot ended before the
  host went down: its own exit (or a clean shutdown's stop, below).
- **Removed under the job** (`docker rm -f` by an operator or a cron): the daemon marks the container as
  being removed, kills it, marks it `dead`, deletes its file system, then destroys it, so its watcher may
  read an exit 137 in between. While it goes, its state reads `removing` (`killed_by_removal`): that 137 is
  the removal's, however long the deletion takes (seconds for a file system of many files, longer on a
  loaded host). The worker leaves the row to the supervisor, whose probe reads such a container as unknown
  until it is gone, then absent: the job runs again (workers/executors/docker.py, supervisor/probes.py). A
  removal that fails (a file it cannot delete), or that a daemon restart cuts short, leaves the container
  `dead` for good: Docker 20.10 marks a container dead only as it removes it, and never starts a dead one,
  so an exit 137 of a dead container without OOMKilled is a crash, `container_removed`, and the job runs
  again on its recovery budget. A `docker kill` followed by a separate `docker rm` leaves no such mark: a
  watcher that reads 137 without OOMKilled also asks the event log for `oom` and `destroy` together
  (`container_events`), and a destroyed container is no exit of the job's either.
- **Nothing distinguishes**, so these stay the job's exit: a shim killed under a running daemon (exit 137,
  as a `kill -9` would be), a daemon without live-restore stopped cleanly (it stops its containers and
  answers their exit before it goes), and any exit 255 outside a restart the observer saw.

Docker's record alone cannot tell a lost exit from a job's own `exit 255`: both read exit 255, Error "", no
OOMKilled. What tells them apart is *when* it was recorded. So the rule for "ended by the infrastructure"
needs the observer's own evidence of a restart: an **outage window**, from its last request the daemon
left unanswered (refused, reset mid-answer, a 5xx) to the first one it answered after it. A container is
ended by a restart when it started before the window and Docker's `FinishedAt` lies inside it: it ended
after the daemon was last seen gone, yet the first answer already reported it ended, so the end was
recorded by the restarted daemon's start-up. Then exit 255 is `daemon_restart_lost_exit`, and any non-zero
exit of a daemon without live-restore (`GET /info` LiveRestoreEnabled false) is
`daemon_restart_stopped_container`; both are recovered as crashes (recovery budget), not failed.

Residual ambiguity, stated: a job whose own process exits 255 inside the window (between the observer's last
unanswered request and the restarted daemon's first answer) is read as a lost exit and runs again within its
recovery budget. The window is one watch slice plus the daemon's start-up for a worker (it asks at least
every `WAIT_SLICE`), one sweep interval plus start-up for the supervisor.
"""

from __future__ import annotations

import collections
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .contract import (
    EXIT_UNKNOWN,
    REASON_CONTAINER_REMOVED,
    REASON_HOST_REBOOTED,
    REASON_OOM_KILLED,
    REASON_RESTART_LOST_EXIT,
    REASON_RESTART_STOPPED,
)
from .procid import host_boot_time

#: What ended a container, as the scripts name it (finish.lua kinds, reconcile_apply.lua verdicts).
OWN, OOM, CRASHED = "", "oom", "crashed"
#: The exit code of a process killed by SIGKILL, as the OOM killer kills.
EXIT_SIGKILL = 137
#: How long a watcher that saw the exit waits for the daemon's late `oom` event (the event log is read up to
#: this far past now, and Docker holds the request open until then).
OOM_EVENT_GRACE_SECS = 1.0
#: The inspect `State.Status` of a container Docker is removing: set before `docker rm -f` kills it, kept
#: until it is gone or the removal fails.
STATUS_REMOVING = "removing"
#: ... and of one whose removal got past its kill and then failed or was cut short (Docker marks a container
#: dead only as it removes it); a dead container is never started again.
STATUS_DEAD = "dead"
#: How many past outage windows an observer remembers (a supervisor judges orphans found sweeps later).
KEEP_WINDOWS = 16

_DOCKER_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


@dataclass(frozen=True)
class Ending:
    """How a container ended: its exit code, what ended it (`cause`: OWN, OOM or CRASHED), the error_reason
    for an OOM kill or a crash, and what was seen, in words."""

    code: int
    cause: str = OWN
    reason: str = ""
    evidence: str = ""


def docker_time(value: object) -> float | None:
    """A Docker timestamp (RFC 3339, nanoseconds) as epoch seconds; None for Docker's zero time or garbage."""
    m = _DOCKER_TIME.match(str(value or ""))
    if not m or m.group(1).startswith("0001-"):
        return None
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    try:
        whole = datetime.fromisoformat(m.group(1) + zone)
    except ValueError:
        return None
    return whole.astimezone(timezone.utc).timestamp() + float("0." + (m.group(2) or "0"))


class Outages:
    """What one observer saw of its daemon: the windows in which it restarted, each (last unanswered
    request, first answered request after it), in epoch seconds of this host's clock (the daemon is on a
    local socket, so Docker's timestamps use the same clock)."""

    def __init__(self, keep: int = KEEP_WINDOWS, booted_at: float | None = None) -> None:
        self.windows: collections.deque[tuple[float, float]] = collections.deque(maxlen=keep)
        self.lost_at: float | None = None
        #: When this host booted, and when this observer was first answered by its daemon: a container of
        #: an earlier boot whose end was recorded between the two was ended by the reboot.
        self.booted_at = host_boot_time() if booted_at is None else booted_at
        self.first_answered: float | None = None

    @property
    def ongoing(self) -> bool:
        return self.lost_at is not None

    def unanswered(self, at: float) -> None:
        """A request got no answer: the window now starts here (the latest such moment counts)."""
        self.lost_at = at

    def answered(self, at: float) -> None:
        """A request was answered: an outage in progress ends here."""
        if self.first_answered is None:
            self.first_answered = at
        if self.lost_at is not None:
            self.windows.append((self.lost_at, at))
            self.lost_at = None

    def window_of(self, started: float | None, finished: float | None) -> tuple[float, float] | None:
        """The window a container that ran from `started` to `finished` ended in, having started before it."""
        if started is None or finished is None:
            return None
        for lost, back in reversed(self.windows):
            if started < lost < finished <= back:
                return lost, back
        return None


    def ended_by_reboot(self, started: float | None, finished: float | None) -> bool:
        """Whether a container that ran from `started` to `finished` belonged to an earlier boot of this host
        and had its end recorded by the daemon of this one (before this observer first heard from it)."""
        boot, first = self.booted_at, self.first_answered
        if started is None or finished is None or boot is None or first is None:
            return False
        return started < boot < finished <= first


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S.%f")[:-3] + "Z"


def killed_by_removal(state: Mapping[str, Any]) -> bool:
    """Whether an ended container's inspect `State` says its exit 137 was the kill of a removal under way
    (`docker rm -f`), not the job's own exit nor an OOM kill."""
    return (state.get("Status") == STATUS_REMOVING and state.get("ExitCode") == EXIT_SIGKILL
            and state.get("OOMKilled") is not True)


def container_events(api: Any, container_id: str, state: Mapping[str, Any], actions: tuple[str, ...],
                     grace: float = 0.0) -> set[str]:
    """Which of `actions` the daemon `api` (docker-py's low-level client) logged for the container since it
    started, reading its event log up to `grace` seconds past now. What it raises goes to the caller."""
    started = docker_time(state.get("StartedAt"))
    since = int(started) - 1 if started is not None else None
    until = math.ceil(time.time() + grace)
    events = api.events(since=since, until=until, decode=True,
                        filters={"container": container_id, "event": list(actions)})
    try:
        return {str(e.get("status", e.get("Action"))) for e in events} & set(actions)
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


def oom_event(api: Any, container_id: str, state: Mapping[str, Any], grace: float = 0.0) -> bool:
    """Whether the daemon logged an `oom` event for the container since it started (`container_events`)."""
    return "oom" in container_events(api, container_id, state, ("oom",), grace)


def ending(state: Mapping[str, Any], outages: Outages, live_restore: Callable[[], bool],
           oom_logged: Callable[[], bool] = lambda: False) -> Ending:
    """How the container whose inspect `State` this is ended (it must have ended). `live_restore` asks the
    daemon whether it runs with live-restore, `oom_logged` whether it logged an OOM kill of this container
    (`oom_event`); each is called only when its answer decides, and whatever it raises goes to the caller
    (then nothing is decided: ask again later)."""
    code = int(state.get("ExitCode", -1))
    if code == 0:
        return Ending(0)
    if state.get("OOMKilled") is True:
        return Ending(code, OOM, REASON_OOM_KILLED, f"Docker State.OOMKilled, exit {code}")
    if code == EXIT_SIGKILL and oom_logged():
        return Ending(code, OOM, REASON_OOM_KILLED,
                      f"Docker logged an oom event of the container, exit {code} (State.OOMKilled unset: "
                      f"the daemon heard of the exit first)")
    if code == EXIT_SIGKILL and state.get("Status") == STATUS_DEAD:
        error = str(state.get("Error") or "no error recorded")[:200]
        return Ending(code, CRASHED, REASON_CONTAINER_REMOVED,
                      f"exit {code} of a container Docker marked dead: a removal under it (docker rm -f) "
                      f"killed it and did not finish ({error})")
    started, finished = docker_time(state.get("StartedAt")), docker_time(state.get("FinishedAt"))
    if outages.ended_by_reboot(started, finished):
        assert started is not None and finished is not None and outages.booted_at is not None
        return Ending(code, CRASHED, REASON_HOST_REBOOTED,
                      f"exit {code}: the container started at {_when(started)}, before this host booted at "
                      f"{_when(outages.booted_at)}, and the daemon started since recorded its end at "
                      f"{_when(finished)}")
    window = outages.window_of(started, finished)
    if window is None or finished is None:
        return Ending(code)
    seen = (f"exit {code} recorded at {_when(finished)}, after the daemon last went unanswered at "
            f"{_when(window[0])} and before it first answered again at {_when(window[1])}")
    if code == EXIT_UNKNOWN:
        return Ending(code, CRASHED, REASON_RESTART_LOST_EXIT,
                      f"{seen}: the restarted daemon could not read the container's exit")
    if not live_restore():
        return Ending(code, CRASHED, REASON_RESTART_STOPPED,
                      f"{seen}: the daemon runs without live-restore and stops its containers as it restarts")
    return Ending(code)
