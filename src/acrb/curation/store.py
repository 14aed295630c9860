"""Curation state: one SQLite database and one hash-chained audit log per curation folder.

A curation folder (default ``curation/``) holds ``curation.sqlite`` (curators, sessions, the
candidates being curated, every decision, the current selection per cell) and ``audit.jsonl``
(:mod:`acrb.web.audit`). Every change is one write transaction of the shared
:class:`~acrb.web.database.Database` that updates the tables, stores the sealed audit line in
the database and appends it to ``audit.jsonl`` before committing
(:meth:`~acrb.web.audit.AuditTrail.append`). Many threads and processes can write at once
(SQLite WAL mode with a busy timeout serialises them), and a crash leaves either the whole
decision or none of it. A line appended by a transaction that rolled back is cut from the
log; one left by a process that died before its commit is moved to a side file the next time
the store opens, and `acrb curate verify` fails naming it until it is resolved.

Curators, their tokens (stored only as sha256 digests; the token itself is shown once, when
the curator is added) and their sessions are the web layer's (:mod:`acrb.web.accounts`,
shared with the review tool), in this database's ``curators`` and ``sessions`` tables.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pandas as pd

from acrb.demographics import AGES, GENDERS, RACES
from acrb.errors import InputDataError
from acrb.storage import plain_value, sha256_file
from acrb.web.accounts import AccountStore, Role
from acrb.web.credentials import TokenHolders
from acrb.web.database import read_meta, write_meta
from acrb.web.sessions import SessionTable

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
DATABASE = "curation.sqlite"
AUDIT_LOG = "audit.jsonl"
CURATORS = TokenHolders("curators")
SESSIONS = SessionTable("sessions", user_column="curator")

_SCHEMA = """
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
"""


def design_cells() -> list[tuple[str, str, str, str]]:
    """``(cell, race, gender, age)`` for every cell of the ACRB design, in design order."""
    return [(f"{r}_{g}_{a}", r, g, a) for r in RACES for g in GENDERS for a in AGES]


class CurationStore(AccountStore):
    """The curation folder's database and audit log (safe to share between threads).

    Curators, their tokens and sessions are :class:`~acrb.web.accounts.AccountStore`'s; the
    names below are the curation words for its methods.
    """

    role = Role("curator", CURATORS, SESSIONS, "acrb curate add-curator NAME",
                "choose a short name such as `alice` or `j.doe`")

    def __init__(self, workdir: Path, *, create: bool = False) -> None:
        self._open(workdir, DATABASE, AUDIT_LOG, _SCHEMA, create=create, missing=InputDataError(
            f"no curation database in {workdir}",
            "start one with `acrb curate add-curator NAME` (or pass --workdir where it is)"))

    add_curator = AccountStore.add_user
    curators = AccountStore.users
    curator_for_token = AccountStore.user_for_token

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
                screens[row["candidate_id"]] = {str(k): plain_value(v) for k, v in row.items()}
        with self._db.write() as con:
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
            write_meta(con, "candidates_dir", str(folder.resolve()))
            present = {d: set(candidates[d]) | set(json.loads(read_meta(con, "design", "{}"))
                                                   .get(d, [])) for d in ("race", "gender", "age")}
            write_meta(con, "design", json.dumps({
                "race": [r for r in RACES if r in present["race"]],
                "gender": [g for g in GENDERS if g in present["gender"]],
                "age": [a for a in AGES if a in present["age"]]}))
            if added:
                self._audit.append(con, {"action": "load_candidates", "curator": "",
                                   "folder": str(folder), "added": added,
                                   "table_sha256": sha256_file(table)})
        return added

    def cells(self) -> list[tuple[str, str, str, str]]:
        """The cells being curated: every race x gender x age combination of the design whose
        values occur among the candidates (all 84 for a full draw). A cell whose draw came
        up empty is still a cell, shown as having no candidates and reported missing."""
        design = json.loads(read_meta(self._db.connection(), "design", "{}"))
        if not design:
            return design_cells()
        return [c for c in design_cells() if c[1] in design["race"]
                and c[2] in design["gender"] and c[3] in design["age"]]

    def candidates_dir(self) -> Path | None:
        value = read_meta(self._db.connection(), "candidates_dir")
        return Path(value) if value else None

    def candidate(self, candidate_id: str) -> dict[str, Any] | None:
        if len(candidate_id) > 200:
            return None
        row = self._db.connection().execute("SELECT * FROM candidates WHERE candidate_id = ?",
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
        with self._db.write() as con:
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
            entry = self._audit.append(con, {
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
        with self._db.write() as con:
            return self._audit.append(con, entry)

    def decision(self, seq: int) -> dict[str, Any]:
        row = self._db.connection().execute("SELECT * FROM decisions WHERE seq = ?",
                                      (seq,)).fetchone()
        return _decision(row)

    def decisions(self, cell: str | None = None) -> list[dict[str, Any]]:
        con = self._db.connection()
        rows = (con.execute("SELECT * FROM decisions WHERE cell = ? ORDER BY seq", (cell,))
                if cell else con.execute("SELECT * FROM decisions ORDER BY seq"))
        return [_decision(r) for r in rows]

    def selections(self) -> dict[str, dict[str, Any]]:
        """cell -> the decision that selected its current portrait."""
        con = self._db.connection()
        rows = con.execute("SELECT d.* FROM selection s JOIN decisions d ON d.seq = s.seq")
        return {r["cell"]: _decision(r) for r in rows}

    def rejections(self) -> dict[str, dict[str, Any]]:
        con = self._db.connection()
        rows = con.execute("SELECT d.* FROM rejection r JOIN decisions d ON d.seq = r.seq")
        return {r["candidate_id"]: _decision(r) for r in rows}

    # ------------------------------------------------------------------ views

    def grid(self) -> list[dict[str, Any]]:
        """One row per design cell: its candidates count, flags, selection and rejections."""
        con = self._db.connection()
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
        rows = self._db.connection().execute(
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
