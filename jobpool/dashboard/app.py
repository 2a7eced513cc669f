"""The dashboard's web application (Starlette): pages, the fragments their script polls to stay live, a
small JSON API, and the actions (jobpool/dashboard/actions.py).

Every page is rendered on the server from a Jinja template with autoescaping on, so whatever a job holds
(its command, its log, a reason) is shown as text. The script (static/dashboard.js) only fetches a page's
fragment again every second and puts it in place; a Content-Security-Policy lets no other script run.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import errors
from ..browse import MAX_OFFSET
from ..digits import parse_whole
from ..operations import PoolOperations
from . import actions, auth, views

log = logging.getLogger("jobpool.dashboard")

#: Sent with every response: no script but ours, no framing, no sniffing, nothing cached. The referrer policy
#: keeps the Origin of the pages' own POSTs (`no-referrer` would make the browser send `Origin: null`, which
#: auth.check_origin refuses) and gives other sites nothing.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; object-src 'none'; base-uri 'none'; "
                               "form-action 'self'; frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
#: How often (ms) a page fetches its fragment again.
REFRESH_MS = 1000


def templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("jobpool.dashboard", "templates"),
                             autoescape=True)
    env.filters.update(clock=views.clock, duration=views.duration)
    return env


class SecurityHeaders:
    """Adds `SECURITY_HEADERS` to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)


class Dashboard:
    """The pool the pages read and the actions act on, and the templates they are rendered with."""

    def __init__(self, pool: PoolOperations) -> None:
        self.pool = pool
        self.settings = pool.settings
        self.env = templates()
        #: Sessions, login limits and keys; it reads `self.settings` on each request (a new token ends the
        #: sessions of the old one).
        self.auth = auth.Auth(lambda: self.settings)

    def render(self, request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        """A page (or a fragment, for a name starting with '_'), with what every page needs."""
        session = self.auth.session(request)  # read only: a page never sets the session's cookie
        page = not name.startswith("_")
        common = {"pool_name": self.pool.store.keys.pool, "path": request.url.path, "refresh_ms": REFRESH_MS,
                  "actions": self.auth.enabled(), "logged_in": session is not None, "flash": None}
        if session is not None and page:
            common["csrf"] = session.csrf
            common["flash"], session.flash = session.flash, None
        return HTMLResponse(self.env.get_template(name).render(**common, **ctx), status_code=status)

    def error(self, request: Request, status: int, message: str) -> HTMLResponse:
        return self.render(request, "error.html", status=status, message=message)

    # ---- pages ---------------------------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        return self.render(request, "overview.html", **views.overview(self.pool))

    def overview_fragment(self, request: Request) -> Response:
        return self.render(request, "_overview.html", **views.overview(self.pool))

    def _jobs_args(self, request: Request) -> tuple[str, int]:
        state = request.query_params.get("state", "running")
        return state, parse_whole("offset", request.query_params.get("offset", "0"), 0, MAX_OFFSET)

    def jobs(self, request: Request) -> Response:
        return self.render(request, "jobs.html", **views.jobs_page(self.pool, *self._jobs_args(request)))

    def jobs_fragment(self, request: Request) -> Response:
        return self.render(request, "_jobs.html", **views.jobs_page(self.pool, *self._jobs_args(request)))

    def find(self, request: Request) -> Response:
        """Find by id: the job's page, or a 404 saying no such job."""
        job_id = request.query_params.get("id", "").strip()
        self.pool.get(job_id)
        return RedirectResponse(request.url_for("job", job_id=job_id), status_code=303)

    def job(self, request: Request) -> Response:
        return self.render(request, "job.html", **views.job_detail(self.pool, request.path_params["job_id"]))

    def job_fragment(self, request: Request) -> Response:
        return self.render(request, "_job.html", **views.job_detail(self.pool, request.path_params["job_id"]))

    def events(self, request: Request) -> Response:
        return self.render(request, "events.html", **views.events_feed(self.pool))

    def events_fragment(self, request: Request) -> Response:
        return self.render(request, "_events.html", **views.events_feed(self.pool))

    # ---- JSON: the same reads, for scripts (env values redacted as everywhere) --------------------------

    def api_status(self, request: Request) -> Response:
        return JSONResponse(self.pool.status().to_dict())

    def api_trends(self, request: Request) -> Response:
        return JSONResponse({"points": [p.as_dict() for p in self.pool.trends()]})

    def api_jobs(self, request: Request) -> Response:
        state, offset = self._jobs_args(request)
        return JSONResponse(self.pool.page(state, offset, views.PAGE_SIZE).to_dict())

    def api_job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job = self.pool.get(job_id)
        history, _ = self.pool.tail_events(job_id, views.JOB_EVENTS)
        return JSONResponse({**job.to_dict(), "events": history})

    def api_events(self, request: Request) -> Response:
        return JSONResponse(self.pool.tail_events(None, views.FEED_EVENTS)[0])

    # ---- errors --------------------------------------------------------------------------------------

    def guarded(self, endpoint: Callable[[Request], Any]) -> Callable[[Request], Awaitable[Response]]:
        """`endpoint` (run in a thread: the pool's calls block), its jobpool errors as error pages (JSON under
        /api/). Anything else is a bug: logged with its traceback, answered 500 in the same form (JSON under
        /api/), never a bare text traceback page."""
        from starlette.concurrency import run_in_threadpool

        async def call(request: Request) -> Response:
            try:
                result: Response = await run_in_threadpool(endpoint, request)
                return result
            except errors.JobpoolError as exc:
                status = 404 if isinstance(exc, errors.NotFound) else 400 if isinstance(
                    exc, (errors.InvalidArgument, errors.InvalidSpec)) else 503 if isinstance(
                    exc, errors.RedisUnavailable) else 500
                message = str(exc)
            except Exception:
                log.exception("dashboard: %s failed", request.url.path)
                status, message = 500, "internal error (the dashboard's log has the details)"
            if request.url.path.startswith("/api/"):
                return JSONResponse({"error": message}, status_code=status)
            return self.error(request, status, message)

        return call


def create_app(pool: PoolOperations, allowed_hosts: list[str] | None = None) -> Starlette:
    """The dashboard of `pool`: its pages, fragments, JSON API and (with a token set) actions. With
    `allowed_hosts`, a request naming another Host is refused (400): a page of another site that resolves
    its own name to 127.0.0.1 (DNS rebinding) cannot read a dashboard served on loopback."""
    d = Dashboard(pool)
    g = d.guarded
    routes = [
        Route("/", g(d.overview), name="overview"),
        Route("/fragments/overview", g(d.overview_fragment)),
        Route("/jobs", g(d.jobs), name="jobs"),
        Route("/fragments/jobs", g(d.jobs_fragment)),
        Route("/jobs/find", g(d.find)),
        Route("/jobs/{job_id}", g(d.job), name="job"),
        Route("/fragments/jobs/{job_id}", g(d.job_fragment)),
        Route("/events", g(d.events), name="events"),
        Route("/fragments/events", g(d.events_fragment)),
        Route("/api/status", g(d.api_status)),
        Route("/api/trends", g(d.api_trends)),
        Route("/api/jobs", g(d.api_jobs)),
        Route("/api/jobs/{job_id}", g(d.api_job)),
        Route("/api/events", g(d.api_events)),
        *actions.routes(d),
        Mount("/static", StaticFiles(packages=[("jobpool.dashboard", "static")]), name="static"),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return d.error(request, 404, "no such page")

    hosts = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)] if allowed_hosts else []
    app = Starlette(routes=routes, exception_handlers={404: not_found},
                    middleware=[*hosts, Middleware(SecurityHeaders)])
    app.state.dashboard = d  # its sessions and settings, for whoever serves it
    return app
