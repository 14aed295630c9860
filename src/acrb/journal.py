"""The per-request records of a stage output, kept as a few files instead of one per request.

``generate``, ``evaluate`` and ``judge`` write one record per request as soon as it is done, so
that a crash loses at most the batch in flight and a rerun redoes nothing finished. A file per
request made tens of thousands of small files, which DVC stats on every ``dvc status``. A
:class:`RecordStore` keeps them instead in

- ``records.jsonl``: every record the output holds, one JSON line each (stamped with its table
  and schema version, as :func:`acrb.records.write_record` stamps a file), sorted by request id.
  It is rewritten whole, atomically, when a stage finishes (:meth:`RecordStore.finish`), so its
  bytes depend on the records alone, never on the order they were made in, a crash or the
  runner; records of requests no longer planned stay in it, to be reused if planned again.
- ``records.journal/``: while a stage runs, each writing process (the stage, a Ray actor, a
  shard) appends the records it makes to a file of its own there, one line per record.
  :meth:`RecordStore.finish` folds them into ``records.jsonl`` and removes the folder, so a
  finished output holds none. After a ``kill -9`` the next run reads them back: a last line cut
  off mid-write is the request in flight and is dropped (it is redone); any other line that
  cannot be read (not JSON, or JSON that Python cannot read: a number of thousands of digits,
  arrays nested hundreds deep) stops the stage with the file and line named.

A folder of per-request files written by an older ACRB (``records/<request_id>.json``) is read
the same way and folded in by :meth:`RecordStore.finish`. Records are migrated to their
current version as they are read (:func:`acrb.records.migrate`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Generic

from acrb.errors import InputDataError
from acrb.records import (
    R,
    UnreadableRecordError,
    parse_record,
    record_line,
    unreadable_records_error,
)
from acrb.redaction import redact
from acrb.storage import atomic_write_bytes
from acrb.yaml_input import json_text_problem

#: The compacted records of an output folder.
RECORDS_FILE = "records.jsonl"
#: The folder of in-progress journals (one file per writing process).
JOURNAL_DIR = "records.journal"
#: The per-request files of older ACRB versions.
LEGACY_DIR = "records"


class RecordStore(Generic[R]):
    """The records of ``record_type`` kept in ``folder`` (see the module docstring)."""

    def __init__(self, folder: Path, record_type: type[R]) -> None:
        self.folder = folder
        self.record_type = record_type
        # This process's journal, and the process it belongs to: a store handed to another
        # process (a forked child, a Ray actor) must start a journal of its own there, or a line
        # torn by a kill of one writer would be followed by another's lines.
        self._journal: Path | None = None
        self._journal_pid = 0
        self._lock_holder: int | None = None  # the thread in locked(), if any

    def __getstate__(self) -> dict[str, object]:
        # Unpickled in another process, perhaps on another machine with the same pid.
        return {**self.__dict__, "_journal": None, "_journal_pid": 0, "_lock_holder": None}

    @property
    def records_file(self) -> Path:
        return self.folder / RECORDS_FILE

    @property
    def journal_dir(self) -> Path:
        return self.folder / JOURNAL_DIR

    @property
    def legacy_dir(self) -> Path:
        return self.folder / LEGACY_DIR

    def legacy_paths(self) -> list[Path]:
        """The per-request files of an older ACRB in this folder, if any."""
        return sorted(self.legacy_dir.glob("*.json")) if self.legacy_dir.is_dir() else []

    def journals(self) -> list[Path]:
        return sorted(self.journal_dir.glob("*.jsonl")) if self.journal_dir.is_dir() else []

    def load(self, *, journals_only: bool = False) -> dict[str, R]:
        """Every record stored, by request id: ``records.jsonl``, then older per-request files,
        then the journals (a later line for the same request wins). With ``journals_only``,
        just what the journals hold (what was done since the last finished run).

        Every file is read before anything is reported: records that cannot be read raise one
        :class:`~acrb.errors.InputDataError` that counts and names them."""
        found: dict[str, R] = {}
        failures: list[tuple[Path, UnreadableRecordError]] = []
        if not journals_only:
            self._read_lines(self.records_file, found, failures, torn_ok=False)
            for path in self.legacy_paths():
                try:
                    record = _parse(path.read_bytes(), self.record_type)
                except UnreadableRecordError as failure:
                    failures.append((path, failure))
                    continue
                found[_key(record)] = record
        for journal in self.journals():
            self._read_lines(journal, found, failures, torn_ok=True)
        if failures:
            raise unreadable_records_error(self.record_type, failures)
        return found

    def _read_lines(self, path: Path, found: dict[str, R],
                    failures: list[tuple[Path, UnreadableRecordError]], *, torn_ok: bool
                    ) -> None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        lines = data.split(b"\n")
        # A file whose last line has no newline was cut off while that line was written: in a
        # journal that is the request in flight when the writer was killed (redone); the
        # compacted file is written atomically and always ends with one.
        last = lines.pop()
        if last.strip():
            if torn_ok:
                last = b""
            else:
                lines.append(last)
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = _parse(line, self.record_type)
            except UnreadableRecordError as failure:
                failures.append((Path(f"{path}:{number}"), failure))
                continue
            found[_key(record)] = record

    def append(self, records: Iterable[R]) -> None:
        """Append ``records`` to this process's journal, one line each, in one write.

        Under a shared lock of the folder: a :meth:`finish` of another process (under
        :meth:`locked`) waits for the write, and this write for it, so that no line is
        appended to a journal after it was read and before it is removed."""
        # Defence in depth, as for every text output (acrb.redaction): no API key in a line.
        text = redact("".join(record_line(record) + "\n" for record in records))
        if not text:
            return
        pid = os.getpid()
        with self._lock(fcntl.LOCK_SH):
            # Another process's finish() may have folded this journal and removed the folder.
            self.journal_dir.mkdir(parents=True, exist_ok=True)
            if self._journal is None or self._journal_pid != pid \
                    or self._journal.parent != self.journal_dir:
                self._journal = self.journal_dir / f"{pid}-{uuid.uuid4().hex[:12]}.jsonl"
                self._journal_pid = pid
            with open(self._journal, "a", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()

    def finish(self, extra: Sequence[R] = ()) -> dict[str, R]:
        """Fold the journals (and any older per-request files) into ``records.jsonl``, with
        ``extra`` records added, and remove them; returns every record, by request id.

        Call it under :meth:`locked`, with whatever is written from its records (the table), so
        that shards finishing at once each fold what the others wrote and none writes a table
        that lacks another's records."""
        # Listed before they are read: only what was read is removed.
        journals, legacy = self.journals(), self.legacy_dir.is_dir()
        records = self.load()
        for record in extra:
            records[_key(record)] = record
        if records or self.records_file.exists():
            text = "".join(record_line(records[key]) + "\n" for key in sorted(records))
            atomic_write_bytes(self.records_file, text.encode("utf-8"))
        for journal in journals:
            journal.unlink(missing_ok=True)
        if journals:
            _remove_empty(self.journal_dir)
        if legacy:
            shutil.rmtree(self.legacy_dir)
        self._journal = None
        return records

    @contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive lock on the folder (``flock``), released on exit; appends of every
        process wait for it."""
        with self._lock(fcntl.LOCK_EX):
            yield

    @contextmanager
    def _lock(self, kind: int) -> Iterator[None]:
        if self._lock_holder == threading.get_ident():  # inside this thread's locked()
            yield
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        handle = os.open(self.folder, os.O_RDONLY)
        try:
            fcntl.flock(handle, kind)
            if kind == fcntl.LOCK_EX:
                self._lock_holder = threading.get_ident()
            yield
        finally:
            if kind == fcntl.LOCK_EX:
                self._lock_holder = None
            fcntl.flock(handle, fcntl.LOCK_UN)
            os.close(handle)


def _parse(text: bytes, record_type: type[R]) -> R:
    """:func:`~acrb.records.parse_record`, with what Python's ``json`` cannot read (a number of
    thousands of digits, arrays nested hundreds deep: :func:`acrb.yaml_input.json_text_problem`)
    an :class:`UnreadableRecordError` too, never a traceback."""
    problem = json_text_problem(text)
    if problem is not None:
        raise UnreadableRecordError("invalid", f"not JSON ACRB reads: it holds {problem}")
    try:
        return parse_record(text, record_type)
    except RecursionError:  # json_text_problem's limit lies far below Python's
        raise UnreadableRecordError("invalid", "arrays and objects nested too deeply") from None


def _key(record: object) -> str:
    key = getattr(record, "request_id", None)
    if not isinstance(key, str):
        raise InputDataError(f"a stored record has no request id: {record!r}",
                             "delete the file named to redo its requests")
    return key


def _remove_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):  # another writer's journal is still there
        folder.rmdir()
