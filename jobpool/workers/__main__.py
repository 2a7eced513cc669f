"""`python -m jobpool.workers [--burst]`: one worker configured from JOBPOOL_* (what `jobpool worker` runs)."""

from __future__ import annotations

import logging
import sys

from ..config import Settings
from . import run_worker

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run_worker(Settings.from_env(), burst="--burst" in sys.argv[1:])
