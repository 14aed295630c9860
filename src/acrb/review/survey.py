"""Import an existing web-survey export of human ratings as review items and ratings.

The export is a JSON list with one object per (rater, item): the fields of
:data:`BASE_FIELDS` and, per output shown, the five scores prefixed ``edited_`` (the edit
the audit rates) and ``preserved_`` (the output of the feature prompt, shown beside it):
``edit_success``, ``skin_tone``, ``race_drift``, ``gender_drift``, ``age_drift``, each 1-5
(``null`` = the rater could not tell). The ``edited_`` scores are required; the
``preserved_`` ones are all present or all absent (an item shown alone).

What it becomes:

- one :class:`acrb.records.ReviewItemRecord` per ``itemId``: ``request_id`` None (ACRB did
  not generate it), image paths ``""`` (unknown), ``source_id`` = ``originalItemId``,
  ``random_sample`` True (the survey's items were its sample), instruction ``""``;
  ``category`` is checked but not kept (it belongs to the prompt, not the item);
- one :class:`acrb.records.RatingRecord` per record and output shown: ``edited`` from the
  ``edited_`` scores, ``feature`` from the ``preserved_`` ones, ``race_drift`` ->
  ``race_change`` (likewise gender, age); ``shown_first`` from ``editedShownFirst``;
  ``origin`` = ``survey:<first 12 hex digits of the file's sha256>``.

Raters are pseudonymised: ``rater`` = ``survey-`` + HMAC-SHA256 of the ``userId`` keyed with
the file's sha256, first 16 hex digits. The raw id (often an e-mail address) is never written;
a plain hash of an e-mail could be reversed by hashing guesses, the keyed one only by someone
who holds the export itself. The same file always gives the same pseudonyms.

Bad files are refused with an :class:`acrb.errors.InputDataError` that names the record index
and the field: not a list, a record that is not an object, a missing field, a score outside
1-5, a group label outside the vocabulary, an item whose labels change between records, or a
(``userId``, ``itemId``) pair rated twice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from acrb.demographics import SOURCE_DIMENSIONS
from acrb.errors import InputDataError
from acrb.layout import RATINGS_TABLE, REVIEW_ITEMS_TABLE
from acrb.records import RatingRecord, ReviewItemRecord, ReviewOutput, write_table
from acrb.sources.fairface import LABELS
from acrb.storage import content_hash, sha256_bytes, write_csv

#: Fields every record carries.
BASE_FIELDS: tuple[str, ...] = ("userId", "itemId", "originalItemId", "model", "promptId",
                                "category", "race", "gender", "age", "editedShownFirst",
                                "duration_ms", "createdAt")
#: The survey's score names -> the review axes of :data:`acrb.records.REVIEW_AXES`.
SCORE_FIELDS: dict[str, str] = {"edit_success": "edit_success", "skin_tone": "skin_tone",
                                "race_drift": "race_change", "gender_drift": "gender_change",
                                "age_drift": "age_change"}
#: Score prefix -> the rating's ``output``.
PREFIXES: dict[str, ReviewOutput] = {"edited_": "edited", "preserved_": "feature"}
#: The item labels that must agree between every record of one item.
ITEM_FIELDS: tuple[str, ...] = ("originalItemId", "model", "promptId", "category", "race",
                                "gender", "age")
#: The hex digits of the file hash in ``origin``.
ORIGIN_DIGITS = 12

_FIX = "correct the export (or re-export it from the survey) and import it again"


def _bad(path: Path, index: int, field: str, problem: str) -> InputDataError:
    return InputDataError(f"{path}: record {index}, field {field!r}: {problem}", _FIX)


def _text(path: Path, index: int, record: Mapping[str, Any], field: str) -> str:
    value = record[field]
    if isinstance(value, bool) or not isinstance(value, str | int) or str(value).strip() == "":
        raise _bad(path, index, field, f"expected a non-empty string or number, got {value!r}")
    return str(value).strip()


def _label(path: Path, index: int, record: Mapping[str, Any], dimension: str) -> str:
    """A race, gender or age label in ACRB's spelling (FairFace's spellings accepted)."""
    value = _text(path, index, record, dimension)
    vocabulary = SOURCE_DIMENSIONS[dimension]
    if value in vocabulary:
        return value
    mapped = LABELS[dimension].get(value)
    if mapped is None:
        raise _bad(path, index, dimension, f"{value!r} is not one of {list(vocabulary)} "
                   f"(FairFace spellings such as {next(iter(LABELS[dimension]))!r} also work)")
    return str(mapped)


def _score(path: Path, index: int, record: Mapping[str, Any], field: str) -> int | None:
    value = record[field]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(path, index, field, f"expected a score 1-5 or null, got {value!r}")
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        raise _bad(path, index, field, f"score {value!r} is not a whole number 1-5")
    if not 1 <= value <= 5:
        raise _bad(path, index, field, f"score {value!r} is outside 1-5")
    return int(value)


def _created_at(path: Path, index: int, record: Mapping[str, Any]) -> str:
    """``createdAt`` as ISO 8601 UTC: an ISO string, or epoch milliseconds."""
    value = record["createdAt"]
    try:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, int | float):
            moment = datetime.fromtimestamp(value / 1000, tz=timezone.utc)
        elif isinstance(value, str):
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=timezone.utc)
        else:
            raise ValueError
    except (ValueError, OverflowError, OSError):
        raise _bad(path, index, "createdAt", f"expected an ISO 8601 time or epoch "
                   f"milliseconds, got {value!r}") from None
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _duration(path: Path, index: int, record: Mapping[str, Any]) -> int | None:
    value = record["duration_ms"]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 \
            or not math.isfinite(value):
        raise _bad(path, index, "duration_ms", f"expected milliseconds >= 0 or null, "
                   f"got {value!r}")
    return int(value)


def _shown_first(path: Path, index: int, record: Mapping[str, Any]) -> bool | None:
    value = record["editedShownFirst"]
    if value is not None and not isinstance(value, bool):
        raise _bad(path, index, "editedShownFirst", f"expected true, false or null, "
                   f"got {value!r}")
    return value


def pseudonym(user_id: str, key: str) -> str:
    """The rater id written for ``user_id``: keyed hash (see the module docstring)."""
    digest = hmac.new(key.encode(), user_id.encode("utf-8"), hashlib.sha256).hexdigest()
    return f"survey-{digest[:16]}"


def _load(path: Path) -> tuple[list[Any], str]:
    if not path.is_file():
        raise InputDataError(f"{path} does not exist or is not a file",
                             "give the path of the survey's JSON export")
    data = path.read_bytes()
    try:
        records = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputDataError(f"{path} is not valid JSON: {exc}", _FIX) from exc
    if not isinstance(records, list):
        raise InputDataError(f"{path}: expected a JSON list of rating records, got a "
                             f"{type(records).__name__}", _FIX)
    if not records:
        raise InputDataError(f"{path}: the list of rating records is empty", _FIX)
    return records, sha256_bytes(data)


def import_survey(path: Path | str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read a survey export: (items, ratings) frames of :class:`ReviewItemRecord` and
    :class:`RatingRecord` rows, validated (module docstring for the mapping and the checks)."""
    path = Path(path)
    records, file_hash = _load(path)
    origin = f"survey:{file_hash[:ORIGIN_DIGITS]}"
    items: dict[str, dict[str, Any]] = {}
    item_labels: dict[str, tuple[int, dict[str, str]]] = {}
    seen: dict[tuple[str, str], int] = {}
    ratings: list[RatingRecord] = []
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise InputDataError(f"{path}: record {index} is a {type(record).__name__}, "
                                 "not an object", _FIX)
        for field in BASE_FIELDS:
            if field not in record:
                raise _bad(path, index, field, "missing")
        user = _text(path, index, record, "userId")
        item_id = _text(path, index, record, "itemId")
        labels = {"originalItemId": _text(path, index, record, "originalItemId"),
                  "model": _text(path, index, record, "model"),
                  "promptId": _text(path, index, record, "promptId"),
                  "category": _text(path, index, record, "category"),
                  **{d: _label(path, index, record, d) for d in SOURCE_DIMENSIONS}}
        if item_id in item_labels:
            first, known = item_labels[item_id]
            for field in ITEM_FIELDS:
                if known[field] != labels[field]:
                    raise _bad(path, index, field, f"item {item_id!r} has {labels[field]!r} "
                               f"here but {known[field]!r} in record {first}")
        else:
            item_labels[item_id] = (index, labels)
        rater = pseudonym(user, file_hash)
        if (rater, item_id) in seen:
            raise _bad(path, index, "itemId", f"this user already rated item {item_id!r} in "
                       f"record {seen[(rater, item_id)]}: one rating per user and item")
        seen[(rater, item_id)] = index
        shown_first = _shown_first(path, index, record)
        duration = _duration(path, index, record)
        created_at = _created_at(path, index, record)
        outputs: list[tuple[ReviewOutput, dict[str, int | None]]] = []
        for prefix, output in PREFIXES.items():
            fields = [f"{prefix}{name}" for name in SCORE_FIELDS]
            present = [f for f in fields if f in record]
            if output == "feature" and not present:
                continue  # shown alone: no feature-prompt output
            for field in fields:
                if field not in record:
                    raise _bad(path, index, field, "missing" + (
                        " (the other preserved_ scores are present)" if output == "feature"
                        else ""))
            scores = {axis: _score(path, index, record, f"{prefix}{name}")
                      for name, axis in SCORE_FIELDS.items()}
            outputs.append((output, scores))
        paired = len(outputs) == 2
        for output, scores in outputs:
            first_shown = None
            if paired and shown_first is not None:
                first_shown = shown_first if output == "edited" else not shown_first
            ratings.append(RatingRecord(
                rating_id=content_hash([origin, rater, item_id, output]), rater=rater,
                item_id=item_id, output=output, shown_first=first_shown, repeat=False,
                duration_ms=duration, created_at=created_at, origin=origin, **scores))
        item = items.setdefault(item_id, {"paired": False, **labels})
        item["paired"] = item["paired"] or paired
    item_rows = [ReviewItemRecord(
        item_id=item_id, request_id=None, paired_request_id=None, model=item["model"],
        prompt_id=item["promptId"], instruction="", source_id=item["originalItemId"],
        source_path="", output_path="", paired_output_path="" if item["paired"] else None,
        race=item["race"], gender=item["gender"], age=item["age"], random_sample=True,
        needs_review=False) for item_id, item in items.items()]
    items_frame = pd.DataFrame([r.model_dump() for r in item_rows],
                               columns=list(ReviewItemRecord.model_fields))
    ratings_frame = pd.DataFrame([r.model_dump() for r in ratings],
                                 columns=list(RatingRecord.model_fields))
    return items_frame, ratings_frame


def write_survey(path: Path | str, out_dir: Path | str) -> dict[str, Path]:
    """Import a survey export and write its items and ratings as Parquet tables in
    ``out_dir`` (the file names of ``inputs/review/``: ``items.parquet``, ``ratings.parquet``)
    and the ratings as ``ratings.csv``, atomically. Returns the paths written, keyed ``items``,
    ``ratings`` and ``ratings_csv``."""
    items, ratings = import_survey(path)
    out = Path(out_dir)
    written = {"items": out / REVIEW_ITEMS_TABLE.name, "ratings": out / RATINGS_TABLE.name,
               "ratings_csv": out / "ratings.csv"}
    write_table(written["items"], items, ReviewItemRecord)
    write_table(written["ratings"], ratings, RatingRecord)
    write_csv(ratings, written["ratings_csv"])
    return written


__all__ = ["BASE_FIELDS", "PREFIXES", "SCORE_FIELDS", "import_survey", "pseudonym",
           "write_survey"]
