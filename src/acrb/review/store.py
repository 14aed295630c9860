"""Human review state: one SQLite database and one hash-chained audit log per review folder.

A review folder (default ``review-work/``) holds ``review.sqlite`` and ``audit.jsonl``
(:mod:`acrb.web.audit`), built on the same web layer as curation (:mod:`acrb.web`): raters
hold login tokens stored as sha256 (:class:`~acrb.web.credentials.TokenHolders`), sessions
live in the database (:class:`~acrb.web.sessions.SessionTable`), and every change is one
``BEGIN IMMEDIATE`` transaction that also appends its sealed audit line.

What is rated is a review set: a Parquet table of :class:`~acrb.records.ReviewItemRecord`
rows (``data/review/set/items.parquet``), loaded once with :meth:`ReviewStore.load_set`, which
records the table's sha256. Items are handed out by **claims**, one open claim per rater:

- each item goes to ``raters_per_item`` (k) distinct raters, never to the same rater twice;
- a share ``repeat_fraction`` of each rater's items comes back to them once more, later,
  as a repeat (kept to measure consistency within a rater);
- a paired item (``paired_output_path`` set) is shown with its two outputs in an order drawn
  at random for that showing, and the order is recorded with the rating;
- a rater who comes back gets their open claim back (resume); a claim left open for
  :data:`CLAIM_SECONDS` is released when another claim is made, so an abandoned item goes to
  someone else.

A claim is chosen and written in one write transaction, so 30 raters asking at once are
served one after the other by SQLite's lock: no item is claimed by more than k raters and no
rater claims an item twice. The database enforces the second rule itself (a unique index).
A rating (:meth:`ReviewStore.rate`) is accepted only for the rater's open claim, and it is
stored and appended to the audit log in one transaction. So the log's ``rate`` entries say
what the ``ratings`` table must hold, and :meth:`ReviewStore.verify` checks that it does: a
row edited, deleted or inserted behind the log fails verify (and so ``serve`` and
``finalize``), naming the rating. A torn last log line that committed no rating (a crash
mid-write) is resolved when the folder is opened, logged with its sha256.

The age question is settled with the folder too (``age_question``): ``change``, ACRB's unipolar
``age_change`` (1 the same .. 5 a complete change), or ``direction``, the study's bipolar item
(1 much younger, 3 no change, 5 much older), kept as ``age_direction`` with ``age_change`` read
from its distance to "no change" (:func:`acrb.review.scales.age_from_direction`, as a survey
import reads the same item).
"""

from __future__ import annotations

import json
import math
import random
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from acrb.errors import ConfigError, InputDataError
from acrb.records import RATED_AXES, RatingRecord, ReviewItemRecord, read_table
from acrb.review.scales import age_from_direction, asked_axes
from acrb.storage import content_hash, plain_value, sha256_file
from acrb.web.accounts import AccountStore, Role
from acrb.web.audit import Verification, utc_now
from acrb.web.credentials import TokenHolders
from acrb.web.database import read_meta, write_meta
from acrb.web.sessions import SessionTable

DATABASE = "review.sqlite"
AUDIT_LOG = "audit.jsonl"
RATERS = TokenHolders("raters")
SESSIONS = SessionTable("sessions", user_column="rater")
#: An open claim older than this (seconds) is released when another rater needs an item.
CLAIM_SECONDS = 3600.0
#: Longest time on one item that is recorded (ms); longer means the rater was away: None.
MAX_DURATION_MS = 3_600_000
#: How far a client's time on an item may exceed the server's (ms): rounding and clocks.
CLOCK_SLACK_MS = 2000
#: A repeat comes back only after at least this many other items of the same rater (unless
#: the rater has nothing else left), so it is not recognised from a moment before.
REPEAT_GAP = 3
#: The outputs of an item, as ratings name them.
OUTPUTS = ("edited", "feature")
#: Each axis as people read it: the question and the words of 1..5, the study's rubric
#: (edit success 1 no change .. 5 fully faithful; skin tone 1 much darker, 3 no change,
#: 5 much lighter; race, gender and age change 1 the same .. 5 a complete change; age
#: direction, asked instead of age change under ``age_question: direction``, 1 much younger,
#: 3 no change, 5 much older).
RUBRIC: dict[str, tuple[str, tuple[str, str, str, str, str]]] = {
    "edit_success": ("Did the edit do what the instruction asks?",
                     ("no change", "a trace of it", "partly", "mostly", "fully faithful")),
    "skin_tone": ("How did the skin tone change from the source?",
                  ("much darker", "somewhat darker", "no change", "somewhat lighter",
                   "much lighter")),
    "race_change": ("Does the person appear to be of a different race or ethnicity?",
                    ("the same", "slightly different", "noticeably different",
                     "mostly different", "a complete change")),
    "gender_change": ("Does the person appear to be of a different gender?",
                      ("the same", "slightly different", "noticeably different",
                       "mostly different", "a complete change")),
    "age_change": ("Does the person appear to be of a different age (where the instruction "
                   "did not ask for it)?",
                   ("the same", "slightly different", "noticeably different",
                    "mostly different", "a complete change")),
    "age_direction": ("Does the person look younger or older than in the source (apart from "
                      "any age change the instruction asks for)?",
                      ("much younger", "somewhat younger", "no change", "somewhat older",
                       "much older")),
}
assert tuple(RUBRIC) == RATED_AXES
#: The age questions a review folder may ask (``review.age_question``), the first the default.
AGE_QUESTIONS = ("change", "direction")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    item_id TEXT PRIMARY KEY, position INTEGER NOT NULL, paired INTEGER NOT NULL,
    record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS claims (
    claim_id INTEGER PRIMARY KEY AUTOINCREMENT, rater TEXT NOT NULL,
    item_id TEXT NOT NULL REFERENCES items (item_id), repeat INTEGER NOT NULL,
    shown_order TEXT NOT NULL, claimed_at REAL NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('open', 'done', 'released')),
    audit_seq INTEGER);
CREATE UNIQUE INDEX IF NOT EXISTS claims_once ON claims (rater, item_id, repeat)
    WHERE state != 'released';
CREATE UNIQUE INDEX IF NOT EXISTS claims_one_open ON claims (rater) WHERE state = 'open';
CREATE INDEX IF NOT EXISTS claims_item ON claims (item_id, repeat, state);
CREATE TABLE IF NOT EXISTS ratings (
    rating_id TEXT PRIMARY KEY, claim_id INTEGER NOT NULL REFERENCES claims (claim_id),
    rater TEXT NOT NULL, item_id TEXT NOT NULL, output TEXT NOT NULL, shown_first INTEGER,
    edit_success INTEGER, skin_tone INTEGER, race_change INTEGER, gender_change INTEGER,
    age_change INTEGER, repeat INTEGER NOT NULL, duration_ms INTEGER,
    created_at TEXT NOT NULL, audit_seq INTEGER NOT NULL, age_direction INTEGER);
"""
#: Columns added to a table after its first release: a database made before gets them when
#: opened, NULL in the rows it holds (``age_direction`` last in ``ratings`` for that reason).
_ADDED_COLUMNS = (("ratings", "age_direction", "INTEGER"),)
_SETTINGS = ("raters_per_item", "repeat_fraction", "age_question")
#: What a setting not stored reads as: a folder made before ``age_question`` asked ACRB's own
#: age question.
_SETTING_DEFAULTS = {"raters_per_item": "3", "repeat_fraction": "0.05", "age_question": "change"}


@dataclass(frozen=True)
class Claim:
    """An item handed to a rater: what to show and in which order.

    ``shown_order`` names the outputs left to right (``("edited",)`` for a single output,
    ``("feature", "edited")`` for a pair whose feature-arm output was drawn to the left).
    """

    claim_id: int
    rater: str
    item: ReviewItemRecord
    repeat: bool
    shown_order: tuple[str, ...]
    claimed_at: float


@dataclass(frozen=True)
class RaterProgress:
    """One rater's count of rated items (first showings), repeats, and whether an item is
    open; ``available``: items that may still go to them now (others may take them first)."""

    rater: str
    rated: int
    repeats: int
    open: bool
    available: int


class ReviewStore(AccountStore):
    """The review folder's database and audit log (safe to share between threads).

    ``create=True`` makes the folder if needed; a new folder records ``raters_per_item`` (k),
    ``repeat_fraction`` and ``age_question`` (defaults 3, 0.05 and ``change``, the params'
    defaults). Opening an existing folder with different values is an error: the assignment
    and the ratings already made depend on them.
    Raters, their tokens and sessions are :class:`~acrb.web.accounts.AccountStore`'s.
    """

    role = Role("rater", RATERS, SESSIONS, "acrb review add-rater NAME",
                "use a pseudonym such as `r01`, never a person's name or e-mail")

    def __init__(self, workdir: Path, *, create: bool = False,
                 raters_per_item: int | None = None,
                 repeat_fraction: float | None = None,
                 age_question: str | None = None) -> None:
        self._open(workdir, DATABASE, AUDIT_LOG, _SCHEMA, create=create, missing=InputDataError(
            f"no review database in {workdir}",
            "start one with `acrb review init` (or pass --workdir where it is)"))
        self._add_missing_columns()
        # Unpredictable to raters: the order of a pair and which item comes back.
        self._random = random.SystemRandom()
        self._settle(raters_per_item, repeat_fraction, age_question)

    def _add_missing_columns(self) -> None:
        """Give a database made by an earlier ACRB the columns added since (``CREATE TABLE
        IF NOT EXISTS`` leaves an existing table as it was), so its ratings still read."""
        def missing(con: sqlite3.Connection) -> list[tuple[str, str, str]]:
            return [(table, column, kind) for table, column, kind in _ADDED_COLUMNS
                    if column not in {r["name"] for r in
                                      con.execute(f"PRAGMA table_info({table})")}]

        if not missing(self._db.connection()):
            return
        # Looked at again under the write lock: another process may have added them meanwhile.
        # Not an audit entry: no rating changes, the old rows only gain an unknown field.
        with self._db.write() as con:
            for table, column, kind in missing(con):
                con.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    def _settle(self, raters_per_item: int | None, repeat_fraction: float | None,
                age_question: str | None) -> None:
        if raters_per_item is not None and raters_per_item < 1:
            raise ConfigError(f"raters_per_item is {raters_per_item}", "use 1 or more")
        if repeat_fraction is not None and not 0 <= repeat_fraction <= 1:
            raise ConfigError(f"repeat_fraction is {repeat_fraction}", "use 0 to 1")
        if age_question is not None and age_question not in AGE_QUESTIONS:
            raise ConfigError(f"age_question is {str(age_question)[:40]!r}",
                              f"use one of {', '.join(AGE_QUESTIONS)}")
        with self._db.write() as con:
            stored = {key: read_meta(con, key) for key in _SETTINGS}
            if not stored["raters_per_item"]:
                k = 3 if raters_per_item is None else raters_per_item
                fraction = 0.05 if repeat_fraction is None else repeat_fraction
                question = AGE_QUESTIONS[0] if age_question is None else age_question
                write_meta(con, "raters_per_item", str(k))
                write_meta(con, "repeat_fraction", repr(float(fraction)))
                write_meta(con, "age_question", question)
                self._audit.append(con, {"action": "init", "rater": "",
                                         "raters_per_item": k, "repeat_fraction": fraction,
                                         "age_question": question})
                return
        given: dict[str, int | float | str | None] = {
            "raters_per_item": raters_per_item, "repeat_fraction": repeat_fraction,
            "age_question": age_question}
        for key, value in given.items():
            if value is None:
                continue
            known = stored[key] or _SETTING_DEFAULTS[key]
            same = value == known if isinstance(value, str) else float(value) == float(known)
            if not same:
                raise ConfigError(
                    f"{self.workdir} was started with review.{key} = {known}, "
                    f"params now say {value}",
                    f"set review.{key} back to {known}, or start a new review folder "
                    "(--workdir) for the new setting")

    # ------------------------------------------------------------------ settings, audit

    @property
    def raters_per_item(self) -> int:
        """k: distinct raters each item goes to."""
        return int(read_meta(self._db.connection(), "raters_per_item", "3"))

    @property
    def repeat_fraction(self) -> float:
        """Share of each rater's items shown to them a second time."""
        return float(read_meta(self._db.connection(), "repeat_fraction", "0.05"))

    @property
    def age_question(self) -> str:
        """The age question asked: ``change`` (``age_change``, 1 the same .. 5 a complete
        change) or ``direction`` (``age_direction``, 1 much younger .. 5 much older)."""
        return read_meta(self._db.connection(), "age_question",
                         _SETTING_DEFAULTS["age_question"])

    @property
    def asked_axes(self) -> tuple[str, ...]:
        """The axes each output is rated on here (:func:`asked_axes` of the age question)."""
        return asked_axes(self.age_question)

    def set_info(self) -> dict[str, str]:
        """The loaded review set: ``path``, ``sha256``, ``project_root`` (empty if none)."""
        con = self._db.connection()
        return {key: read_meta(con, f"set_{key}") for key in ("path", "sha256", "project_root")}

    def note(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Append a non-rating entry (a finalization) to the log."""
        with self._db.write() as con:
            return self._audit.append(con, entry)

    def verify(self) -> Verification:
        """Check ``audit.jsonl`` (its chain, the database's copy of it, no unresolved lines
        set aside: :meth:`AccountStore.verify`), then that the ``ratings`` table holds
        exactly the ratings the log's ``rate`` entries record (:func:`ratings_against_log`):
        one edited, deleted or inserted in the database alone is named."""
        check = super().verify()
        if not check.ok:
            return check
        with self._db.write() as con:  # the lines and the rows of one moment
            lines = [str(r["line"]) for r in con.execute("SELECT line FROM audit ORDER BY seq")]
            rows = [dict(r) for r in con.execute("SELECT * FROM ratings")]
        problem = ratings_against_log(rows, lines)
        if problem:
            return Verification(
                self.database, False, check.entries, check.head, None,
                problem=f"table ratings does not match the audit log: {problem}",
                fix=f"the database was changed outside the tool; restore {DATABASE} from a "
                    f"backup (every rating as given is in {AUDIT_LOG}); nothing is exported "
                    "until they agree")
        return check

    def _committed_after(self, con: sqlite3.Connection, seq: int) -> bool:
        """Whether a rating (or a claim it closed) carries an audit entry after ``seq``."""
        return con.execute(
            "SELECT EXISTS (SELECT 1 FROM ratings WHERE audit_seq > ?) "
            "OR EXISTS (SELECT 1 FROM claims WHERE audit_seq > ?)", (seq, seq)).fetchone()[0] == 1

    def too_few_raters(self) -> str | None:
        """A warning when fewer raters are registered than k (no item can be rated by k),
        else None (:func:`too_few_raters`)."""
        return too_few_raters(self.raters_per_item, len(self.raters()))

    # ------------------------------------------------------------------ raters, sessions
    # (AccountStore's: login, session, logout, replace_token, in the review's words here)

    add_rater = AccountStore.add_user
    raters = AccountStore.users

    # ------------------------------------------------------------------ the review set

    def load_set(self, path: Path, project_root: Path) -> int:
        """Take the review set at ``path`` (ReviewItemRecord rows; image paths relative to
        ``project_root``) into the database; return how many items were added.

        The set's sha256 is recorded; loading the same table again adds nothing, and a
        different table is refused, since ratings refer to the items of the first.
        """
        path, root = Path(path), Path(project_root).resolve()
        if not path.is_file():
            raise InputDataError(f"review set {path} not found",
                                 "draw it with the review_set stage (`dvc repro review_set`) "
                                 "or pass --set")
        digest = sha256_file(path)
        known = self.set_info()
        if known["sha256"]:
            if known["sha256"] != digest:
                raise InputDataError(
                    f"{path} (sha256 {digest[:16]}) is not the review set this folder rates "
                    f"({known['path']}, sha256 {known['sha256'][:16]})",
                    "start a new review folder (--workdir) for the new set")
            return 0
        items = [ReviewItemRecord.model_validate({k: plain_value(v) for k, v in row.items()})
                 for row in read_table(path, ReviewItemRecord).to_dict(orient="records")]
        if not items:
            raise InputDataError(f"review set {path} has no items",
                                 "check review.sample_size and the judged outputs")
        missing = [f"{item.item_id}: {name}" for item in items
                   for name in _image_paths(item).values()
                   if _inside(root, name) is None]
        if missing:
            raise InputDataError(
                f"{len(missing)} image(s) of {path} are not files under {root}: "
                + "; ".join(missing[:5]),
                "run from the project root (or pass --params from it) and pull the images "
                "with `dvc pull`")
        with self._db.write() as con:
            for position, item in enumerate(items):
                con.execute("INSERT INTO items VALUES (?, ?, ?, ?)",
                            (item.item_id, position, int(item.paired_output_path is not None),
                             item.model_dump_json()))
            write_meta(con, "set_path", str(path))
            write_meta(con, "set_sha256", digest)
            write_meta(con, "set_project_root", str(root))
            self._audit.append(con, {"action": "load_set", "rater": "", "set": str(path),
                                     "set_sha256": digest, "items": len(items)})
        return len(items)

    def items(self) -> list[ReviewItemRecord]:
        """The review set's items, in the set's order."""
        rows = self._db.connection().execute("SELECT record FROM items ORDER BY position")
        return [ReviewItemRecord.model_validate_json(r["record"]) for r in rows]

    # ------------------------------------------------------------------ claims

    def next_item(self, rater: str) -> Claim | None:
        """The item ``rater`` should rate now: their open claim if they have one (resume),
        else a new claim (a due repeat, or the next fresh item); None when nothing is left.

        A fresh item is one with fewer than k raters that this rater has not had; among
        those, items closest to k come first, so items are completed rather than all
        started; ties in an order of the rater's own (a hash of rater and item), so raters
        do not see the set in one shared order.
        """
        k, fraction = self.raters_per_item, self.repeat_fraction
        with self._db.write() as con:
            if not RATERS.exists(con, rater):
                raise InputDataError(f"no rater named {rater!r}", "log in again")
            open_claim = con.execute("SELECT * FROM claims WHERE rater = ? AND state = 'open'",
                                     (rater,)).fetchone()
            if open_claim is not None:
                return self._claim(con, open_claim)
            now = time.time()
            con.execute("UPDATE claims SET state = 'released' WHERE state = 'open' "
                        "AND claimed_at < ?", (now - CLAIM_SECONDS,))
            fresh = con.execute(
                "SELECT i.item_id, i.paired, COUNT(c.claim_id) AS n FROM items i "
                "LEFT JOIN claims c ON c.item_id = i.item_id AND c.repeat = 0 "
                "AND c.state != 'released' WHERE i.item_id NOT IN (SELECT item_id FROM claims "
                "WHERE rater = ? AND state != 'released') GROUP BY i.item_id HAVING n < ?",
                (rater, k)).fetchall()
            done = con.execute(
                "SELECT COUNT(*) FROM claims WHERE rater = ? AND state = 'done' AND repeat = 0",
                (rater,)).fetchone()[0]
            repeats = con.execute(
                "SELECT COUNT(*) FROM claims WHERE rater = ? AND state != 'released' "
                "AND repeat = 1", (rater,)).fetchone()[0]
            # While fresh items remain, a repeat is due for every whole 1/fraction items
            # rated; at the end the share is rounded up, so a rater's last items still count.
            due = math.floor(done * fraction + 1e-9) if fresh else math.ceil(done * fraction
                                                                            - 1e-9)
            choice: tuple[str, int, bool] | None = None
            if repeats < due:
                candidates = con.execute(
                    "SELECT c.item_id, i.paired, (SELECT COUNT(*) FROM claims l WHERE "
                    "l.rater = c.rater AND l.claim_id > c.claim_id) AS since FROM claims c "
                    "JOIN items i ON i.item_id = c.item_id WHERE c.rater = ? "
                    "AND c.state = 'done' AND c.repeat = 0 AND c.item_id NOT IN "
                    "(SELECT item_id FROM claims WHERE rater = ? AND repeat = 1 "
                    "AND state != 'released')", (rater, rater)).fetchall()
                gap = REPEAT_GAP if fresh else 0
                eligible = [r for r in candidates if r["since"] >= gap]
                if eligible:
                    pick = self._random.choice(eligible)
                    choice = (pick["item_id"], pick["paired"], True)
            if choice is None and fresh:
                most = max(r["n"] for r in fresh)
                nearest = [r for r in fresh if r["n"] == most]
                pick = min(nearest, key=lambda r: content_hash([rater, r["item_id"]]))
                choice = (pick["item_id"], pick["paired"], False)
            if choice is None:
                return None
            item_id, paired, repeat = choice
            order = list(OUTPUTS) if paired else ["edited"]
            self._random.shuffle(order)
            cursor = con.execute(
                "INSERT INTO claims (rater, item_id, repeat, shown_order, claimed_at, state) "
                "VALUES (?, ?, ?, ?, ?, 'open')",
                (rater, item_id, int(repeat), ",".join(order), now))
            row = con.execute("SELECT * FROM claims WHERE claim_id = ?",
                              (cursor.lastrowid,)).fetchone()
            return self._claim(con, row)

    def _claim(self, con: sqlite3.Connection, row: sqlite3.Row) -> Claim:
        record = con.execute("SELECT record FROM items WHERE item_id = ?",
                             (row["item_id"],)).fetchone()["record"]
        return Claim(int(row["claim_id"]), str(row["rater"]),
                     ReviewItemRecord.model_validate_json(record), bool(row["repeat"]),
                     tuple(str(row["shown_order"]).split(",")), float(row["claimed_at"]))

    def open_claim(self, rater: str) -> Claim | None:
        """The rater's open claim, if any (claims nothing new)."""
        con = self._db.connection()
        row = con.execute("SELECT * FROM claims WHERE rater = ? AND state = 'open'",
                          (rater,)).fetchone()
        return self._claim(con, row) if row else None

    def claim_image(self, rater: str, claim_id: int, slot: str) -> Path | None:
        """The image file shown in ``slot`` (``source``, or ``0``/``1``: the outputs left to
        right) of one of ``rater``'s claims: a file under the project root, or None."""
        con = self._db.connection()
        row = con.execute("SELECT * FROM claims WHERE claim_id = ? AND rater = ?",
                          (claim_id, rater)).fetchone()
        if row is None:
            return None
        claim = self._claim(con, row)
        paths = _image_paths(claim.item)
        if slot == "source":
            name = paths["source"]
        elif slot in ("0", "1") and int(slot) < len(claim.shown_order):
            name = paths[claim.shown_order[int(slot)]]
        else:
            return None
        root = self.set_info()["project_root"]
        return _inside(Path(root), name) if root else None

    # ------------------------------------------------------------------ ratings

    def rate(self, rater: str, item_id: str,
             answers: Mapping[str, Mapping[str, int | None]],
             shown_order: Sequence[str], duration_ms: int | None = None) -> dict[str, Any]:
        """Record ``rater``'s answers about the item of their open claim; return the sealed
        audit entry.

        ``answers`` maps each output shown (``edited``, ``feature``) to every axis of
        :attr:`asked_axes`, each 1-5 or None ("cannot tell"). Under the ``direction`` age
        question the answer is stored as ``age_direction`` and its drift as ``age_change``;
        under ``change``, ``age_direction`` stays None. The audit entry keeps the answers as
        given.
        ``shown_order`` must be the order the claim recorded. ``duration_ms`` is the
        client's measure of the time on the item: used if it is no more than the time since
        the claim (plus :data:`CLOCK_SLACK_MS`), else that server-side time is used; over
        :data:`MAX_DURATION_MS` it is recorded as None (the rater was away).
        """
        question = self.age_question
        clean = _checked_answers(answers, asked_axes(question))
        with self._db.write() as con:
            row = con.execute("SELECT * FROM claims WHERE rater = ? AND state = 'open'",
                              (rater,)).fetchone()
            if row is None or row["item_id"] != item_id:
                raise InputDataError(
                    f"rater {rater!r} holds no open claim on item {item_id!r}",
                    "rate the item the app shows you now (it was rated already, or the "
                    "claim expired and went to someone else)")
            claim = self._claim(con, row)
            if tuple(shown_order) != claim.shown_order:
                raise InputDataError(
                    f"shown order {list(shown_order)} is not the order recorded for this "
                    f"showing ({list(claim.shown_order)})", "rate the page as shown")
            if set(clean) != set(claim.shown_order):
                raise InputDataError(
                    f"answers are about {sorted(clean)}, the item showed "
                    f"{list(claim.shown_order)}", "answer every output shown, once")
            server_ms = max(0, round((time.time() - claim.claimed_at) * 1000))
            measured = duration_ms if duration_ms is not None \
                and 0 <= duration_ms <= server_ms + CLOCK_SLACK_MS else server_ms
            duration = measured if measured <= MAX_DURATION_MS else None
            created = utc_now()
            paired = len(claim.shown_order) > 1
            rows = []
            for output in claim.shown_order:
                rating_id = "rt-" + content_hash([rater, item_id, output, claim.repeat])
                rows.append({"rating_id": rating_id, "output": output,
                             "shown_first": (claim.shown_order[0] == output) if paired else None,
                             **_stored_axes(clean[output], question)})
            entry = self._audit.append(con, {
                "action": "rate", "rater": rater, "item_id": item_id, "repeat": claim.repeat,
                "shown_order": list(claim.shown_order), "duration_ms": duration,
                "answers": {output: clean[output] for output in claim.shown_order},
                "rating_ids": [r["rating_id"] for r in rows], "created_at": created})
            columns = ("rating_id", "claim_id", "rater", "item_id", "output", "shown_first",
                       *RATED_AXES, "repeat", "duration_ms", "created_at", "audit_seq")
            for r in rows:
                con.execute(
                    f"INSERT INTO ratings ({', '.join(columns)}) "
                    f"VALUES ({', '.join('?' * len(columns))})",
                    (r["rating_id"], claim.claim_id, rater, item_id, r["output"],
                     None if r["shown_first"] is None else int(r["shown_first"]),
                     *(r[axis] for axis in RATED_AXES), int(claim.repeat), duration,
                     created, entry["seq"]))
            con.execute("UPDATE claims SET state = 'done', audit_seq = ? WHERE claim_id = ?",
                        (entry["seq"], claim.claim_id))
        return entry

    def ratings(self) -> list[RatingRecord]:
        """Every rating, in the order they were saved, as RatingRecord rows (origin app)."""
        rows = self._db.connection().execute("SELECT * FROM ratings ORDER BY audit_seq, output")
        return [RatingRecord(
            rating_id=r["rating_id"], rater=r["rater"], item_id=r["item_id"], output=r["output"],
            shown_first=None if r["shown_first"] is None else bool(r["shown_first"]),
            **{axis: r[axis] for axis in RATED_AXES}, repeat=bool(r["repeat"]),
            duration_ms=r["duration_ms"], created_at=r["created_at"], origin="app")
            for r in rows]

    # ------------------------------------------------------------------ progress

    def rater_progress(self, rater: str) -> RaterProgress:
        """How far ``rater`` is (see :class:`RaterProgress`)."""
        con = self._db.connection()
        counts = {(r["repeat"], r["state"]): r["n"] for r in con.execute(
            "SELECT repeat, state, COUNT(*) AS n FROM claims WHERE rater = ? "
            "GROUP BY repeat, state", (rater,))}
        available = con.execute(
            "SELECT COUNT(*) FROM (SELECT i.item_id, COUNT(c.claim_id) AS n FROM items i "
            "LEFT JOIN claims c ON c.item_id = i.item_id AND c.repeat = 0 "
            "AND c.state != 'released' WHERE i.item_id NOT IN (SELECT item_id FROM claims "
            "WHERE rater = ? AND state != 'released') GROUP BY i.item_id HAVING n < ?)",
            (rater, self.raters_per_item)).fetchone()[0]
        return RaterProgress(rater, counts.get((0, "done"), 0), counts.get((1, "done"), 0),
                             bool(counts.get((0, "open"), 0) or counts.get((1, "open"), 0)),
                             int(available))

    def progress(self) -> dict[str, Any]:
        """Overall progress: items, k, the target (items x k first ratings), first ratings
        done, items rated by all k, repeats done, and each rater's :class:`RaterProgress`."""
        con = self._db.connection()
        k = self.raters_per_item
        items = con.execute("SELECT COUNT(*) FROM items").fetchone()[0]
        per_item = [r[0] for r in con.execute(
            "SELECT COUNT(*) FROM claims WHERE state = 'done' AND repeat = 0 GROUP BY item_id")]
        repeats = con.execute("SELECT COUNT(*) FROM claims WHERE state = 'done' "
                              "AND repeat = 1").fetchone()[0]
        return {"items": items, "raters_per_item": k, "target": items * k,
                "rated": sum(per_item), "complete_items": sum(n >= k for n in per_item),
                "repeats": repeats,
                "raters": [self.rater_progress(name) for name in self.raters()]}


def _image_paths(item: ReviewItemRecord) -> dict[str, str]:
    paths = {"source": item.source_path, "edited": item.output_path}
    if item.paired_output_path is not None:
        paths["feature"] = item.paired_output_path
    return paths


def _inside(root: Path, name: str) -> Path | None:
    """``root / name`` resolved, if it is a file inside ``root``; else None (an absolute
    path, ``..`` or a link that leads out, a missing file)."""
    if not name or Path(name).is_absolute() or "\x00" in name:
        return None
    path = (root / name).resolve()
    if not path.is_relative_to(root.resolve()) or not path.is_file():
        return None
    return path


def _checked_answers(answers: Mapping[str, Mapping[str, int | None]],
                     axes: tuple[str, ...]) -> dict[str, dict[str, int | None]]:
    """``answers`` if they answer exactly ``axes`` (each 1-5 or None) for known outputs; an
    :class:`InputDataError` naming what is unknown, missing or out of range otherwise."""
    if not isinstance(answers, Mapping) or not answers:
        raise InputDataError("no answers given", "answer every axis of every output shown")
    clean: dict[str, dict[str, int | None]] = {}
    for output, given in answers.items():
        if output not in OUTPUTS:
            raise InputDataError(f"output {str(output)[:40]!r} is not one of {OUTPUTS}",
                                 "name outputs edited or feature")
        if not isinstance(given, Mapping):
            raise InputDataError(f"answers for {output} are not a mapping of axes",
                                 f"give {', '.join(axes)}")
        unknown = sorted(str(a)[:40] for a in set(given) - set(axes))
        missing = [a for a in axes if a not in given]
        if unknown or missing:
            raise InputDataError(
                f"answers for {output}: " + "; ".join(
                    part for part in (f"unknown axes {unknown}" if unknown else "",
                                      f"missing {missing}" if missing else "") if part),
                f"answer exactly {', '.join(axes)} (1-5, or cannot tell)")
        for axis in axes:
            value = given[axis]
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 1 <= value <= 5):
                raise InputDataError(f"{output} {axis} is {str(value)[:20]!r}",
                                     "answer 1-5, or cannot tell")
        clean[output] = {axis: given[axis] for axis in axes}
    return clean


def _stored_axes(answered: Mapping[str, int | None], age_question: str
                 ) -> dict[str, int | None]:
    """One output's checked answers as the rating's fields (every axis of
    :data:`~acrb.records.RATED_AXES`): a direction answer also read as drift."""
    stored: dict[str, int | None] = {axis: answered.get(axis) for axis in RATED_AXES}
    if age_question == "direction":
        stored.update(age_from_direction(answered["age_direction"]))
    return stored


#: The ``ratings`` columns an audit ``rate`` entry fixes (all but ``claim_id``).
_LOGGED_COLUMNS = ("rater", "item_id", "output", "shown_first", *RATED_AXES, "repeat",
                   "duration_ms", "created_at", "audit_seq")
#: How many rating ids a mismatch names at most.
_NAMED = 5


def logged_ratings(lines: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The ``ratings`` rows the audit log's ``rate`` entries committed, by rating id, each
    with the :data:`_LOGGED_COLUMNS` as :meth:`ReviewStore.rate` stores them."""
    logged: dict[str, dict[str, Any]] = {}
    for line in lines:
        entry = json.loads(line)
        if entry.get("action") != "rate":
            continue
        order = list(entry["shown_order"])
        ids = entry.get("rating_ids") or [
            "rt-" + content_hash([entry["rater"], entry["item_id"], output, entry["repeat"]])
            for output in order]
        for rating_id, output in zip(ids, order, strict=True):
            answered = entry["answers"][output]
            # The question asked shows in the answers: direction answers carry age_direction.
            question = "direction" if "age_direction" in answered else "change"
            logged[rating_id] = {
                "rater": entry["rater"], "item_id": entry["item_id"], "output": output,
                "shown_first": int(order[0] == output) if len(order) > 1 else None,
                **_stored_axes(answered, question), "repeat": int(bool(entry["repeat"])),
                "duration_ms": entry["duration_ms"], "created_at": entry["created_at"],
                "audit_seq": entry["seq"]}
    return logged


def ratings_against_log(rows: Sequence[Mapping[str, Any]], lines: Sequence[str]) -> str:
    """The first way the ``ratings`` table's ``rows`` differ from what the audit log's
    ``lines`` committed (ids only in one of them, then a value that differs), naming the
    ratings; empty when they agree."""
    logged = logged_ratings(lines)
    stored = {str(row["rating_id"]): row for row in rows}
    inserted = sorted(set(stored) - set(logged))
    deleted = sorted(set(logged) - set(stored), key=lambda r: logged[r]["audit_seq"])
    if inserted or deleted:
        parts = [f"{len(stored)} rating(s) in the database, {len(logged)} in the log"]
        if inserted:
            parts.append("in the database only (inserted behind the log): "
                         + _named(inserted, stored))
        if deleted:
            parts.append("in the log only (deleted from the database): "
                         + _named(deleted, logged))
        return "; ".join(parts)
    for rating_id, expected in sorted(logged.items(), key=lambda kv: kv[1]["audit_seq"]):
        row = stored[rating_id]
        changed = [f"{column} is {row[column]!r} in the database, {expected[column]!r} in the "
                   "log" for column in _LOGGED_COLUMNS if row[column] != expected[column]]
        if changed:
            return (f"rating {rating_id} ({_about(expected)}, audit entry "
                    f"{expected['audit_seq']}) was edited: " + "; ".join(changed))
    return ""


def _about(row: Mapping[str, Any]) -> str:
    return f"rater {row['rater']}, item {row['item_id']}, {row['output']}"


def _named(ids: Sequence[str], rows: Mapping[str, Mapping[str, Any]]) -> str:
    named = ", ".join(f"{i} ({_about(rows[i])})" for i in ids[:_NAMED])
    return named + (f" and {len(ids) - _NAMED} more" if len(ids) > _NAMED else "")


def too_few_raters(k: int, raters: int) -> str | None:
    """The warning for ``k`` raters per item with only ``raters`` registered: no item can
    be complete until more are added. None when there are enough."""
    if raters >= k:
        return None
    return (f"warning: review.raters_per_item is {k} but only {raters} rater(s) are "
            f"registered: no item can reach {k} ratings until {k - raters} more rater(s) "
            "are added (`acrb review add-rater NAME`)")


def ratings_frame(store: ReviewStore) -> pd.DataFrame:
    """The store's ratings as a DataFrame with the RatingRecord columns."""
    rows = [r.model_dump() for r in store.ratings()]
    return pd.DataFrame(rows, columns=list(RatingRecord.model_fields))


def describe(progress: dict[str, Any]) -> list[str]:
    """Progress in lines for people (``acrb review status``)."""
    lines = [f"{progress['rated']} / {progress['target']} ratings ({progress['items']} items "
             f"x k={progress['raters_per_item']}); {progress['complete_items']} items rated by "
             f"all k; {progress['repeats']} repeats"]
    for p in progress["raters"]:
        lines.append(f"  {p.rater}: {p.rated} rated, {p.repeats} repeats"
                     + (", one open" if p.open else "") + f"; {p.available} still open to them")
    warning = too_few_raters(progress["raters_per_item"], len(progress["raters"]))
    if warning:
        lines.append(warning)
    return lines

