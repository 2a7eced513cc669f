"""The dashboard's sessions and POST checks (jobpool/dashboard/auth.py) through Starlette's TestClient,
against a real redis-server: the origin check stands on its own (Origin `null`, another origin, or none is
refused even with the right CSRF token), no page writes the session's cookie, logout and a new token end a
session at once on the server, a session expires there, and logins are limited per client and for all,
logged without the guess. The same in a real browser: tests/integration/test_dashboard_browser.py."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import cast

import httpx2 as httpx
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from jobpool import JobState, Pool
from jobpool.dashboard import create_app
from jobpool.dashboard.auth import LOGIN_COOKIE, SESSION_COOKIE, SESSION_SECS
from jobpool.dashboard.ratelimit import GLOBAL_BURST, LOGIN_BURST
from tests.support.constants import IMAGE
from tests.support.dashboard import BASE, TOKEN, client_for, csrf_of, log_in


@pytest.fixture
def rw(pool: Pool) -> Iterator[TestClient]:
    with client_for(pool, TOKEN) as c:
        yield c


def session_cookies(r: httpx.Response) -> list[str]:
    """The Set-Cookie lines of a response that name the session's cookie."""
    return [c for c in r.headers.get_list("set-cookie") if c.startswith(f"{SESSION_COOKIE}=")]


def another_browser(c: TestClient, address: str = "testclient") -> TestClient:
    """A client of the same dashboard (the same sessions) holding none of `c`'s cookies."""
    return TestClient(c.app, base_url=BASE, headers={"origin": BASE}, client=(address, 50001))


# ---- item 2: the origin check means something on its own ------------------------------------------

@pytest.mark.parametrize("headers", [
    {"origin": "null"},  # what a page with `Referrer-Policy: no-referrer`, or a sandboxed frame, sends
    {"origin": "http://localhost:8766"},  # another port of the same host: same site, another origin
    {"origin": "https://localhost:8765"},  # another scheme
    {"origin": "http://evil.test"},
    {"origin": "", "referer": "http://evil.test/page"},
])
def test_a_post_from_another_or_no_origin_is_refused_even_with_the_csrf_token(
        pool: Pool, rw: TestClient, headers: dict[str, str]) -> None:
    pool.set_slots(0)
    job = pool.enqueue(IMAGE, ["true"])
    csrf = log_in(rw)
    r = rw.post(f"/actions/jobs/{job.id}/pause", data={"csrf": csrf}, headers=headers, follow_redirects=False)
    assert r.status_code == 403 and "another origin" in r.text, (headers, r.status_code)
    assert pool.get(job.id).state is JobState.QUEUED
    r = rw.post(f"/actions/jobs/{job.id}/pause", data={"csrf": csrf}, follow_redirects=False)  # own origin
    assert r.status_code == 303 and pool.get(job.id).state is JobState.PAUSED


def test_a_post_naming_no_origin_is_refused_but_a_same_origin_referer_does(pool: Pool) -> None:
    pool.set_slots(0)
    job = pool.enqueue(IMAGE, ["true"])
    with client_for(pool, TOKEN, origin=None) as c:
        page = c.get("/login")
        # The login itself: refused without Origin or Referer, before the token is looked at.
        r = c.post("/login", data={"token": TOKEN, "csrf": csrf_of(page.text)}, follow_redirects=False)
        assert r.status_code == 403 and "no origin" in r.text
        r = c.post("/login", data={"token": TOKEN, "csrf": csrf_of(page.text)},
                   headers={"referer": f"{BASE}/login"}, follow_redirects=False)
        assert r.status_code == 303
        csrf = csrf_of(c.get("/").text)
        r = c.post("/actions/queue/pause", data={"csrf": csrf}, follow_redirects=False)
        assert r.status_code == 403 and "no origin" in r.text
        r = c.post(f"/actions/jobs/{job.id}/pause", data={"csrf": csrf}, headers={"referer": f"{BASE}/"},
                   follow_redirects=False)
        assert r.status_code == 303 and pool.get(job.id).state is JobState.PAUSED
    assert not pool.stats()["queue_paused"]


def test_a_login_from_origin_null_is_refused(pool: Pool, rw: TestClient) -> None:
    page = rw.get("/login")
    r = rw.post("/login", data={"token": TOKEN, "csrf": csrf_of(page.text)}, headers={"origin": "null"},
                follow_redirects=False)
    assert r.status_code == 403 and not session_cookies(r)


def test_the_pages_keep_the_origin_of_their_own_posts(pool: Pool, rw: TestClient) -> None:
    """`no-referrer` makes a browser send `Origin: null` with the pages' own forms; `same-origin` keeps it."""
    assert rw.get("/").headers["referrer-policy"] == "same-origin"


# ---- item 3: no page writes the session's cookie ----------------------------------------------------

def test_no_page_sets_the_session_cookie(pool: Pool, rw: TestClient) -> None:
    """A link from another site brings no SameSite=Strict cookie: the page it opens must not write a fresh
    session cookie over the one the browser holds (that logged the browser out)."""
    job = pool.enqueue(IMAGE, ["true"])
    csrf = log_in(rw)
    held = rw.cookies.get(SESSION_COOKIE)
    with another_browser(rw) as other:  # the same dashboard seen without its cookies: a cross-site link
        for path in ("/", f"/jobs/{job.id}", "/jobs", "/events", "/login", "/no/such/page"):
            r = other.get(path)
            assert not session_cookies(r), path
            assert 'id="pool-actions"' not in r.text and 'id="job-actions"' not in r.text
        login_form = other.get("/login").headers["set-cookie"]
        assert login_form.startswith(f"{LOGIN_COOKIE}=") and "Path=/login" in login_form
    assert rw.cookies.get(SESSION_COOKIE) == held
    assert 'id="pool-actions"' in rw.get("/").text  # still logged in
    r = rw.post("/actions/queue/pause", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and pool.stats()["queue_paused"]
    # The login page of a browser already logged in sends it on.
    r = rw.get("/login?next=/events", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/events" and not session_cookies(r)


# ---- item 4: sessions end on the server ---------------------------------------------------------

def test_logout_ends_the_session_for_every_copy_of_its_cookie(pool: Pool, rw: TestClient) -> None:
    csrf = log_in(rw)
    copied = rw.cookies.get(SESSION_COOKIE)
    assert copied
    out = rw.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303
    with another_browser(rw) as thief:
        thief.cookies.set(SESSION_COOKIE, copied)
        r = thief.post("/actions/queue/pause", data={"csrf": csrf}, follow_redirects=False)
        assert r.status_code == 403 and "log in" in r.text
        assert 'id="pool-actions"' not in thief.get("/").text
    assert not pool.stats()["queue_paused"]
    assert any("Max-Age=0" in c for c in session_cookies(out))  # and the browser's own copy goes


def test_a_new_token_ends_the_sessions_of_the_old(pool: Pool) -> None:
    """The sessions remember a keyed fingerprint of the token they were made under; the dashboard asks its
    settings on every request, so a session of another token is dead without a restart."""
    dash = Pool(pool.store.client, pool.settings.replace(dashboard_token=TOKEN), actor="dashboard")
    app = create_app(dash)
    with TestClient(app, base_url=BASE, headers={"origin": BASE}) as c:
        csrf = log_in(c)
        assert c.post("/actions/queue/pause", data={"csrf": csrf}, follow_redirects=False).status_code == 303
        new = "a0d8c7e1f29b4e6f8a3c5d7e9f1b2c4d"
        app.state.dashboard.settings = dash.settings.replace(dashboard_token=new)
        r = c.post("/actions/queue/resume", data={"csrf": csrf}, follow_redirects=False)
        assert r.status_code == 403 and "log in" in r.text
        assert pool.stats()["queue_paused"]
        page = c.get("/login")
        assert c.post("/login", data={"token": TOKEN, "csrf": csrf_of(page.text)}).status_code == 403
        r = c.post("/login", data={"token": new, "csrf": csrf_of(page.text)}, follow_redirects=False)
        assert r.status_code == 303


def test_a_session_expires_on_the_server(pool: Pool, rw: TestClient) -> None:
    csrf = log_in(rw)
    sessions = cast(Starlette, rw.app).state.dashboard.auth.sessions
    now = sessions.clock()
    sessions.clock = lambda: now + SESSION_SECS + 1
    r = rw.post("/actions/queue/pause", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 403 and "log in" in r.text and len(sessions) == 0


# ---- item 5: logins are limited and logged ------------------------------------------------------

def try_token(c: TestClient, token: str) -> httpx.Response:
    page = c.get("/login")
    return c.post("/login", data={"token": token, "csrf": csrf_of(page.text), "next": "/"},
                  follow_redirects=False)


def test_logins_are_limited_per_client_and_a_limited_guess_is_not_looked_at(
        pool: Pool, rw: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    guess = "wrong-guess-0123456789abcdef"
    with caplog.at_level(logging.WARNING, logger="jobpool.dashboard"):
        for _ in range(LOGIN_BURST):
            r = try_token(rw, guess)
            assert r.status_code == 403 and "wrong token" in r.text
        r = try_token(rw, guess)
        assert r.status_code == 429
        assert "too many login attempts from this address" in r.text
        assert int(r.headers["retry-after"]) > 0
        r = try_token(rw, TOKEN)  # the right one: not even looked at
        assert r.status_code == 429 and not session_cookies(r)
    failed = [rec for rec in caplog.records if "failed login" in rec.getMessage()]
    assert len(failed) == LOGIN_BURST and all(rec.levelno == logging.WARNING for rec in failed)
    assert all("testclient" in rec.getMessage() for rec in failed)  # the client's address
    assert guess not in caplog.text and TOKEN not in caplog.text
    # Another address is not held back by this one.
    with another_browser(rw, "10.0.0.2") as other:
        assert try_token(other, TOKEN).status_code == 303


def test_logins_are_limited_for_all_clients_together(pool: Pool, rw: TestClient) -> None:
    for n in range(GLOBAL_BURST):
        with another_browser(rw, f"10.1.0.{n}") as c:
            assert try_token(c, "wrong-guess-0123456789abcdef").status_code == 403
    with another_browser(rw, "10.2.0.1") as c:
        r = try_token(c, TOKEN)
        assert r.status_code == 429
        assert re.search(r"too many login attempts to this dashboard: try again in \d+ s", r.text)
