"""A worker boot: one process start, one id (uuid4, never reused), one `boot:<id>` record with a TTL.

The record is what `jobpool status` counts as a live worker. It is refreshed by a small thread in the
worker's main process, so it stays fresh while the work horse is busy and while RQ blocks on its queue.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..procid import kernel_boot_id, pid_namespace
from ..store.calls import Store
from ..store.keys import worker_name
from .outage import Outage, is_transient

log = logging.getLogger("jobpool.worker")


def live_restore_of(api: Any) -> str:
    """Whether the Docker daemon behind `api` (an SDK `APIClient`) runs with live-restore, as the boot record
    keeps it: "1", "0", "swarm" (off, on a Swarm node, where dockerd refuses to start with it), or '' when it
    cannot be told (no answer, or a daemon that does not say). Its `GET /info` `LiveRestoreEnabled`, as
    jobpool/exits.py reads it to judge an exit, and `Swarm.LocalNodeState`."""
    try:
        info = api.info()
    except Exception as exc:  # noqa: BLE001 - unknown, not a reason to stop: only a warning hangs on it
        log.debug("could not read the docker daemon's live-restore setting: %s", exc)
        return ""
    enabled = info.get("LiveRestoreEnabled")
    if enabled is False and (info.get("Swarm") or {}).get("LocalNodeState") == "active":
        return "swarm"
    return "1" if enabled is True else "0" if enabled is False else ""


class Boot:
    def __init__(self, store: Store, executor_name: str, daemon_id: str = "") -> None:
        self.store = store
        self.id = uuid.uuid4().hex
        self.key = store.keys.boot(self.id)
        self.ttl_ms = int(max(store.settings.lease_secs, 3 * store.settings.heartbeat_secs) * 1000)
        self.fields: dict[str, str | int] = {
            "host": socket.gethostname(), "pid": os.getpid(), "pidns": pid_namespace(),
            "kernel_boot_id": kernel_boot_id(), "daemon_id": daemon_id, "executor": executor_name,
            "started_at": int(time.time() * 1000), "draining": 0, "role": "worker",
            # Why this worker holds its claims ('' when it does not): its host fails its check
            # (workers/hostcheck.py).
            "cannot_claim": "",
            # Whether its Docker daemon runs with live-restore: "1", "0", or '' unknown (not asked yet, or
            # no Docker). Without it a daemon restart stops the running jobs, so `status` warns
            # (jobpool/status/health.py; README.md, "The container contract").
            "live_restore": "",
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Shared with the process's work loop (jobpool/workers/rqworker.py): one outage, logged once.
        self.outage = Outage(f"worker {worker_name(store.keys.pool, self.id)}")
        #: Why the work loop cannot take work ('' when it can: `HorseWorker.stuck`), asked at each beat and
        #: recorded as `stuck`: this thread beats on while the loop is wedged, and `jobpool status` must not
        #: count such a worker as ready (jobpool/status/health.py).
        self.stuck: Callable[[], str] | None = None

    def beat(self) -> None:
        now = int(time.time() * 1000)
        record = {**self.fields, "heartbeat_at": now, "stuck": self.stuck() if self.stuck is not None else ""}
        self.store.beat_boot(self.id, record, self.ttl_ms, now)

    def set_draining(self) -> None:
        self.fields["draining"] = 1
        try:
            self.beat()
        except Exception as exc:  # noqa: BLE001 - a drain must go on even if Redis is away
            log.warning("could not mark boot %s draining: %s", self.id, exc)

    def set_cannot_claim(self, problem: str) -> None:
        """Say in the record why this worker holds its claims ('' once it claims again), at once."""
        self.fields["cannot_claim"] = problem
        try:
            self.beat()
        except Exception as exc:  # noqa: BLE001 - the next heartbeat writes it; the hold goes on regardless
            log.warning("could not update boot %s: %s", self.id, exc)

    def set_live_restore(self, value: str) -> None:
        """Record what the daemon said of live-restore (`live_restore_of`); the next heartbeat writes it. An
        unknown answer ('') keeps the last known one: a daemon that did not answer once has not changed."""
        if value:
            self.fields["live_restore"] = value

    def start(self) -> None:
        self.beat()
        self._thread = threading.Thread(target=self._run, name="jobpool-boot-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval = self.store.settings.heartbeat_secs
        while not self._stop.wait(interval):
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - keep beating through a Redis restart
                if is_transient(exc):
                    self.outage.failed("the boot heartbeat", exc)
                else:
                    log.warning("boot heartbeat failed: %s", exc)
            else:
                self.outage.recovered()

    def stop(self) -> None:
        """A clean exit removes the record at once; a crash lets it expire."""
        self._stop.set()
        try:
            self.store.remove_boot(self.id)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not remove boot record: %s", exc)

    def describe(self) -> str:
        return json.dumps({"boot_id": self.id, **self.fields})
