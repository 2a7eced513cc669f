"""The worker process's runtime: who this boot is, and whether a drain was asked for.

RQ forks a work horse per job; the horse inherits this module's state, which is how the RQ job function
(called with no arguments) finds its pool's store, its boot id and its settings without passing them through
RQ. It is also how a horse starts with its work already done: `prepare` (in the main process, once per boot)
imports the job path and builds the Docker client a horse launches with, so no horse pays for either
between a slot's release and its next container's create.
"""

from __future__ import annotations

import importlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..store.calls import Store
from .cleanup import Cleaner
from .executors import Executor, make_executor
from .hostcheck import HostCheck


@dataclass
class Runtime:
    store: Store
    boot_id: str
    #: The Docker daemon's identity (jobpool/fleet/daemonid.py), established at boot or, if the daemon did not
    #: answer then, before the first claim (workers/entry.py); '' for the subprocess executor.
    daemon_id: str = ""
    #: The Docker API version negotiated once at boot, so each job's client skips the negotiation.
    api_version: str | None = None
    #: Set in the horse when a drain (shutdown) is requested: monotonic time of the request.
    drain_requested_at: float | None = None
    left_running: list[str] = field(default_factory=list)
    #: The main process's remover of finished containers (workers/cleanup.py); None for the subprocess
    #: executor, whose leftovers the horse removes itself.
    cleaner: Cleaner | None = None
    #: The executor a horse launches with, built by `prepare` in the main process and never used there: each
    #: horse gets an untouched copy (no connection open yet) with the fork.
    prepared: Executor | None = None
    #: Called in a horse once its job's end is recorded and its container handed to `cleaner` (or removed):
    #: from then on the worker may take its next job while this horse writes RQ's record of the delivery
    #: (workers/horses.py, "Done before RQ's record").
    job_ended: Callable[[], None] | None = None
    #: Called in a horse once its job runs and that is recorded (launched, or adopted): the worker may fork
    #: its next standby (workers/horses.py, "After the launch").
    job_launched: Callable[[], None] | None = None
    #: The check of this worker's host (workers/hostcheck.py): a horse whose launch met a host fault notes it
    #: there, and the worker holds its claims until the host passes again. None outside a worker process.
    host_check: HostCheck | None = None

    def prepare(self) -> None:
        """Per-boot work a horse would otherwise repeat for every job: import the job functions (RQ imports
        them by name in the horse) and build the horse's executor once the daemon's API version is known."""
        importlib.import_module("jobpool.workers.entry")
        if self.prepared is None and (self.store.settings.executor != "docker" or self.api_version):
            self.prepared = make_executor(self.store.settings, self.daemon_id, self.api_version)

    def executor(self) -> Executor:
        """This horse's executor: the prepared one (taken: a horse runs one job), else a new one."""
        executor, self.prepared = self.prepared, None
        return executor or make_executor(self.store.settings, self.daemon_id, self.api_version)

    def request_drain(self) -> None:
        if self.drain_requested_at is None:
            self.drain_requested_at = time.monotonic()


_current: Runtime | None = None


def install(runtime: Runtime) -> None:
    global _current  # noqa: PLW0603 - one runtime per worker process, installed once at its start
    _current = runtime


def current() -> Runtime:
    if _current is None:
        raise RuntimeError("jobpool job functions run only inside a jobpool worker")
    return _current


#: The signal the worker sends its horse to start a drain. SIGTERM sent straight to the horse (a service
#: manager killing the whole process group) means the same.
DRAIN_SIGNAL = signal.SIGUSR1
