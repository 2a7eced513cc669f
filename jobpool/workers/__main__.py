"""`python -m jobpool.workers [--burst]`: one worker configured from JOBPOOL_* (what `jobpool worker` runs).

Exit status: 0 after a stop (or an emptied queue with --burst), 1 when the worker dies of an error, 2 for a
bad setting (one line naming the variable, as the CLI prints it) or a Redis that may evict job rows (one line
naming its `maxmemory-policy`, checked before the worker writes anything: jobpool/store/redispolicy.py).
"""

from __future__ import annotations

import logging
import sys

from ..config import Settings
from ..errors import ConfigError, JobpoolError
from . import WorkerDied, run_worker


def main(argv: list[str]) -> int:
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        run_worker(settings, burst="--burst" in argv)
    except ConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    except (WorkerDied, JobpoolError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
