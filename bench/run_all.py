"""Run every benchmark, one after another, and print each one's result block.

    python3 -m bench.run_all [--quick]

Each benchmark starts its own private redis-server and dockerd and measures its baseline in the same run
(these machines are noisy: compare the ratios, not the absolute times). `--quick` runs smaller sizes.
The latest figures, with the machine and the command, are kept in BENCHMARKS.md.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BENCHES = [
    ("enqueue", ["enqueue"], ["enqueue", "--rounds", "3"]),
    ("slot handoff", ["handoff"], ["handoff", "--jobs", "15"]),
    ("throughput", ["throughput", "--blocks", "10"], ["throughput", "--jobs", "60", "--blocks", "3"]),
    ("handoff trace", ["handoff_trace"], ["handoff_trace", "--jobs", "10"]),
    ("sweep", ["sweep"], ["sweep"]),
    ("metrics scrape", ["scrape"], ["scrape", "--retained", "20000", "--repeat", "20"]),
    ("status read phases", ["status_phases"], ["status_phases", "--running", "1000", "--workers", "100"]),
    ("failure detection", ["failover"], ["failover", "--rounds", "2"]),
    ("memory", ["memory"], ["memory"]),
    ("lifetime", ["lifetime"], ["lifetime", "--quick"]),
    ("chaos soak", ["soak"], ["soak", "--jobs", "30", "--slots", "2", "--workers", "3"]),
    ("one Redis under a large fleet", ["scale"], ["scale", "--quick"]),
    ("live logs", ["livelog"], ["livelog", "--secs", "5"]),
    ("script calls spaced and back to back", ["cold_calls"], ["cold_calls", "--calls", "40"]),
]


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    failed = []
    for name, full, small in BENCHES:
        argv = small if quick else full
        print(f"== {name}: python3 -m bench.{' '.join(argv)}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, "-m", f"bench.{argv[0]}", *argv[1:]], cwd=ROOT)
        print(f"== {name}: exit {rc} in {time.monotonic() - t0:.0f}s\n", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
