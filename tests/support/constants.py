"""Constants the tests share, defined once: the test image, the fast timings, whether CI is running.

A plain module (not a conftest.py) so any test file can import it by name: ``from conftest import`` would be
ambiguous between tests/unit/conftest.py and tests/integration/conftest.py when both are collected.
"""

from __future__ import annotations

import os
from typing import Any

#: The busybox image tests/support/servers.py imports into the test dockerd
#: (`DockerDaemon.import_busybox_image`).
IMAGE = "jobpool-test:busybox"

#: True under CI: a missing service fails instead of skipping, and the state machine runs its long profile.
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")

#: The environment of workers that run jobs as local processes: no image, no daemon.
SUB = {"JOBPOOL_EXECUTOR": "subprocess"}

#: A job that checkpoints: on SIGTERM it records a step in its checkpoint directory and exits 75 (interrupted,
#: hand me back); run again, it finds the step and succeeds.
CHECKPOINTING = r"""
trap 'echo step > "$JOBPOOL_CHECKPOINT_DIR/ck"; echo interrupted; exit 75' TERM
if [ -f "$JOBPOOL_CHECKPOINT_DIR/ck" ]; then
  echo "resumed with $(cat "$JOBPOOL_CHECKPOINT_DIR/ck")"; exit 0
fi
echo started; while true; do sleep 0.1; done
"""

#: Fast timings for real jobpool processes (their environment), so fault tests finish in seconds; the same
#: code paths as the defaults.
FAST_ENV = {
    "JOBPOOL_HEARTBEAT_SECS": "0.2",
    "JOBPOOL_LEASE_SECS": "1",
    "JOBPOOL_DRAIN_TIMEOUT_SECS": "3",
    "JOBPOOL_STOP_GRACE_SECS": "2",
    "JOBPOOL_SWEEP_INTERVAL_SECS": "0.5",
    "JOBPOOL_CLAIM_GRACE_SECS": "5",
    "JOBPOOL_PROBE_TIMEOUT_SECS": "3",
}

#: Faster still, as `Settings` for an in-process `Pool` whose rows the test drives with no worker behind them:
#: a claimed row's lease lapses within a second, and one slot makes "the next job runs" observable.
FAST_SETTINGS: dict[str, Any] = {
    "lease_secs": 0.5, "heartbeat_secs": 0.1, "sweep_interval_secs": 0.2, "recovery_budget": 0,
    "claim_grace_secs": 1.0, "probe_timeout_secs": 5.0, "max_concurrent_jobs": 1, "stop_grace_secs": 1.0,
}

#: Under CI the hypothesis state machine (tests/unit/test_state_machine.py) runs at least this many steps on
#: each backend; the profile tests/conftest.py loads under CI is sized for it, and the test checks the count.
MACHINE_STEPS_CI = 5000
