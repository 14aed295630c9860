"""The curation web app: a person picks one portrait per design cell, in a browser.

Server-rendered pages (Starlette + Jinja2, autoescaped) over a :class:`CurationStore`; every
write goes through :meth:`CurationStore.decide` and so into the hash-chained audit log. The
app is meant for a workstation or a small trusted network, and it defends itself accordingly:

- a write needs a curator: a session cookie plus the session's CSRF token in the form, or a
  bearer token on ``/api`` (where cookies are not read, so a browser cannot be tricked into it);
- cross-site writes are refused on their ``Origin`` and ``Sec-Fetch-Site`` headers, before
  any credential is looked at;
- the ``Host`` header must name this server (DNS rebinding), bodies are capped at 64 KiB and
  every field has a length bound;
- every response carries a strict Content-Security-Policy (no inline script or style anywhere),
  and pages are not cached.

SQLite work runs in sync code, which Starlette runs in its thread pool; the store keeps one
connection per thread.
"""

from __future__ import annotations

import hmac
import json
import secrets
import socket
import threading
import time
from collections import deque
from importlib import resources
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit

import jinja2
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from acrb.curation.store import (
    CRITERIA,
    MAX_RATIONALE,
    CurationStore,
    Session,
)
from acrb.errors import InputDataError

SESSION_COOKIE = "acrb_session"
LOGIN_CSRF_COOKIE = "acrb_login_csrf"
MAX_BODY = 64 * 1024
MAX_TOKEN = 128
MAX_CELL = 100
MAX_CANDIDATE = 200
MAX_SECRET = 128
LOG_ENTRIES = 200
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")
CSP = ("default-src 'none'; img-src 'self'; style-src 'self'; script-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
_LOWER_SECURITY = {k.lower() for k in SECURITY_HEADERS}
#: Only these files are served as images; anything else a candidate table names is a 404.
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
               ".webp": "image/webp"}
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


# ----------------------------------------------------------------------------- middleware


class _SecurityHeaders:
    """Adds the security headers to every response, and ``no-store`` where nothing else
    says how to cache (pages show live curation state and the CSRF token)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.decode("latin-1").lower() not in _LOWER_SECURITY]
                headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                if not any(k.lower() == b"cache-control" for k, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class _TooLarge(Exception):
    pass


class _BodyLimit:
    """413 for bodies over ``limit`` bytes: by Content-Length up front, and by counting for
    bodies sent without one."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None:
            if not length.strip().isdigit():
                await PlainTextResponse("Invalid Content-Length", 400)(scope, receive, send)
                return
            if int(length) > self.limit:
                await _too_large(self.limit)(scope, receive, send)
                return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _TooLarge
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except _TooLarge:
            if started:
                raise
            await _too_large(self.limit)(scope, receive, send)


def _too_large(limit: int) -> Response:
    return PlainTextResponse(f"Request body larger than {limit // 1024} KiB", 413)


class _CrossSiteGuard:
    """403 for any write a browser says comes from another site or origin.

    ``Sec-Fetch-Site`` other than ``same-origin`` / ``none`` is refused (``same-site`` too:
    another app on the same host, on another port, is same-site but not same-origin). An
    ``Origin`` must name this server, except ``Origin: null``, which browsers send for this
    app's own forms because of ``Referrer-Policy: no-referrer``: it passes only together with
    ``Sec-Fetch-Site: same-origin``, a header pages cannot set.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in _SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        fetch_site = headers.get("sec-fetch-site", "").strip().lower()
        if fetch_site and fetch_site not in ("same-origin", "none"):
            await PlainTextResponse("Cross-site request refused", 403)(scope, receive, send)
            return
        if origin is not None:
            if origin.strip() == "null":
                allowed = fetch_site == "same-origin"
            else:
                allowed = same_origin(origin, scope.get("scheme", "http"),
                                      headers.get("host", ""))
            if not allowed:
                await PlainTextResponse("Cross-origin request refused", 403)(scope, receive,
                                                                             send)
                return
        await self.app(scope, receive, send)


def same_origin(origin: str, scheme: str, host: str) -> bool:
    """Whether an ``Origin`` header names this server (``scheme://host``), default ports
    filled in. ``null`` and anything unparsable are not."""

    def key(url: str) -> tuple[str, str, int] | None:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return None
        if parts.path or parts.query or parts.fragment or parts.username is not None:
            return None
        return (parts.scheme, parts.hostname.lower(),
                port or (443 if parts.scheme == "https" else 80))

    mine = key(f"{scheme}://{host}")
    return mine is not None and key(origin.strip()) == mine


# ----------------------------------------------------------------------------- validation


class _Invalid(Exception):
    """A request the curator can correct: answered with 400 and the problem."""

    def __init__(self, problem: str, fix: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def _form_fields(items: list[tuple[str, Any]], bounds: dict[str, int]) -> dict[str, str]:
    """The form's fields, each once, each a string within its bound; unknown names refused."""
    fields: dict[str, str] = {}
    for name, value in items:
        if name not in bounds:
            raise _Invalid(f"unknown form field {name[:40]!r}", "submit the form as served")
        if name in fields:
            raise _Invalid(f"form field {name!r} appears more than once",
                           "submit the form as served")
        if not isinstance(value, str):
            raise _Invalid(f"form field {name!r} is not text", "submit the form as served")
        if len(value) > bounds[name]:
            raise _Invalid(f"form field {name!r} is longer than {bounds[name]} characters",
                           "shorten it")
        fields[name] = value
    return fields


def _check_decision(action: str, candidate_id: str | None, criteria: dict[str, bool],
                    rationale: str) -> None:
    """The rules of interactive curation, for forms and the API alike. The store checks the
    rest (action, cell, candidate, criteria names, rationale length) for every writer; it
    cannot require a rationale, since the study's imported selections have none."""
    if action in ("select", "reject") and not candidate_id:
        raise _Invalid(f"{action} needs a candidate", "choose one of the cell's candidates")
    missing = [name for name in CRITERIA if not criteria.get(name)]
    if action == "select" and missing and not rationale.strip():
        raise _Invalid(
            f"a selection with unticked criteria ({', '.join(missing)}) needs a rationale",
            "tick every criterion the portrait meets and say in the rationale why it is "
            "chosen despite the rest")


def _secret_matches(given: str | None, expected: str | None) -> bool:
    if not given or not expected or len(given) > MAX_SECRET:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def _csrf_field_matches(items: list[tuple[str, Any]], session: Session) -> bool:
    """Whether the form carries exactly one ``csrf`` field, equal to the session's."""
    given = [value for name, value in items if name == "csrf"]
    return len(given) == 1 and isinstance(given[0], str) \
        and _secret_matches(given[0], session.csrf)


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token if 0 < len(token) <= MAX_TOKEN else None


# ----------------------------------------------------------------------------- display


def _number(value: Any, digits: int = 2) -> str:
    if value is None or isinstance(value, bool):
        return "—"
    try:
        return f"{float(value):.{digits}f}"
    except (TypeError, ValueError):
        return str(value)


def _percent(value: Any) -> str:
    if value is None:
        return "—"
    try:
        return f"{100 * float(value):.1f}%"
    except (TypeError, ValueError):
        return str(value)


def prescreen_rows(screen: dict[str, Any]) -> list[tuple[str, str]]:
    """The pre-screen measurements of a candidate as ``(label, text)`` rows, all of them."""
    if not screen:
        return [("Pre-screen", "not run for this candidate")]
    found = screen.get("face_found")
    detector = screen.get("face_detector") or ""
    face = ("found" + (f" ({detector})" if detector else "")) if found else "not found"
    nearest = screen.get("nearest_bits")
    return [
        ("Face", face),
        ("Face fraction", _number(screen.get("face_fraction"))),
        ("Face offset", _number(screen.get("face_offset"))),
        ("Sharpness", _number(screen.get("sharpness"), 1)),
        ("Brightness", _number(screen.get("brightness"), 1)),
        ("Contrast", _number(screen.get("contrast"), 3)),
        ("Clipped dark / bright",
         f"{_percent(screen.get('clipped_dark'))} / {_percent(screen.get('clipped_bright'))}"),
        ("Nearest other (pHash)", "—" if nearest is None else f"{nearest} bits"),
        ("Near duplicate of", (screen.get("near_duplicate_of") or "").replace(";", ", ")
         or "none"),
    ]


def _split(value: Any) -> list[str]:
    return [part for part in str(value or "").split(";") if part]


def _ticks(criteria: dict[str, Any]) -> str:
    """A selection's checklist in a few words: what was left unticked."""
    missing = [name for name in CRITERIA if not criteria.get(name)]
    if not missing:
        return "all criteria ticked"
    if len(missing) == len(CRITERIA):
        return "no criteria ticked"
    return "unticked: " + ", ".join(missing)


# ----------------------------------------------------------------------------- the app


class _App:
    """The endpoints, sharing one store and one template environment."""

    def __init__(self, store: CurationStore) -> None:
        self.store = store
        self.cells = [cell for cell, *_ in store.cells()]
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("acrb.curation", "templates"),
            autoescape=True, undefined=jinja2.StrictUndefined,
            trim_blocks=True, lstrip_blocks=True)
        self.env.filters["q"] = lambda value: quote(str(value), safe="")
        self.env.filters["ticks"] = _ticks
        static = resources.files("acrb.curation").joinpath("static")
        self.static = {
            "app.css": (static.joinpath("app.css").read_bytes(), "text/css; charset=utf-8"),
            "app.js": (static.joinpath("app.js").read_bytes(),
                       "text/javascript; charset=utf-8"),
        }

    # -------------------------------------------------------------- helpers

    def _session(self, request: Request) -> Session | None:
        return self.store.session(request.cookies.get(SESSION_COOKIE))

    def _page(self, name: str, *, status: int = 200, session: Session | None = None,
              page: str = "", nav: dict[str, str] | None = None,
              **context: Any) -> HTMLResponse:
        html = self.env.get_template(name).render(
            curator=session.curator if session else "", csrf=session.csrf if session else "",
            page=page, nav=nav or {}, criteria=CRITERIA, max_rationale=MAX_RATIONALE,
            **context)
        return HTMLResponse(html, status_code=status)

    def _error(self, status: int, problem: str, fix: str = "",
               session: Session | None = None, back: str = "/") -> HTMLResponse:
        return self._page("error.html", status=status, session=session, page="error",
                          status_code=status, problem=problem, fix=fix, back=back)

    def _next_open(self, after: str | None = None) -> str | None:
        """The next cell in design order (after ``after``, wrapping) that has candidates and
        no selection."""
        rows = {row["cell"]: row for row in self.store.grid()}
        start = self.cells.index(after) + 1 if after in self.cells else 0
        for offset in range(len(self.cells)):
            cell = self.cells[(start + offset) % len(self.cells)]
            if cell == after:
                continue
            if rows[cell]["candidates"] and rows[cell]["selection"] is None:
                return cell
        return None

    def _neighbours(self, cell: str) -> tuple[str, str]:
        at = self.cells.index(cell)
        return self.cells[at - 1], self.cells[(at + 1) % len(self.cells)]

    # -------------------------------------------------------------- login

    def login_form(self, request: Request) -> Response:
        if self._session(request) is not None:
            return RedirectResponse("/", 303)
        token = secrets.token_urlsafe(32)
        response = self._page("login.html", page="login", login_csrf=token, error="",
                              max_token=MAX_TOKEN)
        _set_cookie(request, response, LOGIN_CSRF_COOKIE, token)
        return response

    async def login(self, request: Request) -> Response:
        items = await _form_items(request)
        return await run_in_threadpool(self._login, request, items)

    def _login(self, request: Request, items: list[tuple[str, Any]]) -> Response:
        try:
            fields = _form_fields(items, {"token": MAX_TOKEN, "csrf": MAX_SECRET})
        except _Invalid as exc:
            return self._error(400, exc.problem, exc.fix, back="/login")
        expected = request.cookies.get(LOGIN_CSRF_COOKIE)
        if not _secret_matches(fields.get("csrf"), expected):
            return self._error(403, "the login form has expired or did not come from this "
                               "server", "reload the login page and try again", back="/login")
        found = self.store.login(fields.get("token", "").strip())
        if found is None:
            return self._page("login.html", status=401, page="login", login_csrf=expected,
                              error="token not recognised", max_token=MAX_TOKEN)
        sid, _ = found
        response = RedirectResponse("/", 303)
        _set_cookie(request, response, SESSION_COOKIE, sid)
        response.delete_cookie(LOGIN_CSRF_COOKIE, path="/", httponly=True, samesite="strict")
        return response

    async def logout(self, request: Request) -> Response:
        items = await _form_items(request)
        return await run_in_threadpool(self._logout, request, items)

    def _form_session(self, request: Request,
                      items: list[tuple[str, Any]]) -> Session | Response:
        """The session a form post acts for, or the 403 page when it has none or its CSRF
        field does not match that session's token."""
        session = self._session(request)
        if session is None:
            return self._error(403, "not logged in", "log in and try again", back="/login")
        if not _csrf_field_matches(items, session):
            return self._error(403, "the form did not carry this session's token",
                               "reload the page and try again", session=session)
        return session

    def _logout(self, request: Request, items: list[tuple[str, Any]]) -> Response:
        session = self._form_session(request, items)
        if isinstance(session, Response):
            return session
        self.store.logout(request.cookies.get(SESSION_COOKIE, ""))
        response = RedirectResponse("/login", 303)
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
        return response

    # -------------------------------------------------------------- pages

    def grid(self, request: Request) -> Response:
        session = self._session(request)
        if session is None:
            return RedirectResponse("/login", 303)
        rows = self.store.grid()
        by_cell = {row["cell"]: row for row in rows}
        design = self.store.cells()
        races = list(dict.fromkeys(r for _, r, _, _ in design))
        columns = list(dict.fromkeys((g, a) for _, _, g, a in design))
        genders = list(dict.fromkeys(g for g, _ in columns))
        table = [{"race": race, "cells": [by_cell[f"{race}_{g}_{a}"] for g, a in columns]}
                 for race in races]
        selected = sum(1 for row in rows if row["selection"] is not None)
        next_open = self._next_open()
        nav = {"next": f"/cell/{next_open}"} if next_open else {}
        return self._page("grid.html", session=session, page="grid", nav=nav, table=table,
                          genders=genders, columns=columns,
                          ages_per_gender=len(columns) // max(len(genders), 1),
                          selected=selected, total=len(rows), next_open=next_open)

    def cell(self, request: Request) -> Response:
        session = self._session(request)
        if session is None:
            return RedirectResponse("/login", 303)
        cell = request.path_params["cell"]
        if cell not in self.cells:
            return self._error(404, f"no cell {cell[:MAX_CELL]!r} in the design",
                               "pick a cell from the grid", session=session)
        return self._cell_page(session, cell)

    def _cell_page(self, session: Session, cell: str, *, status: int = 200,
                   error: _Invalid | None = None, form: dict[str, Any] | None = None
                   ) -> HTMLResponse:
        candidates = self.store.cell_candidates(cell)
        selection = self.store.selections().get(cell)
        rejections = self.store.rejections()
        form = form or {}
        chosen = form.get("candidate_id") or (selection or {}).get("candidate_id")
        cards = []
        for number, found in enumerate(candidates, start=1):
            screen = found["prescreen"] or {}
            cards.append({
                "number": number, "id": found["candidate_id"], "rank": found["rank"],
                "width": found["width"], "height": found["height"],
                "shown_height": round(200 * found["height"] / found["width"])
                if found["width"] and found["height"] else 200,
                "origin": found["origin"], "dataset": found["dataset"],
                "rows": prescreen_rows(screen), "flags": _split(screen.get("flags")),
                "selected": selection if selection and selection["candidate_id"]
                == found["candidate_id"] else None,
                "rejected": rejections.get(found["candidate_id"]),
                "checked": chosen == found["candidate_id"],
            })
        prev_cell, next_cell = self._neighbours(cell)
        nav = {"next": f"/cell/{next_cell}", "prev": f"/cell/{prev_cell}", "grid": "/"}
        race, gender, age = cell.split("_", 2)
        return self._page(
            "cell.html", status=status, session=session, page="cell", nav=nav, cell=cell,
            race=race, gender=gender, age=age, cards=cards, selection=selection,
            history=list(reversed(self.store.decisions(cell))), prev_cell=prev_cell,
            next_cell=next_cell, error=error, ticked=set(form.get("criteria", ())),
            rationale=form.get("rationale", ""))

    def log(self, request: Request) -> Response:
        session = self._session(request)
        if session is None:
            return RedirectResponse("/login", 303)
        verification = self.store.verify()
        entries: deque[str] = deque(maxlen=LOG_ENTRIES)
        if self.store.log.is_file():
            with open(self.store.log, encoding="utf-8", errors="replace") as handle:
                entries.extend(line.rstrip("\n") for line in handle)
        shown: list[dict[str, Any]] = []
        for line in reversed(entries):
            try:
                entry = json.loads(line)
            except ValueError:
                entry = None
            if not isinstance(entry, dict):
                shown.append({"raw": line[:500]})
                continue
            shown.append({"raw": "", "seq": entry.get("seq"), "at": entry.get("at", ""),
                          "curator": entry.get("curator", ""), "action": entry.get("action", ""),
                          "cell": entry.get("cell") or "",
                          "candidate_id": entry.get("candidate_id") or "",
                          "criteria": entry.get("criteria")
                          if isinstance(entry.get("criteria"), dict) else None,
                          "rationale": entry.get("rationale") or "",
                          "source": entry.get("source") or "",
                          "hash": str(entry.get("hash", ""))[:16]})
        return self._page("log.html", session=session, page="log", entries=shown,
                          verification=verification, message=verification.message(),
                          limit=LOG_ENTRIES)

    def image(self, request: Request) -> Response:
        if self._session(request) is None:
            return PlainTextResponse("Not logged in", 401)
        candidate_id = request.path_params["candidate_id"]
        if (not candidate_id or len(candidate_id) > MAX_CANDIDATE or candidate_id[0] == "."
                or any(c in candidate_id for c in "/\\\x00")):
            return PlainTextResponse("Not Found", 404)
        path = self.store.image_path(candidate_id)
        media = IMAGE_TYPES.get(path.suffix.lower()) if path is not None else None
        if path is None or media is None:
            return PlainTextResponse("Not Found", 404)
        return FileResponse(path, media_type=media,
                            headers={"Cache-Control": "private, max-age=3600"})

    def static_file(self, request: Request) -> Response:
        body, media = self.static[request.url.path.lstrip("/")]
        return Response(body, media_type=media, headers={"Cache-Control": "no-cache"})

    # -------------------------------------------------------------- decisions (forms)

    async def decide(self, request: Request) -> Response:
        items = await _form_items(request)
        return await run_in_threadpool(self._decide, request, items)

    def _decide(self, request: Request, items: list[tuple[str, Any]]) -> Response:
        session = self._form_session(request, items)
        if isinstance(session, Response):
            return session
        bounds = {"csrf": MAX_SECRET, "action": 16, "candidate_id": MAX_CANDIDATE,
                  "rationale": 2 * MAX_RATIONALE, **{name: 16 for name in CRITERIA}}
        try:
            fields = _form_fields(items, bounds)
        except _Invalid as exc:
            return self._error(400, exc.problem, exc.fix, session=session)
        cell = request.path_params["cell"]
        if cell not in self.cells:
            return self._error(404, f"no cell {cell[:MAX_CELL]!r} in the design",
                               "pick a cell from the grid", session=session)
        action = fields.get("action", "")
        candidate_id = fields.get("candidate_id") or None
        # Browsers send line breaks as CRLF; maxlength counted them as one character.
        rationale = fields.get("rationale", "").replace("\r\n", "\n").strip()
        criteria = {name: True for name in CRITERIA if name in fields}
        form = {"candidate_id": candidate_id, "criteria": list(criteria),
                "rationale": rationale}
        try:
            _check_decision(action, candidate_id, criteria, rationale)
            self.store.decide(session.curator, cell, action, candidate_id=candidate_id,
                              criteria=criteria, rationale=rationale, source="web")
        except _Invalid as exc:
            return self._cell_page(session, cell, status=400, error=exc, form=form)
        except InputDataError as exc:
            return self._cell_page(session, cell, status=400,
                                   error=_Invalid(exc.problem, exc.fix or ""), form=form)
        if action == "select":
            following = self._next_open(after=cell)
            return RedirectResponse(f"/cell/{following}" if following else "/", 303)
        return RedirectResponse(f"/cell/{cell}", 303)

    # -------------------------------------------------------------- API (bearer only)

    async def api_decide(self, request: Request) -> Response:
        body = await request.body()
        return await run_in_threadpool(self._api_decide, request, body)

    def _api_decide(self, request: Request, body: bytes) -> Response:
        token = _bearer(request)
        curator = self.store.curator_for_token(token) if token else None
        if curator is None:
            return _api_error(401, "a curator's bearer token is required",
                              "send `Authorization: Bearer <token>` (cookies are not read "
                              "here)", headers={"WWW-Authenticate": "Bearer"})
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            return _api_error(415, "the body must be JSON", "send Content-Type: "
                              "application/json")
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            return _api_error(400, "the body is not valid JSON", "send one JSON object")
        try:
            cell, action, candidate_id, criteria, rationale = _api_fields(data)
            _check_decision(action, candidate_id, criteria, rationale)
            entry = self.store.decide(curator, cell, action, candidate_id=candidate_id,
                                      criteria=criteria, rationale=rationale, source="api")
        except _Invalid as exc:
            return _api_error(400, exc.problem, exc.fix)
        except InputDataError as exc:
            return _api_error(400, exc.problem, exc.fix or "")
        return JSONResponse({"seq": entry["seq"], "hash": entry["hash"]}, 201)

    def api_progress(self, request: Request) -> Response:
        token = _bearer(request)
        if token is not None:
            allowed = self.store.curator_for_token(token) is not None
        else:
            allowed = self._session(request) is not None
        if not allowed:
            return _api_error(401, "log in or send a curator's bearer token",
                              "send `Authorization: Bearer <token>`",
                              headers={"WWW-Authenticate": "Bearer"})
        chosen = self.store.selections()
        cells = {cell: (chosen[cell]["candidate_id"] if cell in chosen else None)
                 for cell in self.cells}
        return JSONResponse({"selected": sum(v is not None for v in cells.values()),
                             "total": len(cells), "cells": cells})


def _api_fields(data: Any) -> tuple[str, str, str | None, dict[str, bool], str]:
    if not isinstance(data, dict):
        raise _Invalid("the body must be a JSON object", "send {\"cell\": ..., \"action\": ...}")
    unknown = sorted(set(data) - {"cell", "action", "candidate_id", "criteria", "rationale"})
    if unknown:
        raise _Invalid(f"unknown fields {[str(k)[:40] for k in unknown[:5]]}",
                       "use cell, action, candidate_id, criteria, rationale")
    cell, action = data.get("cell"), data.get("action")
    candidate_id, criteria = data.get("candidate_id"), data.get("criteria") or {}
    rationale = data.get("rationale") or ""
    if not isinstance(cell, str) or not cell or len(cell) > MAX_CELL:
        raise _Invalid(f"cell must be a design cell name of at most {MAX_CELL} characters",
                       "e.g. Black_Female_20s")
    if not isinstance(action, str):
        raise _Invalid("action must be a string", "use select, reject or deselect")
    if candidate_id is not None and not isinstance(candidate_id, str):
        raise _Invalid("candidate_id must be a string or null", "use an id from the cell")
    if not isinstance(criteria, dict) or not all(isinstance(v, bool)
                                                 for v in criteria.values()):
        raise _Invalid("criteria must be an object of true/false ticks",
                       f"keys: {', '.join(CRITERIA)}")
    if not isinstance(rationale, str):
        raise _Invalid("rationale must be a string", "send text")
    return cell, action, candidate_id or None, criteria, rationale.strip()


def _api_error(status: int, problem: str, fix: str,
               headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": problem, "fix": fix}, status, headers=headers)


async def _form_items(request: Request) -> list[tuple[str, Any]]:
    form = await request.form(max_files=0, max_fields=64)
    try:
        return list(form.multi_items())
    finally:
        await form.close()


def _set_cookie(request: Request, response: Response, name: str, value: str) -> None:
    response.set_cookie(name, value, path="/", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")


# ----------------------------------------------------------------------------- public API


def create_app(store: CurationStore, *, allowed_hosts: list[str] | None = None) -> Starlette:
    """The curation app over ``store``; ``allowed_hosts`` are the Host names it answers to
    (default: the loopback names), so a rebinding DNS name cannot reach it."""
    app = _App(store)
    routes = [
        Route("/login", app.login_form, methods=["GET"]),
        Route("/login", app.login, methods=["POST"]),
        Route("/logout", app.logout, methods=["POST"]),
        Route("/", app.grid, methods=["GET"]),
        Route("/cell/{cell}", app.cell, methods=["GET"]),
        Route("/cell/{cell}/decide", app.decide, methods=["POST"]),
        Route("/api/decisions", app.api_decide, methods=["POST"]),
        Route("/api/progress", app.api_progress, methods=["GET"]),
        Route("/image/{candidate_id}", app.image, methods=["GET"]),
        Route("/log", app.log, methods=["GET"]),
        Route("/app.css", app.static_file, methods=["GET"]),
        Route("/app.js", app.static_file, methods=["GET"]),
    ]
    middleware = [
        Middleware(_SecurityHeaders),
        Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts or LOCAL_HOSTS),
                   www_redirect=False),
        Middleware(_BodyLimit),
        Middleware(_CrossSiteGuard),
    ]
    return Starlette(routes=routes, middleware=middleware)


def local_hosts(host: str) -> list[str]:
    """``host`` and the loopback names (the Host check ignores the port)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return list(dict.fromkeys([host, *LOCAL_HOSTS]))


def serve(store: CurationStore, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Run the app in this process until interrupted (one worker: the store is per-process)."""
    app = create_app(store, allowed_hosts=local_hosts(host))
    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False)


class LiveServer:
    """The app on a free port of 127.0.0.1 in a background thread, for tests and scripts::

        with LiveServer(store, port=0) as server:
            httpx.get(server.url + "/login")
    """

    def __init__(self, store: CurationStore, port: int = 0, *,
                 allowed_hosts: list[str] | None = None, timeout: float = 10.0) -> None:
        self.store = store
        self.timeout = timeout
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", port))
        self.port: int = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(store, allowed_hosts=allowed_hosts
                         or local_hosts("127.0.0.1"))
        config = uvicorn.Config(app, log_level="warning", server_header=False,
                                timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._socket]},
                                        name=f"acrb-curation-{self.port}", daemon=True)

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + self.timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._stop()
                raise RuntimeError(f"the curation server on port {self.port} did not start")
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout):
            pass
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stop()

    def _stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(self.timeout)
        self._socket.close()
