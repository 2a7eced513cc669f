"""A jobpool worker that writes a timestamp at each step of the handoff path (bench/handoff_trace.py runs it
as `python3 -m bench._traced_worker`). Each step is wrapped from outside, by name; nothing in jobpool
changes."""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any

import docker.api.container as dac
from rq.worker import Worker

from jobpool.store.scriptcalls import ScriptCalls
from jobpool.workers import attempt, entry, rqworker
from jobpool.workers.__main__ import main

TRACE_DIR = os.environ["JP_TRACE_DIR"]


def mark(what: str) -> None:
    with open(f"{TRACE_DIR}/{os.getpid()}.log", "a") as f:
        f.write(f"{time.time():.6f} {what}\n")


def wrap(owner: Any, name: str, label: str, after: bool = True) -> None:
    orig = getattr(owner, name)

    @functools.wraps(orig)
    def traced(*args: Any, **kwargs: Any) -> Any:
        mark(label + ">")
        result = orig(*args, **kwargs)
        if after:
            mark(label + "<")
        return result

    setattr(owner, name, traced)


STEPS = [
    (rqworker.JobpoolWorker, "dequeue_job_and_maintain_ttl", "dequeue"),
    (Worker, "prepare_execution", "prep_exec"), (Worker, "fork_work_horse", "fork"),
    (Worker, "main_work_horse", "horse"), (Worker, "prepare_job_execution", "prep_job"),
    (entry, "run_job", "run_job"), (attempt.Attempt, "claim", "claim"), (attempt.Attempt, "finish", "finish"),
    (attempt.Attempt, "set_container", "set_container"), (ScriptCalls, "candidates", "candidates"),
    (dac.ContainerApiMixin, "create_container", "create"), (dac.ContainerApiMixin, "start", "start"),
    (dac.ContainerApiMixin, "wait", "wait"), (dac.ContainerApiMixin, "inspect_container", "inspect"),
    (dac.ContainerApiMixin, "logs", "logs"), (dac.ContainerApiMixin, "remove_container", "remove"),
]

if __name__ == "__main__":
    for owner, name, label in STEPS:
        wrap(owner, name, label, after=name not in ("fork_work_horse", "main_work_horse", "run_job"))
    sys.exit(main(sys.argv[1:]))
