"""Run every benchmark, one after another, and print each one's result block.

    python3 bench/run_all.py [--quick]

Each benchmark starts its own private redis-server and dockerd and measures its baseline in the same run
(these machines are noisy: compare the ratios, not the absolute times). `--quick` runs smaller sizes.
The latest figures, with the machine and the command, are kept in BENCHMARKS.md.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

BENCHES = [
    ("enqueue", ["enqueue.py"], ["enqueue.py", "--rounds", "3"]),
    ("slot handoff", ["handoff.py"], ["handoff.py", "--jobs", "15"]),
    ("throughput", ["throughput.py", "--blocks", "10"], ["throughput.py", "--jobs", "60", "--blocks", "3"]),
    ("handoff trace", ["handoff_trace.py"], ["handoff_trace.py", "--jobs", "10"]),
    ("sweep", ["sweep.py"], ["sweep.py"]),
    ("metrics scrape", ["scrape.py"], ["scrape.py", "--retained", "20000", "--repeat", "20"]),
    ("failure detection", ["failover.py"], ["failover.py", "--rounds", "2"]),
    ("memory", ["memory.py"], ["memory.py"]),
    ("lifetime", ["lifetime.py"], ["lifetime.py", "--quick"]),
    ("chaos soak", ["soak.py"], ["soak.py", "--jobs", "30", "--slots", "2", "--workers", "3"]),
]


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    failed = []
    for name, full, small in BENCHES:
        argv = small if quick else full
        print(f"== {name}: python3 bench/{' '.join(argv)}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, str(HERE / argv[0]), *argv[1:]])
        print(f"== {name}: exit {rc} in {time.monotonic() - t0:.0f}s\n", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
