"""The curation audit log: JSON lines, each carrying the hash of the line before it.

Every entry is one JSON object on one line with ``seq`` (1, 2, ...), ``prev`` (the ``hash`` of
the previous entry; 64 zeros for the first) and ``hash``: the sha256 of the entry's canonical
JSON (sorted keys, no spaces, UTF-8) with ``hash`` left out. Changing any byte of a past entry
changes its hash, which no longer matches the ``prev`` of the entry after it, and recomputing
every later hash to hide the edit changes the last one, which the curation database and the
finalized manifest both keep (:func:`verify` compares against it). Deleting or reordering lines
breaks ``seq``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GENESIS = "0" * 64


def canonical(entry: dict[str, Any]) -> str:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def entry_hash(entry: dict[str, Any]) -> str:
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
                                    "differs from the entry the curation database recorded: "
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
