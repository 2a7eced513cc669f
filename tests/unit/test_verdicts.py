"""The verdict table (docs/architecture.md, 'Evidence and verdicts'), row by row, as pure functions (no
Redis, no Docker). What a verdict does to the row is checked against the scripts in test_exit_verdicts.py."""

from __future__ import annotations

import pytest

from jobpool.config import Settings
from jobpool.supervisor.probes import (
    Absent,
    Present,
    Unknown,
    _summary_result,
    parse_exit_code,
    probe_process,
)
from jobpool.supervisor.verdicts import (
    DispatchFacts,
    Kind,
    ProbeKind,
    RowSnapshot,
    decide,
    probe_needed,
)

S = Settings(claim_grace_secs=60, job_stale_seconds=3600, recovery_budget=1)
NOW = 10_000_000


def claimed(**kw: object) -> RowSnapshot:
    base: dict[str, object] = {"id": "j1", "attempt": 2, "owner_boot": "b1", "claimed_at": NOW - 1000,
                               "promoted_at": NOW - 2000}
    base.update(kw)
    return RowSnapshot(**base)  # type: ignore[arg-type]


def unclaimed(age_secs: float) -> RowSnapshot:
    return RowSnapshot(id="j1", attempt=1, promoted_at=NOW - int(age_secs * 1000))


# ---- promoted, never claimed ---------------------------------------------------------------------------


@pytest.mark.parametrize("facts", [DispatchFacts(in_queue=True), DispatchFacts(in_intermediate=True),
                                   DispatchFacts(in_started=True)])
def test_unclaimed_and_held_by_rq_is_left_however_old(facts: DispatchFacts) -> None:
    v = decide(unclaimed(10 * 3600), False, None, facts, NOW, S)
    assert v.kind is Kind.KEEP


@pytest.mark.parametrize("facts", [DispatchFacts(in_intermediate=True, taken_secs=S.claim_grace_secs),
                                   DispatchFacts(in_started=True, taken_secs=S.claim_grace_secs + 1)])
def test_a_delivery_taken_but_unclaimed_past_the_grace_is_redispatched(facts: DispatchFacts) -> None:
    v = decide(unclaimed(61), False, None, facts, NOW, S)
    assert (v.kind, v.reason) == (Kind.REDISPATCH, "lost_dispatch") and "without a claim" in v.evidence
    # Back on the queue too (RQ's maintenance re-enqueued it): waiting for a worker, left.
    assert decide(unclaimed(61), False, None, DispatchFacts(in_queue=True, in_intermediate=True,
                                                            taken_secs=999), NOW, S).kind is Kind.KEEP


def test_unclaimed_within_grace_is_left_even_if_lost() -> None:
    assert decide(unclaimed(59), False, None, DispatchFacts(), NOW, S).kind is Kind.KEEP


def test_unclaimed_lost_past_grace_is_redispatched() -> None:
    v = decide(unclaimed(61), False, None, DispatchFacts(), NOW, S)
    assert (v.kind, v.reason) == (Kind.REDISPATCH, "lost_dispatch")
    assert "in none of RQ's" in v.evidence and "attempt 1" in v.evidence


# ---- claimed ---------------------------------------------------------------------------------------------


def test_lease_present_keeps_whatever_the_probe() -> None:
    for probe in (None, Absent(), Unknown("x"), Present(running=False, exit_code=1)):
        assert decide(claimed(), True, probe, None, NOW, S).kind is Kind.KEEP


def test_lease_present_past_stale_limit_only_warns() -> None:
    row = claimed(claimed_at=NOW - 3601 * 1000)
    v = decide(row, True, None, None, NOW, S)
    assert (v.kind, v.reason, v.stale) == (Kind.WARN, "stale", True)
    assert "evict-stale" in v.evidence


def test_stale_is_evicted_only_by_the_operator() -> None:
    row = claimed(claimed_at=NOW - 3601 * 1000)
    v = decide(row, True, None, None, NOW, S, evict_stale=True)
    assert (v.kind, v.reason) == (Kind.EVICT, "stale_evicted")
    assert decide(claimed(), True, None, None, NOW, S, evict_stale=True).kind is Kind.KEEP  # not stale


def test_lease_gone_container_running_is_adopted() -> None:
    v = decide(claimed(), False, Present(running=True, container_id="c1"), None, NOW, S)
    assert (v.kind, v.container_id) == (Kind.ADOPT, "c1")


def test_lease_gone_container_exited_finishes_from_its_code() -> None:
    v = decide(claimed(), False, Present(running=False, exit_code=7, container_id="c1"), None, NOW, S)
    assert (v.kind, v.exit_code, v.reason) == (Kind.EXITED, 7, "container_exited")


def test_lease_gone_no_container_is_absent_naming_the_evidence() -> None:
    v = decide(claimed(), False, Absent(), None, NOW, S)
    assert (v.kind, v.reason) == (Kind.ABSENT, "orphan_reconciled_no_container")
    v = decide(claimed(), False, Absent(never_started=True), None, NOW, S)
    assert v.reason == "orphan_reconciled_never_started"


@pytest.mark.parametrize("probe", [Unknown("daemon unreachable"), None])
def test_lease_gone_unknown_keeps_the_slot_and_warns_with_the_reason(probe: Unknown | None) -> None:
    v = decide(claimed(), False, probe, None, NOW, S)
    assert (v.kind, v.reason) == (Kind.WARN, "probe_unknown")
    if probe is not None:
        assert "daemon unreachable" in v.evidence


def test_subprocess_rows() -> None:
    row = claimed(executor="subprocess", identity='{"pid": 1}')
    assert decide(row, False, Absent(), None, NOW, S).reason == "orphan_reconciled_dead_pid"
    alive = decide(row, False, Present(running=True), None, NOW, S)
    assert (alive.kind, alive.reason) == (Kind.WARN, "orphan_process_alive")  # never adopted
    stale = claimed(executor="subprocess", claimed_at=NOW - 3601 * 1000)
    assert decide(stale, False, Present(running=True), None, NOW, S, evict_stale=True).kind is Kind.EVICT


def test_which_rows_are_probed() -> None:
    assert probe_needed(unclaimed(1), False) is None
    assert probe_needed(claimed(), True) is None
    assert probe_needed(claimed(), False) is ProbeKind.CONTAINER
    assert probe_needed(claimed(executor="subprocess"), False) is ProbeKind.PROCESS


def test_row_snapshot_from_row_fills_executor_and_daemon_from_the_boot_record() -> None:
    row = {"id": "j", "attempt": "3", "owner_boot": "b", "identity": "", "daemon_id": ""}
    snap = RowSnapshot.from_row(row, "docker", {"executor": "subprocess", "daemon_id": "D"})
    assert (snap.executor, snap.daemon_id, snap.attempt, snap.lease_value) == ("subprocess", "D", 3, "b:3")
    assert RowSnapshot.from_row({**row, "identity": "{}"}, "docker").executor == "subprocess"
    assert RowSnapshot.from_row(row, "docker").executor == "docker"


# ---- reading the daemon's answer ----------------------------------------------------------------------


@pytest.mark.parametrize(("status", "code"), [
    ("Exited (0) 3 seconds ago", 0), ("Exited (137) 2 hours ago", 137),
    ("Up 5 minutes", None), ("", None), (None, None), ("Created", None),
])
def test_parse_exit_code(status: str | None, code: int | None) -> None:
    assert parse_exit_code(status) == code


def test_container_summaries() -> None:
    assert _summary_result({"Id": "a", "State": "running", "Status": "Up 1 second"}) == Present(
        running=True, container_id="a", detail="container a running")
    assert _summary_result({"Id": "a", "State": "paused", "Status": "Up (Paused)"}).running  # type: ignore[union-attr]
    exited = _summary_result({"Id": "a", "State": "exited", "Status": "Exited (3) 1 second ago"})
    assert isinstance(exited, Present) and (exited.running, exited.exit_code) == (False, 3)
    created = _summary_result({"Id": "a", "State": "created", "Status": "Created"})
    assert isinstance(created, Absent) and created.never_started
    assert _summary_result({"Id": "a", "State": "dead", "Status": "Dead"}) is None  # needs an inspect
    assert isinstance(_summary_result({"Id": "a", "State": "weird", "Status": "?"}), Unknown)


def test_probe_process_without_an_identity_is_unknown() -> None:
    assert isinstance(probe_process(None), Unknown)
    assert isinstance(probe_process("not json"), Unknown)
