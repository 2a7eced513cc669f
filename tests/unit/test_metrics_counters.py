"""The pool's counters (the `metrics` hash): counted by the scripts in the step that makes each transition
(scripts/_lib.lua `count`, `event`, `observe_duration`), read back by jobpool/metrics.py, on fakeredis[lua]
and on a real redis-server. Every value asserted is the consequence of the calls the test makes.
"""

from __future__ import annotations

import math
import re
from importlib import resources
from typing import cast

import pytest

from jobpool import contract, metrics
from jobpool.api import Pool
from jobpool.contract import JOB_DURATION_BUCKETS, METRIC_REASONS
from jobpool.metrics import Histogram, read_counters, record_sweep
from jobpool.retention import prune
from jobpool.store.runner import SCRIPT_NAMES
from jobpool.supervisor import verdicts
from tests.support.attempts import claim
from tests.support.pool_helpers import Backend, enqueue, orphan, paused_pool, reconcile, row

SCRIPTS = resources.files("jobpool") / "scripts"


def fields(pool: Pool) -> dict[str, int]:
    counters = cast("dict[str, str]", pool.store.client.hgetall(pool.keys.metrics))
    return {k: int(float(v)) for k, v in counters.items()}


def transitions(pool: Pool) -> dict[tuple[str, str], int]:
    return dict(read_counters(pool.store).transitions)


def ran(pool: Pool, code: int = 0, reason: str = "", kind: str = "exit") -> str:
    """Enqueue a job, claim it and finish it as `kind` with `code`; its id."""
    job = enqueue(pool)
    att = claim(pool, job.id)
    att.set_container("cid", "daemon")
    att.finish(kind, code if kind != "error" else None, reason=reason)
    return job.id


def test_every_transition_is_counted_by_the_state_it_entered_and_its_reason(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    ran(pool, 0)
    assert transitions(pool) == {("queued", "enqueued"): 1, ("running", "promoted"): 1,
                                 ("running", "claimed"): 1, ("succeeded", "exit_0"): 1}
    pool.pause(None, reason="maintenance")
    pool.set_slots(2)
    got = transitions(pool)
    assert got[("none", "queue_paused")] == 1 and got[("none", "slots_set")] == 1


def test_exit_codes_share_one_label_and_the_row_keeps_the_real_one(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    ids = [ran(pool, code) for code in (1, 3, 137, 255)]
    assert transitions(pool)[("failed", "exit_code_nonzero")] == 4
    assert [row(pool, i)["error_reason"] for i in ids] == ["exit_code_1", "exit_code_3", "exit_code_137",
                                                          "exit_code_255"]
    assert not any(reason.startswith("exit_code_") and reason != "exit_code_nonzero"
                   for _, reason in transitions(pool))


def test_a_reason_with_a_detail_counts_by_its_word_and_free_text_as_other(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    ran(pool, kind="error", reason="launch_failed: pull access denied for nosuchimage")
    job = enqueue(pool)
    claim(pool, job.id)
    pool.evict(job.id, pool.get(job.id).attempt, reason="Operator Said So")
    got = transitions(pool)
    assert got[("failed", "launch_failed")] == 1
    assert got[("failed", "other")] == 1
    assert row(pool, job.id)["error_reason"] == "Operator Said So"


def test_a_finish_sent_again_is_not_counted_twice(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    att = claim(pool, job.id)
    assert att.finish("exit", 0) == "succeeded"
    before = fields(pool)
    assert att.finish("exit", 0) == "succeeded"  # its reply was lost: the same answer, nothing counted
    assert fields(pool) == before


def test_recoveries_count_the_budget_spent(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    orphan(backend, pool, job.id)
    assert reconcile(pool, job.id, "absent", budget=1)[1] == "queued"
    assert read_counters(pool.store).recoveries == 1
    assert transitions(pool)[("queued", "orphan_reconciled_no_container")] == 1
    pool.promote()
    orphan(backend, pool, job.id, boot="boot-b")
    assert reconcile(pool, job.id, "absent", budget=1)[1] == "failed"  # none left: no budget spent
    assert read_counters(pool.store).recoveries == 1
    job2 = enqueue(pool)
    att = claim(pool, job2.id)
    assert att.finish("crashed", 255, reason=contract.REASON_RESTART_LOST_EXIT) == "queued"
    assert read_counters(pool.store).recoveries == 2
    assert transitions(pool)[("queued", contract.REASON_RESTART_LOST_EXIT)] == 1


def test_terminal_jobs_land_in_the_bucket_of_their_time_since_enqueue(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    att = claim(pool, job.id)
    created = int(row(pool, job.id)["created_at"])
    pool.store.client.hset(pool.keys.job(job.id), "created_at", created - 100_000)  # enqueued 100 s earlier
    att.finish("exit", 0)
    stored = fields(pool)
    assert stored["job_duration:succeeded:120"] == 1 and stored["job_duration:succeeded:count"] == 1
    assert 100_000 <= stored["job_duration:succeeded:sum_ms"] < 110_000
    h = read_counters(pool.store).job_duration["succeeded"]
    assert h.count == 1 and 100 <= h.sum_seconds < 110
    cumulative = dict(h.buckets)
    assert cumulative[60] == 0 and cumulative[120] == 1 and cumulative[math.inf] == 1
    assert [b for b, _ in h.buckets] == [*JOB_DURATION_BUCKETS, math.inf]


def test_every_way_to_a_terminal_state_is_observed(backend: Backend) -> None:
    pool, jobs = paused_pool(backend, 3, slots=1)
    pool.cancel(jobs[2].id)  # queued -> cancelled
    pool.promote()
    pool.cancel(jobs[0].id)  # promoted, unclaimed -> cancelled
    claim(pool, jobs[1].id).finish("exit", 2)  # failed
    h = read_counters(pool.store).job_duration
    assert (h["cancelled"].count, h["failed"].count, h["succeeded"].count) == (2, 1, 0)
    assert all(hist.buckets[0][1] == hist.count for hist in h.values())  # all well under a second


def test_pruning_never_removes_the_counters(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1, keep_succeeded=1, keep_succeeded_secs=0)
    for _ in range(3):
        ran(pool, 0)
    before = fields(pool)
    assert prune(pool.store, actor=pool.actor).counts["succeeded"] == 2
    after = fields(pool)
    assert after.pop("transitions:none:pruned") == 1  # one event for the batch
    assert after == before
    assert pool.keys.metrics not in pool.keys.leftovers("x")


def test_the_sweep_record_and_its_counters_are_written_together(backend: Backend) -> None:
    pool = backend.pool()
    record_sweep(pool.store, '{"at": 1}', 30.0, {"present": 2, "unknown": 1, "absent": 0})
    record_sweep(pool.store, '{"at": 2}', 7000.0, {"exited": 1})
    assert pool.store.client.get(pool.keys.last_sweep) == '{"at": 2}'
    c = read_counters(pool.store)
    assert c.probes == {"present": 2, "exited": 1, "absent": 0, "unknown": 1}
    sweep = c.sweep_duration
    assert sweep is not None and sweep.count == 2 and sweep.sum_seconds == pytest.approx(7.03)
    cumulative = dict(sweep.buckets)
    assert cumulative[0.025] == 0 and cumulative[0.05] == 1 and cumulative[5.0] == 1 and cumulative[10.0] == 2
    assert c.sweep_overruns == 0
    record_sweep(pool.store, '{"at": 3}', 40_000.0, {}, overran=True)  # longer than its sweep interval
    c = read_counters(pool.store)
    assert c.sweep_overruns == 1 and c.to_dict()["sweep_overruns"] == 1
    assert c.sweep_duration is not None and c.sweep_duration.count == 3


def test_histogram_buckets_written_under_other_bounds_are_kept_cumulative() -> None:
    h = Histogram.from_fields({"1": 2, "7": 1, "inf": 4, "junk": 9}, (1, 5, 10), 1.0, 1500.0)
    assert h.buckets == ((1, 2), (5, 2), (10, 3), (math.inf, 7)) and h.count == 7 and h.sum_seconds == 1.5


def test_a_hand_edited_counter_reads_as_zero_not_as_an_error() -> None:
    c = metrics.parse({"transitions:failed:exit_0": "x", "recoveries": "2", "probes:absent": "nan?",
                       "someone:else": "1"})
    assert c.transitions == {("failed", "exit_0"): 0} and c.recoveries == 2 and c.probes["absent"] == 0


def _metric_reason(backend: Backend, reason: str) -> str:
    text = contract.lua_constants() + (SCRIPTS / "_lib.lua").read_text() + "\nreturn metric_reason(ARGV[1])"
    return str(backend.client.eval(text, 0, reason))


def test_every_reason_jobpool_writes_is_its_own_label(backend: Backend) -> None:
    """The vocabulary (contract.METRIC_REASONS) holds every reason the scripts and the supervisor write, so
    none of them is lost in 'other'."""
    written = {v for k, v in vars(verdicts).items() if k.startswith("REASON_")}
    written |= {v for k, v in vars(contract).items() if k.startswith("REASON_")}
    lib = (SCRIPTS / "_lib.lua").read_text()
    for body in [lib, *((SCRIPTS / f"{name}.lua").read_text() for name in SCRIPT_NAMES)]:
        written |= set(re.findall(r"event\([^,]+, [^,]+, [^,]+, [^,]+, '(\w+)'", body))
        written |= set(re.findall(r"end_running\([^,]+, [^,]+, [^,]+, [^,]+, '(\w+)'", body))
    written |= set(re.findall(r"return '\w+', '(\w+)'", lib))  # verdict_for_exit's reasons
    written |= {"evicted"}  # Pool.evict's default
    written.remove("exit_code_")  # the prefix of exit_code_<N>: one label for them all (the next test)
    assert {"exit_0", "shutdown_handback", "cancel", "promoted", "pruned", "dropped_corrupt_row"} <= written
    assert {r: _metric_reason(backend, r) for r in written} == {r: r for r in written}
    assert set(written) <= set(METRIC_REASONS)


@pytest.mark.parametrize(("reason", "label"), [
    ("exit_code_1", "exit_code_nonzero"), ("exit_code_255", "exit_code_nonzero"),
    ("exit_code_-1", "exit_code_nonzero"), ("launch_failed: no such image", "launch_failed"),
    ("bad_spec: image: required", "bad_spec"), ("", "none"), ("Operator Said So", "other"),
    ("exit_code_", "other"), ("x" * 500, "other"),
])
def test_reasons_outside_the_vocabulary_are_bounded(backend: Backend, reason: str, label: str) -> None:
    assert _metric_reason(backend, reason) == label
