"""Who may act through the dashboard, and the checks every POST passes (docs/architecture.md, "The
dashboard").

Actions are off unless `Settings.dashboard_token` (JOBPOOL_DASHBOARD_TOKEN) is set. With it, a browser logs
in once by giving the token, and gets a session:

- **Kept in this process** (`Sessions`): the cookie holds only a random session id; the record behind it holds
  the session's CSRF token, its expiry, and a fingerprint of the token it was made under. Logout deletes the
  record, so a copy of the cookie is dead at once; a record made under another token than today's is dead too,
  and a restart forgets them all.
- **Set only by a login**, never by a page: a link from another site brings no SameSite=Strict cookie, and the
  page it opens must not write one over the session the browser holds. The login form's own CSRF token rides
  in a short-lived cookie of its own (path /login), signed with this process's key.
- **Every POST** must say it comes from the very origin it reached (`check_origin`: Origin, or Referer when
  there is none; `null` and neither are refused) and carry its form's CSRF token. Either check stops a
  cross-site POST on its own.
- **Logins are rate-limited** per client address and for all clients (jobpool/dashboard/ratelimit.py); a
  client over its limit gets 429 and its guess is not looked at. A wrong token is logged with the client's
  address, never the guess. The token is compared in constant time (by digests of equal length), never
  stored in a cookie, rendered or logged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import itsdangerous
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from ..config import Settings
from .ratelimit import LoginLimiter

log = logging.getLogger("jobpool.dashboard")

SESSION_COOKIE = "jobpool_dashboard"
#: The login form's cookie: its CSRF token's seed, for the login POST only.
LOGIN_COOKIE = "jobpool_dashboard_login"
#: A logged-in session lasts this long (seconds) from its login, then the token is asked for again.
SESSION_SECS = 12 * 3600
#: A login form is good for this long.
LOGIN_FORM_SECS = 3600
#: At most this many sessions are kept; past it the oldest goes.
MAX_SESSIONS = 1000
CSRF_FIELD = "csrf"
DEFAULT_PORTS = {"http": 80, "https": 443}


class Refused(Exception):
    """A POST that is not allowed: `status` is the HTTP status, the message says why (no secret in it);
    `retry_after` (seconds) goes with a 429."""

    def __init__(self, message: str, status: int = 403, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


def actions_enabled(settings: Settings) -> bool:
    return bool(settings.dashboard_token)


def client_of(request: Request) -> str:
    return request.client.host if request.client else "unknown"


# ---- origin -------------------------------------------------------------------------------------------

def _origin_of(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, the port made explicit; None for anything else ('null')."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme]


def served_origin(request: Request) -> tuple[str, str, int] | None:
    """The origin the request reached: its scheme, and the host and port its Host header names."""
    return _origin_of(f"{request.url.scheme}://{request.headers.get('host', '')}/")


def check_origin(request: Request) -> None:
    """The POST came from a page of this very origin. Browsers send Origin with every POST (the pages'
    `Referrer-Policy: same-origin` keeps it the real one, not `null`); without it, the Referer must name this
    origin. `null`, another origin, or neither is refused: this holds even when the CSRF token is known."""
    origin = request.headers.get("origin")
    sent = origin if origin is not None else request.headers.get("referer")
    if sent is None:
        raise Refused("refused: the request says no origin (a browser sends one with every form)")
    served = served_origin(request)
    if served is None or _origin_of(sent) != served:
        raise Refused("refused: the request came from another origin")


def _same(sent: object, expected: str) -> bool:
    return isinstance(sent, str) and hmac.compare_digest(sent.encode(), expected.encode())


# ---- sessions -----------------------------------------------------------------------------------------

@dataclass
class Session:
    id: str
    csrf: str
    expires: float
    #: The fingerprint of the dashboard token this session was logged in with (`Auth.fingerprint`).
    token_fp: bytes
    #: The outcome of the last action, shown once on the next page.
    flash: str | None = None


class Sessions:
    """The logged-in sessions of this process, by session id."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self, token_fp: bytes, flash: str | None = None) -> Session:
        with self._lock:
            now = self.clock()
            for sid in [sid for sid, s in self._by_id.items() if s.expires <= now or s.token_fp != token_fp]:
                del self._by_id[sid]
            while len(self._by_id) >= MAX_SESSIONS:
                del self._by_id[next(iter(self._by_id))]  # the oldest login (dicts keep insertion order)
            session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), now + SESSION_SECS,
                              token_fp, flash)
            self._by_id[session.id] = session
            return session

    def live(self, sid: str | None, token_fp: bytes) -> Session | None:
        """The session `sid` if it exists, has not expired and was made under the token of `token_fp`."""
        if not sid:
            return None
        with self._lock:
            session = self._by_id.get(sid)
            if session is None:
                return None
            if session.expires <= self.clock() or not hmac.compare_digest(session.token_fp, token_fp):
                del self._by_id[sid]
                return None
            return session

    def end(self, sid: str) -> None:
        with self._lock:
            self._by_id.pop(sid, None)

    def __len__(self) -> int:
        return len(self._by_id)


# ---- the dashboard's authority ------------------------------------------------------------------------

class Auth:
    """The sessions, the login limiter and the keys of one dashboard process. `settings` is asked on each
    request, so a new token takes effect (and ends the sessions of the old one) without a restart."""

    def __init__(self, settings: Callable[[], Settings], clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._key = secrets.token_bytes(32)  # made fresh for each process: a restart ends every session
        self.sessions = Sessions(clock)
        self.limiter = LoginLimiter(clock)
        self._login_signer = itsdangerous.TimestampSigner(self._key, salt="jobpool-dashboard-login")

    def enabled(self) -> bool:
        return actions_enabled(self.settings())

    def fingerprint(self) -> bytes:
        """A keyed digest of today's token: what a session remembers of it (never the token)."""
        return hmac.new(self._key, self.settings().dashboard_token.encode(), hashlib.sha256).digest()

    def session(self, request: Request) -> Session | None:
        """This request's live session, if its cookie names one (and actions are on)."""
        if not self.enabled():
            return None
        return self.sessions.live(request.cookies.get(SESSION_COOKIE), self.fingerprint())

    def _secure(self, request: Request) -> bool:
        return request.url.scheme == "https"

    # ---- the login form ---------------------------------------------------------------------------

    def _login_csrf(self, seed: str) -> str:
        return hmac.new(self._key, b"login-form:" + seed.encode(), hashlib.sha256).hexdigest()

    def login_form(self, request: Request) -> tuple[str, str]:
        """The login form's CSRF token, and the signed seed its cookie carries (the one this browser already
        holds while it is still good, so two open login forms both work)."""
        held = self._login_seed(request)
        seed = held if held is not None else secrets.token_urlsafe(32)
        return self._login_csrf(seed), self._login_signer.sign(seed).decode()

    def set_login_cookie(self, request: Request, response: Response, signed_seed: str) -> None:
        response.set_cookie(LOGIN_COOKIE, signed_seed, max_age=LOGIN_FORM_SECS, path="/login", httponly=True,
                            samesite="strict", secure=self._secure(request))

    def _login_seed(self, request: Request) -> str | None:
        signed = request.cookies.get(LOGIN_COOKIE)
        if not signed:
            return None
        try:
            return self._login_signer.unsign(signed, max_age=LOGIN_FORM_SECS).decode()
        except itsdangerous.BadSignature:
            return None

    # ---- the POSTs --------------------------------------------------------------------------------

    def login(self, request: Request, form: FormData) -> Session:
        """Check a login: from this origin, with its form's CSRF token, within the limits, then the token.
        A new session, with its own CSRF token."""
        if not self.enabled():
            raise Refused("actions are off: there is nothing to log in to")
        check_origin(request)
        seed = self._login_seed(request)
        if seed is None or not _same(form.get(CSRF_FIELD), self._login_csrf(seed)):
            raise Refused("refused: missing or stale login form (reload the page and try again)")
        client = client_of(request)
        limited = self.limiter.refused(client)
        if limited is not None:
            why, wait = limited
            raise Refused(f"{why}: try again in {wait} s", status=429, retry_after=wait)
        self.limiter.tried(client)
        given = form.get("token")
        given_digest = hashlib.sha256(given.encode() if isinstance(given, str) else b"").digest()
        token_digest = hashlib.sha256(self.settings().dashboard_token.encode()).digest()
        if not isinstance(given, str) or not hmac.compare_digest(given_digest, token_digest):
            log.warning("dashboard: failed login from %s (wrong token)", client)
            raise Refused("wrong token")
        return self.sessions.create(self.fingerprint(), flash="logged in: actions are on for this browser")

    def set_session_cookie(self, request: Request, response: Response, session: Session) -> None:
        response.set_cookie(SESSION_COOKIE, session.id, max_age=SESSION_SECS, path="/", httponly=True,
                            samesite="strict", secure=self._secure(request))
        response.delete_cookie(LOGIN_COOKIE, path="/login")

    def check_action(self, request: Request, form: FormData) -> Session:
        """An action: actions on, from this origin, a live session, its CSRF token."""
        if not self.enabled():
            raise Refused("actions are off: start the dashboard with JOBPOOL_DASHBOARD_TOKEN set to enable "
                          "them")
        check_origin(request)
        session = self.session(request)
        if session is None:
            raise Refused("log in with the dashboard token first")
        if not _same(form.get(CSRF_FIELD), session.csrf):
            raise Refused("refused: missing or wrong CSRF token (reload the page and try again)")
        return session

    def logout(self, request: Request, form: FormData, response: Response) -> None:
        """End this browser's session here, so no copy of its cookie acts again; the cookie goes too."""
        check_origin(request)
        session = self.session(request)
        if session is not None:
            if not _same(form.get(CSRF_FIELD), session.csrf):
                raise Refused("refused: missing or wrong CSRF token (reload the page and try again)")
            self.sessions.end(session.id)
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict",
                               secure=self._secure(request))
