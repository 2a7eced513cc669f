"""Two removers of one finished container: the worker's deferred removal
(jobpool/workers/cleanup.py, `remove_finished`) and the inventory publisher's clean-up, or the supervisor's
leftover pass, can meet on one container; Docker then answers the second "removal ... is already in
progress" (409). A removal under way is as good as one's own: the worker must still remove the ended job's
checkpoint volume once the container is gone, not leave it behind (it did, 5-11 per 150-310 jobs in soaks).

Real dockerd: each container writes 200 MB to its own layer before it exits, so that removing it takes long
enough (vfs deletes the layer's files) for the worker's removal to be sent while the other one runs."""

from __future__ import annotations

import threading

import docker

from jobpool.workers import remove_finished
from jobpool.workers.executors.docker import DockerExecutor, checkpoint_volume
from tests.support.constants import IMAGE
from tests.support.polling import eventually

POOL = "race"


def finished_container(client: docker.DockerClient, job_id: str) -> str:
    """An exited container of `job_id` holding the job's checkpoint volume, its layer made large."""
    container = client.containers.create(
        IMAGE, ["sh", "-c", "dd if=/dev/zero of=/big bs=1M count=200 2>/dev/null"],
        labels={"jobpool.pool": POOL, "jobpool.job_id": job_id},
        mounts=[docker.types.Mount("/ckpt", checkpoint_volume(POOL, job_id), type="volume")])
    container.start()
    assert container.wait(timeout=60)["StatusCode"] == 0
    return str(container.id)


def removing(api: docker.APIClient, container_id: str) -> bool | None:
    """True while the daemon is removing it, None once it is gone, False before."""
    try:
        return bool(api.inspect_container(container_id)["State"]["Status"] == "removing")
    except docker.errors.NotFound:
        return None


def test_a_removal_already_in_progress_still_lets_the_checkpoint_go(docker_host: str) -> None:
    client = docker.DockerClient(base_url=docker_host, timeout=60)
    executor = DockerExecutor(docker.DockerClient(base_url=docker_host, timeout=60))
    met = 0
    try:
        for n in range(12):
            job_id = f"job{n}"
            cid = finished_container(client, job_id)
            other = threading.Thread(target=client.api.remove_container, args=(cid,), kwargs={"force": True})
            other.start()
            state = eventually(lambda cid=cid: removing(client.api, cid) is not False, timeout=30,
                               interval=0.002, message="the other removal began")
            if state is True:  # the worker's removal is sent while the other one runs
                met += 1
                remove_finished(executor, cid, POOL, job_id)
            other.join(60)
            if state is True:
                names = [v["Name"] for v in client.api.volumes()["Volumes"] or []]
                assert checkpoint_volume(POOL, job_id) not in names, "the ended job's checkpoint was left"
            else:  # gone before the worker could meet it: clean up and try again
                client.api.remove_volume(checkpoint_volume(POOL, job_id), force=True)
            if met >= 3:
                break
        assert met >= 1, "the race was never met: no removal was seen in progress"
    finally:
        executor.close()
        client.close()
