"""The accounts of a tool's store: token holders, their sessions, and the audit lines of both.

Curation's curators and review's raters are the same thing in different words: a name that
holds a login token (:class:`~acrb.web.credentials.TokenHolders`), sessions opened with that
token (:class:`~acrb.web.sessions.SessionTable`), and an audit line for every token issued,
login and logout. :class:`AccountStore` holds that logic once; a store names its holders in
a :class:`Role` (its tables, the word its audit lines and messages use, its CLI command) and
keeps its public method names (``add_curator``, ``raters``...) as aliases.

Only the standard library is imported, so a store works without the web extra installed.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from acrb.errors import ConfigError, InputDataError
from acrb.web.audit import AUDIT_SCHEMA, AuditTrail, Verification, utc_now
from acrb.web.credentials import MAX_USER_NAME, USER_NAME, TokenHolders
from acrb.web.database import Database
from acrb.web.sessions import Session, SessionTable


@dataclass(frozen=True)
class Role:
    """The token holders of one tool, in that tool's words.

    ``word`` (``curator``, ``rater``) names them in messages and is the key of the holder's
    name in audit lines (``{"action": "add_rater", "rater": ...}``); ``add_command`` is the
    CLI command that adds one (``acrb review add-rater NAME``); ``name_fix`` is the advice
    for a name that is refused.
    """

    word: str
    holders: TokenHolders
    sessions: SessionTable
    add_command: str
    name_fix: str

    @property
    def tool_command(self) -> str:
        """The tool's command group (``acrb curate``), the start of :attr:`add_command`."""
        return " ".join(self.add_command.split()[:2])


class AccountStore:
    """A tool's folder (database and audit log) with its token holders and their sessions.

    Subclasses set :attr:`role`, call :meth:`_open` from their constructor, and use
    ``self._db`` and ``self._audit`` for their own tables. Safe to share between threads (the
    database keeps one connection per thread).
    """

    role: ClassVar[Role]
    workdir: Path
    database: Path
    log: Path
    _db: Database
    _audit: AuditTrail

    def _open(self, workdir: Path, database: str, audit_log: str, schema: str, *,
              create: bool, missing: InputDataError) -> None:
        """Open (``create``: make) the folder's database, with the role's tables, ``schema``
        and the audit table, and its audit log; ``missing`` is raised when the database is
        not there and ``create`` is false."""
        self.workdir = Path(workdir)
        self.database = self.workdir / database
        self.log = self.workdir / audit_log
        if not self.database.exists() and not create:
            raise missing
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._db = Database(self.database, "\n".join(
            (self.role.holders.schema, self.role.sessions.schema, schema, AUDIT_SCHEMA)))
        self._audit = AuditTrail(self._db, self.log,
                                 f"{self.role.tool_command} verify {self.workdir}")
        self._audit.set_aside_lines_past_head(self._committed_after)

    def _committed_after(self, con: sqlite3.Connection, seq: int) -> bool | None:
        """Whether the store's tables hold a change that an audit entry after ``seq``
        recorded. False lets a torn last log line (a crash mid-write) be resolved when the
        store opens (:meth:`acrb.web.audit.AuditTrail.set_aside_lines_past_head`); None, the
        default, says the store cannot tell, so a person resolves it."""
        return None

    def close(self) -> None:
        """Close this thread's database connection."""
        self._db.close()

    def verify(self) -> Verification:
        """Check ``audit.jsonl`` against its own chain and against the database's copy, and
        that no lines set aside from past its head wait for a person (under the write lock;
        see :meth:`acrb.web.audit.AuditTrail.verify`)."""
        return self._audit.verify()

    def resolve_set_aside(self, by: str = "") -> list[dict[str, Any]]:
        """Accept the lines set aside from past the log's head (a write that never
        committed), each side file logged with its digest
        (:meth:`acrb.web.audit.AuditTrail.resolve_set_aside`); return the entries logged."""
        return self._audit.resolve_set_aside(by)

    def head(self) -> tuple[int, str]:
        """``(entries, hash of the last)`` of the audit log, as the database recorded them."""
        return self._audit.head()

    def add_user(self, name: str) -> str:
        """Register a token holder and return their token (shown once; only its hash is
        kept)."""
        word = self.role.word
        if not USER_NAME.match(name):
            raise ConfigError(f"{word} name {name!r} is not 1-{MAX_USER_NAME} letters, "
                              "digits, '.', '_' or '-' starting with a letter or digit",
                              self.role.name_fix)
        with self._db.write() as con:
            if self.role.holders.exists(con, name):
                raise ConfigError(f"{word} {name!r} already exists",
                                  "pick another name; a lost token is replaced with "
                                  f"`{self.role.add_command} --replace-token`")
            token = self.role.holders.add(con, name, created_at=utc_now())
            self._audit.append(con, {"action": f"add_{word}", word: name})
        return token

    def replace_token(self, name: str) -> str:
        """Issue a holder a new token (the old one and their sessions stop working)."""
        word = self.role.word
        with self._db.write() as con:
            if not self.role.holders.exists(con, name):
                raise ConfigError(f"no {word} named {name!r}", "add them first")
            token = self.role.holders.replace(con, name)
            self.role.sessions.close_all(con, name)
            self._audit.append(con, {"action": "replace_token", word: name})
        return token

    def users(self) -> list[str]:
        """Every holder's name, sorted."""
        return self.role.holders.names(self._db.connection())

    def user_for_token(self, token: str) -> str | None:
        """The holder of ``token``, or None."""
        return self.role.holders.holder(self._db.connection(), token)

    def login(self, token: str) -> tuple[str, Session] | None:
        """A new session for the token's holder: ``(session id, Session)``, or None."""
        user = self.user_for_token(token)
        if user is None:
            return None
        with self._db.write() as con:
            found = self.role.sessions.open(con, user)
            self._audit.append(con, {"action": "login", self.role.word: user})
        return found

    def session(self, sid: str | None) -> Session | None:
        """The live session with id ``sid`` (its ``user`` is the holder), or None."""
        return self.role.sessions.find(self._db.connection(), sid)

    def logout(self, sid: str) -> None:
        """End the session ``sid`` and log it; an unknown or expired one is ignored."""
        session = self.session(sid)
        if session is None:
            return
        with self._db.write() as con:
            self.role.sessions.close(con, sid)
            self._audit.append(con, {"action": "logout", self.role.word: session.user})
