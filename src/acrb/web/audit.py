"""A web tool's audit log: JSON lines, each carrying the hash of the line before it.

Every entry is one JSON object on one line with ``seq`` (1, 2, ...), ``prev`` (the ``hash`` of
the previous entry; 64 zeros for the first) and ``hash``: the sha256 of the entry's canonical
JSON (sorted keys, no spaces, UTF-8) with ``hash`` left out. Changing any byte of a past entry
changes its hash, which no longer matches the ``prev`` of the entry after it, and recomputing
every later hash to hide the edit changes the last one. Deleting or reordering lines breaks
``seq``.

The log cannot vouch for its own end: anyone who can write the file can append a correctly
chained line. So the head is anchored outside the log, in the tool's database (every sealed
line, the entry count and the head hash; :class:`AuditTrail`) and in any export (a finalized
manifest keeps the count and head), and :func:`verify` fails on any line the anchor does not
cover, whatever it holds: an appended forgery, garbage, or a line of a write that never
committed.

:class:`AuditTrail` keeps the log of one tool: each entry is sealed, stored in the tool's
database and appended to the file inside the write transaction that makes the change it
records, so the log and the tables never disagree. If that transaction rolls back in the
process, its line is cut from the file again. If the process dies between the append and the
commit, the line stays past the recorded head: the next open moves such lines to a side file
(so the tool can go on writing a clean chain) and records that in the database, and
:meth:`AuditTrail.verify` fails, naming the side file, until a person looks at it and accepts
it with :meth:`AuditTrail.resolve_set_aside`, which logs the side file's digest in the chain.
From the file alone an interrupted write and an appended forgery look the same; neither ever
enters the chain. One case is settled without a person, where the tool can vouch that nothing
was committed (:meth:`AuditTrail.set_aside_lines_past_head` with ``committed_after``): the only
bytes past the head are one torn line (no line end, not JSON), what a crash in the middle of
the write leaves. It is set aside and resolved at once, with a ``resolved_torn_line`` entry
holding the dropped bytes' sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from acrb.errors import InputDataError
from acrb.web.database import Database, read_meta, write_meta

GENESIS = "0" * 64
AUDIT_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY, line TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS audit_set_aside (
    file TEXT PRIMARY KEY, after_seq INTEGER NOT NULL, lines INTEGER NOT NULL,
    bytes INTEGER NOT NULL, sha256 TEXT NOT NULL, at TEXT NOT NULL, resolved_seq INTEGER);
"""
_SEQ_KEY, _HEAD_KEY, _BYTES_KEY = "audit_seq", "audit_head", "audit_bytes"
#: What lines past the recorded head may be; said wherever they are reported.
PAST_HEAD = "an interrupted write or an appended forgery"


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
    """The outcome of :func:`verify`: ``ok``, entries read, the first problem found and, for
    a problem a person can settle, the ``fix``."""

    path: Path
    ok: bool
    entries: int
    head: str
    line: int | None = None
    problem: str = ""
    notes: list[str] = field(default_factory=list)
    fix: str = ""
    past_head: int = 0
    set_aside: list[str] = field(default_factory=list)

    def message(self) -> str:
        """One line for people: the entries and head if intact, else where and what broke."""
        if self.ok:
            return f"{self.path}: {self.entries} entries, chain intact, head {self.head[:16]}"
        where = f"{self.path} line {self.line}" if self.line else str(self.path)
        return f"{where}: {self.problem}"


def verify(path: Path, expected_head: str, expected_lines: list[str] | None = None,
           expected_entries: int | None = None) -> Verification:
    """Check the log at ``path`` against its own chain and against its anchor; name the
    first line that breaks either.

    ``expected_head`` is the last hash recorded outside the log (the database, a manifest):
    the log must end exactly there, so a line after it fails however well it is chained, and
    a log that never reaches it was truncated or rewritten. ``expected_entries`` is the entry
    count recorded with it, if known. ``expected_lines`` are the lines as the database stored
    them: a line that differs is named even if the chain was recomputed after the edit.
    """
    path = Path(path)
    if expected_lines is not None:
        expected_entries = len(expected_lines)
    if not path.is_file():
        return Verification(path, False, 0, GENESIS, None, "audit log not found")
    prev = GENESIS
    count = 0
    anchored = expected_head == GENESIS and not expected_entries
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if anchored or (expected_entries is not None and number > expected_entries):
                rest = 1 + sum(1 for _ in handle)
                return Verification(path, False, count, prev, number, _past_head(rest, count),
                                    past_head=rest)
            if not raw.endswith(b"\n"):
                return Verification(path, False, count, prev, number,
                                    "the line has no line end: the log was cut mid-line")
            try:
                line = raw[:-1].decode("utf-8")
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
            if expected_lines is not None and expected_lines[number - 1] != line:
                return Verification(path, False, count, prev, number,
                                    "differs from the entry the database recorded: "
                                    "the log was rewritten from this line on")
            prev = entry["hash"]
            count = number
            anchored = prev == expected_head
    if expected_entries is not None and count < expected_entries:
        return Verification(path, False, count, prev, count + 1,
                            f"the log ends after {count} entries but {expected_entries} were "
                            "recorded: lines were removed from the end")
    if prev != expected_head:
        return Verification(path, False, count, prev, count or None,
                            f"the chain is intact but ends at {prev[:16]}, not at the recorded "
                            f"head {expected_head[:16]}: the log was truncated or rewritten")
    return Verification(path, True, count, prev)


def _past_head(lines: int, head_line: int) -> str:
    return (f"{lines} line(s) past the recorded head (entry {head_line}): {PAST_HEAD}; "
            "no line after the recorded head is trusted")


class AuditTrail:
    """The audit log of one tool: the file at ``path`` and its copy in ``database``.

    The database keeps every sealed line (table ``audit``), the chain's length, head and byte
    size (``meta``), and the lines set aside from past the head (table ``audit_set_aside``),
    so :meth:`verify` catches a file rewritten with a recomputed chain and any line appended
    to it. A tool that records a change calls :meth:`append` inside the write transaction
    that makes it. ``verify_command`` is the command that checks this log (``acrb curate
    verify FOLDER``); its fixes name it, and it with ``--resolve`` to accept set-aside lines.
    """

    def __init__(self, database: Database, path: Path,
                 verify_command: str = "acrb curate verify") -> None:
        self.database = database
        self.path = Path(path)
        self.verify_command = verify_command

    def append(self, con: sqlite3.Connection, entry: dict[str, Any]) -> dict[str, Any]:
        """Seal ``entry`` (with ``at``, the current UTC time, unless it has one) onto the
        chain inside the caller's write transaction, store it, append it to the file and
        fsync; return the sealed entry. If the transaction rolls back, the line is cut from
        the file again; if the process dies first, the next open sets it aside.

        Refuses to append (:class:`~acrb.errors.InputDataError`) when the file's size is not
        what the database recorded: a line chained after bytes nobody recorded would mix
        them into the log.
        """
        seq = int(read_meta(con, _SEQ_KEY, "0")) + 1
        recorded = _recorded_bytes(con)
        size = self.path.stat().st_size if self.path.exists() else 0
        if size != recorded:
            raise InputDataError(
                f"{self.path} is {size} bytes but the database recorded {recorded}: the log "
                "was changed outside the tool, so nothing more is appended to it",
                f"stop the tool and run `{self.verify_command}` to see what changed")
        sealed = seal({"at": utc_now(), **entry}, seq, read_meta(con, _HEAD_KEY, GENESIS))
        line = canonical(sealed)
        con.execute("INSERT INTO audit (seq, line) VALUES (?, ?)", (seq, line))
        write_meta(con, _SEQ_KEY, str(seq))
        write_meta(con, _HEAD_KEY, sealed["hash"])
        data = (line + "\n").encode()
        write_meta(con, _BYTES_KEY, str(recorded + len(data)))
        self.database.on_rollback(lambda: _cut(self.path, recorded))
        with open(self.path, "ab") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return sealed

    def head(self) -> tuple[int, str]:
        """``(entries, hash of the last)`` as the database recorded them."""
        con = self.database.connection()
        return int(read_meta(con, _SEQ_KEY, "0")), read_meta(con, _HEAD_KEY, GENESIS)

    def verify(self) -> Verification:
        """Check the file against its own chain and against the database's copy, then that
        no set-aside lines wait for a person (:meth:`set_aside_lines_past_head`).

        Runs under the write lock: a writer appends to the file before it commits, so reading
        while others write would see lines the database does not have yet and report them as
        tampering.
        """
        with self.database.write() as con:
            check = verify(self.path, expected_head=read_meta(con, _HEAD_KEY, GENESIS),
                           expected_lines=_stored_lines(con))
            pending = _unresolved(con)
        if not check.ok:
            if check.past_head:
                check.fix = ("the lines are still in the log; reopen the tool (any `acrb` "
                             "command on this folder) to set them aside, then verify again")
            return check
        if pending:
            first = pending[0]
            lines = sum(int(r["lines"]) for r in pending)
            return Verification(
                self.path, False, check.entries, check.head, None,
                set_aside=[str(r["file"]) for r in pending],
                problem=f"{lines} line(s) past the recorded head (entry {first['after_seq']}) were "
                f"set aside, unresolved: {PAST_HEAD}; see "
                + ", ".join(str(self.path.with_name(r["file"])) for r in pending),
                fix=f"read the side file: if it is a write that never committed, accept it "
                    f"as set aside with `{self.verify_command} --resolve` (logged with its "
                    "sha256); if nobody here wrote it, the log was tampered with: keep the "
                    "file as evidence")
        return check

    def set_aside_lines_past_head(
            self, committed_after: Callable[[sqlite3.Connection, int], bool | None] | None = None
    ) -> Path | None:
        """Move bytes past the database's last entry to a side file,
        ``<log>.past-head-<entries>-<unix time>``, and record it (unresolved) in the
        database; return its path, or None when there were none.

        They are a line of a transaction that never committed (a crash between the append
        and the commit) or something appended by someone else; either way they are not part
        of the log, and the next append must chain onto the recorded head. A file that
        disagrees with the database before that point is left alone, for :meth:`verify`.

        ``committed_after(con, seq)`` says whether the tool's tables hold a change that an
        entry after ``seq`` recorded (None: it cannot tell). When it says False and the bytes
        are one torn line (no line end, not JSON: a crash mid-write), they are resolved at
        once: the side file is kept and a ``resolved_torn_line`` entry logs its size and
        sha256, so nobody has to run ``--resolve`` for a crash. Anything else waits for a
        person, as without it.
        """
        with self.database.write() as con:
            if not self.path.exists():
                return None
            recorded = "".join(f"{line}\n" for line in _stored_lines(con)).encode()
            data = self.path.read_bytes()
            if len(data) <= len(recorded) or not data.startswith(recorded):
                return None
            extra = data[len(recorded):]
            seq = int(read_meta(con, _SEQ_KEY, "0"))
            aside = self.path.with_name(f"{self.path.name}.past-head-{seq}-{int(time.time())}")
            while aside.exists():
                aside = aside.with_name(aside.name + "_")
            with open(aside, "xb") as handle:
                handle.write(extra)
                handle.flush()
                os.fsync(handle.fileno())
            con.execute("INSERT INTO audit_set_aside (file, after_seq, lines, bytes, sha256, "
                        "at) VALUES (?, ?, ?, ?, ?, ?)",
                        (aside.name, seq, len(extra.splitlines()), len(extra),
                         hashlib.sha256(extra).hexdigest(), utc_now()))
            write_meta(con, _BYTES_KEY, str(len(recorded)))
            # Cut last: a crash before this leaves the bytes in the log, set aside again at
            # the next open; a crash after it leaves the side file recorded.
            _cut(self.path, len(recorded))
            if committed_after is not None and is_torn_line(extra) \
                    and committed_after(con, seq) is False:
                entry = self.append(con, {
                    "action": "resolved_torn_line", "file": aside.name, "after_seq": seq,
                    "bytes": len(extra), "sha256": hashlib.sha256(extra).hexdigest()})
                con.execute("UPDATE audit_set_aside SET resolved_seq = ? WHERE file = ?",
                            (entry["seq"], aside.name))
        return aside

    def resolve_set_aside(self, by: str = "") -> list[dict[str, Any]]:
        """Accept every unresolved side file as set aside: log one ``resolve_set_aside``
        entry per file (its name, line and byte counts, sha256, whether it is still there
        unchanged, and ``by``) and mark it resolved. The side file is kept; its lines never
        enter the chain. Returns the entries logged."""
        logged = []
        with self.database.write() as con:
            check = verify(self.path, expected_head=read_meta(con, _HEAD_KEY, GENESIS),
                           expected_lines=_stored_lines(con))
            if not check.ok:
                raise InputDataError(f"the audit log does not verify: {check.message()}",
                                     "set-aside lines are resolved only on an intact log; "
                                     "restore audit.jsonl from a backup first")
            for row in _unresolved(con):
                aside = self.path.with_name(row["file"])
                intact = aside.is_file() and \
                    hashlib.sha256(aside.read_bytes()).hexdigest() == row["sha256"]
                entry = self.append(con, {
                    "action": "resolve_set_aside", "by": by, "file": row["file"],
                    "after_seq": row["after_seq"], "lines": row["lines"],
                    "bytes": row["bytes"], "sha256": row["sha256"], "set_aside_at": row["at"],
                    "file_intact": intact})
                con.execute("UPDATE audit_set_aside SET resolved_seq = ? WHERE file = ?",
                            (entry["seq"], row["file"]))
                logged.append(entry)
        return logged


def is_torn_line(data: bytes) -> bool:
    """Whether ``data`` (bytes past a log's head) is one incomplete line: no line end, and
    not a JSON object (an entry cut off in the middle of its write)."""
    if not data or b"\n" in data:
        return False
    try:
        return not isinstance(json.loads(data.decode("utf-8")), dict)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError both
        return True


def _stored_lines(con: sqlite3.Connection) -> list[str]:
    return [str(r["line"]) for r in con.execute("SELECT line FROM audit ORDER BY seq")]


def _recorded_bytes(con: sqlite3.Connection) -> int:
    """The log's size as the database recorded it (computed from the stored lines for a
    database written before the size was kept)."""
    value = read_meta(con, _BYTES_KEY)
    if value:
        return int(value)
    row = con.execute("SELECT COALESCE(SUM(LENGTH(CAST(line AS BLOB))) + COUNT(*), 0) "
                      "FROM audit").fetchone()
    return int(row[0])


def _unresolved(con: sqlite3.Connection) -> list[sqlite3.Row]:
    return list(con.execute("SELECT * FROM audit_set_aside WHERE resolved_seq IS NULL "
                            "ORDER BY at, file"))


def _cut(path: Path, size: int) -> None:
    """Truncate ``path`` to ``size`` bytes and fsync."""
    with open(path, "r+b") as handle:
        handle.truncate(size)
        handle.flush()
        os.fsync(handle.fileno())
