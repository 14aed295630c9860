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

Each file is written atomically; other files in the folder (a survey import) are left alone.
"""

from __future__ import annotations

import json
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

MANIFEST = "manifest.json"
RATINGS_CSV = RATINGS_TABLE.with_suffix(".csv").name


@dataclass(frozen=True)
class FinalizeResult:
    folder: Path
    ratings: int
    items: int
    raters: int
    audit_head: str


def finalize(store: ReviewStore, out_dir: Path) -> FinalizeResult:
    """Write the export described above to ``out_dir``; refuse a log that does not verify
    or a review without ratings."""
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
    entry = store.note({"action": "finalize", "rater": "", "out": str(out_dir),
                        "ratings": len(ratings), "items": len(items)})
    ratings_path = out_dir / RATINGS_TABLE.name
    items_path = out_dir / REVIEW_ITEMS_TABLE.name
    write_table(ratings_path, ratings, RatingRecord)
    write_table(items_path, items, ReviewItemRecord)
    # The CSV is the table read back through its schema, so both say exactly the same.
    frame = read_table(ratings_path, RatingRecord)
    write_csv(frame, out_dir / RATINGS_CSV)
    atomic_write_bytes(out_dir / AUDIT_LOG, store.log.read_bytes())
    info = store.set_info()
    manifest: dict[str, Any] = {
        "review_set": {"path": info["path"], "sha256": info["sha256"]},
        "raters_per_item": store.raters_per_item,
        "repeat_fraction": store.repeat_fraction,
        "age_question": store.age_question,
        "ratings": len(ratings), "repeats": sum(r.repeat for r in ratings),
        "items": len(items), "raters": raters,
        "files": {name: sha256_file(out_dir / name)
                  for name in (ratings_path.name, RATINGS_CSV, items_path.name, AUDIT_LOG)},
        "audit": {"entries": entry["seq"], "head": entry["hash"]},
    }
    atomic_write_json(out_dir / MANIFEST, manifest)
    return FinalizeResult(out_dir, len(ratings), len(items), len(raters), entry["hash"])


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
