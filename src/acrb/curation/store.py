"""Curation state: one SQLite database and one hash-chained audit log per curation folder.

A curation folder (default ``curation/``) holds ``curation.sqlite`` (curators, sessions, the
candidates being curated, every decision, the current selection per cell) and ``audit.jsonl``
(:mod:`acrb.curation.audit`). Every change goes through :meth:`CurationStore._write`: one
``BEGIN IMMEDIATE`` transaction that updates the tables, stores the sealed audit line in the
database and appends it to ``audit.jsonl`` before committing. Many threads and processes can
write at once (SQLite WAL mode with a busy timeout serialises them), and a crash leaves either
the whole decision or none of it; a line appended by a transaction that then failed is moved
aside the next time the store opens.

Tokens are stored only as sha256 digests; the token itself is shown once, when the curator is
added.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from acrb.curation.audit import GENESIS, Verification, canonical, seal, verify
from acrb.demographics import AGES, GENDERS, RACES
from acrb.errors import ConfigError, InputDataError
from acrb.storage import plain_value, sha256_file

#: The study's selection checklist, in its order, with the question each item asks.
CRITERIA: dict[str, str] = {
    "frontal_face": "Frontal face: the face looks at the camera, both eyes visible",
    "clear_focus": "Clear focus: the face is sharp, not blurred or pixelated",
    "proper_lighting": "Proper lighting: the face is neither dark nor washed out",
    "identifiable_features": "Identifiable features: eyes, nose and mouth unoccluded",
    "neutral_expression": "Neutral expression: no strong emotion or open mouth",
    "upright_posture": "Upright posture: the head is not strongly tilted",
}
ACTIONS = ("select", "reject", "deselect")
MAX_RATIONALE = 2000
MAX_NAME = 40
SESSION_SECONDS = 12 * 3600
DATABASE = "curation.sqlite"
AUDIT_LOG = "audit.jsonl"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS curators (
    name TEXT PRIMARY KEY, token_sha256 TEXT NOT NULL UNIQUE, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    sid_sha256 TEXT PRIMARY KEY, curator TEXT NOT NULL, csrf TEXT NOT NULL,
    expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS candidates (
    candidate_id TEXT PRIMARY KEY, cell TEXT NOT NULL, rank INTEGER NOT NULL,
    race TEXT NOT NULL, gender TEXT NOT NULL, age TEXT NOT NULL, origin TEXT NOT NULL,
    file TEXT NOT NULL, sha256 TEXT NOT NULL, width INTEGER, height INTEGER,
    dataset TEXT NOT NULL, prescreen TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS candidates_cell ON candidates (cell, rank);
CREATE TABLE IF NOT EXISTS decisions (
    seq INTEGER PRIMARY KEY, at TEXT NOT NULL, curator TEXT NOT NULL, cell TEXT NOT NULL,
    candidate_id TEXT, action TEXT NOT NULL, criteria TEXT NOT NULL, rationale TEXT NOT NULL,
    source TEXT NOT NULL, recorded_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS selection (
    cell TEXT PRIMARY KEY, candidate_id TEXT NOT NULL, seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS rejection (
    candidate_id TEXT PRIMARY KEY, seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY, line TEXT NOT NULL);
"""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def design_cells() -> list[tuple[str, str, str, str]]:
    """``(cell, race, gender, age)`` for every cell of the ACRB design, in design order."""
    return [(f"{r}_{g}_{a}", r, g, a) for r in RACES for g in GENDERS for a in AGES]


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Session:
    curator: str
    csrf: str


class CurationStore:
    """The curation folder's database and audit log (safe to share between threads)."""

    def __init__(self, workdir: Path, *, create: bool = False) -> None:
        self.workdir = Path(workdir)
        self.database = self.workdir / DATABASE
        self.log = self.workdir / AUDIT_LOG
        if not self.database.exists() and not create:
            raise InputDataError(
                f"no curation database in {self.workdir}",
                "start one with `acrb curate add-curator NAME` (or pass --workdir where it is)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._connect() as con:
            con.execute("PRAGMA journal_mode=WAL")
            con.executescript(_SCHEMA)
        self._set_aside_uncommitted_lines()

    # ------------------------------------------------------------------ connections

    def _connect(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(self.database, timeout=30.0, isolation_level=None,
                                  check_same_thread=False)
            con.row_factory = sqlite3.Row
            con.execute("PRAGMA busy_timeout = 30000")
            con.execute("PRAGMA synchronous = FULL")
            con.execute("PRAGMA foreign_keys = ON")
            self._local.con = con
        return con

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
            self._local.con = None

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        con = self._connect()
        con.execute("BEGIN IMMEDIATE")
        try:
            yield con
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")

    def _meta(self, con: sqlite3.Connection, key: str, default: str = "") -> str:
        row = con.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row["value"] if row else default

    def _set_meta(self, con: sqlite3.Connection, key: str, value: str) -> None:
        con.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE "
                    "SET value = excluded.value", (key, value))

    def _append(self, con: sqlite3.Connection, entry: dict[str, Any]) -> dict[str, Any]:
        """Seal ``entry`` onto the chain, inside the caller's write transaction."""
        seq = int(self._meta(con, "audit_seq", "0")) + 1
        sealed = seal({"at": now(), **entry}, seq, self._meta(con, "audit_head", GENESIS))
        line = canonical(sealed)
        con.execute("INSERT INTO audit (seq, line) VALUES (?, ?)", (seq, line))
        self._set_meta(con, "audit_seq", str(seq))
        self._set_meta(con, "audit_head", sealed["hash"])
        with open(self.log, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return sealed

    def _set_aside_uncommitted_lines(self) -> None:
        """Lines past the database's last entry were written by a transaction that never
        committed (a crash between the append and the commit): move them to a side file."""
        with self._write() as con:
            recorded = int(self._meta(con, "audit_seq", "0"))
            if not self.log.exists():
                return
            lines = self.log.read_text(encoding="utf-8").splitlines(keepends=True)
            if len(lines) <= recorded:
                return
            stored = [r["line"] for r in con.execute("SELECT line FROM audit ORDER BY seq")]
            if [x.rstrip("\n") for x in lines[:recorded]] != stored:
                return  # the log disagrees with the database: leave it for `verify`
            aside = self.log.with_name(f"{AUDIT_LOG}.uncommitted-{int(time.time())}")
            aside.write_text("".join(lines[recorded:]), encoding="utf-8")
            self.log.write_text("".join(lines[:recorded]), encoding="utf-8")

    # ------------------------------------------------------------------ audit

    def verify(self) -> Verification:
        """Check ``audit.jsonl`` against its own chain and against the database's copy.

        Runs under the write lock: a writer appends to the file before it commits, so reading
        while others write would see lines the database does not have yet and report them as
        tampering.
        """
        with self._write() as con:
            stored = [r["line"] for r in con.execute("SELECT line FROM audit ORDER BY seq")]
            return verify(self.log, expected_head=self._meta(con, "audit_head", GENESIS),
                          expected_lines=stored)

    def head(self) -> tuple[int, str]:
        con = self._connect()
        return int(self._meta(con, "audit_seq", "0")), self._meta(con, "audit_head", GENESIS)

    # ------------------------------------------------------------------ curators, sessions

    def add_curator(self, name: str) -> str:
        """Register a curator and return their token (shown once; only its hash is kept)."""
        if not _NAME.match(name):
            raise ConfigError(f"curator name {name!r} is not 1-{MAX_NAME} letters, digits, "
                              "'.', '_' or '-' starting with a letter or digit",
                              "choose a short name such as `alice` or `j.doe`")
        token = "acrb_" + secrets.token_urlsafe(32)
        with self._write() as con:
            if con.execute("SELECT 1 FROM curators WHERE name = ?", (name,)).fetchone():
                raise ConfigError(f"curator {name!r} already exists",
                                  "pick another name; a lost token is replaced with "
                                  "`acrb curate add-curator NAME --replace-token`")
            con.execute("INSERT INTO curators VALUES (?, ?, ?)", (name, _digest(token), now()))
            self._append(con, {"action": "add_curator", "curator": name})
        return token

    def replace_token(self, name: str) -> str:
        token = "acrb_" + secrets.token_urlsafe(32)
        with self._write() as con:
            if not con.execute("SELECT 1 FROM curators WHERE name = ?", (name,)).fetchone():
                raise ConfigError(f"no curator named {name!r}", "add them first")
            con.execute("UPDATE curators SET token_sha256 = ? WHERE name = ?",
                        (_digest(token), name))
            con.execute("DELETE FROM sessions WHERE curator = ?", (name,))
            self._append(con, {"action": "replace_token", "curator": name})
        return token

    def curators(self) -> list[str]:
        return [r["name"] for r in self._connect().execute(
            "SELECT name FROM curators ORDER BY name")]

    def curator_for_token(self, token: str) -> str | None:
        if not token or len(token) > 128:
            return None
        row = self._connect().execute("SELECT name FROM curators WHERE token_sha256 = ?",
                                      (_digest(token),)).fetchone()
        return row["name"] if row else None

    def login(self, token: str) -> tuple[str, Session] | None:
        """A new session for the token's curator: ``(session id, Session)``, or None."""
        curator = self.curator_for_token(token)
        if curator is None:
            return None
        sid, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        with self._write() as con:
            con.execute("DELETE FROM sessions WHERE expires < ?", (time.time(),))
            con.execute("INSERT INTO sessions VALUES (?, ?, ?, ?)",
                        (_digest(sid), curator, csrf, time.time() + SESSION_SECONDS))
            self._append(con, {"action": "login", "curator": curator})
        return sid, Session(curator, csrf)

    def session(self, sid: str | None) -> Session | None:
        if not sid or len(sid) > 128:
            return None
        row = self._connect().execute(
            "SELECT curator, csrf, expires FROM sessions WHERE sid_sha256 = ?",
            (_digest(sid),)).fetchone()
        if row is None or row["expires"] < time.time():
            return None
        return Session(row["curator"], row["csrf"])

    def logout(self, sid: str) -> None:
        session = self.session(sid)
        if session is None:
            return
        with self._write() as con:
            con.execute("DELETE FROM sessions WHERE sid_sha256 = ?", (_digest(sid),))
            self._append(con, {"action": "logout", "curator": session.curator})

    # ------------------------------------------------------------------ candidates

    def load_candidates(self, folder: Path) -> int:
        """Take the candidates (``candidates.parquet``, optional ``prescreen.parquet``) of
        ``folder`` into the database, or check that they are the ones already there.

        Decisions refer to candidates by id and sha256, so a candidate whose bytes changed
        since curation began is an error naming it, never a silent swap.
        """
        from acrb.sources.fairface import read_candidates

        folder = Path(folder)
        table = folder / "candidates.parquet"
        if not table.exists():
            raise InputDataError(
                f"{table} not found",
                "draw the candidates first: `acrb sources` with sources.kind: fairface")
        candidates = read_candidates(table)
        screens: dict[str, dict[str, Any]] = {}
        if (folder / "prescreen.parquet").exists():
            for row in pd.read_parquet(folder / "prescreen.parquet").to_dict(orient="records"):
                screens[row["candidate_id"]] = {k: plain_value(v) for k, v in row.items()}
        with self._write() as con:
            known = {r["candidate_id"]: r["sha256"]
                     for r in con.execute("SELECT candidate_id, sha256 FROM candidates")}
            changed = [c for c, s in zip(candidates["candidate_id"], candidates["sha256"],
                                         strict=True) if c in known and known[c] != s]
            if changed:
                raise InputDataError(
                    f"{len(changed)} candidate(s) in {folder} differ from the ones being "
                    f"curated in {self.workdir}: {', '.join(changed[:5])}",
                    "point --candidates at the candidates this curation started with, or "
                    "start a new curation folder for the new draw")
            added = 0
            for row in candidates.to_dict(orient="records"):
                if row["candidate_id"] in known:
                    continue
                con.execute(
                    "INSERT INTO candidates VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (row["candidate_id"], row["cell"], int(row["rank"]), row["race"],
                     row["gender"], row["age"], row["origin"], row["file"], row["sha256"],
                     int(row["width"]), int(row["height"]), row["dataset"],
                     json.dumps(screens.get(row["candidate_id"], {}))))
                added += 1
            self._set_meta(con, "candidates_dir", str(folder.resolve()))
            present = {d: set(candidates[d]) | set(json.loads(self._meta(con, "design", "{}"))
                                                   .get(d, [])) for d in ("race", "gender", "age")}
            self._set_meta(con, "design", json.dumps({
                "race": [r for r in RACES if r in present["race"]],
                "gender": [g for g in GENDERS if g in present["gender"]],
                "age": [a for a in AGES if a in present["age"]]}))
            if added:
                self._append(con, {"action": "load_candidates", "curator": "",
                                   "folder": str(folder), "added": added,
                                   "table_sha256": sha256_file(table)})
        return added

    def cells(self) -> list[tuple[str, str, str, str]]:
        """The cells being curated: every race x gender x age combination of the design whose
        values occur among the candidates (all 84 for a full draw). A cell whose draw came
        up empty is still a cell, shown as having no candidates and reported missing."""
        design = json.loads(self._meta(self._connect(), "design", "{}"))
        if not design:
            return design_cells()
        return [c for c in design_cells() if c[1] in design["race"]
                and c[2] in design["gender"] and c[3] in design["age"]]

    def candidates_dir(self) -> Path | None:
        value = self._meta(self._connect(), "candidates_dir")
        return Path(value) if value else None

    def candidate(self, candidate_id: str) -> dict[str, Any] | None:
        if len(candidate_id) > 200:
            return None
        row = self._connect().execute("SELECT * FROM candidates WHERE candidate_id = ?",
                                      (candidate_id,)).fetchone()
        return _candidate(row) if row else None

    def image_path(self, candidate_id: str) -> Path | None:
        """The file of a known candidate, inside the candidates folder; None otherwise."""
        found = self.candidate(candidate_id)
        root = self.candidates_dir()
        if found is None or root is None:
            return None
        path = (root / found["file"]).resolve()
        if not path.is_relative_to(root.resolve()) or not path.is_file():
            return None
        return path

    # ------------------------------------------------------------------ decisions

    def decide(self, curator: str, cell: str, action: str, *, candidate_id: str | None = None,
               criteria: dict[str, bool] | None = None, rationale: str = "",
               source: str = "web", extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Record one decision and return its sealed audit entry.

        ``select`` makes ``candidate_id`` the cell's portrait (replacing an earlier choice);
        ``reject`` marks it unsuitable (and clears the selection if it was the one chosen);
        ``deselect`` clears the cell's selection. ``extra`` fields go into the audit entry;
        ``extra["recorded_at"]`` is when the decision was originally made, for imports.
        """
        if action not in ACTIONS:
            raise InputDataError(f"action {action!r} is not one of {', '.join(ACTIONS)}",
                                 "use select, reject or deselect")
        if len(rationale) > MAX_RATIONALE:
            raise InputDataError(f"rationale is {len(rationale)} characters; at most "
                                 f"{MAX_RATIONALE}", "shorten it")
        unknown = sorted(set(criteria or {}) - set(CRITERIA))
        if unknown:
            raise InputDataError(f"unknown criteria {unknown}", f"use {', '.join(CRITERIA)}")
        ticks = {name: bool((criteria or {}).get(name, False)) for name in CRITERIA}
        with self._write() as con:
            if source == "web" and not con.execute(
                    "SELECT 1 FROM curators WHERE name = ?", (curator,)).fetchone():
                raise InputDataError(f"no curator named {curator!r}", "log in again")
            if cell not in {c for c, *_ in self.cells()}:
                raise InputDataError(f"cell {cell!r} is not in the design",
                                     "use <Race>_<Gender>_<Age>, e.g. Black_Female_20s")
            digest = ""
            if action != "deselect":
                row = con.execute("SELECT cell, sha256 FROM candidates WHERE candidate_id = ?",
                                  (candidate_id or "",)).fetchone()
                if row is None or row["cell"] != cell:
                    raise InputDataError(f"candidate {candidate_id!r} is not a candidate of "
                                         f"cell {cell}", "pick one of the cell's candidates")
                digest = row["sha256"]
            entry = self._append(con, {
                "action": action, "curator": curator, "cell": cell,
                "candidate_id": candidate_id if action != "deselect" else None,
                "candidate_sha256": digest, "criteria": ticks, "rationale": rationale,
                "source": source, **(extra or {}),
            })
            seq = entry["seq"]
            con.execute("INSERT INTO decisions VALUES (?,?,?,?,?,?,?,?,?,?)",
                        (seq, entry["at"], curator, cell, entry["candidate_id"], action,
                         json.dumps(ticks), rationale, source,
                         str((extra or {}).get("recorded_at") or entry["at"])))
            if action == "select":
                con.execute("INSERT INTO selection VALUES (?, ?, ?) ON CONFLICT(cell) DO "
                            "UPDATE SET candidate_id = excluded.candidate_id, "
                            "seq = excluded.seq", (cell, candidate_id, seq))
                con.execute("DELETE FROM rejection WHERE candidate_id = ?", (candidate_id,))
            elif action == "reject":
                con.execute("INSERT INTO rejection VALUES (?, ?) ON CONFLICT(candidate_id) DO "
                            "UPDATE SET seq = excluded.seq", (candidate_id, seq))
                con.execute("DELETE FROM selection WHERE cell = ? AND candidate_id = ?",
                            (cell, candidate_id))
            else:
                con.execute("DELETE FROM selection WHERE cell = ?", (cell,))
        return entry

    def note(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Append a non-decision entry (an import summary, a finalization) to the log."""
        with self._write() as con:
            return self._append(con, entry)

    def decision(self, seq: int) -> dict[str, Any]:
        row = self._connect().execute("SELECT * FROM decisions WHERE seq = ?",
                                      (seq,)).fetchone()
        return _decision(row)

    def decisions(self, cell: str | None = None) -> list[dict[str, Any]]:
        con = self._connect()
        rows = (con.execute("SELECT * FROM decisions WHERE cell = ? ORDER BY seq", (cell,))
                if cell else con.execute("SELECT * FROM decisions ORDER BY seq"))
        return [_decision(r) for r in rows]

    def selections(self) -> dict[str, dict[str, Any]]:
        """cell -> the decision that selected its current portrait."""
        con = self._connect()
        rows = con.execute("SELECT d.* FROM selection s JOIN decisions d ON d.seq = s.seq")
        return {r["cell"]: _decision(r) for r in rows}

    def rejections(self) -> dict[str, dict[str, Any]]:
        con = self._connect()
        rows = con.execute("SELECT d.* FROM rejection r JOIN decisions d ON d.seq = r.seq")
        return {r["candidate_id"]: _decision(r) for r in rows}

    # ------------------------------------------------------------------ views

    def grid(self) -> list[dict[str, Any]]:
        """One row per design cell: its candidates count, flags, selection and rejections."""
        con = self._connect()
        counts = {r["cell"]: (r["n"], r["flagged"]) for r in con.execute(
            "SELECT cell, COUNT(*) AS n, SUM(json_extract(prescreen, '$.flags') != '') "
            "AS flagged FROM candidates GROUP BY cell")}
        rejected: dict[str, int] = {}
        for r in con.execute("SELECT d.cell FROM rejection r JOIN decisions d "
                             "ON d.seq = r.seq"):
            rejected[r["cell"]] = rejected.get(r["cell"], 0) + 1
        chosen = self.selections()
        rows = []
        for cell, race, gender, age in self.cells():
            n, flagged = counts.get(cell, (0, 0))
            rows.append({"cell": cell, "race": race, "gender": gender, "age": age,
                         "candidates": n, "flagged": int(flagged or 0),
                         "rejected": rejected.get(cell, 0), "selection": chosen.get(cell)})
        return rows

    def cell_candidates(self, cell: str) -> list[dict[str, Any]]:
        rows = self._connect().execute(
            "SELECT * FROM candidates WHERE cell = ? ORDER BY rank", (cell,))
        return [_candidate(r) for r in rows]


def _candidate(row: sqlite3.Row) -> dict[str, Any]:
    found = dict(row)
    found["prescreen"] = json.loads(found["prescreen"] or "{}")
    return found


def _decision(row: sqlite3.Row) -> dict[str, Any]:
    found = dict(row)
    found["criteria"] = json.loads(found["criteria"])
    return found
