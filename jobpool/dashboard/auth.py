"""Who may act through the dashboard, and the checks every POST passes (docs/architecture.md, "The
dashboard").

Actions are off unless `Settings.dashboard_token` (JOBPOOL_DASHBOARD_TOKEN) is set. With it, a browser logs
in once by giving the token; the session is a cookie signed with a key made fresh for each dashboard process
(so a restart logs everyone out), HttpOnly and SameSite=Strict, and it holds a per-session CSRF token that
every POST (the login's included) must carry back in its form. The token itself is never stored in the
cookie, never rendered, never logged: it is compared in constant time and forgotten.
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlsplit

from starlette.datastructures import FormData
from starlette.requests import Request

from ..config import Settings

SESSION_COOKIE = "jobpool_dashboard"
#: A logged-in session lasts this long (seconds), then the token is asked for again.
SESSION_SECS = 12 * 3600
CSRF_FIELD = "csrf"


class Refused(Exception):
    """A POST that is not allowed: `status` is the HTTP status, the message says why (no secret in it)."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


def session_key() -> str:
    """The signing key of this process's session cookies."""
    return secrets.token_urlsafe(32)


def actions_enabled(settings: Settings) -> bool:
    return bool(settings.dashboard_token)


def logged_in(request: Request) -> bool:
    return bool(request.session.get("auth"))


def csrf_token(request: Request) -> str:
    """This session's CSRF token, made on first use (a page with a form asks for it)."""
    token = request.session.get(CSRF_FIELD)
    if not isinstance(token, str) or not token:
        token = secrets.token_urlsafe(32)
        request.session[CSRF_FIELD] = token
    return token


def check_post(request: Request, form: FormData) -> None:
    """Every POST: from this origin (when the browser says), carrying this session's CSRF token."""
    origin = request.headers.get("origin")
    if origin is not None and origin != "null":
        parts = urlsplit(origin)
        if parts.netloc != request.headers.get("host", ""):
            raise Refused("refused: the request came from another origin")
    sent = form.get(CSRF_FIELD)
    expected = request.session.get(CSRF_FIELD)
    if not isinstance(sent, str) or not isinstance(expected, str) or not expected \
            or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise Refused("refused: missing or wrong CSRF token (reload the page and try again)")


def check_action(request: Request, form: FormData, settings: Settings) -> None:
    """An action: actions on, a valid POST, a logged-in session."""
    if not actions_enabled(settings):
        raise Refused("actions are off: start the dashboard with JOBPOOL_DASHBOARD_TOKEN set to enable them")
    check_post(request, form)
    if not logged_in(request):
        raise Refused("log in with the dashboard token first")


def login(request: Request, form: FormData, settings: Settings) -> None:
    """Check the token given in the login form; on success the session is logged in, with a new CSRF token
    (a token seen before login is not trusted after it)."""
    if not actions_enabled(settings):
        raise Refused("actions are off: there is nothing to log in to")
    check_post(request, form)
    given = form.get("token")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(),
                                                             settings.dashboard_token.encode()):
        raise Refused("wrong token")
    request.session.clear()
    request.session["auth"] = True
    csrf_token(request)


def logout(request: Request, form: FormData) -> None:
    check_post(request, form)
    request.session.clear()
