"""Export a review's ratings into ``inputs/review/``, where the ``review`` stage reads them.

The export (``acrb review finalize``) holds:

- ``ratings.parquet``: every rating as a :class:`~acrb.records.RatingRecord` row, origin
  ``app``, repeats marked (``age_direction`` set where the folder asked the bipolar age
  question, ``age_question: direction``, with ``age_change`` its drift); and the same rows as
  ``ratings.csv`` (axis values empty where the rater chose "cannot tell") for people and other
  tools;
- ``items.parquet``: the :class:`~acrb.records.ReviewItemRecord` rows of the items that were
  rated (with their group labels, which the raters never saw);
- ``audit.jsonl``: the whole hash-chained log, ending with the ``finalize`` entry, and
  ``manifest.json``: the review set's sha256, the counts, k, the repeat fraction and the age
  question, each file's sha256 and the log's entry count and head hash, so `acrb review
  verify` can check the exported log on its own.

The files are written as a set: first into a staging folder inside the export folder, then
each renamed into place, the manifest last, only once every file is written. A finalize that
fails part-way (a full disk) leaves the previous export as it was, still verifying. Other files
in the folder (a survey import) are left alone.

:func:`verify_export` checks an export on its own: the log against the manifest's entry count
and head hash, and every file against the sha256 the manifest lists (`acrb review verify
FOLDER`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acrb.errors import InputDataError
from acrb.layout import RATINGS_TABLE, REVIEW_ITEMS_TABLE
from acrb.records import RatingRecord, ReviewItemRecord, read_table, write_table
from acrb.review.store import AUDIT_LOG, ReviewStore
from acrb.storage import (
    atomic_write_bytes,
    atomic_write_json,
    sha256_file,
    write_csv,
)
from acrb.web.audit import Verification, verify

MANIFEST = "manifest.json"
RATINGS_CSV = RATINGS_TABLE.with_suffix(".csv").name
#: The staging folder of a finalize under way (``<out>/.finalize-<random>``).
STAGING_PREFIX = ".finalize-"


@dataclass(frozen=True)
class FinalizeResult:
    folder: Path
    ratings: int
    items: int
    raters: int
    audit_head: str


def finalize(store: ReviewStore, out_dir: Path) -> FinalizeResult:
    """Write the export described above to ``out_dir``; refuse a log that does not verify
    (or a ratings table that disagrees with it) or a review without ratings.

    Every file is written to a staging folder first and renamed into ``out_dir`` only when
    all are written (the manifest last); a write that fails leaves ``out_dir`` as it was and
    is reported as an :class:`~acrb.errors.InputDataError` naming the folder.
    """
    check = store.verify()
    if not check.ok:
        raise InputDataError(f"the audit log does not verify: {check.message()}",
                             check.fix or ("restore audit.jsonl from a backup; ratings cannot "
                                           "be exported from a trail that was altered"))
    ratings = store.ratings()
    if not ratings:
        raise InputDataError(f"{store.workdir} has no ratings yet",
                             "rate some items in `acrb review serve` first")
    rated = {r.item_id for r in ratings}
    items = [item for item in store.items() if item.item_id in rated]
    raters = sorted({r.rater for r in ratings})
    out_dir = Path(out_dir)
    names = (RATINGS_TABLE.name, RATINGS_CSV, REVIEW_ITEMS_TABLE.name, AUDIT_LOG)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in out_dir.glob(f"{STAGING_PREFIX}*"):  # left by a finalize that was killed
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out_dir))
    except OSError as exc:
        raise _write_failed(out_dir, exc) from exc
    try:
        ratings_path = staging / RATINGS_TABLE.name
        write_table(ratings_path, ratings, RatingRecord)
        write_table(staging / REVIEW_ITEMS_TABLE.name, items, ReviewItemRecord)
        # The CSV is the table read back through its schema, so both say exactly the same.
        write_csv(read_table(ratings_path, RatingRecord), staging / RATINGS_CSV)
        # Logged once the large files are written: a full disk is usually met before.
        entry = store.note({"action": "finalize", "rater": "", "out": str(out_dir),
                            "ratings": len(ratings), "items": len(items)})
        # The log up to this finalize: a rating saved meanwhile belongs to the next export.
        lines = store.log.read_bytes().split(b"\n")[:entry["seq"]]
        log = b"".join(line + b"\n" for line in lines)
        atomic_write_bytes(staging / AUDIT_LOG, log)
        info = store.set_info()
        manifest: dict[str, Any] = {
            "review_set": {"path": info["path"], "sha256": info["sha256"]},
            "raters_per_item": store.raters_per_item,
            "repeat_fraction": store.repeat_fraction,
            "age_question": store.age_question,
            "ratings": len(ratings), "repeats": sum(r.repeat for r in ratings),
            "items": len(items), "raters": raters,
            "files": {name: sha256_file(staging / name) for name in names},
            "audit": {"entries": entry["seq"], "head": entry["hash"]},
        }
        atomic_write_json(staging / MANIFEST, manifest)
        # Renames in one folder need no space; the manifest goes last, so an export caught
        # between two renames fails verify naming the file rather than passing.
        for name in (*names, MANIFEST):
            os.replace(staging / name, out_dir / name)
    except OSError as exc:
        raise _write_failed(out_dir, exc) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return FinalizeResult(out_dir, len(ratings), len(items), len(raters), entry["hash"])


def _write_failed(out_dir: Path, exc: OSError) -> InputDataError:
    return InputDataError(f"the export to {out_dir} could not be written: {exc}",
                          "make room (or fix the folder's permissions) and run `acrb review "
                          "finalize` again; the export that was there is unchanged")


def verify_export(folder: Path) -> Verification:
    """Check a finalized export on its own: its ``audit.jsonl`` against the manifest's
    entry count and head hash (:func:`acrb.web.audit.verify`), then every file the manifest
    lists against its sha256. The first problem is returned, naming the line or the file."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    anchor = manifest["audit"]
    if not isinstance(anchor, dict) or not isinstance(anchor.get("head"), str):
        return Verification(folder / MANIFEST, False, 0, "", None,
                            problem="its audit entry holds no head hash",
                            fix="export again with `acrb review finalize`")
    check = verify(folder / AUDIT_LOG, expected_head=anchor["head"],
                   expected_entries=anchor.get("entries"))
    if not check.ok:
        return check
    files = manifest.get("files", {})
    if not isinstance(files, dict) or not all(
            isinstance(n, str) and isinstance(d, str) for n, d in files.items()):
        return _export_problem(check, folder / MANIFEST,
                               "its files are not a mapping of file name to sha256")
    for name, digest in files.items():
        path = folder / name
        if Path(name).name != name or name in ("", ".", ".."):
            return _export_problem(check, folder / MANIFEST,
                                   f"lists {name[:60]!r}, which is not a file of the export")
        if not path.is_file():
            return _export_problem(check, path, f"is listed in {MANIFEST} but missing")
        found = sha256_file(path)
        if found != digest:
            return _export_problem(check, path, f"sha256 is {found[:16]}, not the "
                                   f"{digest[:16]} {MANIFEST} recorded: the file was changed "
                                   "after the export")
    check.notes.append(f"{len(files)} file(s) match the sha256 in {MANIFEST}")
    return check


def _export_problem(check: Verification, path: Path, problem: str) -> Verification:
    return Verification(path, False, check.entries, check.head, None, problem=problem,
                        fix="export again with `acrb review finalize` from the review folder "
                            "(or restore the export from where it is kept, e.g. `dvc pull`)")


def read_manifest(folder: Path) -> dict[str, Any]:
    """The ``manifest.json`` of a finalized export."""
    path = Path(folder) / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputDataError(f"{path} cannot be read: {exc}",
                             "export again with `acrb review finalize`") from exc
    if not isinstance(data, dict) or "audit" not in data:
        raise InputDataError(f"{path} is not a review export manifest",
                             "export again with `acrb review finalize`")
    return data
