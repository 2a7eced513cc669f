"""Whether this worker's own host can launch a job, and the hold on claiming while it cannot.

An error of the worker's own host before a job starts (its checkpoint root or state directory cannot be
written, its Docker daemon refuses the connection: `HostFault`, jobpool/workers/executors/base.py) is no
fault of the job's: the horse hands the job back to its place (scripts/finish.lua, kind 'handback'), with no
recovery budget spent. But the job goes back to the head of the queue, and a worker that took it again at
once would hand it back again, in a tight loop of claims and handbacks. So a worker holds its claims (it
does not dequeue) while its host fails its check (docs/architecture.md, "Workers", "Host faults"):

- **The file system probe.** A thread makes and removes a marker directory under the directory a launch
  writes to first (`JOBPOOL_CHECKPOINT_ROOT` for Docker, `JOBPOOL_STATE_DIR` for the subprocess executor)
  every `JOBPOOL_HOST_CHECK_SECS`, every `RECHECK_SECS` while it fails; the first dequeue waits for the
  first probe. It runs off the main thread: on a hung network file system the probe itself hangs, and one
  that has not answered within `PROBE_HANG_SECS` counts as a failure. Probed whether or not a job met the
  fault, so `status` says so before one does, and a root that fails between two probes costs one job a
  handback at most.
- **What a horse met.** The horse that handed a job back says why on `FaultNote`, a small mapping it shares
  with its worker (made before any fork). Before its next dequeue the worker reads it, and waits for a probe
  made after it; a Docker fault is probed from then on by a ping of the daemon, until one answers. And each
  handback in a row doubles a pause before the next claim (`BACKOFF_FIRST_SECS` up to `BACKOFF_MAX_SECS`),
  so a fault the probes cannot see (a directory of its own gone bad) still costs a claim now and then, not
  a loop; a dequeue after a job that met no fault ends it.

While claims are held the boot record says why (`cannot_claim`), and `jobpool status` shows it and counts the
worker as not ready (jobpool/status/health.py).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rq.exceptions import StopRequested

from ..config import Settings
from .executors.base import CHECKPOINT_ROOT, DOCKER, STATE_DIR, HostFault

log = logging.getLogger("jobpool.worker")

#: How often the file system is probed while it fails (or a Docker fault is suspected); while it passes, every
#: `JOBPOOL_HOST_CHECK_SECS`.
RECHECK_SECS = 1.0
#: A probe that has not answered for this long counts as failed (a hung network file system).
PROBE_HANG_SECS = 10.0
#: The pause before the next claim after a handback, doubled for each one in a row, up to the max.
BACKOFF_FIRST_SECS = 1.0
BACKOFF_MAX_SECS = 30.0
#: How long the hold waits at a time before looking again (and sending RQ's worker heartbeat).
HOLD_SLICE_SECS = 0.5

_NOTE_BYTES = 1024


class FaultNote:
    """What the last horse's host fault was, in a page shared by the worker and the horses it forks (an
    anonymous shared mapping: each fork sees the same bytes). One horse runs at a time, and the worker reads
    the note only after its horse is done, so the two never write it at once."""

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, _NOTE_BYTES)

    def write(self, fault: HostFault) -> None:
        """In a horse: record the fault its launch met."""
        text = f"{fault.what}\n{fault.cause}".encode(errors="replace")[:_NOTE_BYTES - 2]
        self._map[2:2 + len(text)] = text
        self._map[:2] = len(text).to_bytes(2, "big")

    def take(self) -> tuple[str, str] | None:
        """In the worker: the fault noted since the last take, as (what, cause), and clear it."""
        size = int.from_bytes(self._map[:2], "big")
        if not size:
            return None
        what, _, cause = bytes(self._map[2:2 + size]).decode(errors="replace").partition("\n")
        self._map[:2] = b"\0\0"
        return what, cause


@dataclass
class _Probe:
    """The file system probe's last result, and the one in flight."""

    problem: str = ""
    done_round: int = -1  # none done yet
    started_at: float | None = None


class HostCheck:
    """The check of this worker's host (see the module's docstring). `directory` is what the file system probe
    writes under ('' for none: Docker's checkpoint volumes live in its daemon); `what` names it for the
    record; `every` is how often it probes while it passes; `ping` asks the Docker daemon (None for the
    subprocess executor); `publish(problem)` writes why claims are held ('' when they are not) to the boot
    record."""

    def __init__(self, directory: str, what: str, marker: str, every: float,
                 ping: Callable[[], object] | None, publish: Callable[[str], None],
                 identify: Callable[[], object] | None = None,
                 recheck: Callable[[], object] | None = None) -> None:
        """`identify`: establishes the Docker daemon's identity (jobpool/fleet/daemonid.py) when it was not at
        boot; until it does, no job is taken (a job's horse could only drop it, holding its slot a claim grace
        each time). `recheck`: called once a round after the probes, on this thread, for what the boot
        record says of the daemon but no claim waits on (its live-restore setting: workers/__init__.py);
        it keeps its own pace, and its errors are only logged."""
        self.directory, self.what, self.every, self.ping, self.publish = directory, what, every, ping, publish
        self.identify = identify
        self.recheck = recheck
        self._identity_problem = f"{DOCKER}: its identity is not established yet" if identify else ""
        self.marker = os.path.join(directory, f".jobpool-probe-{marker}") if directory else ""
        self.note = FaultNote()
        self._lock = threading.Lock()
        self._probe = _Probe()
        self._round = 0  # rounds asked for; the thread answers each with `done_round`
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._docker_problem = ""  # set by a horse's Docker fault, cleared by a ping that answers
        self._in_a_row = 0  # handbacks in a row, for the backoff
        self._not_before = 0.0  # monotonic: no claim before this (the backoff)
        self._backoff_why = ""
        self._published = ""
        self._publish_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="jobpool-host-check", daemon=True)

    # -- the probe thread ------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                asked = self._round
                self._probe.started_at = time.monotonic()
            problem = self._probe_directory()
            docker = self._probe_docker()
            identity = self._probe_identity()
            with self._lock:
                self._probe = _Probe(problem, asked, None)
            self._publish()
            self._recheck()
            failing = bool(problem or docker or identity)
            self._wake.wait(min(RECHECK_SECS, self.every) if failing else self.every)
            self._wake.clear()

    def _probe_directory(self) -> str:
        if not self.marker:
            return ""
        try:
            os.makedirs(self.directory, exist_ok=True)
            # A marker left by a probe of this boot cut short: it was made once, and goes now.
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.marker)
            os.rmdir(self.marker)
        except OSError as exc:
            return f"{self.what} {self.directory} is unusable: {exc}"
        return ""

    def _probe_docker(self) -> str:
        with self._lock:
            suspected = self._docker_problem
        if not suspected or self.ping is None:
            return ""
        try:
            self.ping()
        except Exception as exc:  # noqa: BLE001 - any failure to answer is the daemon still away
            with self._lock:
                self._docker_problem = f"{DOCKER} does not answer: {exc}"
            return self._docker_problem
        with self._lock:
            self._docker_problem = ""
        log.info("host check: the docker daemon answers again")
        return ""

    def _recheck(self) -> None:
        if self.recheck is None:
            return
        try:
            self.recheck()
        except Exception as exc:  # noqa: BLE001 - nothing waits on it: the probes go on regardless
            log.warning("host check: %s", exc)

    def _probe_identity(self) -> str:
        """Establish the daemon's identity while it is not (a daemon that did not answer at boot, or whose
        identity could not be read: daemonid.py); '' once it is."""
        with self._lock:
            missing = self._identity_problem
        if not missing or self.identify is None:
            return ""
        try:
            self.identify()
        except Exception as exc:  # noqa: BLE001 - any failure leaves the identity unknown, and claims held
            with self._lock:
                self._identity_problem = f"{DOCKER}: its identity cannot be established: {exc}"
            return self._identity_problem
        with self._lock:
            self._identity_problem = ""
        log.info("host check: the docker daemon's identity is established; claiming")
        return ""

    # -- the worker's main thread ----------------------------------------------------------------------------

    def problem(self) -> str:
        """Why claims are held now ('' when they are not)."""
        now = time.monotonic()
        with self._lock:
            probe, docker = self._probe, self._docker_problem
            not_before, why = self._not_before, self._backoff_why
        if probe.started_at is not None and now - probe.started_at > PROBE_HANG_SECS:
            return f"{self.what} {self.directory}: its probe has not answered for {PROBE_HANG_SECS:g} s"
        with self._lock:
            identity = self._identity_problem
        if probe.problem or docker or identity:
            return probe.problem or docker or identity
        if now < not_before:
            return f"pausing after handing a job back ({why})"
        return ""

    def before_dequeue(self, idle: Callable[[], None], stopping: Callable[[], bool]) -> None:
        """Hold until this worker's host passes its check: read what its last horse noted, then wait, calling
        `idle` (RQ's worker heartbeat) each slice, while `problem` says why. A stop ends the wait as it ends a
        dequeue, with RQ's `StopRequested`: raised by RQ's signal handler itself when the worker is idle, and
        here when `stopping()` says a stop was asked meanwhile."""
        noted = self.note.take()
        if noted is None:
            self._in_a_row = 0
            self._probed_after(0)  # the first probe, at boot; done at once ever after
        else:
            self._noted(*noted)
        logged = ""
        while True:
            problem = self.problem()
            self._publish()
            if not problem:
                if logged:
                    log.info("host check: passes again; claiming")
                return
            if problem != logged:
                log.warning("host check: not claiming: %s", problem)
                logged = problem
            if stopping():
                raise StopRequested
            idle()
            time.sleep(HOLD_SLICE_SECS)

    def _noted(self, what: str, cause: str) -> None:
        self._in_a_row += 1
        pause = min(BACKOFF_FIRST_SECS * 2 ** (self._in_a_row - 1), BACKOFF_MAX_SECS)
        with self._lock:
            self._not_before = time.monotonic() + pause
            self._backoff_why = f"{what}: {cause}"
            if what == DOCKER:
                self._docker_problem = f"{DOCKER}: {cause}"
            self._round += 1
            asked = self._round
        self._wake.set()
        self._probed_after(asked)  # so the hold does not pass on a result from before the fault

    def _probed_after(self, asked: int) -> None:
        """Wait until a probe of round `asked` or later is done (at most `PROBE_HANG_SECS`: then `problem`
        says the probe hangs)."""
        deadline = time.monotonic() + PROBE_HANG_SECS
        while time.monotonic() < deadline:
            with self._lock:
                if self._probe.done_round >= asked:
                    return
            time.sleep(0.02)

    def _publish(self) -> None:
        """Write why claims are held to the boot record when it changed (both threads call this)."""
        with self._publish_lock:
            problem = self.problem()
            if problem == self._published:
                return
            self._published = problem
            self.publish(problem)


def for_settings(settings: Settings, boot_id: str, ping: Callable[[], object] | None,
                 publish: Callable[[str], None], identify: Callable[[], object] | None = None,
                 recheck: Callable[[], object] | None = None) -> HostCheck:
    """The check of a worker with these settings: Docker probes its checkpoint root (if any), pings its
    daemon after a Docker fault and, given `identify`, establishes its identity before any claim; the
    subprocess executor probes its state directory."""
    every = settings.host_check_secs
    if settings.executor == "docker":
        return HostCheck(settings.checkpoint_root, CHECKPOINT_ROOT, boot_id, every, ping, publish, identify,
                         recheck)
    return HostCheck(os.path.abspath(settings.state_dir), STATE_DIR, boot_id, every, None, publish)
