"""The dashboard in a real browser: headless Chromium (Debian's chromium and chromium-driver) driven by
Selenium, against a real `jobpool dashboard` process, a real redis-server, a real dockerd, a real worker and
a real supervisor.

It watches a job go queued -> running -> succeeded on its page without the page reloading, logs in with the
token and pauses a running job (checked in Redis), is refused without the session or without its CSRF
token, finds a secret env value nowhere (page sources and JSON), sees a `<script>` in a command as text, and
takes the overview's screenshot (JOBPOOL_DASHBOARD_SCREENSHOT=path keeps it: docs/dashboard.png is one).

Another site, served by the test on a second local origin, shows what the sessions and POST checks hold
against (jobpool/dashboard/auth.py): a link from it does not log the browser out, a form on it that posts
with `Origin: null` and the right CSRF token is refused, and a cookie copied before logout acts no more.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from jobpool import JobState, Pool
from tests.support.constants import CHECKPOINTING, IMAGE, IN_CI
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.servers import free_port

if TYPE_CHECKING:
    from selenium.webdriver import Chrome

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TOKEN = "browser-test-token-0123456789abcdef"
SECRET = "hunter2-the-env-secret"
MARK = "window.__jobpoolNoReload"

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Chrome]:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        reason = "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        if IN_CI:
            pytest.fail(f"{reason} (CI is set, so this fails instead of skipping)", pytrace=False)
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    # The driver given by path: Selenium Manager would try to download one.
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")),
                              options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def dashboard(spawn: Callable[..., JobpoolProcess]) -> str:
    """A real `jobpool dashboard` with actions on (the token in its environment); its base URL."""
    port = free_port()
    proc = spawn("jobpool.cli", ("dashboard", "--port", str(port)), JOBPOOL_DASHBOARD_TOKEN=TOKEN)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.proc.poll() is None, f"the dashboard exited: {proc.log()}"
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/api/status", timeout=2) as r:
            return bool(r.status == 200)
        return False

    eventually(answers, timeout=30, message="the dashboard answers")
    assert TOKEN not in proc.log()
    return url


def post(url: str, data: dict[str, str], cookie: str | None = None, origin: str | None = None) -> int:
    """A POST outside the browser (as another site or a script would send it); its HTTP status."""
    headers = {"content-type": "application/x-www-form-urlencoded"}
    if cookie:
        headers["cookie"] = cookie
    if origin:
        headers["origin"] = origin
    req = urllib.request.Request(url, data=urllib.parse.urlencode(data).encode(), headers=headers,
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def text_of(driver: Chrome, element_id: str) -> str:
    try:
        return str(driver.find_element(By.ID, element_id).text)
    except Exception:  # noqa: BLE001 - replaced by the live refresh between find and read: not yet
        return ""


def test_dashboard_in_a_real_browser(pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str,
                                     dashboard: str, browser: Chrome, tmp_path: Path) -> None:
    pool.set_slots(0)  # nothing starts until the test says so
    command = "echo '<script>window.__xss = 1</script>'; sleep 6; echo finished"
    job = pool.enqueue(IMAGE, ["sh", "-c", command], env={"API_KEY": SECRET})
    spawn()
    # A point of the pool's history a second (a minute by default), so the overview's charts fill as it runs.
    spawn("jobpool.cli", ("supervisor",), JOBPOOL_TREND_SECS="1")
    sources: list[str] = []

    # ---- a job goes queued -> running -> succeeded on its page, which never reloads ----------------
    browser.get(f"{dashboard}/jobs/{job.id}")
    assert text_of(browser, "job-state") == "queued"
    assert "<script>window.__xss = 1</script>" in text_of(browser, "command")  # shown as text
    browser.execute_script(f"{MARK} = true;")
    pool.set_slots(1)
    eventually(lambda: text_of(browser, "job-state") == "running", timeout=60,
               message="the page shows the job running")
    # Its live log, tailed on the page while it runs (its worker sends it about every second).
    eventually(lambda: "<script>window.__xss = 1</script>" in text_of(browser, "log"), timeout=30,
               message="the page tails the running job's live log")
    assert pool.get(job.id).state is JobState.RUNNING and "finished" not in text_of(browser, "log")
    eventually(lambda: text_of(browser, "job-state") == "succeeded", timeout=60,
               message="the page shows the job succeeded")
    assert browser.execute_script(f"return {MARK};") is True, "the page was reloaded"
    assert browser.execute_script("return window.__xss;") is None, "the command's script ran"
    eventually(lambda: "finished" in text_of(browser, "log"), timeout=10, message="the log tail shown")
    assert "<script>window.__xss = 1</script>" in text_of(browser, "log")
    assert browser.execute_script("return window.__xss;") is None, "the log's script ran"
    events = text_of(browser, "job-events")
    assert "succeeded" in events and "running" in events
    sources.append(browser.page_source)

    # ---- read-only until logged in; refused without the session or without its CSRF token -------------
    running = pool.enqueue(IMAGE, ["sh", "-c", CHECKPOINTING], env={"API_KEY": SECRET})
    eventually(lambda: "started" in pool.logs(running.id) or pool.get(running.id).container_id, timeout=60,
               message="the second job runs")
    browser.get(f"{dashboard}/jobs/{running.id}")
    assert not browser.find_elements(By.ID, "job-pause")
    pause_url = f"{dashboard}/actions/jobs/{running.id}/pause"
    assert post(pause_url, {"csrf": "guessed"}, origin=dashboard) == 403  # no session at all
    browser.get(f"{dashboard}/login?next=/jobs/{running.id}")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "login").click()
    eventually(lambda: browser.find_elements(By.ID, "job-pause"), timeout=10, message="actions shown")
    cookie = browser.get_cookie("jobpool_dashboard")
    assert cookie and cookie["httpOnly"] and TOKEN not in cookie["value"]
    session = f"jobpool_dashboard={cookie['value']}"
    # The session and the dashboard's origin (the origin check passed), but no CSRF token, or a wrong one.
    assert post(pause_url, {}, cookie=session, origin=dashboard) == 403
    assert post(pause_url, {"csrf": "guessed"}, cookie=session, origin=dashboard) == 403
    assert pool.get(running.id).state is JobState.RUNNING and not pool.get(running.id).pause_requested

    # ---- with the token: pause the running job; Redis has it paused, the event names the dashboard ------
    browser.execute_script(f"{MARK} = true;")
    browser.find_element(By.ID, "job-pause").click()
    eventually(lambda: pool.get(running.id).state is JobState.PAUSED, timeout=60,
               message="the running job is paused in Redis")
    assert any(e["actor"].startswith("dashboard:") for e in pool.events(running.id))
    eventually(lambda: text_of(browser, "job-state") == "paused", timeout=10, message="the page shows it")
    assert "pause requested" in text_of(browser, "flash") or "paused" in text_of(browser, "flash")
    sources.append(browser.page_source)

    # ---- retry a failed job from its page: a new attempt, its history kept ---------------------------------
    failing = pool.enqueue(IMAGE, ["sh", "-c", "exit 3"])
    assert pool.wait(failing.id, timeout=60).state is JobState.FAILED
    browser.get(f"{dashboard}/jobs/{failing.id}")
    browser.find_element(By.ID, "job-retry").click()
    eventually(lambda: "retried" in text_of(browser, "flash"), timeout=10, message="the retry said")
    again = eventually(lambda: (j := pool.get(failing.id)).attempt == 2 and j.state is JobState.FAILED and j,
                       timeout=60, message="the retried job's second attempt ends")
    assert again.exit_code == 3
    retried = [e for e in pool.events(failing.id) if e["reason"] == "retried"]
    assert len(retried) == 1 and retried[0]["actor"].startswith("dashboard:")

    # ---- a waiting job's page says what it waits for ---------------------------------------------------
    later = pool.enqueue(IMAGE, ["true"], not_before=pool.now_ms() / 1000 + 3600)
    browser.get(f"{dashboard}/jobs/{later.id}")
    assert text_of(browser, "job-state") == "waiting" and "delayed start" in text_of(browser, "waiting")
    pool.cancel(later.id)

    # ---- every page and JSON document: the secret nowhere ------------------------------------------------
    for path in ("/", "/jobs?state=succeeded", "/jobs?state=paused", "/events", f"/jobs/{job.id}",
                 f"/api/jobs/{job.id}", f"/api/jobs/{running.id}", "/api/jobs?state=paused", "/api/status",
                 "/api/events", "/api/trends"):
        browser.get(dashboard + path)
        sources.append(browser.page_source)
    for source in sources:
        assert SECRET not in source
    assert all(TOKEN not in source for source in sources)

    # ---- the overview, live: a job running, one waiting; and its screenshot -------------------------------
    browser.get(dashboard + "/")
    busy = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 60"], labels={"team": "ingest"})
    waiting = pool.enqueue(IMAGE, ["sh", "-c", "echo next"])
    eventually(lambda: busy.id[:12] in text_of(browser, "workers") and "1 / 1" in text_of(browser, "slots")
               and waiting.id[:12] in text_of(browser, "queue") and "healthy" in text_of(browser, "health"),
               timeout=60, message="the overview shows the running job on its worker and the waiting one")
    assert busy.id[:12] in text_of(browser, "running")
    assert browser.execute_script(f"return {MARK};") is None  # a fresh page: the mark went with the last
    # The history, drawn live: the jobs that ended above in the throughput chart, the queue against the slots
    # with the waiting job queued behind the one running, and the waits of the jobs that ended.
    points = pool.trends()
    assert points and points[-1].width_ms == 1000
    assert sum(p.finished["succeeded"] or 0 for p in points) >= 1, [p.as_dict() for p in points[-30:]]
    assert any(p.wait_p50_ms is not None for p in points)
    eventually(lambda: "queued 1" in text_of(browser, "chart-queue") and "slots max 1" in
               text_of(browser, "chart-queue"), timeout=30, message="the queue chart has the latest point")
    for chart in ("throughput", "queue", "waits"):
        drawn = f"#chart-{chart} svg path, #chart-{chart} svg circle"
        assert browser.find_elements(By.CSS_SELECTOR, drawn), f"the {chart} chart"
    shot = tmp_path / "dashboard.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("JOBPOOL_DASHBOARD_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
    pool.cancel(busy.id)
    pool.cancel(waiting.id)


class OtherSite:
    """Another site's pages, served on a port of its own on 127.0.0.1: `url(host, path)` names one by
    `localhost` (another site than the dashboard's 127.0.0.1) or by 127.0.0.1 (the same site, another origin:
    SameSite cookies go with its requests, so only the origin check and the CSRF token stand)."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {}
        pages = self.pages

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the name http.server calls
                body = pages.get(self.path, "no such page").encode()
                self.send_response(200 if self.path in pages else 404)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # http.server's name
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, host: str, path: str) -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def other_site() -> Iterator[OtherSite]:
    site = OtherSite()
    yield site
    site.close()


def logged_in(driver: Chrome) -> bool:
    return bool(driver.find_elements(By.ID, "pool-actions"))


def log_in(driver: Chrome, dashboard: str) -> str:
    """Log in through the login form; the session's CSRF token (from the overview's forms)."""
    driver.get(f"{dashboard}/login?next=/")
    driver.find_element(By.ID, "token").send_keys(TOKEN)
    driver.find_element(By.ID, "login").click()
    eventually(lambda: logged_in(driver), timeout=10, message="logged in: the pool's actions shown")
    return str(driver.find_element(By.NAME, "csrf").get_attribute("value"))


def test_a_link_from_another_site_does_not_log_the_browser_out(
        pool: Pool, dashboard: str, browser: Chrome, other_site: OtherSite) -> None:
    log_in(browser, dashboard)
    # The dashboard's own forms post with their real origin (Referrer-Policy: same-origin) and act.
    browser.find_element(By.CSS_SELECTOR, "form[action='/actions/queue/pause'] button").click()
    eventually(lambda: pool.stats()["queue_paused"], timeout=10, message="the queue paused from the page")
    eventually(lambda: logged_in(browser), timeout=10, message="back on the overview")
    browser.find_element(By.CSS_SELECTOR, "form[action='/actions/queue/resume'] button").click()
    eventually(lambda: not pool.stats()["queue_paused"], timeout=10, message="the queue resumed by the page")
    eventually(lambda: logged_in(browser), timeout=10, message="back on the overview")

    # A link on another site (localhost is another site than 127.0.0.1): no SameSite=Strict cookie goes
    # with the navigation, so the page it opens is read-only; it must not write over the session.
    other_site.pages["/link.html"] = f'<a id="to-dashboard" href="{dashboard}/">the dashboard</a>'
    browser.get(other_site.url("localhost", "/link.html"))
    browser.find_element(By.ID, "to-dashboard").click()
    eventually(lambda: browser.current_url.startswith(dashboard), timeout=10, message="the link followed")
    assert not logged_in(browser)
    browser.get(f"{dashboard}/")  # the user's own next visit
    assert logged_in(browser), "a link from another site logged the browser out"


def test_a_post_with_origin_null_and_the_csrf_token_is_refused_and_logout_ends_the_session(
        pool: Pool, dashboard: str, browser: Chrome, other_site: OtherSite) -> None:
    csrf = log_in(browser, dashboard)
    # A form on another origin of the same site (127.0.0.1, another port), knowing the CSRF token: the
    # SameSite=Strict cookie goes along, and its no-referrer policy makes Chromium send `Origin: null`.
    # Only the origin check stands, and it refuses.
    other_site.pages["/post.html"] = (
        '<!doctype html><meta name="referrer" content="no-referrer">'
        f'<form method="post" action="{dashboard}/actions/queue/pause">'
        f'<input type="hidden" name="csrf" value="{csrf}"><input type="hidden" name="next" value="/">'
        '<button type="submit" id="attack">win a prize</button></form>')
    browser.get(other_site.url("127.0.0.1", "/post.html"))
    browser.find_element(By.ID, "attack").click()
    eventually(lambda: browser.current_url.startswith(dashboard), timeout=10, message="the form posted")
    assert not pool.stats()["queue_paused"], "a POST with Origin: null and the CSRF token acted"
    assert "another origin" in browser.page_source

    # Logout ends the session: a copy of its cookie taken before acts no more.
    browser.get(f"{dashboard}/")
    assert logged_in(browser)
    cookie = browser.get_cookie("jobpool_dashboard")
    assert cookie
    copied = f"jobpool_dashboard={cookie['value']}"
    browser.find_element(By.CSS_SELECTOR, "form[action='/logout'] button").click()
    eventually(lambda: browser.find_elements(By.LINK_TEXT, "Log in for actions"), timeout=10,
               message="logged out")
    assert post(f"{dashboard}/actions/queue/pause", {"csrf": csrf}, cookie=copied, origin=dashboard) == 403
    assert not pool.stats()["queue_paused"], "a cookie copied before logout acted after it"
