"""The web layer every ACRB tool for people (curation, human review) is built from.

A tool brings its own store, pages and routes; from here it takes the same defences and the
same record of who did what:

- :mod:`acrb.web.security`: security headers and CSP, Host check, body limit, cross-site guard
  (:func:`security_middleware`), and :func:`local_hosts`;
- :mod:`acrb.web.credentials`: login tokens (issued once, stored as sha256;
  :class:`TokenHolders`), bearer-token parsing, constant-time secret comparison;
- :mod:`acrb.web.sessions`: sessions in the tool's SQLite database (:class:`SessionTable`),
  per-session CSRF tokens, cookie names per tool (:class:`SessionCookies`);
- :mod:`acrb.web.forms`: form posts read within bounds;
- :mod:`acrb.web.database` and :mod:`acrb.web.audit`: the tool's SQLite database and its
  hash-chained audit log (:class:`AuditTrail`, :func:`verify`);
- :mod:`acrb.web.accounts`: the store's side of token holders (:class:`AccountStore`: open the
  folder, add a holder, replace a token, log in, find a session, log out, each logged), named
  in the tool's words by a :class:`Role`;
- :mod:`acrb.web.pages`: the app's side (:class:`ToolPages`: login, logout, error pages,
  ``/app.css`` and ``/app.js``, :func:`image_response`), with the shared templates
  ``base.html``, ``login.html`` and ``error.html`` and the stylesheet ``base.css``, worded per
  tool by a :class:`PageText`;
- :mod:`acrb.web.serving`: :func:`serve` and the warning for a non-loopback host.

Names are imported on first use: the database, audit, credential, session and account parts
need only the standard library, so a tool's store and `acrb curate verify` work without
Starlette installed; the middleware, forms, pages and serving need the ``fairface`` extra.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from acrb.web.accounts import AccountStore, Role
    from acrb.web.audit import AuditTrail, Verification, canonical, entry_hash, seal, verify
    from acrb.web.credentials import TokenHolders, bearer_token, issue_secret, secret_matches
    from acrb.web.database import Database
    from acrb.web.forms import InvalidRequest, form_fields, form_items
    from acrb.web.pages import IMAGE_TYPES, PageText, ToolPages, image_response
    from acrb.web.security import CSP, local_hosts, same_origin, security_middleware
    from acrb.web.serving import exposure_warning, serve
    from acrb.web.sessions import Session, SessionCookies, SessionTable, csrf_field_matches

_EXPORTS: dict[str, tuple[str, ...]] = {
    "accounts": ("AccountStore", "Role"),
    "audit": ("AuditTrail", "Verification", "canonical", "entry_hash", "seal", "verify"),
    "credentials": ("TokenHolders", "bearer_token", "issue_secret", "secret_matches"),
    "database": ("Database",),
    "forms": ("InvalidRequest", "form_fields", "form_items"),
    "pages": ("IMAGE_TYPES", "PageText", "ToolPages", "image_response"),
    "security": ("CSP", "local_hosts", "same_origin", "security_middleware"),
    "serving": ("exposure_warning", "serve"),
    "sessions": ("Session", "SessionCookies", "SessionTable", "csrf_field_matches"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [
    "CSP",
    "IMAGE_TYPES",
    "AccountStore",
    "AuditTrail",
    "Database",
    "InvalidRequest",
    "PageText",
    "Role",
    "Session",
    "SessionCookies",
    "SessionTable",
    "TokenHolders",
    "ToolPages",
    "Verification",
    "bearer_token",
    "canonical",
    "csrf_field_matches",
    "entry_hash",
    "exposure_warning",
    "form_fields",
    "form_items",
    "image_response",
    "issue_secret",
    "local_hosts",
    "same_origin",
    "seal",
    "secret_matches",
    "security_middleware",
    "serve",
    "verify",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
