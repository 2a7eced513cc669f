"""Which of the daemon's error words refuse the job's spec (jobpool/workers/executors/docker.py,
`names_the_spec`): the messages are those real daemons answered (tests/integration/test_spec_refusals.py),
and the daemon's own faults seen in soaks (bench/soak.py) must not read as the job's."""

from __future__ import annotations

from typing import Any

import pytest

from jobpool.spec import JobSpec, build_spec
from jobpool.workers.executors.refusals import names_the_spec


def spec(**fields: object) -> JobSpec:
    return build_spec({"image": "busybox", "command": ["app", "--x"], **fields}, bind_roots=("/srv",))


@pytest.mark.parametrize(("fields", "words"), [
    ({"workdir": "/bin/sh"}, "Cannot mkdir: /bin/sh is not a directory"),
    ({"network": "backend"}, "network backend not found"),
    ({"user": "nobody2"}, "unable to find user nobody2: no matching entries in passwd file"),
    ({}, 'OCI runtime create failed: exec: "app": executable file not found in $PATH'),
    ({"mounts": ["/srv/data:/data:ro"]}, "invalid mount config: bind source path does not exist: /srv/data"),
])
def test_words_that_name_the_spec_refuse_it(fields: dict[str, Any], words: str) -> None:
    assert names_the_spec(words, spec(**fields))


@pytest.mark.parametrize("words", [
    "failed to create shim task: OCI runtime create failed: ttrpc: closed",  # `sh` is the command
    "write /var/lib/docker/containers: database not open",
    "failed to update store for object type *libnetwork.endpoint: open : no such file or directory",
    "no space left on device",
])
def test_the_daemons_own_faults_do_not(words: str) -> None:
    assert not names_the_spec(words, spec(workdir="/work", user="1000", network="none", command=["sh", "-c"]))
