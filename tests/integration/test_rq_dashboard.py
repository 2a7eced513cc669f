"""RQ's own dashboard (rq-dashboard, a test dependency) run against a live pool: a real redis-server, a real
jobpool worker with a job running, one finished and one failed. What the README's "RQ's own tools" says of
each of its pages is what this finds: they answer, except the two it names, for the reasons it gives."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable

from jobpool import JobState, Pool
from tests.support.constants import SUB
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.servers import free_port

#: The registries of RQ's queue the dashboard lists jobs of.
REGISTRIES = ("queued", "started", "finished", "failed", "deferred", "scheduled", "canceled")


def get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            reply.read()
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_rq_dashboards_pages_answer_on_a_live_pool(sub_pool: Pool, spawn: Callable[..., JobpoolProcess],
                                                   redis_url: str) -> None:
    spawn(**SUB)
    done = sub_pool.wait(sub_pool.enqueue("ignored", ["true"]).id, timeout=30)
    failed = sub_pool.wait(sub_pool.enqueue("ignored", ["sh", "-c", "exit 3"]).id, timeout=30)
    assert (done.state, failed.state) == (JobState.SUCCEEDED, JobState.FAILED)
    running = sub_pool.enqueue("ignored", ["sleep", "300"])
    eventually(lambda: sub_pool.get(running.id).identity, timeout=30, message="the job runs")
    port = free_port()
    # --json: jobpool's jobs are written with RQ's JSON serializer, never pickle.
    spawn("rq_dashboard", ("--redis-url", redis_url, "--port", str(port), "--bind", "127.0.0.1", "--json"))
    eventually(lambda: _answers(port), timeout=30, message="rq-dashboard serving")
    queue = sub_pool.keys.rq_queue_name
    pages = ["/", "/0/view/queues", "/0/view/workers", "/0/view/jobs", "/0/data/queues.json",
             f"/0/view/job/{running.id}", f"/0/data/job/{running.id}.json"]
    for registry in REGISTRIES:
        pages += [f"/0/view/jobs/{queue}/{registry}/8/asc/1", f"/0/data/jobs/{queue}/{registry}/8/asc/1.json"]
    answers = {page: get(port, page) for page in pages}
    assert all(code == 200 for code in answers.values()), answers
    # The two exceptions the README names. The workers' data while one runs a job: rq-dashboard reads each
    # worker's current job with RQ's default (pickle) serializer whatever --json says.
    assert get(port, "/0/data/workers.json") == 500
    # A finished job's page: jobpool deletes RQ's record of a delivery once its job ended (the row is
    # jobpool's: `jobpool show`), and rq-dashboard answers a missing job with a 500.
    assert get(port, f"/0/data/job/{done.id}.json") == 500
    sub_pool.cancel(running.id)
    assert sub_pool.wait(running.id, timeout=60).state is JobState.CANCELLED
    eventually(lambda: get(port, "/0/data/workers.json") == 200, timeout=30,
               message="the workers' data answers once no worker runs a job")


def _answers(port: int) -> bool:
    try:
        return get(port, "/0/data/queues.json") == 200
    except OSError:
        return False
