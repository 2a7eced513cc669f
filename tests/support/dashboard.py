"""A dashboard of a test's pool seen through Starlette's TestClient, and logging in to it: shared by the
dashboard's integration tests (tests/integration/test_dashboard*.py)."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from jobpool import Pool
from jobpool.dashboard import create_app

#: The dashboard token the tests' clients log in with (strong enough for `Settings` to take it).
TOKEN = "dashboard-token-for-tests-0123456789"

BASE = "http://localhost:8765"


def client_for(pool: Pool, token: str = "", origin: str | None = BASE) -> TestClient:
    """A client of a dashboard of `pool`, sending the Origin a browser sends with every POST (None: none)."""
    dash = Pool(pool.store.client, pool.settings.replace(dashboard_token=token), actor="dashboard")
    # "localhost" stands for the browser's origin; the TestClient's own default host is "testserver".
    return TestClient(create_app(dash), base_url=BASE, headers={"origin": origin} if origin else None)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def log_in(c: TestClient) -> str:
    """Log in with the token; the session's CSRF token after it."""
    page = c.get("/login?next=/")
    r = c.post("/login", data={"token": TOKEN, "csrf": csrf_of(page.text), "next": "/"},
               follow_redirects=False)
    assert r.status_code == 303, r.text
    return csrf_of(c.get("/").text)
