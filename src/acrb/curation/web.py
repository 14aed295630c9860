"""The curation web app: a person picks one portrait per design cell, in a browser.

Server-rendered pages (Starlette + Jinja2, autoescaped) over a :class:`CurationStore`; every
write goes through :meth:`CurationStore.decide` and so into the hash-chained audit log. The
app is meant for a workstation or a small trusted network, and it defends itself with the
shared web layer (:mod:`acrb.web`):

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

import json
from collections import deque
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route

from acrb.curation.store import CRITERIA, MAX_RATIONALE, CurationStore
from acrb.errors import InputDataError
from acrb.web import serving
from acrb.web.credentials import MAX_SECRET, bearer_token
from acrb.web.forms import InvalidRequest, form_fields
from acrb.web.pages import PageText, ToolPages, image_response
from acrb.web.security import LoginThrottle, local_hosts
from acrb.web.sessions import Session, SessionCookies

#: The cookies of this tool (``acrb_session``, ``acrb_login_csrf``).
COOKIES = SessionCookies("acrb")
MAX_CELL = 100
MAX_CANDIDATE = 200
LOG_ENTRIES = 200
#: How the shared pages (login, errors, the frame) name this tool.
TEXT = PageText(
    title="ACRB curation", who="Logged in as", token_label="Curator token",
    login_hint="The token was shown once, when <code>acrb curate add-curator NAME</code> "
               "added you.",
    home_link=True, menu=(("/", "Grid"), ("/log", "Audit log")))


# ----------------------------------------------------------------------------- validation


def _check_decision(action: str, candidate_id: str | None, criteria: dict[str, bool],
                    rationale: str) -> None:
    """The rules of interactive curation, for forms and the API alike. The store checks the
    rest (action, cell, candidate, criteria names, rationale length) for every writer; it
    cannot require a rationale, since the study's imported selections have none."""
    if action in ("select", "reject") and not candidate_id:
        raise InvalidRequest(f"{action} needs a candidate",
                             "choose one of the cell's candidates")
    missing = [name for name in CRITERIA if not criteria.get(name)]
    if action == "select" and missing and not rationale.strip():
        raise InvalidRequest(
            f"a selection with unticked criteria ({', '.join(missing)}) needs a rationale",
            "tick every criterion the portrait meets and say in the rationale why it is "
            "chosen despite the rest")


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


class _App(ToolPages):
    """The endpoints, sharing one store and one template environment (login, logout, errors
    and the page frame are :class:`~acrb.web.pages.ToolPages`')."""

    def __init__(self, store: CurationStore) -> None:
        super().__init__(store, "acrb.curation", cookies=COOKIES, text=TEXT,
                         stylesheet="app.css", script="app.js")
        self.store = store
        self.cells = [cell for cell, *_ in store.cells()]
        self.env.filters["q"] = lambda value: quote(str(value), safe="")
        self.env.filters["ticks"] = _ticks
        self.env.globals.update(criteria=CRITERIA, max_rationale=MAX_RATIONALE)

    # -------------------------------------------------------------- helpers

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
                   error: InvalidRequest | None = None, form: dict[str, Any] | None = None
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
        return image_response(self.store.image_path(candidate_id))

    # -------------------------------------------------------------- decisions (forms)

    async def decide(self, request: Request) -> Response:
        return await self._form_post(request, self._decide)

    def _decide(self, request: Request, items: list[tuple[str, Any]]) -> Response:
        session = self._form_session(request, items)
        if isinstance(session, Response):
            return session
        bounds = {"csrf": MAX_SECRET, "action": 16, "candidate_id": MAX_CANDIDATE,
                  "rationale": 2 * MAX_RATIONALE, **{name: 16 for name in CRITERIA}}
        try:
            fields = form_fields(items, bounds)
        except InvalidRequest as exc:
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
            self.store.decide(session.user, cell, action, candidate_id=candidate_id,
                              criteria=criteria, rationale=rationale, source="web")
        except InvalidRequest as exc:
            return self._cell_page(session, cell, status=400, error=exc, form=form)
        except InputDataError as exc:
            return self._cell_page(session, cell, status=400,
                                   error=InvalidRequest(exc.problem, exc.fix or ""),
                                   form=form)
        if action == "select":
            following = self._next_open(after=cell)
            return RedirectResponse(f"/cell/{following}" if following else "/", 303)
        return RedirectResponse(f"/cell/{cell}", 303)

    # -------------------------------------------------------------- API (bearer only)

    async def api_decide(self, request: Request) -> Response:
        body = await request.body()
        return await run_in_threadpool(self._api_decide, request, body)

    def _api_decide(self, request: Request, body: bytes) -> Response:
        token = bearer_token(request.headers)
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
        except InvalidRequest as exc:
            return _api_error(400, exc.problem, exc.fix)
        except InputDataError as exc:
            return _api_error(400, exc.problem, exc.fix or "")
        return JSONResponse({"seq": entry["seq"], "hash": entry["hash"]}, 201)

    def api_progress(self, request: Request) -> Response:
        token = bearer_token(request.headers)
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
        raise InvalidRequest("the body must be a JSON object",
                             "send {\"cell\": ..., \"action\": ...}")
    unknown = sorted(set(data) - {"cell", "action", "candidate_id", "criteria", "rationale"})
    if unknown:
        raise InvalidRequest(f"unknown fields {[str(k)[:40] for k in unknown[:5]]}",
                             "use cell, action, candidate_id, criteria, rationale")
    cell, action = data.get("cell"), data.get("action")
    candidate_id, criteria = data.get("candidate_id"), data.get("criteria") or {}
    rationale = data.get("rationale") or ""
    if not isinstance(cell, str) or not cell or len(cell) > MAX_CELL:
        raise InvalidRequest(f"cell must be a design cell name of at most {MAX_CELL} "
                             "characters", "e.g. Black_Female_20s")
    if not isinstance(action, str):
        raise InvalidRequest("action must be a string", "use select, reject or deselect")
    if candidate_id is not None and not isinstance(candidate_id, str):
        raise InvalidRequest("candidate_id must be a string or null", "use an id from the cell")
    if not isinstance(criteria, dict) or not all(isinstance(v, bool)
                                                 for v in criteria.values()):
        raise InvalidRequest("criteria must be an object of true/false ticks",
                             f"keys: {', '.join(CRITERIA)}")
    if not isinstance(rationale, str):
        raise InvalidRequest("rationale must be a string", "send text")
    return cell, action, candidate_id or None, criteria, rationale.strip()


def _api_error(status: int, problem: str, fix: str,
               headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": problem, "fix": fix}, status, headers=headers)


# ----------------------------------------------------------------------------- public API


def create_app(store: CurationStore, *, allowed_hosts: list[str] | None = None,
               login_throttle: LoginThrottle | None = None) -> Starlette:
    """The curation app over ``store``; ``allowed_hosts`` are the Host names it answers to
    (default: the loopback names), so a rebinding DNS name cannot reach it;
    ``login_throttle`` limits failed logins per client (default: 10 a minute)."""
    pages = _App(store)
    if login_throttle is not None:
        pages.login_throttle = login_throttle
    return pages.app([
        Route("/", pages.grid, methods=["GET"]),
        Route("/cell/{cell}", pages.cell, methods=["GET"]),
        Route("/cell/{cell}/decide", pages.decide, methods=["POST"]),
        Route("/api/decisions", pages.api_decide, methods=["POST"]),
        Route("/api/progress", pages.api_progress, methods=["GET"]),
        Route("/image/{candidate_id}", pages.image, methods=["GET"]),
        Route("/log", pages.log, methods=["GET"]),
    ], allowed_hosts)


def serve(store: CurationStore, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Run the app in this process until interrupted (one worker: the store is per-process)."""
    serving.serve(create_app(store, allowed_hosts=local_hosts(host)), host=host, port=port)
