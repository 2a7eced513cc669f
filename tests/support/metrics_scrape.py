"""A real supervisor's `/metrics`, scraped over HTTP and parsed with prometheus-client's own parser: the
helpers of tests/integration/test_metrics.py and test_monitoring.py."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> tuple[set[str], Samples]:
    """The metric families and every sample of one scrape, keyed by (sample name, its labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    families, samples = set(), {}
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return families, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample of pool "it" (the tests' pool: tests/integration/conftest.py)."""
    return samples[(name, frozenset({"pool": "it", **labels}.items()))]


def serving(port: int) -> Callable[[], Any]:
    def ready() -> Any:
        try:
            return scrape(port)
        except OSError:
            return None
    return ready


def start_supervisor(spawn: Callable[..., JobpoolProcess], port: int, **env: str) -> JobpoolProcess:
    sup = spawn("jobpool.cli", ("supervisor",), JOBPOOL_METRICS_PORT=str(port), **env)
    eventually(serving(port), timeout=30, message=f"the supervisor serving /metrics on {port}")
    return sup
