"""`jobpool status` and a worker whose work loop is stuck (its boot record's `stuck`, written by its heartbeat
thread: jobpool/workers/horses.py, `HorseWorker.stuck`): live, but not ready, and unhealthy whatever the
other workers can take (it holds work it cannot do)."""

from __future__ import annotations

from jobpool.exporter import gauges
from jobpool.status import Health, Slots, StatusReport, Sweep, judge
from jobpool.status.read import _workers

NOW = 1_000_000


def report(*records: dict[str, str], slots: int = 1) -> StatusReport:
    boots = [(f"b{i}", float(NOW)) for i in range(len(records))]
    return StatusReport(pool="p", redis_url="redis://", reachable=True, health=Health(), now_ms=NOW,
                        slots=Slots(0, slots), workers=_workers(boots, list(records), {}, NOW),
                        last_sweep=Sweep(at=NOW, age_ms=0))


def test_a_stuck_worker_is_live_but_not_ready() -> None:
    r = report({"pid": "7", "host": "h", "stuck": "horse 8 is stopped"})
    assert r.workers is not None and r.workers.live == 1
    assert r.workers.boots[0].stuck == r.workers.boots[0].to_dict()["stuck"] == "horse 8 is stopped"
    health = judge(r, sweep_interval_secs=1)
    assert health.reasons == ("fewer live workers than slots: 0 ready for 1 slot (1 stuck on its horse)",
                              "worker b0 on h cannot take work: horse 8 is stopped")


def test_a_worker_both_not_claiming_and_stuck_is_counted_once() -> None:
    r = report({"cannot_claim": "checkpoint root: read-only", "stuck": "horse 8 is stopped"}, {"host": "h"},
               slots=2)
    assert judge(r, sweep_interval_secs=1).reasons == (
        "fewer live workers than slots: 1 ready for 2 slots (1 not claiming: its host fails its check)",)


def test_a_stuck_worker_is_unhealthy_even_with_enough_ready_workers_besides_it() -> None:
    health = judge(report({"stuck": ""}, {"stuck": "standby horse 9 has not taken its job for 4s"}),
                   sweep_interval_secs=1)
    assert health.reasons == (
        "worker b1 on ? cannot take work: standby horse 9 has not taken its job for 4s",)


def test_a_record_without_the_field_and_a_draining_stuck_worker() -> None:
    """Records of workers from before the field count as ready; a draining worker is not ready already, and
    is not counted twice (but stuck, it still holds work it cannot do)."""
    r = report({"host": "h"}, {"draining": "1", "stuck": "horse 8 is stopped"}, slots=1)
    assert r.workers is not None and (r.workers.live, r.workers.draining) == (2, 1)
    assert judge(r, sweep_interval_secs=1).reasons == ("worker b1 on ? cannot take work: horse 8 is stopped",)


def test_the_ready_gauge_leaves_a_stuck_worker_out() -> None:
    r = report({"host": "h"}, {"stuck": "horse 8 is stopped"}, {"cannot_claim": "read-only"}, slots=3)
    (ready,) = [m for m in gauges(r) if m.name == "jobpool_workers_ready"]
    assert [s.value for s in ready.samples] == [1]
