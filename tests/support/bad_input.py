"""What the bad-input tests share (tests/integration/test_bad_input_*.py): ids and values, the rows of the
jobs that must stay unchanged, the CLI as a real process, and what a clean one-line refusal looks like.

Every door must refuse bad input cleanly: the API with a `JobpoolError` subclass and no write, the CLI with
one ``Error:`` line and exit 2 (bad input) or 1 (failure), never a traceback; workers and the supervisor keep
running past garbage, and good jobs still run to the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import cast

from jobpool import Job, JobState, Pool
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess

REPO = Path(__file__).resolve().parents[2]
#: A well-formed job id that no pool holds.
UNKNOWN_ID = "0" * 32
HUGE = "x" * 1_000_000

Jobs = dict[str, Job]


def rows(pool: Pool, ids: list[str]) -> dict[str, dict[str, str]]:
    """The raw hashes of `ids`: "unchanged for the other jobs" is checked on these."""
    return {job_id: cast("dict[str, str]",
                         pool.store.client.hgetall(pool.keys.job(job_id))) for job_id in ids}


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        module: str = "jobpool.cli", timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """`python -m jobpool.cli ARGS` as a real process, with only the JOBPOOL_* variables given."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("JOBPOOL_")}
    full.update({"PYTHONPATH": str(REPO), **(env or {})})
    return subprocess.run([sys.executable, "-m", module, *args], env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str | None:
    """None if `result` is a clean refusal (exit `code`, one `Error:` line, no traceback); else why not."""
    lines = result.stderr.strip().splitlines()
    if "Traceback" in result.stderr or "Traceback" in result.stdout:
        return f"traceback (exit {result.returncode}): {lines[-1] if lines else ''}"
    if result.returncode != code:
        return f"exit {result.returncode}, wanted {code}; stderr {result.stderr!r}"
    if len(lines) != 1 or not lines[0].startswith("Error: "):
        return f"stderr is not one 'Error:' line: {result.stderr!r}"
    return None


def alive(*procs: JobpoolProcess) -> bool:
    """True while every process runs; fails at once (not at a polling deadline) when one has died."""
    for p in procs:
        code = p.proc.poll()
        if code is not None:
            raise AssertionError(f"{p.log_path.name} exited with {code}:\n{p.log()[-3000:]}")
    return True


def runs_to_success(pool: Pool, job_id: str, procs: tuple[JobpoolProcess, ...], timeout: float) -> Job:
    """Wait for `job_id` to succeed while `procs` keep running; fails at once if it ends any other way."""
    def done() -> Job | None:
        alive(*procs)
        job = pool.get(job_id)
        assert job.state not in (JobState.FAILED, JobState.CANCELLED), (job, pool.logs(job_id))
        return job if job.state is JobState.SUCCEEDED else None

    return eventually(done, timeout=timeout, message=f"job {job_id} succeeded")
