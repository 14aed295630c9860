"""The pages every ACRB tool for people has: log in, log out, errors, the page frame, assets.

A tool's app class derives from :class:`ToolPages` and adds its own pages. From here it gets:

- a Jinja environment (autoescaped, strict) that looks up a template in the tool's package
  first and then in this package's ``templates/``: ``base.html`` (the frame: header with the
  tool's name, the logged-in holder and the log-out form), ``login.html`` and ``error.html``
  are shared, worded per tool by :class:`PageText`;
- ``GET``/``POST /login`` (the login form carries its own CSRF token, in a cookie of the
  tool's :class:`~acrb.web.sessions.SessionCookies`, since there is no session yet; failed
  logins are limited per client address by :attr:`ToolPages.login_throttle`, a
  :class:`~acrb.web.security.LoginThrottle`) and ``POST /logout``;
- :meth:`ToolPages._form_session`: the session a form post acts for, or the 403 page;
- :meth:`ToolPages.app`: the tool's routes with these, behind the shared defences;
- ``/app.css`` and ``/app.js``: this package's ``static/base.css`` followed by the tool's
  stylesheet, and the tool's script, read once;
- :func:`image_response`: an image file served privately, only of the types in
  :data:`IMAGE_TYPES`.

The store is an :class:`~acrb.web.accounts.AccountStore`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route

from acrb.web.accounts import AccountStore
from acrb.web.credentials import MAX_SECRET, MAX_TOKEN, issue_secret, secret_matches
from acrb.web.forms import InvalidRequest, form_fields, form_items
from acrb.web.security import LoginThrottle, security_middleware
from acrb.web.sessions import Session, SessionCookies, csrf_field_matches

#: Only these files are served as images; any other path a store names is a 404.
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
               ".webp": "image/webp"}


@dataclass(frozen=True)
class PageText:
    """How the shared templates name a tool and its token holders.

    ``title`` is the brand in the header and the end of every page title (``ACRB review``);
    ``who`` introduces the logged-in holder (``Rating as``); ``token_label`` labels the login
    field; ``login_hint`` is the line under the login form (markup written by the tool, never
    user input); ``home_link`` makes the brand a link to ``/``; ``menu`` is ``(href, label)``
    links shown to a logged-in holder.
    """

    title: str
    who: str
    token_label: str
    login_hint: str
    home_link: bool = False
    menu: tuple[tuple[str, str], ...] = field(default=())


def image_response(path: Path | None) -> Response:
    """``path`` as a privately cached image, or 404 when there is none or it is not one of
    :data:`IMAGE_TYPES`."""
    media = IMAGE_TYPES.get(path.suffix.lower()) if path is not None else None
    if path is None or media is None:
        return PlainTextResponse("Not Found", 404)
    return FileResponse(path, media_type=media, headers={"Cache-Control": "private, max-age=3600"})


class ToolPages:
    """The shared endpoints of a tool over ``store``; ``package`` holds the tool's
    ``templates/`` and ``static/`` (``stylesheet`` and ``script`` name its files there)."""

    def __init__(self, store: AccountStore, package: str, *, cookies: SessionCookies,
                 text: PageText, stylesheet: str, script: str) -> None:
        self.accounts = store
        self.cookies = cookies
        #: Failed logins per client address (replace it to change the limit).
        self.login_throttle = LoginThrottle()
        self.env = jinja2.Environment(
            loader=jinja2.ChoiceLoader([jinja2.PackageLoader(package, "templates"),
                                        jinja2.PackageLoader("acrb.web", "templates")]),
            autoescape=True, undefined=jinja2.StrictUndefined,
            trim_blocks=True, lstrip_blocks=True)
        self.env.globals.update(tool=text.title, who=text.who, token_label=text.token_label,
                                login_hint=Markup(text.login_hint),
                                home_link=text.home_link, menu=text.menu)
        shared = resources.files("acrb.web").joinpath("static")
        own = resources.files(package).joinpath("static")
        self.static = {
            "app.css": (shared.joinpath("base.css").read_bytes()
                        + own.joinpath(stylesheet).read_bytes(), "text/css; charset=utf-8"),
            "app.js": (own.joinpath(script).read_bytes(), "text/javascript; charset=utf-8"),
        }

    def app(self, routes: list[Route], allowed_hosts: list[str] | None) -> Starlette:
        """The tool's app: the shared routes (login, logout, the two assets) and the tool's
        ``routes``, behind the shared defences (:func:`~acrb.web.security.security_middleware`;
        ``allowed_hosts`` are the Host names it answers to, default the loopback names)."""
        shared = [
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/app.css", self.static_file, methods=["GET"]),
            Route("/app.js", self.static_file, methods=["GET"]),
        ]
        return Starlette(routes=[*shared, *routes],
                         middleware=security_middleware(allowed_hosts))

    # -------------------------------------------------------------- helpers

    def _session(self, request: Request) -> Session | None:
        return self.accounts.session(self.cookies.session_id(request))

    def _page(self, name: str, *, status: int = 200, session: Session | None = None,
              page: str = "", nav: Mapping[str, str] | None = None,
              **context: Any) -> HTMLResponse:
        """Template ``name`` with the holder (``user``, empty when logged out), their CSRF
        token, the page's name and its keyboard links (``nav``: ``data-*`` of the body)."""
        html = self.env.get_template(name).render(
            user=session.user if session else "", csrf=session.csrf if session else "",
            page=page, nav=nav or {}, **context)
        return HTMLResponse(html, status_code=status)

    def _error(self, status: int, problem: str, fix: str = "",
               session: Session | None = None, back: str = "/") -> HTMLResponse:
        return self._page("error.html", status=status, session=session, page="error",
                          status_code=status, problem=problem, fix=fix, back=back)

    async def _form_post(self, request: Request,
                         handler: Callable[[Request, list[tuple[str, Any]]], Response]
                         ) -> Response:
        """A form post: its fields read within the body limit, then ``handler`` (sync:
        SQLite work) run in the thread pool."""
        items = await form_items(request)
        return await run_in_threadpool(handler, request, items)

    def _form_session(self, request: Request,
                      items: list[tuple[str, Any]]) -> Session | Response:
        """The session a form post acts for, or the 403 page when it has none or its CSRF
        field does not match that session's token."""
        session = self._session(request)
        if session is None:
            return self._error(403, "not logged in", "log in and try again", back="/login")
        if not csrf_field_matches(items, session):
            return self._error(403, "the form did not carry this session's token",
                               "reload the page and try again", session=session)
        return session

    # -------------------------------------------------------------- login, logout

    def login_form(self, request: Request) -> Response:
        if self._session(request) is not None:
            return RedirectResponse("/", 303)
        token = issue_secret()
        response = self._page("login.html", page="login", login_csrf=token, error="",
                              max_token=MAX_TOKEN)
        self.cookies.set_login_csrf(request, response, token)
        return response

    async def login(self, request: Request) -> Response:
        return await self._form_post(request, self._login)

    def _login(self, request: Request, items: list[tuple[str, Any]]) -> Response:
        client = request.client.host if request.client else ""
        wait = self.login_throttle.retry_after(client)
        if wait > 0:
            seconds = math.ceil(wait)
            refused = self._error(429, "too many failed logins from this address",
                                  f"wait {seconds} s, then log in with the token you were "
                                  "given", back="/login")
            refused.headers["Retry-After"] = str(seconds)
            return refused
        try:
            fields = form_fields(items, {"token": MAX_TOKEN, "csrf": MAX_SECRET})
        except InvalidRequest as exc:
            return self._error(400, exc.problem, exc.fix, back="/login")
        expected = self.cookies.login_csrf_cookie(request)
        if not secret_matches(fields.get("csrf"), expected):
            return self._error(403, "the login form has expired or did not come from this "
                               "server", "reload the login page and try again", back="/login")
        found = self.accounts.login(fields.get("token", "").strip())
        if found is None:
            self.login_throttle.failed(client)
            return self._page("login.html", status=401, page="login", login_csrf=expected,
                              error="token not recognised", max_token=MAX_TOKEN)
        self.login_throttle.succeeded(client)
        sid, _ = found
        response = RedirectResponse("/", 303)
        self.cookies.set_session(request, response, sid)
        self.cookies.clear_login_csrf(response)
        return response

    async def logout(self, request: Request) -> Response:
        return await self._form_post(request, self._logout)

    def _logout(self, request: Request, items: list[tuple[str, Any]]) -> Response:
        session = self._form_session(request, items)
        if isinstance(session, Response):
            return session
        self.accounts.logout(self.cookies.session_id(request) or "")
        response = RedirectResponse("/login", 303)
        self.cookies.clear_session(response)
        return response

    def static_file(self, request: Request) -> Response:
        body, media = self.static[request.url.path.lstrip("/")]
        return Response(body, media_type=media, headers={"Cache-Control": "no-cache"})
