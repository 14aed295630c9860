"""The review web app: a rater logs in with their token and rates one item after another.

Server-rendered pages (Starlette + Jinja2, autoescaped) over a :class:`ReviewStore`, behind
the same defences as curation (:mod:`acrb.web`): security headers and a strict CSP (no inline
script or style), the Host check, a 64 KiB body limit, the cross-site guard; a write needs a
session cookie and that session's CSRF token in the form; every rating goes through
:meth:`ReviewStore.rate` and so into the hash-chained audit log.

What a rater sees is the source image, the output (or the two outputs of a pair, left and
right in the order drawn for that showing), the instruction, and the rubric's questions on the
axes the store asks (:attr:`ReviewStore.asked_axes`: the age question is the folder's
``age_question``, change or direction). The page never
carries the item's id, source id, file paths, model or group labels, nor any judge's score:
images are addressed by the rater's claim number and a slot (``source``, ``0``, ``1``), form
fields by slot, and the server maps slots back to outputs through the claim. A repeat is not
marked as one.

Keyboard (``/app.js``): digits 1-5 answer the focused axis and 0 answers "cannot tell", each
moving on to the next axis; Enter submits. Without the script the form is a plain post.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route

from acrb.errors import InputDataError
from acrb.review.store import RUBRIC, Claim, ReviewStore
from acrb.web import serving
from acrb.web.credentials import MAX_SECRET
from acrb.web.forms import InvalidRequest, form_fields
from acrb.web.pages import PageText, ToolPages, image_response
from acrb.web.security import LoginThrottle, ascii_digits, local_hosts
from acrb.web.sessions import Session, SessionCookies

#: The cookies of this tool (``acrb_review_session``, ``acrb_review_login_csrf``): not the
#: curation tool's, so both can run on one machine.
COOKIES = SessionCookies("acrb_review")
#: The form value of "cannot tell" (stored as None).
CANNOT_TELL = "cannot_tell"
SLOTS = ("0", "1")
SLOT_LABELS = {1: ("Output",), 2: ("Output A (left)", "Output B (right)")}
MAX_CLAIM_DIGITS = 12
#: How the shared pages (login, errors, the frame) name this tool.
TEXT = PageText(
    title="ACRB review", who="Rating as", token_label="Rater token",
    login_hint="The study's organiser gave you this token. Your ratings are saved under a "
               "pseudonym.")


def field_bounds(axes: tuple[str, ...]) -> dict[str, int]:
    """The form fields a rating page posts, each with its longest value: the answers on
    ``axes`` (the store's asked axes) for every slot; any other field is refused."""
    return {"csrf": MAX_SECRET, "claim": MAX_CLAIM_DIGITS, "duration_ms": 12,
            **{f"{slot}.{axis}": len(CANNOT_TELL) for slot in SLOTS for axis in axes}}


def parse_answers(fields: dict[str, str], shown_order: tuple[str, ...],
                  axes: tuple[str, ...]) -> dict[str, dict[str, int | None]]:
    """The form's answers on ``axes`` (the store's asked axes), slot by slot, as
    ``{output: {axis: 1-5 or None}}``; raises :class:`InvalidRequest` naming the first axis
    left unanswered or answered out of range."""
    answers: dict[str, dict[str, int | None]] = {}
    labels = SLOT_LABELS[len(shown_order)]
    for number, output in enumerate(shown_order):
        answers[output] = {}
        for axis in axes:
            value = fields.get(f"{number}.{axis}")
            where = f"{labels[number]}: {RUBRIC[axis][0]}"
            if value is None or value == "":
                raise InvalidRequest(f"no answer to “{where}”",
                                     "choose 1-5 or cannot tell for every question")
            if value == CANNOT_TELL:
                answers[output][axis] = None
            elif value in ("1", "2", "3", "4", "5"):
                answers[output][axis] = int(value)
            else:
                raise InvalidRequest(f"answer {value[:12]!r} to “{where}” is not 1-5 or "
                                     "cannot tell", "submit the form as served")
    extra = [name for name in fields if name[:1] in SLOTS
             and int(name[0]) >= len(shown_order)]
    if extra:
        raise InvalidRequest(f"answers for an output not shown ({extra[0]})",
                             "submit the form as served")
    return answers


class _App(ToolPages):
    """The endpoints, sharing one store and one template environment (login, logout, errors
    and the page frame are :class:`~acrb.web.pages.ToolPages`')."""

    def __init__(self, store: ReviewStore) -> None:
        super().__init__(store, "acrb.review", cookies=COOKIES, text=TEXT,
                         stylesheet="review.css", script="review.js")
        self.store = store

    # -------------------------------------------------------------- the rating page

    def rate_page(self, request: Request) -> Response:
        session = self._session(request)
        if session is None:
            return RedirectResponse("/login", 303)
        claim = self.store.next_item(session.user)
        if claim is None:
            return self._page("done.html", session=session, page="done",
                              progress=self.store.rater_progress(session.user))
        return self._rating(session, claim)

    def _rating(self, session: Session, claim: Claim, *, status: int = 200,
                error: InvalidRequest | None = None,
                chosen: dict[str, str] | None = None) -> HTMLResponse:
        labels = SLOT_LABELS[len(claim.shown_order)]
        slots = [{"key": str(n), "label": labels[n]} for n in range(len(claim.shown_order))]
        axes = [{"name": axis, "question": RUBRIC[axis][0],
                 "scale": list(enumerate(RUBRIC[axis][1], start=1))}
                for axis in self.store.asked_axes]
        return self._page("rate.html", status=status, session=session, page="rate",
                          claim=claim.claim_id, instruction=claim.item.instruction,
                          slots=slots, axes=axes, cannot_tell=CANNOT_TELL, error=error,
                          chosen=chosen or {},
                          progress=self.store.rater_progress(session.user))

    async def rate(self, request: Request) -> Response:
        return await self._form_post(request, self._rate)

    def _rate(self, request: Request, items: list[tuple[str, Any]]) -> Response:
        session = self._form_session(request, items)
        if isinstance(session, Response):
            return session
        axes = self.store.asked_axes
        try:
            fields = form_fields(items, field_bounds(axes))
        except InvalidRequest as exc:
            return self._error(400, exc.problem, exc.fix, session=session)
        claim = self.store.open_claim(session.user)
        if claim is None or fields.get("claim") != str(claim.claim_id):
            # A second press of Enter, or a page left open in another tab: not an error the
            # rater must act on; the next page shows where they are.
            return RedirectResponse("/", 303)
        try:
            answers = parse_answers(fields, claim.shown_order, axes)
            duration = fields.get("duration_ms", "")
            client_ms = int(duration) if ascii_digits(duration) else None
            self.store.rate(session.user, claim.item.item_id, answers, claim.shown_order,
                            client_ms)
        except InvalidRequest as exc:
            return self._rating(session, claim, status=400, error=exc, chosen=fields)
        except InputDataError as exc:
            return self._rating(session, claim, status=400,
                                error=InvalidRequest(exc.problem, exc.fix or ""),
                                chosen=fields)
        return RedirectResponse("/", 303)

    # -------------------------------------------------------------- images

    def image(self, request: Request) -> Response:
        session = self._session(request)
        if session is None:
            return PlainTextResponse("Not logged in", 401)
        claim, slot = request.path_params["claim"], request.path_params["slot"]
        if not ascii_digits(claim) or len(claim) > MAX_CLAIM_DIGITS \
                or slot not in ("source", *SLOTS):
            return PlainTextResponse("Not Found", 404)
        return image_response(self.store.claim_image(session.user, int(claim), slot))


# ----------------------------------------------------------------------------- public API


def create_app(store: ReviewStore, *, allowed_hosts: list[str] | None = None,
               login_throttle: LoginThrottle | None = None) -> Starlette:
    """The review app over ``store``; ``allowed_hosts`` are the Host names it answers to
    (default: the loopback names), so a rebinding DNS name cannot reach it;
    ``login_throttle`` limits failed logins per client (default: 10 a minute)."""
    pages = _App(store)
    if login_throttle is not None:
        pages.login_throttle = login_throttle
    return pages.app([
        Route("/", pages.rate_page, methods=["GET"]),
        Route("/rate", pages.rate, methods=["POST"]),
        Route("/image/{claim}/{slot}", pages.image, methods=["GET"]),
    ], allowed_hosts)


def serve(store: ReviewStore, host: str = "127.0.0.1", port: int = 8766,
          trusted_proxies: Sequence[str] = ()) -> None:
    """Run the app in this process until interrupted (one worker: the store is per-process);
    ``X-Forwarded-*`` headers are believed only from ``trusted_proxies``
    (:func:`acrb.web.serving.server_options`), so logins are throttled per real peer."""
    serving.serve(create_app(store, allowed_hosts=local_hosts(host)), host=host, port=port,
                  trusted_proxies=trusted_proxies)

