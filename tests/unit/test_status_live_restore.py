"""`jobpool status` and Docker daemons without live-restore (jobpool/status/health.py, `_live_restore_notes`):
the workers' boot records say what their daemon answered (workers/boot.py, `live_restore_of`); one warning
names the daemons without it, each once however many workers it has, and never makes the pool unhealthy."""

from __future__ import annotations

from jobpool.status import Health, Slots, StatusReport, Sweep, judge
from jobpool.status.read import _workers

NOW = 1_000_000


def report(*records: dict[str, str]) -> StatusReport:
    boots = [(f"b{i}", float(NOW)) for i in range(len(records))]
    return StatusReport(pool="p", redis_url="redis://", reachable=True, health=Health(), now_ms=NOW,
                        slots=Slots(0, 1), workers=_workers(boots, list(records), {}, NOW),
                        last_sweep=Sweep(at=NOW, age_ms=0))


def docker(daemon: str, host: str, live_restore: str) -> dict[str, str]:
    return {"host": host, "daemon_id": daemon, "executor": "docker", "live_restore": live_restore}


def test_daemons_without_live_restore_are_one_warning_naming_each_once() -> None:
    r = report(docker("jpd1:a@k1", "h1", "0"), docker("jpd1:a@k1", "h1", "0"), docker("jpd1:b@k2", "h2", "1"),
               docker("jpd1:c@k3", "h3", "0"), docker("jpd1:d@k4", "h4", ""))
    health = judge(r, sweep_interval_secs=1)
    assert health.healthy, health.reasons
    assert health.warnings == (
        "2 Docker daemon(s) run without live-restore, so restarting one stops the jobs running on it: "
        "jpd1:a@k1 (host h1: worker b0, b1); jpd1:c@k3 (host h3: worker b3). Turn it on: "
        "\"live-restore\": true in /etc/docker/daemon.json, then reload dockerd",)
    assert [w.live_restore for w in r.workers.boots] == [False, False, True, False, None]  # type: ignore[union-attr]


def test_no_warning_with_live_restore_unknown_or_no_docker() -> None:
    r = report(docker("jpd1:a@k1", "h1", "1"), docker("", "h2", ""), {"host": "h3", "executor": "subprocess"})
    assert judge(r, sweep_interval_secs=1).warnings == ()


def test_a_daemon_whose_identity_is_not_established_is_named_by_its_host() -> None:
    (warning,) = judge(report(docker("", "h9", "0")), sweep_interval_secs=1).warnings
    assert "the daemon of host h9 (host h9: worker b0)" in warning


class Api:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    def info(self) -> object:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_what_a_worker_records_of_its_daemons_answer() -> None:
    from jobpool.workers.boot import live_restore_of

    assert live_restore_of(Api({"LiveRestoreEnabled": True})) == "1"
    assert live_restore_of(Api({"LiveRestoreEnabled": False})) == "0"
    assert live_restore_of(Api({})) == ""  # a daemon that does not say: unknown, no warning
    assert live_restore_of(Api(ConnectionError("no answer"))) == ""


def test_a_swarm_node_is_advised_a_drain_never_live_restore() -> None:
    """Swarm refuses live-restore (dockerd would not start with it): a Swarm node's daemon gets the advice to
    drain the node before a restart, not the one to turn live-restore on."""
    from jobpool.workers.boot import live_restore_of

    def node(state: str) -> Api:
        return Api({"LiveRestoreEnabled": False, "Swarm": {"LocalNodeState": state}})

    assert live_restore_of(node("active")) == "swarm"
    assert live_restore_of(node("inactive")) == "0"
    r = report(docker("jpd1:a@k1", "h1", "swarm"), docker("jpd1:b@k2", "h2", "0"))
    warnings = judge(r, sweep_interval_secs=1).warnings
    drain, = [w for w in warnings if "Swarm" in w]
    assert "jpd1:a@k1" in drain and "docker node update --availability drain" in drain
    turn_on, = [w for w in warnings if "Turn it on" in w]
    assert "jpd1:b@k2" in turn_on and "jpd1:a@k1" not in turn_on
    assert [(w.live_restore, w.swarm) for w in r.workers.boots] == [(False, True), (False, False)]  # type: ignore[union-attr]
