"""The dashboard's pages, JSON and actions through Starlette's TestClient, against a real redis-server (no
browser: tests/integration/test_dashboard_browser.py drives a real one). What is checked: everything a job
holds is shown escaped, env values appear nowhere, actions are off without a token and need the token, this
session's CSRF token and a POST with it, paging and find-by-id, 404s, and that an action's event names the
dashboard."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

import pytest
from starlette.testclient import TestClient

from jobpool import JobState, Pool, Settings
from jobpool.dashboard import create_app
from jobpool.dashboard.views import OVERVIEW_RUNNING, PAGE_SIZE
from jobpool.status import WORKER_JOBS
from jobpool.workers.attempt import Attempt
from tests.support.constants import IMAGE, SUB
from tests.support.dashboard import TOKEN, client_for, csrf_of, log_in
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess

SECRET = "s3cret-env-value-never-shown"
XSS = "<script>alert('x')</script>"

@pytest.fixture
def ro(pool: Pool) -> Iterator[TestClient]:
    with client_for(pool) as c:
        yield c


@pytest.fixture
def rw(pool: Pool) -> Iterator[TestClient]:
    with client_for(pool, TOKEN) as c:
        yield c


def test_pages_show_a_job_escaped_and_never_its_env_values(pool: Pool, ro: TestClient) -> None:
    job = pool.enqueue(IMAGE, ["sh", "-c", f"echo {XSS}"], env={"API_KEY": SECRET}, labels={"x": XSS})
    bodies = {path: ro.get(path) for path in ("/", "/fragments/overview", "/jobs?state=running",
                                              "/fragments/jobs?state=running", f"/jobs/{job.id}",
                                              f"/fragments/jobs/{job.id}", "/events", "/fragments/events",
                                              "/api/status", "/api/jobs?state=running", f"/api/jobs/{job.id}",
                                              "/api/events")}
    for path, r in bodies.items():
        assert r.status_code == 200, (path, r.text)
        assert SECRET not in r.text, f"{path} shows the env value"
        if path.startswith("/api/"):  # JSON, which a browser never renders as a page (nosniff)
            assert r.headers["content-type"] == "application/json"
            assert r.headers["x-content-type-options"] == "nosniff"
        else:
            assert r.headers["content-type"].startswith("text/html")
            assert "<script>alert" not in r.text, f"{path} shows the command unescaped"
    page = bodies[f"/jobs/{job.id}"].text
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page  # shown, as text
    assert "API_KEY" in page and job.id in page
    assert bodies[f"/api/jobs/{job.id}"].json()["spec"]["env"] == {"API_KEY": "<redacted>"}
    assert bodies[f"/api/jobs/{job.id}"].json()["spec"]["command"] == ["sh", "-c", f"echo {XSS}"]
    assert "content-security-policy" in bodies["/"].headers
    assert "script-src 'self'" in bodies["/"].headers["content-security-policy"]


def test_a_log_with_a_script_is_shown_as_text(sub_pool: Pool, spawn: Callable[..., JobpoolProcess],
                                              ro: TestClient) -> None:
    job = sub_pool.enqueue("ignored", ["sh", "-c", f"echo \"{XSS}\"; echo done"])
    spawn(**SUB)
    assert sub_pool.wait(job.id, timeout=60).state is JobState.SUCCEEDED
    page = ro.get(f"/jobs/{job.id}").text
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;\ndone" in page
    assert "<script>alert" not in page
    assert re.search(r'id="job-state">succeeded<', page)


def test_overview_shows_slots_queue_promotion_and_unknown_held(pool: Pool, ro: TestClient) -> None:
    pool.set_slots(1)
    first = pool.enqueue(IMAGE, ["true"])
    waiting = pool.enqueue(IMAGE, ["true"])
    pool.pause(None, reason="maintenance window")
    # The supervisor's record of a sweep that kept a slot on unknown evidence (supervisor/report.py).
    record = {"at": pool.now_ms(), "rows": 1, "unknown": 1, "verdicts": {"warn": 1},
              "unknown_jobs": [{"job": first.id, "attempt": 1, "reason": "probe_unknown",
                                "evidence": "daemon <b>down</b>"}]}
    pool.store.client.set(pool.keys.last_sweep, json.dumps(record))
    html = ro.get("/fragments/overview").text
    assert re.search(r"1 / 1\s*</div>", html)
    assert "promotion paused" in html and "maintenance window" in html
    assert waiting.id[:12] in html and "oldest waiting" in html
    held = html.split('id="unknown-held"')[1].split("</table>")[0]
    assert first.id in held and "probe_unknown" in held and "daemon &lt;b&gt;down&lt;/b&gt;" in held
    assert "1 held on unknown evidence" in html
    assert "warn=1" in html
    assert ro.get("/api/status").json()["last_sweep"]["unknown_jobs"][0]["job"] == first.id



def test_the_limits_and_why_a_job_waits_are_shown(pool: Pool, ro: TestClient) -> None:
    pool.set_slots(3)
    pool.set_limit("dataset:*", 1)
    holder = pool.enqueue(IMAGE, ["true"], uses={"dataset:sales": 1})
    writer = pool.enqueue(IMAGE, ["true"], uses={"dataset:sales": 1}, priority=4, group="team-a")
    limits = ro.get("/fragments/overview").text.split('id="limits"')[1].split("</table>")[0]
    assert "dataset:*" in limits and re.search(r"1 / 1", limits)
    page = ro.get(f"/jobs/{writer.id}").text
    waiting = page.split('id="waiting"')[1].split("</div></div>")[0]
    assert f"dataset:sales 1/1 (limit dataset:*), needs 1, held by {holder.id}" in waiting
    assert "team-a" in page and "dataset:sales=1" in page
    assert ro.get("/api/status").json()["limits"] == [{"name": "dataset:*", "max": 1, "used": 1}]
    assert 'id="waiting"' not in ro.get(f"/jobs/{holder.id}").text


def test_overview_names_the_daemons_holding_slots_on_stale_evidence(pool: Pool, ro: TestClient) -> None:
    """A claimed job on a daemon that never published (its worker dead, its lease gone): the overview names
    the daemon, its job and the command that frees it (StatusReport.daemons, jobpool/status/read.py)."""
    daemon = "jpd1:" + "e" * 32 + "@boot-1"
    job = pool.enqueue(IMAGE, ["true"])
    Attempt(pool.store, job.id, "dead-boot", pool.get(job.id).attempt).claim("docker", daemon)
    pool.store.client.delete(pool.keys.lease(job.id))  # its worker died
    html = ro.get("/fragments/overview").text
    table = html.split('id="daemons"')[1].split("</table>")[0]
    assert daemon in table and job.id[:12] in table and f"jobpool forget-daemon {daemon}" in table
    (stale,) = ro.get("/api/status").json()["daemons"]["stale"]
    assert (stale["daemon_id"], stale["jobs"]) == (daemon, [job.id])


def test_overview_pages_the_running_jobs_and_bounds_each_workers(pool: Pool, ro: TestClient) -> None:
    """The overview reads the first OVERVIEW_RUNNING running jobs, and links to the rest a page at a time; a
    worker owning more jobs than the report names (adopted) says how many more (StatusReport, `running`)."""
    n = OVERVIEW_RUNNING + 5
    pool.set_slots(n)
    jobs = [pool.enqueue(IMAGE, ["sleep", "60"]) for _ in range(n)]
    now = pool.now_ms()
    pool.store.client.hset(pool.keys.boot("w1"), mapping={"host": "h1", "pid": 42, "executor": "docker"})
    pool.store.client.zadd(pool.keys.boots, {"w1": now})
    for job in jobs[:WORKER_JOBS + 2]:
        Attempt(pool.store, job.id, "w1", pool.get(job.id).attempt).claim("docker", "")
    html = ro.get("/fragments/overview").text
    running = html.split('id="running"')[1].split("</table>")[0]
    assert running.count("<tr>") - 1 == OVERVIEW_RUNNING
    more = html.split('id="running-more"')[1].split("</p>")[0]
    assert f"the first {OVERVIEW_RUNNING} of {n}" in more and 'href="/jobs?state=running"' in more
    workers = html.split('id="workers"')[1].split("</table>")[0]
    assert "and 2 more" in workers and sum(j.id[:12] in workers for j in jobs) == WORKER_JOBS
    (boot,) = ro.get("/api/status").json()["workers"]["boots"]
    assert (boot["running"], boot["jobs"]) == (WORKER_JOBS + 2, [j.id for j in jobs[:WORKER_JOBS]])


def test_paging_and_find_by_id(pool: Pool, ro: TestClient) -> None:
    pool.set_slots(0)
    jobs = [pool.enqueue(IMAGE, ["echo", str(i)]) for i in range(PAGE_SIZE + 3)]
    first = ro.get("/jobs?state=queued").text
    ids = re.findall(r'data-job="([0-9a-f]+)"', first)
    assert ids == [j.id for j in jobs[:PAGE_SIZE]]  # queue order
    assert f"1&ndash;{PAGE_SIZE} of {PAGE_SIZE + 3}" in first
    assert 'id="next"' in first and 'id="prev"' not in first
    second = ro.get(f"/jobs?state=queued&offset={PAGE_SIZE}").text
    assert re.findall(r'data-job="([0-9a-f]+)"', second) == [j.id for j in jobs[PAGE_SIZE:]]
    assert 'id="prev"' in second and 'id="next"' not in second
    api = ro.get(f"/api/jobs?state=queued&offset={PAGE_SIZE}").json()
    assert api["total"] == PAGE_SIZE + 3
    assert [j["id"] for j in api["jobs"]] == [j.id for j in jobs[PAGE_SIZE:]]

    found = ro.get(f"/jobs/find?id={jobs[5].id}", follow_redirects=False)
    assert found.status_code == 303 and found.headers["location"].endswith(f"/jobs/{jobs[5].id}")
    assert ro.get(f"/jobs/find?id={'0' * 32}").status_code == 404


@pytest.mark.parametrize("path", ["/jobs/" + "0" * 32, "/fragments/jobs/" + "0" * 32, "/api/jobs/" + "0" * 32,
                                  "/no/such/page"])
def test_unknown_job_or_page_is_404(pool: Pool, ro: TestClient, path: str) -> None:
    r = ro.get(path)
    assert r.status_code == 404
    assert ("no job" in r.text or "no such page" in r.text), r.text


def test_bad_paging_input_is_400(pool: Pool, ro: TestClient) -> None:
    assert ro.get("/jobs?state=bogus").status_code == 400
    assert ro.get("/jobs?state=queued&offset=-1").status_code == 400
    assert ro.get("/api/jobs?state=queued&offset=x").json()["error"].startswith("offset")


def test_actions_are_off_without_a_token(pool: Pool, ro: TestClient) -> None:
    pool.set_slots(0)
    job = pool.enqueue(IMAGE, ["true"])
    page = ro.get(f"/jobs/{job.id}").text
    assert "read-only" in page and 'id="job-pause"' not in page
    r = ro.post(f"/actions/jobs/{job.id}/pause", data={"csrf": "anything"})
    assert r.status_code == 403 and "actions are off" in r.text
    assert ro.post("/actions/slots", data={"slots": "5"}).status_code == 403
    assert ro.get("/login").status_code == 404
    assert pool.get(job.id).state is JobState.QUEUED and pool.slots() == (0, 0)


def test_actions_need_login_and_the_sessions_csrf_token(pool: Pool, rw: TestClient) -> None:
    pool.set_slots(0)
    job = pool.enqueue(IMAGE, ["true"])
    csrf = csrf_of(rw.get("/login").text)
    # Not logged in: refused, with or without a CSRF token.
    r = rw.post(f"/actions/jobs/{job.id}/pause", data={"csrf": csrf})
    assert r.status_code == 403 and "log in" in r.text
    # A wrong token is refused, and so is a login without the CSRF token.
    r = rw.post("/login", data={"token": TOKEN[:-1] + "x", "csrf": csrf})
    assert r.status_code == 403 and "wrong token" in r.text and TOKEN not in r.text
    assert rw.post("/login", data={"token": TOKEN}).status_code == 403
    csrf = log_in(rw)
    # Logged in: a POST without the CSRF token, with another one, or from another origin is refused.
    for data, headers in (({}, {}), ({"csrf": "forged"}, {}), ({"csrf": csrf}, {"origin": "http://evil.test"})):
        r = rw.post(f"/actions/jobs/{job.id}/pause", data=data, headers=headers)
        assert r.status_code == 403, (data, headers)
    assert pool.get(job.id).state is JobState.QUEUED
    # With it: done, and the event names the dashboard.
    r = rw.post(f"/actions/jobs/{job.id}/pause", data={"csrf": csrf, "reason": "from the web",
                                                       "next": f"/jobs/{job.id}"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/jobs/{job.id}"
    assert pool.get(job.id).state is JobState.PAUSED
    last = pool.events(job.id)[-1]
    assert last["to"] == "paused" and last["actor"].startswith("dashboard:")
    assert last["evidence"] == "from the web"
    assert f"paused {job.id}" in rw.get(f"/jobs/{job.id}").text  # the outcome, shown once
    assert rw.post(f"/actions/jobs/{job.id}/resume", data={"csrf": csrf}).status_code == 200
    assert pool.get(job.id).state is JobState.QUEUED
    # The queue, the slots, a cancel; a refused transition is said on the page.
    rw.post("/actions/queue/pause", data={"csrf": csrf, "reason": "web"})
    assert pool.stats()["queue_paused"] and pool.stats()["paused_by"].startswith("dashboard:")
    rw.post("/actions/slots", data={"csrf": csrf, "slots": "3"})
    assert pool.slots()[1] == 3
    assert "refused" in rw.post("/actions/slots", data={"csrf": csrf, "slots": "-2"}).text
    rw.post("/actions/queue/resume", data={"csrf": csrf})
    assert not pool.stats()["queue_paused"]
    rw.post(f"/actions/jobs/{job.id}/cancel", data={"csrf": csrf})
    assert pool.get(job.id).state in (JobState.CANCELLED, JobState.RUNNING)
    assert "refused" in rw.post(f"/actions/jobs/{job.id}/resume", data={"csrf": csrf}).text
    assert rw.post("/actions/jobs/" + "0" * 32 + "/pause", data={"csrf": csrf}).status_code == 404
    # A redirect target that is not a local path is not followed.
    r = rw.post("/actions/queue/resume", data={"csrf": csrf, "next": "//evil.test/"}, follow_redirects=False)
    assert r.headers["location"] == "/"
    # Logged out: refused again.
    rw.post("/logout", data={"csrf": csrf})
    assert rw.post("/actions/queue/pause", data={"csrf": csrf}).status_code == 403


def test_reconcile_action_runs_the_operators_sweep_as_the_dashboard(pool: Pool, rw: TestClient,
                                                                      docker_host: str) -> None:
    csrf = log_in(rw)
    r = rw.post("/actions/reconcile", data={"csrf": csrf})
    assert r.status_code == 200 and f"sweep pool={pool.keys.pool}" in r.text


def test_the_cookies_are_httponly_strict_and_hold_no_token(pool: Pool, rw: TestClient) -> None:
    login_form = rw.get("/login").headers["set-cookie"].lower()
    assert login_form.startswith("jobpool_dashboard_login=") and "path=/login" in login_form
    page = rw.get("/login")
    r = rw.post("/login", data={"token": TOKEN, "csrf": csrf_of(page.text)}, follow_redirects=False)
    session = next(c.lower() for c in r.headers.get_list("set-cookie") if c.startswith("jobpool_dashboard="))
    for cookie in (login_form, session):
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert TOKEN.lower() not in cookie


def test_on_loopback_another_host_name_is_refused(pool: Pool) -> None:
    """DNS rebinding: a page of another site whose name now resolves to 127.0.0.1 names its own host."""
    app = create_app(pool, allowed_hosts=["127.0.0.1", "localhost"])
    with TestClient(app, base_url="http://localhost:8765") as c:
        assert c.get("/api/status").status_code == 200
        assert c.get("/api/status", headers={"host": "evil.test:8765"}).status_code == 400


def test_the_token_is_never_in_the_settings_repr() -> None:
    s = Settings.from_env({"JOBPOOL_DASHBOARD_TOKEN": TOKEN})
    assert s.dashboard_token == TOKEN and TOKEN not in repr(s) and TOKEN not in str(s)


def test_a_weak_token_is_refused_without_being_shown() -> None:
    from jobpool import ConfigError
    with pytest.raises(ConfigError, match="JOBPOOL_DASHBOARD_TOKEN") as caught:
        Settings.from_env({"JOBPOOL_DASHBOARD_TOKEN": "short-one"})
    assert "short-one" not in str(caught.value)


def test_live_fragment_follows_a_state_change(pool: Pool, ro: TestClient) -> None:
    pool.set_slots(0)
    job = pool.enqueue(IMAGE, ["true"])
    assert 'id="job-state">queued<' in ro.get(f"/fragments/jobs/{job.id}").text
    pool.set_slots(1)
    eventually(lambda: 'id="job-state">running<' in ro.get(f"/fragments/jobs/{job.id}").text,
               message="the fragment shows the job running")


def test_waiting_jobs_are_listed_counted_and_say_what_they_wait_for(pool: Pool, ro: TestClient) -> None:
    pool.set_slots(0)
    first = pool.enqueue(IMAGE, ["true"])
    later = pool.enqueue(IMAGE, ["true"], not_before=pool.now_ms() / 1000 + 3600)
    chained = pool.enqueue(IMAGE, ["sh", "-c", "exit 3"], after=[first.id], timeout=90, retries=2,
                           retry_on=[3])
    tabs = ro.get("/jobs?state=waiting").text
    assert re.search(r'<span class="state waiting">waiting</span> 2</a>', tabs)
    assert re.findall(r'data-job="([0-9a-f]+)"', tabs) == [later.id, chained.id]  # soonest due first
    rows = dict(re.findall(r'data-job="([0-9a-f]+)".*?<td>([^<]*)</td></tr>', tabs, re.S))
    assert re.fullmatch(r"until \S+Z \(in (59|60) min; delayed start\)", rows[later.id]), rows
    assert rows[chained.id] == f"after {first.id}"
    page = ro.get(f"/jobs/{chained.id}").text
    waits = page.split('id="waiting"')[1].split("</div></div>")[0]
    assert f"jobs {first.id} (queued): 0 of 1 succeeded" in waits
    assert f'<a href="/jobs/{first.id}"><code>{first.id}</code></a>' in page.split('id="after"')[1]
    assert "1 min 30 s per attempt" in page.split('id="timeout"')[1].split("</td>")[0]
    retries = page.split('id="retries"')[1].split("</td>")[0]
    assert "0 of 2 used; first delay 10 s, doubled per retry; on exit 3 or a timeout" in retries
    assert "wait until" in ro.get(f"/jobs/{later.id}").text
    overview = ro.get("/fragments/overview").text
    card = re.sub(r"\s+", " ", overview.split('id="waiting-jobs"')[1].split("</div>")[0])
    assert "2 waiting</a> ; the next due" in card and later.id[:12] in card
    assert ro.get("/api/status").json()["waiting"] == {"count": 2, "next_job": later.id,
                                                       "next_due_ms": pool.get(later.id).wait_until}
    api = ro.get(f"/api/jobs/{chained.id}").json()
    assert (api["state"], api["after"], api["spec"]["retry_on"]) == ("waiting", [first.id], [3])


def test_a_waiting_job_is_paused_resumed_cancelled_and_retried_from_the_page(pool: Pool,
                                                                              rw: TestClient) -> None:
    pool.set_slots(0)
    job = pool.enqueue(IMAGE, ["true"], not_before=pool.now_ms() / 1000 + 3600)
    csrf = log_in(rw)
    assert 'id="job-retry"' not in rw.get(f"/jobs/{job.id}").text  # only a failed or cancelled job
    back = {"csrf": csrf, "next": f"/jobs/{job.id}"}
    rw.post(f"/actions/jobs/{job.id}/pause", data=back)
    assert pool.get(job.id).state is JobState.PAUSED
    assert "resumed" in rw.post(f"/actions/jobs/{job.id}/resume", data=back).text
    assert pool.get(job.id).state is JobState.WAITING
    refused = rw.post(f"/actions/jobs/{job.id}/retry", data=back).text
    assert f"refused: only a failed or cancelled job is retried; {job.id} is waiting" in refused
    page = rw.post(f"/actions/jobs/{job.id}/cancel", data=back).text
    assert f"cancelled {job.id}" in page and 'id="job-retry"' in page
    assert pool.get(job.id).state is JobState.CANCELLED
    page = rw.post(f"/actions/jobs/{job.id}/retry", data=back).text
    assert f"retried {job.id} (waiting)" in page  # its start time is still to come: it waits for it again
    assert pool.get(job.id).state is JobState.WAITING
    last = pool.events(job.id)[-1]
    assert (last["to"], last["reason"]) == ("waiting", "retried") and last["actor"].startswith("dashboard:")
    # Without the session's CSRF token, refused like every action.
    pool.cancel(job.id)
    assert rw.post(f"/actions/jobs/{job.id}/retry", data={"csrf": "forged"}).status_code == 403
    assert pool.get(job.id).state is JobState.CANCELLED
