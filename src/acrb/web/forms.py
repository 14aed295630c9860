"""Form posts read within bounds: no files, a few fields, each named, once, and of bounded length.

The body as a whole is capped by :class:`acrb.web.security.BodyLimit`; these checks make a
request that a served form could not have produced a 400 naming the field, before the tool
looks at the values.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.requests import Request

#: Most fields a form post may carry; more is refused by the multipart parser.
MAX_FIELDS = 64


class InvalidRequest(Exception):
    """A request its sender can correct: answered with 400 (or the tool's page) showing
    ``problem`` and ``fix``."""

    def __init__(self, problem: str, fix: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


async def form_items(request: Request, max_fields: int = MAX_FIELDS) -> list[tuple[str, Any]]:
    """The posted form's ``(name, value)`` pairs in order, repeats kept; file uploads are
    refused (400) by the parser, as are more than ``max_fields`` fields."""
    form = await request.form(max_files=0, max_fields=max_fields)
    try:
        return list(form.multi_items())
    finally:
        await form.close()


def form_fields(items: Iterable[tuple[str, Any]], bounds: dict[str, int]) -> dict[str, str]:
    """The form's fields, each once, each a string of at most ``bounds[name]`` characters.

    Raises :class:`InvalidRequest` for a name not in ``bounds``, a repeated name, a value that
    is not text (an upload), or one over its bound. Absent fields are simply not in the result.
    """
    fields: dict[str, str] = {}
    for name, value in items:
        if name not in bounds:
            raise InvalidRequest(f"unknown form field {name[:40]!r}",
                                 "submit the form as served")
        if name in fields:
            raise InvalidRequest(f"form field {name!r} appears more than once",
                                 "submit the form as served")
        if not isinstance(value, str):
            raise InvalidRequest(f"form field {name!r} is not text", "submit the form as served")
        if len(value) > bounds[name]:
            raise InvalidRequest(f"form field {name!r} is longer than {bounds[name]} "
                                 "characters", "shorten it")
        fields[name] = value
    return fields
