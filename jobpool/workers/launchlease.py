"""The lease of an attempt while it launches.

The claim sets the lease, and the watcher renews it once the job runs; in between, a launch can take longer
than the lease (a daemon hiccup, a large image unpacked on vfs). A lease that lapsed there let the supervisor
judge the attempt absent, or "created, never started", and free its slot while the launch went on to start
the job. `LaunchLease` renews the lease from a small thread every heartbeat while the launch is in flight;
the watcher stops it once it watches the job (workers/watch.py: `launch_and_watch`). It renews the lease the
same way while the watcher reads a long log tail before its finish (`watch._finish`).
"""

from __future__ import annotations

import logging
import threading

from ..errors import NotFound, NotOwner, RedisUnavailable
from ..store.replies import Requests
from .attempt import Attempt

log = logging.getLogger("jobpool.worker")


class LaunchLease:
    """Renews `attempt`'s lease every `every` seconds until the block ends. A refusal ends the renewal (the
    fence before the job's start then says so: the renewal itself never stops a launch); Redis errors are
    logged and tried again at the next beat. `requests` holds the latest persisted requests read back."""

    def __init__(self, attempt: Attempt, every: float) -> None:
        self.attempt = attempt
        self.every = every
        self.requests: Requests | None = None
        #: The renewal was refused while the launch went on: whatever it started is not ours to run.
        self.refused = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jobpool-launch-lease", daemon=True)

    def _run(self) -> None:
        what = f"job {self.attempt.job_id} attempt {self.attempt.attempt}"
        while not self._stop.wait(self.every):
            try:
                self.requests = self.attempt.heartbeat()
            except (NotOwner, NotFound) as exc:
                log.warning("%s: lost the row while launching (%s)", what, exc)
                self.refused = True
                return
            except RedisUnavailable as exc:
                log.warning("%s: lease renewal during the launch failed (%s); will retry", what, exc)
            except Exception:  # a dead renewal thread would let the lease lapse silently
                log.exception("%s: lease renewal during the launch failed", what)

    def __enter__(self) -> LaunchLease:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        # A renewal stuck on an unanswering Redis is not waited for: at worst it renews the lease once more.
        self._thread.join(self.every)
