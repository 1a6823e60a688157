"""The evidence console's shell: a Litestar router at /console, signed in with an API key, rendering Jinja2 pages.

The gateway's process mounts it (`crashsafe serve gateway` passes `console_router()` to the gateway's `build_app`),
and the app lends it its broker, its `Door` (the stored key records and the per-client rates) and its Settings
through `app.state`. A page handler asks `session_of(request, scope)` for the signed-in client: the key in the
cookie is checked against its stored record on every request, as the API checks a bearer key, so a revocation
takes effect at the next page load. A POST handler also calls
`check_csrf(request, session)`. Pages are rendered with `render(...)` (autoescaped Jinja2 from the package).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from litestar import Request, Response, Router, get, post
from litestar.datastructures import CacheControlHeader, Cookie
from litestar.enums import MediaType
from litestar.response import Redirect
from litestar.static_files import create_static_files_router

from crashsafe.contracts.clients import Scope, split_key
from crashsafe.contracts.errors import BrokerUnavailable, CrashsafeError, RateLimited, Unauthenticated
from crashsafe.domain.access import Client, authenticate
from crashsafe.domain.admission import status_for
from crashsafe.services.platform.logs import log

logger = logging.getLogger("crashsafe.console")

PREFIX = "/console"
COOKIE = "crashsafe_console"  # the API key itself: HttpOnly, SameSite=Strict, Path=/console
SIGNIN_COOKIE = "crashsafe_console_signin"  # the sign-in form's double-submit token (no session yet)
CSRF_FIELD = "csrf"
MAX_FORM_BYTES = 16 * 1024

# Every console page lives in one origin with no inline script or style: htmx's own indicator style is off
# (meta htmx-config), so the policy needs no 'unsafe-inline'.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self';"
        " frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "x-frame-options": "DENY",  # frame-ancestors' older spelling, for browsers that predate CSP level 2
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}

# The pages in the nav, in order (the runs pages are this slice's; the others are operators' pages on this shell).
NAV = (
    ("runs", "Runs", f"{PREFIX}/runs"),
    ("approvals", "Approvals", f"{PREFIX}/approvals"),
    ("dead-letters", "Dead letters", f"{PREFIX}/dead-letters"),
    ("audit", "Audit", f"{PREFIX}/audit"),
    ("reconciliation", "Reconciliation", f"{PREFIX}/reconciliation"),
)

templates = Environment(
    loader=PackageLoader("crashsafe.services.console", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _ts(at: datetime | None) -> str:
    """A time as the pages show it: UTC, to the second."""
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S}" if at is not None else "–"


templates.filters["ts"] = _ts


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in console user: the client its key proves, and the CSRF token its forms carry."""

    client: Client
    csrf: str


class SignInNeeded(Exception):
    """No usable key in the cookie (missing, malformed, unknown, wrong secret, revoked): to the sign-in page."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotPermitted(Exception):
    """Signed in, but the key lacks the scope (or the form lacks its CSRF token): a 403 page."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def csrf_token(key_id: str, secret: str) -> str:
    """The token every POST form of a session carries: an HMAC of the key's id under its secret, so only a page
    rendered for the holder of the key has it, and it dies with the key."""
    return hmac.new(secret.encode(), b"crashsafe-console-csrf:" + key_id.encode(), hashlib.sha256).hexdigest()


def _secure(request: Request[Any, Any, Any]) -> bool:
    return request.url.scheme == "https" or request.app.state.settings.tls_cert_file is not None


def _cookie(request: Request[Any, Any, Any], key: str, value: str, max_age: int | None = None) -> Cookie:
    return Cookie(
        key=key,
        value=value,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
        max_age=max_age,
    )


def _gone(request: Request[Any, Any, Any], key: str) -> Cookie:
    return _cookie(request, key, "", max_age=0)


async def session_of(request: Request[Any, Any, Any], scope: Scope = Scope.RUNS_READ) -> Session:
    """The signed-in client, its key checked against the stored record now; SignInNeeded or NotPermitted.
    Counts against the client's rate, as an API request does."""
    session = await _checked(request, scope)
    door = request.app.state.door
    door.limit(door.clients, session.client.key_id, "client")
    return session


async def still_signed_in(request: Request[Any, Any, Any], scope: Scope = Scope.RUNS_READ) -> bool:
    """For a long-lived response (a live stream): is the cookie's key still valid, with `scope`, right now?"""
    try:
        await _checked(request, scope)
    except (SignInNeeded, NotPermitted):
        return False
    except BrokerUnavailable:
        return True  # the record cannot be read now: nothing reaches the stream either; asked again soon
    return True


async def _checked(request: Request[Any, Any, Any], scope: Scope) -> Session:
    parts = split_key(request.cookies.get(COOKIE, ""))
    if parts is None:
        raise SignInNeeded("missing" if not request.cookies.get(COOKIE) else "malformed")
    key_id, secret = parts
    door = request.app.state.door
    try:
        client = authenticate(key_id, secret, await door.keys.get(key_id))
    except Unauthenticated as exc:
        log(logger, logging.INFO, "refused", reason=exc.reason, path=request.url.path)
        raise SignInNeeded(exc.reason) from None
    if not client.may(scope):
        raise NotPermitted(f"this key ({client.key_id}) has no {scope.value} scope")
    return Session(client=client, csrf=csrf_token(key_id, secret))


async def check_csrf(request: Request[Any, Any, Any], session: Session) -> dict[str, str]:
    """The submitted form, if it carries this session's CSRF token; NotPermitted otherwise."""
    form = await request.form()
    token = form.get(CSRF_FIELD)
    if not isinstance(token, str) or not hmac.compare_digest(token, session.csrf):
        raise NotPermitted(
            "this form is stale or was not sent from the console: reload the page and try again"
        )
    return {k: v for k, v in form.items() if isinstance(v, str)}


def render(
    template: str,
    session: Session | None = None,
    *,
    status_code: int = 200,
    page: str = "",
    cookies: list[Cookie] | None = None,
    **context: Any,
) -> Response[str]:
    """A page from the package's templates (autoescaped), with the nav, the session's tenant and CSRF token."""
    html = templates.get_template(template).render(
        session=session,
        client=session.client if session else None,
        csrf=session.csrf if session else "",
        csrf_field=CSRF_FIELD,
        nav=NAV,
        page=page,
        prefix=PREFIX,
        **context,
    )
    return Response(
        content=html,
        status_code=status_code,
        media_type=MediaType.HTML,
        headers=SECURITY_HEADERS,
        cookies=cookies or [],
    )


def _local(next_path: str | None) -> str:
    """Where to go after signing in: only a console path (never another origin)."""
    if (
        next_path
        and next_path.startswith(PREFIX + "/")
        and not next_path.startswith("//")
        and "\\" not in next_path
    ):
        return next_path
    return f"{PREFIX}/runs"


# Handlers -----------------------------------------------------------------------------------------------------


def _on_signin_needed(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    assert isinstance(exc, SignInNeeded)
    target = f"{PREFIX}/signin?next={quote(request.url.path, safe='/')}"
    if exc.reason != "missing":
        target += f"&why={quote(exc.reason)}"
    if "text/event-stream" in request.headers.get("accept", ""):
        # A live stream's reconnect: a status, not a page (EventSource gives up on anything but 200).
        return Response(content="sign in again", status_code=401, media_type=MediaType.TEXT)
    if request.headers.get("hx-request"):
        # An htmx fragment request: a redirect would be swapped into the page; tell htmx to go there instead,
        # back to the page the fragment is part of afterwards.
        page = urlsplit(request.headers.get("hx-current-url", "")).path
        target = f"{PREFIX}/signin?next={quote(_local(page), safe='/')}"
        return Response(content="", status_code=401, headers={"hx-redirect": target})
    return Redirect(
        target, status_code=303, cookies=[_gone(request, COOKIE)] if exc.reason != "missing" else []
    )


def _on_not_permitted(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    assert isinstance(exc, NotPermitted)
    return render("error.html", status_code=403, title="Not allowed", message=exc.message)


def _on_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    assert isinstance(exc, CrashsafeError)
    status = status_for(exc)
    response = render(
        "error.html", status_code=status, title=exc.code.value.replace("_", " "), message=exc.message
    )
    if isinstance(exc, RateLimited):
        response.headers["retry-after"] = str(max(1, round(exc.retry_after_s)))
    return response


@get(["/", ""], include_in_schema=False)
async def console_home() -> Redirect:
    return Redirect(f"{PREFIX}/runs", status_code=303)


_WHY = {
    "invalid": "That key is not valid.",
    "revoked": "That key was revoked: sign in with another.",
    "malformed": "That is not an API key (csk_…).",
    "missing": "",
}


@get("/signin", include_in_schema=False)
async def signin_page(request: Request[Any, Any, Any]) -> Response[str]:
    token = secrets.token_urlsafe(24)
    why = request.query_params.get("why", "")
    return render(
        "signin.html",
        page="signin",
        token=token,
        next=_local(request.query_params.get("next")),
        message=_WHY.get(why, ""),
        cookies=[_cookie(request, SIGNIN_COOKIE, token)],
    )


@post("/signin", include_in_schema=False, request_max_body_size=MAX_FORM_BYTES)
async def signin(request: Request[Any, Any, Any]) -> Response[Any]:
    """The key pasted into the form, checked as the API checks a bearer key (stored record, then runs:read)."""
    form = await request.form()
    token, key, next_path = form.get(CSRF_FIELD), form.get("key"), form.get("next")
    expected = request.cookies.get(SIGNIN_COOKIE, "")
    if not isinstance(token, str) or not expected or not hmac.compare_digest(token, expected):
        raise NotPermitted("this sign-in form is stale: reload the sign-in page and try again")
    fresh = secrets.token_urlsafe(24)
    parts = split_key(key) if isinstance(key, str) else None

    def again(reason: str) -> Response[str]:
        return render(
            "signin.html",
            status_code=401,
            page="signin",
            token=fresh,
            next=_local(next_path if isinstance(next_path, str) else None),
            message=_WHY.get(reason, ""),
            cookies=[_cookie(request, SIGNIN_COOKIE, fresh)],
        )

    if parts is None:
        return again("malformed")
    door = request.app.state.door
    try:
        client = authenticate(parts[0], parts[1], await door.keys.get(parts[0]))
    except Unauthenticated as exc:
        log(logger, logging.INFO, "sign-in refused", reason=exc.reason)
        return again(exc.reason if exc.reason in _WHY else "invalid")
    if not client.may(Scope.RUNS_READ):
        raise NotPermitted(
            f"this key ({client.key_id}) has no {Scope.RUNS_READ.value} scope: the console needs it"
        )
    log(logger, logging.INFO, "signed in", key_id=client.key_id, tenant=client.tenant)
    assert isinstance(key, str)
    return Redirect(
        _local(next_path if isinstance(next_path, str) else None),
        status_code=303,
        cookies=[_cookie(request, COOKIE, key.strip()), _gone(request, SIGNIN_COOKIE)],
    )


@post("/signout", include_in_schema=False, request_max_body_size=MAX_FORM_BYTES)
async def signout(request: Request[Any, Any, Any]) -> Response[Any]:
    try:
        await check_csrf(request, await session_of(request))
    except SignInNeeded:
        pass  # signed out already (or revoked): just drop the cookie
    return Redirect(f"{PREFIX}/signin", status_code=303, cookies=[_gone(request, COOKIE)])


STATIC_DIR = Path(__file__).parent / "static"


def console_router() -> Router:
    """The console at /console: the shell's own handlers, its static files, and every page's handlers."""
    # Imported here: the page modules import this module's helpers. One line per page module (additive).
    from crashsafe.services.console import pages_operate, pages_runs, run_evidence_download

    pages: list[Any] = [*pages_runs.HANDLERS, *pages_operate.HANDLERS, *run_evidence_download.HANDLERS]
    return Router(
        path=PREFIX,
        route_handlers=[
            console_home,
            signin_page,
            signin,
            signout,
            create_static_files_router(
                path="/static",
                directories=[STATIC_DIR],
                name="console-static",
                include_in_schema=False,
                cache_control=CacheControlHeader(max_age=3600, public=True),
            ),
            *pages,
        ],
        exception_handlers={
            SignInNeeded: _on_signin_needed,
            NotPermitted: _on_not_permitted,
            CrashsafeError: _on_error,
        },
        include_in_schema=False,
    )
