"""The README's five-minute tour, step by step, as a newcomer runs it: `jobpool up` in one shell (Docker
when a daemon answers: here the test daemon), each command of the tour's code block in another shell in the
same directory, and a check that each step does what its comment says.

The steps are read from README.md itself, so a tour that changes without this test breaks it. The one
substitution is the image: the test daemon has `jobpool-test:busybox`, not `busybox` (jobpool never pulls).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from jobpool import JobState, Pool
from tests.support.polling import eventually
from tests.support.upstack import Stacks, Up, fast_env

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "jobpool-test:busybox"

#: The tour's steps in order: the command's verb and what its comment promises (checked below).
EXPECTED = [
    ("enqueue", "prints the job id"),
    ("ls", "queued / running / finished jobs"),
    ("slots", "at most one job at a time"),
    ("enqueue", ""),
    ("events", "every transition"),
    ("pause", "the container gets SIGTERM; the job ends `paused`, its checkpoint kept"),
    ("resume", "back in the queue at its original place"),
    ("cancel", ""),
    ("show", "state, attempt, exit code, error_reason"),
    ("logs", "kept after the container is gone"),
    ("status", "exits 1 when unhealthy"),
]


@dataclass
class Step:
    argv: list[str]
    comment: str

    @property
    def verb(self) -> str:
        return self.argv[1]


def tour() -> list[Step]:
    """The commands of the README's tour block, with their comments."""
    section = (ROOT / "README.md").read_text().split("## A five-minute tour", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the README's tour has no sh code block"
    steps = []
    for line in block.group(1).splitlines():
        if line.strip():
            command, _, comment = line.partition("  #")  # a comment stands apart from its command
            steps.append(Step(shlex.split(command), comment.strip()))
    return steps


def test_the_tour_is_the_one_this_test_follows() -> None:
    steps = tour()
    assert all(s.argv[0] == "jobpool" for s in steps), [s.argv for s in steps]
    verbs = [verb for verb, _ in EXPECTED]
    assert [s.verb for s in steps] == verbs, "the README tour changed: update this test"
    for step, (verb, promise) in zip(steps, EXPECTED, strict=True):
        assert promise in step.comment, f"`jobpool {verb}` no longer says {promise!r}: {step.comment!r}"


@pytest.fixture
def start_up(tmp_path: Path) -> Iterator[Callable[..., Up]]:
    stacks = Stacks(tmp_path)
    yield stacks.start
    stacks.close()


class Shell:
    """A second shell in `up`'s directory: a newcomer's environment (no JOBPOOL_* settings, no flags)."""

    def __init__(self, cwd: Path, docker_host: str) -> None:
        self.cwd = cwd
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("JOBPOOL_")}
        self.env["DOCKER_HOST"] = docker_host
        self.job = ""

    def argv(self, step: Step) -> list[str]:
        args = [IMAGE if a == "busybox" and step.verb == "enqueue" else a for a in step.argv[1:]]
        args = [self.job if a == "JOB" else a for a in args]
        return [sys.executable, "-m", "jobpool.cli", *args]

    def run(self, step: Step, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(self.argv(step), cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode in ok, f"{step.argv} exited {done.returncode}: {done.stdout}{done.stderr}"
        return done


def test_the_readme_tour_does_what_it_says(tmp_path: Path, docker_host: str,
                                           start_up: Callable[..., Up]) -> None:
    steps = iter(tour())
    # The stop grace is longer than the job: a pause that only a SIGKILL could end would let the job run
    # to its end and succeed (what a container without an init did to this very tour).
    env = {**fast_env(), "DOCKER_HOST": docker_host, "JOBPOOL_STOP_GRACE_SECS": "600"}
    up = start_up("--executor", "auto", env=env)
    state = up.ready()
    assert f"executor: docker (a Docker daemon answered at {docker_host})" in up.log(), up.log()
    pool = Pool.from_url(state["redis_url"])
    shell = Shell(tmp_path, docker_host)
    client = docker.DockerClient(base_url=docker_host)
    try:
        _follow_the_tour(steps, shell, pool, client)
    finally:
        client.close()
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0, up.stderr()


def _follow_the_tour(steps: Iterator[Step], shell: Shell, pool: Pool, client: docker.DockerClient) -> None:
    # enqueue: prints the job id, and the job runs.
    out = shell.run(next(steps)).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", out), out
    first = shell.job = out
    eventually(lambda: _container(client, first, "running"), timeout=30, message="the tour's job runs")
    # ls: lists it.
    assert first in shell.run(next(steps)).stdout
    # slots 1: one job at a time, fleet-wide.
    shell.run(next(steps))
    assert pool.slots() == (1, 1)
    # enqueue a second job: it waits for the one slot.
    second = shell.run(next(steps)).stdout.strip()
    assert pool.get(second).state is JobState.QUEUED and pool.get(first).state is JobState.RUNNING
    # events --follow: every transition, until Ctrl-C.
    _follow_events(next(steps), shell, first, second)
    # pause JOB: the container gets SIGTERM, the job ends paused, its checkpoint kept; the second job runs.
    seq = pool.get(first).seq
    shell.run(next(steps))
    paused = pool.wait(first, timeout=60, states=[JobState.PAUSED, JobState.SUCCEEDED, JobState.FAILED])
    assert paused.state is JobState.PAUSED, (paused.state, paused.exit_code, paused.error_reason)
    assert paused.exit_code == 128 + signal.SIGTERM, "ended by its SIGTERM"
    assert client.volumes.get(f"jobpool-ckpt-{pool.keys.pool}-{first}"), "the checkpoint is kept"
    assert pool.wait(second, timeout=60).state is JobState.SUCCEEDED
    assert "second" in pool.logs(second)
    # resume JOB: back in the queue at its original place (and, with the slot free, running again).
    shell.run(next(steps))
    resumed = pool.get(first)
    assert resumed.state in (JobState.QUEUED, JobState.RUNNING) and resumed.seq == seq, resumed
    eventually(lambda: pool.get(first).state is JobState.RUNNING and _container(client, first, "running"),
               timeout=30, message="the resumed job runs again")
    # cancel JOB: it ends cancelled.
    shell.run(next(steps))
    assert pool.wait(first, timeout=60, states=[JobState.CANCELLED]).state is JobState.CANCELLED
    # show JOB: state, attempt, exit code, error reason.
    shown = shell.run(next(steps)).stdout
    for field, value in (("state", "cancelled"), ("attempt", "2"), ("exit code", str(128 + signal.SIGTERM)),
                         ("error reason", "")):
        assert re.search(rf"^{field}\s*:?\s+{value}", shown, re.M), f"{field!r} {value!r} not in:\n{shown}"
    # logs JOB: its output, kept after the container is gone.
    eventually(lambda: not _container(client, first), timeout=30, message="the job's containers are removed")
    assert "step 1\n" in shell.run(next(steps)).stdout
    # status: exits 0 while healthy, 1 when unhealthy (here: more slots than live workers).
    status = next(steps)
    assert "slots" in shell.run(status).stdout
    pool.set_slots(3)  # `up` runs two workers
    assert "fewer live workers than slots" in shell.run(status, ok=(1,)).stdout
    assert next(steps, None) is None


def _container(client: docker.DockerClient, job_id: str, status: str | None = None) -> bool:
    filters = {"label": f"jobpool.job_id={job_id}", **({"status": status} if status else {})}
    return bool(client.containers.list(all=status is None, sparse=True, filters=filters))


def _follow_events(step: Step, shell: Shell, first: str, second: str) -> None:
    log = shell.cwd / "events.log"
    with open(log, "wb") as out:
        follow = subprocess.Popen(shell.argv(step), cwd=shell.cwd, env=shell.env, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        seen = eventually(lambda: (text := log.read_text()) and first in text and second in text and text,
                          timeout=30, message="events --follow shows both jobs")
        assert re.search(rf"{first}\s+(queued|-) -> running", seen), seen
        assert re.search(rf"{second}\s+- -> queued", seen), seen
        follow.send_signal(signal.SIGINT)
        assert follow.wait(30) == 0, log.read_text()
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait(10)
