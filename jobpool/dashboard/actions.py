"""The dashboard's actions: pause/resume/cancel/retry a job, pause/resume the queue, set slots, and the
operator's `reconcile --evict-stale`, each the same call the CLI makes (jobpool/cli/).

Each is a POST that passes `Auth.check_action` (actions on, from the dashboard's own origin, a live session,
its CSRF token) and acts as `dashboard:<client address>`, so every event it writes names the dashboard. The
outcome is one line shown on the page the browser is sent back to.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from typing import Any, Protocol

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from .. import errors
from ..cancel import stop_if_orphaned
from ..contract import MAX_SLOTS
from ..digits import parse_whole
from ..models import Job, JobState
from ..operations import PoolOperations
from . import auth


class Dashboard(Protocol):
    """What the actions need of the dashboard they belong to (jobpool/dashboard/app.py `Dashboard`): its pool,
    its sessions, and its pages to answer with."""

    pool: PoolOperations
    auth: auth.Auth

    def render(self, request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse: ...

    def error(self, request: Request, status: int, message: str) -> HTMLResponse: ...


#: Who the events of the dashboard's actions name (with the client's address).
ACTOR = "dashboard"


def actor_of(request: Request) -> str:
    client = request.client.host if request.client else "unknown"
    return f"{ACTOR}:{client}"


def _back(request: Request, form: FormData) -> str:
    """Where to send the browser afterwards: a local path from the form, else the overview."""
    target = form.get("next")
    if isinstance(target, str) and target.startswith("/") and not target.startswith("//") \
            and "\\" not in target:
        return target
    return "/"


def _text(form: FormData, name: str) -> str:
    value = form.get(name, "")
    return value if isinstance(value, str) else ""


def _job_line(job: Job, verb: str, done: JobState, requested: bool) -> str:
    if job.state is done:
        return f"{done.value} {job.id}"
    if requested:
        return f"{verb} requested for {job.id} (it is {job.state.value}; its worker acts on the request)"
    return f"{job.id} is {job.state.value}"


def _cancel(pool: PoolOperations, job_id: str, reason: str) -> str:
    job = pool.cancel(job_id, reason=reason)
    line = _job_line(job, "cancel", JobState.CANCELLED, job.cancel_requested)
    stop = stop_if_orphaned(pool.store, job)  # its worker gone: stopped by label, as `jobpool cancel` does
    if stop is not None:
        line += f"; its worker is gone: {stop.action}" + (f" ({stop.detail})" if stop.detail else "")
    return line


def _job_id(request: Request) -> str:
    return str(request.path_params["job_id"])


def _pause(pool: PoolOperations, request: Request, form: FormData) -> str:
    job = pool.pause(_job_id(request), reason=_text(form, "reason"))
    assert job is not None
    return _job_line(job, "pause", JobState.PAUSED, job.pause_requested)


def _resume(pool: PoolOperations, request: Request, form: FormData) -> str:
    job = pool.resume(_job_id(request))
    assert job is not None
    return f"resumed {job.id} ({job.state.value})"


def _cancel_job(pool: PoolOperations, request: Request, form: FormData) -> str:
    return _cancel(pool, _job_id(request), _text(form, "reason"))


def _retry(pool: PoolOperations, request: Request, form: FormData) -> str:
    """A failed or cancelled job run again as a new attempt (`Pool.retry`), as `jobpool retry` does."""
    try:
        job = pool.retry(_job_id(request))
    except errors.InvalidState as exc:
        return f"refused: only a failed or cancelled job is retried; {_job_id(request)} is {exc.state}"
    return f"retried {job.id} ({job.state.value})"


def _pause_queue(pool: PoolOperations, request: Request, form: FormData) -> str:
    pool.pause(None, reason=_text(form, "reason"))
    return "promotion paused: queued jobs will not start until it is resumed"


def _resume_queue(pool: PoolOperations, request: Request, form: FormData) -> str:
    pool.resume(None)
    return "promotion resumed"


def _slots(pool: PoolOperations, request: Request, form: FormData) -> str:
    old = pool.set_slots(parse_whole("slots", _text(form, "slots").strip(), 0, MAX_SLOTS))
    used, mx = pool.slots()
    return f"slots {used}/{mx} (was {old})"


def _reconcile(pool: PoolOperations, request: Request, form: FormData) -> str:
    """The operator's sweep with --evict-stale, as `jobpool reconcile --evict-stale` runs it."""
    run = importlib.import_module("jobpool.supervisor").reconcile
    report = run(pool.store, evict_stale=True, actor=pool.actor)
    line: str = report.line()
    return line


#: path -> what it does; each a POST under /actions.
ACTIONS: dict[str, Callable[[PoolOperations, Request, FormData], str]] = {
    "/actions/jobs/{job_id}/pause": _pause,
    "/actions/jobs/{job_id}/resume": _resume,
    "/actions/jobs/{job_id}/cancel": _cancel_job,
    "/actions/jobs/{job_id}/retry": _retry,
    "/actions/queue/pause": _pause_queue,
    "/actions/queue/resume": _resume_queue,
    "/actions/slots": _slots,
    "/actions/reconcile": _reconcile,
}


class Actions:
    """The POST endpoints of one dashboard (`Dashboard` renders the pages they answer with), and its login
    and logout (the sessions are `Dashboard.auth`'s, jobpool/dashboard/auth.py)."""

    def __init__(self, d: Dashboard) -> None:
        self.d = d

    def endpoint(self, do: Callable[[PoolOperations, Request, FormData], str]) -> Callable[[Request], object]:
        """The POST endpoint that checks the request (`Auth.check_action`), then does `do` as this client."""
        d = self.d

        async def act(request: Request) -> Response:
            form = await request.form()
            try:
                session = d.auth.check_action(request, form)
            except auth.Refused as exc:
                return d.error(request, exc.status, str(exc))
            acting = copy.copy(d.pool)  # the same connections and scripts, acting as this client
            acting.actor = actor_of(request)
            try:
                line = await run_in_threadpool(do, acting, request, form)
            except errors.RedisUnavailable as exc:
                return d.error(request, 503, str(exc))
            except errors.NotFound as exc:
                return d.error(request, 404, str(exc))
            except errors.JobpoolError as exc:  # refused input or transition: said on the page
                line = f"refused: {exc}"
            session.flash = line
            return RedirectResponse(_back(request, form), status_code=303)
        return act

    def _login_form(self, request: Request, target: str, status: int = 200, refused: str | None = None,
                    retry_after: int | None = None) -> Response:
        """The login page, with its form's CSRF token and the cookie that seeds it (path /login only: the
        session's cookie is never written by a page)."""
        csrf, seed = self.d.auth.login_form(request)
        extra = {} if refused is None else {"refused": refused}
        response = self.d.render(request, "login.html", status=status, next=target, login_csrf=csrf, **extra)
        self.d.auth.set_login_cookie(request, response, seed)
        if retry_after is not None:
            response.headers["retry-after"] = str(retry_after)
        return response

    async def login_page(self, request: Request) -> Response:
        if not self.d.auth.enabled():
            return self.d.error(request, 404, "actions are off: there is nothing to log in to")
        target = _back(request, FormData(request.query_params))
        if self.d.auth.session(request) is not None:  # logged in already: on to where it was going
            return RedirectResponse(target, status_code=303)
        return self._login_form(request, target)

    async def login(self, request: Request) -> Response:
        if not self.d.auth.enabled():
            return self.d.error(request, 404, "actions are off: there is nothing to log in to")
        form = await request.form()
        target = _back(request, form)
        try:
            session = self.d.auth.login(request, form)
        except auth.Refused as exc:
            return self._login_form(request, target, exc.status, str(exc), exc.retry_after)
        response = RedirectResponse(target, status_code=303)
        self.d.auth.set_session_cookie(request, response, session)
        return response

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        response = RedirectResponse("/", status_code=303)
        try:
            self.d.auth.logout(request, form, response)
        except auth.Refused as exc:
            return self.d.error(request, exc.status, str(exc))
        return response


def routes(d: Dashboard) -> list[Route]:
    """The POST routes of the actions, and login/logout."""
    a = Actions(d)
    return [
        Route("/login", a.login_page, methods=["GET"], name="login"),
        Route("/login", a.login, methods=["POST"]),
        Route("/logout", a.logout, methods=["POST"]),
        *(Route(path, a.endpoint(do), methods=["POST"]) for path, do in ACTIONS.items()),
    ]
