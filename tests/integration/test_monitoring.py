"""The monitoring files shipped in deploy/: the Prometheus alerting rules
(deploy/prometheus/jobpool-alerts.yml) and the Grafana dashboard (deploy/grafana/jobpool-dashboard.json).
Every series they use is one a real supervisor's `/metrics` serves (scraped from a live pool on a real
redis-server), every expression parses (Prometheus's own `promtool`), and each alert fires when it should and
not when it should not (`promtool test rules` with deploy/prometheus/jobpool-alerts.test.yml)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobpool import Pool
from tests.support.constants import IN_CI
from tests.support.metrics_scrape import scrape, start_supervisor
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "jobpool-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "jobpool-alerts.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "jobpool-dashboard.json"
#: The alerts the README promises (issue: a wedge, unknown-held slots, no sweep, Redis away, its eviction
#: policy, strays).
PROMISED = {"JobpoolQueueWedged", "JobpoolSlotsHeldUnknown", "JobpoolNoSweep", "JobpoolRedisUnreachable",
            "JobpoolRedisEvictionPolicy", "JobpoolStrayContainers"}
_SERIES = re.compile(r"\bjobpool_[a-z_]+\b")


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in doc["panels"] for t in panel.get("targets", [])]
    queries = [v["definition"] for v in doc["templating"]["list"] if v["type"] == "query"]
    return exprs + queries


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if IN_CI:
            pytest.fail("promtool is not installed (apt-get install prometheus); CI is set", pytrace=False)
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return found


def test_every_series_the_rules_and_the_dashboard_use_is_served(
        pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    pool.set_limit("gpu", 2)  # a named limit, so its gauges have samples
    port = free_port()
    start_supervisor(spawn, port)
    def names() -> set[str]:
        return {name for name, _ in scrape(port)[1]}

    served = eventually(lambda: "jobpool_last_sweep_age_seconds" in (s := names()) and s, timeout=30,
                        message="a sweep recorded, and served")
    used: dict[str, list[str]] = {}  # name -> where
    for rule in alert_rules():
        for name in _SERIES.findall(rule["expr"]):
            used.setdefault(name, []).append(rule["alert"])
    for expr in dashboard_exprs():
        for name in _SERIES.findall(expr):
            used.setdefault(name, []).append("dashboard")
    assert used, "the files use jobpool's series"
    missing = {name: where for name, where in used.items() if name not in served}
    assert not missing, f"series used but not served by /metrics: {missing}"
    # And every family served is in the README's table of metrics.
    readme = (ROOT / "README.md").read_text()
    families = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in served}
    undocumented = sorted(f for f in families if f"`{f}" not in readme)
    assert not undocumented, f"served but not in the README's metrics table: {undocumented}"


def test_the_promised_alerts_are_there_with_what_an_operator_needs() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= PROMISED
    for rule in rules:
        notes = rule["annotations"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert notes["summary"] and "`jobpool " in notes["description"], f"{rule['alert']}: what to run"


def test_the_rules_parse_and_fire_as_their_tests_say() -> None:
    tool = promtool()
    check = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run([tool, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent,
                          capture_output=True, text=True, check=False)
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert tested == {r["alert"] for r in alert_rules()}, "every alert has its promtool test"


def test_every_dashboard_expression_parses(tmp_path: Path) -> None:
    """promtool parses each expression as a recording rule's (with the dashboard's variables given values)."""
    tool = promtool()
    exprs = [e.replace("$pool", "p") for e in dashboard_exprs() if not e.startswith("label_values(")]
    assert exprs
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"panel_{i}", "expr": e}
                                                        for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    check = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
