"""Where a job's cgroup is found (jobpool/jobcgroup.py), read from a mount table and a cgroup file written
here: a v2-only host, a hybrid one, a cgroup namespace's view, and hosts that offer none."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from jobpool import jobcgroup
from jobpool.procid import identity_of
from jobpool.supervisor.probes import Absent, Unknown, probe_process

V2_ONLY = "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw\n"
HYBRID = ("31 23 0:27 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n"
          "32 31 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
          "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
V1_ONLY = "32 31 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
#: A container that sees its own cgroup mounted at /sys/fs/cgroup, without a cgroup namespace of its own.
SUBTREE = "50 40 0:30 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
ESCAPED = "35 24 0:30 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:  # a setter
    def set_host(mounts: str, cgroup: str = "0::/system.slice/worker.service\n") -> None:
        (tmp_path / "mountinfo").write_text(mounts)
        (tmp_path / "cgroup").write_text(cgroup)
        monkeypatch.setattr(jobcgroup, "MOUNTINFO", str(tmp_path / "mountinfo"))
        monkeypatch.setattr(jobcgroup, "OWN_CGROUP", str(tmp_path / "cgroup"))

    return set_host


@pytest.mark.parametrize(("mounts", "where"), [
    (V2_ONLY, "/sys/fs/cgroup/system.slice/worker.service/job"),
    (HYBRID, "/sys/fs/cgroup/unified/system.slice/worker.service/job"),
    (ESCAPED, "/mnt/cg two/system.slice/worker.service/job"),
])
def test_a_cgroup_s_directory_on_each_kind_of_host(host: Callable[..., None], mounts: str,
                                                   where: str) -> None:
    host(mounts)
    assert jobcgroup.directory(jobcgroup.own_path() + "/job") == Path(where)


def test_a_mount_of_a_subtree_shows_only_what_is_below_it(host: Callable[..., None]) -> None:
    host(SUBTREE, "0::/docker/abc\n")
    assert jobcgroup.directory("/docker/abc/job") == Path("/sys/fs/cgroup/job")
    with pytest.raises(jobcgroup.Unavailable, match="outside"):
        jobcgroup.directory("/docker/other/job")


@pytest.mark.parametrize(("mounts", "cgroup", "why"), [
    (V1_ONLY, "0::/\n", "no cgroup2 hierarchy"),
    (V2_ONLY, "4:memory:/x\n", "in no cgroup2 cgroup"),
])
def test_a_host_without_cgroup2_says_why_and_what_it_risks(host: Callable[..., None], mounts: str,
                                                           cgroup: str, why: str) -> None:
    host(mounts, cgroup)
    assert why in jobcgroup.unavailable()
    unkept = jobcgroup.promise_unkept()
    assert why in unkept and "setsid" in unkept and "outlive" in unkept


def test_a_recorded_cgroup_of_another_cgroup_namespace_is_not_judged(host: Callable[..., None]) -> None:
    host(V2_ONLY)
    other = {"cgroup": "/system.slice/worker.service/job", "cgroup_id": 1,
             "cgroupns": jobcgroup.namespace() + 1}
    assert jobcgroup.recorded(other) is None
    assert jobcgroup.still_populated(other) is None
    assert jobcgroup.still_populated({"cgroup": "/x"}) is None  # unreadable: not judged either


def test_a_gone_main_process_with_a_cgroup_out_of_sight_is_unknown(host: Callable[..., None]) -> None:
    """The supervisor's probe: the job's main process is gone, but whether a process it started still lives
    cannot be seen from here, so the slot is kept (jobpool/supervisor/probes.py)."""
    host(V2_ONLY)
    proc = subprocess.Popen(["sleep", "30"])
    identity = identity_of(proc.pid)
    proc.kill()
    proc.wait(10)
    recorded = {**identity, "cgroup": "/system.slice/worker.service/job", "cgroup_id": 1,
                "cgroupns": jobcgroup.namespace() + 1}
    assert isinstance(probe_process(recorded), Unknown)
    assert isinstance(probe_process(identity), Absent)  # none recorded: its main process alone, as before
