"""A web tool's audit log: JSON lines, each carrying the hash of the line before it.

Every entry is one JSON object on one line with ``seq`` (1, 2, ...), ``prev`` (the ``hash`` of
the previous entry; 64 zeros for the first) and ``hash``: the sha256 of the entry's canonical
JSON (sorted keys, no spaces, UTF-8) with ``hash`` left out. Changing any byte of a past entry
changes its hash, which no longer matches the ``prev`` of the entry after it, and recomputing
every later hash to hide the edit changes the last one, which the tool's database (and any
export, such as a finalized curation manifest) keeps: :func:`verify` compares against it.
Deleting or reordering lines breaks ``seq``.

:class:`AuditTrail` keeps the log of one tool: each entry is sealed, stored in the tool's
database and appended to the file inside the write transaction that makes the change it
records, so the log and the tables never disagree; a line appended by a transaction that then
failed (a crash between the append and the commit) is moved aside when the tool next opens.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from acrb.web.database import Database, read_meta, write_meta

GENESIS = "0" * 64
AUDIT_SCHEMA = "CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY, line TEXT NOT NULL);"
_SEQ_KEY, _HEAD_KEY = "audit_seq", "audit_head"


def utc_now() -> str:
    """The current UTC time as ISO 8601 with milliseconds (the ``at`` of every entry)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def canonical(entry: dict[str, Any]) -> str:
    """The entry as it is written and hashed: JSON with sorted keys, no spaces, UTF-8."""
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def entry_hash(entry: dict[str, Any]) -> str:
    """sha256 (hex) of the entry's canonical JSON without its ``hash`` field."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(canonical(body).encode()).hexdigest()


def seal(entry: dict[str, Any], seq: int, prev: str) -> dict[str, Any]:
    """Return ``entry`` with ``seq``, ``prev`` and its ``hash`` filled in."""
    sealed = {**entry, "seq": seq, "prev": prev}
    sealed["hash"] = entry_hash(sealed)
    return sealed


@dataclass
class Verification:
    """The outcome of :func:`verify`: ``ok``, entries read, and the first problem found."""

    path: Path
    ok: bool
    entries: int
    head: str
    line: int | None = None
    problem: str = ""
    notes: list[str] = field(default_factory=list)

    def message(self) -> str:
        """One line for people: the entries and head if intact, else where and what broke."""
        if self.ok:
            return f"{self.path}: {self.entries} entries, chain intact, head {self.head[:16]}"
        where = f"{self.path} line {self.line}" if self.line else str(self.path)
        return f"{where}: {self.problem}"


def verify(path: Path, expected_head: str | None = None,
           expected_lines: list[str] | None = None) -> Verification:
    """Check the chain of the log at ``path``; name the first line that breaks it.

    ``expected_head`` is the last hash recorded elsewhere (database, manifest): a log whose
    chain is intact but ends elsewhere was truncated or rewritten. ``expected_lines`` are the
    lines as the database stored them: a line that differs is named even if the chain was
    recomputed after the edit.
    """
    path = Path(path)
    if not path.is_file():
        return Verification(path, False, 0, GENESIS, None, "audit log not found")
    prev = GENESIS
    count = 0
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.rstrip("\n")
            try:
                entry = json.loads(line)
                if not isinstance(entry, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                return Verification(path, False, count, prev, number,
                                    f"not a JSON object ({exc}): the line was edited or cut")
            if entry.get("seq") != number:
                return Verification(path, False, count, prev, number,
                                    f"seq is {entry.get('seq')!r}, expected {number}: "
                                    "lines were removed, added or reordered")
            if entry.get("prev") != prev:
                return Verification(path, False, count, prev, number,
                                    "prev does not match the hash of the line before: "
                                    "a line before it was edited, removed or inserted")
            if entry.get("hash") != entry_hash(entry):
                return Verification(path, False, count, prev, number,
                                    "hash does not match the entry's content: "
                                    "the line was edited after it was written")
            if expected_lines is not None and number <= len(expected_lines) \
                    and expected_lines[number - 1] != line:
                return Verification(path, False, count, prev, number,
                                    "differs from the entry the database recorded: "
                                    "the log was rewritten from this line on")
            prev = entry["hash"]
            count = number
    if expected_lines is not None and count < len(expected_lines):
        return Verification(path, False, count, prev, count + 1,
                            f"the log ends after {count} entries but the database recorded "
                            f"{len(expected_lines)}: lines were removed from the end")
    if expected_head is not None and prev != expected_head:
        return Verification(path, False, count, prev, count or None,
                            f"the chain is intact but ends at {prev[:16]}, not at the recorded "
                            f"head {expected_head[:16]}: the log was truncated or rewritten")
    return Verification(path, True, count, prev)


class AuditTrail:
    """The audit log of one tool: the file at ``path`` and its copy in ``database``.

    The database keeps every sealed line (table ``audit``) and the chain's length and head
    (``meta``), so :meth:`verify` catches a file rewritten with a recomputed chain, and a tool
    that records a change calls :meth:`append` inside the write transaction that makes it.
    """

    def __init__(self, database: Database, path: Path) -> None:
        self.database = database
        self.path = Path(path)

    def append(self, con: sqlite3.Connection, entry: dict[str, Any]) -> dict[str, Any]:
        """Seal ``entry`` (with ``at``, the current UTC time, unless it has one) onto the
        chain inside the caller's write transaction, store it, append it to the file and
        fsync; return the sealed entry. If the transaction then fails, the line stays in the
        file and :meth:`set_aside_uncommitted_lines` moves it aside at the next open."""
        seq = int(read_meta(con, _SEQ_KEY, "0")) + 1
        sealed = seal({"at": utc_now(), **entry}, seq, read_meta(con, _HEAD_KEY, GENESIS))
        line = canonical(sealed)
        con.execute("INSERT INTO audit (seq, line) VALUES (?, ?)", (seq, line))
        write_meta(con, _SEQ_KEY, str(seq))
        write_meta(con, _HEAD_KEY, sealed["hash"])
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return sealed

    def head(self) -> tuple[int, str]:
        """``(entries, hash of the last)`` as the database recorded them."""
        con = self.database.connection()
        return int(read_meta(con, _SEQ_KEY, "0")), read_meta(con, _HEAD_KEY, GENESIS)

    def verify(self) -> Verification:
        """Check the file against its own chain and against the database's copy.

        Runs under the write lock: a writer appends to the file before it commits, so reading
        while others write would see lines the database does not have yet and report them as
        tampering.
        """
        with self.database.write() as con:
            return verify(self.path, expected_head=read_meta(con, _HEAD_KEY, GENESIS),
                          expected_lines=_stored_lines(con))

    def set_aside_uncommitted_lines(self) -> None:
        """Lines past the database's last entry were written by a transaction that never
        committed (a crash between the append and the commit): move them to a side file,
        ``<log>.uncommitted-<unix time>``. A file that disagrees with the database before
        that point is left alone, for :meth:`verify` to report."""
        with self.database.write() as con:
            recorded = int(read_meta(con, _SEQ_KEY, "0"))
            if not self.path.exists():
                return
            lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
            if len(lines) <= recorded:
                return
            if [x.rstrip("\n") for x in lines[:recorded]] != _stored_lines(con):
                return
            aside = self.path.with_name(f"{self.path.name}.uncommitted-{int(time.time())}")
            aside.write_text("".join(lines[recorded:]), encoding="utf-8")
            self.path.write_text("".join(lines[:recorded]), encoding="utf-8")


def _stored_lines(con: sqlite3.Connection) -> list[str]:
    return [str(r["line"]) for r in con.execute("SELECT line FROM audit ORDER BY seq")]
