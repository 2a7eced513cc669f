"""The parent of `jobpool up`'s redis-server: Redis stops only after the last worker is gone.

`up` stops its stack in order: workers drain (hand their jobs back through Redis), then Redis stops. When
`up` itself dies at once (SIGKILL), every child gets the kernel's parent-death signal at the same moment;
a redis-server child of `up` would then stop while the workers still drain, and their hand-backs would
find no Redis. So Redis is this process's child instead: on SIGTERM (from `up`, or the parent-death signal
when `up` died) it waits until the workers' lock (jobpool/up/state.py, WORKERS_LOCK) is free, bounded by
--wait seconds, then stops Redis (SIGTERM, then SIGKILL after --stop seconds). If Redis exits by itself,
this process exits with its code. Should this process be SIGKILLed, Redis gets SIGTERM from the kernel.

Usage: python -m jobpool.up.guard --workers-lock PATH --keep-fd N --wait SECS --stop SECS -- redis-server ...
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

from .state import dying_with_parent, lock_is_free


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="jobpool.up.guard")
    parser.add_argument("--workers-lock", type=Path, required=True)
    parser.add_argument("--keep-fd", type=int, action="append", default=[])
    parser.add_argument("--wait", type=float, required=True)
    parser.add_argument("--stop", type=float, required=True)
    parser.add_argument("command", nargs="+")
    args = parser.parse_args(argv)
    asked: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: asked.append(signum))
    child = subprocess.Popen(args.command, stdin=subprocess.DEVNULL, pass_fds=tuple(args.keep_fd),
                             preexec_fn=dying_with_parent())
    while not asked:
        code = child.poll()
        if code is not None:
            return code
        time.sleep(0.1)
    deadline = time.monotonic() + args.wait
    while not lock_is_free(args.workers_lock) and time.monotonic() < deadline:
        time.sleep(0.1)
    child.terminate()
    try:
        child.wait(args.stop)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
